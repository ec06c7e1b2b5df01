// Contract: device memory — allocation, pointer attributes, memset, kernel
// pointers, the communication library's view (copies are in copy.cpp). The
// simulator's own facts (exact 512-byte accounting, best-fit placement,
// coalescing, pages returned on free) are in ../simulator/memory.cpp.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "test_util.h"

namespace {

using openreg_test::DeviceBuffer;
using openreg_test::DeviceCount;
using openreg_test::RuntimeTest;

class MemoryTest : public RuntimeTest {
 protected:
  static size_t Capacity() {
    size_t free_bytes = 0;
    size_t total = 0;
    EXPECT_EQ(orSuccess, orMemGetInfo(&free_bytes, &total));
    return total;
  }
  static size_t FreeBytes() {
    size_t free_bytes = 0;
    size_t total = 0;
    EXPECT_EQ(orSuccess, orMemGetInfo(&free_bytes, &total));
    return free_bytes;
  }
};

TEST_F(MemoryTest, MallocAndFree) {
  const size_t free_before = FreeBytes();
  void* p = reinterpret_cast<void*>(0x1);
  OR_ASSERT_OK(orMalloc(&p, 1000));
  ASSERT_NE(nullptr, p);
  EXPECT_LE(FreeBytes() + 1000, free_before);
  OR_ASSERT_OK(orFree(p));
  EXPECT_EQ(free_before, FreeBytes());
}

TEST_F(MemoryTest, ZeroSizeGivesNullAndSuccess) {
  const size_t free_before = FreeBytes();
  void* p = reinterpret_cast<void*>(0x1);
  OR_ASSERT_OK(orMalloc(&p, 0));
  EXPECT_EQ(nullptr, p);
  EXPECT_EQ(free_before, FreeBytes());
  OR_EXPECT_OK(orFree(nullptr));  // freeing NULL is a no-op
}

TEST_F(MemoryTest, NullOutPointerIsInvalidValue) {
  EXPECT_EQ(orErrorInvalidValue, orMalloc(nullptr, 16));
  EXPECT_EQ(orErrorInvalidValue, orMalloc(nullptr, 0));
}

TEST_F(MemoryTest, AllocationsAre512AlignedAndDisjoint) {
  std::vector<void*> ptrs;
  std::vector<size_t> sizes = {1, 3, 511, 512, 513, 1000, 4095, 4097, 77777};
  for (size_t n : sizes) {
    void* p = nullptr;
    OR_ASSERT_OK(orMalloc(&p, n));
    ASSERT_NE(nullptr, p);
    EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(p) % 512) << "size " << n;
    orPointerAttributes attr;
    OR_ASSERT_OK(orPointerGetAttributes(&attr, p));
    EXPECT_GE(attr.size, n);
    EXPECT_EQ(p, attr.base);
    ptrs.push_back(p);
  }
  // No two allocations overlap.
  for (size_t i = 0; i < ptrs.size(); ++i) {
    for (size_t j = 0; j < ptrs.size(); ++j) {
      if (i == j) continue;
      auto a = reinterpret_cast<uintptr_t>(ptrs[i]);
      auto b = reinterpret_cast<uintptr_t>(ptrs[j]);
      EXPECT_TRUE(a + sizes[i] <= b || b + sizes[j] <= a);
    }
  }
  for (void* p : ptrs) {
    OR_ASSERT_OK(orFree(p));
  }
}

TEST_F(MemoryTest, MoreThanCapacityIsOutOfMemory) {
  const size_t capacity = Capacity();
  const size_t free_before = FreeBytes();
  for (size_t n :
       {capacity + 1, capacity + 512, capacity * 2, SIZE_MAX, SIZE_MAX - 100}) {
    SCOPED_TRACE(n);
    void* p = reinterpret_cast<void*>(0x1);
    EXPECT_EQ(orErrorMemoryAllocation, orMalloc(&p, n));
    EXPECT_EQ(nullptr, p);
  }
  EXPECT_EQ(free_before, FreeBytes());
}

