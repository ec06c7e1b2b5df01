// What the fallbacks share (OpenRegFallback.cpp for strided tensors,
// OpenRegLayoutFallback.cpp for sparse and nested ones).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/library.h>

#include "aten/fallback/OpenRegFallbackEntry.h"
#include "aten/fallback/OpenRegOpTraits.h"

namespace openreg {

// The engine's fallback (OpenRegFallback.cpp): the CPU kernel on the device
// memory, queued once its signature is learnt (engine().fallback).
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

class BorrowedStack;

// The global fallback for a call whose tensor arguments are borrowed
// (OpenRegBorrowedStack.h), from an unboxed entry: leaves the results on
// `stack`.
void fallback_borrowed(const c10::OperatorHandle& op, BorrowedStack& stack);

// Whether routed operators get unboxed entries (OPENREG_UNBOXED_ENTRIES=0
// turns them off, for comparison; default: on).
bool unboxed_entries_enabled();

// Registers, for `op`, an unboxed kernel that calls fallback_borrowed(),
// when its schema is one of the signatures OpenRegUnboxedEntry.cpp knows;
// returns false otherwise (the boxed fallback is registered instead).
bool register_unboxed_entry(torch::Library& library, const char* name,
                            const c10::OperatorHandle& op);

// Registers the layout fallback for every aten operator the CPU runs for a
// sparse or nested layout (OpenRegLayoutFallback.cpp); returns how many.
int route_layout_ops_to_fallback();

}  // namespace openreg
