// Inter-process sharing of device memory (orIpc*), as CUDA's cudaIpc*.
//
// Export: a handle names the owner (pid), its arena file (fd number and
// inode, to notice a reused pid or fd), the allocation (offset, size) and a
// generation. The generation lives in the export table after the arena in
// the same memfd (Device comment in runtime_internal.h); orFree clears it,
// so a handle to freed memory is refused instead of aliasing whatever is
// allocated there next.
//
// Import: the peer reopens the owner's memfd through /proc/<pid>/fd/<fd>
// and maps the allocation's pages twice, as the owner maps its arena: a
// PROT_NONE device view (host access faults) and a read-write kernel view.
// Why /proc and not the alternatives: pidfd_getfd() needs ptrace-attach
// rights (refused under Yama ptrace_scope=1, the Ubuntu default, when the
// receiver is not the owner's ancestor, and by Docker's default seccomp
// profile); an SCM_RIGHTS socket needs a listener thread in every owner and
// a rendezvous. Opening /proc/<pid>/fd/N only needs ptrace-*read* rights,
// which a process has over every dumpable process of its own user, and it
// works for any number of peers without the owner doing anything.
//
// Imported ranges sit in a fixed table that address lookups (memcpy, kernel
// pointers, attributes, the fault handler) read without a lock: each slot is
// a seqlock, written under g_import_mutex.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "runtime_internal.h"

namespace openreg_rt {

namespace {

constexpr uint32_t kHandleMagic = 0x5049524f;  // "ORIP"
constexpr uint16_t kHandleVersion = 1;

// The bytes of an orIpcMemHandle_t.
struct HandleData {
  uint32_t magic;
  uint16_t version;
  uint16_t device;
  int32_t pid;
  int32_t fd;
  uint64_t inode;
  uint64_t capacity;  // where the export table starts in the owner's file
  uint64_t offset;    // of the allocation in the arena
  uint64_t size;
  uint64_t generation;
};
static_assert(sizeof(HandleData) <= OR_IPC_HANDLE_SIZE,
              "HandleData must fit in orIpcMemHandle_t");

std::atomic<uint64_t> g_next_generation{1};

size_t page_size() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

size_t table_index(size_t offset) { return offset / kAllocAlignment; }

constexpr int kMaxImports = 1024;

// One imported allocation. The fields lookups read are atomics under a
// seqlock (`seq` is odd while a writer changes them); the rest is guarded
// by g_import_mutex.
struct ImportSlot {
  std::atomic<uint32_t> seq{0};
  std::atomic<char*> device_base{nullptr};  // nullptr: slot unused
  std::atomic<char*> kernel_base{nullptr};
  std::atomic<char*> dma_base{nullptr};
  std::atomic<size_t> size{0};
  std::atomic<int> device{0};
  std::atomic<int> pid{0};

  // Guarded by g_import_mutex.
  int refs = 0;
  char* map_device = nullptr;  // the page-aligned mappings
  char* map_kernel = nullptr;
  char* map_dma = nullptr;
  size_t map_len = 0;
  uint64_t inode = 0;
  uint64_t offset = 0;
  uint64_t generation = 0;
};

std::mutex g_import_mutex;  // serializes writers of g_imports
ImportSlot g_imports[kMaxImports];
std::atomic<int> g_import_end{0};  // slots at or past it were never used

// The page-aligned mappings of one import; a view nullptr when absent.
struct ImportViews {
  char* device = nullptr;
  char* kernel = nullptr;
  char* dma = nullptr;
};

void publish(ImportSlot& slot, char* device_base, char* kernel_base,
             char* dma_base, size_t size, int device, int pid) {
  slot.seq.fetch_add(1, std::memory_order_relaxed);  // odd: writing
  std::atomic_thread_fence(std::memory_order_release);
  slot.kernel_base.store(kernel_base, std::memory_order_relaxed);
  slot.dma_base.store(dma_base, std::memory_order_relaxed);
  slot.size.store(size, std::memory_order_relaxed);
  slot.device.store(device, std::memory_order_relaxed);
  slot.pid.store(pid, std::memory_order_relaxed);
  slot.device_base.store(device_base, std::memory_order_relaxed);
  slot.seq.fetch_add(1, std::memory_order_release);  // even: stable
}

// Maps [begin, begin + len) of fd as a device view and a kernel view. With
// the process driver only the device view: the device processes map the
// range read-write themselves (proc::map_import), by the path of `fd`; and,
// unless OPENREG_NIC_DMA=0, the communication library's view, as the
// process's own arenas have one (orMemGetDmaPointer).
orError_t map_views(int fd, size_t begin, size_t len, ImportViews* views,
                    int slot) {
  auto map = [&](int prot) -> char* {
    void* v = mmap(nullptr, len, prot, MAP_SHARED | MAP_NORESERVE, fd,
                   static_cast<off_t>(begin));
    return v == MAP_FAILED ? nullptr : static_cast<char*>(v);
  };
  char* d = map(PROT_NONE);
  if (d == nullptr) {
    return orErrorMapBufferObjectFailed;
  }
  if (process_driver()) {
    const std::string path =
        "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(fd);
    const orError_t err = proc::map_import(slot, path.c_str(), begin, len,
                                           reinterpret_cast<uint64_t>(d));
    if (err != orSuccess) {
      munmap(d, len);
      return err;
    }
    // Without the view, collectives stage the memory (not an error).
    *views = {d, nullptr, nic_dma() ? map(PROT_READ | PROT_WRITE) : nullptr};
    return orSuccess;
  }
  char* k = map(PROT_READ | PROT_WRITE);
  if (k == nullptr) {
    munmap(d, len);
    return orErrorMapBufferObjectFailed;
  }
  *views = {d, k, nullptr};
  return orSuccess;
}

// [doc:ipc-open-owner]
// Opens the owner's arena file and checks that the handle still describes a
// live export of it. On success *fd_out is an open descriptor.
orError_t open_owner_file(const HandleData& h, int* fd_out) {
  const std::string path =
      "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    // No such process or descriptor: the owner exited (or closed it).
    return errno == ENOENT || errno == ESRCH ? orErrorInvalidResourceHandle
                                             : orErrorMapBufferObjectFailed;
  }
  struct stat st;
  uint64_t generation = 0;
  const uint64_t entry = h.capacity + table_index(h.offset) * sizeof(uint64_t);
  const bool same_file =
      fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_ino) == h.inode &&
      entry + sizeof(uint64_t) <= static_cast<uint64_t>(st.st_size);
  const bool exported =
      same_file &&
      pread(fd, &generation, sizeof(generation), static_cast<off_t>(entry)) ==
          static_cast<ssize_t>(sizeof(generation)) &&
      generation == h.generation;
  if (!exported) {
    close(fd);
    return orErrorInvalidResourceHandle;
  }
  *fd_out = fd;
  return orSuccess;
}
// [/doc:ipc-open-owner]

}  // namespace

