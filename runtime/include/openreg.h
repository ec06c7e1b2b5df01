/*
 * openreg.h - the driver API of the openreg simulated accelerator.
 *
 * This is the only header the PyTorch layer (csrc/) may include from the
 * runtime. It is a plain C ABI in the style of a GPU driver: opaque handles,
 * every call returns an orError_t, orGetErrorString() explains a code.
 *
 * A vendor porting openreg to real hardware replaces the library behind this
 * header and keeps everything above it.
 *
 * Simulated hardware
 * ------------------
 * - OPENREG_DEVICE_COUNT devices (default 2, 1..16).
 * - Each device owns OPENREG_DEVICE_MEMORY bytes of memory (default 4 GiB,
 *   suffixes K/M/G/T accepted, 1M..1T). Physical pages are used only once
 *   touched.
 * - Device memory is not accessible from host code: dereferencing a device
 *   pointer on the host faults, and the runtime prints which device and
 *   offset were touched before the process dies. Code that runs *as the
 *   device* (kernels) reaches the same bytes through orGetKernelPointer().
 * - Streams are in-order queues, each drained by its own worker thread
 *   (OPENREG_DRIVER=process, the default: in one process per device).
 *
 * Thread-safety: every function may be called from any thread. The current
 * device is thread-local, as in CUDA.
 *
 * Fork: after the runtime has been initialised, a forked child cannot use it;
 * every call in the child returns orErrorInitializedInParent.
 */
#ifndef OPENREG_H_
#define OPENREG_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define OPENREG_API __attribute__((visibility("default")))
#else
#define OPENREG_API
#endif

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

/* Every function returns one of these. The numeric values are part of the
 * ABI and never change. */
typedef enum orError_t {
  orSuccess = 0,
  /* An argument is null, zero where it must not be, or out of range. */
  orErrorInvalidValue = 1,
  /* The device has not enough free memory for the request. */
  orErrorMemoryAllocation = 2,
  /* The runtime could not create its devices (bad environment variable,
   * failed mmap, ...). */
  orErrorInitializationError = 3,
  /* A device ordinal is not in [0, device count). */
  orErrorInvalidDevice = 4,
  /* A pointer is not (the start of) a live device allocation where one is
   * required, or a free was repeated. */
  orErrorInvalidDevicePointer = 5,
  /* The memcpy kind does not match where the pointers live. */
  orErrorInvalidMemcpyDirection = 6,
  /* Asynchronous work has not finished yet (from the query functions). */
  orErrorNotReady = 7,
  /* A stream or event handle is null where it must not be, destroyed, or
   * belongs to another device than the operation requires; or an IPC memory
   * handle is stale: its allocation was freed, or its owner process exited
   * (see orIpcOpenMemHandle). */
  orErrorInvalidResourceHandle = 8,
  /* A kernel launched on a stream reported a failure. */
  orErrorLaunchFailure = 9,
  /* The runtime was initialised in a parent process and this is a forked
   * child; use the spawn start method instead. */
  orErrorInitializedInParent = 10,
  /* Elapsed time was requested from an event created with
   * orEventDisableTiming, or from an event that was never recorded. */
  orErrorInvalidEventTiming = 11,
  /* The pointer is not a host allocation made by orMallocHost. */
  orErrorInvalidHostPointer = 12,
  /* orIpcOpenMemHandle was given a handle exported by the calling process
   * (use the device pointer itself; CUDA calls this an invalid context). */
  orErrorIpcSameProcess = 13,
  /* The memory of another process could not be mapped: its
   * /proc/<pid>/fd entry is not accessible (another user or PID namespace,
   * a non-dumpable owner), mmap failed, or too many handles are open. */
  orErrorMapBufferObjectFailed = 14,
  /* The device is lost: it stopped working (a hardware fault; in the
   * simulator orSimulateDeviceLoss). Every later call that uses it returns
   * this code, and its queued work is dropped. orDeviceGetLossReason says
   * why. Other devices are not affected. */
  orErrorDeviceLost = 15,
  /* orModuleLoad could not load the kernel library: the file is missing or
   * is not a loadable shared object for this machine. */
  orErrorFileNotFound = 16,
  /* orModuleGetFunction: the library has no kernel of that name. */
  orErrorSymbolNotFound = 17,
  /* The driver does not implement this function or this argument. */
  orErrorNotSupported = 18,
  /* A host wait ended early because the host wait check asked for it
   * (orSetHostWaitCheck). The awaited work goes on: nothing was reported
   * or cleared, and a later synchronization waits for it again. */
  orErrorInterrupted = 19,
} orError_t;

