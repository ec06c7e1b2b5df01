// The global fallback: any ATen operator without an openreg kernel runs
// PyTorch's CPU kernel directly on device memory.
//
// For each call the fallback
//  1. finds the device (the first openreg tensor, or an openreg Device
//     argument) and rejects mixed devices the way CUDA does;
//  2. replaces every openreg tensor by its kernel view (a CPU tensor over the
//     same bytes), openreg generators by their CPU state, openreg devices by
//     the CPU;
//  3. runs the CPU kernel as device work: queued on the current stream
//     (launch_async) when the output metadata is known without running it,
//     otherwise after the stream drains (run_sync);
//  4. maps results back: in-place and out= results are the original device
//     arguments (resized if the kernel resized them), views of an input
//     become device views of the same storage, new tensors are copied into
//     device memory.
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/ops/contiguous.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/flat_hash_map.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "aten/OpenRegKernelView.h"
#include "aten/OpenRegResize.h"
#include "core/OpenRegException.h"
#include "random/OpenRegGenerator.h"

namespace openreg {

namespace {

bool is_openreg(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

// Operators that, as on CUDA, accept CPU index tensors beside device tensors.
bool accepts_cpu_tensors(const c10::OperatorName& name) {
  static constexpr std::string_view kAllowed[] = {
      "aten::index", "aten::index_put_", "aten::_index_put_impl_",
      "aten::index_put"};
  for (auto allowed : kAllowed) {
    if (name.name == allowed) {
      return true;
    }
  }
  return false;
}

// Calls f on every tensor inside an argument (tensors, tensor lists, lists of
// optional tensors).
template <typename F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      f(t);
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) {
        f(e.toTensor());
      }
    }
  }
}

// Replaces every openreg tensor inside v by f(tensor).
template <typename F>
c10::IValue map_tensors(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    return f(v.toTensor());
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) {
      out.push_back(f(t));
    }
    return out;
  }
  if (v.isList()) {
    auto list = v.toList();
    bool any = false;
    for (const c10::IValue& e : list) {
      any = any || e.isTensor();
    }
    if (!any) {
      return v;
    }
    c10::impl::GenericList out(list.elementType());
    for (const c10::IValue& e : list) {
      out.push_back(e.isTensor() ? c10::IValue(f(e.toTensor())) : e);
    }
    return out;
  }
  return v;
}

bool is_generator_arg(const c10::Argument& arg) {
  const c10::TypePtr& type = arg.type();
  if (type->kind() == c10::TypeKind::GeneratorType) {
    return true;
  }
  if (auto opt = type->cast<c10::OptionalType>()) {
    return opt->getElementType()->kind() == c10::TypeKind::GeneratorType;
  }
  return false;
}

// Finds the device an operator call runs on and checks all tensors agree.
c10::Device find_device(const c10::OperatorHandle& op,
                        c10::ArrayRef<c10::IValue> args) {
  std::optional<c10::Device> device;
  std::optional<c10::Device> other;
  for (const c10::IValue& v : args) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (!t.defined()) {
        return;
      }
      if (is_openreg(t)) {
        if (!device) {
          device = t.device();
        } else {
          TORCH_CHECK(*device == t.device(),
                      "Expected all tensors to be on the same device, but "
                      "found at least two devices, ",
                      *device, " and ", t.device(),
                      "! (when checking arguments for ", op.schema().name(),
                      ")");
        }
      } else if (t.device().is_cpu()) {
        if (t.dim() != 0 && !other) {
          other = t.device();  // CPU scalars (0-dim) are allowed, as on CUDA
        }
      } else if (!other) {
        other = t.device();
      }
    });
  }
  if (device) {
    TORCH_CHECK(!other || (other->is_cpu() &&
                           accepts_cpu_tensors(op.schema().operator_name())),
                "Expected all tensors to be on the same device, but found at "
                "least two devices, ",
                *device, " and ", *other, "! (when checking arguments for ",
                op.schema().name(), ")");
    return *device;
  }
  for (const c10::IValue& v : args) {
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      return v.toDevice();
    }
  }
  TORCH_CHECK(false, "openreg fallback for ", op.schema().name(),
              " found no openreg tensor or device among its arguments");
}

