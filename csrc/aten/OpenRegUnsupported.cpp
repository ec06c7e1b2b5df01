// Tensor kinds openreg does not support, refused with a clear error.
//
// A quantized or sparse tensor on openreg dispatches to the
// QuantizedPrivateUse1 / SparsePrivateUse1 keys, where nothing is
// registered; PyTorch's own message ("Could not run 'aten::empty_strided'
// with arguments from the 'Quantizedopenreg' backend") names an internal
// operator. These fallbacks say what is unsupported and what to do instead.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

namespace openreg {

namespace {

void quantized_unsupported(const c10::OperatorHandle& op,
                           torch::jit::Stack* /*stack*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "openreg does not support quantized tensors (", op.schema().name(),
      " was called with one); quantize and run quantized models on the CPU");
}

void sparse_unsupported(const c10::OperatorHandle& op,
                        torch::jit::Stack* /*stack*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "openreg does not support sparse COO tensors (",
      op.schema().name(),
      " was called with one); openreg supports only strided tensors: use "
      "to_dense(), or keep the sparse tensor on the CPU");
}

}  // namespace

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(
      torch::CppFunction::makeFromBoxedFunction<&quantized_unsupported>());
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_unsupported>());
}

}  // namespace openreg
