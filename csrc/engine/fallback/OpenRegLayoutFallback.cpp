// Sparse (COO and compressed) and nested tensors on openreg: the fallback of
// their dispatch keys (SparsePrivateUse1, SparseCsrPrivateUse1,
// NestedTensorPrivateUse1), and the few kernels that only describe such a
// tensor (its indices, values, dimensions), registered natively.
//
// A call with an openreg tensor of another layout than strided runs
// PyTorch's CPU kernel of that layout (SparseCPU, SparseCsrCPU,
// NestedTensorCPU) on CPU twins of its tensors whose parts are kernel views
// of the device parts (OpenRegLayouts.h): the kernel reads and writes device
// memory in place, what it allocates is device memory (a result the device
// cannot hold raises out of memory before it is computed), and its results
// become device tensors of their layout. The CPU's checks raise the CPU's
// errors; what the CPU does not support raises the CPU's error too.
//
// Such calls run synchronously (after the stream drained, like the first
// call of a strided signature): the metadata of their results (a sparse
// tensor's nnz, a nested tensor's sizes) depends on the data.
//
// What a vendor keeps: the registrations and the dispatch-key fallback; what
// it replaces: the CPU kernels, by its own sparse and nested kernels.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/ccol_indices_native.h>
#include <ATen/ops/col_indices_native.h>
#include <ATen/ops/crow_indices_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/row_indices_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/values_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "aten/OpenRegLaunch.h"
#include "aten/fallback/OpenRegIValue.h"
#include "aten/fallback/OpenRegOpTraits.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegStream.h"
#include "engine/OpenRegKernelView.h"
#include "engine/fallback/OpenRegFallback.h"
#include "engine/fallback/OpenRegLayouts.h"
#include "engine/memory/OpenRegKernelScratch.h"

namespace openreg {

namespace {

// Bytes of the largest strided part of `t` (the KernelMemoryOnDevice spill
// limit).
size_t largest_part(const at::Tensor& t) {
  if (!t.defined()) {
    return 0;
  }
  if (t.layout() == c10::kSparse) {
    return std::max(largest_part(t._indices()), largest_part(t._values()));
  }
  if (t.is_sparse_csr()) {
    return largest_part(t.values());
  }
  if (t.is_nested() || t.layout() != c10::kStrided) {
    return 0;
  }
  return t.has_storage() ? t.storage().nbytes() : 0;
}

// [doc:layout-fallback]
void layout_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpTraits& traits = op_traits(op);
  const size_t num_args = op.schema().arguments().size();
  const size_t first = stack->size() - num_args;
  const c10::Device device =
      find_device(traits, torch::jit::last(*stack, num_args));
  const c10::DeviceGuard guard(device);
  std::vector<c10::IValue> originals(stack->begin() + first, stack->end());
  // A Device argument that is not openreg names where results go (the CPU
  // for .cpu()): they stay there.
  bool results_on_host = false;
  size_t largest = 0;
  for (const c10::IValue& v : originals) {
    if (v.isDevice() && v.toDevice().type() != c10::DeviceType::PrivateUse1) {
      results_on_host = true;
    }
    for_each_tensor(v, [&](const at::Tensor& t) {
      largest = std::max(largest, largest_part(t));
    });
  }
  // Staged views (a driver without kernel pointers): what the kernel
  // changes is copied back after it ("staged-kernels", OpenRegKernelView.h).
  std::optional<StagedKernelScope> staged_scope;
  if (!host_kernels_supported()) {
    staged_scope.emplace();
  }
  KernelViews views;
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // device, CPU twin
  std::vector<void*> bases;
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      v = c10::Device(c10::DeviceType::CPU);
      continue;
    }
    const bool writes = traits.writes[i] && v.isTensor();
    v = map_tensors(v, [&](const at::Tensor& t) -> at::Tensor {
      if (!is_openreg(t)) {
        return t;
      }
      const bool dense = t.layout() == c10::kStrided && !t.is_nested();
      at::Tensor twin = dense && writes ? views.view(t, /*resizable=*/true)
                                        : kernel_tensor(t, views);
      if (t.requires_grad() && !twin.requires_grad()) {
        // Some kernels compute what their backward needs only for an input
        // that requires grad (_sparse_mm_reduce_impl's argmax indices). The
        // twin is this call's own tensor.
        twin.set_requires_grad(true);
      }
      if (writes) {
        written.emplace_back(t, twin);
        bases.push_back(dense ? twin.storage().mutable_data() : nullptr);
      }
      return twin;
    });
  }
  const c10::Stream stream = getCurrentStream(device.index()).unwrap();
  run_sync(
      device.index(),
      [&] {
        std::optional<KernelMemoryOnDevice> on_device;
        if (!results_on_host && host_kernels_supported()) {
          on_device.emplace(stream, largest);
        }
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        op.callBoxed(stack);  // the CPU kernel of the twins' layouts
      },
      -1, traits.display_name.c_str());
  if (staged_scope) {
    staged_scope->write_back_changed();
  }
  for (size_t k = 0; k < written.size(); ++k) {
    sync_tensor(written[k].first, written[k].second, views, bases[k]);
  }
  const size_t num_rets = traits.return_arg.size();
  const size_t ret_first = stack->size() - num_rets;
  for (size_t r = 0; r < num_rets; ++r) {
    c10::IValue& v = (*stack)[ret_first + r];
    if (traits.return_arg[r] >= 0) {
      v = originals[static_cast<size_t>(traits.return_arg[r])];
    } else if (results_on_host) {
      // Copies of device data, never views of device memory.
      v = map_tensors(v, [&](const at::Tensor& t) {
        return t.defined() && t.layout() == c10::kStrided && !t.is_nested() &&
                       views.device_storage_of(t) != nullptr
                   ? t.clone()
                   : t;
      });
    } else {
      v = map_tensors(v, [&](const at::Tensor& t) {
        return device_tensor(t, views, device);
      });
    }
  }
}
// [/doc:layout-fallback]

}  // namespace

