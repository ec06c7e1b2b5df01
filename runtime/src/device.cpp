// Runtime state, initialisation from the environment, fork detection, and
// the device-level API.
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime_internal.h"

namespace openreg_rt {

std::atomic<bool> g_forked{false};

namespace {

constexpr int kDefaultDeviceCount = 2;
constexpr int kMaxDeviceCount = OR_MAX_DEVICES;
constexpr size_t kDefaultCapacity = size_t{4} << 30;  // 4 GiB per device
constexpr size_t kMinCapacity = size_t{1} << 20;      // 1 MiB
// Each device maps its capacity twice (device and kernel views): 16 devices
// of 1 TiB take 32 TiB of the 128 TiB a process can map.
constexpr size_t kMaxCapacity = size_t{1} << 40;  // 1 TiB
// The process driver's pinned pool: address space and a sparse file, pages
// exist only once allocated and touched.
constexpr size_t kPinnedPoolBytes = size_t{16} << 30;
constexpr int kPriorityLeast = 0;
constexpr int kPriorityGreatest = -1;

thread_local int t_current_device = 0;

// Why creating the devices failed (orGetInitErrorMessage); set before the
// initialisation's status.
std::string& init_message() {
  static auto* message = new std::string();  // leaked: read until exit
  return *message;
}

// Parses "123", "64K", "512M", "4G", "1T" (binary units). Returns false if
// bad.
bool parse_bytes(const char* text, size_t* out) {
  // strtoull would accept leading blanks and a sign, and wraps "-1" to
  // 2^64 - 1: only a plain decimal number is a size.
  if (*text < '0' || *text > '9') {
    return false;
  }
  char* end = nullptr;
  errno = 0;
  unsigned long long value = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text) {
    return false;
  }
  size_t shift = 0;
  if (*end == 'K' || *end == 'k') {
    shift = 10;
  } else if (*end == 'M' || *end == 'm') {
    shift = 20;
  } else if (*end == 'G' || *end == 'g') {
    shift = 30;
  } else if (*end == 'T' || *end == 't') {
    shift = 40;
  } else if (*end != '\0') {
    return false;
  }
  if (shift != 0) {
    ++end;
    // "K", "KB", "Ki", "KiB" (binary units in every spelling).
    if (*end == 'i' || *end == 'I') {
      ++end;
    }
    if (*end == 'B' || *end == 'b') {
      ++end;
    }
  }
  // Half the address space is more than any mapping can get, and the limit
  // leaves room for the caller's rounding up to whole pages.
  constexpr unsigned long long kMaxBytes = ~0ULL >> 1;
  if (*end != '\0' || value > (kMaxBytes >> shift)) {
    return false;
  }
  *out = static_cast<size_t>(value) << shift;
  return true;
}

// Creates the memfd arena and its two mappings. Releases what it made on
// failure.
orError_t create_device(int index, size_t capacity, bool kernel_view,
                        std::unique_ptr<Device>* out) {
  auto dev = std::make_unique<Device>();
  dev->index = index;
  dev->capacity = capacity;
  std::string name = "openreg-device-" + std::to_string(index);
  dev->fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (dev->fd < 0) {
    std::fprintf(stderr, "openreg: memfd_create failed: %s\n",
                 std::strerror(errno));
    return orErrorInitializationError;
  }
  auto fail = [&dev](const char* what) {
    char text[256];
    std::snprintf(text, sizeof(text), "%s failed for device %d: %s", what,
                  dev->index, std::strerror(errno));
    std::fprintf(stderr, "openreg: %s\n", text);
    init_message() = text;
    if (dev->device_base != nullptr) {
      munmap(dev->device_base, dev->capacity);
    }
    if (dev->kernel_base != nullptr) {
      munmap(dev->kernel_base, dev->capacity);
    }
    close(dev->fd);
    return orErrorInitializationError;
  };
  // The arena, then the IPC export table (sparse: no page exists until
  // written).
  if (ftruncate(dev->fd, static_cast<off_t>(
                             capacity + export_table_bytes(capacity))) != 0) {
    return fail("ftruncate");
  }
  struct stat st;
  if (fstat(dev->fd, &st) != 0) {
    return fail("fstat");
  }
  dev->inode = static_cast<uint64_t>(st.st_ino);
  void* device_view = mmap(nullptr, capacity, PROT_NONE,
                           MAP_SHARED | MAP_NORESERVE, dev->fd, 0);
  if (device_view == MAP_FAILED) {
    return fail("mmap (device view)");
  }
  dev->device_base = static_cast<char*>(device_view);
  if (!kernel_view) {
    // Process driver: the device process reads and writes the arena (and
    // the communication library, through orMemGetDmaPointer's view).
    dev->free_ranges.emplace(0, capacity);
    dev->default_stream = new Stream(dev.get(), kPriorityLeast, true);
    *out = std::move(dev);
    return orSuccess;
  }
  void* kernel_view_ptr = mmap(nullptr, capacity, PROT_READ | PROT_WRITE,
                               MAP_SHARED | MAP_NORESERVE, dev->fd, 0);
  if (kernel_view_ptr == MAP_FAILED) {
    return fail("mmap (kernel view)");
  }
  dev->kernel_base = static_cast<char*>(kernel_view_ptr);
  dev->free_ranges.emplace(0, capacity);
  dev->default_stream = new Stream(dev.get(), kPriorityLeast, true);
  *out = std::move(dev);
  return orSuccess;
}

void on_fork_child() { g_forked.store(true, std::memory_order_relaxed); }

// The configuration read from the environment. Reading it creates nothing,
// so orGetDeviceCount is safe before a fork (like cudaGetDeviceCount).
struct Config {
  orError_t status = orErrorInitializationError;
  int count = kDefaultDeviceCount;
  size_t capacity = kDefaultCapacity;
  bool process = true;            // OPENREG_DRIVER: process (default), thread
  int64_t kernel_timeout_ns = 0;  // OPENREG_KERNEL_TIMEOUT, 0: off
  bool nic_dma = true;            // OPENREG_NIC_DMA: 1 (default) or 0
  std::string message;            // why status is not orSuccess
};

// Reports a bad setting on stderr and keeps the text for
// orGetInitErrorMessage.
template <typename... Args>
void bad_setting(Config& c, const char* format, Args... args) {
  char text[512];
  std::snprintf(text, sizeof(text), format, args...);
  std::fprintf(stderr, "openreg: %s\n", text);
  c.message = text;
}

const Config& config() {
  static const Config cfg = [] {
    Config c;
    if (const char* env = std::getenv("OPENREG_DEVICE_COUNT")) {
      // Digits only, as for the memory size (strtol alone would accept
      // leading blanks and a sign, and not trailing ones).
      char* end = nullptr;
      long v = std::strtol(env, &end, 10);
      if (*env < '0' || *env > '9' || end == env || *end != '\0' || v < 1 ||
          v > kMaxDeviceCount) {
        bad_setting(c,
                    "OPENREG_DEVICE_COUNT='%s' is not a number in "
                    "[1, %d]",
                    env, kMaxDeviceCount);
        return c;
      }
      c.count = static_cast<int>(v);
    }
    if (const char* env = std::getenv("OPENREG_DEVICE_MEMORY")) {
      if (!parse_bytes(env, &c.capacity) || c.capacity < kMinCapacity ||
          c.capacity > kMaxCapacity) {
        bad_setting(c,
                    "OPENREG_DEVICE_MEMORY='%s' is not a size from "
                    "1M to 1T per device (examples: 1073741824, 512M, 4G, "
                    "1T)",
                    env);
        return c;
      }
    }
    // Each device a process of its own by default: a device with memory
    // and a crash of its own, as real hardware (docs/process-driver.md,
    // "Which driver is the default").
    if (const char* env = std::getenv("OPENREG_DRIVER")) {
      if (std::strcmp(env, "thread") == 0) {
        c.process = false;
      } else if (std::strcmp(env, "process") != 0 && *env != '\0') {
        bad_setting(c,
                    "OPENREG_DRIVER='%s' is not 'process' (each device a "
                    "process of its own, the default) or 'thread' (each "
                    "device a set of threads of this process)",
                    env);
        return c;
      }
    }
    if (const char* env = std::getenv("OPENREG_TEAM_SPIN")) {
      // Read where a kernel library is loaded (device_team.cpp, "team
      // spin"): by the device processes, or by the thread driver here.
      if (*env != '\0' && std::strcmp(env, "auto") != 0 &&
          std::strcmp(env, "long") != 0 && std::strcmp(env, "short") != 0) {
        bad_setting(c,
                    "OPENREG_TEAM_SPIN='%s' is not 'auto' (the default: "
                    "the driver chooses as the devices run), 'long' or "
                    "'short' (how long the device's OpenMP threads spin "
                    "after a region)",
                    env);
        return c;
      }
    }
    if (const char* env = std::getenv("OPENREG_NIC_DMA")) {
      // orMemGetDmaPointer: whether the host's communication library reaches
      // device memory in place (GPUDirect RDMA) or must stage it.
      if (std::strcmp(env, "0") == 0) {
        c.nic_dma = false;
      } else if (std::strcmp(env, "1") != 0 && *env != '\0') {
        bad_setting(c,
                    "OPENREG_NIC_DMA='%s' is not '1' (the default: "
                    "collectives reach device memory in place, as "
                    "GPUDirect RDMA) or '0' (they stage it through pinned "
                    "host memory)",
                    env);
        return c;
      }
    }
    if (const char* env = std::getenv("OPENREG_KERNEL_TIMEOUT")) {
      // Seconds, a plain decimal number ("30", "0.5"); 0 or empty: off.
      char* end = nullptr;
      errno = 0;
      const double v = std::strtod(env, &end);
      const bool plain = (*env >= '0' && *env <= '9') || *env == '.';
      if (*env != '\0' && (!plain || errno != 0 || end == env || *end != '\0' ||
                           !(v >= 0) || v > 86400)) {
        bad_setting(c,
                    "OPENREG_KERNEL_TIMEOUT='%s' is not a number of "
                    "seconds in [0, 86400] (0: no watchdog)",
                    env);
        return c;
      }
      c.kernel_timeout_ns = static_cast<int64_t>(v * 1e9);
    }
    size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    c.capacity = (c.capacity + page - 1) / page * page;
    c.status = orSuccess;
    return c;
  }();
  return cfg;
}

struct InitState {
  orError_t status = orErrorInitializationError;
  Runtime* rt = nullptr;
};

// Creates the devices on first use. From here on a forked child may not use
// the runtime: the arenas are shared mappings and the stream workers do not
// exist in the child.
InitState& init_state() {
  static InitState* state = [] {
    auto* s = new InitState();  // leaked: worker threads outlive main()
    const Config& cfg = config();
    if (cfg.status != orSuccess) {
      s->status = cfg.status;
      return s;
    }
    auto* rt = new Runtime();
    rt->capacity = cfg.capacity;
    for (int i = 0; i < cfg.count; ++i) {
      std::unique_ptr<Device> dev;
      if (create_device(i, cfg.capacity, !cfg.process, &dev) != orSuccess) {
        return s;
      }
      rt->devices.push_back(std::move(dev));
    }
    if (cfg.process && proc::start(rt, kPinnedPoolBytes) != orSuccess) {
      return s;
    }
    install_fault_handler(rt);
    pthread_atfork(nullptr, nullptr, on_fork_child);
    s->rt = rt;
    s->status = orSuccess;
    return s;
  }();
  return *state;
}

}  // namespace

