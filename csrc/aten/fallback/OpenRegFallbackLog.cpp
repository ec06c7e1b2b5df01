#include "aten/fallback/OpenRegFallbackLog.h"

#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

namespace openreg {

namespace {

class FallbackLog {
 public:
  void note(const c10::OperatorHandle& op, const std::string& name) {
    // Fast path without a lock: this thread has seen the operator already.
    thread_local ska::flat_hash_set<const void*> seen_here;
    if (!seen_here.insert(&op.schema()).second) {
      return;
    }
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      first = names_.insert(name).second;
    }
    if (first && warn_.load()) {
      TORCH_WARN("openreg: ", name,
                 " has no openreg kernel; it runs PyTorch's CPU kernel on the "
                 "device memory (the CPU fallback). Turn this notice off with "
                 "torch.openreg.set_fallback_warnings(False).");
    }
  }

  std::vector<std::string> names() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {names_.begin(), names_.end()};
  }

  void set_warnings(bool enabled) { warn_.store(enabled); }

 private:
  std::mutex mutex_;  // guards names_
  std::set<std::string> names_;
  std::atomic<bool> warn_{[] {
    const char* env = std::getenv("OPENREG_FALLBACK_WARNINGS");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }()};
};

FallbackLog& log() {
  static auto* log = new FallbackLog();  // leaked: used until exit
  return *log;
}

}  // namespace

void note_fallback(const c10::OperatorHandle& op, const std::string& name) {
  log().note(op, name);
}

std::vector<std::string> fallback_ops() { return log().names(); }

void set_fallback_warnings(bool enabled) { log().set_warnings(enabled); }

}  // namespace openreg