// Brings the device argument `dev` up to date with its kernel view `view`
// after a kernel that may have resized it (out= arguments, set_, resize_).
void sync_mutated(const at::Tensor& dev, const at::Tensor& view,
                  void* original_base) {
  c10::TensorImpl* impl = dev.unsafeGetTensorImpl();
  if (view.storage().data() != original_base) {
    // The CPU kernel grew the storage on the host: grow the device storage
    // and move the bytes there.
    const c10::Storage& storage = dev.storage();
    resize_bytes(storage.unsafeGetStorageImpl(), view.storage().nbytes());
    if (view.storage().nbytes() != 0) {
      OPENREG_CHECK(orMemcpy(storage.mutable_data(), view.storage().data(),
                             view.storage().nbytes(), orMemcpyHostToDevice));
    }
  }
  if (dev.sizes() != view.sizes() || dev.strides() != view.strides() ||
      dev.storage_offset() != view.storage_offset()) {
    impl->set_sizes_and_strides(view.sizes(), view.strides(),
                                view.storage_offset());
  }
  // Some kernels return their out= result as a conjugate or negative view
  // (linalg_lu_solve with left=False sets the conjugate bit on `result`).
  if (dev.is_conj() != view.is_conj()) {
    impl->_set_conj(view.is_conj());
  }
  if (dev.is_neg() != view.is_neg()) {
    impl->_set_neg(view.is_neg());
  }
}

// The argument an in-place/out= result aliases, or -1.
int written_argument(const c10::FunctionSchema& schema, size_t ret) {
  const c10::AliasInfo* alias = schema.returns()[ret].alias_info();
  if (alias == nullptr || !alias->isWrite()) {
    return -1;
  }
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* a = args[i].alias_info();
    if (a != nullptr && a->beforeSets() == alias->beforeSets()) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

// Ops that must run synchronously although nothing in their schema says so:
// meta kernels that describe results the CPU kernel does not produce (batch
// norm in eval mode returns empty saved statistics on the CPU), and random
// ops without a Generator argument (they draw from a global generator, which
// must happen in program order).
bool meta_differs_from_cpu(const c10::OperatorName& name) {
  static constexpr std::string_view kOps[] = {
      "aten::native_batch_norm",
      "aten::_native_batch_norm_legit",
      "aten::_native_batch_norm_legit_no_training",
      "aten::_batch_norm_with_update",
      "aten::_batch_norm_no_update",
      "aten::native_dropout",
      "aten::_fused_dropout"};
  for (auto op : kOps) {
    if (name.name == op) {
      return true;
    }
  }
  return false;
}

// Ops whose CPU kernel returns its out= argument as a conjugate view
// (linalg_lu_solve with left=False solves A^H X^H = B^H in place and flips
// the conjugate bit of `result`): the host-side bit changes with the call, so
// they always run synchronously. The elementwise asynchronous path would take
// them when the shapes happen to broadcast; the meta path finds out on the
// first (synchronous) call, and a launch asserts that no bit changed.
bool flips_result_bits(const c10::OperatorName& name) {
  return name.name == "aten::linalg_lu_solve";
}

// The operator's name for messages ("aten::add.out").
std::string op_name(const c10::FunctionSchema& schema) {
  std::string name = schema.name();
  if (!schema.overload_name().empty()) {
    name += "." + schema.overload_name();
  }
  return name;
}

// What an asynchronous kernel captures of its arguments: non-owning handles
// over device memory (a block freed on the host is reused only in stream
// order, as on CUDA; no Python objects reach the worker) and snapshots of
// CPU tensors (the host may change them before the kernel runs). Python
// numbers are made for the call and need no snapshot.
std::vector<c10::IValue> capture_arguments(const torch::jit::Stack& stack,
                                           size_t first, size_t num_args) {
  std::vector<c10::IValue> captured;
  captured.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    captured.push_back(map_tensors(stack[first + i], [](const at::Tensor& t) {
      if (!t.defined()) {
        return t;
      }
      if (is_openreg(t)) {
        return borrowed_alias(t);
      }
      if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
        return t;
      }
      return t.clone();
    }));
  }
  return captured;
}