/* A static, human readable description of an error code ("out of memory").
 * Never returns NULL; unknown codes give "unrecognized error code". */
OPENREG_API const char* orGetErrorString(orError_t error);
/* The enumerator's name ("orErrorMemoryAllocation"). Never returns NULL. */
OPENREG_API const char* orGetErrorName(orError_t error);

/* Creates the simulated devices now; otherwise the first call that needs
 * them does. Idempotent. Fails with orErrorInitializationError on a bad
 * environment and orErrorInitializedInParent in a forked child. */
OPENREG_API orError_t orInit(void);
/* Why initialisation failed: the setting that is wrong ("OPENREG_DRIVER='x'
 * is not 'process' ... or 'thread' ...") or the step that failed; "" when it
 * did not fail, or has not run yet. At most size - 1 characters,
 * NUL-terminated. Errors: orErrorInvalidValue (message NULL with size > 0). */
OPENREG_API orError_t orGetInitErrorMessage(char* message, size_t size);

/* Version of this runtime, as major * 1000 + minor * 10. */
OPENREG_API orError_t orRuntimeGetVersion(int* version);

/* ------------------------------------------------------------------------ */
/* Devices                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct orDeviceProp {
  char name[64];              /* "openreg simulated device" */
  size_t totalGlobalMem;      /* capacity in bytes */
  int major;                  /* capability major version */
  int minor;                  /* capability minor version */
  int multiProcessorCount;    /* simulated compute units */
  int pciBusID;               /* equals the device ordinal */
  int streamPriorityLeast;    /* numerically largest (lowest) priority */
  int streamPriorityGreatest; /* numerically smallest (highest) priority */
} orDeviceProp;

/* The most devices a runtime has (OPENREG_DEVICE_COUNT's upper bound). The
 * PyTorch layer sizes its per-device tables by it and the process driver its
 * shared tables, so it is defined here once. */
#define OR_MAX_DEVICES 16

/* Number of simulated devices, at most OR_MAX_DEVICES. Only reads the
 * configuration: it creates no device state, so a process may call it and then
 * fork (the child can still use the runtime). Every other call initialises the
 * devices on first use. */
OPENREG_API orError_t orGetDeviceCount(int* count);
/* Sets the calling thread's current device. */
OPENREG_API orError_t orSetDevice(int device);
/* The calling thread's current device (0 until orSetDevice is called). */
OPENREG_API orError_t orGetDevice(int* device);
OPENREG_API orError_t orGetDeviceProperties(orDeviceProp* prop, int device);
/* Free and total memory of the current device, in bytes. */
OPENREG_API orError_t orMemGetInfo(size_t* free_bytes, size_t* total_bytes);
/* Blocks until every stream of the current device has drained, then returns
 * (and clears) the first kernel error reported on that device, if any. */
OPENREG_API orError_t orDeviceSynchronize(void);
/* orSuccess (and an empty `reason`) if `device` works; orErrorDeviceLost if
 * it is lost, with what happened in `reason` (at most size - 1 characters,
 * NUL-terminated; reason may be NULL when size is 0). */
OPENREG_API orError_t orDeviceGetLossReason(int device, char* reason,
                                            size_t size);
