#include "aten/OpenRegResize.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <algorithm>

#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegStream.h"
#include "memory/OpenRegMemcpy.h"

namespace openreg {

void resize_bytes(c10::StorageImpl* storage, size_t new_size) {
  TORCH_CHECK(storage->resizable(),
              "Trying to resize storage that is not resizable");
  c10::DeviceIndex device = storage->device().index();
  ScopedDevice guard(device);
  c10::DataPtr new_data;
  if (new_size != 0) {
    new_data = storage->allocator()->allocate(new_size);
  }
  size_t keep = std::min(new_size, storage->nbytes());
  if (keep != 0 && storage->data() != nullptr) {
    // As on CUDA: the copy is queued on the current stream, so it follows
    // the work already queued there (which may still be writing the old
    // data) and precedes whatever the caller queues next. The old block is
    // marked as used by this stream, so the allocator does not hand it out
    // on its own stream before the copy has read it.
    const OpenRegStream stream = getCurrentStream(device);
    memcpy_on_stream(new_data.get(), storage->data(), keep,
                     orMemcpyDeviceToDevice, stream);
    if (auto* allocator =
            dynamic_cast<c10::DeviceAllocator*>(storage->allocator())) {
      allocator->recordStream(storage->data_ptr(), stream.unwrap());
    }
  }
  storage->set_data_ptr_noswap(std::move(new_data));
  storage->set_nbytes(new_size);
}

void resize_impl(c10::TensorImpl* self, c10::IntArrayRef size,
                 std::optional<c10::IntArrayRef> stride) {
  if (self->sizes() == size && (!stride || self->strides() == *stride)) {
    return;
  }
  const auto itemsize = self->dtype().itemsize();
  const auto offset = static_cast<size_t>(self->storage_offset());
  size_t needed = 0;
  if (stride) {
    TORCH_CHECK(size.size() == stride->size(), "resize: ", size.size(),
                " sizes but ", stride->size(), " strides");
    self->set_sizes_and_strides(size, *stride);
    needed = at::detail::computeStorageNbytes(size, *stride, itemsize, offset);
  } else {
    self->set_sizes_contiguous(size);
    needed = at::detail::computeStorageNbytesContiguous(size, itemsize, offset);
  }
  if (self->numel() == 0) {
    return;  // an empty tensor needs no storage, whatever its offset
  }
  const c10::Storage& storage = self->unsafe_storage();
  if (needed > storage.nbytes()) {
    resize_bytes(storage.unsafeGetStorageImpl(), needed);
  }
}

}  // namespace openreg
