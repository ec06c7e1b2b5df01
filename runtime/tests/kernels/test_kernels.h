// Parameters of the test kernels (test_kernels.cpp): plain structs of
// fixed-width fields, passed to orLaunchFunction as bytes. Device and pinned
// addresses travel as uint64.
#pragma once

#include <cstddef>
#include <cstdint>

struct OrTestFill {  // or_test_fill_u32, or_test_scale_add_u32
  uint64_t dst;      // device memory, count uint32 values
  uint64_t count;
  uint32_t value;
  uint32_t pad;
};

struct OrTestProbe {  // or_test_probe
  uint64_t probe;     // any address
  uint64_t result;    // pinned host memory, one uint32
};

struct OrTestChecksumHeader {  // or_test_checksum, followed by the data
  uint64_t result;             // pinned host memory, one uint64
};

inline uint64_t or_test_fnv1a(const unsigned char* data, size_t n) {
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    hash = (hash ^ data[i]) * 1099511628211ull;
  }
  return hash;
}

struct OrTestWarn {  // or_test_warn: "warning <first + i>" for i < count
  uint32_t first;
  uint32_t count;
};

struct OrTestGate {  // or_test_gate
  uint64_t entered;  // pinned host memory, one uint32, set to 1 on entry
  uint64_t open;     // pinned host memory, one uint32, waited for
};

struct OrTestLead {   // or_test_note_lead
  uint64_t launched;  // pinned host memory, one uint32: launches returned
  uint64_t leads;     // pinned host memory, one uint32 per launch
  uint32_t index;     // this launch's number: leads[index] = launched - index
  uint32_t spin_us;   // then busy for this long
};

struct OrTestTeamThreads {  // or_test_team_threads
  uint64_t result;          // pinned host memory, one uint32: the answer
  uint32_t threads;         // what the kernel asks team_threads for
  uint32_t until_all;  // 1: asks again, up to 10 s, until it gets `threads`
};
