// SIMULATOR ONLY: the direct binary path (see the header).
#include "engine/ops/OpenRegDirectBinary.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/TypeCast.h>

#include <cstdlib>
#include <cstring>

#include "aten/OpenRegLaunch.h"
#include "aten/fallback/OpenRegCopyingFallback.h"
#include "core/OpenRegLaunchStats.h"
#include "core/OpenRegNamedKernels.h"
#include "core/OpenRegStream.h"
#include "engine/OpenRegKernelView.h"
#include "engine/fallback/OpenRegQueuedCall.h"
#include "memory/OpenRegAllocator.h"

namespace openreg {

namespace {

// The CPU kernels of these operators split their loop over threads from
// at::internal::GRAIN_SIZE elements on; below it they run on one thread, as
// this kernel does. Larger calls take the fallback and its team.
constexpr int64_t kMaxElements = 32768;

bool dense(const at::Tensor& t) {
  return t.layout() == c10::kStrided && t.is_contiguous() && !t.is_conj() &&
         !t.is_neg();
}

bool is_one(const c10::Scalar& s) {
  if (s.isIntegral(/*includeBool=*/false)) {
    return s.toLong() == 1;
  }
  return s.isFloatingPoint() && s.toDouble() == 1.0;
}

// A Python number (a wrapped-number tensor of int64 or double) in `dtype`,
// converted as the CPU kernel converts it (c10::convert, the copy kernel's
// cast; doc:wrapped-number-dtype in aten/fallback/OpenRegOpTraits.cpp), and
// held exactly in a double; false for any other wrapped number (bool,
// complex).
bool number_in(const at::Tensor& wrapped, c10::ScalarType dtype,
               double* number) {
  const c10::ScalarType from = wrapped.scalar_type();
  if (from == c10::ScalarType::Long) {
    const int64_t i = *wrapped.const_data_ptr<int64_t>();
    *number = dtype == c10::ScalarType::Float ? c10::convert<float>(i)
                                              : c10::convert<double>(i);
    return true;
  }
  if (from == c10::ScalarType::Double) {
    const double d = *wrapped.const_data_ptr<double>();
    *number = dtype == c10::ScalarType::Float ? c10::convert<float>(d) : d;
    return true;
  }
  return false;
}

}  // namespace

bool direct_binary_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("OPENREG_DIRECT_BINARY");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return on;
}

// [doc:direct-binary]
// The calls the path takes: `a` a dense (contiguous, no conj or neg bit)
// float or double device tensor of 1 to kMaxElements elements; `b` a dense
// tensor of the same device, dtype and sizes, or a Python number (int or
// float: it never changes a floating tensor's dtype); alpha 1. Their
// result is a new dense tensor of a's sizes and dtype, as the CPU kernel's
// is, and each element is one IEEE operation on the same operands, so the
// values are the CPU's bit for bit. Errors and odd cases (mixed devices,
// broadcasting, type promotion, a bool) stay with the fallback, which
// raises or computes them as the CPU does.
at::Tensor direct_binary(kernels::BinaryOp op, const std::string& name,
                         const at::Tensor& a, const at::Tensor& b,
                         const c10::Scalar* alpha) {
  // The fallback's diagnostic modes see every call: OPENREG_FALLBACK=copy
  // (the fallback that copies every argument to the host, compared with the
  // engine) and OPENREG_SERIALIZED_CALLS=0 (every queued call captured as
  // host objects).
  if (!direct_binary_enabled() || copying_fallback_selected() ||
      !serialized_calls() || !a.defined() || !b.defined() ||
      a.device().type() != c10::DeviceType::PrivateUse1) {
    return {};
  }
  const c10::ScalarType dtype = a.scalar_type();
  const int64_t n = a.numel();
  if ((dtype != c10::ScalarType::Float && dtype != c10::ScalarType::Double) ||
      n == 0 || n > kMaxElements || !dense(a) ||
      (alpha != nullptr && !is_one(*alpha))) {
    return {};
  }
  const bool b_is_number = b.unsafeGetTensorImpl()->is_wrapped_number();
  double number = 0;
  if (b_is_number) {
    if (b.device().type() != c10::DeviceType::CPU ||
        !number_in(b, dtype, &number)) {
      return {};
    }
  } else if (b.device() != a.device() || b.scalar_type() != dtype ||
             !b.sizes().equals(a.sizes()) || !dense(b)) {
    return {};
  }
  // The result's block is taken for the stream the kernel runs on, as
  // empty_generic would take it with a's device current, without switching
  // the current device there and back (no guard: nothing here uses it).
  const c10::DeviceIndex device = a.device().index();
  const size_t nbytes = static_cast<size_t>(n) * c10::elementSize(dtype);
  c10::Storage storage(
      c10::Storage::use_byte_size_t(), nbytes,
      allocate_device_memory(nbytes, getCurrentStream(device).unwrap()),
      device_allocator(), /*resizable=*/true);
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::scalarTypeToTypeMeta(dtype));
  out.unsafeGetTensorImpl()->set_sizes_contiguous(a.sizes());
  kernels::BinaryParams p{};
  p.a = device_address(a);
  p.b = b_is_number ? 0 : device_address(b);
  p.out = device_address(out);
  p.n = n;
  p.number = number;
  p.op = static_cast<int32_t>(op);
  p.dtype = static_cast<int32_t>(dtype);
  p.b_is_number = b_is_number ? 1 : 0;
  stats::count(stats::kQueued);
  launch_function(device, name, named_kernel(NamedKernel::kBinary), &p,
                  sizeof(p), n);
  return out;
}
// [/doc:direct-binary]

}  // namespace openreg
