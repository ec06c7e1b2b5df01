// Compiled with -fopenmp (csrc/CMakeLists.txt), linked against torch's own
// libgomp: the same runtime, and the same thread pool per calling thread,
// as the CPU kernels the stream worker runs.
#include "engine/kernels/OpenRegParallel.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <exception>

namespace openreg {

void parallel_chunks(int64_t begin, int64_t end, int64_t grain,
                     c10::function_ref<void(int64_t, int64_t)> f) {
  if (begin >= end) {
    return;
  }
  const int64_t range = end - begin;
  const int64_t most = grain > 0 ? (range + grain - 1) / grain : range;
  if (most <= 1 || omp_in_parallel() || omp_get_max_threads() <= 1) {
    f(begin, end);
    return;
  }
  std::exception_ptr error;
  std::atomic_flag failed = ATOMIC_FLAG_INIT;
  // No num_threads clause: a region of the thread count the caller set keeps
  // libgomp reusing one team (ATen's invoke_parallel does the same); the
  // threads beyond `most` get no chunk.
#pragma omp parallel
  {
    const int64_t threads = std::min<int64_t>(omp_get_num_threads(), most);
    const int64_t chunk = (range + threads - 1) / threads;
    const int64_t first = begin + omp_get_thread_num() * chunk;
    if (first < end) {
      try {
        f(first, std::min(end, first + chunk));
      } catch (...) {
        if (!failed.test_and_set()) {
          error = std::current_exception();
        }
      }
    }
  }
  if (error) {
    std::rethrow_exception(error);
  }
}

int start_idle_team() {
  int team = 1;
#pragma omp parallel num_threads(2)
  {
#pragma omp master
    team = omp_get_num_threads();
  }
  return team;
}

}  // namespace openreg