orError_t ensure_init() {
  if (g_forked.load(std::memory_order_relaxed)) {
    return orErrorInitializedInParent;
  }
  return init_state().status;
}

Runtime& runtime() { return *init_state().rt; }

bool process_driver() { return config().process; }

bool nic_dma() { return config().nic_dma; }

int64_t kernel_timeout_ns() { return config().kernel_timeout_ns; }

Device* device_at(int index) {
  auto& devs = runtime().devices;
  if (index < 0 || index >= static_cast<int>(devs.size())) {
    return nullptr;
  }
  return devs[static_cast<size_t>(index)].get();
}

Device* device_of(const void* p) {
  for (auto& dev : runtime().devices) {
    if (dev->contains(p)) {
      return dev.get();
    }
  }
  return nullptr;
}

bool find_device_range(const void* p, DeviceRange* out) {
  if (Device* dev = device_of(p)) {
    out->dev = dev;
    out->device_base = dev->device_base;
    out->kernel_base = dev->kernel_base;
    out->size = dev->capacity;
    out->imported = false;
    out->owner_pid = 0;
    return true;
  }
  return find_imported(p, out);
}

int current_device() { return t_current_device; }

orError_t lose_device(Device* dev, const char* reason) {
  if (dev->process != nullptr) {
    // The device process really ends (SIGKILL); its watcher marks the device
    // lost as for any other end.
    return proc::kill_device(dev, reason);
  }
  {
    std::lock_guard<std::mutex> lock(dev->lost_mutex);
    if (dev->lost.load(std::memory_order_relaxed)) {
      return orSuccess;  // lost once: the first reason stays
    }
    dev->lost_reason = reason;
  }
  // From now on the workers drop what they have not started, and every
  // call that uses the device fails.
  dev->lost.store(true, std::memory_order_release);
  return orSuccess;
}

}  // namespace openreg_rt

