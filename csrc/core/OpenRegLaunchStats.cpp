#include "core/OpenRegLaunchStats.h"

#include <atomic>
#include <mutex>

namespace openreg::stats {

namespace {

std::atomic<int64_t> g_counters[kCounterCount];

struct ByOp {
  std::mutex mu;  // guards the maps
  std::map<std::string, int64_t> synchronous;
  std::map<std::string, int64_t> learned;
  std::map<std::string, int64_t> captured;
  std::map<std::string, int64_t> staged;
  std::map<std::string, int64_t> described;
  std::map<std::string, int64_t> copied;
};

ByOp& by_op() {
  static auto* maps = new ByOp();  // leaked: counted from worker threads too
  return *maps;
}

}  // namespace

void count(Counter counter) {
  g_counters[counter].fetch_add(1, std::memory_order_relaxed);
}

void count_op(Counter counter, const char* op) {
  count(counter);
  ByOp& maps = by_op();
  std::lock_guard<std::mutex> lock(maps.mu);
  std::map<std::string, int64_t>& map = counter == kLearned     ? maps.learned
                                        : counter == kCaptured  ? maps.captured
                                        : counter == kStaged    ? maps.staged
                                        : counter == kDescribed ? maps.described
                                        : counter == kCopied    ? maps.copied
                                                             : maps.synchronous;
  ++map[op];
}

Snapshot snapshot() {
  Snapshot s;
  for (int i = 0; i < kCounterCount; ++i) {
    s.counters[i] = g_counters[i].load(std::memory_order_relaxed);
  }
  ByOp& maps = by_op();
  std::lock_guard<std::mutex> lock(maps.mu);
  s.synchronous_by_op = maps.synchronous;
  s.learned_by_op = maps.learned;
  s.captured_by_op = maps.captured;
  s.staged_by_op = maps.staged;
  s.described_by_op = maps.described;
  s.copied_by_op = maps.copied;
  return s;
}

void reset() {
  for (auto& c : g_counters) {
    c.store(0, std::memory_order_relaxed);
  }
  ByOp& maps = by_op();
  std::lock_guard<std::mutex> lock(maps.mu);
  maps.synchronous.clear();
  maps.learned.clear();
  maps.captured.clear();
  maps.staged.clear();
  maps.described.clear();
  maps.copied.clear();
}

}  // namespace openreg::stats
