// A kernel library for the runtime's tests (openreg.h, "Named kernels"):
// each function is an orDeviceKernelFn. It does not link against any
// driver; everything device-side comes through orKernelContext. A vendor
// running the contract tests on real hardware builds these few kernels for
// their device and passes the result as OPENREG_TEST_KERNELS.
//
// Parameters are plain structs of fixed-width fields, written by the tests
// (tests/test_util.h has the same structs).
#include "kernels/test_kernels.h"

#include <openreg.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {

template <typename T>
T* at(orKernelContext* ctx, uint64_t device_ptr) {
  return static_cast<T*>(
      ctx->translate(ctx, reinterpret_cast<const void*>(device_ptr)));
}

}  // namespace

extern "C" {

// dst[i] = value for i < count.
__attribute__((visibility("default"))) int or_test_fill_u32(
    const void* params, size_t bytes, orKernelContext* ctx) {
  if (bytes != sizeof(OrTestFill)) {
    ctx->report_error(ctx, "or_test_fill_u32: wrong parameter size");
    return 1;
  }
  OrTestFill p;
  std::memcpy(&p, params, sizeof(p));
  auto* dst = at<uint32_t>(ctx, p.dst);
  if (dst == nullptr) {
    ctx->report_error(ctx, "or_test_fill_u32: dst is not device memory");
    return 1;
  }
  for (uint64_t i = 0; i < p.count; ++i) {
    dst[i] = p.value;
  }
  return 0;
}

// dst[i] = dst[i] * 2 + value: the order of two launches shows in the result.
__attribute__((visibility("default"))) int or_test_scale_add_u32(
    const void* params, size_t bytes, orKernelContext* ctx) {
  if (bytes != sizeof(OrTestFill)) {
    return 1;
  }
  OrTestFill p;
  std::memcpy(&p, params, sizeof(p));
  auto* dst = at<uint32_t>(ctx, p.dst);
  if (dst == nullptr) {
    return 1;
  }
  for (uint64_t i = 0; i < p.count; ++i) {
    dst[i] = dst[i] * 2 + p.value;
  }
  return 0;
}

// Writes into the pinned word `result` what the kernel sees of the device:
// bit 0 set if translate(probe) is not NULL, bits 8.. the device index.
__attribute__((visibility("default"))) int or_test_probe(const void* params,
                                                         size_t bytes,
                                                         orKernelContext* ctx) {
  if (bytes != sizeof(OrTestProbe)) {
    return 1;
  }
  OrTestProbe p;
  std::memcpy(&p, params, sizeof(p));
  auto* result = at<uint32_t>(ctx, p.result);
  if (result == nullptr) {
    return 1;
  }
  const bool reachable =
      ctx->translate(ctx, reinterpret_cast<const void*>(p.probe)) != nullptr;
  *result = (reachable ? 1u : 0u) | (static_cast<uint32_t>(ctx->device) << 8);
  return 0;
}

// Writes the FNV-1a hash of the bytes after the header to the pinned
// uint64 `result`: every parameter byte arrived, in order.
__attribute__((visibility("default"))) int or_test_checksum(
    const void* params, size_t bytes, orKernelContext* ctx) {
  if (bytes < sizeof(OrTestChecksumHeader)) {
    return 1;
  }
  OrTestChecksumHeader h;
  std::memcpy(&h, params, sizeof(h));
  auto* result = at<uint64_t>(ctx, h.result);
  if (result == nullptr) {
    return 1;
  }
  *result = or_test_fnv1a(static_cast<const unsigned char*>(params) + sizeof(h),
                          bytes - sizeof(h));
  return 0;
}

// Fails with the parameter bytes as its message (NUL-terminated text);
// without parameters it only describes what it was doing.
__attribute__((visibility("default"))) int or_test_fail(const void* params,
                                                        size_t bytes,
                                                        orKernelContext* ctx) {
  ctx->describe(ctx, "step 3 of 5");
  if (bytes > 0) {
    ctx->report_error(ctx, static_cast<const char*>(params));
  }
  return 7;
}

// Sets the pinned word `entered` to 1, then waits until the pinned word
// `open` is nonzero: a test holds a stream busy without timing assumptions.
// Pinned memory is shared with the device, so this works whether the device
// runs in the test's process or in its own.
__attribute__((visibility("default"))) int or_test_gate(const void* params,
                                                        size_t bytes,
                                                        orKernelContext* ctx) {
  if (bytes != sizeof(OrTestGate)) {
    return 1;
  }
  OrTestGate p;
  std::memcpy(&p, params, sizeof(p));
  auto* entered = at<uint32_t>(ctx, p.entered);
  auto* open = at<uint32_t>(ctx, p.open);
  if (entered == nullptr || open == nullptr) {
    return 1;
  }
  reinterpret_cast<std::atomic<uint32_t>*>(entered)->store(
      1, std::memory_order_release);
  while (reinterpret_cast<std::atomic<uint32_t>*>(open)->load(
             std::memory_order_acquire) == 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return 0;
}

// How far ahead of the device the host is when this launch runs: the
// launches the host has made (a pinned word it counts) minus this one's
// number, written to leads[index]; then busy for spin_us, so that the host
// outpaces the device.
__attribute__((visibility("default"))) int or_test_note_lead(
    const void* params, size_t bytes, orKernelContext* ctx) {
  if (bytes != sizeof(OrTestLead)) {
    return 1;
  }
  OrTestLead p;
  std::memcpy(&p, params, sizeof(p));
  auto* launched = at<uint32_t>(ctx, p.launched);
  auto* leads = at<uint32_t>(ctx, p.leads);
  if (launched == nullptr || leads == nullptr) {
    return 1;
  }
  const uint32_t now = reinterpret_cast<std::atomic<uint32_t>*>(launched)->load(
      std::memory_order_acquire);
  leads[p.index] = now - p.index;
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::microseconds(p.spin_us);
  while (std::chrono::steady_clock::now() < until) {
  }
  return 0;
}

// Writes orKernelContext::team_threads(threads) to the pinned word
// `result`, at once or (until_all) once it answers `threads`.
__attribute__((visibility("default"))) int or_test_team_threads(
    const void* params, size_t bytes, orKernelContext* ctx) {
  if (bytes != sizeof(OrTestTeamThreads) || ctx->version < 4) {
    ctx->report_error(ctx, "or_test_team_threads: wrong parameters or context");
    return 1;
  }
  OrTestTeamThreads p;
  std::memcpy(&p, params, sizeof(p));
  auto* result = at<uint32_t>(ctx, p.result);
  if (result == nullptr) {
    return 1;
  }
  const int threads = static_cast<int>(p.threads);
  int answer = ctx->team_threads(ctx, threads);
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (p.until_all != 0 && answer != threads &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    answer = ctx->team_threads(ctx, threads);
  }
  reinterpret_cast<std::atomic<uint32_t>*>(result)->store(
      static_cast<uint32_t>(answer), std::memory_order_release);
  return 0;
}

// A kernel that faults: it writes through a null pointer. On a device with
// its own process that process dies and the device is lost; the thread
// driver would take the whole program down, so tests launch it only on a
// process driver.
__attribute__((visibility("default"))) int or_test_segfault(
    const void* params, size_t bytes, orKernelContext* ctx) {
  (void)params;
  (void)bytes;
  ctx->describe(ctx, "writing through a null pointer");
  volatile uint32_t* null_word = nullptr;
  *null_word = 1;
  return 0;
}

// Gives the host warnings (orKernelContext::warn), then succeeds.
__attribute__((visibility("default"))) int or_test_warn(const void* params,
                                                        size_t bytes,
                                                        orKernelContext* ctx) {
  if (bytes != sizeof(OrTestWarn) || ctx->version < 3) {
    ctx->report_error(ctx, "or_test_warn: wrong parameters or context");
    return 1;
  }
  OrTestWarn p;
  std::memcpy(&p, params, sizeof(p));
  for (uint32_t i = 0; i < p.count; ++i) {
    char text[32];
    std::snprintf(text, sizeof(text), "warning %u", p.first + i);
    ctx->warn(ctx, text);
  }
  return 0;
}

// A kernel that aborts (an assertion failing in device code).
__attribute__((visibility("default"))) int or_test_abort(const void* params,
                                                         size_t bytes,
                                                         orKernelContext* ctx) {
  (void)params;
  (void)bytes;
  (void)ctx;
  std::abort();
}

}  // extern "C"