// The body of an asynchronous fallback kernel: the CPU kernel over kernel
// views of the captured arguments. Returns the kernel's results; fails if
// the kernel changed the shape of an argument it writes (device tensors are
// never resized asynchronously).
torch::jit::Stack run_cpu_kernel(const c10::OperatorHandle& op,
                                 const std::vector<c10::IValue>& captured,
                                 KernelViews& views) {
  torch::jit::Stack stack;
  stack.reserve(captured.size());
  std::vector<std::pair<at::Tensor, at::Tensor>> written;
  const auto& args = op.schema().arguments();
  for (size_t i = 0; i < captured.size(); ++i) {
    const c10::AliasInfo* a = args[i].alias_info();
    const bool writes = a != nullptr && a->isWrite() && captured[i].isTensor();
    stack.push_back(map_tensors(captured[i], [&](const at::Tensor& t) {
      if (!is_openreg(t)) {
        return t;
      }
      at::Tensor view = views.view(t);
      if (writes) {
        written.emplace_back(t, view);
      }
      return view;
    }));
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  for (const auto& [dev, view] : written) {
    TORCH_CHECK(dev.sizes() == view.sizes() && dev.strides() == view.strides(),
                "the out= argument of shape ", dev.sizes(),
                " would have to be resized to ", view.sizes(),
                "; asynchronous kernels cannot resize device tensors: pass "
                "an output of the right shape, or an empty one");
    TORCH_INTERNAL_ASSERT(
        dev.is_conj() == view.is_conj() && dev.is_neg() == view.is_neg(),
        "the CPU kernel changed the conjugate/negative bit of its out= "
        "argument in an asynchronous launch (signatures that do so must run "
        "synchronously)");
  }
  return stack;
}

// What both asynchronous paths require: not an op of flips_result_bits(), no
// generator (random draws happen in program order), no Device arguments, and
// every written tensor a non-empty device tensor (an empty one is to be
// resized) that overlaps neither itself nor, partially, any input (the CPU
// raises there; the synchronous path raises the same error). Sets
// *any_written if some tensor is written. Ops with an output_mask qualify:
// the mask is part of the meta path's signature, and the first CPU run
// checks which results the meta kernel said exist.
bool can_run_async(const c10::FunctionSchema& schema,
                   const torch::jit::Stack& stack, bool* any_written) {
  const auto& arg_schema = schema.arguments();
  const size_t num_args = arg_schema.size();
  if (flips_result_bits(schema.operator_name())) {
    return false;
  }
  for (const c10::Argument& a : arg_schema) {
    if (is_generator_arg(a)) {
      return false;
    }
  }
  const size_t first = stack.size() - num_args;
  *any_written = false;
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isDevice()) {
      return false;
    }
    const c10::AliasInfo* a = arg_schema[i].alias_info();
    if (a == nullptr || !a->isWrite() || !v.isTensor()) {
      continue;
    }
    const at::Tensor& w = v.toTensor();
    if (!is_openreg(w) || w.numel() == 0 ||
        at::has_internal_overlap(w) == at::MemOverlap::Yes) {
      return false;
    }
    *any_written = true;
    for (size_t j = 0; j < num_args; ++j) {
      bool partial = false;
      for_each_tensor(stack[first + j], [&](const at::Tensor& t) {
        partial = partial || (t.defined() && is_openreg(t) &&
                              at::get_overlap_status(w, t) ==
                                  at::MemOverlapStatus::Partial);
      });
      if (partial) {
        return false;
      }
    }
  }
  return true;
}

