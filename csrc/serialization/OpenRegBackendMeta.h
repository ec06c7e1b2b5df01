#pragma once

// Backend metadata attached to openreg tensors (c10::BackendMeta).
//
// PyTorch gives every TensorImpl one slot for a backend's own metadata. A real
// accelerator keeps there what the tensor's sizes and strides cannot say, for
// example a private storage format; openreg keeps named boolean tags, because
// tensor metadata is serialized as a string -> bool map. The slot follows
// PyTorch's rules:
//   - shallow copies (detach(), .data, nn.Parameter, `p.data = other`) clone
//     it (TensorImpl::copy_tensor_metadata calls BackendMeta::clone);
//   - new tensors (clone(), to(), copies, views) start without it;
//   - torch.save/torch.load carry it through the functions registered with
//     torch::jit::TensorBackendMetaRegistry (OpenRegBackendMeta.cpp).

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <map>
#include <string>

namespace openreg {

struct OpenRegBackendMeta final : c10::BackendMeta {
  std::map<std::string, bool> tags;

  // A copy, so tags set on a shallow copy do not leak into the original.
  c10::intrusive_ptr<c10::BackendMeta> clone(
      const c10::intrusive_ptr<c10::BackendMeta>& ptr) const override;
};

// Key prefix of the openreg entries in torch.save's tensor metadata map.
inline constexpr const char* kTagKeyPrefix = "openreg.";

// The tags of an openreg tensor (empty if it has none).
std::map<std::string, bool> tensor_tags(const at::Tensor& tensor);

// Sets one tag; the tensor must be on an openreg device.
void set_tensor_tag(const at::Tensor& tensor, const std::string& name,
                    bool value);

}  // namespace openreg
