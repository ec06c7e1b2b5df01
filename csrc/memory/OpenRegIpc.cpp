// Storages shared between processes: see OpenRegIpc.h for the protocol.
#include "memory/OpenRegIpc.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegKernelTask.h"
#include "core/OpenRegStream.h"
#include "memory/OpenRegAllocator.h"

namespace openreg {

namespace {

constexpr int64_t kReleased = 0;
constexpr int64_t kInFlight = -1;

// A file of reference-count slots, mapped read-write. The sender's own file
// is created once; a receiver maps each sender's file while it holds
// storages from it.
class RefFile {
 public:
  static constexpr size_t kSlots = size_t{1} << 16;
  static constexpr size_t kBytes = kSlots * sizeof(int64_t);

  RefFile(int pid, int fd, uint64_t inode, void* map)
      : pid_(pid), fd_(fd), inode_(inode), slots_(map) {}
  ~RefFile() {
    if (pid_ != getpid()) {
      munmap(slots_, kBytes);
    }
  }
  RefFile(const RefFile&) = delete;
  RefFile& operator=(const RefFile&) = delete;

  std::atomic<int64_t>& slot(size_t i) const {
    return static_cast<std::atomic<int64_t>*>(slots_)[i];
  }
  int fd() const { return fd_; }
  uint64_t inode() const { return inode_; }

 private:
  const int pid_;
  const int fd_;
  const uint64_t inode_;
  void* const slots_;
};

void* map_slots(int fd) {
  void* map =
      mmap(nullptr, RefFile::kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return map == MAP_FAILED ? nullptr : map;
}

// This process's file (never unmapped or closed: receivers reach it by its
// descriptor until the process exits).
std::shared_ptr<RefFile> local_file() {
  static const std::shared_ptr<RefFile> file = [] {
    const int fd = memfd_create("openreg-ipc-refcounts", MFD_CLOEXEC);
    TORCH_CHECK(fd >= 0,
                "openreg IPC: memfd_create failed: ", std::strerror(errno));
    struct stat st;
    void* map = nullptr;
    if (ftruncate(fd, static_cast<off_t>(RefFile::kBytes)) != 0 ||
        fstat(fd, &st) != 0 || (map = map_slots(fd)) == nullptr) {
      const int err = errno;
      close(fd);
      TORCH_CHECK(false,
                  "openreg IPC: cannot create the reference-count "
                  "file: ",
                  std::strerror(err));
    }
    return std::make_shared<RefFile>(getpid(), fd,
                                     static_cast<uint64_t>(st.st_ino), map);
  }();
  return file;
}

// Another process's file, shared by every storage received from it.
std::shared_ptr<RefFile> peer_file(int pid, int fd, uint64_t inode) {
  static std::mutex mutex;  // guards cache
  static std::map<std::tuple<int, int, uint64_t>, std::weak_ptr<RefFile>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto& entry = cache[{pid, fd, inode}];
  if (auto file = entry.lock()) {
    return file;
  }
  const std::string path =
      "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int peer_fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  struct stat st;
  const bool same = peer_fd >= 0 && fstat(peer_fd, &st) == 0 &&
                    static_cast<uint64_t>(st.st_ino) == inode;
  const int err = errno;
  void* map = same ? map_slots(peer_fd) : nullptr;
  if (peer_fd >= 0) {
    close(peer_fd);  // the mapping keeps the file
  }
  TORCH_CHECK(peer_fd >= 0 || err != ENOENT,
              "openreg IPC: the sending process ", pid,
              " exited before this process received the tensor; keep the "
              "sender alive until its receivers have their tensors");
  TORCH_CHECK(peer_fd >= 0, "openreg IPC: cannot open ", path, " (",
              std::strerror(err),
              "): sender and receiver must run as the same user in the same "
              "PID namespace");
  TORCH_CHECK(same, "openreg IPC: process ", pid,
              " is not the process that sent the tensor (it exited and its "
              "pid was reused)");
  TORCH_CHECK(map != nullptr,
              "openreg IPC: cannot map the reference counts "
              "of process ",
              pid, ": ", std::strerror(errno));
  auto file = std::make_shared<RefFile>(pid, fd, inode, map);
  entry = file;
  return file;
}

bool process_alive(int64_t pid) {
  return kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

// A send is over when its receiver released it or exited.
bool send_done(int64_t value) {
  return value == kReleased || (value > 0 && !process_alive(value));
}

// ---------------------------------------------------------------------------
// Sender

// The context of a shared storage's DataPtr in the sender.
struct SentBlock {
  c10::DataPtr original;      // the caching allocator's DataPtr
  std::vector<size_t> slots;  // sends not known to be over (under mutex)
};

void sent_deleter(void* ctx);

class Sender {
 public:
  // Takes a slot for one more send of `block`.
  size_t acquire(SentBlock* block) {
    const auto file = local_file();
    for (int attempt = 0; attempt < 2; ++attempt) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        prune(*file, block);
        if (next_unused_ < RefFile::kSlots || !free_.empty()) {
          size_t slot = next_unused_;
          if (free_.empty()) {
            ++next_unused_;
          } else {
            slot = free_.back();
            free_.pop_back();
          }
          file->slot(slot).store(kInFlight, std::memory_order_release);
          block->slots.push_back(slot);
          return slot;
        }
      }
      ipc_collect();  // may free slots of dead storages
    }
    TORCH_CHECK(false, "openreg IPC: ", RefFile::kSlots,
                " tensors sent to other processes are still held there; "
                "release them in the receivers (then "
                "torch.openreg.ipc_collect()) before sending more");
  }

  // [doc:ipc-retire]
  // The sender's storage died: release the block now, or park it.
  void retire(SentBlock* block) {
    std::vector<SentBlock*> done;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      limbo_.push_back(block);
      collect_locked(&done);
    }
    for (SentBlock* b : done) {
      delete b;  // returns the block to the caching allocator
    }
  }
  // [/doc:ipc-retire]

