// Error strings of the openreg runtime.
#include <openreg.h>

namespace {

struct ErrorInfo {
  orError_t code;
  const char* name;
  const char* text;
};

constexpr ErrorInfo kErrors[] = {
    {orSuccess, "orSuccess", "no error"},
    {orErrorInvalidValue, "orErrorInvalidValue",
     "invalid argument (null pointer, zero or out-of-range value)"},
    {orErrorMemoryAllocation, "orErrorMemoryAllocation", "out of memory"},
    {orErrorInitializationError, "orErrorInitializationError",
     "openreg runtime initialization failed (orGetInitErrorMessage says "
     "why)"},
    {orErrorInvalidDevice, "orErrorInvalidDevice", "invalid device ordinal"},
    {orErrorInvalidDevicePointer, "orErrorInvalidDevicePointer",
     "invalid device pointer (not a live device allocation, or freed twice)"},
    {orErrorInvalidMemcpyDirection, "orErrorInvalidMemcpyDirection",
     "memcpy kind does not match the memory the pointers refer to"},
    {orErrorNotReady, "orErrorNotReady", "device work not yet completed"},
    {orErrorInvalidResourceHandle, "orErrorInvalidResourceHandle",
     "invalid resource handle (a stream or event: null, destroyed, or on "
     "another device; an IPC memory handle: stale, its allocation was freed "
     "or its owner process exited)"},
    {orErrorLaunchFailure, "orErrorLaunchFailure",
     "a kernel launched on the device failed"},
    {orErrorInitializedInParent, "orErrorInitializedInParent",
     "openreg was initialized in the parent process and cannot be used in a "
     "forked child; use the 'spawn' start method"},
    {orErrorInvalidEventTiming, "orErrorInvalidEventTiming",
     "event has timing disabled or was never recorded"},
    {orErrorInvalidHostPointer, "orErrorInvalidHostPointer",
     "not a pinned host allocation from orMallocHost (or freed twice)"},
    {orErrorIpcSameProcess, "orErrorIpcSameProcess",
     "the IPC memory handle was exported by this process (use the device "
     "pointer itself)"},
    {orErrorMapBufferObjectFailed, "orErrorMapBufferObjectFailed",
     "the memory of another process could not be mapped (its /proc/<pid>/fd "
     "entry is not accessible: another user or PID namespace; mmap failed; "
     "or too many IPC handles are open)"},
    {orErrorDeviceLost, "orErrorDeviceLost",
     "the device is lost (it stopped working; orDeviceGetLossReason says "
     "why): its work was dropped and every call that uses it fails"},
    {orErrorFileNotFound, "orErrorFileNotFound",
     "the kernel library could not be loaded (missing, or not a shared "
     "object for this machine)"},
    {orErrorSymbolNotFound, "orErrorSymbolNotFound",
     "the kernel library has no kernel of that name"},
    {orErrorNotSupported, "orErrorNotSupported",
     "this driver does not support the operation"},
    {orErrorInterrupted, "orErrorInterrupted",
     "host wait interrupted (the device work goes on)"},
};

const ErrorInfo* find(orError_t error) {
  for (const auto& info : kErrors) {
    if (info.code == error) {
      return &info;
    }
  }
  return nullptr;
}

}  // namespace

extern "C" {

const char* orGetErrorString(orError_t error) {
  const ErrorInfo* info = find(error);
  return info ? info->text : "unrecognized error code";
}

const char* orGetErrorName(orError_t error) {
  const ErrorInfo* info = find(error);
  return info ? info->name : "unrecognized error code";
}

}  // extern "C"
