#include "memory/OpenRegMemoryHistory.h"

#include <atomic>
#include <chrono>
#include <utility>

#include "core/OpenRegKernelTask.h"

namespace openreg::allocator {

namespace {

std::atomic<bool> g_trace{false};
std::atomic<int> g_when{static_cast<int>(RecordContext::NEVER)};
std::atomic<CreateContextFn> g_recorder{nullptr};
std::atomic<size_t> g_max_entries{0};

}  // namespace

void set_history_settings(const HistorySettings& settings) {
  g_max_entries.store(settings.max_entries, std::memory_order_relaxed);
  g_when.store(static_cast<int>(settings.when), std::memory_order_relaxed);
  g_trace.store(settings.trace, std::memory_order_relaxed);
  g_recorder.store(settings.recorder, std::memory_order_release);
}

std::shared_ptr<c10::GatheredContext> gather_context(bool free) {
  const CreateContextFn recorder = g_recorder.load(std::memory_order_acquire);
  if (recorder == nullptr || worker_stream() != nullptr) {
    return nullptr;
  }
  const auto when =
      static_cast<RecordContext>(g_when.load(std::memory_order_relaxed));
  if (when == RecordContext::NEVER || (free && when != RecordContext::ALL)) {
    return nullptr;
  }
  return recorder();
}

void Trace::record(TraceEntry::Action action, c10::DeviceIndex device,
                   size_t addr, size_t size, c10::StreamId stream,
                   std::shared_ptr<c10::GatheredContext> context) {
  if (!g_trace.load(std::memory_order_relaxed)) {
    return;
  }
  const size_t max = g_max_entries.load(std::memory_order_relaxed);
  if (max == 0) {
    return;
  }
  while (entries_.size() >= max) {
    entries_.pop_front();
  }
  // Microseconds since the epoch (CUDA's snapshot reports time_us).
  const auto now = std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  entries_.emplace_back(action, device, addr, size,
                        reinterpret_cast<void*>(static_cast<intptr_t>(stream)),
                        c10::MempoolId_t{0, 0},
                        static_cast<c10::approx_time_t>(now),
                        std::move(context));
}

}  // namespace openreg::allocator
