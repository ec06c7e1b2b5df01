// The torch_openreg._C extension module. Loading it registers every C++
// integration point (static registrations in the other files); this file
// only adds the functions the Python package needs.
#include <ATen/EmptyTensor.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/strides.h>
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <optional>
#include <sstream>
#include <vector>

#include "aten/OpenRegLaunch.h"
#include "aten/fallback/OpenRegFallbackEntry.h"
#include "aten/fallback/OpenRegFallbackLog.h"
#include "core/OpenRegEngine.h"
#include "core/OpenRegException.h"
#include "core/OpenRegFaults.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegInterrupt.h"
#include "core/OpenRegLaunchStats.h"
#include "core/OpenRegNamedKernels.h"
#include "core/OpenRegStream.h"
#include "core/OpenRegSynchronize.h"
#include "distributed/OpenRegProcessGroup.h"
#include "memory/OpenRegAllocator.h"
#include "memory/OpenRegIpc.h"
#include "python/OpenRegAddedBindings.h"
#include "python/OpenRegMemoryHistory.h"
#include "random/OpenRegGenerator.h"
#include "serialization/OpenRegBackendMeta.h"

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
  const InterruptibleWait interruptible;  // Ctrl-C ends the wait
  synchronize_device(device < 0 ? current_device() : device);
}

// Sync debug mode: which Python call synchronized
// (torch_openreg/openreg/_sync_caller.py), or "" if Python cannot tell.
std::string python_sync_caller() {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) {
    return "";
  }
  py::gil_scoped_acquire gil;
  try {
    return py::module_::import("torch_openreg.openreg._sync_caller")
        .attr("describe")()
        .cast<std::string>();
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("openreg sync debug mode");
    return "";
  }
}

// The Python callable the stream sanitizer installed (leaked on purpose: it
// may be called until exit).
py::object* g_trace_callback = nullptr;

void call_trace(const char* kind, int64_t event, int64_t stream,
                int64_t device) {
  py::gil_scoped_acquire gil;
  if (g_trace_callback == nullptr) {
    return;
  }
  try {
    (*g_trace_callback)(kind, event, stream, device);
  } catch (py::error_already_set& e) {
    if (std::strcmp(kind, "elapsed") == 0) {
      throw;  // the sanitizer's report, for the caller of elapsed_time
    }
    e.discard_as_unraisable("openreg stream sanitizer trace");
  }
}

void set_trace_callback(py::object callback) {
  if (callback.is_none()) {
    set_sync_trace(nullptr);
    return;
  }
  if (g_trace_callback == nullptr) {
    g_trace_callback = new py::object();
  }
  *g_trace_callback = std::move(callback);
  set_sync_trace(&call_trace);
}

// The host waits for the device without the GIL: device work may need it
// (a CPU kernel written in Python), and other Python threads run meanwhile.
void wait_without_gil(void (*wait)(void*), void* arg) {
  if (Py_IsInitialized() && PyGILState_Check() != 0) {
    const py::gil_scoped_release no_gil;
    wait(arg);
  } else {
    wait(arg);
  }
}

// [doc:interrupt-hooks]
// Ctrl-C (core/OpenRegInterrupt.h). Python runs signal handlers on its main
// thread only; a handler that raises (KeyboardInterrupt, by default) leaves
// its exception for raise_python_interrupt, which the synchronization
// throws once the runtime's wait has returned.
unsigned long g_main_thread = 0;
thread_local std::optional<py::error_already_set> t_interrupt;

bool python_interrupt_pending() {
  if (PyThread_get_thread_ident() != g_main_thread || !Py_IsInitialized() ||
      _Py_IsFinalizing()) {
    return false;
  }
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() == 0) {
    return false;
  }
  t_interrupt.emplace();  // takes the error the handler raised
  return true;
}

[[noreturn]] void raise_python_interrupt() {
  py::gil_scoped_acquire gil;
  if (!t_interrupt) {
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw py::error_already_set();
  }
  py::error_already_set e = std::move(*t_interrupt);
  t_interrupt.reset();
  throw e;
}

