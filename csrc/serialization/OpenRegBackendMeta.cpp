#include "serialization/OpenRegBackendMeta.h"

#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/pickler_helper.h>

#include <cstring>
#include <unordered_map>

namespace openreg {

// [doc:backend-meta-clone]
c10::intrusive_ptr<c10::BackendMeta> OpenRegBackendMeta::clone(
    const c10::intrusive_ptr<c10::BackendMeta>& /*ptr*/) const {
  auto copy = c10::make_intrusive<OpenRegBackendMeta>();
  copy->tags = tags;
  return copy;
}
// [/doc:backend-meta-clone]

namespace {

// Only openreg tensors carry OpenRegBackendMeta, and only this file sets it.
OpenRegBackendMeta* meta_of(const at::Tensor& tensor) {
  return static_cast<OpenRegBackendMeta*>(
      tensor.unsafeGetTensorImpl()->get_backend_meta());
}

// [doc:backend-meta-serialize]
// torch.save: adds "openreg.<name>" entries to the tensor's metadata map.
void serialize_meta(const at::Tensor& tensor,
                    std::unordered_map<std::string, bool>& metadata) {
  if (auto* meta = meta_of(tensor)) {
    for (const auto& [name, value] : meta->tags) {
      metadata[kTagKeyPrefix + name] = value;
    }
  }
}

// torch.load: restores the "openreg.<name>" entries onto the loaded tensor.
// Entries of other backends are ignored, as PyTorch does for unknown keys.
void deserialize_meta(const at::Tensor& tensor,
                      std::unordered_map<std::string, bool>& metadata) {
  const size_t prefix_len = std::strlen(kTagKeyPrefix);
  for (const auto& [key, value] : metadata) {
    if (key.compare(0, prefix_len, kTagKeyPrefix) == 0) {
      set_tensor_tag(tensor, key.substr(prefix_len), value);
    }
  }
}

// Static registration: PyTorch's pickler asks this registry for every tensor
// whose device type is PrivateUse1.
const bool registered = [] {
  torch::jit::TensorBackendMetaRegistry(c10::DeviceType::PrivateUse1,
                                        &serialize_meta, &deserialize_meta);
  return true;
}();
// [/doc:backend-meta-serialize]

}  // namespace

std::map<std::string, bool> tensor_tags(const at::Tensor& tensor) {
  TORCH_CHECK(tensor.defined(), "tensor_tags: the tensor is undefined");
  auto* meta = meta_of(tensor);
  return meta ? meta->tags : std::map<std::string, bool>{};
}

void set_tensor_tag(const at::Tensor& tensor, const std::string& name,
                    bool value) {
  TORCH_CHECK(tensor.defined(), "set_tensor_tag: the tensor is undefined");
  TORCH_CHECK(tensor.device().type() == c10::DeviceType::PrivateUse1,
              "set_tensor_tag: tags live on openreg tensors, got a tensor on ",
              tensor.device());
  TORCH_CHECK(!name.empty() && name.find('.') == std::string::npos,
              "set_tensor_tag: a tag name must be non-empty and contain no "
              "'.', got '",
              name, "'");
  auto* impl = tensor.unsafeGetTensorImpl();
  auto* meta = meta_of(tensor);
  if (meta == nullptr) {
    auto fresh = c10::make_intrusive<OpenRegBackendMeta>();
    meta = fresh.get();
    impl->set_backend_meta(std::move(fresh));
  }
  meta->tags[name] = value;
}

}  // namespace openreg
