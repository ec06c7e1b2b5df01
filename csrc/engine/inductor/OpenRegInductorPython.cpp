#include "engine/inductor/OpenRegInductorPython.h"

#include <ATen/ops/empty_strided.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/python_numbers.h>

#include <cstring>
#include <string>
#include <utility>

#include "core/OpenRegFunctions.h"
#include "core/OpenRegStream.h"
#include "engine/inductor/OpenRegCompiledKernel.h"
#include "python/OpenRegAddedBindings.h"

namespace py = pybind11;

namespace openreg::inductor {

namespace {

// [doc:compiled-kernel-class]
// A kernel Inductor compiled for openreg, as the generated Python wrapper
// calls it: kernel(buf0, arg1_1, 128). `path` and `symbol` name its entry
// point in the compiled library, which the device loads (the host's ctypes
// copy is never called). `signature` has one letter per argument: 'p' a
// tensor whose memory the kernel writes (and may read), 'r' one it only
// reads, 'i' an int64 size, 'f' a float.
class CompiledKernel {
 public:
  CompiledKernel(std::string name, const std::string& path,
                 const std::string& symbol, std::string signature)
      : name_(std::move(name)), signature_(std::move(signature)) {
    TORCH_CHECK(!path.empty() && !symbol.empty(), "openreg compiled kernel ",
                name_, ": no library path or symbol");
    for (char c : signature_) {
      TORCH_CHECK(c == 'p' || c == 'r' || c == 'i' || c == 'f',
                  "openreg compiled kernel ", name_, ": bad signature '",
                  signature_, "' (one of p, r, i, f per argument)");
    }
    prefix_ = compiled_kernel_prefix(name_, path, symbol);
  }

  void operator()(const py::args& args) const {
    using compiled::ArgKind;
    const size_t n = signature_.size();
    TORCH_CHECK(args.size() == n, "openreg compiled kernel ", name_, " takes ",
                n, " arguments (signature '", signature_, "'), got ",
                args.size());
    c10::SmallVector<compiled::CompiledKernelArg, 16> kernel_args(n);
    c10::DeviceIndex device = -1;
    size_t device_arg = 0;
    for (size_t i = 0; i < n; ++i) {
      PyObject* obj = PyTuple_GET_ITEM(args.ptr(), i);
      const char kind = signature_[i];
      compiled::CompiledKernelArg& arg = kernel_args[i];
      if (kind == 'p' || kind == 'r') {
        TORCH_CHECK(THPVariable_Check(obj), "openreg compiled kernel ", name_,
                    ": argument ", i, " must be a tensor, got ",
                    Py_TYPE(obj)->tp_name);
        const at::Tensor& t = THPVariable_Unpack(obj);
        if (t.device().type() == c10::DeviceType::PrivateUse1) {
          if (device < 0) {
            device = t.device().index();
            device_arg = i;
          } else {
            TORCH_CHECK(t.device().index() == device,
                        "openreg compiled kernel ", name_, ": argument ", i,
                        " is on openreg:", static_cast<int>(t.device().index()),
                        " but argument ", device_arg,
                        " is on openreg:", static_cast<int>(device));
          }
          // The device address (never dereferenced on the host).
          const auto address = reinterpret_cast<uint64_t>(t.const_data_ptr());
          arg.kind = ArgKind::kDevicePointer;
          std::memcpy(arg.value, &address, sizeof(address));
        } else {
          // Inductor hands a device kernel the one-element CPU tensors it
          // reads (an optimizer's step count): passed by value.
          TORCH_CHECK(t.is_cpu() && kind == 'r' && t.numel() == 1 &&
                          t.element_size() <= sizeof(arg.value),
                      "openreg compiled kernel ", name_, ": argument ", i,
                      " is a ", t.device().str(), " tensor of ", t.numel(),
                      " elements", kind == 'p' ? " that the kernel writes" : "",
                      "; the kernel runs on openreg and takes openreg tensors "
                      "(and one-element CPU tensors it only reads)");
          arg.kind = ArgKind::kHostScalar;
          std::memcpy(arg.value, t.const_data_ptr(), t.element_size());
        }
      } else if (kind == 'i') {
        TORCH_CHECK(THPUtils_checkLong(obj), "openreg compiled kernel ", name_,
                    ": argument ", i, " must be an int, got ",
                    Py_TYPE(obj)->tp_name);
        const int64_t v = THPUtils_unpackLong(obj);
        arg.kind = ArgKind::kInt;
        std::memcpy(arg.value, &v, sizeof(v));
      } else {
        TORCH_CHECK(THPUtils_checkDouble(obj), "openreg compiled kernel ",
                    name_, ": argument ", i, " must be a float, got ",
                    Py_TYPE(obj)->tp_name);
        const auto v = static_cast<float>(THPUtils_unpackDouble(obj));
        arg.kind = ArgKind::kFloat;
        std::memcpy(arg.value, &v, sizeof(v));
      }
    }
    TORCH_CHECK(device >= 0, "openreg compiled kernel ", name_,
                " has no openreg tensor argument, so no device to run on");
    launch_compiled_kernel(device, name_, prefix_, kernel_args);
  }

  const std::string& name() const { return name_; }
  const std::string& signature() const { return signature_; }

 private:
  std::string name_;
  std::string signature_;
  std::string prefix_;  // the launch's header, name, path and symbol
};
// [/doc:compiled-kernel-class]

}  // namespace

void init_python_bindings(py::module_& m) {
  py::class_<CompiledKernel>(m, "_CompiledKernel")
      .def(py::init<std::string, std::string, std::string, std::string>(),
           py::arg("name"), py::arg("path"), py::arg("symbol"),
           py::arg("signature"))
      .def("__call__", &CompiledKernel::operator())
      .def_property_readonly("name", &CompiledKernel::name)
      .def_property_readonly("signature", &CompiledKernel::signature)
      .def("__repr__", [](const CompiledKernel& k) {
        return "<openreg compiled kernel " + k.name() + " (" + k.signature() +
               ")>";
      });
  // The allocation the generated wrapper makes for every buffer: the
  // dispatcher's empty_strided without the Python argument parser.
  m.def(
      "_empty_strided",
      [](c10::IntArrayRef size, c10::IntArrayRef stride, at::ScalarType dtype,
         c10::DeviceIndex device) {
        return at::empty_strided(size, stride,
                                 at::TensorOptions().dtype(dtype).device(
                                     c10::DeviceType::PrivateUse1, device));
      },
      py::arg("size"), py::arg("stride"), py::arg("dtype"), py::arg("device"));
  m.def(
      "_current_raw_stream",
      [](c10::DeviceIndex device) {
        check_device_index(device);
        return reinterpret_cast<uintptr_t>(getCurrentStream(device).native());
      },
      py::arg("device"));
}

namespace {
[[maybe_unused]] const bool added = add_bindings(&init_python_bindings);
}  // namespace

}  // namespace openreg::inductor