TEST_F(MemoryTest, DoubleFreeIsInvalidDevicePointer) {
  void* p = nullptr;
  OR_ASSERT_OK(orMalloc(&p, 4096));
  OR_ASSERT_OK(orFree(p));
  EXPECT_EQ(orErrorInvalidDevicePointer, orFree(p));
}

TEST_F(MemoryTest, FreeOfNonAllocationPointersFails) {
  DeviceBuffer buf(4096);
  // Interior pointer of a live block: not the start of an allocation.
  EXPECT_EQ(orErrorInvalidDevicePointer, orFree(buf.bytes() + 512));
  EXPECT_EQ(orErrorInvalidDevicePointer, orFree(buf.bytes() + 1));
  // Host pointers: stack, heap.
  int on_stack = 0;
  EXPECT_EQ(orErrorInvalidDevicePointer, orFree(&on_stack));
  void* heap = std::malloc(64);
  EXPECT_EQ(orErrorInvalidDevicePointer, orFree(heap));
  std::free(heap);
  // The live block is untouched by the failed frees.
  orPointerAttributes attr;
  OR_ASSERT_OK(orPointerGetAttributes(&attr, buf.get()));
  EXPECT_EQ(orMemoryTypeDevice, attr.type);
  EXPECT_EQ(4096u, attr.size);
}

TEST_F(MemoryTest, InteriorPointerAttributes) {
  DeviceBuffer buf(10000);
  orPointerAttributes whole;
  OR_ASSERT_OK(orPointerGetAttributes(&whole, buf.get()));
  const size_t size = whole.size;
  EXPECT_GE(size, 10000u);
  for (size_t off : {size_t{0}, size_t{1}, size_t{511}, size_t{512},
                     size_t{9999}, size - 1}) {
    SCOPED_TRACE(off);
    orPointerAttributes attr;
    std::memset(&attr, 0x5a, sizeof(attr));
    OR_ASSERT_OK(orPointerGetAttributes(&attr, buf.bytes() + off));
    EXPECT_EQ(orMemoryTypeDevice, attr.type);
    EXPECT_EQ(0, attr.device);
    EXPECT_EQ(buf.get(), attr.base);
    EXPECT_EQ(size, attr.size);
  }
}

TEST_F(MemoryTest, AttributesOfFreedOrUnallocatedDeviceAddresses) {
  void* p = nullptr;
  OR_ASSERT_OK(orMalloc(&p, 1024));
  OR_ASSERT_OK(orFree(p));
  orPointerAttributes attr;
  EXPECT_EQ(orErrorInvalidDevicePointer, orPointerGetAttributes(&attr, p));
  EXPECT_EQ(orErrorInvalidDevicePointer,
            orPointerGetAttributes(&attr, static_cast<char*>(p) + 100));
}

TEST_F(MemoryTest, AttributesOfHostPointers) {
  int on_stack = 0;
  void* heap = std::malloc(128);
  for (const void* p :
       {static_cast<const void*>(&on_stack), static_cast<const void*>(heap)}) {
    orPointerAttributes attr;
    std::memset(&attr, 0x5a, sizeof(attr));
    OR_ASSERT_OK(orPointerGetAttributes(&attr, p));
    EXPECT_EQ(orMemoryTypeUnregistered, attr.type);
    EXPECT_EQ(-1, attr.device);
  }
  std::free(heap);

  orPointerAttributes attr;
  std::memset(&attr, 0x5a, sizeof(attr));
  OR_ASSERT_OK(orPointerGetAttributes(&attr, nullptr));
  EXPECT_EQ(orMemoryTypeUnregistered, attr.type);
  EXPECT_EQ(-1, attr.device);

  EXPECT_EQ(orErrorInvalidValue, orPointerGetAttributes(nullptr, &on_stack));
}

