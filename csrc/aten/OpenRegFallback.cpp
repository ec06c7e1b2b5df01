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
#include <torch/library.h>

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

// The asynchronous path, for in-place and out= operators (every result is
// an argument it writes): the host knows all output metadata already, so the
// CPU kernel can run later on the stream. Functional operators reach it too:
// PyTorch's generic kernels for structured ops allocate the output on the
// device and call the out= variant. Returns false (having changed nothing)
// for the synchronous path: results the host must see (new tensors, scalars),
// random ops (generator state must be read in program order), output_mask
// ops, outputs that are empty (to be resized) or overlap an input partially
// (the CPU raises; the synchronous path raises the same error).
//
// The kernel captures non-owning handles: a block freed on the host goes
// back to the caching allocator at once and is reused on the same stream
// only after this kernel (stream order), as CUDA's allocator does; use on
// another stream needs Tensor.record_stream, as on CUDA.
bool try_fallback_async(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                        c10::Device device) {
  const c10::FunctionSchema& schema = op.schema();
  const auto& arg_schema = schema.arguments();
  const size_t num_args = arg_schema.size();
  for (const c10::Argument& a : arg_schema) {
    if (is_generator_arg(a) || a.name() == "output_mask") {
      return false;
    }
  }
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    if (written_argument(schema, r) < 0) {
      return false;
    }
  }
  const size_t first = stack->size() - num_args;
  bool any_written = false;
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = (*stack)[first + i];
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
    any_written = true;
    for (size_t j = 0; j < num_args; ++j) {
      bool partial = false;
      for_each_tensor((*stack)[first + j], [&](const at::Tensor& t) {
        partial = partial || (t.defined() && is_openreg(t) &&
                              at::get_overlap_status(w, t) ==
                                  at::MemOverlapStatus::Partial);
      });
      if (partial) {
        return false;
      }
    }
  }
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

  std::vector<c10::IValue> captured;
  captured.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    captured.push_back(
        map_tensors((*stack)[first + i], [](const at::Tensor& t) {
          if (!t.defined()) {
            return t;
          }
          // CPU tensors (scalars, indices) are snapshots: the host may change
          // them before the kernel runs.
          if (is_openreg(t)) {
            return borrowed_alias(t);
          }
          at::Tensor snapshot = t.clone();
          if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
            // A Python number stays a "wrapped number" for type promotion.
            snapshot.unsafeGetTensorImpl()->set_wrapped_number(true);
          }
          return snapshot;
        }));
  }
  std::string name = schema.name();
  if (!schema.overload_name().empty()) {
    name += "." + schema.overload_name();
  }
  launch_async(
      device.index(), std::move(name), [op, captured = std::move(captured)]() {
        KernelViews views;
        torch::jit::Stack kernel_stack;
        kernel_stack.reserve(captured.size());
        std::vector<std::pair<at::Tensor, at::Tensor>> written;
        const auto& args = op.schema().arguments();
        for (size_t i = 0; i < captured.size(); ++i) {
          const c10::AliasInfo* a = args[i].alias_info();
          const bool writes =
              a != nullptr && a->isWrite() && captured[i].isTensor();
          kernel_stack.push_back(
              map_tensors(captured[i], [&](const at::Tensor& t) {
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
        op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU),
                           &kernel_stack);
        for (const auto& [dev, view] : written) {
          TORCH_CHECK(
              dev.sizes() == view.sizes() && dev.strides() == view.strides(),
              "the out= argument of shape ", dev.sizes(),
              " would have to be resized to ", view.sizes(),
              "; asynchronous kernels cannot resize device "
              "tensors: pass an output of the right shape, "
              "or an empty one");
        }
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
