// Named kernels: kernel libraries (modules), their functions, and launches
// with byte parameters (openreg.h, "Named kernels").
//
// The thread driver runs a kernel on the stream's worker thread of this
// process, so a module is the library loaded here with dlopen and a
// function its symbol. What the kernel sees of the device comes through the
// orKernelContext the worker builds for each call: translate() maps device
// addresses to the arena's read-write kernel view, report_error() keeps the
// failure's message for orStreamGetErrorMessage.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "device_team.h"
#include "runtime_internal.h"

using namespace openreg_rt;

namespace {

// The worker's per-call state behind orKernelContext::driver_data.
struct KernelCall {
  orStream* stream = nullptr;
  std::string message;  // first report_error of this call
  bool reported = false;
  std::string activity;   // the last describe()
  const char* name = "";  // the function's
};

void* translate(orKernelContext* ctx, const void* device_ptr) {
  (void)ctx;
  DeviceRange range;
  if (find_device_range(device_ptr, &range)) {
    return range_is_valid(range, device_ptr, 1) ? kernel_ptr(range, device_ptr)
                                                : nullptr;
  }
  // Pinned host memory is reachable by the device as it is.
  return host_range_is_pinned(device_ptr, 1) ? const_cast<void*>(device_ptr)
                                             : nullptr;
}

void report_error(orKernelContext* ctx, const char* message) {
  auto* call = static_cast<KernelCall*>(ctx->driver_data);
  if (!call->reported) {
    call->reported = true;
    call->message = message != nullptr ? message : "";
  }
}

void describe(orKernelContext* ctx, const char* what) {
  auto* call = static_cast<KernelCall*>(ctx->driver_data);
  call->activity.assign(what != nullptr ? what : "");
  call->activity.resize(std::min<size_t>(call->activity.size(), 127));
  if (openreg_rt::kernel_timeout_ns() != 0) {  // what the watchdog names
    call->stream->note_running(
        openreg_rt::kernel_label(call->name, call->activity.c_str()));
  }
}

void warn(orKernelContext* ctx, const char* message) {
  auto* call = static_cast<KernelCall*>(ctx->driver_data);
  Device* dev = call->stream->device();
  std::string text(message != nullptr ? message : "");
  text.resize(std::min<size_t>(text.size(), OR_MAX_WARNING_BYTES - 1));
  std::lock_guard<std::mutex> lock(dev->warnings_mutex);
  dev->warnings_pending.store(true, std::memory_order_release);
  size_t& kept = dev->warnings_kept[call->stream];
  if (kept >= OR_MAX_PENDING_WARNINGS) {
    ++dev->warnings_dropped;
    return;
  }
  ++kept;
  dev->warnings.push_back(std::move(text));
}

// Host threads blocked in a wait for a device, all devices together: the
// host's cores are one pool, which every device of the thread driver
// shares with the host's own work.
std::atomic<int> g_host_waiting{0};
std::mutex g_publish_mu;  // the process driver's copies (HostWaiting)

int team_threads(orKernelContext* ctx, int threads) {
  (void)ctx;
  return team_threads_now(threads);
}

}  // namespace