TEST_F(MemoryTest, AllocationFollowsCurrentDevice) {
  const int count = DeviceCount();
  for (int d = 0; d < count; ++d) {
    SCOPED_TRACE(d);
    OR_ASSERT_OK(orSetDevice(d));
    void* p = nullptr;
    OR_ASSERT_OK(orMalloc(&p, 4096));
    orPointerAttributes attr;
    OR_ASSERT_OK(orPointerGetAttributes(&attr, static_cast<char*>(p) + 7));
    EXPECT_EQ(orMemoryTypeDevice, attr.type);
    EXPECT_EQ(d, attr.device);
    EXPECT_EQ(p, attr.base);
    // Freed with another device current.
    OR_ASSERT_OK(orSetDevice(0));
    OR_ASSERT_OK(orFree(p));
  }
}

TEST_F(MemoryTest, Memset) {
  const size_t n = 3000;
  DeviceBuffer dev(n);
  OR_ASSERT_OK(orMemset(dev.get(), 0x5a, n));
  OR_ASSERT_OK(orMemset(dev.bytes() + 1000, 0x100 + 0xc3, 500));  // low byte
  std::vector<unsigned char> out(n, 0);
  OR_ASSERT_OK(orMemcpy(out.data(), dev.get(), n, orMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) {
    unsigned char want = (i >= 1000 && i < 1500) ? 0xc3 : 0x5a;
    ASSERT_EQ(want, out[i]) << "byte " << i;
  }
}

TEST_F(MemoryTest, MemsetBadArguments) {
  char host[64];
  EXPECT_EQ(orErrorInvalidDevicePointer, orMemset(host, 0, sizeof(host)));
  EXPECT_EQ(orErrorInvalidValue, orMemset(nullptr, 0, 16));
  OR_EXPECT_OK(orMemset(nullptr, 0, 0));
}

struct AliasArgs {
  unsigned char* kernel_ptr;
  size_t n;
  const unsigned char* expect;  // when set, compare instead of write
  bool matched;
};

// Device code: writes a pattern through the kernel pointer, or checks that
// the kernel pointer shows `expect`.
int AliasKernel(void* arg) {
  auto* a = static_cast<AliasArgs*>(arg);
  if (a->expect != nullptr) {
    a->matched = std::memcmp(a->kernel_ptr, a->expect, a->n) == 0;
    return 0;
  }
  for (size_t i = 0; i < a->n; ++i) {
    a->kernel_ptr[i] = static_cast<unsigned char>(i * 7);
  }
  return 0;
}

TEST_F(MemoryTest, KernelPointerIsAWritableAliasOfDeviceMemory) {
  OR_REQUIRE_HOST_KERNELS();
  const size_t n = 8192;
  DeviceBuffer dev(n);
  void* kp = nullptr;
  OR_ASSERT_OK(orGetKernelPointer(&kp, dev.get()));
  ASSERT_NE(nullptr, kp);

  // Kernel-side write, read back through the driver.
  AliasArgs write{static_cast<unsigned char*>(kp), n, nullptr, false};
  OR_ASSERT_OK(orLaunchKernel(nullptr, AliasKernel, &write));
  OR_ASSERT_OK(orStreamSynchronize(nullptr));
  std::vector<unsigned char> out(n, 0);
  OR_ASSERT_OK(orMemcpy(out.data(), dev.get(), n, orMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(static_cast<unsigned char>(i * 7), out[i]) << "byte " << i;
  }

  // Driver write, kernel-side read.
  const auto src = openreg_test::BytePattern(n, 5);
  OR_ASSERT_OK(orMemcpy(dev.get(), src.data(), n, orMemcpyHostToDevice));
  AliasArgs check{static_cast<unsigned char*>(kp), n, src.data(), false};
  OR_ASSERT_OK(orLaunchKernel(nullptr, AliasKernel, &check));
  OR_ASSERT_OK(orStreamSynchronize(nullptr));
  EXPECT_TRUE(check.matched);

  // Interior pointers translate by the same offset.
  void* kp_mid = nullptr;
  OR_ASSERT_OK(orGetKernelPointer(&kp_mid, dev.bytes() + 1234));
  EXPECT_EQ(static_cast<char*>(kp) + 1234, kp_mid);
}

TEST_F(MemoryTest, KernelPointerBadArguments) {
  OR_REQUIRE_HOST_KERNELS();
  DeviceBuffer dev(512);
  EXPECT_EQ(orErrorInvalidValue, orGetKernelPointer(nullptr, dev.get()));
  int host = 0;
  void* kp = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(orErrorInvalidDevicePointer, orGetKernelPointer(&kp, &host));
  EXPECT_EQ(nullptr, kp);
  kp = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(orErrorInvalidDevicePointer, orGetKernelPointer(&kp, nullptr));
  EXPECT_EQ(nullptr, kp);
}

TEST_F(MemoryTest, ConcurrentAllocationFromManyThreads) {
  const size_t free_before = FreeBytes();
  const int kThreads = 4;
  const int kIters = 200;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<void*> mine;
      for (int i = 0; i < kIters; ++i) {
        void* p = nullptr;
        if (orMalloc(&p, static_cast<size_t>(512 * (1 + (i + t) % 7))) !=
            orSuccess) {
          ++failures;
        }
        mine.push_back(p);
        if (i % 3 == 0) {
          if (orFree(mine.front()) != orSuccess) ++failures;
          mine.erase(mine.begin());
        }
      }
      for (void* p : mine) {
        if (orFree(p) != orSuccess) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(0, failures.load());
  EXPECT_EQ(free_before, FreeBytes());
}

// orMemGetDmaPointer: the communication library's view of device memory (a
// NIC that DMAs it, as GPUDirect RDMA). A driver may not support it
// (orErrorNotSupported: collectives then stage through pinned memory); when
// it does, the view reads what copies wrote, copies read what it wrote, and
// it is not the device address itself.
TEST_F(MemoryTest, DmaPointerReadsAndWritesTheDeviceBytes) {
  const size_t n = 3 * 4096 + 100;
  DeviceBuffer buf(n);
  const std::vector<unsigned char> in = openreg_test::BytePattern(n, 3);
  OR_ASSERT_OK(orMemcpy(buf.get(), in.data(), n, orMemcpyHostToDevice));
  void* view = nullptr;
  const orError_t err = orMemGetDmaPointer(&view, buf.get(), n);
  if (err == orErrorNotSupported) {
    EXPECT_EQ(nullptr, view);
    GTEST_SKIP() << "this driver's collectives stage device memory";
  }
  OR_ASSERT_OK(err);
  ASSERT_NE(nullptr, view);
  EXPECT_NE(buf.get(), view);
  EXPECT_EQ(0, std::memcmp(view, in.data(), n));
  const std::vector<unsigned char> out = openreg_test::BytePattern(n, 4);
  std::memcpy(view, out.data(), n);
  std::vector<unsigned char> back(n);
  OR_ASSERT_OK(orMemcpy(back.data(), buf.get(), n, orMemcpyDeviceToHost));
  EXPECT_EQ(out, back);
  void* inside = nullptr;
  OR_ASSERT_OK(orMemGetDmaPointer(&inside, buf.bytes() + 4097, 100));
  EXPECT_EQ(static_cast<char*>(view) + 4097, inside);
}

TEST_F(MemoryTest, DmaPointerRefusesWhatIsNotLiveDeviceMemory) {
  DeviceBuffer buf(4096);
  EXPECT_EQ(orErrorInvalidValue, orMemGetDmaPointer(nullptr, buf.get(), 1));
  void* view = reinterpret_cast<void*>(0x1);
  int host = 0;
  EXPECT_EQ(orErrorInvalidDevicePointer,
            orMemGetDmaPointer(&view, &host, sizeof(host)));
  EXPECT_EQ(nullptr, view);
  EXPECT_EQ(orErrorInvalidDevicePointer,
            orMemGetDmaPointer(&view, buf.get(), 4096 + 1));
  void* freed = nullptr;
  OR_ASSERT_OK(orMalloc(&freed, 4096));
  OR_ASSERT_OK(orFree(freed));
  EXPECT_EQ(orErrorInvalidDevicePointer, orMemGetDmaPointer(&view, freed, 16));
}

}  // namespace
