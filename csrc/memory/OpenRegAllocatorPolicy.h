// The caching allocator's policy: how a request is rounded, which pool and
// segment size it gets, when a cached block may serve it and when the rest
// is split off, and which PYTORCH_ALLOC_CONF options apply.
//
// The rules are CUDA's caching allocator's, built from c10's constants and
// from the options c10 parses for every accelerator
// (c10::CachingAllocator::AcceleratorAllocatorConfig, which reads
// PYTORCH_ALLOC_CONF and, deprecated, PYTORCH_CUDA_ALLOC_CONF), so memory
// statistics and options mean what a CUDA user expects:
//  - a request is rounded up to a multiple of kMinBlockSize (512 bytes), or,
//    with roundup_power2_divisions, to the next of N equal steps between the
//    powers of two around it;
//  - rounded requests up to kSmallSize (1 MiB) come from the small pool,
//    whose segments are kSmallBuffer (2 MiB); larger ones from the large
//    pool: up to kMinLargeAlloc (10 MiB) in a large_segment_size_mb segment
//    (20 MiB by default), above that in a segment of the request rounded up
//    to kRoundLarge (2 MiB);
//  - a cached block is split when the rest is worth keeping (at least
//    kMinBlockSize in the small pool, more than kSmallSize in the large one)
//    and the request is below max_split_size_mb; blocks of max_split_size_mb
//    or more ("oversize") serve only oversize requests, and only when they
//    exceed them by less than max_non_split_rounding_mb.
//
// The options are read where they apply, so a change at run time
// (c10::CachingAllocator::setAllocatorSettings) takes effect as on CUDA.
#pragma once

#include <c10/core/AllocatorConfig.h>

#include <cstddef>

namespace openreg::allocator {

using c10::CachingAllocator::kMinBlockSize;
using c10::CachingAllocator::kMinLargeAlloc;
using c10::CachingAllocator::kRoundLarge;
using c10::CachingAllocator::kSmallBuffer;
using c10::CachingAllocator::kSmallSize;
using Config = c10::CachingAllocator::AcceleratorAllocatorConfig;

// The bytes a request of `size` occupies (roundup_power2_divisions).
size_t round_size(size_t size);

// The pool of a rounded request.
inline bool is_small(size_t rounded) { return rounded <= kSmallSize; }

// The bytes of the segment made for a rounded request (large_segment_size_mb).
size_t segment_size(size_t rounded);

// A block this large is never split (max_split_size_mb; no limit by default).
inline bool is_oversize(size_t block_size) {
  return block_size >= Config::max_split_size();
}

// Whether a free block of `block_size` (the smallest large enough on the
// stream) may serve a rounded request of `size`.
bool may_reuse(size_t block_size, size_t size);

// Whether serving `size` from a block of `block_size` splits off the rest.
bool should_split(bool small_pool, size_t block_size, size_t size);

// garbage_collection_threshold: the fraction of the per-process memory
// limit above which cached blocks are reclaimed before a new segment is
// made; 0 when not set. As on CUDA it applies only once
// set_per_process_memory_fraction has been called.
inline double gc_threshold() { return Config::garbage_collection_threshold(); }

// Checks the current PYTORCH_ALLOC_CONF settings against what this allocator
// implements: options openreg cannot honour (expandable_segments:True)
// raise NotImplementedError, keys no allocator knows raise ValueError, both
// naming the option. Keys registered by another backend's allocator are
// left to it, with a warning. Cheap when the settings have not changed
// since the last successful check.
void check_settings();

}  // namespace openreg::allocator
