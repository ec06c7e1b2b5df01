// The user's interrupt (Python's Ctrl-C) during device work: the host's
// long waits give way to it, and paths that treat an operator's failure as
// "this way does not apply" let it through.
//
// The runtime calls the host wait check about every 20 ms while a host
// thread is blocked in a synchronization (openreg.h, orSetHostWaitCheck).
// The check interrupts only a wait inside an InterruptibleWait scope: a
// synchronization after which nothing of the host refers to work still
// queued (torch.openreg.synchronize(), Stream/Event.synchronize(), the wait
// before a copy to pageable memory, before a synchronous kernel). It never
// interrupts a wait that keeps host memory in use (a synchronous kernel's
// own wait, a copy's). The device's work goes on; a later synchronization
// waits for it again and reports its errors. The Python module installs
// the hooks (csrc/python/Module.cpp); without them nothing is interrupted.
// Thread-safe.
#pragma once

#include <exception>

namespace openreg {

struct InterruptHooks {
  // Called on a waiting thread inside an InterruptibleWait scope: true if the
  // user interrupted (the hook keeps the error for raise()).
  bool (*pending)() = nullptr;
  // Raises the error pending() kept (Python's KeyboardInterrupt).
  [[noreturn]] void (*raise)() = nullptr;
  // True if `e` is the user's interrupt (KeyboardInterrupt, SystemExit)
  // raised inside an operator (a meta kernel written in Python, say).
  bool (*is_interrupt)(const std::exception& e) = nullptr;
};
void set_interrupt_hooks(const InterruptHooks& hooks);

// Marks, for its scope, the waits of this thread as interruptible.
class InterruptibleWait {
 public:
  InterruptibleWait();
  ~InterruptibleWait();
  InterruptibleWait(const InterruptibleWait&) = delete;
  InterruptibleWait& operator=(const InterruptibleWait&) = delete;

 private:
  bool previous_;
};

// The runtime's host wait check (orSetHostWaitCheck); installed at init.
int host_wait_check();
// Whether the check interrupted a wait of this thread since the last call
// (clears it): the wait's caller then raises the interrupt, also when the
// awaited work finished at the same moment.
bool take_kept_interrupt();
// After a wait returned orErrorInterrupted: raises the user's interrupt.
[[noreturn]] void raise_interrupt();
// True if `e` is the user's interrupt: a catch that turns an operator's
// failure into "not this way" rethrows it instead.
bool is_interrupt(const std::exception& e);

}  // namespace openreg
