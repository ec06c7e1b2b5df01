// CUDA's determinism, for the operators the fallback runs.
//
// With torch.use_deterministic_algorithms(True), CUDA raises (or warns,
// with warn_only=True) for the operators its kernels compute with
// nondeterministic atomics and that have no deterministic alternative: the
// list of "throw a RuntimeError when called on CUDA" in the docstring of
// torch.use_deterministic_algorithms (PyTorch 2.13). The CPU's kernels are
// deterministic and say nothing, so code that CI runs on the CPU passes and
// fails on a GPU. alert_like_cuda() makes the same call CUDA's kernel makes
// (at::globalContext().alertNotDeterministic with CUDA's name for it), so
// the message and the warn_only behaviour are PyTorch's own
// (docs/catches.md lists the operators and conditions).
//
// shuffle_like_atomics() is the other half: without deterministic mode,
// CUDA's atomic accumulations (index_add_, scatter_add_,
// index_put_(accumulate=True)) add in an order that changes from run to
// run, so their floating-point results differ between runs. Armed by
// torch.openreg.faults.shuffle_atomics(seed), it permutes the accumulated
// entries of each such call before the kernel, so a program that relies on
// one order sees different bits at each seed, as on a GPU.
#pragma once

#include <ATen/core/stack.h>

#include "aten/fallback/OpenRegOpTraits.h"

namespace openreg {

// `args`: the call's arguments. Raises c10's determinism error (or warns)
// when CUDA's kernel of this operator would, with these arguments.
void alert_like_cuda(const OpTraits& traits, c10::ArrayRef<c10::IValue> args);

// Replaces, on `stack`, the index and source of an accumulating call by the
// same entries in a random order (faults::shuffle_atomics armed, not in
// deterministic mode). Launches the permutations on the device.
void shuffle_like_atomics(const OpTraits& traits, torch::jit::Stack* stack);

}  // namespace openreg
