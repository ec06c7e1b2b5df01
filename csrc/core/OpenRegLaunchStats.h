// Launch statistics: how the PyTorch layer ran the operators of a stretch
// of code (queued on a stream, run synchronously, run synchronously to learn
// a signature) and how often the host waited for a device. For finding
// where time goes in a real loop (benchmarks/bench_loops.py --breakdown),
// read from Python as torch.openreg._launch_stats(). Counting costs one
// relaxed atomic increment per event; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace openreg::stats {

enum Counter : int {
  kQueued = 0,       // operator calls queued on a stream (the fallback's and
                     // the direct binary path's)
  kSynchronous = 1,  // fallback calls run synchronously (data-dependent, ...)
  kLearned = 2,      // synchronous first runs of a signature
  kLaunches = 3,     // tasks launched on streams (kernels, copies, fills)
  kHostWaits = 4,    // host waits for a stream, device or event
  kCaptured = 5,     // queued calls captured as host objects, not as bytes
  kStaged = 6,       // host kernels run staged (a driver of named kernels)
  kDescribed = 7,    // synchronous calls the device ran and described
  kCopied = 8,       // queued calls whose kernel computes its results into
                     // temporaries and copies them into the device results
                     // (no out= variant writes them in place)
  kHostCopied = 9,   // fallback calls run by the copying fallback
                     // (OPENREG_FALLBACK=copy: arguments copied to the host)
  kCounterCount = 10,
};

void count(Counter counter);
// count() plus the operator's name, for kSynchronous, kLearned, kCaptured,
// kStaged, kDescribed and kCopied.
void count_op(Counter counter, const char* op);

struct Snapshot {
  int64_t counters[kCounterCount] = {};
  std::map<std::string, int64_t> synchronous_by_op;
  std::map<std::string, int64_t> learned_by_op;
  std::map<std::string, int64_t> captured_by_op;
  std::map<std::string, int64_t> staged_by_op;
  std::map<std::string, int64_t> described_by_op;
  std::map<std::string, int64_t> copied_by_op;
};
Snapshot snapshot();
void reset();

}  // namespace openreg::stats