  size_t collect() {
    std::vector<SentBlock*> done;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      collect_locked(&done);
    }
    for (SentBlock* b : done) {
      delete b;
    }
    return done.size();
  }

  bool pending() const noexcept {
    return pending_.load(std::memory_order_relaxed) != 0;
  }

 private:
  // Frees the slots of `block` whose sends are over.
  void prune(const RefFile& file, SentBlock* block) {
    auto& slots = block->slots;
    for (size_t i = 0; i < slots.size();) {
      if (send_done(file.slot(slots[i]).load(std::memory_order_acquire))) {
        free_.push_back(slots[i]);
        slots[i] = slots.back();
        slots.pop_back();
      } else {
        ++i;
      }
    }
  }

  void collect_locked(std::vector<SentBlock*>* done) {
    if (limbo_.empty()) {
      return;
    }
    const auto file = local_file();
    for (size_t i = 0; i < limbo_.size();) {
      prune(*file, limbo_[i]);
      if (limbo_[i]->slots.empty()) {
        done->push_back(limbo_[i]);
        limbo_[i] = limbo_.back();
        limbo_.pop_back();
      } else {
        ++i;
      }
    }
    pending_.store(limbo_.size(), std::memory_order_relaxed);
  }

  std::mutex mutex_;  // guards everything below but pending_
  size_t next_unused_ = 0;
  std::vector<size_t> free_;
  std::vector<SentBlock*> limbo_;
  std::atomic<size_t> pending_{0};
};

Sender& sender() {
  static Sender* s = new Sender();  // leaked: deleters may run at exit
  return *s;
}

void sent_deleter(void* ctx) {
  auto* block = static_cast<SentBlock*>(ctx);
  if (is_in_bad_fork()) {
    return;  // the child must not touch the parent's blocks or counts
  }
  try {
    sender().retire(block);
  } catch (const std::exception& e) {
    TORCH_WARN("openreg IPC: releasing a shared block failed: ", e.what());
  }
}

// ---------------------------------------------------------------------------
// Receiver

// The context of a received storage's DataPtr.
struct ReceivedBlock {
  void* base = nullptr;  // from orIpcOpenMemHandle (nullptr: same process)
  std::shared_ptr<RefFile> refs;
  size_t slot = 0;
  c10::DeviceIndex device = 0;
  int sender = 0;
  std::mutex mutex;                    // guards streams
  std::vector<c10::StreamId> streams;  // recorded with record_stream
};

void release_now(ReceivedBlock* block) noexcept {
  if (block->base != nullptr) {
    OPENREG_CHECK_WARN(orIpcCloseMemHandle(block->base));
  }
  block->refs->slot(block->slot).store(kReleased, std::memory_order_release);
  delete block;
}

int release_kernel(void* ctx) {
  release_now(static_cast<ReceivedBlock*>(ctx));
  return 0;
}