using namespace openreg_rt;

extern "C" {

orError_t orInit(void) { return ensure_init(); }

orError_t orGetInitErrorMessage(char* message, size_t size) {
  if (message == nullptr && size != 0) {
    return orErrorInvalidValue;
  }
  std::string text;
  if (!g_forked.load(std::memory_order_relaxed)) {
    const Config& c = config();
    text = c.status != orSuccess ? c.message
           : init_state().status != orSuccess
               ? (init_message().empty() ? std::string("the device processes "
                                                       "did not start (see "
                                                       "stderr)")
                                         : init_message())
               : std::string();
  }
  if (size != 0) {
    std::snprintf(message, size, "%s", text.c_str());
  }
  return orSuccess;
}

orError_t orRuntimeGetVersion(int* version) {
  if (version == nullptr) {
    return orErrorInvalidValue;
  }
  *version = 1000;
  return orSuccess;
}

orError_t orGetDeviceCount(int* count) {
  if (count == nullptr) {
    return orErrorInvalidValue;
  }
  *count = 0;
  if (g_forked.load(std::memory_order_relaxed)) {
    return orErrorInitializedInParent;
  }
  // Only reads the configuration: creates no device state.
  const Config& cfg = config();
  OR_RETURN_IF_ERROR(cfg.status);
  *count = cfg.count;
  return orSuccess;
}

orError_t orSetDevice(int device) {
  OR_RETURN_IF_ERROR(ensure_init());
  if (device_at(device) == nullptr) {
    return orErrorInvalidDevice;
  }
  t_current_device = device;
  return orSuccess;
}

orError_t orGetDevice(int* device) {
  if (device == nullptr) {
    return orErrorInvalidValue;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  *device = t_current_device;
  return orSuccess;
}

orError_t orGetDeviceProperties(orDeviceProp* prop, int device) {
  if (prop == nullptr) {
    return orErrorInvalidValue;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  Device* dev = device_at(device);
  if (dev == nullptr) {
    return orErrorInvalidDevice;
  }
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "openreg simulated device");
  prop->totalGlobalMem = dev->capacity;
  prop->major = 1;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  prop->pciBusID = device;
  prop->streamPriorityLeast = kPriorityLeast;
  prop->streamPriorityGreatest = kPriorityGreatest;
  return orSuccess;
}

orError_t orMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) {
    return orErrorInvalidValue;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  Device* dev = device_at(t_current_device);
  std::lock_guard<std::mutex> lock(dev->mem_mutex);
  *total_bytes = dev->capacity;
  *free_bytes = dev->capacity - dev->used;
  return orSuccess;
}

orError_t orDeviceSynchronize(void) {
  OR_RETURN_IF_ERROR(ensure_init());
  Device* dev = device_at(t_current_device);
  orError_t first = orSuccess;
  {
    // Holding the registry lock keeps every stream alive while we wait;
    // stream workers never take it, so this cannot deadlock. The set holds
    // the destroyed streams whose work has not finished too.
    std::lock_guard<std::mutex> lock(dev->streams_mutex);
    const StreamsLocked locked;  // the watchdog reads the streams meanwhile
    for (Stream* s : dev->streams) {
      orError_t err = s->synchronize(/*interruptible=*/true);
      if (err == orErrorInterrupted) {
        return err;
      }
      if (first == orSuccess) {
        first = err;
      }
    }
  }
  reap_destroyed_streams(dev);
  {
    std::lock_guard<std::mutex> lock(dev->streams_mutex);
    if (first == orSuccess) {
      first = dev->destroyed_error;
    }
    dev->destroyed_error = orSuccess;
  }
  return first != orSuccess ? first : check_not_lost(dev);
}

orError_t orDeviceGetLossReason(int device, char* reason, size_t size) {
  if (reason == nullptr && size != 0) {
    return orErrorInvalidValue;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  Device* dev = device_at(device);
  if (dev == nullptr) {
    return orErrorInvalidDevice;
  }
  if (size != 0) {
    reason[0] = '\0';
  }
  if (!dev->lost.load(std::memory_order_acquire)) {
    return orSuccess;
  }
  if (size != 0) {
    std::lock_guard<std::mutex> lock(dev->lost_mutex);
    std::snprintf(reason, size, "%s", dev->lost_reason.c_str());
  }
  return orErrorDeviceLost;
}

// [doc:device-loss]
orError_t orSimulateDeviceLoss(int device, const char* reason) {
  OR_RETURN_IF_ERROR(ensure_init());
  Device* dev = device_at(device);
  if (dev == nullptr) {
    return orErrorInvalidDevice;
  }
  return lose_device(dev, reason != nullptr ? reason : "lost (simulated)");
}
// [/doc:device-loss]

orError_t orDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least == nullptr || greatest == nullptr) {
    return orErrorInvalidValue;
  }
  *least = kPriorityLeast;
  *greatest = kPriorityGreatest;
  return orSuccess;
}

}  // extern "C"
