#include "core/OpenRegSynchronize.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "core/OpenRegDeviceAsserts.h"
#include "core/OpenRegException.h"
#include "core/OpenRegFaults.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegInterrupt.h"
#include "core/OpenRegKernelTask.h"
#include "core/OpenRegLaunchStats.h"
#include "core/OpenRegStream.h"

namespace openreg {

namespace {

std::mutex g_errors_mutex;  // guards g_errors and g_warnings
// First failure message per stream since its last synchronization.
std::unordered_map<orStream_t, std::string> g_errors;

// Warnings raised by kernels since the last synchronization, per stream.
std::unordered_map<orStream_t, std::vector<c10::Warning>> g_warnings;

std::atomic<SyncTraceFn> g_sync_trace{nullptr};
thread_local bool t_calls_own_wait = false;
thread_local bool t_internal_wait = false;
std::atomic<HostWaitHook> g_host_wait{nullptr};

// Runs `wait` (which blocks on the runtime) through the host wait hook.
template <typename F>
orError_t host_wait(F&& wait) {
  orError_t err = orSuccess;
  auto call = [&] { err = wait(); };
  using Call = decltype(call);
  if (HostWaitHook hook = g_host_wait.load(std::memory_order_acquire)) {
    hook([](void* arg) { (*static_cast<Call*>(arg))(); }, &call);
  } else {
    call();
  }
  if (take_kept_interrupt() || err == orErrorInterrupted) {
    // The user's Ctrl-C in an InterruptibleWait (OpenRegInterrupt.h): the
    // device's work goes on, its errors wait for the next synchronization.
    raise_interrupt();
  }
  return err;
}

// Raises the deferred warnings of `stream` (nullptr: of every stream of
// `device`) on the calling thread.
void raise_deferred_warnings(orStream_t stream, c10::DeviceIndex device) {
  std::vector<c10::Warning> warnings;
  {
    std::lock_guard<std::mutex> lock(g_errors_mutex);
    for (auto it = g_warnings.begin(); it != g_warnings.end();) {
      int dev = -1;
      bool match = stream != nullptr
                       ? it->first == stream
                       : orStreamGetDevice(it->first, &dev) == orSuccess &&
                             dev == device;
      if (match) {
        warnings.insert(warnings.end(), it->second.begin(), it->second.end());
        it = g_warnings.erase(it);
      } else {
        ++it;
      }
    }
  }
  // The device's own: kernels that warn on purpose (orKernelContext::warn).
  // Like CUDA's printf buffer, any synchronization with the device delivers
  // them.
  const auto take = [](void* out, const char* message) {
    static_cast<std::vector<c10::Warning>*>(out)->emplace_back(
        c10::UserWarning{}, c10::SourceLocation{"", "the openreg device", 0},
        message, /*verbatim=*/false);
  };
  OPENREG_CHECK(orDeviceTakeWarnings(device, take, &warnings));
  for (const c10::Warning& w : warnings) {
    c10::warn(w);
  }
}

// Turns the result of a synchronization into an exception carrying the
// messages of the kernels that failed on `stream` (nullptr: any stream of
// `device`).
void raise_deferred(orError_t err, orStream_t stream, c10::DeviceIndex device) {
  if (err != orErrorLaunchFailure) {
    OPENREG_CHECK(err);
    return;
  }
  std::string msg;
  {
    std::lock_guard<std::mutex> lock(g_errors_mutex);
    for (auto it = g_errors.begin(); it != g_errors.end();) {
      int dev = -1;
      bool match = stream != nullptr
                       ? it->first == stream
                       : orStreamGetDevice(it->first, &dev) == orSuccess &&
                             dev == device;
      if (match) {
        msg += (msg.empty() ? "" : "\n") +
               device_assert_of_failure(device, it->second);
        it = g_errors.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (msg.empty()) {
    // A named kernel (orLaunchFunction) reports its failure to the driver,
    // which keeps the message for the stream.
    auto ask = [&msg, device](orStream_t s) {
      char text[2048] = {};
      if (orStreamGetErrorMessage(s, text, sizeof(text)) == orSuccess &&
          text[0] != '\0') {
        msg +=
            (msg.empty() ? "" : "\n") + device_assert_of_failure(device, text);
      }
    };
    if (stream != nullptr) {
      ask(stream);
    } else {
      for (orStream_t s : device_streams(device)) {
        ask(s);
      }
    }
  }
  // As CUDA reports a kernel's failure (torch.AcceleratorError).
  faults::surfaced(device, stream != nullptr ? "a stream synchronization"
                                             : "a device synchronization");
  // A device-side assert's message says how it is reported already.
  const bool assert_triggered =
      msg.find("device-side assert triggered") != std::string::npos;
  const char* hint =
      assert_triggered ? ""
      : launch_blocking()
          ? "\n(OPENREG_LAUNCH_BLOCKING=1: the failure is raised at the "
            "launch of the kernel that failed.)"
      : t_calls_own_wait
          ? "\n(Raised by a call that runs synchronously: it waits for its "
            "own kernel and for every kernel queued before it.)"
          : "\n(Kernels run asynchronously: the failure is reported at the "
            "next synchronization. Set OPENREG_LAUNCH_BLOCKING=1 to raise it "
            "at the launch.)";
  throw c10::AcceleratorError(
      {__func__, __FILE__, __LINE__}, orErrorLaunchFailure,
      (msg.empty() ? std::string("an openreg kernel failed") : msg) + hint);
}

}  // namespace

InternalWait::InternalWait() : previous_(t_internal_wait) {
  t_internal_wait = true;
}

InternalWait::~InternalWait() { t_internal_wait = previous_; }

CallsOwnWait::CallsOwnWait() : previous_(t_calls_own_wait) {
  t_calls_own_wait = true;
}

CallsOwnWait::~CallsOwnWait() { t_calls_own_wait = previous_; }

// [doc:kernel-errors]
void record_kernel_failure(orStream_t stream, const std::string& op,
                           const char* what) {
  std::lock_guard<std::mutex> lock(g_errors_mutex);
  g_errors.emplace(stream,
                   "openreg kernel '" + op + "' failed on the device: " + what);
}

void record_kernel_warning(orStream_t stream, const c10::Warning& warning) {
  std::lock_guard<std::mutex> lock(g_errors_mutex);
  g_warnings[stream].push_back(warning);
}

void synchronize_stream(orStream_t stream, c10::DeviceIndex device,
                        int64_t id) {
  faults::check_not_poisoned(device);
  if (stream == worker_stream()) {
    // A kernel of this stream waiting for its stream: everything queued
    // before the kernel has finished, everything after waits for it.
    return;
  }
  stats::count(stats::kHostWaits);
  const orError_t err =
      host_wait([stream] { return orStreamSynchronize(stream); });
  reclaim_finished_tasks();
  raise_deferred_warnings(stream, device);
  raise_deferred(err, stream, device);
  // The work waited for may have made the device unusable (a sticky kernel
  // error, a collective that did not complete): the wait raises that too.
  faults::check_not_poisoned(device);
  trace_sync("sync_stream", 0, id, device);
}

void synchronize_device(c10::DeviceIndex device) {
  faults::check_not_poisoned(device);
  if (orStream_t own = worker_stream()) {
    int own_device = -1;
    if (orStreamGetDevice(own, &own_device) == orSuccess &&
        own_device == device) {
      // On a worker of this device (a kernel that allocates device memory
      // and must free the cache first): every other stream of the device.
      const c10::ArrayRef<orStream_t> streams = device_streams(device);
      for (size_t id = 0; id < streams.size(); ++id) {
        if (streams[id] != own) {
          synchronize_stream(streams[id], device, static_cast<int64_t>(id));
        }
      }
      return;
    }
  }
  ScopedDevice guard(device);
  stats::count(stats::kHostWaits);
  const orError_t err = host_wait([] { return orDeviceSynchronize(); });
  reclaim_finished_tasks();
  raise_deferred_warnings(nullptr, device);
  raise_deferred(err, nullptr, device);
  faults::check_not_poisoned(device);
  trace_sync("sync_device", 0, 0, device);
}
// [/doc:kernel-errors]

void synchronize_event(orEvent_t event) {
  if (event == nullptr) {
    return;
  }
  stats::count(stats::kHostWaits);
  OPENREG_CHECK(host_wait([event] { return orEventSynchronize(event); }));
  reclaim_finished_tasks();
  int device = -1;
  if (orEventGetDevice(event, &device) == orSuccess) {
    faults::check_not_poisoned(static_cast<c10::DeviceIndex>(device));
  }
  trace_sync("sync_event", reinterpret_cast<int64_t>(event), 0, -1);
}

void set_sync_trace(SyncTraceFn fn) { g_sync_trace.store(fn); }

void set_host_wait_hook(HostWaitHook hook) {
  g_host_wait.store(hook, std::memory_order_release);
}

void trace_elapsed(int64_t end_event) {
  if (SyncTraceFn fn = g_sync_trace.load(std::memory_order_relaxed)) {
    fn("elapsed", end_event, 0, -1);
  }
}

void trace_sync(const char* kind, int64_t event, int64_t stream,
                int64_t device) {
  const bool sync = kind[0] == 's';  // sync_event, sync_stream, sync_device
  if (sync && t_internal_wait) {
    return;
  }
  if (SyncTraceFn fn = g_sync_trace.load(std::memory_order_relaxed)) {
    fn(kind, event, stream, device);
  }
}

}  // namespace openreg
