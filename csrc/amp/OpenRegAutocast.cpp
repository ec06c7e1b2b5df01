// Autocast for openreg: the AutocastPrivateUse1 dispatch key with CUDA's
// policy lists (PyTorch's shared AT_FORALL_* lists), so
// torch.autocast("openreg", dtype=torch.float16 / torch.bfloat16) casts
// exactly the ops CUDA casts:
//  - lower_precision_fp: matmul/conv family run in the autocast dtype;
//  - fp32: ops that need range or precision run in float32;
//  - fp32_set_opt_dtype / fp32_append_dtype: reductions get dtype=float32;
//  - promote: mixed-dtype ops run in the widest input dtype.
//  - banned: binary_cross_entropy raises, as under CUDA autocast.
// Every other op falls through to the next dispatch key unchanged.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace openreg {

namespace {

// PyTorch's signature lists name these types unqualified.
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

// As CUDA's autocast: binary_cross_entropy is not safe in reduced precision
// and is refused with PyTorch's explanation (the CUDA function is internal
// to ATen, so it is written out here).
Tensor binary_cross_entropy_banned(const Tensor& /*self*/,
                                   const Tensor& /*target*/,
                                   const std::optional<Tensor>& /*weight*/,
                                   int64_t /*reduction*/) {
  TORCH_CHECK(
      false,
      "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are "
      "unsafe to autocast.\n"
      "Many models use a sigmoid layer right before the binary cross entropy "
      "layer.\n"
      "In this case, combine the two layers using "
      "torch.nn.functional.binary_cross_entropy_with_logits\n"
      "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and "
      "BCEWithLogits are\n"
      "safe to autocast.");
}

// [doc:autocast-register]
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define OPENREG_LOWER_PRECISION_FP(...) \
  KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(OPENREG_LOWER_PRECISION_FP)
#undef OPENREG_LOWER_PRECISION_FP

#define OPENREG_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(OPENREG_FP32)
#undef OPENREG_FP32

#define OPENREG_FP32_SET_OPT_DTYPE(...) \
  KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(OPENREG_FP32_SET_OPT_DTYPE)
#undef OPENREG_FP32_SET_OPT_DTYPE

  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(
      KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)

#define OPENREG_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(OPENREG_PROMOTE)
#undef OPENREG_PROMOTE

  m.impl("binary_cross_entropy", TORCH_FN(binary_cross_entropy_banned));
}
// [/doc:autocast-register]

}  // namespace

}  // namespace openreg
