// Random operators with an openreg kernel: they draw from the device's
// generator (torch.Generator("openreg:N")), not the CPU's global one, so
// torch.openreg.manual_seed governs them.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones_like.h>

#include <cstdint>
#include <tuple>

#include "PrivateUse1NativeFunctions.h"  // generated (csrc/openreg_native_functions.yaml)
#include "aten/OpenRegKernelView.h"
#include "aten/OpenRegLaunch.h"
#include "aten/OpenRegParallel.h"
#include "random/OpenRegGenerator.h"
#include "random/OpenRegPhilox.h"

namespace openreg {

namespace {

// The dtypes and layouts the fused kernels take: floating tensors whose
// elements fill their memory exactly once (any dense permutation), so the
// kernel walks memory linearly and every tensor of the call has the same
// strides.
bool fusable(const at::Tensor& t) {
  return at::isFloatingType(t.scalar_type()) &&
         t.is_non_overlapping_and_dense();
}

// [doc:fused-dropout]
// Dropout as CUDA runs it: one kernel writes the mask and the result, its
// random numbers from Philox keyed by the launch's reserved draw, so it is
// queued like any kernel and split over threads without changing a bit.
// Element i (in memory order) is kept when the top 24 bits of number i of
// the stream are below keep * 2^24. The arithmetic is the CPU's
// `input * mask * scale`: a dropped NaN or inf stays NaN.
template <typename scalar_t>
void dropout_kernel(const scalar_t* in, scalar_t* out, bool* mask, int64_t n,
                    uint32_t threshold, double scale, const RandomDraw& draw) {
  using opmath_t = at::opmath_type<scalar_t>;
  const auto s = static_cast<opmath_t>(scale);
  const Philox4x32 philox(draw);
  constexpr int64_t kGrainBlocks = 4096;  // 16384 elements
  parallel_chunks(0, (n + 3) / 4, kGrainBlocks, [&](int64_t b, int64_t e) {
    const int64_t last = std::min(n, e * 4);  // this chunk's elements end
    uint32_t r[4 * Philox4x32::kBatch];
    for (int64_t block = b; block < e; block += Philox4x32::kBatch) {
      philox.batch(static_cast<uint64_t>(block), r);
      const int64_t first = block * 4;
      const int64_t count =
          std::min<int64_t>(4 * Philox4x32::kBatch, last - first);
      for (int64_t j = 0; j < count; ++j) {
        const bool keep = (r[j] >> 8) < threshold;
        const int64_t i = first + j;
        mask[i] = keep;
        out[i] = static_cast<scalar_t>(static_cast<opmath_t>(in[i]) *
                                       static_cast<opmath_t>(keep) * s);
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> fused_dropout(const at::Tensor& input,
                                                 double keep) {
  const double scale = keep == 0. ? 0. : 1. / keep;
  // keep = 1 keeps all: 2^24 is above every 24-bit value.
  const auto threshold =
      static_cast<uint32_t>(keep * static_cast<double>(1u << 24));
  at::Tensor out = at::empty_like(input);
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  const c10::DeviceIndex device = input.device().index();
  const RandomDraw draw = reserve_draw(std::nullopt, device);
  const int64_t n = input.numel();
  launch_async(
      device, "aten::native_dropout",
      [in = borrowed_alias(input), res = borrowed_alias(out),
       m = borrowed_alias(mask), n, threshold, scale, draw] {
        KernelViews views;
        const at::Tensor src = views.view(in);
        at::Tensor dst = views.view(res);
        at::Tensor bits = views.view(m);
        AT_DISPATCH_FLOATING_TYPES_AND2(
            at::kHalf, at::kBFloat16, src.scalar_type(), "native_dropout", [&] {
              dropout_kernel<scalar_t>(src.const_data_ptr<scalar_t>(),
                                       dst.mutable_data_ptr<scalar_t>(),
                                       bits.mutable_data_ptr<bool>(), n,
                                       threshold, scale, draw);
            });
      },
      n);
  return {out, mask};
}
// [/doc:fused-dropout]

}  // namespace

std::tuple<at::Tensor, at::Tensor> OpenRegNativeFunctions::native_dropout(
    const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0) {
    return {input, at::empty_like(input)};
  }
  if (!train.value_or(true)) {
    return {input.clone(),
            at::ones_like(input, input.options().dtype(at::kBool))};
  }
  const double keep = 1. - p;
  if (fusable(input) && keep >= 0. && keep <= 1.) {
    return fused_dropout(input, keep);
  }
  // Other layouts and dtypes: the CPU's composition, with the mask drawn
  // from the device generator.
  const double scale = keep == 0. ? 0. : 1. / keep;
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  mask.bernoulli_(keep, default_generator(input.device().index()));
  return {input.mul(mask).mul_(scale), mask};
}

// The CPU's `grad * mask * scale`, in one pass when the layouts allow.
at::Tensor OpenRegNativeFunctions::native_dropout_backward(
    const at::Tensor& grad, const at::Tensor& mask, double scale) {
  TORCH_CHECK(mask.scalar_type() == at::kBool,
              "Mask should be Bool Scalar Type", mask.scalar_type());
  if (!grad.defined() || !fusable(grad) || mask.device() != grad.device() ||
      !mask.is_non_overlapping_and_dense() || grad.sizes() != mask.sizes() ||
      grad.strides() != mask.strides() || grad.numel() == 0) {
    return at::mul(at::mul(grad, mask), scale);
  }
  at::Tensor out = at::empty_like(grad);
  const int64_t n = grad.numel();
  launch_async(
      grad.device().index(), "aten::native_dropout_backward",
      [g = borrowed_alias(grad), m = borrowed_alias(mask),
       res = borrowed_alias(out), n, scale] {
        KernelViews views;
        const at::Tensor src = views.view(g);
        const at::Tensor bits = views.view(m);
        at::Tensor dst = views.view(res);
        AT_DISPATCH_FLOATING_TYPES_AND2(
            at::kHalf, at::kBFloat16, src.scalar_type(),
            "native_dropout_backward", [&] {
              using opmath_t = at::opmath_type<scalar_t>;
              const scalar_t* gp = src.const_data_ptr<scalar_t>();
              const bool* mp = bits.const_data_ptr<bool>();
              scalar_t* op = dst.mutable_data_ptr<scalar_t>();
              const auto s = static_cast<opmath_t>(scale);
              parallel_chunks(0, n, 16384, [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i) {
                  op[i] =
                      static_cast<scalar_t>(static_cast<opmath_t>(gp[i]) *
                                            static_cast<opmath_t>(mp[i]) * s);
                }
              });
            });
      },
      n);
  return out;
}

}  // namespace openreg