/* SIMULATOR ONLY (a driver for real hardware returns orErrorInvalidValue):
 * makes `device` lost, as a hardware fault would, for tests of the lost-
 * device paths. The kernel it runs now finishes; its queued work is dropped
 * (events recorded on it still complete, so nothing waits forever); every
 * later call that uses it returns orErrorDeviceLost. `reason` (may be NULL)
 * is what orDeviceGetLossReason reports. */
OPENREG_API orError_t orSimulateDeviceLoss(int device, const char* reason);
/* Stream priorities accepted by orStreamCreateWithPriority: lower numbers are
 * higher priority, as in CUDA. */
OPENREG_API orError_t orDeviceGetStreamPriorityRange(int* least, int* greatest);

/* ------------------------------------------------------------------------ */
/* Memory                                                                   */
/* ------------------------------------------------------------------------ */

/* Allocates size bytes on the current device. *ptr is set to NULL first.
 * The address is aligned to 512 bytes and cannot be dereferenced by host
 * code. size 0 gives *ptr == NULL and orSuccess. Returns
 * orErrorMemoryAllocation when the device is full. Costs a lock and a map
 * update, no system call: a caching allocator on top is still advised. */
OPENREG_API orError_t orMalloc(void** ptr, size_t size);
/* Frees an allocation made by orMalloc on any device. NULL is a no-op.
 * Waits for nothing: the caller guarantees no queued work uses it. Returns
 * the physical pages of the block to the system, and makes IPC handles of
 * it stale. Memory opened with orIpcOpenMemHandle is not freed here
 * (orErrorInvalidDevicePointer): close it with orIpcCloseMemHandle. */
OPENREG_API orError_t orFree(void* ptr);
/* Page-locked ("pinned") host memory: ordinary host memory the device can
 * copy from asynchronously. *ptr is set to NULL first. */
OPENREG_API orError_t orMallocHost(void** ptr, size_t size);
OPENREG_API orError_t orFreeHost(void* ptr);

typedef enum orMemoryType {
  orMemoryTypeUnregistered = 0, /* ordinary (pageable) host memory */
  orMemoryTypeHost = 1,         /* pinned host memory from orMallocHost */
  orMemoryTypeDevice = 2,       /* device memory from orMalloc */
} orMemoryType;

typedef struct orPointerAttributes {
  orMemoryType type;
  int device;  /* owning device, -1 for host memory */
  void* base;  /* start of the allocation that contains the pointer */
  size_t size; /* size of that allocation in bytes */
} orPointerAttributes;

/* Describes any pointer, including pointers into the middle of an
 * allocation. Unknown pointers give orMemoryTypeUnregistered and orSuccess.
 * A pointer inside a device's address range that is not part of a live
 * allocation gives orErrorInvalidDevicePointer. Memory opened with
 * orIpcOpenMemHandle is device memory whose base and size are those of the
 * imported allocation. */
OPENREG_API orError_t orPointerGetAttributes(orPointerAttributes* attributes,
                                             const void* ptr);

typedef enum orMemcpyKind {
  orMemcpyHostToHost = 0,
  orMemcpyHostToDevice = 1,
  orMemcpyDeviceToHost = 2,
  orMemcpyDeviceToDevice = 3, /* also across devices */
  orMemcpyDefault = 4,        /* inferred from the pointers */
} orMemcpyKind;

typedef struct orStream* orStream_t;
typedef struct orEvent* orEvent_t;

/* Synchronous copy: returns once the bytes have arrived. It is ordered after
 * the work already queued on the default stream of the device(s) involved.
 * Device ranges must lie inside live allocations. */
OPENREG_API orError_t orMemcpy(void* dst, const void* src, size_t count,
                               orMemcpyKind kind);
/* Enqueues the copy on stream (NULL: the current device's default stream)
 * and returns. With pageable host memory the call behaves like orMemcpy
 * (it waits), as CUDA does, except a copy to the device of at most
 * OR_MAX_INLINE_COPY_BYTES: its bytes are captured and the call returns at
 * once. With pinned host memory or device-to-device it returns at once. */
#define OR_MAX_INLINE_COPY_BYTES 32768
OPENREG_API orError_t orMemcpyAsync(void* dst, const void* src, size_t count,
                                    orMemcpyKind kind, orStream_t stream);
