// The execution engine: how this backend runs what it has no device kernel
// for, set apart from the integration every backend needs.
//
// openreg's engine is the simulator's (csrc/engine/): PyTorch's CPU kernels
// run on the device memory itself, through kernel views, queued on the
// streams as launch plans and serialized calls. A port of real hardware has
// no such engine: its device's memory is not the host's. The integration
// (core/, memory/, aten/, ...) therefore never includes the engine; it calls
// the hooks below, and each hook left empty has the behaviour of a device
// whose memory the host cannot map:
//  - the boxed fallback copies arguments to the host and back
//    (aten/fallback/OpenRegCopyingFallback.h);
//  - copies that convert, broadcast or restride go through the host;
//  - the device runs named kernels only (host_kernels_supported() is false:
//    no host code touches device memory), whichever driver runs it.
// The engine fills the hooks in from its static initializers, when the
// extension loads and before any call; nothing changes them afterwards.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Storage.h>
#include <c10/util/FunctionRef.h>
#include <torch/library.h>

namespace openreg {

struct Engine {
  // Set by the engine: host kernels (closures that run PyTorch's CPU kernels
  // on device memory) exist in this build.
  bool present = false;
  // The boxed fallback of every operator without a kernel.
  void (*fallback)(const c10::OperatorHandle& op,
                   torch::jit::Stack* stack) = nullptr;
  // Registers the engine's routes when the Python module loads (the
  // operators of the sparse and nested layouts); returns how many
  // operators it routed.
  int (*route_ops)() = nullptr;
  // An unboxed kernel for a routed operator `op` in `library` (its tensor
  // arguments borrowed, not boxed), or false to route the boxed entry.
  bool (*register_unboxed)(torch::Library& library, const char* name,
                           const c10::OperatorHandle& op) = nullptr;
  // _copy_from's case that is more than bytes (dtype conversion, strides,
  // broadcasting, overlapping storages) on `device`. `queue`: a same-device
  // copy that may be queued on the stream without the host waiting. Returns
  // false when it did not copy (then the copy goes through the host).
  bool (*copy)(const at::Tensor& src, const at::Tensor& dst,
               c10::DeviceIndex device, bool queue) = nullptr;
  // Runs a host kernel on the calling thread when the driver runs named
  // kernels only: the engine stages the device memory its views touch.
  void (*run_staged)(c10::function_ref<void()> kernel) = nullptr;
  // The host address of a device storage's bytes (a kernel view), for a
  // host library that reads and writes them in place (Gloo).
  void* (*kernel_base)(const c10::Storage& storage) = nullptr;
  // torch.openreg.empty_cache() on `device`: frees the engine's workspace.
  void (*empty_cache)(c10::DeviceIndex device) = nullptr;
  // Around every host kernel a stream worker runs (aten/OpenRegLaunch.cpp):
  // the engine gives the CPU kernels inside it its workspace. enter returns
  // the state leave restores.
  bool (*enter_host_kernel)() = nullptr;
  void (*leave_host_kernel)(bool previous) = nullptr;
};

// The hooks of this build (filled by the engine's static initializers).
Engine& engine();

}  // namespace openreg