bool python_is_interrupt(const std::exception& e) {
  PyObject* type = nullptr;
  if (const auto* pe = dynamic_cast<const python_error*>(&e)) {
    type = pe->type;
  }
  const auto* pybind = dynamic_cast<const py::error_already_set*>(&e);
  if ((type == nullptr && pybind == nullptr) || !Py_IsInitialized()) {
    return false;
  }
  py::gil_scoped_acquire gil;
  if (pybind != nullptr) {
    type = pybind->type().ptr();
  }
  return type != nullptr &&
         (PyErr_GivenExceptionMatches(type, PyExc_KeyboardInterrupt) != 0 ||
          PyErr_GivenExceptionMatches(type, PyExc_SystemExit) != 0);
}
// [/doc:interrupt-hooks]

// torch.cuda.memory_snapshot()'s shape: block addresses follow from the
// segment's address and the sizes of the blocks before them.
py::list snapshot_to_python() {
  py::list segments;
  for (const auto& seg : memory_snapshot()) {
    py::dict d;
    d["device"] = static_cast<int>(seg.device);
    d["address"] = seg.address;
    d["total_size"] = seg.total_size;
    d["allocated_size"] = seg.allocated_size;
    d["active_size"] = seg.active_size;
    d["requested_size"] = seg.requested_size;
    d["stream"] = reinterpret_cast<intptr_t>(seg.stream);  // a StreamId
    d["segment_type"] = seg.is_large ? "large" : "small";
    py::list blocks;
    size_t address = seg.address;
    for (const auto& b : seg.blocks) {
      py::dict bd;
      bd["address"] = address;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested_size;
      bd["state"] = b.allocated ? "active_allocated"
                    : b.active  ? "active_pending_free"
                                : "inactive";
      blocks.append(bd);
      address += b.size;
    }
    d["blocks"] = blocks;
    segments.append(d);
  }
  return segments;
}

py::dict stat_to_python(const c10::CachingAllocator::Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

py::dict host_stats() {
  at::HostStats s = host_allocator()->get_stats();
  py::dict d;
  d["allocations"] = stat_to_python(s.allocations);
  d["allocated_bytes"] = stat_to_python(s.allocated_bytes);
  d["active_requests"] = stat_to_python(s.active_requests);
  d["active_bytes"] = stat_to_python(s.active_bytes);
  d["num_host_alloc"] = s.num_host_alloc;
  d["num_host_free"] = s.num_host_free;
  return d;
}

// Checks that [data, data + nbytes) lies in live openreg device memory:
// the caching allocator's block holding the address (the runtime only knows
// the segment the block was cut from), or else what the runtime reports.
// Returns the device. `what` names the caller in the messages.
int check_device_range(const void* data, size_t nbytes, const char* what) {
  const auto address = reinterpret_cast<uintptr_t>(data);
  orPointerAttributes attr;
  const orError_t err = orPointerGetAttributes(&attr, data);
  TORCH_CHECK(err != orErrorInvalidDevicePointer, what, ": address 0x",
              std::hex, address, std::dec,
              " is in openreg device memory that is not allocated (freed, "
              "or returned to the device by empty_cache())");
  OPENREG_CHECK(err);
  TORCH_CHECK(attr.type == orMemoryTypeDevice, what, ": address 0x", std::hex,
              address, std::dec,
              " is not openreg device memory (pinned or pageable host memory "
              "makes CPU tensors: use torch.frombuffer or torch.from_numpy)");
  const auto* base = static_cast<const char*>(attr.base);
  size_t size = attr.size;
  if (const auto block =
          find_device_block(data, static_cast<c10::DeviceIndex>(attr.device))) {
    TORCH_CHECK(block->allocated, what, ": address 0x", std::hex, address,
                std::dec, " is in openreg memory that was freed (a block of ",
                block->size, " bytes the caching allocator keeps for reuse)");
    base = block->begin;
    size = block->size;
  }
  const auto* begin = static_cast<const char*>(data);
  TORCH_CHECK(begin + nbytes <= base + size, what, ": ", nbytes,
              " bytes from address 0x", std::hex, address, std::dec,
              " run past the end of its allocation (", size,
              " bytes, starting ", begin - base, " bytes earlier)");
  return attr.device;
}

// A tensor another library handed over (DLPack): its memory must be live
// openreg memory covering everything its sizes and strides reach.
void check_imported(const at::Tensor& t, const std::string& what) {
  if (t.device().type() != c10::DeviceType::PrivateUse1 || t.numel() == 0) {
    return;
  }
  const size_t nbytes =
      at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.itemsize(),
                                       static_cast<size_t>(t.storage_offset()));
  check_device_range(t.storage().data(), nbytes, what.c_str());
}