// The asynchronous path, for in-place and out= operators (every result is
// an argument it writes): the host knows all output metadata already, so the
// CPU kernel can run later on the stream. Functional operators reach it too:
// PyTorch's generic kernels for structured ops allocate the output on the
// device and call the out= variant. Called only when can_run_async() holds;
// returns false (having changed nothing) when a result is not a written
// argument (new tensors, scalars), for the meta path or the synchronous one.
//
// The kernel captures non-owning handles: a block freed on the host goes
// back to the caching allocator at once and is reused on the same stream
// only after this kernel (stream order), as CUDA's allocator does; use on
// another stream needs Tensor.record_stream, as on CUDA.
bool try_fallback_async(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                        c10::Device device, bool any_written) {
  const c10::FunctionSchema& schema = op.schema();
  const auto& arg_schema = schema.arguments();
  const size_t num_args = arg_schema.size();
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    if (written_argument(schema, r) < 0) {
      return false;
    }
  }
  const size_t first = stack->size() - num_args;
  if (!any_written && !schema.returns().empty()) {
    return false;
  }
  // Output shapes must be known on the host without running the op. Meta
  // kernels would tell, but most are written in Python (~100 us a call), so
  // the asynchronous path takes the case it can check for free: every
  // written tensor already has the broadcast shape and the promoted dtype of
  // the inputs (all elementwise ops, including the out= calls PyTorch makes
  // for structured functional ops). Everything else (reductions, matmul,
  // indexing, an out= to be resized, a cast the CPU rejects) runs
  // synchronously and behaves exactly like the CPU.
  c10::DimVector shape;
  bool first_input = true;
  at::native::ResultTypeState promotion;
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = (*stack)[first + i];
    const c10::AliasInfo* a = arg_schema[i].alias_info();
    const bool out_arg = a != nullptr && a->isWrite() &&
                         arg_schema[i].kwarg_only() && v.isTensor();
    if (!v.isTensor() || out_arg || !v.toTensor().defined()) {
      continue;
    }
    const at::Tensor& t = v.toTensor();
    promotion = at::native::update_result_type_state(t, promotion);
    if (first_input) {
      shape.assign(t.sizes().begin(), t.sizes().end());
      first_input = false;
      continue;
    }
    try {
      shape = at::infer_size_dimvector(shape, t.sizes());
    } catch (const std::exception&) {
      return false;
    }
  }
  const c10::ScalarType promoted = at::native::result_type(promotion);
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = (*stack)[first + i];
    const c10::AliasInfo* a = arg_schema[i].alias_info();
    if (a != nullptr && a->isWrite() && v.isTensor() &&
        (first_input || v.toTensor().sizes() != c10::IntArrayRef(shape) ||
         v.toTensor().scalar_type() != promoted)) {
      return false;
    }
  }

  std::vector<c10::IValue> captured =
      capture_arguments(*stack, first, num_args);
  launch_async(device.index(), op_name(schema),
               [op, captured = std::move(captured)]() {
                 KernelViews views;
                 run_cpu_kernel(op, captured, views);
               });

  std::vector<c10::IValue> results;
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    results.push_back(
        (*stack)[first + static_cast<size_t>(written_argument(schema, r))]);
  }
  torch::jit::drop(*stack, num_args);
  for (c10::IValue& r : results) {
    stack->push_back(std::move(r));
  }
  return true;
}

// ---------------------------------------------------------------------------
// The asynchronous path for everything else: output metadata from the op's
// meta kernel, cached by signature.
//
// Meta kernels are mostly Python (~100 us), so their answer is cached per
// signature (operator, and for each argument its dtype, sizes and strides,
// or its value): a training loop repeats the same signatures, so the meta
// kernel runs once per shape. A signature whose meta run fails (data-
// dependent shapes, no meta kernel) or says an output aliases an input or a
// written argument changes shape is cached as "synchronous".

struct OutSpec {
  enum Kind { kWritten, kNew, kNewList, kNone } kind = kNone;
  int arg = -1;                           // kWritten
  std::vector<at::TensorOptions> dtypes;  // kNew/kNewList, one per tensor
  std::vector<std::vector<int64_t>> sizes;
  std::vector<std::vector<int64_t>> strides;
};

struct MetaEntry {
  bool ok = false;
  std::vector<OutSpec> outs;
};