/* Sets count bytes of device memory to value, synchronously. */
OPENREG_API orError_t orMemset(void* dst, int value, size_t count);

/* Translates a device address into the address at which code running as
 * the device (a function launched on a stream, or an inline kernel) reads
 * and writes the same bytes. Never dereference the result outside of such
 * device code: it is how the simulator implements kernels, not a way around
 * the isolation of device memory. The pointer must lie inside a device's
 * address range; no allocation lookup is made (this is the hot path). */
OPENREG_API orError_t orGetKernelPointer(void** kernel_ptr,
                                         const void* device_ptr);

/* The address at which the host's communication library (a NIC that DMAs
 * device memory, as with GPUDirect RDMA) reads and writes `size` bytes of
 * live device memory at device_ptr in place; for collectives only, ordered
 * with the streams by events; memory opened from another process
 * (orIpcOpenMemHandle) too. orErrorNotSupported when the device has no such
 * access (OPENREG_NIC_DMA=0): stage the bytes through pinned host memory
 * instead. */
OPENREG_API orError_t orMemGetDmaPointer(void** dma_ptr, const void* device_ptr,
                                         size_t size);

/* ------------------------------------------------------------------------ */
/* Inter-process communication (IPC): device memory shared between processes */
/* ------------------------------------------------------------------------ */

/* Device memory of one process can be mapped into another process on the
 * same machine, as with CUDA's cudaIpc* functions: the owner exports an
 * allocation as a handle (plain bytes, sent by any means: a pipe, a
 * multiprocessing queue), the peer opens the handle and gets its own device
 * pointer to the same bytes. Writes on either side are visible to the other
 * once the writing side's device work has finished (synchronize it, then
 * tell the other process by host means); the runtime orders nothing across
 * processes.
 *
 * The simulator reopens the owner's arena file through /proc/<pid>/fd, so
 * both processes must run as the same user in the same PID namespace and
 * the owner must be dumpable (the default); a mapping stays valid after the
 * owner exits (docs/ipc.md says how).
 *
 * Both processes see the allocation as memory of device `d` of their own
 * machine, where d is the owner's device ordinal (the peer needs at least
 * d + 1 devices). Imported memory does not count against the peer's
 * capacity or orMemGetInfo. */

#define OR_IPC_HANDLE_SIZE 64

/* Opaque, fixed size, copyable by value (like cudaIpcMemHandle_t). It
 * carries the owner's pid, the device, the identity of the owner's arena
 * file, the allocation's offset and size, and a generation number that
 * orFree invalidates. */
typedef struct orIpcMemHandle_st {
  char reserved[OR_IPC_HANDLE_SIZE];
} orIpcMemHandle_t;

/* Flags of orIpcOpenMemHandle. Peer access between the simulated devices
 * is always enabled, so the flag is accepted and changes nothing. */
enum {
  orIpcMemLazyEnablePeerAccess = 1,
};

/* Exports the allocation that starts at devPtr (a pointer returned by
 * orMalloc) for other processes. The handle covers the whole allocation;
 * exporting the same live allocation again gives the same handle bytes. The
 * handle becomes stale when the allocation is freed (a later allocation at
 * the same address gets a different handle). *handle is zeroed first.
 * Errors: orErrorInvalidValue (handle NULL); orErrorInvalidDevicePointer
 * (devPtr NULL, host memory, not the start of a live allocation, or memory
 * this process imported: only the owner exports). Costs no system call
 * after the first export on a device. */
OPENREG_API orError_t orIpcGetMemHandle(orIpcMemHandle_t* handle, void* devPtr);

