// What a launch, a round trip and a copy cost through openreg.h, with
// whichever driver OPENREG_DRIVER selects. Prints one JSON object; run by
// benchmarks/bench_runtime.py once per driver, each in a fresh process.
//
//   openreg_launch_bench [KERNEL_LIBRARY]
#include <openreg.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

void check(orError_t err, const char* what) {
  if (err != orSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, orGetErrorName(err));
    std::exit(1);
  }
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const char* library = argc > 1 ? argv[1] : OPENREG_TEST_KERNELS_DEFAULT;
  orModule_t module = nullptr;
  check(orModuleLoad(&module, library), "orModuleLoad");
  orFunction_t fill = nullptr;
  check(orModuleGetFunction(&fill, module, "or_test_fill_u32"), "function");
  void* buf = nullptr;
  check(orMalloc(&buf, 4096), "orMalloc");
  struct {
    uint64_t dst, count;
    uint32_t value, pad;
  } params{reinterpret_cast<uint64_t>(buf), 1, 1, 0};
  orStream_t stream = nullptr;
  check(orStreamCreate(&stream), "orStreamCreate");
  orLaunchAttributes single{};
  single.hostThreads = 1;

  // Warm up: workers started, pages touched.
  for (int i = 0; i < 2000; ++i) {
    check(orLaunchFunction(stream, fill, &params, sizeof(params), &single),
          "launch");
  }
  check(orStreamSynchronize(stream), "sync");

  // Launches queued back to back, one synchronization at the end.
  constexpr int kLaunches = 50000;
  auto t0 = Clock::now();
  for (int i = 0; i < kLaunches; ++i) {
    check(orLaunchFunction(stream, fill, &params, sizeof(params), &single),
          "launch");
  }
  check(orStreamSynchronize(stream), "sync");
  const double launch_us = seconds_since(t0) / kLaunches * 1e6;

  // A launch and a synchronization each time (a synchronous op).
  constexpr int kRoundTrips = 5000;
  t0 = Clock::now();
  for (int i = 0; i < kRoundTrips; ++i) {
    check(orLaunchFunction(stream, fill, &params, sizeof(params), &single),
          "launch");
    check(orStreamSynchronize(stream), "sync");
  }
  const double round_trip_us = seconds_since(t0) / kRoundTrips * 1e6;

  // Event record + query, the caching allocator's per-block check.
  orEvent_t event = nullptr;
  check(orEventCreateWithFlags(&event, orEventDisableTiming), "event");
  t0 = Clock::now();
  for (int i = 0; i < kRoundTrips; ++i) {
    check(orEventRecord(event, stream), "record");
    while (orEventQuery(event) == orErrorNotReady) {
    }
  }
  const double event_us = seconds_since(t0) / kRoundTrips * 1e6;

  // 64 MB host to device and back, from pinned and from pageable memory.
  constexpr size_t kBytes = size_t{64} << 20;
  void* dev = nullptr;
  void* pinned = nullptr;
  check(orMalloc(&dev, kBytes), "orMalloc 64MB");
  check(orMallocHost(&pinned, kBytes), "orMallocHost");
  std::vector<char> pageable(kBytes, 1);
  std::memset(pinned, 1, kBytes);
  auto bandwidth = [&](void* host, orMemcpyKind kind) {
    void* dst = kind == orMemcpyHostToDevice ? dev : host;
    const void* src = kind == orMemcpyHostToDevice ? host : dev;
    check(orMemcpy(dst, src, kBytes, kind), "copy");  // warm
    double best = 1e9;
    for (int r = 0; r < 5; ++r) {
      auto t = Clock::now();
      check(orMemcpy(dst, src, kBytes, kind), "copy");
      best = std::min(best, seconds_since(t));
    }
    return kBytes / best / 1e9;
  };
  const double h2d_pinned = bandwidth(pinned, orMemcpyHostToDevice);
  const double d2h_pinned = bandwidth(pinned, orMemcpyDeviceToHost);
  const double h2d_pageable = bandwidth(pageable.data(), orMemcpyHostToDevice);
  const double d2h_pageable = bandwidth(pageable.data(), orMemcpyDeviceToHost);

  const char* driver = std::getenv("OPENREG_DRIVER");
  std::printf(
      "{\"driver\": \"%s\", \"launch_us\": %.3f, \"round_trip_us\": %.3f, "
      "\"event_us\": %.3f, \"h2d_pinned_gbs\": %.2f, \"d2h_pinned_gbs\": "
      "%.2f, \"h2d_pageable_gbs\": %.2f, \"d2h_pageable_gbs\": %.2f}\n",
      driver != nullptr ? driver : "thread", launch_us, round_trip_us, event_us,
      h2d_pinned, d2h_pinned, h2d_pageable, d2h_pageable);
  orEventDestroy(event);
  orFreeHost(pinned);
  orFree(dev);
  orFree(buf);
  orStreamDestroy(stream);
  orModuleUnload(module);
  return 0;
}