void append_signature(std::string& key, const c10::IValue& v) {
  auto tensor = [&key](const at::Tensor& t) {
    if (!t.defined()) {
      key += "U;";
      return;
    }
    key += is_openreg(t) ? 'D' : 'C';
    key += std::to_string(static_cast<int>(t.scalar_type()));
    key += '[';
    for (auto d : t.sizes()) {
      key += std::to_string(d);
      key += ',';
    }
    key += '|';
    for (auto d : t.strides()) {
      key += std::to_string(d);
      key += ',';
    }
    key += ']';
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
      key += 'w';
    }
    if (t.is_conj()) {
      key += 'c';
    }
    if (t.is_neg()) {
      key += 'n';
    }
    key += ';';
  };
  if (v.isTensor()) {
    tensor(v.toTensor());
  } else if (v.isTensorList()) {
    key += '{';
    for (const at::Tensor& t : v.toTensorList()) {
      tensor(t);
    }
    key += '}';
  } else if (v.isList() && !v.toListRef().empty() &&
             v.toListRef()[0].isTensor()) {
    key += '{';
    for (const c10::IValue& e : v.toListRef()) {
      e.isTensor() ? tensor(e.toTensor()) : void(key += "N;");
    }
    key += '}';
  } else {
    std::ostringstream os;
    os << v;
    key += os.str();
    key += ';';
  }
}

class MetaCache {
 public:
  std::shared_ptr<const MetaEntry> find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second;
  }
  void insert(const std::string& key, std::shared_ptr<const MetaEntry> e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (map_.size() > 8192) {
      map_.clear();  // bounded: shapes of a long-running program change
    }
    map_.emplace(key, std::move(e));
  }

 private:
  std::mutex mutex_;  // guards map_
  std::unordered_map<std::string, std::shared_ptr<const MetaEntry>> map_;
};

MetaCache& meta_cache() {
  static auto* cache = new MetaCache();  // leaked: used until exit
  return *cache;
}

// Runs the op on meta tensors (one meta storage per device storage, so
// aliasing shows) and describes its results.
std::shared_ptr<const MetaEntry> compute_meta(const c10::OperatorHandle& op,
                                              const torch::jit::Stack& stack,
                                              size_t first) {
  auto entry = std::make_shared<MetaEntry>();
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> storages;
  auto meta_of = [&](const at::Tensor& t) -> at::Tensor {
    if (!is_openreg(t)) {
      return t;
    }
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    const c10::Storage* meta_storage = nullptr;
    for (const auto& [k, st] : storages) {
      if (k == key) {
        meta_storage = &st;
      }
    }
    if (meta_storage == nullptr) {
      storages.emplace_back(
          key,
          c10::Storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                       c10::GetAllocator(c10::DeviceType::Meta),
                       /*resizable=*/true));
      meta_storage = &storages.back().second;
    }
    at::Tensor m = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(*meta_storage),
        c10::DispatchKeySet(c10::DispatchKey::Meta), t.dtype());
    m.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(),
                                                   t.storage_offset());
    m._set_conj(t.is_conj());
    m._set_neg(t.is_neg());
    return m;
  };
  torch::jit::Stack meta_stack;
  std::vector<std::pair<at::Tensor, at::Tensor>> written;
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = stack[first + i];
    const c10::AliasInfo* a = schema.arguments()[i].alias_info();
    const bool writes = a != nullptr && a->isWrite() && v.isTensor();
    meta_stack.push_back(map_tensors(v, [&](const at::Tensor& t) {
      at::Tensor m = meta_of(t);
      if (writes && is_openreg(t)) {
        written.emplace_back(t, m);
      }
      return m;
    }));
  }
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta),
                       &meta_stack);
  } catch (const std::exception&) {
    return entry;  // not ok: synchronous
  }
  for (const auto& [dev, m] : written) {
    if (dev.sizes() != m.sizes() || dev.strides() != m.strides() ||
        dev.storage_offset() != m.storage_offset()) {
      return entry;
    }
  }
  auto aliases_input = [&](const at::Tensor& m) {
    for (const auto& [k, st] : storages) {
      if (st.unsafeGetStorageImpl() == m.storage().unsafeGetStorageImpl()) {
        return true;
      }
    }
    return false;
  };
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    OutSpec spec;
    const int arg = written_argument(schema, r);
    const c10::IValue& mv = meta_stack[r];
    auto add = [&](const at::Tensor& m) {
      spec.dtypes.push_back(m.options());
      spec.sizes.emplace_back(m.sizes().begin(), m.sizes().end());
      spec.strides.emplace_back(m.strides().begin(), m.strides().end());
    };
    if (arg >= 0) {
      spec.kind = OutSpec::kWritten;
      spec.arg = arg;
    } else if (mv.isTensor()) {
      const at::Tensor& m = mv.toTensor();
      if (!m.defined() || m.is_conj() || m.is_neg() || aliases_input(m)) {
        return entry;
      }
      spec.kind = OutSpec::kNew;
      add(m);
    } else if (mv.isTensorList()) {
      spec.kind = OutSpec::kNewList;
      for (const at::Tensor& m : mv.toTensorList()) {
        if (!m.defined() || aliases_input(m)) {
          return entry;
        }
        add(m);
      }
    } else if (!mv.isNone()) {
      return entry;
    }
    entry->outs.push_back(std::move(spec));
  }
  entry->ok = true;
  return entry;
}