/* Maps the allocation a handle from another process describes; *devPtr is
 * its base in this process (the owner's offsets within the allocation
 * apply unchanged). Opening a handle that is already open in this process
 * returns the same pointer and counts one more open; each open needs one
 * orIpcCloseMemHandle. The owner must not free the allocation while peers
 * use it (its pages would be released and reused); keeping it is the job of
 * the layer above, as in CUDA. *devPtr is set to NULL first.
 * Errors: orErrorInvalidValue (devPtr NULL, unknown flags, bytes that are
 * not a handle); orErrorIpcSameProcess (exported by this process);
 * orErrorInvalidDevice (this process has no such device);
 * orErrorInvalidResourceHandle (stale: freed, or the owner exited);
 * orErrorMapBufferObjectFailed (see the error code; at most 1024 distinct
 * handles are open at once). */
OPENREG_API orError_t orIpcOpenMemHandle(void** devPtr, orIpcMemHandle_t handle,
                                         unsigned int flags);

/* Closes one open of orIpcOpenMemHandle; the last close unmaps the memory
 * (work still queued on it must have finished). The owner's memory is not
 * affected. Errors: orErrorInvalidValue (NULL); orErrorInvalidDevicePointer
 * (not a pointer returned by orIpcOpenMemHandle, or already closed as often
 * as it was opened). */
OPENREG_API orError_t orIpcCloseMemHandle(void* devPtr);

/* ------------------------------------------------------------------------ */
/* Streams                                                                  */
/* ------------------------------------------------------------------------ */

/* Each device has a default stream (what NULL means) that always exists. */
OPENREG_API orError_t orDeviceGetDefaultStream(int device, orStream_t* stream);
/* On the current device; priority 0, or clamped into its range as CUDA's. */
OPENREG_API orError_t orStreamCreate(orStream_t* stream);
OPENREG_API orError_t orStreamCreateWithPriority(orStream_t* stream,
                                                 int priority);
/* Returns at once, as cudaStreamDestroy: queued work still runs (the device's
 * synchronization waits for it, reports its failure), then the stream is
 * freed. A default stream is orErrorInvalidResourceHandle. */
OPENREG_API orError_t orStreamDestroy(orStream_t stream);
OPENREG_API orError_t orStreamGetPriority(orStream_t stream, int* priority);
OPENREG_API orError_t orStreamGetDevice(orStream_t stream, int* device);
/* orSuccess once all work enqueued before the call has *finished*,
 * orErrorNotReady before that. */
OPENREG_API orError_t orStreamQuery(orStream_t stream);
/* Blocks until all work enqueued before the call has finished. Returns (and
 * clears) the first kernel error reported on the stream. */
OPENREG_API orError_t orStreamSynchronize(orStream_t stream);
/* Work enqueued on stream after this call waits until the event's most
 * recent record has completed. An event never recorded is a no-op. The
 * event may belong to another device. */
OPENREG_API orError_t orStreamWaitEvent(orStream_t stream, orEvent_t event);

/* Stream memory operations (CUDA's cuStreamWaitValue32 model): a semaphore
 * in pinned host memory that the host, or any thread, sets and a stream
 * waits on, for work whose end the device cannot see (a collective run by
 * the host's network library, data arriving from elsewhere).
 *
 * orStreamWaitValue32: work enqueued on stream after this call waits until
 * the 32-bit word at addr satisfies (int32_t)(*addr - value) >= 0 (CUDA's
 * CU_STREAM_WAIT_VALUE_GEQ: "at least value", modulo 2^32, so a counter may
 * wrap). addr lies in memory from orMallocHost, 4-byte aligned, and must
 * stay allocated until the wait has passed. flags must be 0. The call does
 * not look at the word; nothing before it on stream is affected, and a wait
 * that is never satisfied holds the stream forever (as on CUDA). Errors:
 * orErrorInvalidValue (addr NULL, not pinned or misaligned; flags nonzero).
 *
 * orHostWriteValue32: stores value into the word at addr (release order, so
 * what the host wrote before is visible to the work after the wait) and
 * wakes the streams waiting on it at once. A plain store to the word is
 * seen as well, within about a millisecond. Errors as above. */
OPENREG_API orError_t orStreamWaitValue32(orStream_t stream, void* addr,
                                          uint32_t value, unsigned int flags);
