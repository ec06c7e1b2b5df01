// Contract: copies of device memory — every direction, large and unaligned
// ranges, ranges outside an allocation, bad arguments, and copies ordered
// with the streams' work (memory.cpp has allocation and memset).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "module_fixture.h"
#include "test_util.h"

namespace {

using openreg_test::BytePattern;
using openreg_test::DeviceBuffer;
using openreg_test::Gate;
using openreg_test::RuntimeTest;
using openreg_test::StreamHandle;

using CopyTest = RuntimeTest;

TEST_F(CopyTest, MemcpyRoundTripsEveryKind) {
  const size_t n = 100000;  // not a multiple of the page or block size
  const auto src = BytePattern(n, 1);
  DeviceBuffer a(n);
  DeviceBuffer b(n);

  OR_ASSERT_OK(orMemcpy(a.get(), src.data(), n, orMemcpyHostToDevice));
  OR_ASSERT_OK(orMemcpy(b.get(), a.get(), n, orMemcpyDeviceToDevice));
  std::vector<unsigned char> out(n, 0);
  OR_ASSERT_OK(orMemcpy(out.data(), b.get(), n, orMemcpyDeviceToHost));
  EXPECT_EQ(src, out);

  std::vector<unsigned char> host_copy(n, 0);
  OR_ASSERT_OK(orMemcpy(host_copy.data(), src.data(), n, orMemcpyHostToHost));
  EXPECT_EQ(src, host_copy);

  // orMemcpyDefault infers every direction.
  const auto src2 = BytePattern(n, 2);
  OR_ASSERT_OK(orMemcpy(a.get(), src2.data(), n, orMemcpyDefault));
  OR_ASSERT_OK(orMemcpy(b.get(), a.get(), n, orMemcpyDefault));
  std::fill(out.begin(), out.end(), 0);
  OR_ASSERT_OK(orMemcpy(out.data(), b.get(), n, orMemcpyDefault));
  EXPECT_EQ(src2, out);
  std::fill(host_copy.begin(), host_copy.end(), 0);
  OR_ASSERT_OK(orMemcpy(host_copy.data(), src2.data(), n, orMemcpyDefault));
  EXPECT_EQ(src2, host_copy);
}

// Large copies (a driver may move them differently, e.g. on several
// engines) at destination and source offsets that are not aligned, of a size
// that is not a multiple of any vector width: every byte arrives, none
// around the range is touched.
TEST_F(CopyTest, LargeMemcpyAtUnalignedOffsets) {
  const size_t n = (size_t{9} << 20) + 13;
  const size_t pad = 64;
  const auto src = BytePattern(n + pad, 5);
  DeviceBuffer a(n + 2 * pad);
  DeviceBuffer b(n + 2 * pad);
  OR_ASSERT_OK(orMemset(a.get(), 0x5a, n + 2 * pad));
  OR_ASSERT_OK(orMemset(b.get(), 0xa5, n + 2 * pad));
  // Host (offset 3) to device (offset 7), device to device (offset 7 to 1).
  OR_ASSERT_OK(
      orMemcpy(a.bytes() + 7, src.data() + 3, n, orMemcpyHostToDevice));
  OR_ASSERT_OK(
      orMemcpy(b.bytes() + 1, a.bytes() + 7, n, orMemcpyDeviceToDevice));
  std::vector<unsigned char> out(n + 2 * pad, 0);
  OR_ASSERT_OK(
      orMemcpy(out.data(), b.get(), n + 2 * pad, orMemcpyDeviceToHost));
  EXPECT_EQ(0xa5, out[0]);
  EXPECT_EQ(0, std::memcmp(out.data() + 1, src.data() + 3, n));
  for (size_t i = n + 1; i < n + 2 * pad; ++i) {
    ASSERT_EQ(0xa5, out[i]) << "byte " << i << " after the copied range";
  }
  // Device to host at an unaligned host offset.
  std::vector<unsigned char> back(n + 5, 0x11);
  OR_ASSERT_OK(
      orMemcpy(back.data() + 5, a.bytes() + 7, n, orMemcpyDeviceToHost));
  EXPECT_EQ(0x11, back[4]);
  EXPECT_EQ(0, std::memcmp(back.data() + 5, src.data() + 3, n));
}

TEST_F(CopyTest, MemcpyInteriorRanges) {
  const size_t n = 4096;
  const auto src = BytePattern(n, 3);
  DeviceBuffer dev(n);
  OR_ASSERT_OK(orMemset(dev.get(), 0, n));
  // Write bytes [100, 300) only.
  OR_ASSERT_OK(
      orMemcpy(dev.bytes() + 100, src.data(), 200, orMemcpyHostToDevice));
  std::vector<unsigned char> out(n, 0xee);
  OR_ASSERT_OK(orMemcpy(out.data(), dev.get(), n, orMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) {
    unsigned char want = (i >= 100 && i < 300) ? src[i - 100] : 0;
    ASSERT_EQ(want, out[i]) << "byte " << i;
  }
  // Overlapping device-to-device copy within one allocation behaves like
  // memmove.
  OR_ASSERT_OK(orMemcpy(dev.bytes() + 150, dev.bytes() + 100, 200,
                        orMemcpyDeviceToDevice));
  OR_ASSERT_OK(
      orMemcpy(out.data(), dev.bytes() + 150, 200, orMemcpyDeviceToHost));
  EXPECT_EQ(0, std::memcmp(out.data(), src.data(), 200));
}

TEST_F(CopyTest, MemcpyAcrossDevices) {
  OR_REQUIRE_DEVICES(2);
  const size_t n = 50000;
  const auto src = BytePattern(n, 4);
  DeviceBuffer on0(n);
  OR_ASSERT_OK(orSetDevice(1));
  DeviceBuffer on1(n);
  OR_ASSERT_OK(orSetDevice(0));

  OR_ASSERT_OK(orMemcpy(on0.get(), src.data(), n, orMemcpyHostToDevice));
  OR_ASSERT_OK(orMemcpy(on1.get(), on0.get(), n, orMemcpyDeviceToDevice));
  std::vector<unsigned char> out(n, 0);
  OR_ASSERT_OK(orMemcpy(out.data(), on1.get(), n, orMemcpyDeviceToHost));
  EXPECT_EQ(src, out);

  // And back, with the direction inferred and the other device current.
  OR_ASSERT_OK(orSetDevice(1));
  OR_ASSERT_OK(orMemset(on0.get(), 0, n));
  OR_ASSERT_OK(orMemcpy(on0.get(), on1.get(), n, orMemcpyDefault));
  std::fill(out.begin(), out.end(), 0);
  OR_ASSERT_OK(orMemcpy(out.data(), on0.get(), n, orMemcpyDefault));
  EXPECT_EQ(src, out);
}

TEST_F(CopyTest, MemcpyWrongKindIsInvalidDirection) {
  DeviceBuffer dev(1024);
  DeviceBuffer dev2(1024);
  char host[1024] = {};
  char host2[1024] = {};
  struct Case {
    void* dst;
    const void* src;
    orMemcpyKind kind;
  };
  const Case kCases[] = {
      {host, host2, orMemcpyHostToDevice},
      {host, dev.get(), orMemcpyHostToDevice},
      {dev.get(), dev2.get(), orMemcpyHostToDevice},
      {host, host2, orMemcpyDeviceToHost},
      {dev.get(), host, orMemcpyDeviceToHost},
      {dev.get(), dev2.get(), orMemcpyDeviceToHost},
      {host, host2, orMemcpyDeviceToDevice},
      {dev.get(), host, orMemcpyDeviceToDevice},
      {host, dev.get(), orMemcpyDeviceToDevice},
      {dev.get(), host, orMemcpyHostToHost},
      {host, dev.get(), orMemcpyHostToHost},
      {dev.get(), dev2.get(), orMemcpyHostToHost},
      {dev.get(), host, static_cast<orMemcpyKind>(5)},
      // (C++ only allows values in the enum's range 0..7 without UB.)
      {host, host2, static_cast<orMemcpyKind>(6)},
      {dev.get(), dev2.get(), static_cast<orMemcpyKind>(7)},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(static_cast<int>(c.kind));
    EXPECT_EQ(orErrorInvalidMemcpyDirection,
              orMemcpy(c.dst, c.src, 16, c.kind));
    EXPECT_EQ(orErrorInvalidMemcpyDirection,
              orMemcpyAsync(c.dst, c.src, 16, c.kind, nullptr));
  }
}

TEST_F(CopyTest, MemcpyNullArguments) {
  DeviceBuffer dev(1024);
  char host[16] = {};
  EXPECT_EQ(orErrorInvalidValue,
            orMemcpy(nullptr, host, 16, orMemcpyHostToDevice));
  EXPECT_EQ(orErrorInvalidValue,
            orMemcpy(dev.get(), nullptr, 16, orMemcpyHostToDevice));
  EXPECT_EQ(orErrorInvalidValue,
            orMemcpyAsync(dev.get(), nullptr, 16, orMemcpyDefault, nullptr));
  // A zero-byte copy is a no-op whatever the pointers.
  OR_EXPECT_OK(orMemcpy(nullptr, nullptr, 0, orMemcpyDefault));
  OR_EXPECT_OK(orMemcpy(dev.get(), host, 0, orMemcpyHostToDevice));
  OR_EXPECT_OK(orMemcpyAsync(nullptr, nullptr, 0, orMemcpyDefault, nullptr));
}

TEST_F(CopyTest, CopyRangeOutsideAllocationIsInvalidDevicePointer) {
  std::vector<unsigned char> host(8192, 1);
  void* p = nullptr;
  OR_ASSERT_OK(orMalloc(&p, 1024));
  char* dev = static_cast<char*>(p);

  // Exactly the allocation (rounded size) is fine, one byte more is not.
  OR_EXPECT_OK(orMemcpy(dev, host.data(), 1024, orMemcpyHostToDevice));
  OR_EXPECT_OK(orMemcpy(dev + 512, host.data(), 512, orMemcpyHostToDevice));
  EXPECT_EQ(orErrorInvalidDevicePointer,
            orMemcpy(dev, host.data(), 1025, orMemcpyHostToDevice));
  EXPECT_EQ(orErrorInvalidDevicePointer,
            orMemcpy(dev + 512, host.data(), 513, orMemcpyHostToDevice));
  EXPECT_EQ(orErrorInvalidDevicePointer,
            orMemcpy(host.data(), dev + 1000, 25, orMemcpyDeviceToHost));
  EXPECT_EQ(orErrorInvalidDevicePointer,
            orMemcpy(host.data(), dev, 1025, orMemcpyDefault));
  EXPECT_EQ(
      orErrorInvalidDevicePointer,
      orMemcpyAsync(host.data(), dev, 1025, orMemcpyDeviceToHost, nullptr));
  EXPECT_EQ(orErrorInvalidDevicePointer, orMemset(dev + 1, 0, 1024));
  // A count so large that pointer + count wraps around must not pass the
  // range check.
  for (size_t huge : {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX / 2 + 1}) {
    SCOPED_TRACE(huge);
    EXPECT_EQ(orErrorInvalidDevicePointer,
              orMemcpy(host.data(), dev + 512, huge, orMemcpyDeviceToHost));
    EXPECT_EQ(orErrorInvalidDevicePointer,
              orMemcpy(dev + 512, host.data(), huge, orMemcpyHostToDevice));
    EXPECT_EQ(orErrorInvalidDevicePointer, orMemset(dev + 512, 0, huge));
  }

  // A freed allocation cannot be copied to or from.
  OR_ASSERT_OK(orFree(p));
  EXPECT_EQ(orErrorInvalidDevicePointer,
            orMemcpy(dev, host.data(), 16, orMemcpyHostToDevice));
  EXPECT_EQ(orErrorInvalidDevicePointer,
            orMemcpy(host.data(), dev, 16, orMemcpyDeviceToHost));
  EXPECT_EQ(orErrorInvalidDevicePointer, orMemset(dev, 0, 16));
}

// --- copies and streams -----------------------------------------------------

struct WriteArgs {
  void* kernel_ptr;
  int value;
  int delay_ms;
};

int DelayedWrite(void* arg) {
  auto* a = static_cast<WriteArgs*>(arg);
  std::this_thread::sleep_for(std::chrono::milliseconds(a->delay_ms));
  std::memcpy(a->kernel_ptr, &a->value, sizeof(int));
  return 0;
}

TEST_F(CopyTest, MemcpyIsOrderedAfterDefaultStreamWork) {
  OR_REQUIRE_HOST_KERNELS();
  DeviceBuffer dev(512);
  OR_ASSERT_OK(orMemset(dev.get(), 0, 512));
  WriteArgs args{nullptr, 0x1234567, 20};
  OR_ASSERT_OK(orGetKernelPointer(&args.kernel_ptr, dev.get()));
  OR_ASSERT_OK(orLaunchKernel(nullptr, DelayedWrite, &args));
  int out = 0;
  OR_ASSERT_OK(orMemcpy(&out, dev.get(), sizeof(out), orMemcpyDeviceToHost));
  EXPECT_EQ(0x1234567, out);
}

TEST_F(CopyTest, MemcpyAsyncWithPinnedMemoryIsQueued) {
  OR_REQUIRE_HOST_KERNELS();
  const size_t n = 64 * 1024;
  void* pinned_in = nullptr;
  void* pinned_out = nullptr;
  OR_ASSERT_OK(orMallocHost(&pinned_in, n));
  OR_ASSERT_OK(orMallocHost(&pinned_out, n));
  const auto src = BytePattern(n, 6);
  std::memcpy(pinned_in, src.data(), n);
  std::memset(pinned_out, 0, n);
  DeviceBuffer dev(n);
  StreamHandle stream;

  // The stream is blocked: if orMemcpyAsync waited for it, this test would
  // hang instead of reaching Open().
  Gate gate;
  OR_ASSERT_OK(orLaunchKernel(stream.get(), Gate::Kernel, &gate));
  OR_ASSERT_OK(orMemcpyAsync(dev.get(), pinned_in, n, orMemcpyHostToDevice,
                             stream.get()));
  OR_ASSERT_OK(orMemcpyAsync(pinned_out, dev.get(), n, orMemcpyDeviceToHost,
                             stream.get()));
  gate.WaitEntered();
  EXPECT_EQ(orErrorNotReady, orStreamQuery(stream.get()));
  gate.Open();
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  EXPECT_EQ(0, std::memcmp(pinned_out, src.data(), n));

  // A pinned interior range counts as pinned too; Default kind works.
  std::memset(pinned_out, 0, n);
  OR_ASSERT_OK(orMemcpyAsync(static_cast<char*>(pinned_out) + 100, dev.get(),
                             1000, orMemcpyDefault, stream.get()));
  OR_ASSERT_OK(orStreamSynchronize(stream.get()));
  EXPECT_EQ(
      0, std::memcmp(static_cast<char*>(pinned_out) + 100, src.data(), 1000));

  OR_ASSERT_OK(orFreeHost(pinned_in));
  OR_ASSERT_OK(orFreeHost(pinned_out));
}

TEST_F(CopyTest, MemcpyAsyncWithPageableMemoryWaits) {
  OR_REQUIRE_HOST_KERNELS();
  DeviceBuffer dev(512);
  WriteArgs args{nullptr, 77, 20};
  OR_ASSERT_OK(orGetKernelPointer(&args.kernel_ptr, dev.get()));
  StreamHandle stream;
  OR_ASSERT_OK(orLaunchKernel(stream.get(), DelayedWrite, &args));
  int out = 0;  // pageable: the call returns only when the copy is done
  OR_ASSERT_OK(orMemcpyAsync(&out, dev.get(), sizeof(out), orMemcpyDeviceToHost,
                             stream.get()));
  EXPECT_EQ(77, out);
  OR_EXPECT_OK(orStreamQuery(stream.get()));
}

TEST_F(CopyTest, MemcpyAsyncDeviceToDeviceOnDefaultStream) {
  const size_t n = 4096;
  const auto src = BytePattern(n, 8);
  DeviceBuffer a(n);
  DeviceBuffer b(n);
  OR_ASSERT_OK(orMemcpy(a.get(), src.data(), n, orMemcpyHostToDevice));
  OR_ASSERT_OK(
      orMemcpyAsync(b.get(), a.get(), n, orMemcpyDeviceToDevice, nullptr));
  OR_ASSERT_OK(orStreamSynchronize(nullptr));
  std::vector<unsigned char> out(n, 0);
  OR_ASSERT_OK(orMemcpy(out.data(), b.get(), n, orMemcpyDeviceToHost));
  EXPECT_EQ(src, out);
}

// --- small copies from pageable memory (named kernels: both drivers) --------

using openreg_test::GateLaunch;
using InlineCopyTest = openreg_test::ModuleTest;

// Up to OR_MAX_INLINE_COPY_BYTES, a copy from pageable memory to the device
// captures the bytes and returns without waiting for the stream: the host
// may reuse its buffer at once, and the copy runs in stream order.
TEST_F(InlineCopyTest, SmallPageableCopyToDeviceDoesNotWaitForTheStream) {
  const size_t n = OR_MAX_INLINE_COPY_BYTES;
  DeviceBuffer dev(n + 512);
  OR_ASSERT_OK(orMemset(dev.get(), 0x11, n + 512));
  StreamHandle stream;
  std::vector<unsigned char> host = BytePattern(n, 9);
  const std::vector<unsigned char> want = host;
  {
    GateLaunch gate(this, stream.get());
    gate.WaitEntered();
    // Would hang here if the call waited for the gated stream.
    OR_ASSERT_OK(orMemcpyAsync(dev.get(), host.data(), n, orMemcpyHostToDevice,
                               stream.get()));
    OR_ASSERT_OK(orMemcpyAsync(dev.bytes() + n + 3, host.data() + 5, 1,
                               orMemcpyDefault, stream.get()));
    EXPECT_EQ(orErrorNotReady, orStreamQuery(stream.get()));
    std::fill(host.begin(), host.end(), 0);  // captured at the calls
  }  // opens the gate, synchronizes the stream
  std::vector<unsigned char> out(n + 512, 0);
  OR_ASSERT_OK(orMemcpy(out.data(), dev.get(), n + 512, orMemcpyDeviceToHost));
  EXPECT_EQ(0, std::memcmp(out.data(), want.data(), n));
  EXPECT_EQ(0x11, out[n + 2]);
  EXPECT_EQ(want[5], out[n + 3]);
  EXPECT_EQ(0x11, out[n + 4]);
}

// One byte more and the copy is staged as before: the call returns only
// once the stream's earlier work and the copy are done.
TEST_F(InlineCopyTest, LargerPageableCopyToDeviceWaitsForTheStream) {
  const size_t n = OR_MAX_INLINE_COPY_BYTES + 1;
  DeviceBuffer dev(n);
  StreamHandle stream;
  const std::vector<unsigned char> host = BytePattern(n, 10);
  std::atomic<bool> returned{false};
  {
    GateLaunch gate(this, stream.get());
    gate.WaitEntered();
    std::thread copier([&] {
      EXPECT_EQ(orSuccess, orMemcpyAsync(dev.get(), host.data(), n,
                                         orMemcpyHostToDevice, stream.get()));
      returned = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(returned.load());
    gate.Open();
    copier.join();
  }
  std::vector<unsigned char> out(n, 0);
  OR_ASSERT_OK(orMemcpy(out.data(), dev.get(), n, orMemcpyDeviceToHost));
  EXPECT_EQ(host, out);
}

}  // namespace