// A signature whose meta description awaits comparison with a CPU run.
struct PendingVerification {
  std::string key;
  std::shared_ptr<const MetaEntry> entry;
};

bool try_fallback_async_meta(const c10::OperatorHandle& op,
                             torch::jit::Stack* stack, c10::Device device,
                             PendingVerification* verify) {
  const c10::FunctionSchema& schema = op.schema();
  if (meta_differs_from_cpu(schema.operator_name())) {
    return false;
  }
  const size_t num_args = schema.arguments().size();
  const size_t first = stack->size() - num_args;
  std::string key = schema.name();
  key += '.';
  key += schema.overload_name();
  key += ':';
  for (size_t i = 0; i < num_args; ++i) {
    append_signature(key, (*stack)[first + i]);
  }
  std::shared_ptr<const MetaEntry> entry = meta_cache().find(key);
  if (entry == nullptr) {
    // First call of this signature: run it synchronously, and trust the meta
    // kernel's description only if the CPU kernel's results agree with it
    // (some differ, e.g. half-precision layer norm keeps float statistics).
    std::shared_ptr<const MetaEntry> candidate =
        compute_meta(op, *stack, first);
    if (!candidate->ok) {
      meta_cache().insert(key, candidate);
    } else if (verify != nullptr) {
      *verify = {std::move(key), std::move(candidate)};
    }
    return false;
  }
  if (!entry->ok) {
    return false;
  }

  // Results, allocated now on the host.
  std::vector<c10::IValue> results;
  std::vector<std::pair<std::pair<size_t, int>, at::Tensor>> new_outputs;
  for (size_t r = 0; r < entry->outs.size(); ++r) {
    const OutSpec& spec = entry->outs[r];
    auto make = [&](size_t i) {
      at::Tensor out = at::empty_strided(spec.sizes[i], spec.strides[i],
                                         spec.dtypes[i].device(device));
      new_outputs.push_back(
          {{r, spec.kind == OutSpec::kNew ? -1 : int(i)}, borrowed_alias(out)});
      return out;
    };
    switch (spec.kind) {
      case OutSpec::kWritten:
        results.push_back((*stack)[first + static_cast<size_t>(spec.arg)]);
        break;
      case OutSpec::kNew:
        results.push_back(make(0));
        break;
      case OutSpec::kNewList: {
        c10::List<at::Tensor> list;
        for (size_t i = 0; i < spec.sizes.size(); ++i) {
          list.push_back(make(i));
        }
        results.push_back(list);
        break;
      }
      case OutSpec::kNone:
        results.emplace_back();
        break;
    }
  }

  std::vector<c10::IValue> captured =
      capture_arguments(*stack, first, num_args);
  launch_async(
      device.index(), op_name(schema),
      [op, captured = std::move(captured),
       new_outputs = std::move(new_outputs)]() {
        KernelViews views;
        torch::jit::Stack kernel_stack = run_cpu_kernel(op, captured, views);
        for (const auto& [where, out] : new_outputs) {
          const c10::IValue& v = kernel_stack[where.first];
          at::Tensor result =
              where.second < 0 ? v.toTensor() : v.toTensorList()[where.second];
          TORCH_CHECK(result.defined() && result.sizes() == out.sizes() &&
                          result.scalar_type() == out.scalar_type(),
                      "the CPU kernel's result differs from the meta "
                      "kernel's ",
                      out.sizes(), " ", out.scalar_type());
          views.view(out).copy_(result);
        }
      });

  torch::jit::drop(*stack, num_args);
  for (c10::IValue& r : results) {
    stack->push_back(std::move(r));
  }
  return true;
}

