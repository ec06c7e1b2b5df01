// The global fallback: any ATen operator without an openreg kernel runs
// PyTorch's CPU kernel directly on device memory.
//
// For each call the fallback
//  1. finds the device (the first openreg tensor, or an openreg Device
//     argument) and rejects mixed devices the way CUDA does;
//  2. replaces every openreg tensor by its kernel view (a CPU tensor over the
//     same bytes), openreg generators by their CPU state, openreg devices by
//     the CPU;
//  3. runs the CPU kernel as device work (launch());
//  4. maps results back: in-place and out= results are the original device
//     arguments (resized if the kernel resized them), views of an input
//     become device views of the same storage, new tensors are copied into
//     device memory.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <ATen/ops/contiguous.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <deque>
#include <string_view>
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
}

// Meta tensors mirroring device tensors, one meta storage per device storage,
// so that running an op on them shows which results alias which inputs.
class MetaMirror {
 public:
  at::Tensor meta(const at::Tensor& t) {
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    const c10::Storage* meta_storage = nullptr;
    for (const Entry& e : entries_) {
      if (e.device == key) {
        meta_storage = &e.meta_storage;
      }
    }
    if (meta_storage == nullptr) {
      // The meta storage carries the device address (never dereferenced),
      // so host-side overlap checks see the same addresses as the CPU would.
      c10::DataPtr fake(const_cast<void*>(t.storage().data()),
                        c10::Device(c10::DeviceType::Meta));
      entries_.push_back(
          {key, t.storage(),
           c10::Storage(c10::make_intrusive<c10::StorageImpl>(
               c10::StorageImpl::use_byte_size_t(), t.storage().nbytes(),
               std::move(fake), c10::GetAllocator(c10::DeviceType::Meta),
               /*resizable=*/true))});
      meta_storage = &entries_.back().meta_storage;
    }
    at::Tensor m = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(*meta_storage),
        c10::DispatchKeySet(c10::DispatchKey::Meta), t.dtype());
    m.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(),
                                                   t.storage_offset());
    m._set_conj(t.is_conj());
    m._set_neg(t.is_neg());
    return m;
  }

  // The device storage a meta result aliases, or nullptr for a new tensor.
  const c10::Storage* device_storage_of(const at::Tensor& m) const {
    for (const Entry& e : entries_) {
      if (e.meta_storage.unsafeGetStorageImpl() ==
          m.storage().unsafeGetStorageImpl()) {
        return &e.device_storage;
      }
    }
    return nullptr;
  }

 private:
  struct Entry {
    c10::StorageImpl* device;
    c10::Storage device_storage;
    c10::Storage meta_storage;
  };
  std::deque<Entry> entries_;  // stable addresses
};

bool is_tensor_type(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) {
    return true;
  }
  if (auto opt = type->cast<c10::OptionalType>()) {
    return opt->getElementType()->kind() == c10::TypeKind::TensorType;
  }
  if (auto list = type->cast<c10::ListType>()) {
    return list->getElementType()->kind() == c10::TypeKind::TensorType;
  }
  return false;
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

// Ops whose meta kernel describes results the CPU kernel does not produce
// (batch norm in eval mode returns empty saved statistics on the CPU).
bool meta_differs_from_cpu(const c10::OperatorName& name) {
  static constexpr std::string_view kOps[] = {
      "aten::native_batch_norm", "aten::_native_batch_norm_legit",
      "aten::_native_batch_norm_legit_no_training",
      "aten::_batch_norm_with_update", "aten::_batch_norm_no_update"};
  for (auto op : kOps) {
    if (name.name == op) {
      return true;
    }
  }
  return false;
}

// A new result the kernel must copy into device memory.
struct NewOutput {
  size_t ret;
  int list_index;  // -1 for a single tensor
  at::Tensor device;
};

