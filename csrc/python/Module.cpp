// The torch_openreg._C extension module. Loading it registers every C++
// integration point (static registrations in the other files); this file
// only adds the functions the Python package needs.
#include <pybind11/pybind11.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

#include <sstream>

#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "random/OpenRegGenerator.h"

namespace py = pybind11;

namespace openreg {

namespace {

struct DeviceProperties {
  std::string name;
  size_t total_memory;
  int major;
  int minor;
  int multi_processor_count;

  std::string repr() const {
    std::ostringstream os;
    os << "_OpenRegDeviceProperties(name='" << name << "', major=" << major
       << ", minor=" << minor << ", total_memory=" << total_memory / (1 << 20)
       << "MB, multi_processor_count=" << multi_processor_count << ")";
    return os.str();
  }
};

DeviceProperties get_device_properties(c10::DeviceIndex device) {
  check_device_index(device);
  lazy_init();
  orDeviceProp prop;
  OPENREG_CHECK(orGetDeviceProperties(&prop, device));
  return {prop.name, prop.totalGlobalMem, prop.major, prop.minor,
          prop.multiProcessorCount};
}

void synchronize(c10::DeviceIndex device) {
  lazy_init();
  ScopedDevice guard(device < 0 ? current_device() : device);
  OPENREG_CHECK(orDeviceSynchronize());
}

}  // namespace

}  // namespace openreg

PYBIND11_MODULE(_C, m) {
  using namespace openreg;
  m.doc() = "openreg: a simulated PyTorch accelerator (C++ part)";

  py::class_<DeviceProperties>(m, "_OpenRegDeviceProperties")
      .def_readonly("name", &DeviceProperties::name)
      .def_readonly("total_memory", &DeviceProperties::total_memory)
      .def_readonly("major", &DeviceProperties::major)
      .def_readonly("minor", &DeviceProperties::minor)
      .def_readonly("multi_processor_count",
                    &DeviceProperties::multi_processor_count)
      .def("__repr__", &DeviceProperties::repr);

  m.def("_init", &lazy_init, "Initialise the openreg runtime (idempotent).");
  m.def("_is_initialized", &is_initialized);
  m.def("_is_in_bad_fork", &is_in_bad_fork);
  m.def("_device_count", &device_count);
  m.def("_get_device", &current_device);
  m.def("_set_device", &set_device, py::arg("device"));
  m.def("_exchange_device", &exchange_device, py::arg("device"));
  m.def("_synchronize", &synchronize, py::arg("device"));
  m.def("_get_device_properties", &get_device_properties, py::arg("device"));
  m.def(
      "_get_default_generator",
      [](c10::DeviceIndex device) {
        return py::reinterpret_steal<py::object>(
            THPGenerator_initDefaultGenerator(default_generator(device)));
      },
      py::arg("device"));
}
