// Storages shared between processes (torch.multiprocessing), like CUDA IPC.
//
// Sender: share_storage() exports the caching-allocator segment that holds
// the storage (orIpcGetMemHandle covers the whole runtime allocation) and
// says where the storage lies inside it. The storage's DataPtr is wrapped
// once (its context becomes a SentBlock that owns the allocator's DataPtr),
// and every send takes one slot of a reference-count file: a memfd of int64
// slots that receivers reach through /proc/<pid>/fd/<fd>. When the sender's
// storage dies while a receiver still holds a send, the block is parked in
// a limbo instead of returning to the caching allocator, and released by
// ipc_collect() once every receiver has let go (or exited).
//
// Receiver: open_shared_storage() opens the handle (orIpcOpenMemHandle, so
// kernels reach the sender's bytes through this process's kernel view) and
// returns a non-resizable storage at the same bytes. When it dies, the
// release is queued on the current stream of its device (after any stream
// recorded with record_stream), so the sender never reuses the block while
// this process's queued kernels may still touch it.
//
// Slot values: 0 free or released, -1 sent and not yet received, > 0 the
// pid of the receiver holding it. Thread-safe.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <string>

namespace openreg {

// Everything a receiver needs, as the Python reducer pickles it.
struct IpcShare {
  c10::DeviceIndex device = 0;
  std::string handle;       // the orIpcMemHandle_t bytes of the segment
  size_t offset = 0;        // of the storage's data in the segment
  size_t nbytes = 0;        // of the storage
  int pid = 0;              // the sender
  int refs_fd = -1;         // the sender's reference-count file ...
  uint64_t refs_inode = 0;  // ... and its identity
  int64_t slot = 0;         // this send's slot in it
  uintptr_t address = 0;    // the data pointer in the sender
};

// Shares a storage of the caching allocator. Refuses storages the allocator
// did not make (from_blob, DLPack) and storages received from another
// process. The caller synchronizes the device first, so the receiver sees
// the sender's queued writes.
IpcShare share_storage(const c10::Storage& storage);

// The receiver's storage for a share (in the sending process itself: a
// storage over the same pointer, still keeping the block from reuse).
c10::Storage open_shared_storage(const IpcShare& share);

// Gives a send back without opening it (the receiver already has the
// storage, e.g. two tensors of one storage in one message).
void release_share(const IpcShare& share);

// Returns to the caching allocator the blocks whose storages died in this
// process and whose receivers have all released them or exited. Returns how
// many blocks it released. Never call it with an allocator lock held.
size_t ipc_collect();

// True if blocks wait in the limbo (cheap: lets the allocator try
// ipc_collect() before reporting out of memory).
bool ipc_blocks_pending() noexcept;

// For the caching allocator's recordStream: the allocator's own DataPtr
// behind a shared storage's, or nullptr if `ptr` is not a shared one.
const c10::DataPtr* ipc_original_data_ptr(const c10::DataPtr& ptr);
// Records a stream on a received storage (its release waits for it);
// false if `ptr` is not a received storage.
bool ipc_record_received_stream(const c10::DataPtr& ptr, c10::Stream stream);

}  // namespace openreg