// Wraps openreg device memory that something else owns (a vendor library, a
// DLPack producer, another tensor) as a tensor, without copying: the
// at::from_blob path a C++ integration uses. `owner` is kept alive until the
// tensor's storage dies. The pointer must be live device memory, and the
// extent the sizes and strides reach must lie inside its allocation.
at::Tensor from_blob(uintptr_t address, std::vector<int64_t> sizes,
                     std::optional<std::vector<int64_t>> strides,
                     at::ScalarType dtype, int64_t storage_offset,
                     py::object owner) {
  void* data = reinterpret_cast<void*>(address);
  const auto contiguous = c10::contiguous_strides(sizes);
  const std::vector<int64_t> st = strides.value_or(
      std::vector<int64_t>(contiguous.begin(), contiguous.end()));
  TORCH_CHECK(st.size() == sizes.size(), "from_blob: ", sizes.size(),
              " sizes but ", st.size(), " strides");
  TORCH_CHECK(storage_offset >= 0, "from_blob: negative storage offset ",
              storage_offset);
  const size_t itemsize = c10::elementSize(dtype);
  const size_t nbytes = (at::detail::computeStorageNbytes(sizes, st, itemsize) +
                         static_cast<size_t>(storage_offset) * itemsize);
  const int device = check_device_range(data, nbytes, "from_blob");
  auto* keep = new py::object(std::move(owner));
  return at::for_blob(data, sizes)
      .strides(st)
      .storage_offset(storage_offset)
      .deleter([keep](void*) {
        if (Py_IsInitialized()) {
          py::gil_scoped_acquire gil;
          delete keep;
        }
      })
      .options(at::TensorOptions().dtype(dtype).device(
          c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)))
      .make_tensor();
}

// A storage shared with another process, as the Python reducer pickles it:
// (device, handle, offset, nbytes, pid, refs_fd, refs_inode, slot, address).
// [doc:ipc-share-tuple]
py::tuple share_to_python(const IpcShare& s) {
  return py::make_tuple(s.device, py::bytes(s.handle), s.offset, s.nbytes,
                        s.pid, s.refs_fd, s.refs_inode, s.slot, s.address);
}
// [/doc:ipc-share-tuple]

IpcShare share_from_python(const py::tuple& t) {
  TORCH_CHECK(t.size() == 9, "openreg IPC: expected 9 fields, got ", t.size());
  IpcShare s;
  s.device = t[0].cast<c10::DeviceIndex>();
  s.handle = t[1].cast<std::string>();
  s.offset = t[2].cast<size_t>();
  s.nbytes = t[3].cast<size_t>();
  s.pid = t[4].cast<int>();
  s.refs_fd = t[5].cast<int>();
  s.refs_inode = t[6].cast<uint64_t>();
  s.slot = t[7].cast<int64_t>();
  s.address = t[8].cast<uintptr_t>();
  return s;
}

// The received storage, as a uint8 tensor over all of it (Python takes its
// untyped_storage()).
at::Tensor open_shared(const py::tuple& t) {
  const IpcShare share = share_from_python(t);
  c10::Storage storage = open_shared_storage(share);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      caffe2::TypeMeta::Make<uint8_t>());
  tensor.unsafeGetTensorImpl()->set_sizes_contiguous(
      {static_cast<int64_t>(share.nbytes)});
  return tensor;
}

}  // namespace

}  // namespace openreg

