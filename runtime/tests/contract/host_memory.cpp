// Pinned host memory: orMallocHost / orFreeHost and its pointer attributes.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "test_util.h"

namespace {

using openreg_test::DeviceBuffer;
using openreg_test::RuntimeTest;

class HostMemoryTest : public RuntimeTest {};

TEST_F(HostMemoryTest, AllocateUseAndFree) {
  const size_t n = 10000;
  void* p = reinterpret_cast<void*>(0x1);
  OR_ASSERT_OK(orMallocHost(&p, n));
  ASSERT_NE(nullptr, p);
  // Pinned memory is ordinary host memory: the host reads and writes it.
  auto* bytes = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<unsigned char>(i);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(static_cast<unsigned char>(i), bytes[i]);
  }
  OR_ASSERT_OK(orFreeHost(p));
}

TEST_F(HostMemoryTest, ZeroSizeGivesNull) {
  void* p = reinterpret_cast<void*>(0x1);
  OR_ASSERT_OK(orMallocHost(&p, 0));
  EXPECT_EQ(nullptr, p);
  OR_EXPECT_OK(orFreeHost(nullptr));  // NULL is a no-op
}

TEST_F(HostMemoryTest, NullOutPointerIsInvalidValue) {
  EXPECT_EQ(orErrorInvalidValue, orMallocHost(nullptr, 64));
  EXPECT_EQ(orErrorInvalidValue, orMallocHost(nullptr, 0));
}

TEST_F(HostMemoryTest, ImpossibleSizeIsOutOfMemory) {
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(orErrorMemoryAllocation, orMallocHost(&p, SIZE_MAX - 4096));
  EXPECT_EQ(nullptr, p);
}

TEST_F(HostMemoryTest, AttributesForStartAndInteriorPointers) {
  const size_t n = 5000;
  void* p = nullptr;
  OR_ASSERT_OK(orMallocHost(&p, n));
  for (size_t off : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, n - 1}) {
    SCOPED_TRACE(off);
    orPointerAttributes attr;
    std::memset(&attr, 0x5a, sizeof(attr));
    OR_ASSERT_OK(orPointerGetAttributes(&attr, static_cast<char*>(p) + off));
    EXPECT_EQ(orMemoryTypeHost, attr.type);
    EXPECT_EQ(-1, attr.device);
    EXPECT_EQ(p, attr.base);
    EXPECT_EQ(n, attr.size);
  }
  // Just past the requested size is not part of the allocation.
  orPointerAttributes attr;
  OR_ASSERT_OK(orPointerGetAttributes(&attr, static_cast<char*>(p) + n));
  EXPECT_NE(orMemoryTypeHost, attr.type);
  OR_ASSERT_OK(orFreeHost(p));

  // After the free the address is ordinary host memory again.
  OR_ASSERT_OK(orPointerGetAttributes(&attr, p));
  EXPECT_EQ(orMemoryTypeUnregistered, attr.type);
  EXPECT_EQ(-1, attr.device);
}

TEST_F(HostMemoryTest, DoubleFreeIsInvalidHostPointer) {
  void* p = nullptr;
  OR_ASSERT_OK(orMallocHost(&p, 256));
  OR_ASSERT_OK(orFreeHost(p));
  EXPECT_EQ(orErrorInvalidHostPointer, orFreeHost(p));
}

TEST_F(HostMemoryTest, FreeingOtherPointersIsInvalidHostPointer) {
  void* p = nullptr;
  OR_ASSERT_OK(orMallocHost(&p, 8192));
  // Interior pointer of a live pinned block.
  EXPECT_EQ(orErrorInvalidHostPointer, orFreeHost(static_cast<char*>(p) + 16));
  // Pageable host memory.
  int on_stack = 0;
  EXPECT_EQ(orErrorInvalidHostPointer, orFreeHost(&on_stack));
  void* heap = std::malloc(32);
  EXPECT_EQ(orErrorInvalidHostPointer, orFreeHost(heap));
  std::free(heap);
  // Device memory.
  {
    DeviceBuffer dev(512);
    EXPECT_EQ(orErrorInvalidHostPointer, orFreeHost(dev.get()));
  }
  // The other way round: orFree does not take pinned memory.
  EXPECT_EQ(orErrorInvalidDevicePointer, orFree(p));

  // The block survived all of that.
  orPointerAttributes attr;
  OR_ASSERT_OK(orPointerGetAttributes(&attr, p));
  EXPECT_EQ(orMemoryTypeHost, attr.type);
  EXPECT_EQ(8192u, attr.size);
  OR_ASSERT_OK(orFreeHost(p));
}

TEST_F(HostMemoryTest, CopiesThroughPinnedMemory) {
  const size_t n = 20000;
  void* in = nullptr;
  void* out = nullptr;
  OR_ASSERT_OK(orMallocHost(&in, n));
  OR_ASSERT_OK(orMallocHost(&out, n));
  for (size_t i = 0; i < n; ++i) {
    static_cast<unsigned char*>(in)[i] = static_cast<unsigned char>(i * 3);
  }
  std::memset(out, 0, n);
  {
    DeviceBuffer dev(n);
    OR_ASSERT_OK(orMemcpy(dev.get(), in, n, orMemcpyHostToDevice));
    OR_ASSERT_OK(orMemcpy(out, dev.get(), n, orMemcpyDeviceToHost));
  }
  EXPECT_EQ(0, std::memcmp(in, out, n));
  // Pinned memory is host memory for the direction check.
  EXPECT_EQ(orErrorInvalidMemcpyDirection,
            orMemcpy(out, in, n, orMemcpyDeviceToDevice));
  OR_EXPECT_OK(orMemcpy(out, in, n, orMemcpyHostToHost));
  OR_ASSERT_OK(orFreeHost(in));
  OR_ASSERT_OK(orFreeHost(out));
}

TEST_F(HostMemoryTest, ConcurrentAllocateAndFree) {
  const int kThreads = 4;
  const int kIters = 100;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        const size_t n = static_cast<size_t>(64 + 100 * ((i + t) % 5));
        void* p = nullptr;
        if (orMallocHost(&p, n) != orSuccess || p == nullptr) {
          ++failures;
          continue;
        }
        std::memset(p, t, n);
        orPointerAttributes attr;
        if (orPointerGetAttributes(&attr, static_cast<char*>(p) + n / 2) !=
                orSuccess ||
            attr.type != orMemoryTypeHost || attr.base != p || attr.size != n) {
          ++failures;
        }
        if (orFreeHost(p) != orSuccess) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(0, failures.load());
}

}  // namespace