size_t export_table_bytes(size_t capacity) {
  const size_t bytes = capacity / kAllocAlignment * sizeof(uint64_t);
  return (bytes + page_size() - 1) / page_size() * page_size();
}

void forget_export(Device& dev, size_t offset) {
  if (dev.export_table != nullptr) {
    dev.export_table[table_index(offset)].store(0, std::memory_order_release);
  }
}

bool find_imported(const void* p, DeviceRange* out) {
  const int end = g_import_end.load(std::memory_order_acquire);
  const auto* c = static_cast<const char*>(p);
  for (int i = 0; i < end; ++i) {
    ImportSlot& slot = g_imports[i];
    // A few retries: a writer holds a slot odd only for a handful of stores.
    for (int attempt = 0; attempt < 64; ++attempt) {
      const uint32_t before = slot.seq.load(std::memory_order_acquire);
      if ((before & 1) != 0) {
        continue;
      }
      char* base = slot.device_base.load(std::memory_order_relaxed);
      const size_t size = slot.size.load(std::memory_order_relaxed);
      char* kernel = slot.kernel_base.load(std::memory_order_relaxed);
      char* dma = slot.dma_base.load(std::memory_order_relaxed);
      const int device = slot.device.load(std::memory_order_relaxed);
      const int pid = slot.pid.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (slot.seq.load(std::memory_order_relaxed) != before) {
        continue;
      }
      if (base == nullptr || c < base || c >= base + size) {
        break;
      }
      out->dev = runtime().devices[static_cast<size_t>(device)].get();
      out->device_base = base;
      out->kernel_base = kernel;
      out->dma_base = dma;
      out->size = size;
      out->imported = true;
      out->owner_pid = pid;
      return true;
    }
  }
  return false;
}

}  // namespace openreg_rt

using namespace openreg_rt;

extern "C" {

orError_t orIpcGetMemHandle(orIpcMemHandle_t* handle, void* devPtr) {
  if (handle == nullptr) {
    return orErrorInvalidValue;
  }
  std::memset(handle, 0, sizeof(*handle));
  OR_RETURN_IF_ERROR(ensure_init());
  Device* dev = device_of(devPtr);  // imported memory is not in an arena
  if (dev == nullptr) {
    return orErrorInvalidDevicePointer;
  }
  const size_t offset =
      static_cast<size_t>(static_cast<char*>(devPtr) - dev->device_base);
  std::lock_guard<std::mutex> lock(dev->mem_mutex);
  auto it = dev->live.find(offset);
  if (it == dev->live.end()) {
    return orErrorInvalidDevicePointer;
  }
  if (dev->export_table == nullptr) {
    const size_t bytes = export_table_bytes(dev->capacity);
    void* table =
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
             dev->fd, static_cast<off_t>(dev->capacity));
    if (table == MAP_FAILED) {
      return orErrorMapBufferObjectFailed;
    }
    dev->export_table = static_cast<std::atomic<uint64_t>*>(table);
  }
  std::atomic<uint64_t>& entry = dev->export_table[table_index(offset)];
  uint64_t generation = entry.load(std::memory_order_relaxed);
  if (generation == 0) {
    generation = g_next_generation.fetch_add(1, std::memory_order_relaxed);
    entry.store(generation, std::memory_order_release);
  }
  HandleData h{};
  h.magic = kHandleMagic;
  h.version = kHandleVersion;
  h.device = static_cast<uint16_t>(dev->index);
  h.pid = static_cast<int32_t>(getpid());
  h.fd = dev->fd;
  h.inode = dev->inode;
  h.capacity = dev->capacity;
  h.offset = offset;
  h.size = it->second;
  h.generation = generation;
  std::memcpy(handle->reserved, &h, sizeof(h));
  return orSuccess;
}

