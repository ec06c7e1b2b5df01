// The driver under test, chosen at run time: the contract tests call the
// functions of runtime/include/openreg.h as any client would, and the
// definitions below forward each call to a shared library loaded with
// dlopen, in the manner of IREE's HAL conformance tests. Any library that
// exports the whole API can be checked, unchanged:
//
//   openreg_contract_tests --driver=/path/to/libvendor_driver.so
//   OPENREG_DRIVER_LIBRARY=/path/to/lib.so openreg_contract_tests
//
// The build registers this binary with ctest against libopenreg_driver.so,
// the simulator built as a shared library.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <openreg.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// Every function of the C ABI: X(return type, name, (parameters), (arguments)).
#define OPENREG_DRIVER_API(X)                                                  \
  X(const char*, orGetErrorString, (orError_t error), (error))                 \
  X(const char*, orGetErrorName, (orError_t error), (error))                   \
  X(orError_t, orInit, (void), ())                                             \
  X(orError_t, orGetInitErrorMessage, (char* message, size_t size),            \
    (message, size))                                                           \
  X(orError_t, orRuntimeGetVersion, (int* version), (version))                 \
  X(orError_t, orGetDeviceCount, (int* count), (count))                        \
  X(orError_t, orSetDevice, (int device), (device))                            \
  X(orError_t, orGetDevice, (int* device), (device))                           \
  X(orError_t, orGetDeviceProperties, (orDeviceProp * prop, int device),       \
    (prop, device))                                                            \
  X(orError_t, orMemGetInfo, (size_t * free_bytes, size_t * total_bytes),      \
    (free_bytes, total_bytes))                                                 \
  X(orError_t, orDeviceSynchronize, (void), ())                                \
  X(orError_t, orDeviceGetLossReason, (int device, char* reason, size_t size), \
    (device, reason, size))                                                    \
  X(orError_t, orSimulateDeviceLoss, (int device, const char* reason),         \
    (device, reason))                                                          \
  X(orError_t, orDeviceGetStreamPriorityRange, (int* least, int* greatest),    \
    (least, greatest))                                                         \
  X(orError_t, orMalloc, (void** ptr, size_t size), (ptr, size))               \
  X(orError_t, orFree, (void* ptr), (ptr))                                     \
  X(orError_t, orMallocHost, (void** ptr, size_t size), (ptr, size))           \
  X(orError_t, orFreeHost, (void* ptr), (ptr))                                 \
  X(orError_t, orPointerGetAttributes,                                         \
    (orPointerAttributes * attributes, const void* ptr), (attributes, ptr))    \
  X(orError_t, orMemcpy,                                                       \
    (void* dst, const void* src, size_t count, orMemcpyKind kind),             \
    (dst, src, count, kind))                                                   \
  X(orError_t, orMemcpyAsync,                                                  \
    (void* dst, const void* src, size_t count, orMemcpyKind kind,              \
     orStream_t stream),                                                       \
    (dst, src, count, kind, stream))                                           \
  X(orError_t, orMemset, (void* dst, int value, size_t count),                 \
    (dst, value, count))                                                       \
  X(orError_t, orGetKernelPointer,                                             \
    (void** kernel_ptr, const void* device_ptr), (kernel_ptr, device_ptr))     \
  X(orError_t, orMemGetDmaPointer,                                             \
    (void** dma_ptr, const void* device_ptr, size_t size),                     \
    (dma_ptr, device_ptr, size))                                               \
  X(orError_t, orIpcGetMemHandle, (orIpcMemHandle_t * handle, void* devPtr),   \
    (handle, devPtr))                                                          \
  X(orError_t, orIpcOpenMemHandle,                                             \
    (void** devPtr, orIpcMemHandle_t handle, unsigned int flags),              \
    (devPtr, handle, flags))                                                   \
  X(orError_t, orIpcCloseMemHandle, (void* devPtr), (devPtr))                  \
  X(orError_t, orDeviceGetDefaultStream, (int device, orStream_t* stream),     \
    (device, stream))                                                          \
  X(orError_t, orStreamCreate, (orStream_t * stream), (stream))                \
  X(orError_t, orStreamCreateWithPriority,                                     \
    (orStream_t * stream, int priority), (stream, priority))                   \
  X(orError_t, orStreamDestroy, (orStream_t stream), (stream))                 \
  X(orError_t, orStreamGetPriority, (orStream_t stream, int* priority),        \
    (stream, priority))                                                        \
  X(orError_t, orStreamGetDevice, (orStream_t stream, int* device),            \
    (stream, device))                                                          \
  X(orError_t, orStreamQuery, (orStream_t stream), (stream))                   \
  X(orError_t, orStreamSynchronize, (orStream_t stream), (stream))             \
  X(orError_t, orStreamWaitEvent, (orStream_t stream, orEvent_t event),        \
    (stream, event))                                                           \
  X(orError_t, orStreamWaitValue32,                                            \
    (orStream_t stream, void* addr, uint32_t value, unsigned int flags),       \
    (stream, addr, value, flags))                                              \
  X(orError_t, orHostWriteValue32, (void* addr, uint32_t value),               \
    (addr, value))                                                             \
  X(orError_t, orLaunchKernel,                                                 \
    (orStream_t stream, orKernelFn fn, void* user_data),                       \
    (stream, fn, user_data))                                                   \
  X(orError_t, orLaunchKernelEx,                                               \
    (orStream_t stream, orKernelFn fn, void* user_data,                        \
     const orLaunchAttributes* attributes),                                    \
    (stream, fn, user_data, attributes))                                       \
  X(orError_t, orModuleLoad, (orModule_t * module, const char* path),          \
    (module, path))                                                            \
  X(orError_t, orModuleLoadEx,                                                 \
    (orModule_t * module, const char* path, char* errorLog,                    \
     size_t errorLogBytes),                                                    \
    (module, path, errorLog, errorLogBytes))                                   \
  X(orError_t, orModuleUnload, (orModule_t module), (module))                  \
  X(orError_t, orModuleGetFunction,                                            \
    (orFunction_t * function, orModule_t module, const char* name),            \
    (function, module, name))                                                  \
  X(orError_t, orLaunchFunction,                                               \
    (orStream_t stream, orFunction_t function, const void* params,             \
     size_t bytes, const orLaunchAttributes* attributes),                      \
    (stream, function, params, bytes, attributes))                             \
  X(orError_t, orSetHostWaitCheck, (orHostWaitCheckFn check), (check))         \
  X(orError_t, orStreamGetErrorMessage,                                        \
    (orStream_t stream, char* message, size_t size), (stream, message, size))  \
  X(orError_t, orDeviceTakeWarnings,                                           \
    (int device, orWarningFn fn, void* user_data), (device, fn, user_data))    \
  X(orError_t, orEventCreateWithFlags,                                         \
    (orEvent_t * event, unsigned int flags), (event, flags))                   \
  X(orError_t, orEventCreate, (orEvent_t * event), (event))                    \
  X(orError_t, orEventDestroy, (orEvent_t event), (event))                     \
  X(orError_t, orEventRecord, (orEvent_t event, orStream_t stream),            \
    (event, stream))                                                           \
  X(orError_t, orEventQuery, (orEvent_t event), (event))                       \
  X(orError_t, orEventSynchronize, (orEvent_t event), (event))                 \
  X(orError_t, orEventElapsedTime,                                             \
    (float* ms, orEvent_t start, orEvent_t end), (ms, start, end))             \
  X(orError_t, orEventGetDevice, (orEvent_t event, int* device),               \
    (event, device))

