#include "engine/kernels/OpenRegDropout.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include <algorithm>

#include "engine/kernels/OpenRegParallel.h"
#include "engine/kernels/OpenRegPhilox.h"

namespace openreg::kernels {

namespace {

// [doc:fused-dropout]
// Dropout as CUDA runs it: one kernel writes the mask and the result, its
// random numbers from Philox keyed by the launch's reserved draw, so it is
// queued like any kernel and split over threads without changing a bit.
// Element i (in memory order) is kept when the top 24 bits of number i of
// the stream are below keep * 2^24. The arithmetic is the CPU's
// `input * mask * scale`: a dropped NaN or inf stays NaN.
template <typename scalar_t>
void dropout_kernel(const scalar_t* in, scalar_t* out, bool* mask, int64_t n,
                    uint32_t threshold, double scale, uint64_t seed,
                    uint64_t offset) {
  using opmath_t = at::opmath_type<scalar_t>;
  const auto s = static_cast<opmath_t>(scale);
  const Philox4x32 philox(seed, offset);
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
// [/doc:fused-dropout]

}  // namespace

void dropout(const void* in, void* out, bool* mask, int64_t n,
             c10::ScalarType dtype, uint32_t threshold, double scale,
             uint64_t seed, uint64_t offset) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, dtype, "native_dropout", [&] {
        dropout_kernel<scalar_t>(static_cast<const scalar_t*>(in),
                                 static_cast<scalar_t*>(out), mask, n,
                                 threshold, scale, seed, offset);
      });
}

void dropout_backward(const void* grad, const bool* mask, void* out, int64_t n,
                      c10::ScalarType dtype, double scale) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, dtype, "native_dropout_backward", [&] {
        using opmath_t = at::opmath_type<scalar_t>;
        const auto* gp = static_cast<const scalar_t*>(grad);
        auto* op = static_cast<scalar_t*>(out);
        const auto s = static_cast<opmath_t>(scale);
        parallel_chunks(0, n, 16384, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            op[i] = static_cast<scalar_t>(static_cast<opmath_t>(gp[i]) *
                                          static_cast<opmath_t>(mask[i]) * s);
          }
        });
      });
}

}  // namespace openreg::kernels