// [doc:layout-route]
int route_layout_ops_to_fallback() {
  // PyTorch's CompositeExplicitAutograd kernels serve every backend key,
  // sparse and nested ones included, ahead of a fallback, and assume strided
  // tensors (clone of a sparse tensor ran the dense clone). So each aten
  // operator the CPU runs for a layout (a SparseCPU, SparseCsrCPU or
  // NestedTensorCPU kernel) and openreg has no kernel of its own for goes to
  // the layout fallback explicitly, at module load, after every static
  // registration (a vendor's own kernel always wins).
  static torch::Library* libraries[3] = {};
  constexpr std::pair<c10::DispatchKey, c10::DispatchKey> kLayouts[] = {
      {c10::DispatchKey::SparseCPU, c10::DispatchKey::SparsePrivateUse1},
      {c10::DispatchKey::SparseCsrCPU, c10::DispatchKey::SparseCsrPrivateUse1},
      {c10::DispatchKey::NestedTensorCPU,
       c10::DispatchKey::NestedTensorPrivateUse1},
  };
  TORCH_INTERNAL_ASSERT(libraries[0] == nullptr, "routed twice");
  int routed = 0;
  for (size_t k = 0; k < 3; ++k) {
    const auto [cpu, ours] = kLayouts[k];
    libraries[k] = new torch::Library(torch::Library::IMPL, "aten", ours,
                                      __FILE__, __LINE__);
    for (const c10::OperatorName& name :
         c10::Dispatcher::singleton().getAllOpNames()) {
      const std::optional<c10::OperatorHandle> op =
          c10::Dispatcher::singleton().findOp(name);
      if (!op || name.getNamespace() != std::string_view("aten") ||
          !op->hasKernelForDispatchKey(cpu) ||
          op->hasKernelForDispatchKey(ours)) {
        continue;
      }
      std::string short_name = name.name.substr(name.name.find("::") + 2);
      if (!name.overload_name.empty()) {
        short_name += "." + name.overload_name;
      }
      libraries[k]->impl(
          short_name.c_str(),
          torch::CppFunction::makeFromBoxedFunction<&layout_fallback>());
      ++routed;
    }
  }
  return routed;
}
// [/doc:layout-route]

// [doc:layout-register]
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&layout_fallback>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&layout_fallback>());
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&layout_fallback>());
}

namespace {

// ATen's constructors of a sparse tensor make its first (empty) parts on the
// current device: a guard makes that the device the tensor is for, as the
// device guard of a generated CUDA registration does.
at::Tensor sparse_from_parts(
    int64_t sparse_dim, int64_t dense_dim, c10::SymIntArrayRef size,
    const at::Tensor& indices, const at::Tensor& values,
    std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
    std::optional<at::Device> device, std::optional<bool> pin_memory,
    std::optional<bool> is_coalesced) {
  const c10::OptionalDeviceGuard guard(is_openreg(values) ? values.device()
                                                          : device);
  return at::native::new_with_dims_and_tensor_sparse_symint(
      sparse_dim, dense_dim, size, indices, values, dtype, layout, device,
      pin_memory, is_coalesced);
}

at::Tensor sparse_with_dims(int64_t sparse_dim, int64_t dense_dim,
                            at::IntArrayRef size,
                            std::optional<at::ScalarType> dtype,
                            std::optional<at::Layout> layout,
                            std::optional<at::Device> device,
                            std::optional<bool> pin_memory) {
  const c10::OptionalDeviceGuard guard(device);
  return at::native::new_with_dims_sparse(sparse_dim, dense_dim, size, dtype,
                                          layout, device, pin_memory);
}

}  // namespace

// Kernels that only make or describe a sparse tensor from its parts: ATen's
// own, which every device shares (they touch no data).
TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("_sparse_coo_tensor_with_dims_and_tensors",
         TORCH_FN(sparse_from_parts));
  m.impl("_sparse_coo_tensor_with_dims", TORCH_FN(sparse_with_dims));
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_dimI", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
}

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("crow_indices", TORCH_FN(at::native::crow_indices_sparse_csr));
  m.impl("col_indices", TORCH_FN(at::native::col_indices_sparse_csr));
  m.impl("ccol_indices", TORCH_FN(at::native::ccol_indices_sparse_csr));
  m.impl("row_indices", TORCH_FN(at::native::row_indices_sparse_csr));
  m.impl("values", TORCH_FN(at::native::values_sparse_csr));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse_csr));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse_csr));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse_csr));
}
// [/doc:layout-register]

}  // namespace openreg
