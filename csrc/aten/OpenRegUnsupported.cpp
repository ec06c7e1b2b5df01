// Tensor kinds openreg does not support, refused with a clear error.
//
// A quantized tensor on openreg dispatches to the QuantizedPrivateUse1 key,
// where nothing is registered; PyTorch's own message ("Could not run
// 'aten::empty_strided' with arguments from the 'Quantizedopenreg' backend")
// names an internal operator. This fallback says what is unsupported and
// what to do instead. (PyTorch has deprecated its quantized tensors in
// favour of torchao; sparse and nested tensors run:
// fallback/OpenRegLayoutFallback.cpp.)
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

}  // namespace

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(
      torch::CppFunction::makeFromBoxedFunction<&quantized_unsupported>());
}

}  // namespace openreg