OPENREG_API orError_t orHostWriteValue32(void* addr, uint32_t value);

/* A kernel: it runs on the stream's worker thread in stream order. It
 * returns 0 on success; a nonzero return marks a launch failure that the
 * next synchronisation of the stream (or device) reports. */
typedef int (*orKernelFn)(void* user_data);
/* Enqueues fn(user_data) on stream and returns. The same as
 * orLaunchKernelEx with no attributes. */
OPENREG_API orError_t orLaunchKernel(orStream_t stream, orKernelFn fn,
                                     void* user_data);

/* What a launch says about its kernel beyond the function and its data
 * (cudaLaunchKernelEx takes its launch configuration the same way). Zeroed
 * attributes are the defaults. */
typedef struct orLaunchAttributes {
  /* SIMULATOR ONLY (a driver for real hardware ignores it): the most host
   * threads the kernel may keep busy, the stream's worker included. A kernel
   * computed by a CPU library may open a thread pool of its own beside the
   * worker (OpenMP's), which lives as long as the worker thread does. 0: not
   * known (any number); 1: the worker alone.
   *
   * The simulator uses it to decide when an idle worker ends: a worker that
   * has run a kernel with 0 or more than 1 retires after 10 ms without work,
   * so that a pool it may own does not compete with the host's own CPU work;
   * a worker that has run only kernels with 1 sleeps until the next launch
   * (a stream used periodically, such as once per training step, then does
   * not start a new thread every time). Negative: orErrorInvalidValue. */
  int hostThreads;
  /* What the kernel is ("aten::mm"), for diagnostics: the watchdog's
   * lost-device reason names it. NULL: unnamed. It must stay valid until the
   * kernel has finished; it is not copied at the launch. A named kernel
   * (orLaunchFunction) is named by its function. */
  const char* name;
} orLaunchAttributes;

/* Host waits that last. A thread blocked in orStreamSynchronize,
 * orDeviceSynchronize or orEventSynchronize calls `check` from that thread
 * about every 20 ms while the wait lasts (never in other calls, and not at
 * all in waits shorter than that): when it returns nonzero, the call
 * returns orErrorInterrupted at once. The device's work is not affected. A
 * host program uses it to stay responsive during a long wait (Python's
 * Ctrl-C). NULL removes it. Thread-safe.
 *
 * The watchdog (OPENREG_KERNEL_TIMEOUT=S, seconds, read at initialisation;
 * unset or 0: off, as on CUDA, where a hung kernel is waited for forever): a
 * device that completes no command on any stream for S seconds while a host
 * thread waits for it (a synchronization, a launch waiting for room) is
 * lost (orErrorDeviceLost; orDeviceGetLossReason names the kernel that was
 * running and S), as a GPU's watchdog resets a GPU that stopped making
 * progress (Windows' TDR, Xid 8 on Linux). A kernel that legitimately runs
 * longer than S is lost too, as there. */
typedef int (*orHostWaitCheckFn)(void);
OPENREG_API orError_t orSetHostWaitCheck(orHostWaitCheckFn check);

/* Enqueues fn(user_data) on stream and returns. attributes may be NULL (the
 * defaults). Errors: orErrorInvalidValue (fn NULL, an attribute out of
 * range). */
OPENREG_API orError_t orLaunchKernelEx(orStream_t stream, orKernelFn fn,
                                       void* user_data,
                                       const orLaunchAttributes* attributes);

/* ------------------------------------------------------------------------ */
/* Named kernels: modules, functions, launches with byte parameters          */
/* ------------------------------------------------------------------------ */

/* The launch model of a device with its own memory, after CUDA's driver API
 * (cuModuleLoad, cuModuleGetFunction, cuLaunchKernel's kernelParams): a
 * kernel is a function of a kernel library, looked up by name, and its
 * arguments are bytes copied at the launch. The host never hands the device
 * a host pointer or a closure, so the same launch works whether the device
 * runs in this process (the thread driver) or in its own (a process driver,
 * a real accelerator). orLaunchKernel's host function pointers are the
 * simulator's shortcut and cannot cross to another address space.
 *
 * A kernel library is a shared object that exports, for each kernel, a C
 * function of type orDeviceKernelFn. It does not link against the driver:
 * everything it needs from the device side comes in orKernelContext. */

