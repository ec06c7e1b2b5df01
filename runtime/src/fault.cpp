// Diagnoses host accesses to device memory. The device view of every arena is
// PROT_NONE, so such an access raises SIGSEGV; this handler says which device
// and offset were touched, then hands the signal to the previous handler (or
// the default action), so the process still dies as it would on hardware.
#include <signal.h>
#include <unistd.h>

#include <cstring>

#include "runtime_internal.h"

namespace openreg_rt {

namespace {

struct sigaction g_old_segv;
struct sigaction g_old_bus;
// Set once before the handler is installed; never freed.
const Runtime* g_runtime = nullptr;

// Async-signal-safe output helpers (no stdio in a signal handler).
void put(const char* s) {
  ssize_t ignored = write(STDERR_FILENO, s, std::strlen(s));
  (void)ignored;
}

void put_number(uint64_t v, int base) {
  char buf[32];
  int i = sizeof(buf);
  buf[--i] = '\0';
  do {
    buf[--i] = "0123456789abcdef"[v % static_cast<uint64_t>(base)];
    v /= static_cast<uint64_t>(base);
  } while (v != 0 && i > 0);
  if (base == 16) {
    put("0x");
  }
  put(buf + i);
}

void chain(int sig, siginfo_t* info, void* context) {
  struct sigaction* old = sig == SIGBUS ? &g_old_bus : &g_old_segv;
  if ((old->sa_flags & SA_SIGINFO) != 0 && old->sa_sigaction != nullptr) {
    old->sa_sigaction(sig, info, context);
    return;
  }
  if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
    old->sa_handler(sig);
    return;
  }
  // Default action: reinstall it and return; the faulting instruction runs
  // again and the process terminates with the original signal.
  signal(sig, SIG_DFL);
}

void on_fault(int sig, siginfo_t* info, void* context) {
  const void* addr = info->si_addr;
  // Devices are immutable after initialisation, so reading them here is safe.
  Device* dev = nullptr;
  for (auto& d : g_runtime->devices) {
    if (d->contains(addr)) {
      dev = d.get();
      break;
    }
  }
  DeviceRange imported;
  if (dev == nullptr && find_imported(addr, &imported)) {
    dev = imported.dev;
  }
  if (dev != nullptr) {
    put("\nopenreg: host code accessed device memory at ");
    put_number(reinterpret_cast<uint64_t>(addr), 16);
    put(" (device ");
    put_number(static_cast<uint64_t>(dev->index), 10);
    if (imported.imported) {
      put(", memory imported from process ");
      put_number(static_cast<uint64_t>(imported.owner_pid), 10);
      put(", offset ");
      put_number(static_cast<uint64_t>(static_cast<const char*>(addr) -
                                       imported.device_base),
                 16);
      put(" in the allocation");
    } else {
      put(", offset ");
      put_number(static_cast<uint64_t>(static_cast<const char*>(addr) -
                                       dev->device_base),
                 16);
    }
    put(").\nopenreg: device memory cannot be read or written by the host; "
        "copy the tensor to the CPU first (tensor.cpu()), or run the "
        "operation on the device.\n");
  }
  chain(sig, info, context);
}

}  // namespace

void install_fault_handler(const Runtime* rt) {
  g_runtime = rt;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_old_segv);
  sigaction(SIGBUS, &sa, &g_old_bus);
}

}  // namespace openreg_rt
