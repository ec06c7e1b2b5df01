#include "core/OpenRegFaults.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <sstream>
#include <utility>

namespace openreg::faults {

namespace {

struct Fault {
  int64_t id;
  enum Kind { kAllocation, kKernel, kDelay, kCollective, kShuffle } kind;
  int device = -1;      // -1: any (delays); the rank for a collective
  int64_t stream = -1;  // delays: -1 any
  std::string op;       // kernels, collectives
  int64_t after = 0;    // matching events to let pass first
  size_t min_bytes = 0;
  bool sticky = false;
  bool hang = false;
  int64_t max_us = 0;
  uint64_t seed = 0;
  int64_t seen = 0;  // matching events so far
};

std::mutex g_mu;  // guards everything below
std::vector<Fault> g_faults;
std::vector<Event> g_events;
int64_t g_next_id = 1;
int64_t g_last_collective = 0;
// Any fault armed (fast path), and the devices poisoned by a sticky error.
std::atomic<bool> g_armed{false};
std::atomic<uint32_t> g_poisoned{0};
std::string g_poison_message[32];  // per device, set once before the bit
PoisonKind g_poison_kind[32];      // likewise

void update_armed() { g_armed.store(!g_faults.empty()); }

int64_t arm(Fault f) {
  std::lock_guard<std::mutex> lock(g_mu);
  f.id = g_next_id++;
  g_faults.push_back(std::move(f));
  update_armed();
  return g_faults.back().id;
}

// splitmix64: the seeded sequence of a delay fault.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

const char* kind_name(Fault::Kind k) {
  switch (k) {
    case Fault::kAllocation:
      return "fail_allocation";
    case Fault::kKernel:
      return "fail_kernel";
    case Fault::kDelay:
      return "delay_kernels";
    case Fault::kCollective:
      return "fail_collective";
    case Fault::kShuffle:
      return "shuffle_atomics";
  }
  return "?";
}

void poison_locked(int device, const std::string& message,
                   PoisonKind kind = PoisonKind::kAccelerator) {
  if (device < 0 || device >= 32 || (g_poisoned.load() & (1u << device)) != 0) {
    return;
  }
  g_poison_message[device] = message;
  g_poison_kind[device] = kind;
  g_poisoned.fetch_or(1u << device, std::memory_order_release);
}

// Takes a one-shot fault out once it fired.
void fired(std::vector<Fault>::iterator it) {
  g_faults.erase(it);
  update_armed();
}

}  // namespace

int64_t fail_allocation(int device, int64_t after, size_t min_bytes) {
  TORCH_CHECK(device >= 0 && after >= 0, "fail_allocation: device ", device,
              " and after ", after, " must not be negative");
  Fault f{};
  f.kind = Fault::kAllocation;
  f.device = device;
  f.after = after;
  f.min_bytes = min_bytes;
  return arm(std::move(f));
}

int64_t fail_kernel(std::string op, int device, int64_t after, bool sticky) {
  TORCH_CHECK(device >= 0 && after >= 0, "fail_kernel: device ", device,
              " and after ", after, " must not be negative");
  TORCH_CHECK(!op.empty(), "fail_kernel: op must name an operator");
  Fault f{};
  f.kind = Fault::kKernel;
  f.device = device;
  f.op = std::move(op);
  f.after = after;
  f.sticky = sticky;
  return arm(std::move(f));
}

int64_t delay_kernels(int device, int64_t stream, int64_t max_us,
                      uint64_t seed) {
  TORCH_CHECK(max_us > 0 && max_us <= 10'000'000, "delay_kernels: max_us ",
              max_us, " must be in [1, 10000000]");
  Fault f{};
  f.kind = Fault::kDelay;
  f.device = device;
  f.stream = stream;
  f.max_us = max_us;
  f.seed = seed;
  return arm(std::move(f));
}

int64_t fail_collective(std::string op, int rank, int64_t after, bool hang) {
  TORCH_CHECK(rank >= 0 && after >= 0, "fail_collective: rank ", rank,
              " and after ", after, " must not be negative");
  Fault f{};
  f.kind = Fault::kCollective;
  f.device = rank;
  f.op = std::move(op);
  f.after = after;
  f.hang = hang;
  return arm(std::move(f));
}

void disarm(int64_t id) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto it = g_faults.begin(); it != g_faults.end(); ++it) {
    if (it->id == id) {
      g_faults.erase(it);
      break;
    }
  }
  update_armed();
}

void disarm_all() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_faults.clear();
  update_armed();
}

std::vector<Event> report() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_events;
}

void clear_report() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_events.clear();
}

bool allocation_fails(int device, size_t nbytes) {
  if (!g_armed.load(std::memory_order_relaxed)) {
    return false;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto it = g_faults.begin(); it != g_faults.end(); ++it) {
    if (it->kind != Fault::kAllocation || it->device != device ||
        nbytes < it->min_bytes || it->seen++ < it->after) {
      continue;
    }
    std::ostringstream what;
    what << nbytes << " bytes, matching allocation " << it->seen;
    g_events.push_back({it->id, "fail_allocation", device, what.str(),
                        "torch.OutOfMemoryError at the allocation"});
    fired(it);
    return true;
  }
  return false;
}