typedef struct orModule_st* orModule_t;     /* a loaded kernel library */
typedef struct orFunction_st* orFunction_t; /* one kernel of a module */

/* What a running kernel gets from the device, besides its parameters. The
 * driver owns it; it is valid for the duration of the kernel's call only. */
typedef struct orKernelContext {
  /* Version of this structure (OR_KERNEL_CONTEXT_VERSION); fields are only
   * ever added at the end. */
  int version;
  /* The device the kernel runs on. */
  int device;
  /* The address at which this kernel reads and writes the device memory at
   * `device_ptr` (which must lie inside a live allocation of a device or an
   * imported one), or NULL if it is not device memory. Pinned host memory
   * (orMallocHost) is returned as is: the device reaches it directly. */
  void* (*translate)(struct orKernelContext* ctx, const void* device_ptr);
  /* Records why the kernel fails (copied; the first message of a stream is
   * kept). The kernel then returns nonzero: the stream's next
   * synchronization returns orErrorLaunchFailure and
   * orStreamGetErrorMessage gives this text. */
  void (*report_error)(struct orKernelContext* ctx, const char* message);
  /* The driver's own state. */
  void* driver_data;
  /* Version 2. Names what the kernel is doing, for diagnostics (copied, at
   * most 127 characters kept; a later call replaces it): a kernel that runs
   * many operations, such as a library's interpreter of serialized calls,
   * names the one it runs. When the device is lost while the kernel runs,
   * the lost-device message names the kernel and this text; a failure
   * without a report_error message names both too. */
  void (*describe)(struct orKernelContext* ctx, const char* what);
  /* Version 3. Gives the host a warning (copied, at most
   * OR_MAX_WARNING_BYTES - 1 characters kept). The device keeps its
   * warnings until the host takes them (orDeviceTakeWarnings), as CUDA keeps
   * a kernel's printf output until a synchronization; past
   * OR_MAX_PENDING_WARNINGS per stream it only counts them. */
  void (*warn)(struct orKernelContext* ctx, const char* message);
  /* Version 4. SIMULATOR ONLY (a device with cores of its own returns
   * `threads`): how many of `threads` host threads a kernel that may run on
   * fewer threads (its caller's choice) should use now. The simulated device
   * computes on the host's cores: while no host thread waits for the device
   * (a synchronization, or a launch waiting for room on a full stream), the
   * host runs its own work on one of them, and a team using them all would
   * keep stopping for it, so this returns threads - 1 (at least 1); while a
   * host thread waits, `threads`. The process driver's device processes
   * read the user process's count of waiting threads. */
  int (*team_threads)(struct orKernelContext* ctx, int threads);
} orKernelContext;

#define OR_KERNEL_CONTEXT_VERSION 4
#define OR_MAX_WARNING_BYTES 512
#define OR_MAX_PENDING_WARNINGS 16
/* The most parameter bytes one launch may pass (CUDA allows 32764). */
#define OR_MAX_KERNEL_PARAMS 32768

/* A kernel: params and bytes are what orLaunchFunction was given (a copy).
 * Returns 0 on success, nonzero on failure (after report_error, preferably).
 */
typedef int (*orDeviceKernelFn)(const void* params, size_t bytes,
                                orKernelContext* ctx);

/* Loads the kernel library at `path` (a shared object) for every device.
 * Loading the same path twice gives two handles to one library. *module is
 * set to NULL first. Errors: orErrorInvalidValue (NULL arguments);
 * orErrorFileNotFound (the file is missing or cannot be loaded). */