// Compares the results of a synchronous run with the meta description and
// caches the verdict: the signature runs asynchronously from now on only if
// every result matched in shape and dtype.
void verify_meta_entry(PendingVerification verify,
                       const torch::jit::Stack& stack, size_t ret_first,
                       bool bits_changed) {
  // A kernel that flips the conjugate/negative bit of an argument it writes
  // changes host-side metadata: only the synchronous path can carry that.
  bool agrees = !bits_changed;
  auto same = [](const at::Tensor& t, const OutSpec& spec, size_t i) {
    return t.defined() && t.sizes() == c10::IntArrayRef(spec.sizes[i]) &&
           t.scalar_type() == c10::typeMetaToScalarType(spec.dtypes[i].dtype());
  };
  const auto& outs = verify.entry->outs;
  for (size_t r = 0; r < outs.size() && agrees; ++r) {
    const c10::IValue& v = stack[ret_first + r];
    switch (outs[r].kind) {
      case OutSpec::kWritten:
        break;
      case OutSpec::kNew:
        agrees = v.isTensor() && same(v.toTensor(), outs[r], 0);
        break;
      case OutSpec::kNewList: {
        agrees =
            v.isTensorList() && v.toTensorList().size() == outs[r].sizes.size();
        for (size_t i = 0; agrees && i < outs[r].sizes.size(); ++i) {
          agrees = same(v.toTensorList()[i], outs[r], i);
        }
        break;
      }
      case OutSpec::kNone:
        agrees = v.isNone() || (v.isTensor() && !v.toTensor().defined());
        break;
    }
  }
  if (agrees) {
    meta_cache().insert(verify.key, std::move(verify.entry));
  } else {
    meta_cache().insert(verify.key, std::make_shared<const MetaEntry>());
  }
}

// Which operators have run through the fallback, and the once-per-operator
// warning about it (OPENREG_FALLBACK_WARNINGS=0 or
// torch.openreg.set_fallback_warnings(False) silences it).
class FallbackLog {
 public:
  void note(const c10::OperatorHandle& op) {
    // Fast path without a lock: this thread has seen the operator already.
    thread_local ska::flat_hash_set<const void*> seen_here;
    const void* key = &op.schema();
    if (!seen_here.insert(key).second) {
      return;
    }
    const std::string name = op_name(op.schema());
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      first = names_.insert(name).second;
    }
    if (first && warn_.load()) {
      TORCH_WARN("openreg: ", name,
                 " has no openreg kernel; it runs PyTorch's CPU kernel on the "
                 "device memory (the CPU fallback). Silence this with "
                 "torch.openreg.set_fallback_warnings(False) or "
                 "OPENREG_FALLBACK_WARNINGS=0.");
    }
  }

  std::vector<std::string> names() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {names_.begin(), names_.end()};
  }

  void set_warnings(bool enabled) { warn_.store(enabled); }

 private:
  std::mutex mutex_;  // guards names_
  std::set<std::string> names_;
  std::atomic<bool> warn_{[] {
    const char* env = std::getenv("OPENREG_FALLBACK_WARNINGS");
    return env == nullptr || std::string(env) != "0";
  }()};
};

FallbackLog& fallback_log() {
  static auto* log = new FallbackLog();  // leaked: used until exit
  return *log;
}