std::optional<std::string> kernel_fails(int device, const std::string& op) {
  if (!g_armed.load(std::memory_order_relaxed)) {
    return std::nullopt;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto it = g_faults.begin(); it != g_faults.end(); ++it) {
    if (it->kind != Fault::kKernel || it->device != device || it->op != op ||
        it->seen++ < it->after) {
      continue;
    }
    std::ostringstream msg;
    msg << (it->sticky ? "an illegal memory access" : "a launch failure")
        << " was injected into kernel '" << op << "' on openreg:" << device
        << " (torch.openreg.faults.fail_kernel"
        << (it->sticky ? ", sticky: the device stays unusable" : "") << ")";
    std::ostringstream what;
    what << op << ", matching launch " << it->seen
         << (it->sticky ? ", sticky" : "");
    g_events.push_back({it->id, "fail_kernel", device, what.str(), ""});
    if (it->sticky) {
      poison_locked(device, "openreg:" + std::to_string(device) +
                                " is unusable after " + msg.str() +
                                "; every later call on it fails, as on CUDA "
                                "after an illegal memory access");
    }
    fired(it);
    return msg.str();
  }
  return std::nullopt;
}

int64_t kernel_delay_us(int device, int64_t stream) {
  if (!g_armed.load(std::memory_order_relaxed)) {
    return 0;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  int64_t delay = 0;
  for (Fault& f : g_faults) {
    if (f.kind != Fault::kDelay || (f.device >= 0 && f.device != device) ||
        (f.stream >= 0 && f.stream != stream)) {
      continue;
    }
    const uint64_t r = mix(f.seed ^ mix(static_cast<uint64_t>(f.seen++)));
    delay = std::max(
        delay, static_cast<int64_t>(r % static_cast<uint64_t>(f.max_us + 1)));
  }
  return delay;
}

bool armed() { return g_armed.load(std::memory_order_relaxed); }

int64_t shuffle_atomics(uint64_t seed) {
  Fault f{};
  f.kind = Fault::kShuffle;
  f.seed = seed;
  return arm(std::move(f));
}

bool shuffle_atomics_seed(uint64_t* seed) {
  if (!g_armed.load(std::memory_order_relaxed)) {
    return false;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  for (Fault& f : g_faults) {
    if (f.kind == Fault::kShuffle) {
      *seed = mix(f.seed ^ mix(static_cast<uint64_t>(f.seen++)));
      return true;
    }
  }
  return false;
}

CollectiveFault collective_fault(const std::string& op, int rank) {
  CollectiveFault out;
  if (!g_armed.load(std::memory_order_relaxed)) {
    return out;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto it = g_faults.begin(); it != g_faults.end(); ++it) {
    if (it->kind != Fault::kCollective || it->device != rank || it->op != op ||
        it->seen++ < it->after) {
      continue;
    }
    out.action = it->hang ? 2 : 1;
    std::ostringstream msg;
    msg << "orccl " << op << " on rank " << rank
        << (it->hang ? " never arrived" : " failed")
        << " (injected by torch.openreg.faults.fail_collective)";
    out.message = msg.str();
    std::ostringstream what;
    what << op << ", matching call " << it->seen << (it->hang ? ", hang" : "");
    g_events.push_back({it->id, "fail_collective", rank, what.str(), ""});
    g_last_collective = it->id;
    fired(it);
    return out;
  }
  return out;
}

int64_t last_collective_fault() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_last_collective;
}

void check_not_poisoned(c10::DeviceIndex device) {
  const uint32_t poisoned = g_poisoned.load(std::memory_order_acquire);
  if (C10_LIKELY(poisoned == 0) || device < 0 || device >= 32 ||
      (poisoned & (1u << device)) == 0) {
    return;
  }
  std::string message;
  PoisonKind kind;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    message = g_poison_message[device];
    kind = g_poison_kind[device];
  }
  if (kind == PoisonKind::kCollective) {
    throw c10::DistBackendError({__func__, __FILE__, __LINE__}, message);
  }
  throw c10::AcceleratorError({__func__, __FILE__, __LINE__}, 700, message);
}

void poison(int device, const std::string& message, PoisonKind kind) {
  std::lock_guard<std::mutex> lock(g_mu);
  poison_locked(device, message, kind);
}

void surfaced(int device, const std::string& where) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (Event& e : g_events) {
    if (e.kind == "fail_kernel" && e.device == device && e.surfaced.empty()) {
      e.surfaced = where;
    }
  }
}

void surfaced_fault(int64_t id, const std::string& where) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (Event& e : g_events) {
    if (e.fault == id && e.surfaced.empty()) {
      e.surfaced = where;
    }
  }
}

}  // namespace openreg::faults