// The asynchronous path: output metadata comes from the op's meta kernel on
// the host, the CPU kernel runs later on the stream. Returns false (having
// changed nothing) when the op needs the synchronous path: random ops (their
// generator state must be read in program order), non-tensor results, no
// usable meta kernel (e.g. data-dependent output shapes), or out= arguments
// the op would resize.
bool try_fallback_async(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                        c10::Device device) {
  const c10::FunctionSchema& schema = op.schema();
  if (meta_differs_from_cpu(schema.operator_name())) {
    return false;
  }
  const auto& arg_schema = schema.arguments();
  const size_t num_args = arg_schema.size();
  for (const c10::Argument& a : arg_schema) {
    // An output_mask makes some results undefined on the CPU while meta
    // kernels still describe them: only the CPU run knows.
    if (is_generator_arg(a) || a.name() == "output_mask") {
      return false;
    }
  }
  for (const c10::Argument& r : schema.returns()) {
    if (!is_tensor_type(r.type())) {
      return false;
    }
  }
  const size_t first = stack->size() - num_args;
  MetaMirror mirror;
  torch::jit::Stack meta_stack;
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // (device, meta)
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = (*stack)[first + i];
    if (v.isDevice()) {
      return false;
    }
    const c10::AliasInfo* a = arg_schema[i].alias_info();
    const bool writes = a != nullptr && a->isWrite() && v.isTensor();
    meta_stack.push_back(map_tensors(v, [&](const at::Tensor& t) {
      if (!is_openreg(t)) {
        return t;
      }
      at::Tensor m = mirror.meta(t);
      if (writes) {
        written.emplace_back(t, m);
      }
      return m;
    }));
  }
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta),
                       &meta_stack);
  } catch (const std::exception&) {
    return false;  // the synchronous path runs it (or raises its error)
  }
  for (const auto& [dev, m] : written) {
    if (dev.sizes() != m.sizes() || dev.strides() != m.strides() ||
        dev.storage_offset() != m.storage_offset() ||
        m.storage().nbytes() > dev.storage().nbytes()) {
      return false;
    }
    // Meta kernels skip memory-overlap checks; an output that partially
    // overlaps an input takes the synchronous path, which raises exactly
    // where the CPU does.
    if (at::has_internal_overlap(dev) == at::MemOverlap::Yes) {
      return false;
    }
    for (size_t i = 0; i < num_args; ++i) {
      bool partial = false;
      for_each_tensor((*stack)[first + i], [&](const at::Tensor& t) {
        partial = partial || (t.defined() && is_openreg(t) &&
                              at::get_overlap_status(dev, t) ==
                                  at::MemOverlapStatus::Partial);
      });
      if (partial) {
        return false;
      }
    }
  }

  // Results, known now on the host.
  const size_t num_rets = schema.returns().size();
  std::vector<c10::IValue> results(num_rets);
  std::vector<NewOutput> new_outputs;
  auto plan = [&](const at::Tensor& m, size_t r, int index) -> at::Tensor {
    if (!m.defined()) {
      return m;
    }
    if (const c10::Storage* storage = mirror.device_storage_of(m)) {
      return device_alias(*storage, m);  // a view of an input
    }
    at::Tensor out =
        at::empty_strided(m.sizes(), m.strides(), m.options().device(device));
    out._set_conj(m.is_conj());
    out._set_neg(m.is_neg());
    new_outputs.push_back({r, index, device_alias(out.storage(), out)});
    return out;
  };
  for (size_t r = 0; r < num_rets; ++r) {
    const int arg = written_argument(schema, r);
    if (arg >= 0) {
      results[r] = (*stack)[first + static_cast<size_t>(arg)];
      continue;
    }
    const c10::IValue& mv = meta_stack[r];
    if (mv.isTensor()) {
      results[r] = plan(mv.toTensor(), r, -1);
    } else if (mv.isTensorList()) {
      c10::List<at::Tensor> list;
      int index = 0;
      for (const at::Tensor& m : mv.toTensorList()) {
        list.push_back(plan(m, r, index++));
      }
      results[r] = list;
    } else {
      results[r] = mv;  // None
    }
  }

  // What the kernel captures: fresh handles over the device storages (the
  // memory stays alive until the kernel ran; no Python objects), and
  // snapshots of CPU tensors (the host may change them before it runs).
  std::vector<c10::IValue> captured;
  captured.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    captured.push_back(
        map_tensors((*stack)[first + i], [](const at::Tensor& t) {
          if (!t.defined()) {
            return t;
          }
          return is_openreg(t) ? device_alias(t.storage(), t) : t.clone();
        }));
  }
  std::string name = schema.name();
  if (!schema.overload_name().empty()) {
    name += "." + schema.overload_name();
  }
  launch_async(
      device.index(), std::move(name),
      [op, captured = std::move(captured),
       new_outputs = std::move(new_outputs)]() {
        KernelViews views;
        torch::jit::Stack kernel_stack;
        kernel_stack.reserve(captured.size());
        for (const c10::IValue& v : captured) {
          kernel_stack.push_back(map_tensors(v, [&](const at::Tensor& t) {
            return is_openreg(t) ? views.view(t) : t;
          }));
        }
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU),
                           &kernel_stack);
        for (const NewOutput& out : new_outputs) {
          const c10::IValue& v = kernel_stack[out.ret];
          at::Tensor result = out.list_index < 0
                                  ? v.toTensor()
                                  : v.toTensorList()[out.list_index];
          TORCH_CHECK(result.defined() &&
                          result.sizes() == out.device.sizes() &&
                          result.scalar_type() == out.device.scalar_type(),
                      "result ", result.sizes(), " ", result.scalar_type(),
                      " differs from the meta kernel's ", out.device.sizes(),
                      " ", out.device.scalar_type());
          views.view(out.device).copy_(result);
        }
      });

  torch::jit::drop(*stack, num_args);
  for (c10::IValue& r : results) {
    stack->push_back(std::move(r));
  }
  return true;
}

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
  if (!launch_blocking() && try_fallback_async(op, stack, device)) {
    return;
  }

  // Keep the original arguments: in-place results return them.
  std::vector<c10::IValue> originals(args.begin(), args.end());
  KernelViews views;
  struct Mutated {
    at::Tensor dev;
    at::Tensor view;
    void* base;
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
        mutated.push_back({t, view, view.storage().mutable_data()});
      }
      return view;
    });
  }

  run_sync(device.index(), [&] {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  });

  for (const Mutated& m : mutated) {
    sync_mutated(m.dev, m.view, m.base);
  }

  const auto& ret_schema = schema.returns();
  const size_t num_rets = ret_schema.size();
  const size_t ret_first = stack->size() - num_rets;
  auto convert = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || !t.device().is_cpu()) {
      return t;
    }
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
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

// Functional ops whose generic (CompositeExplicitAutogradNonFunctional)
// kernel would call the out= variant with a pre-shaped output that the CPU
// kernel then resizes, warning about it. Sending the functional op itself to
// the fallback gives the CPU's behaviour.
// Also ops whose generic kernel is a slower decomposition that rounds
// differently from the CPU kernel (layer norm): the fallback runs the CPU
// kernel itself, so results match the CPU exactly.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name :
       {"mse_loss", "native_layer_norm", "native_layer_norm_backward"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
}

}  // namespace openreg
