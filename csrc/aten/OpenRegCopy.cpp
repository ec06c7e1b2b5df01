// Copies between openreg and the CPU, and between openreg devices, with
// broadcasting and dtype conversion. copy_, to(), cpu() and the generated
// .openreg() methods all end here.
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/copy.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <array>
#include <cstring>
#include <vector>

#include "PrivateUse1NativeFunctions.h"  // generated (csrc/openreg_native_functions.yaml)
#include "aten/fallback/OpenRegCopyingFallback.h"
#include "core/OpenRegEngine.h"
#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "memory/OpenRegAllocator.h"
#include "memory/OpenRegMemcpy.h"

namespace openreg {

namespace {

bool is_openreg(const at::Tensor& t) {
  return t.device().type() == c10::DeviceType::PrivateUse1;
}

// True when a byte-for-byte copy of the dense span is the whole job.
bool can_memcpy(const at::Tensor& src, const at::Tensor& dst) {
  return src.dtype() == dst.dtype() && src.sizes() == dst.sizes() &&
         src.strides() == dst.strides() && src.is_conj() == dst.is_conj() &&
         src.is_neg() == dst.is_neg() && src.is_non_overlapping_and_dense() &&
         dst.is_non_overlapping_and_dense();
}

orMemcpyKind kind_of(const at::Tensor& src, const at::Tensor& dst) {
  if (is_openreg(src)) {
    return is_openreg(dst) ? orMemcpyDeviceToDevice : orMemcpyDeviceToHost;
  }
  return orMemcpyHostToDevice;
}

// A non_blocking copy between pinned host memory and the device is queued on
// the current stream and returns at once, as on CUDA. The pinned block is
// kept from reuse until the copy has run (record_event).
bool try_async_pinned_copy(const at::Tensor& src, const at::Tensor& dst,
                           c10::DeviceIndex device) {
  const at::Tensor& host = is_openreg(src) ? dst : src;
  if (is_openreg(host) || !can_memcpy(src, dst) ||
      !is_pinned_ptr(host.const_data_ptr())) {
    return false;
  }
  const OpenRegStream stream = getCurrentStream(device);
  memcpy_on_stream(dst.data_ptr(), src.const_data_ptr(), dst.nbytes(),
                   kind_of(src, dst), stream);
  host_allocator()->record_event(host.storage().mutable_data(),
                                 host.storage().data_ptr().get_context(),
                                 stream.unwrap());
  return true;
}

// [doc:staged-copy]
// A non_blocking copy from pageable host memory to the device is staged, as
// CUDA's driver stages one: the bytes are copied at the call into a pinned
// block of the host caching allocator, the copy from that block is queued on
// the stream, and the host returns without waiting for the stream's earlier
// work (which a blocking copy does wait for). The caller may reuse its
// source at once; the block is reused only once the copy has run
// (record_event). Without it, `batch.to(device, non_blocking=True)` from an
// ordinary CPU tensor would drain the stream at the start of every training
// step, and the host could never dispatch a step while the device computes
// the previous one. Larger copies than kMaxStagedBytes keep the waiting
// path, which needs no second host copy of the data; copies of at most
// OR_MAX_INLINE_COPY_BYTES need no pinned block (the runtime captures their
// bytes in the queued command).
constexpr size_t kMaxStagedBytes = size_t{64} << 20;

bool try_staged_h2d_copy(const at::Tensor& src, const at::Tensor& dst,
                         c10::DeviceIndex device) {
  if (is_openreg(src) || !is_openreg(dst) || !can_memcpy(src, dst) ||
      dst.nbytes() > kMaxStagedBytes || is_pinned_ptr(src.const_data_ptr())) {
    return false;
  }
  const size_t nbytes = dst.nbytes();
  if (nbytes <= OR_MAX_INLINE_COPY_BYTES) {
    // Small: the runtime carries the bytes in the queued command itself.
    memcpy_on_stream(dst.data_ptr(), src.const_data_ptr(), nbytes,
                     orMemcpyHostToDevice, getCurrentStream(device));
    return true;
  }
  c10::DataPtr staging = host_allocator()->allocate(nbytes);
  std::memcpy(staging.get(), src.const_data_ptr(), nbytes);
  const OpenRegStream stream = getCurrentStream(device);
  memcpy_on_stream(dst.data_ptr(), staging.get(), nbytes, orMemcpyHostToDevice,
                   stream);
  host_allocator()->record_event(staging.get(), staging.get_context(),
                                 stream.unwrap());
  return true;  // `staging` returns to the cache, reused after the copy
}
// [/doc:staged-copy]

}  // namespace

at::Tensor OpenRegNativeFunctions::_copy_from(const at::Tensor& self,
                                              const at::Tensor& dst,
                                              bool non_blocking) {
  // `self` is the source. Either side may be on the CPU; CPU sides must be
  // plain strided CPU tensors.
  for (const at::Tensor* t : {&self, &dst}) {
    TORCH_CHECK(is_openreg(*t) || t->device().is_cpu(),
                "openreg copies to and from the CPU and other openreg "
                "devices only, got a tensor on ",
                t->device());
  }
  if (dst.numel() == 0) {
    // Nothing to move, but the CPU's shape check still applies.
    const std::vector<int64_t> shape =
        at::infer_size(dst.sizes(), self.sizes());
    TORCH_CHECK(c10::IntArrayRef(shape) == dst.sizes(), "output with shape ",
                dst.sizes(), " doesn't match the broadcast shape ",
                c10::IntArrayRef(shape));
    return dst;
  }
  // Work is ordered on the destination's stream when it is a device,
  // otherwise on the source's.
  const c10::DeviceIndex device =
      is_openreg(dst) ? dst.device().index() : self.device().index();
  const c10::DeviceGuard guard(
      c10::Device(c10::DeviceType::PrivateUse1, device));
  if (is_openreg(self) && is_openreg(dst) &&
      self.device().index() != dst.device().index()) {
    // Cross-device: wait for the source device's producing work too.
    getCurrentStream(self.device().index()).synchronize();
  }
  if (non_blocking && (try_async_pinned_copy(self, dst, device) ||
                       try_staged_h2d_copy(self, dst, device))) {
    return dst;
  }
  if (is_openreg(self) && is_openreg(dst) &&
      self.device().index() == dst.device().index() &&
      !self.storage().is_alias_of(dst.storage()) &&
      at::is_expandable_to(self.sizes(), dst.sizes()) &&
      at::has_internal_overlap(dst) != at::MemOverlap::Yes) {
    // Device to device on one device: the engine's kernel queued on the
    // stream (the host does not wait).
    if (engine().copy != nullptr &&
        engine().copy(self, dst, device, /*queue=*/true)) {
      return dst;
    }
  }
  if (!non_blocking && (!is_openreg(self) || !is_openreg(dst))) {
    // As CUDA's copy_: a blocking copy to or from the host waits for the
    // stream (sync debug mode reports it).
    warn_or_error_on_sync("a blocking copy between openreg and the CPU");
  }
  // Tensors sharing memory take the kernel path, whose TensorIterator
  // rejects partial overlap exactly as the CPU does.
  if (can_memcpy(self, dst) && !self.storage().is_alias_of(dst.storage())) {
    memcpy_blocking(dst.data_ptr(), self.const_data_ptr(), dst.nbytes(),
                    kind_of(self, dst), getCurrentStream(device));
    return dst;
  }
  // General case (broadcasting, strides, dtype conversion): the engine's
  // kernel, else PyTorch's CPU copy on host copies of both sides.
  if (engine().copy == nullptr ||
      !engine().copy(self, dst, device, /*queue=*/false)) {
    copy_through_host(self, dst);
  }
  return dst;
}

at::Tensor OpenRegNativeFunctions::_copy_from_and_resize(
    const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return _copy_from(self, dst, false);
}

// [doc:copy-register]
// The copy handles conjugate and negative bits itself (a raw copy keeps them
// only when both sides agree; otherwise PyTorch's CPU copy resolves them), so
// the Conjugate/Negative fallbacks must not materialise them first: that
// would call clone -> copy_ -> _copy_from again, forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
// [/doc:copy-register]

}  // namespace openreg