// [doc:ipc-release]
// Queues the release behind this process's work on the current stream and
// on every recorded stream.
void received_deleter(void* ctx) {
  auto* block = static_cast<ReceivedBlock*>(ctx);
  if (is_in_bad_fork()) {
    return;
  }
  try {
    ScopedDevice guard(block->device);
    const orStream_t stream = getCurrentStream(block->device).native();
    for (c10::StreamId id : block->streams) {
      const c10::Stream other(
          c10::Stream::UNSAFE,
          c10::Device(c10::DeviceType::PrivateUse1, block->device), id);
      orEvent_t event = nullptr;
      OPENREG_CHECK(orEventCreateWithFlags(&event, orEventDisableTiming));
      OPENREG_CHECK(orEventRecord(event, native_stream(other)));
      OPENREG_CHECK(orStreamWaitEvent(stream, event));
      OPENREG_CHECK(orEventDestroy(event));
    }
    if (!host_kernels_supported()) {
      // The driver runs no host code in stream order (each device is a
      // process of its own): the release runs on the host once the work
      // queued so far has finished, found by a later launch or
      // synchronization. The deleter does not wait.
      orEvent_t done = nullptr;
      OPENREG_CHECK(orEventCreateWithFlags(&done, orEventDisableTiming));
      const orError_t err = orEventRecord(done, stream);
      if (err != orSuccess) {
        (void)orEventDestroy(done);
        OPENREG_CHECK(err);
      }
      run_after_event(done, [block] { release_now(block); });
      return;
    }
    orLaunchAttributes attrs{};
    attrs.hostThreads = 1;  // a bookkeeping kernel: no thread pool
    OPENREG_CHECK(orLaunchKernelEx(stream, &release_kernel, block, &attrs));
  } catch (const std::exception& e) {
    TORCH_WARN(
        "openreg IPC: could not queue the release of a received "
        "tensor (released now): ",
        e.what());
    release_now(block);
  }
}
// [/doc:ipc-release]

// Takes the send's slot for this process.
void claim(const RefFile& refs, const IpcShare& share) {
  TORCH_CHECK(
      share.slot >= 0 && static_cast<size_t>(share.slot) < RefFile::kSlots,
      "openreg IPC: bad reference-count slot ", share.slot);
  int64_t expected = kInFlight;
  const bool claimed =
      refs.slot(static_cast<size_t>(share.slot))
          .compare_exchange_strong(expected, static_cast<int64_t>(getpid()),
                                   std::memory_order_acq_rel);
  TORCH_CHECK(claimed, "openreg IPC: this shared tensor was already received",
              expected > 0 ? " by process " + std::to_string(expected) : "",
              "; each put() of a tensor can be received once");
}

std::string ipc_error(orError_t err, const IpcShare& share) {
  switch (err) {
    case orErrorInvalidResourceHandle:
      return "its memory is gone: the sending process " +
             std::to_string(share.pid) +
             " exited or freed it before this process received the tensor";
    case orErrorMapBufferObjectFailed:
      return "the memory of process " + std::to_string(share.pid) +
             " cannot be mapped here (sender and receiver must run as the "
             "same user in the same PID namespace)";
    default:
      return format_error(err, "orIpcOpenMemHandle");
  }
}

}  // namespace

IpcShare share_storage(const c10::Storage& storage) {
  TORCH_CHECK(storage.device_type() == c10::DeviceType::PrivateUse1,
              "share_storage expects an openreg storage, got one on ",
              storage.device());
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  const c10::DataPtr& data = impl->data_ptr();
  TORCH_CHECK(data.get() != nullptr, "share_storage: empty storage");
  TORCH_CHECK(data.get_deleter() != &received_deleter,
              "openreg IPC: cannot send a tensor received from another "
              "process (its memory belongs to process ",
              static_cast<ReceivedBlock*>(data.get_context())->sender,
              "); send a clone() of it");
  // [doc:ipc-wrap]
  SentBlock* block = nullptr;
  if (data.get_deleter() == &sent_deleter) {
    block = static_cast<SentBlock*>(data.get_context());
  } else {
    TORCH_CHECK(data.get_deleter() == device_allocator()->raw_deleter(),
                "openreg IPC: this tensor's memory was not allocated by "
                "openreg's caching allocator (torch.openreg.from_blob, "
                "DLPack, ...), so no process can keep it alive for another; "
                "send a clone() of it");
    auto owned = std::make_unique<SentBlock>();
    c10::DataPtr wrapped(data.get(), owned.get(), &sent_deleter, data.device());
    owned->original = impl->set_data_ptr(std::move(wrapped));
    block = owned.release();
  }
  // [/doc:ipc-wrap]
  void* ptr = impl->data_ptr().get();
  orPointerAttributes attr;
  OPENREG_CHECK(orPointerGetAttributes(&attr, ptr));
  orIpcMemHandle_t handle;
  OPENREG_CHECK(orIpcGetMemHandle(&handle, attr.base));
  IpcShare share;
  share.device = static_cast<c10::DeviceIndex>(attr.device);
  share.handle.assign(handle.reserved, sizeof(handle.reserved));
  share.offset = static_cast<size_t>(static_cast<char*>(ptr) -
                                     static_cast<char*>(attr.base));
  share.nbytes = impl->nbytes();
  share.pid = static_cast<int>(getpid());
  const auto file = local_file();
  share.refs_fd = file->fd();
  share.refs_inode = file->inode();
  share.slot = static_cast<int64_t>(sender().acquire(block));
  share.address = reinterpret_cast<uintptr_t>(ptr);
  return share;
}