namespace {

// The driver's entry points, resolved once before any test runs.
struct DriverApi {
#define OPENREG_DECLARE(ret, name, params, args) ret(*name) params = nullptr;
  OPENREG_DRIVER_API(OPENREG_DECLARE)
#undef OPENREG_DECLARE
};

DriverApi g_driver;

constexpr const char* kEnvVar = "OPENREG_DRIVER_LIBRARY";

// Loads `path` and resolves every function; on failure returns false with
// what went wrong in *error (the dlerror text, or the missing functions).
bool LoadDriver(const char* path, std::string* error) {
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    *error = why != nullptr ? why : "dlopen failed";
    return false;
  }
  std::vector<std::string> missing;
#define OPENREG_RESOLVE(ret, name, params, args)                       \
  g_driver.name =                                                      \
      reinterpret_cast<decltype(g_driver.name)>(dlsym(handle, #name)); \
  if (g_driver.name == nullptr) missing.push_back(#name);
  OPENREG_DRIVER_API(OPENREG_RESOLVE)
#undef OPENREG_RESOLVE
  if (!missing.empty()) {
    *error = "the library does not export:";
    for (const std::string& name : missing) *error += " " + name;
    return false;  // the handle stays open: the process exits
  }
  return true;
}

}  // namespace

// [doc:driver-loader-forward]
// The API the tests call, forwarded to the loaded driver.
extern "C" {
#define OPENREG_FORWARD(ret, name, params, args) \
  ret name params { return g_driver.name args; }
OPENREG_DRIVER_API(OPENREG_FORWARD)
#undef OPENREG_FORWARD
}
// [/doc:driver-loader-forward]

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const char* path = std::getenv(kEnvVar);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--driver=", 9) == 0) {
      path = argv[i] + 9;
    } else if (std::strcmp(argv[i], "--driver") == 0 && i + 1 < argc) {
      path = argv[++i];
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (GTEST_FLAG_GET(list_tests)) {
    return RUN_ALL_TESTS();  // lists the tests; no driver call is made
  }
  if (path == nullptr || *path == '\0') {
    std::fprintf(stderr,
                 "usage: %s --driver=PATH [gtest flags]\n"
                 "  PATH: a shared library implementing runtime/include/"
                 "openreg.h (or set %s)\n",
                 argv[0], kEnvVar);
    return 2;
  }
  std::string error;
  if (!LoadDriver(path, &error)) {
    std::fprintf(stderr, "cannot use the driver %s: %s\n", path, error.c_str());
    return 2;
  }
  // Processes the tests start (the IPC peer, ../ipc_peer.h) load it too.
  setenv(kEnvVar, path, 1);
  std::printf("driver under test: %s\n", path);
  return RUN_ALL_TESTS();
}
