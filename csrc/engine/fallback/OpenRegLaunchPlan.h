// How a fallback call runs: queued on the stream, or synchronously.
//
// The host must know everything about a call before it queues it: that the
// CPU kernel accepts the arguments (dtypes, shapes, overlap, out= casting,
// dtype support), the results' metadata, the out= arguments' final shapes
// and the warnings it raises. All of that depends only on the call's
// signature (the operator and, per argument, its dtype, sizes, strides,
// aliasing, or value) and on the settings the CPU kernel reads at the call
// (the default dtype, deterministic mode, ...: host_settings() in the .cpp),
// except for operators whose results' shapes depend on the data, which
// PyTorch tags (dynamic_output_shape, data_dependent_output) and which
// always run synchronously. So it is learnt once per signature and settings:
//
//  - the first call of a signature runs synchronously: the CPU kernel raises
//    its own errors and warnings at the call, exactly as on the CPU, and the
//    host records what it did (results' metadata, out= arguments' final
//    metadata, warnings);
//  - later calls are queued: the host replays the warnings, resizes out=
//    arguments and allocates results, and only the CPU kernel goes to the
//    stream;
//  - a signature whose first run raised, returned a view of an input or a
//    number, or flipped a conjugate bit stays synchronous;
//  - a signature whose first run warned is learnt once more, from its second
//    call: a warning the CPU kernel gives only once per process
//    (TORCH_WARN_ONCE) is not given again then, and is not replayed.
//
// Only value-dependent errors (an index out of range) can then surface on
// the device; they are raised at the next synchronization, naming the op.
//
// Plans are kept per thread (no lock on the hot path): each thread learns a
// signature once.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>

#include <memory>
#include <optional>
#include <vector>

#include "aten/fallback/OpenRegOpTraits.h"

namespace openreg {

// The metadata of one tensor a plan makes or reshapes.
struct TensorSpec {
  at::ScalarType dtype;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
};

// What a learnt signature does when it is queued.
struct LaunchPlan {
  // Per return: the argument it is (arg >= 0), or the new tensors to
  // allocate (one for a Tensor return, several for a Tensor[] return, none
  // for an undefined Tensor).
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
  // call_elements() of the call: how many threads the kernel may use
  // (launch_async's `elements`), the same as on its first, synchronous run.
  int64_t elements = -1;
  // The operator's out= variant writes the results in place (verified on the
  // first call for operators that are not pointwise; see OpTraits).
  bool into_results = false;
};

// The decision for one call.
struct LaunchDecision {
  enum Kind {
    kQueue,  // `plan` says how
    kSync,   // run synchronously
    kLearn,  // run synchronously, then learn_launch()
  } kind = kSync;
  std::shared_ptr<const LaunchPlan> plan;
  std::vector<int64_t> key;  // kLearn: the signature
  bool relearn = false;      // kLearn: the second run of a signature
};

// The elements of the largest tensor among a call's arguments (-1 if it
// has none), which decides how many threads its kernel uses. The first,
// synchronous run of a signature and its queued calls use the same value,
// so that they split their work alike and give the same bits.
int64_t call_elements(c10::ArrayRef<c10::IValue> args);

// The host's settings a CPU kernel reads (call::settings in
// engine/kernels/OpenRegCallFormat.h): part of a plan's key, and what a device
// in a process of its own applies before a call.
int64_t host_settings();

// The results the operator's Meta kernel gives for `args` (each tensor
// replaced by a meta tensor of its sizes, strides and dtype; the kernel's
// warnings dropped), or nothing when the operator has no Meta kernel or it
// raises (a fake whose sizes depend on the data).
std::optional<std::vector<c10::IValue>> meta_results(
    const OpTraits& traits, c10::ArrayRef<c10::IValue> args);

// Decides how the call on top of `stack` runs.
LaunchDecision plan_launch(const OpTraits& traits,
                           const torch::jit::Stack& stack);

// What the synchronous run of a kLearn call did.
struct SyncRun {
  std::vector<c10::Warning> warnings;  // what the CPU kernel raised
  bool bits_changed = false;   // a conjugate/negative bit of a written arg
  bool returned_view = false;  // a result is a view of an input
  std::vector<int> resized;    // written arguments the kernel resized
  // The out= variant, run on new outputs of the results' metadata, wrote
  // the same bytes as the functional kernel, in place.
  bool out_variant_matches = false;
};

// After the synchronous run of a kLearn call: `args` are the call's device
// arguments after the run, `results` its device results. Learns the plan
// (or that the signature stays synchronous).
void learn_launch(LaunchDecision decision, const OpTraits& traits,
                  c10::ArrayRef<c10::IValue> args,
                  c10::ArrayRef<c10::IValue> results, const SyncRun& run);

}  // namespace openreg