OPENREG_API orError_t orModuleLoad(orModule_t* module, const char* path);
/* orModuleLoad that also says why a load failed, as cuModuleLoadDataEx's
 * error log does: on orErrorFileNotFound, the loader's message (dlerror of
 * the process that could not load it: this one, or a device process) is
 * written to errorLog, at most errorLogBytes - 1 characters, NUL-terminated;
 * on success errorLog is "". errorLog may be NULL when errorLogBytes is 0.
 * A library loaded into a device may also register what it holds there:
 * its static initializers run in the process that runs the device's
 * kernels. */
OPENREG_API orError_t orModuleLoadEx(orModule_t* module, const char* path,
                                     char* errorLog, size_t errorLogBytes);
/* Unloads a module once the work launched from it has finished (the caller
 * guarantees that, as with orFree). Its functions become invalid. */
OPENREG_API orError_t orModuleUnload(orModule_t module);
/* The kernel `name` of `module`. *function is set to NULL first. Errors:
 * orErrorInvalidValue (NULL arguments); orErrorSymbolNotFound. */
OPENREG_API orError_t orModuleGetFunction(orFunction_t* function,
                                          orModule_t module, const char* name);
/* Enqueues function(params, bytes, ctx) on stream (NULL: the current
 * device's default stream) and returns. The bytes are copied before the
 * call returns, so the caller may reuse its buffer at once. params may be
 * NULL when bytes is 0. attributes may be NULL (see orLaunchKernelEx).
 * Errors: orErrorInvalidValue (function NULL, params NULL with bytes > 0,
 * bytes > OR_MAX_KERNEL_PARAMS, a bad attribute); orErrorDeviceLost. */
OPENREG_API orError_t orLaunchFunction(orStream_t stream, orFunction_t function,
                                       const void* params, size_t bytes,
                                       const orLaunchAttributes* attributes);
/* The message given to report_error by the failed kernel whose error the
 * stream's last synchronization (of the stream or its device) returned: ""
 * if that kernel gave none, or if that synchronization returned no kernel
 * failure. At most size - 1 characters, NUL-terminated. Errors:
 * orErrorInvalidValue (message NULL with size > 0). */
OPENREG_API orError_t orStreamGetErrorMessage(orStream_t stream, char* message,
                                              size_t size);
/* Calls fn(user_data, message) for each warning the kernels of `device`
 * gave (orKernelContext::warn) and the host has not taken yet, oldest first
 * within a stream, then forgets them. Warnings a full device dropped come
 * as one message that counts them. fn must not call the driver. Errors:
 * orErrorInvalidValue (fn NULL); orErrorInvalidDevice. */
typedef void (*orWarningFn)(void* user_data, const char* message);
OPENREG_API orError_t orDeviceTakeWarnings(int device, orWarningFn fn,
                                           void* user_data);

/* ------------------------------------------------------------------------ */
/* Events                                                                   */
/* ------------------------------------------------------------------------ */

enum {
  orEventDefault = 0,
  orEventDisableTiming = 2,
};

/* Creates an event on the current device. flags: orEventDefault or
 * orEventDisableTiming. */
OPENREG_API orError_t orEventCreateWithFlags(orEvent_t* event,
                                             unsigned int flags);
OPENREG_API orError_t orEventCreate(orEvent_t* event);
OPENREG_API orError_t orEventDestroy(orEvent_t event);
/* Captures the work enqueued on stream so far. The stream must be on the
 * event's device (orErrorInvalidResourceHandle otherwise). */
OPENREG_API orError_t orEventRecord(orEvent_t event, orStream_t stream);
/* orSuccess if the captured work has finished (or the event was never
 * recorded), orErrorNotReady otherwise. */
OPENREG_API orError_t orEventQuery(orEvent_t event);
OPENREG_API orError_t orEventSynchronize(orEvent_t event);
/* Milliseconds between the completions of two recorded events. Both must
 * have timing enabled and have completed (orErrorNotReady otherwise). */
OPENREG_API orError_t orEventElapsedTime(float* ms, orEvent_t start,
                                         orEvent_t end);
OPENREG_API orError_t orEventGetDevice(orEvent_t event, int* device);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* OPENREG_H_ */
