// Faults on demand (torch.openreg.faults, OPENREG_FAULTS): the registry of
// armed faults, and the checks the execution paths make where the real
// fault would arise. docs/faults.md.
//
//  - an allocation of the caching allocator fails (memory/): it frees its
//    cache, retries and raises torch.OutOfMemoryError, as when the device is
//    full;
//  - a kernel fails on the device (aten/OpenRegLaunch.cpp): the worker
//    reports it instead of running it, and the next synchronization raises
//    torch.AcceleratorError naming the op; a sticky one also poisons its
//    device, as CUDA's illegal-address errors do: every later launch, copy,
//    allocation and synchronization on it raises the same error;
//  - kernels start late, by seeded random amounts (a race amplifier);
//  - a collective of one rank fails or never arrives (distributed/).
// A lost device is the runtime's own state (orSimulateDeviceLoss).
//
// Every decision is made on the host at the call, in program order, so a
// fault is reproducible run after run. Thread-safety: every function may be
// called from any thread; when nothing is armed, each check is one relaxed
// atomic load.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace openreg::faults {

// Arming (each returns the fault's id, for disarm() and the report).
int64_t fail_allocation(int device, int64_t after, size_t min_bytes);
int64_t fail_kernel(std::string op, int device, int64_t after, bool sticky);
int64_t delay_kernels(int device, int64_t stream, int64_t max_us,
                      uint64_t seed);
int64_t fail_collective(std::string op, int rank, int64_t after, bool hang);
int64_t shuffle_atomics(uint64_t seed);
void disarm(int64_t id);
void disarm_all();

// One line of torch.openreg.faults.report(): what was injected, where, and
// where the user saw it ("" while pending).
struct Event {
  int64_t fault;     // the id
  std::string kind;  // "fail_allocation", ...
  int device;        // or the rank, for a collective
  std::string what;  // "aten::mm, call 3", "4194304 bytes, allocation 2", ...
  std::string surfaced;
};
std::vector<Event> report();
void clear_report();

// ---- checks, at the call sites -------------------------------------------

// True while any fault is armed (one relaxed atomic load).
bool armed();

// The caching allocator, for an allocation of `nbytes` on `device`: true if
// this one must fail (recorded in the report).
bool allocation_fails(int device, size_t nbytes);

// A kernel launch of `op` on `device` (host side, in launch order): the
// message the kernel must fail with on the device, or nothing.
std::optional<std::string> kernel_fails(int device, const std::string& op);

// How long the kernel launched now on `device`, stream id `stream`, waits
// before it runs (0: not delayed).
int64_t kernel_delay_us(int device, int64_t stream);

// A call that accumulates with atomics on CUDA (index_add_, scatter_add_,
// index_put_(accumulate=True)): true, and the seed of its permutation, while
// shuffle_atomics is armed (a new seed at each call, from the fault's).
bool shuffle_atomics_seed(uint64_t* seed);

// What a collective `op` ("allreduce", ...) of `rank` does: nothing (0), fail
// (1) or never arrive (2). The message for the report and the error.
struct CollectiveFault {
  int action = 0;
  std::string message;
};
CollectiveFault collective_fault(const std::string& op, int rank);

// What made a device unusable, which decides the error every later call
// raises: a sticky kernel error or a lost device (torch.AcceleratorError),
// or a collective that never completed (c10d's DistBackendError: the data
// on the device was never reduced, so nothing computed from it may be
// observed; ProcessGroupNCCL takes the whole process down for that reason).
enum class PoisonKind { kAccelerator, kCollective };

// Raises the sticky error of `device`, if it has one.
void check_not_poisoned(c10::DeviceIndex device);
// Makes every later call on `device` raise `message` (a sticky kernel error,
// a lost device, a failed collective). The first message stays.
void poison(int device, const std::string& message,
            PoisonKind kind = PoisonKind::kAccelerator);
// Marks the report's pending kernel faults of `device` as surfaced at
// `where` (a synchronization).
void surfaced(int device, const std::string& where);
// Marks fault `id` as surfaced at `where`.
void surfaced_fault(int64_t id, const std::string& where);
// The id of the last fault collective_fault() answered for.
int64_t last_collective_fault();

}  // namespace openreg::faults
