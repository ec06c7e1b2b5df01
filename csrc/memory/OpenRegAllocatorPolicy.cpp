#include "memory/OpenRegAllocatorPolicy.h"

#include <c10/util/Exception.h>
#include <c10/util/llvmMathExtras.h>

#include <mutex>
#include <string>
#include <string_view>

namespace openreg::allocator {

namespace {

size_t round_up(size_t n, size_t unit) { return (n + unit - 1) / unit * unit; }

// The next of `divisions` equal steps between the powers of two around
// `size`: 1200 bytes in 4 divisions of [1024, 2048) is 1280.
size_t round_to_power2_division(size_t size, size_t divisions) {
  if (c10::llvm::isPowerOf2_64(size)) {
    return size;
  }
  // c10 accepts only powers of two as divisions, and round_size() calls
  // this only for size > kMinBlockSize * divisions: the step is a power of
  // two of at least kMinBlockSize.
  const size_t step = c10::llvm::PowerOf2Floor(size) / divisions;
  return round_up(size, step);
}

// [doc:allocator-options]
// The PYTORCH_ALLOC_CONF keys this allocator honours. The pinned_* options
// are honoured by PyTorch's caching host allocator, which the pinned
// allocator (OpenRegAllocator.cpp) is.
constexpr std::string_view kHonoured[] = {
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "large_segment_size_mb",
    "pinned_use_background_threads",
    "pinned_max_round_threshold_mb",
    "pinned_max_cached_size_mb",
};

// Keys c10 parses for every accelerator that this allocator cannot honour
// when enabled, and why.
struct Unsupported {
  std::string_view key;
  std::string_view reason;
};
constexpr Unsupported kUnsupported[] = {
    {"expandable_segments",
     "the runtime has no virtual memory to map a segment's pages into after "
     "it was created (orMalloc only); use max_split_size_mb or "
     "garbage_collection_threshold against fragmentation"},
};
// [/doc:allocator-options]

bool honoured(std::string_view key) {
  for (std::string_view k : kHonoured) {
    if (k == key) {
      return true;
    }
  }
  return false;
}

std::string joined_honoured_keys() {
  std::string out;
  for (std::string_view k : kHonoured) {
    out += out.empty() ? "" : ", ";
    out += k;
  }
  return out;
}

void check_option(const c10::CachingAllocator::ConfigTokenizer& tokens,
                  size_t key_index, size_t value_index) {
  const std::string& key = tokens[key_index];
  if (honoured(key)) {
    return;
  }
  for (const Unsupported& u : kUnsupported) {
    if (u.key == key) {
      // A boolean option set to its default (False) asks for nothing.
      TORCH_CHECK_NOT_IMPLEMENTED(
          tokens[value_index] == "False", "PYTORCH_ALLOC_CONF option ", key,
          ":", tokens[value_index], " is not supported by openreg: ", u.reason);
      return;
    }
  }
  if (Config::getKeys().count(key) != 0) {
    TORCH_WARN("PYTORCH_ALLOC_CONF option ", key,
               " belongs to another backend's allocator; openreg's allocator "
               "does not use it");
    return;
  }
  TORCH_CHECK_VALUE(false, "Unrecognized key '", key,
                    "' in PYTORCH_ALLOC_CONF; openreg's allocator honours ",
                    joined_honoured_keys());
}

}  // namespace

size_t round_size(size_t size) {
  if (size < kMinBlockSize) {
    return kMinBlockSize;
  }
  const size_t divisions = Config::roundup_power2_divisions(size);
  if (divisions > 1 && size > kMinBlockSize * divisions) {
    return round_to_power2_division(size, divisions);
  }
  return round_up(size, kMinBlockSize);
}

size_t segment_size(size_t rounded) {
  if (is_small(rounded)) {
    return kSmallBuffer;
  }
  if (rounded < kMinLargeAlloc) {
    return Config::large_segment_size();
  }
  return round_up(rounded, kRoundLarge);
}

bool may_reuse(size_t block_size, size_t size) {
  const size_t max_split = Config::max_split_size();
  if (size < max_split) {
    return block_size < max_split;  // an oversize block stays whole
  }
  // block_size >= size: the block was found by a lower bound on size.
  return block_size - size < Config::max_non_split_rounding_size();
}

bool should_split(bool small_pool, size_t block_size, size_t size) {
  const size_t rest = block_size - size;
  if (small_pool) {
    return rest >= kMinBlockSize;
  }
  return size < Config::max_split_size() && rest > kSmallSize;
}

void check_settings() {
  static std::mutex mutex;
  static std::string checked;  // the last settings found valid; guarded
  const std::string settings = c10::CachingAllocator::getAllocatorSettings();
  std::lock_guard<std::mutex> lock(mutex);
  if (settings == checked) {
    return;
  }
  // c10 has parsed these settings already, so their syntax is valid.
  const c10::CachingAllocator::ConfigTokenizer tokens(settings);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const size_t key = i;
    i = tokens.skipKey(i);  // the value, or the ']' closing a list
    check_option(tokens, key, key + 2);
    if (i + 1 < tokens.size()) {
      tokens.checkToken(++i, ",");
    }
  }
  checked = settings;
}

}  // namespace openreg::allocator