// [doc:fallback-dispatch]
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const auto& arg_schema = schema.arguments();
  const size_t num_args = arg_schema.size();
  const size_t first = stack->size() - num_args;
  auto args = torch::jit::last(*stack, num_args);

  TORCH_CHECK_NOT_IMPLEMENTED(
      op.hasKernelForDispatchKey(c10::DispatchKey::CPU), "The operator '",
      schema.name(),
      "' has no openreg kernel, and the CPU fallback cannot run it because "
      "it has no CPU kernel either.");
  const c10::Device device = find_device(op, args);
  const c10::DeviceGuard guard(device);
  fallback_log().note(op);
  PendingVerification verify;
  bool any_written = false;
  if (!launch_blocking() && can_run_async(schema, *stack, &any_written) &&
      (try_fallback_async(op, stack, device, any_written) ||
       try_fallback_async_meta(op, stack, device, &verify))) {
    return;
  }
  // [/doc:fallback-dispatch]

  // Keep the original arguments: in-place results return them.
  std::vector<c10::IValue> originals(args.begin(), args.end());
  KernelViews views;
  struct Mutated {
    at::Tensor dev;
    at::Tensor view;
    void* base;
    bool conj;
    bool neg;
  };
  std::vector<Mutated> mutated;

  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& v = (*stack)[first + i];
    const c10::Argument& a = arg_schema[i];
    const bool writes = a.alias_info() != nullptr && a.alias_info()->isWrite();
    if (is_generator_arg(a)) {
      std::optional<at::Generator> gen;
      if (v.isGenerator()) {
        gen = v.toGenerator();
      }
      v = kernel_generator(gen, device.index());
      continue;
    }
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      v = c10::Device(c10::DeviceType::CPU);
      continue;
    }
    // A single mutable tensor may be resized by the kernel (out=, set_);
    // mutable lists (the _foreach_ ops) are only written in place.
    const bool may_resize = writes && v.isTensor();
    v = map_tensors(v, [&](const at::Tensor& t) -> at::Tensor {
      if (!is_openreg(t)) {
        return t;
      }
      at::Tensor view = views.view(t, may_resize);
      if (may_resize) {
        mutated.push_back({t, view, view.storage().mutable_data(),
                           view.is_conj(), view.is_neg()});
      }
      return view;
    });
  }

  run_sync(device.index(), [&] {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  });

  bool bits_changed = false;
  for (const Mutated& m : mutated) {
    bits_changed =
        bits_changed || m.view.is_conj() != m.conj || m.view.is_neg() != m.neg;
    sync_mutated(m.dev, m.view, m.base);
  }

  const auto& ret_schema = schema.returns();
  const size_t num_rets = ret_schema.size();
  const size_t ret_first = stack->size() - num_rets;
  auto convert = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || !t.device().is_cpu()) {
      return t;
    }
    TORCH_CHECK_NOT_IMPLEMENTED(t.layout() == c10::kStrided,
                                "openreg supports only strided tensors, ",
                                "but the CPU kernel of ", op_name(schema),
                                " returned a ", t.layout(), " tensor");
    if (const c10::Storage* storage = views.device_storage_of(t)) {
      return device_alias(*storage, t);  // a view of an input
    }
    return copy_to_device(t, device);
  };
  for (size_t r = 0; r < num_rets; ++r) {
    c10::IValue& v = (*stack)[ret_first + r];
    const c10::AliasInfo* alias = ret_schema[r].alias_info();
    if (alias != nullptr && alias->isWrite()) {
      // An in-place or out= result: return the argument it aliases.
      for (size_t i = 0; i < num_args; ++i) {
        const c10::AliasInfo* arg_alias = arg_schema[i].alias_info();
        if (arg_alias != nullptr &&
            arg_alias->beforeSets() == alias->beforeSets()) {
          v = originals[i];
          break;
        }
      }
      continue;
    }
    v = map_tensors(v, convert);
  }
  if (verify.entry != nullptr) {
    verify_meta_entry(std::move(verify), *stack, ret_first, bits_changed);
  }
}

}  // namespace

std::vector<std::string> fallback_ops() { return fallback_log().names(); }

void set_fallback_warnings(bool enabled) {
  fallback_log().set_warnings(enabled);
}

// [doc:fallback-register]
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}
// [/doc:fallback-register]

// [doc:fallback-forced]
// Functional ops whose generic (CompositeExplicitAutogradNonFunctional)
// kernel would call the out= variant with a pre-shaped output that the CPU
// kernel then resizes, warning about it. Sending the functional op itself to
// the fallback gives the CPU's behaviour.
// Also ops whose generic kernel is a slower decomposition that rounds
// differently from the CPU kernel (layer norm; group norm, whose
// math_group_norm rounds batch norm's output to the input dtype before a
// separate addcmul applies weight and bias; addr, whose math_addr rounds
// beta * self, outer(vec1, vec2) and their sum separately): the fallback runs
// the CPU kernel itself, so results match the CPU exactly.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name :
       {"mse_loss", "native_layer_norm", "native_layer_norm_backward",
        "native_group_norm", "addr", "addr.out"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
}
// [/doc:fallback-forced]

}  // namespace openreg
