// How kernels reach device memory. SIMULATOR ONLY: a real device's kernels
// read device memory themselves; a vendor replaces kernel views by its own
// kernels (see docs/operators.md).
//
// A kernel body sees each device tensor as a CPU tensor over the kernel view
// of the same bytes (same sizes, strides, storage offset): PyTorch's CPU
// kernels then read and write device memory in place, with no copy.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace openreg {

// The kernel address of a device storage's first byte (nullptr if empty).
void* kernel_base(const c10::Storage& storage);

// A device tensor as a queued kernel captures it: where its storage is and
// how the tensor lies in it, without a TensorImpl of its own. Like
// borrowed_alias it does not own the memory; it costs the host no
// allocation. Within one launch, `storage` tells which captured tensors
// share a storage (it is only compared, never dereferenced: the kernel may
// run after the host freed that StorageImpl).
struct DeviceTensorRef {
  DeviceTensorRef() = default;
  explicit DeviceTensorRef(const at::Tensor& t);

  const void* storage = nullptr;       // identity of the device storage
  const void* storage_data = nullptr;  // device address of its first byte
  size_t storage_nbytes = 0;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  int64_t storage_offset = 0;
  caffe2::TypeMeta dtype;
  bool conj = false;
  bool neg = false;
};

// The kernel views of one kernel launch.
//
// Each device tensor becomes a CPU tensor aliasing its device memory through
// the kernel view. One device tensor gives one view however often it is
// passed (so a CPU kernel's `out.is_same(self)` holds as on the CPU), and
// tensors that share a device storage get views that share one CPU storage,
// so PyTorch's overlap checks see the aliasing exactly as on the CPU. A view
// made `resizable` (an out= argument) may be grown by the kernel: it then
// moves to host memory and the caller must copy it back.
//
// [doc:staged-views]
// Staged views: when the driver gives no kernel pointers (its devices run in
// their own processes, host_kernels_supported() is false), a view is a CPU
// tensor over a host copy of the device storage, copied in (ordered on the
// current stream) when the storage is first seen, and copied back if the
// kernel changed it (StagedKernelScope below, which must be alive when the
// views are made): what PyTorch's cpu_fallback does for a real device,
// storage by storage so that views and aliasing stay as on the device.
// [/doc:staged-views]
class KernelViews {
 public:
  at::Tensor view(const at::Tensor& t, bool resizable = false);
  // The view of a temporary device tensor (a part a sparse or nested tensor
  // hands out as a new TensorImpl each time): not remembered by its
  // TensorImpl, whose address the next temporary may reuse; it still shares
  // the CPU storage of every other view of its device storage.
  at::Tensor view_of_temporary(const at::Tensor& t);
  // The view of a captured tensor (one per DeviceTensorRef object).
  at::Tensor view(const DeviceTensorRef& t);

  // The device storage whose kernel view a CPU tensor's storage is, or
  // nullptr if it is none of this launch's.
  const c10::Storage* device_storage_of(const at::Tensor& cpu) const;

 private:
  struct Entry {
    const void* device;           // key: the device StorageImpl
    c10::Storage device_storage;  // undefined for a DeviceTensorRef's
    c10::Storage cpu_storage;
    void* base;  // kernel address the CPU storage started at
  };
  Entry& entry(const void* key, const c10::Storage* storage, const void* data,
               size_t nbytes);
  c10::SmallVector<Entry, 4> entries_;
  // One view per device TensorImpl or DeviceTensorRef.
  c10::SmallVector<std::pair<const void*, at::Tensor>, 4> views_;
};

// [doc:staged-kernels]
// A kernel run staged (launch_async and run_sync when the driver runs named
// kernels only, aten/OpenRegLaunch.cpp; the fallback's synchronous path):
// while the scope is alive on the calling thread, every storage a
// KernelViews stages is also kept here with a copy of its bytes as they
// arrived; write_back_changed() then copies the storages whose bytes the
// kernel changed back into device memory, skipping one the kernel resized
// (it moved; the fallback's sync_tensor copies it). Changed bytes, not alias
// annotations, decide: native_batch_norm writes its running statistics
// without an annotation. A storage another stream writes during the kernel
// would be overwritten with what it held before, a race on the device
// too. Kernels
// that are not named kernels yet (openreg's own: dropout, attention, RNN
// cells, copies, custom ops) so run on any driver, synchronously; counted as
// "staged" in torch.openreg._launch_stats().
class StagedKernelScope {
 public:
  StagedKernelScope();
  ~StagedKernelScope();
  StagedKernelScope(const StagedKernelScope&) = delete;
  StagedKernelScope& operator=(const StagedKernelScope&) = delete;

  void write_back_changed();
  // The scope alive on this thread, or nullptr.
  static StagedKernelScope* current();
  // Called by KernelViews for each storage it stages.
  void add(const void* device_data, const c10::Storage& cpu);

 private:
  struct Staged {
    const void* device_data;
    c10::Storage cpu;  // keeps the host copy alive after its KernelViews
    const void* base;
    std::unique_ptr<char[]> original;
  };
  std::vector<Staged> staged_;
  StagedKernelScope* previous_;
};
// [/doc:staged-kernels]

// A device tensor over the same memory and metadata as `t` that does not own
// the memory (what an asynchronous kernel captures).
at::Tensor borrowed_alias(const at::Tensor& t);

// The address of t's first element on its device (never dereferenced on
// the host), as named kernels take it in their parameters.
uint64_t device_address(const at::Tensor& t);

// Copies a CPU tensor made by a kernel into new memory on `device`, ordered
// on the device's current stream.
at::Tensor copy_to_device(const at::Tensor& cpu, c10::Device device);

// A device tensor over `storage` with the metadata (sizes, strides, offset,
// dtype, conj/neg bits) of `like`, a kernel view of that same storage.
at::Tensor device_alias(const c10::Storage& storage, const at::Tensor& like);

}  // namespace openreg
