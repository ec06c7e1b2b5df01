#include "engine/fallback/OpenRegOutResize.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>

#include <unordered_map>
#include <vector>

#include "aten/fallback/OpenRegIValue.h"
#include "core/OpenRegInterrupt.h"
#include "memory/OpenRegAllocator.h"

namespace openreg {

// [doc:out-room]
std::vector<size_t> empty_out_bytes(const OpTraits& traits,
                                    c10::ArrayRef<c10::IValue> args) {
  std::vector<size_t> sizes;
  if (!traits.writes_any || traits.data_dependent || !traits.has_meta_kernel ||
      !traits.handle.has_value()) {
    return sizes;
  }
  const size_t n = std::min(traits.writes.size(), args.size());
  // Empty written tensors that no other argument passes too.
  std::unordered_map<const c10::TensorImpl*, int> uses;
  for (const c10::IValue& v : args) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (t.defined()) {
        ++uses[t.unsafeGetTensorImpl()];
      }
    });
  }
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    if (traits.writes[i]) {
      for_each_tensor(args[i], [&](const at::Tensor& t) {
        any = any || (is_openreg(t) && t.numel() == 0 &&
                      uses[t.unsafeGetTensorImpl()] == 1);
      });
    }
  }
  if (!any) {
    return sizes;
  }
  // The written tensors with elements that no other argument passes replay
  // as empty ones: a meta kernel written in Python then does not warn about
  // resizing them (the call's own run does); only empty ones are resized.
  std::unordered_map<const c10::TensorImpl*, bool> only_written;
  for (size_t i = 0; i < n; ++i) {
    if (traits.writes[i]) {
      for_each_tensor(args[i], [&](const at::Tensor& t) {
        if (t.defined() && t.numel() != 0 &&
            uses[t.unsafeGetTensorImpl()] == 1) {
          only_written[t.unsafeGetTensorImpl()] = true;
        }
      });
    }
  }
  std::unordered_map<const c10::TensorImpl*, at::Tensor> meta_of;
  torch::jit::Stack stack;
  {
    DropWarnings drop;  // the call's own run gives them
    const c10::WarningUtils::WarningHandlerGuard quiet(&drop);
    try {
      for (const c10::IValue& v : args) {
        stack.push_back(to_meta_device(map_tensors(v, [&](const at::Tensor& t) {
          if (!t.defined()) {
            return t;
          }
          const auto options = t.options().device(c10::kMeta);
          at::Tensor m =
              only_written.count(t.unsafeGetTensorImpl()) != 0
                  ? at::empty({0}, options)
                  : at::empty_strided(t.sizes(), t.strides(), options);
          meta_of[t.unsafeGetTensorImpl()] = m;
          return m;
        })));
      }
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      traits.handle->redispatchBoxed(
          c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
    } catch (const std::exception& e) {
      if (is_interrupt(e)) {
        throw;
      }
      return sizes;  // the run raises the error itself
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (!traits.writes[i]) {
      continue;
    }
    for_each_tensor(args[i], [&](const at::Tensor& real) {
      const c10::TensorImpl* impl = real.unsafeGetTensorImpl();
      if (!is_openreg(real) || real.numel() != 0 || uses[impl] != 1) {
        return;
      }
      const at::Tensor& meta = meta_of.at(impl);
      const size_t nbytes = at::detail::computeStorageNbytes(
          meta.sizes(), meta.strides(), meta.dtype().itemsize());
      if (nbytes > real.storage().nbytes()) {
        sizes.push_back(nbytes);
      }
    });
  }
  return sizes;
}

void check_room_for_empty_outs(const OpTraits& traits,
                               c10::ArrayRef<c10::IValue> args,
                               c10::Device device) {
  // The memory they will take, allocated now and given back to the cache
  // at once: on a device that cannot hold it, torch.OutOfMemoryError comes
  // here, before anything ran; otherwise the run's own allocation reuses
  // the cached block.
  const c10::DeviceGuard on_device(device);
  for (size_t nbytes : empty_out_bytes(traits, args)) {
    device_allocator()->allocate(nbytes);  // freed at once
  }
}
// [/doc:out-room]

}  // namespace openreg
