// Work splitting for openreg's own kernels (dropout, for now).
//
// at::parallel_for splits a loop only in code compiled with OpenMP
// (ATen/Parallel-inl.h tests _OPENMP in the including file): in an extension
// built without -fopenmp it silently runs the whole range on one thread. And
// on a stream worker it would also initialise ATen's per-thread threading
// state, which slows the CPU kernels the worker runs afterwards
// (aten/OpenRegLaunch.cpp, WorkerThreads). parallel_chunks is the split without
// either: one OpenMP region on torch's own OpenMP runtime, its team the
// calling thread's OpenMP thread count, which the stream worker sets per
// kernel.
#pragma once

#include <c10/util/FunctionRef.h>

#include <cstdint>

namespace openreg {

// Calls f(first, last) on disjoint chunks covering [begin, end): one chunk
// per thread of the team, and no chunk smaller than `grain` items unless the
// range is. Runs f on the calling thread alone when one chunk is enough or
// when already inside a parallel region. An exception thrown by f is
// rethrown on the calling thread (the first one, if several threads throw).
void parallel_chunks(int64_t begin, int64_t end, int64_t grain,
                     c10::function_ref<void(int64_t, int64_t)> f);

// SIMULATOR ONLY ("team-spin" in OpenRegEngineKernels.cpp): runs an empty
// region of two threads, leaving the calling thread with an idle team of
// its own (one OpenMP thread more in the process until the thread ends its
// team with omp_pause_resource_all). Returns the team's size.
int start_idle_team();

}  // namespace openreg
