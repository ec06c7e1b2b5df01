// The host's half of a serialized boxed call
// (engine/kernels/OpenRegCallFormat.h): a queued fallback call written to
// bytes, so that the device runs it from bytes alone
// (engine/kernels/OpenRegBoxedCall.h), in this process or in a device process.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "aten/fallback/OpenRegOpTraits.h"
#include "engine/kernels/OpenRegCallFormat.h"
#include "random/OpenRegGenerator.h"

namespace openreg {

// What one call writes.
struct CallToEncode {
  // The operator the device runs: the call's own, or its out= variant
  // (mode kIntoResults).
  const c10::OperatorHandle* op = nullptr;
  call::Mode mode = call::Mode::kCopyResults;
  const OpTraits* traits = nullptr;
  c10::ArrayRef<c10::IValue> args;  // the call's arguments
  // Random ops: the argument whose generator the device makes from a draw.
  c10::ArrayRef<std::pair<size_t, RandomDraw>> draws;
  // The new results (device tensors the host allocated) and where each goes
  // among the operator's returns (return index, list index or -1).
  c10::ArrayRef<at::Tensor> results;
  c10::ArrayRef<std::pair<size_t, int>> result_slots;
  int threads = 0;  // the most threads the kernel may use
  // The kernel's warnings go to the host (call::kForwardWarnings), but for
  // these, which the host raised at the call.
  bool forward_warnings = false;
  c10::ArrayRef<c10::Warning> known_warnings;
  // The device applies the host's settings first (call::kApplySettings):
  // when it runs in a process of its own.
  bool apply_settings = false;
  // When set: the call's device storages and its tensors, in the order of
  // the call's tables (a described call's answer names them by index).
  std::vector<c10::Storage>* storages = nullptr;
  std::vector<at::Tensor>* tensors = nullptr;
};

// Writes the call to `out` (cleared first). Returns false, leaving `out` in
// an unspecified state, when the call has what the format does not carry (a
// list of scalars, a symbolic size, a non-strided device tensor) or would
// exceed OR_MAX_KERNEL_PARAMS bytes (a large CPU tensor argument).
bool encode_call(const CallToEncode& call, std::vector<uint8_t>& out);

// launch_boxed_call() queues `op(args)` as a serialized boxed call (the
// kernel library's openreg_boxed_call, engine/kernels/OpenRegCallFormat.h): the
// device runs PyTorch's CPU kernel of `op` on its own mapping of the device
// tensors among `args`, then copies return i into results[i] (a device
// tensor the host allocated with that return's sizes and dtype; an
// undefined one drops the return). It is how openreg's own kernels that are
// a CPU operator on the device's memory (attention, convolution, copies)
// run on a device that runs named kernels only. Returns false, launching
// nothing, when the call has what the format cannot carry. `op_name` and
// `elements` as for launch_function.
bool launch_boxed_call(c10::DeviceIndex device, const std::string& op_name,
                       const c10::OperatorHandle& op,
                       c10::ArrayRef<c10::IValue> args,
                       c10::ArrayRef<at::Tensor> results, int64_t elements);

}  // namespace openreg
