#include "engine/kernels/OpenRegBinaryKernels.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace openreg::kernels {

namespace {

template <typename T, typename F>
void loop(const T* a, const T* b, T* out, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = f(a[i], b[i]);
  }
}

template <typename T, typename F>
void loop_number(const T* a, T number, T* out, int64_t n, F f) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = f(a[i], number);
  }
}

template <typename T>
void binary_typed(BinaryOp op, const T* a, const T* b, T* out, int64_t n,
                  bool b_is_number, T number) {
  auto run = [&](auto f) {
    if (b_is_number) {
      loop_number(a, number, out, n, f);
    } else {
      loop(a, b, out, n, f);
    }
  };
  // [doc:binary-nan]
  // Which NaN comes out when both operands are NaN depends on the
  // instruction (x86 returns its first source's), and a compiler may swap
  // the operands of a commutative one, so the kernel chooses explicitly, as
  // the CPU kernels' instructions do: y's for add, sub and mul (they compute
  // y * alpha + x), x's for division. `y + y` quiets a signaling NaN as the
  // hardware would.
  switch (op) {
    case BinaryOp::kAdd:
      run([](T x, T y) { return std::isnan(y) ? y + y : x + y; });
      return;
    case BinaryOp::kSub:
      run([](T x, T y) { return std::isnan(y) ? y + y : x - y; });
      return;
    case BinaryOp::kMul:
      run([](T x, T y) { return std::isnan(y) ? y + y : x * y; });
      return;
    case BinaryOp::kDiv:
      run([](T x, T y) { return std::isnan(x) ? x + x : x / y; });
      return;
  }
  // [/doc:binary-nan]
  TORCH_CHECK(false, "openreg_binary: unknown operation ",
              static_cast<int>(op));
}

}  // namespace

void binary(BinaryOp op, const void* a, const void* b, void* out, int64_t n,
            c10::ScalarType dtype, bool b_is_number, double number) {
  if (dtype == c10::ScalarType::Float) {
    binary_typed(op, static_cast<const float*>(a), static_cast<const float*>(b),
                 static_cast<float*>(out), n, b_is_number,
                 static_cast<float>(number));
  } else if (dtype == c10::ScalarType::Double) {
    binary_typed(op, static_cast<const double*>(a),
                 static_cast<const double*>(b), static_cast<double*>(out), n,
                 b_is_number, number);
  } else {
    TORCH_CHECK(false, "openreg_binary: unsupported dtype ", dtype);
  }
}

}  // namespace openreg::kernels
