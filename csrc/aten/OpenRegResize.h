// Growing and shrinking device storages.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <optional>

namespace openreg {

// Reallocates `storage` to `new_size` bytes on its device, keeping the first
// min(old, new) bytes. The storage must be resizable.
void resize_bytes(c10::StorageImpl* storage, size_t new_size);

// Sets sizes (and strides, if given; contiguous otherwise) and grows the
// storage if it is too small.
void resize_impl(c10::TensorImpl* self, c10::IntArrayRef size,
                 std::optional<c10::IntArrayRef> stride);

}  // namespace openreg
