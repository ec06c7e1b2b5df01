// The copying fallback (OpenRegCopyingFallback.cpp): arguments copied to the
// host through the runtime's copies, PyTorch's CPU kernel run there, written
// arguments and results copied back. The fallback of a device whose memory
// the host cannot map, and the one a port starts from.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace openreg {

// Runs `op` on the arguments at the top of `stack` by copying, leaving its
// results there.
void copying_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// copy_(dst, src) through the host, for copies that are more than bytes
// (dtype conversion, strides, broadcasting) without an engine: device sides
// copied to the host, PyTorch's CPU copy there, dst's storage copied back.
void copy_through_host(const at::Tensor& src, const at::Tensor& dst);

// Whether OPENREG_FALLBACK=copy asked for it in place of the simulator's
// engine (read once; any value but "engine", "copy" or empty is refused).
bool copying_fallback_selected();

}  // namespace openreg