namespace openreg_rt {

// [doc:team-threads]
// SIMULATOR ONLY: the device computes on the host's cores. While no host
// thread waits for a device, the host is running (Python, the next
// launches, its own CPU work) on one of them; a kernel that may run on
// fewer threads leaves it that one.
//
// The process driver's device processes see the count through their control
// blocks (proc::publish_host_waiting): a device process cannot see the
// host's threads otherwise.
// The count and its copies change together (g_publish_mu), so that the
// copies end at the count when threads start and end waits at once.
HostWaiting::HostWaiting() {
  if (!process_driver()) {
    g_host_waiting.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const std::lock_guard<std::mutex> lock(g_publish_mu);
  proc::publish_host_waiting(
      g_host_waiting.fetch_add(1, std::memory_order_relaxed) + 1);
}

HostWaiting::~HostWaiting() {
  if (!process_driver()) {
    g_host_waiting.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  const std::lock_guard<std::mutex> lock(g_publish_mu);
  proc::publish_host_waiting(
      g_host_waiting.fetch_sub(1, std::memory_order_relaxed) - 1);
}

int team_threads_now(int threads) {
  if (threads <= 1 || host_waiting_now()) {
    return threads;
  }
  return threads - 1;
}
// [/doc:team-threads]

bool host_waiting_now() {
  return g_host_waiting.load(std::memory_order_relaxed) > 0;
}

std::string kernel_label(const std::string& name, const char* activity) {
  std::string label = "'" + name + "'";
  if (activity != nullptr && activity[0] != '\0') {
    label.append(" (").append(activity).append(")");
  }
  return label;
}

std::string dropped_warnings_message(uint64_t dropped) {
  return "openreg: " + std::to_string(dropped) +
         " more warnings from the device's kernels were not kept (at most " +
         std::to_string(OR_MAX_PENDING_WARNINGS) +
         " per stream between two synchronizations)";
}

std::string failed_kernel_message(const std::string& name, const char* activity,
                                  int status) {
  return "kernel " + kernel_label(name, activity) + " failed (returned " +
         std::to_string(status) + ")";
}

}  // namespace openreg_rt

void orStream::run_function(Task& task) {
  KernelCall call;
  call.stream = this;
  call.name = task.function->name.c_str();
  orKernelContext ctx{};
  ctx.version = OR_KERNEL_CONTEXT_VERSION;
  ctx.device = dev_->index;
  ctx.translate = &translate;
  ctx.report_error = &report_error;
  ctx.driver_data = &call;
  ctx.describe = &describe;
  ctx.warn = &warn;
  ctx.team_threads = &team_threads;
  const int status = task.function->fn(task.params.get(), task.bytes, &ctx);
  if (status != 0) {
    std::string message =
        call.reported ? call.message
                      : failed_kernel_message(task.function->name,
                                              call.activity.c_str(), status);
    record_error(orErrorLaunchFailure, message.c_str());
  }
}

extern "C" {

orError_t orModuleLoad(orModule_t* module, const char* path) {
  return orModuleLoadEx(module, path, nullptr, 0);
}

orError_t orModuleLoadEx(orModule_t* module, const char* path, char* errorLog,
                         size_t errorLogBytes) {
  if (module == nullptr || (errorLog == nullptr && errorLogBytes != 0)) {
    return orErrorInvalidValue;
  }
  *module = nullptr;
  std::string why;
  const auto give_log = [&](orError_t err) {
    if (errorLogBytes > 0) {
      std::snprintf(errorLog, errorLogBytes, "%s", why.c_str());
    }
    return err;
  };
  if (path == nullptr || *path == '\0') {
    return give_log(orErrorInvalidValue);
  }
  OR_RETURN_IF_ERROR(give_log(ensure_init()));
  if (process_driver()) {
    // Loaded by every device process, not here.
    auto m = std::make_unique<orModule_st>();
    m->path = path;
    const orError_t err = proc::module_load(m.get(), path, &why);
    if (err != orSuccess) {
      return give_log(err);
    }
    *module = m.release();
    return give_log(orSuccess);
  }
  // RTLD_LOCAL: two kernel libraries may define the same names.
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* message = dlerror();
    why = message != nullptr ? message : "";
    return give_log(orErrorFileNotFound);
  }
  // SIMULATOR ONLY: the engine's kernel library sets the OpenMP team's spin
  // of this process, which the thread driver's devices share with the host
  // ("team-spin-choice" in device_team.cpp).
  openreg_device::take_team_spin_hint(handle);
  auto* m = new orModule_st();
  m->handle = handle;
  m->path = path;
  *module = m;
  return give_log(orSuccess);
}

orError_t orModuleUnload(orModule_t module) {
  if (module == nullptr) {
    return orErrorInvalidResourceHandle;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  if (process_driver()) {
    proc::module_unload(module);
    delete module;
    return orSuccess;
  }
  dlclose(module->handle);
  delete module;
  return orSuccess;
}

orError_t orModuleGetFunction(orFunction_t* function, orModule_t module,
                              const char* name) {
  if (function == nullptr) {
    return orErrorInvalidValue;
  }
  *function = nullptr;
  if (name == nullptr || *name == '\0') {
    return orErrorInvalidValue;
  }
  if (module == nullptr) {
    return orErrorInvalidResourceHandle;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  std::lock_guard<std::mutex> lock(module->mu);
  auto it = module->functions.find(name);
  if (it == module->functions.end() && process_driver()) {
    auto fn = std::make_unique<orFunction_st>();
    fn->module = module;
    fn->name = name;
    OR_RETURN_IF_ERROR(proc::function_get(module, name, fn.get()));
    it = module->functions.emplace(name, std::move(fn)).first;
  }
  if (it == module->functions.end()) {
    void* symbol = dlsym(module->handle, name);
    if (symbol == nullptr) {
      return orErrorSymbolNotFound;
    }
    auto fn = std::make_unique<orFunction_st>();
    fn->module = module;
    fn->fn = reinterpret_cast<orDeviceKernelFn>(symbol);
    fn->name = name;
    it = module->functions.emplace(name, std::move(fn)).first;
  }
  *function = it->second.get();
  return orSuccess;
}

orError_t orLaunchFunction(orStream_t stream, orFunction_t function,
                           const void* params, size_t bytes,
                           const orLaunchAttributes* attributes) {
  const orLaunchAttributes defaults{};
  const orLaunchAttributes& attrs =
      attributes != nullptr ? *attributes : defaults;
  if (function == nullptr || (params == nullptr && bytes != 0) ||
      bytes > OR_MAX_KERNEL_PARAMS || attrs.hostThreads < 0) {
    return orErrorInvalidValue;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  if (stream == nullptr) {
    stream = device_at(current_device())->default_stream;
  }
  OR_RETURN_IF_ERROR(check_not_lost(stream->device()));
  if (stream->proc_ring_ >= 0) {
    return proc::launch(stream, function, params, bytes);
  }
  return stream->enqueue_function(function, params, bytes, attrs.hostThreads);
}

orError_t orDeviceTakeWarnings(int device, orWarningFn fn, void* user_data) {
  if (fn == nullptr) {
    return orErrorInvalidValue;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  Device* dev = device_at(device);
  if (dev == nullptr) {
    return orErrorInvalidDevice;
  }
  if (process_driver()) {
    proc::take_warnings(dev, fn, user_data);
    return orSuccess;
  }
  if (!dev->warnings_pending.load(std::memory_order_acquire)) {
    return orSuccess;  // the common case: one load
  }
  std::vector<std::string> taken;
  uint64_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(dev->warnings_mutex);
    dev->warnings_pending.store(false, std::memory_order_relaxed);
    taken.swap(dev->warnings);
    dev->warnings_kept.clear();
    dropped = std::exchange(dev->warnings_dropped, 0);
  }
  for (const std::string& text : taken) {
    fn(user_data, text.c_str());
  }
  if (dropped > 0) {
    fn(user_data, dropped_warnings_message(dropped).c_str());
  }
  return orSuccess;
}

orError_t orStreamGetErrorMessage(orStream_t stream, char* message,
                                  size_t size) {
  if (message == nullptr && size != 0) {
    return orErrorInvalidValue;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  if (stream == nullptr) {
    stream = device_at(current_device())->default_stream;
  }
  if (size != 0) {
    std::snprintf(message, size, "%s", stream->last_error_message().c_str());
  }
  return orSuccess;
}

}  // extern "C"