orError_t orIpcOpenMemHandle(void** devPtr, orIpcMemHandle_t handle,
                             unsigned int flags) {
  if (devPtr == nullptr) {
    return orErrorInvalidValue;
  }
  *devPtr = nullptr;
  if ((flags & ~static_cast<unsigned int>(orIpcMemLazyEnablePeerAccess)) != 0) {
    return orErrorInvalidValue;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  HandleData h;
  std::memcpy(&h, handle.reserved, sizeof(h));
  if (h.magic != kHandleMagic || h.version != kHandleVersion || h.pid <= 0 ||
      h.fd < 0 || h.size == 0 || h.offset % kAllocAlignment != 0 ||
      h.generation == 0 || h.offset > h.capacity ||
      h.size > h.capacity - h.offset) {
    return orErrorInvalidValue;
  }
  if (h.pid == static_cast<int32_t>(getpid())) {
    return orErrorIpcSameProcess;
  }
  if (device_at(h.device) == nullptr) {
    return orErrorInvalidDevice;
  }
  std::lock_guard<std::mutex> lock(g_import_mutex);
  const int end = g_import_end.load(std::memory_order_relaxed);
  ImportSlot* free_slot = nullptr;
  for (int i = 0; i < kMaxImports; ++i) {
    ImportSlot& slot = g_imports[i];
    if (slot.refs == 0) {
      if (free_slot == nullptr) {
        free_slot = &slot;
      }
      if (i >= end) {
        break;  // nothing was ever open past this slot
      }
      continue;
    }
    if (slot.pid.load(std::memory_order_relaxed) == h.pid &&
        slot.inode == h.inode && slot.offset == h.offset &&
        slot.generation == h.generation) {
      ++slot.refs;  // already open: same pointer, one more open
      *devPtr = slot.device_base.load(std::memory_order_relaxed);
      return orSuccess;
    }
  }
  if (free_slot == nullptr) {
    return orErrorMapBufferObjectFailed;
  }
  int fd = -1;
  OR_RETURN_IF_ERROR(open_owner_file(h, &fd));
  // mmap needs page-aligned offsets; allocations are 512-byte aligned.
  const size_t begin = h.offset / page_size() * page_size();
  const size_t end_byte =
      (h.offset + h.size + page_size() - 1) / page_size() * page_size();
  ImportViews views;
  const orError_t err = map_views(fd, begin, end_byte - begin, &views,
                                  static_cast<int>(free_slot - g_imports));
  close(fd);  // the mappings keep the file alive
  OR_RETURN_IF_ERROR(err);
  free_slot->refs = 1;
  free_slot->map_device = views.device;
  free_slot->map_kernel = views.kernel;
  free_slot->map_dma = views.dma;
  free_slot->map_len = end_byte - begin;
  free_slot->inode = h.inode;
  free_slot->offset = h.offset;
  free_slot->generation = h.generation;
  const size_t skew = h.offset - begin;
  auto at_skew = [skew](char* view) {
    return view == nullptr ? nullptr : view + skew;
  };
  publish(*free_slot, views.device + skew, at_skew(views.kernel),
          at_skew(views.dma), h.size, h.device, h.pid);
  const int index = static_cast<int>(free_slot - g_imports);
  if (index >= end) {
    g_import_end.store(index + 1, std::memory_order_release);
  }
  *devPtr = views.device + skew;
  return orSuccess;
}

orError_t orIpcCloseMemHandle(void* devPtr) {
  if (devPtr == nullptr) {
    return orErrorInvalidValue;
  }
  OR_RETURN_IF_ERROR(ensure_init());
  std::lock_guard<std::mutex> lock(g_import_mutex);
  const int end = g_import_end.load(std::memory_order_relaxed);
  for (int i = 0; i < end; ++i) {
    ImportSlot& slot = g_imports[i];
    if (slot.refs == 0 ||
        slot.device_base.load(std::memory_order_relaxed) != devPtr) {
      continue;
    }
    if (--slot.refs > 0) {
      return orSuccess;
    }
    // Unpublish before unmapping, so no lookup translates into a hole.
    publish(slot, nullptr, nullptr, nullptr, 0, 0, 0);
    if (process_driver()) {
      proc::unmap_import(i);
    }
    munmap(slot.map_device, slot.map_len);
    for (char* view : {slot.map_kernel, slot.map_dma}) {
      if (view != nullptr) {
        munmap(view, slot.map_len);
      }
    }
    slot.map_device = nullptr;
    slot.map_kernel = nullptr;
    slot.map_dma = nullptr;
    return orSuccess;
  }
  return orErrorInvalidDevicePointer;
}

}  // extern "C"
