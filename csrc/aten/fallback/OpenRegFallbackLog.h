// Which operators have run through the CPU fallback, and the opt-in notice
// about it (off by default; OPENREG_FALLBACK_WARNINGS=1 or
// torch.openreg.set_fallback_warnings(True) turns it on).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <vector>

namespace openreg {

// Notes that `op` ran through the fallback (cheap after the first call of
// an operator on a thread).
void note_fallback(const c10::OperatorHandle& op, const std::string& name);

// The operators that have run through the fallback so far.
std::vector<std::string> fallback_ops();
void set_fallback_warnings(bool enabled);

}  // namespace openreg