c10::Storage open_shared_storage(const IpcShare& share) {
  lazy_init();
  const bool local = share.pid == static_cast<int>(getpid());
  auto refs = local ? local_file()
                    : peer_file(share.pid, share.refs_fd, share.refs_inode);
  TORCH_CHECK(refs->fd() == share.refs_fd && refs->inode() == share.refs_inode,
              "openreg IPC: the reference counts of this tensor belong to a "
              "process that no longer exists");
  claim(*refs, share);
  std::atomic<int64_t>& slot = refs->slot(static_cast<size_t>(share.slot));
  // From here on a failure gives the send back, so the sender does not keep
  // the block for a receiver that never got it.
  void* base = nullptr;
  char* data = reinterpret_cast<char*>(share.address);  // same process
  try {
    check_device_index(share.device);
    TORCH_CHECK(share.handle.size() == OR_IPC_HANDLE_SIZE,
                "openreg IPC: a handle has ", OR_IPC_HANDLE_SIZE,
                " bytes, got ", share.handle.size());
    if (!local) {
      orIpcMemHandle_t handle;
      std::memcpy(handle.reserved, share.handle.data(),
                  sizeof(handle.reserved));
      const orError_t err =
          orIpcOpenMemHandle(&base, handle, orIpcMemLazyEnablePeerAccess);
      TORCH_CHECK(err == orSuccess,
                  "openreg IPC: cannot open the shared tensor: ",
                  ipc_error(err, share));
      orPointerAttributes attr;
      OPENREG_CHECK(orPointerGetAttributes(&attr, base));
      TORCH_CHECK(
          share.offset <= attr.size && share.nbytes <= attr.size - share.offset,
          "openreg IPC: the shared storage (", share.nbytes,
          " bytes at offset ", share.offset, ") does not fit its allocation (",
          attr.size, " bytes)");
      data = static_cast<char*>(base) + share.offset;
    }
  } catch (...) {
    if (base != nullptr) {
      OPENREG_CHECK_WARN(orIpcCloseMemHandle(base));
    }
    slot.store(kReleased, std::memory_order_release);
    throw;
  }
  auto block = std::make_unique<ReceivedBlock>();
  block->base = base;
  block->refs = std::move(refs);
  block->slot = static_cast<size_t>(share.slot);
  block->device = share.device;
  block->sender = share.pid;
  c10::DataPtr ptr(data, block.get(), &received_deleter,
                   c10::Device(c10::DeviceType::PrivateUse1, share.device));
  block.release();  // owned by the DataPtr from here on
  return c10::Storage(c10::Storage::use_byte_size_t(), share.nbytes,
                      std::move(ptr), /*allocator=*/nullptr,
                      /*resizable=*/false);
}

void release_share(const IpcShare& share) {
  const bool local = share.pid == static_cast<int>(getpid());
  auto refs = local ? local_file()
                    : peer_file(share.pid, share.refs_fd, share.refs_inode);
  claim(*refs, share);
  refs->slot(static_cast<size_t>(share.slot))
      .store(kReleased, std::memory_order_release);
}

size_t ipc_collect() { return sender().collect(); }

bool ipc_blocks_pending() noexcept { return sender().pending(); }

const c10::DataPtr* ipc_original_data_ptr(const c10::DataPtr& ptr) {
  if (ptr.get_deleter() != &sent_deleter) {
    return nullptr;
  }
  return &static_cast<SentBlock*>(ptr.get_context())->original;
}

bool ipc_record_received_stream(const c10::DataPtr& ptr, c10::Stream stream) {
  if (ptr.get_deleter() != &received_deleter) {
    return false;
  }
  auto* block = static_cast<ReceivedBlock*>(ptr.get_context());
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1 &&
                  stream.device_index() == block->device,
              "recordStream: the tensor is on openreg:",
              static_cast<int>(block->device), " but the stream is on ",
              stream.device());
  std::lock_guard<std::mutex> lock(block->mutex);
  if (std::find(block->streams.begin(), block->streams.end(), stream.id()) ==
      block->streams.end()) {
    block->streams.push_back(stream.id());
  }
  return true;
}

}  // namespace openreg
