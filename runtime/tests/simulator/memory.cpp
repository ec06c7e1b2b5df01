// The simulator's own facts about device memory: each device is one arena
// of exactly its capacity, handed out in 512-byte blocks (allocation sizes
// are charged rounded up), best fit and coalesced on free, so the whole
// capacity can be allocated at once; freeing punches the pages out of the
// arena (a reused block reads zeros); the kernel view is a second mapping.
// A driver for real hardware answers these differently (the contract every
// driver must meet is in ../contract/memory.cpp).
#include <cstdint>
#include <cstring>
#include <vector>

#include "test_util.h"

namespace {

using openreg_test::DeviceBuffer;
using openreg_test::RoundUp;
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

TEST_F(MemoryTest, AllocationsAreChargedInWhole512ByteBlocks) {
  for (size_t n :
       {size_t{1}, size_t{511}, size_t{512}, size_t{513}, size_t{77777}}) {
    SCOPED_TRACE(n);
    const size_t free_before = FreeBytes();
    DeviceBuffer buf(n);
    orPointerAttributes attr;
    OR_ASSERT_OK(orPointerGetAttributes(&attr, buf.bytes() + n - 1));
    EXPECT_EQ(RoundUp(n, 512), attr.size);
    EXPECT_EQ(free_before - RoundUp(n, 512), FreeBytes());
  }
}

TEST_F(MemoryTest, DeviceStartsEmpty) { EXPECT_EQ(Capacity(), FreeBytes()); }

TEST_F(MemoryTest, AttributesAtTheEndOfTheDeviceRange) {
  orPointerAttributes attr;
  // The whole-device allocation starts at the device's base; with it freed,
  // the last byte of the device range is in no live allocation either.
  const size_t capacity = Capacity();
  void* all = nullptr;
  OR_ASSERT_OK(orMalloc(&all, capacity));
  OR_ASSERT_OK(
      orPointerGetAttributes(&attr, static_cast<char*>(all) + capacity - 1));
  EXPECT_EQ(orMemoryTypeDevice, attr.type);
  EXPECT_EQ(capacity, attr.size);
  OR_ASSERT_OK(orFree(all));
  EXPECT_EQ(
      orErrorInvalidDevicePointer,
      orPointerGetAttributes(&attr, static_cast<char*>(all) + capacity - 1));
  // One past the range is no longer this device's memory (it may be another
  // device's or unmapped host space) and must not report device 0.
  orError_t err =
      orPointerGetAttributes(&attr, static_cast<char*>(all) + capacity);
  if (err == orSuccess && attr.type == orMemoryTypeDevice) {
    EXPECT_NE(0, attr.device);
  }
}

TEST_F(MemoryTest, WholeCapacityThenFullThenFreeThenSucceed) {
  const size_t capacity = Capacity();
  void* all = nullptr;
  OR_ASSERT_OK(orMalloc(&all, capacity));
  ASSERT_NE(nullptr, all);
  EXPECT_EQ(0u, FreeBytes());

  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(orErrorMemoryAllocation, orMalloc(&p, 1));
  EXPECT_EQ(nullptr, p);

  OR_ASSERT_OK(orFree(all));
  OR_ASSERT_OK(orMalloc(&p, 1));
  EXPECT_NE(nullptr, p);
  OR_ASSERT_OK(orFree(p));
}

TEST_F(MemoryTest, FillFailFreeSucceed) {
  const size_t capacity = Capacity();
  const size_t chunk = capacity / 8 / 512 * 512;
  std::vector<void*> blocks;
  for (;;) {
    void* p = nullptr;
    orError_t err = orMalloc(&p, chunk);
    if (err != orSuccess) {
      EXPECT_EQ(orErrorMemoryAllocation, err);
      EXPECT_EQ(nullptr, p);
      break;
    }
    blocks.push_back(p);
    ASSERT_LE(blocks.size(), 8u) << "allocated more than the capacity";
  }
  ASSERT_EQ(8u, blocks.size());
  // The remainder (if any) is smaller than a chunk but still usable.
  const size_t rest = FreeBytes();
  EXPECT_EQ(capacity - 8 * chunk, rest);

  // Free one chunk in the middle: the same size fits again, twice does not.
  OR_ASSERT_OK(orFree(blocks[3]));
  void* again = nullptr;
  OR_ASSERT_OK(orMalloc(&again, chunk));
  EXPECT_EQ(blocks[3], again);  // the only hole that fits
  blocks[3] = again;
  void* p = nullptr;
  EXPECT_EQ(orErrorMemoryAllocation, orMalloc(&p, chunk));

  for (void* b : blocks) {
    OR_ASSERT_OK(orFree(b));
  }
  EXPECT_EQ(capacity, FreeBytes());
}

TEST_F(MemoryTest, FreedBlocksCoalesce) {
  const size_t capacity = Capacity();
  // 256 blocks spanning the whole device, freed in an order that merges each
  // block with its left neighbour, its right neighbour, or both.
  const size_t kBlocks = 256;
  const size_t block = capacity / kBlocks / 512 * 512;
  ASSERT_GT(block, 0u);
  std::vector<void*> ptrs(kBlocks);
  for (auto& p : ptrs) {
    OR_ASSERT_OK(orMalloc(&p, block));
  }
  std::vector<size_t> order;
  for (size_t i = 0; i < 85; ++i) order.push_back(i);            // left merges
  for (size_t i = 169; i >= 85; --i) order.push_back(i);         // right merges
  for (size_t i = 170; i < kBlocks; i += 2) order.push_back(i);  // isolated
  for (size_t i = 171; i < kBlocks; i += 2) order.push_back(i);  // both sides
  ASSERT_EQ(kBlocks, order.size());
  for (size_t i : order) {
    OR_ASSERT_OK(orFree(ptrs[i]));
  }
  ASSERT_EQ(capacity, FreeBytes());

  // Only a fully coalesced free list can hold (almost) the whole device.
  void* big = nullptr;
  OR_ASSERT_OK(orMalloc(&big, capacity - 512));
  OR_ASSERT_OK(orFree(big));
  OR_ASSERT_OK(orMalloc(&big, capacity));
  EXPECT_EQ(ptrs[0], big);
  OR_ASSERT_OK(orFree(big));
}

TEST_F(MemoryTest, FreedPagesAreReturned) {
  // orFree punches the block's whole pages out of the arena, so a new
  // allocation over the same bytes reads zeros, not the old contents.
  const size_t n = 1 << 20;
  void* p = nullptr;
  OR_ASSERT_OK(orMalloc(&p, n));
  OR_ASSERT_OK(orMemset(p, 0xab, n));
  OR_ASSERT_OK(orFree(p));
  void* q = nullptr;
  OR_ASSERT_OK(orMalloc(&q, n));
  if (q != p) {
    OR_ASSERT_OK(orFree(q));
    GTEST_SKIP() << "allocator placed the block elsewhere";
  }
  std::vector<unsigned char> out(n, 0xee);
  OR_ASSERT_OK(orMemcpy(out.data(), q, n, orMemcpyDeviceToHost));
  EXPECT_EQ(std::vector<unsigned char>(n, 0), out);
  OR_ASSERT_OK(orFree(q));
}

TEST_F(MemoryTest, KernelViewIsASeparateMapping) {
  DeviceBuffer dev(4096);
  void* kp = nullptr;
  OR_ASSERT_OK(orGetKernelPointer(&kp, dev.get()));
  EXPECT_NE(dev.get(), kp);
}

}  // namespace