PYBIND11_MODULE(_C, m) {
  using namespace openreg;
  m.doc() = "openreg: a simulated PyTorch accelerator (C++ part)";
  set_host_wait_hook(&wait_without_gil);
  g_main_thread = py::module_::import("threading")
                      .attr("main_thread")()
                      .attr("ident")
                      .cast<unsigned long>();
  InterruptHooks interrupt_hooks;
  interrupt_hooks.pending = &python_interrupt_pending;
  interrupt_hooks.raise = &raise_python_interrupt;
  interrupt_hooks.is_interrupt = &python_is_interrupt;
  set_interrupt_hooks(interrupt_hooks);
  set_sync_caller_hook(&python_sync_caller);
  // The engine's routes, after every static registration.
  static const int routed = route_ops();
  m.attr("_ops_routed") = routed;

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
  m.def("_set_sync_debug_mode", &set_sync_debug_mode, py::arg("mode"));
  m.def("_get_sync_debug_mode", &get_sync_debug_mode);
  m.def("_get_device", &current_device);
  m.def("_set_device", &set_device, py::arg("device"));
  m.def("_exchange_device", &exchange_device, py::arg("device"));
  // Warnings the device kept reach Python here too.
  m.def("_synchronize", torch::wrap_pybind_function_no_gil(&synchronize),
        py::arg("device"));
  m.def("_get_device_properties", &get_device_properties, py::arg("device"));
  m.def(
      "_stream_priority",
      [](int64_t stream_id, c10::DeviceIndex device) {
        return OpenRegStream(
                   c10::Stream(
                       c10::Stream::UNSAFE,
                       c10::Device(c10::DeviceType::PrivateUse1, device),
                       stream_id))
            .priority();
      },
      py::arg("stream_id"), py::arg("device"));
  m.def(
      "_default_stream_id",
      [](c10::DeviceIndex device) { return getDefaultStream(device).id(); },
      py::arg("device"));
  m.def("_from_blob", &from_blob, py::arg("address"), py::arg("sizes"),
        py::arg("strides"), py::arg("dtype"), py::arg("storage_offset"),
        py::arg("owner"));
  m.def("_check_imported", &check_imported, py::arg("tensor"), py::arg("what"));
  m.def("_tensor_tags", &tensor_tags, py::arg("tensor"));
  m.def("_set_tensor_tag", &set_tensor_tag, py::arg("tensor"), py::arg("name"),
        py::arg("value"));
  m.def("_fallback_ops", &fallback_ops);
  m.def("_set_fallback_warnings", &set_fallback_warnings, py::arg("enabled"));
  m.def("_set_sync_trace", &set_trace_callback, py::arg("callback"));
  m.def("_set_memory_fraction", &set_memory_fraction, py::arg("fraction"),
        py::arg("device"));
  m.def("_get_memory_fraction", &get_memory_fraction, py::arg("device"));
  m.def("_memory_snapshot", &snapshot_to_python);
  m.def("_host_memory_stats", &host_stats);
  m.def(
      "_launch_stats",
      [] {
        const stats::Snapshot s = stats::snapshot();
        py::dict out;
        out["queued"] = s.counters[stats::kQueued];
        out["synchronous"] = s.counters[stats::kSynchronous];
        out["learned"] = s.counters[stats::kLearned];
        out["launches"] = s.counters[stats::kLaunches];
        out["host_waits"] = s.counters[stats::kHostWaits];
        out["synchronous_by_op"] = s.synchronous_by_op;
        out["learned_by_op"] = s.learned_by_op;
        out["captured"] = s.counters[stats::kCaptured];
        out["captured_by_op"] = s.captured_by_op;
        out["staged"] = s.counters[stats::kStaged];
        out["staged_by_op"] = s.staged_by_op;
        out["described"] = s.counters[stats::kDescribed];
        out["described_by_op"] = s.described_by_op;
        out["copied"] = s.counters[stats::kCopied];
        out["copied_by_op"] = s.copied_by_op;
        out["host_copied"] = s.counters[stats::kHostCopied];
        return out;
      },
      "How operators ran since the last reset (core/OpenRegLaunchStats.h).");
  m.def("_reset_launch_stats", &stats::reset);
  m.def("_host_empty_cache", [] { host_allocator()->empty_cache(); });
  m.def("_host_reset_peak_stats", [] { host_allocator()->reset_peak_stats(); });
  m.def("_host_reset_accumulated_stats",
        [] { host_allocator()->reset_accumulated_stats(); });
  m.def(
      "_ipc_share",
      [](const at::Tensor& t) {
        return share_to_python(share_storage(t.storage()));
      },
      py::arg("tensor"));
  m.def("_ipc_open", &open_shared, py::arg("share"));
  m.def(
      "_ipc_release",
      [](const py::tuple& t) { release_share(share_from_python(t)); },
      py::arg("share"));
  m.def("_ipc_collect", &ipc_collect);
  // Faults on demand (core/OpenRegFaults.h, torch.openreg.faults).
  m.def("_fault_fail_allocation", &faults::fail_allocation, py::arg("device"),
        py::arg("after"), py::arg("min_bytes"));
  m.def("_fault_fail_kernel", &faults::fail_kernel, py::arg("op"),
        py::arg("device"), py::arg("after"), py::arg("sticky"));
  m.def("_fault_shuffle_atomics", &faults::shuffle_atomics, py::arg("seed"));
  m.def("_fault_delay_kernels", &faults::delay_kernels, py::arg("device"),
        py::arg("stream"), py::arg("max_us"), py::arg("seed"));
  m.def("_fault_fail_collective", &faults::fail_collective, py::arg("op"),
        py::arg("rank"), py::arg("after"), py::arg("hang"));
  m.def("_fault_disarm", &faults::disarm, py::arg("id"));
  m.def("_fault_disarm_all", &faults::disarm_all);
  m.def("_fault_clear_report", &faults::clear_report);
  m.def("_fault_report", [] {
    py::list out;
    for (const faults::Event& e : faults::report()) {
      py::dict d;
      d["id"] = e.fault;
      d["fault"] = e.kind;
      d[e.kind == "fail_collective" ? "rank" : "device"] = e.device;
      d["injected"] = e.what;
      d["surfaced"] = e.surfaced.empty() ? py::object(py::none())
                                         : py::object(py::str(e.surfaced));
      out.append(d);
    }
    return out;
  });
  m.def(
      "_lose_device",
      [](int device, const std::string& reason) {
        lazy_init();
        OPENREG_CHECK(orSimulateDeviceLoss(device, reason.c_str()));
        try {
          // Raised now for this device; the same error for every later call
          // (throw_device_lost poisons the lost devices).
          OPENREG_CHECK(orDeviceGetLossReason(device, nullptr, 0));
        } catch (const c10::AcceleratorError&) {
        }
      },
      py::arg("device"), py::arg("reason"));
  m.def("_named_kernels_only", [] {
    lazy_init();
    return !host_kernels_supported();
  });
  m.def(
      "_crash_device",
      [](int device, int how) {
        lazy_init();
        check_device_index(static_cast<c10::DeviceIndex>(device));
        TORCH_CHECK(!host_kernels_supported(),
                    "crash_device needs a device in a process of its own "
                    "(OPENREG_DRIVER=process): with the thread driver the "
                    "device runs in this process, and a crashing kernel would "
                    "end it. Use torch.openreg.faults.lose_device instead.");
        TORCH_CHECK(how == 1 || how == 2,
                    "how must be 1 (segfault) or 2 "
                    "(abort), got ",
                    how);
        const int32_t params = how;
        launch_function(
            static_cast<c10::DeviceIndex>(device), "openreg_fault_crash",
            named_kernel(NamedKernel::kCrash), &params, sizeof(params));
      },
      py::arg("device"), py::arg("how"));
  m.def(
      "_warn_on_device",
      [](int device, const std::string& message) {
        lazy_init();
        check_device_index(static_cast<c10::DeviceIndex>(device));
        launch_function(static_cast<c10::DeviceIndex>(device),
                        "openreg_fault_warn", named_kernel(NamedKernel::kWarn),
                        message.data(), message.size());
      },
      py::arg("device"), py::arg("message"));
  // [doc:c10d-binding]
  m.def(
      "_create_orccl_backend",
      [](const c10::intrusive_ptr<c10d::Backend>& gloo, int rank, int size,
         std::chrono::milliseconds timeout)
          -> c10::intrusive_ptr<c10d::Backend> {
        return c10::make_intrusive<distributed::ProcessGroupOpenReg>(
            gloo, rank, size, timeout);
      },
      py::arg("gloo"), py::arg("rank"), py::arg("size"), py::arg("timeout"));
  // [/doc:c10d-binding]
  m.def(
      "_get_default_generator",
      [](c10::DeviceIndex device) {
        return py::reinterpret_steal<py::object>(
            THPGenerator_initDefaultGenerator(default_generator(device)));
      },
      py::arg("device"));
  init_added_bindings(m);  // the engine's (python/OpenRegAddedBindings.h)
  init_memory_history_bindings(m);
}
