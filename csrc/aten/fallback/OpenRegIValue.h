// Small helpers over boxed operator arguments (c10::IValue) and their runs,
// shared by the fallback's files.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <string>

namespace openreg {

// Drops every warning: a second run of a call (a Meta kernel's, an out=
// variant's) whose warnings the call's own run gives.
class DropWarnings final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& /*warning*/) override {}
};

inline bool is_openreg(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

// Calls f on every tensor inside an argument (tensors, tensor lists, lists of
// optional tensors).
template <typename F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      f(t);
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor()) {
        f(e.toTensor());
      }
    }
  }
}

// Replaces every tensor inside v by f(tensor).
template <typename F>
c10::IValue map_tensors(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    return f(v.toTensor());
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    out.reserve(v.toTensorList().size());
    for (const at::Tensor& t : v.toTensorList()) {
      out.push_back(f(t));
    }
    return out;
  }
  if (v.isList()) {
    auto list = v.toList();
    bool any = false;
    for (const c10::IValue& e : list) {
      any = any || e.isTensor();
    }
    if (!any) {
      return v;
    }
    c10::impl::GenericList out(list.elementType());
    for (const c10::IValue& e : list) {
      out.push_back(e.isTensor() ? c10::IValue(f(e.toTensor())) : e);
    }
    return out;
  }
  return v;
}

// A factory's device= argument, for a replay on Meta tensors: an openreg
// device becomes the meta device (a meta kernel written in Python would
// otherwise make real device tensors, and compute with them).
inline c10::IValue to_meta_device(c10::IValue v) {
  if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
    return c10::IValue(c10::Device(c10::kMeta));
  }
  return v;
}

// The operator's name for messages ("aten::add.out").
inline std::string op_name(const c10::FunctionSchema& schema) {
  std::string name = schema.name();
  if (!schema.overload_name().empty()) {
    name += "." + schema.overload_name();
  }
  return name;
}

}  // namespace openreg
