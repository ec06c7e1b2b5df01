// How a fallback call runs: queued on the stream, or synchronously.
//
// The host must know everything about a call before it queues it: that the
// CPU kernel accepts the arguments (dtypes, shapes, overlap, out= casting,
// dtype support), the results' metadata, the out= arguments' final shapes
// and the warnings it raises. All of that depends only on the call's
// signature (the operator and, per argument, its dtype, sizes, strides,
// aliasing, or value), so it is established once per signature and cached:
//
//  - the first call of a signature runs synchronously, after the op's meta
//    kernel has described its results; the CPU kernel raises its own errors
//    and warnings at the call, exactly as on the CPU;
//  - if the CPU run agrees with the meta description (results, final shapes
//    of written arguments, warnings), the signature is cached as queueable:
//    later calls replay the warnings, resize out= arguments and allocate
//    results on the host, and queue the CPU kernel;
//  - otherwise (no meta kernel, data-dependent shapes, an error, a result
//    that aliases an input, a disagreement) it is cached as synchronous.
//
// Only value-dependent errors (an index out of range) can then surface on
// the device; they are raised at the next synchronization, naming the op.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>

#include <memory>
#include <vector>

#include "aten/fallback/OpenRegOpTraits.h"

namespace openreg {

// The metadata of one tensor a plan makes or reshapes.
struct TensorSpec {
  at::ScalarType dtype;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
};

// What a cached signature does when it is queued.
struct LaunchPlan {
  // Per return: the argument it is (arg >= 0), or the new tensors to
  // allocate (one for a Tensor return, several for a Tensor[] return, none
  // for a None return).
  struct Output {
    int arg = -1;
    bool is_list = false;
    std::vector<TensorSpec> tensors;
  };
  std::vector<Output> outputs;
  // Written tensor arguments and their final metadata (resized at the call
  // when it differs).
  std::vector<std::pair<int, TensorSpec>> written;
  // Warnings the call raises (the CPU kernel's, from the first call),
  // replayed at every call.
  std::vector<c10::Warning> warnings;
};

// The decision for one call.
struct LaunchDecision {
  enum Kind {
    kQueue,           // `plan` says how
    kSync,            // run synchronously
    kSyncThenVerify,  // run synchronously, then verify(`candidate`)
  } kind = kSync;
  std::shared_ptr<const LaunchPlan> plan;
  std::shared_ptr<LaunchPlan> candidate;
  std::vector<int64_t> key;
};

// Python meta kernels warn through Python's `warnings` module, which c10's
// warning handlers do not see. The Python bindings install a function that
// silences Python warnings until the returned object is destroyed; the meta
// run (whose warnings the CPU run raises again) happens inside it.
using PythonWarningSilencer = std::shared_ptr<void> (*)();
void set_python_warning_silencer(PythonWarningSilencer fn);

// Decides how the call on top of `stack` runs (cached per signature).
LaunchDecision plan_launch(const c10::OperatorHandle& op,
                           const OpTraits& traits,
                           const torch::jit::Stack& stack);

// After the synchronous run of a kSyncThenVerify call: `args` are the
// call's (device) arguments after the run, `results` its results,
// `warnings` what the CPU kernel raised, `bits_changed` whether it flipped
// a conjugate/negative bit of a written argument. Caches the signature as
// queueable if all agree with the candidate, as synchronous otherwise.
void verify_launch(LaunchDecision decision, const OpTraits& traits,
                   c10::ArrayRef<c10::IValue> args,
                   c10::ArrayRef<c10::IValue> results,
                   const std::vector<c10::Warning>& warnings,
                   bool bits_changed);

}  // namespace openreg
