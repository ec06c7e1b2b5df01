#include "core/OpenRegInterrupt.h"

#include <c10/util/Exception.h>

#include <atomic>

namespace openreg {

namespace {

std::atomic<bool (*)()> g_pending{nullptr};
std::atomic<void (*)()> g_raise{nullptr};
std::atomic<bool (*)(const std::exception&)> g_is_interrupt{nullptr};
thread_local bool t_interruptible = false;
// The check said "interrupted" and the hook kept the error: raised after the
// wait, even when the wait ended anyway at the same moment.
thread_local bool t_interrupt_kept = false;

}  // namespace

void set_interrupt_hooks(const InterruptHooks& hooks) {
  g_is_interrupt.store(hooks.is_interrupt, std::memory_order_release);
  g_raise.store(hooks.raise, std::memory_order_release);
  g_pending.store(hooks.pending, std::memory_order_release);
}

InterruptibleWait::InterruptibleWait() : previous_(t_interruptible) {
  t_interruptible = true;
}

InterruptibleWait::~InterruptibleWait() { t_interruptible = previous_; }

int host_wait_check() {
  if (!t_interruptible) {
    return 0;
  }
  bool (*pending)() = g_pending.load(std::memory_order_acquire);
  if (pending == nullptr || !pending()) {
    return 0;
  }
  t_interrupt_kept = true;
  return 1;
}

bool take_kept_interrupt() {
  const bool kept = t_interrupt_kept;
  t_interrupt_kept = false;
  return kept;
}

void raise_interrupt() {
  if (void (*raise)() = g_raise.load(std::memory_order_acquire)) {
    raise();
  }
  TORCH_INTERNAL_ASSERT(false,
                        "openreg: a host wait was interrupted, but no "
                        "interrupt hook is installed");
}

bool is_interrupt(const std::exception& e) {
  bool (*test)(const std::exception&) =
      g_is_interrupt.load(std::memory_order_acquire);
  return test != nullptr && test(e);
}

}  // namespace openreg
