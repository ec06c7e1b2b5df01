// Device memory shared between processes, what any driver must do:
// orIpcGetMemHandle, orIpcOpenMemHandle, orIpcCloseMemHandle (bad arguments,
// same process, closing twice, stale handles, memory shared both ways), and
// the communication library's view of opened memory (orMemGetDmaPointer).
// A handle must be opened by another process: ../ipc_peer.h starts one.
#include <cstring>
#include <vector>

#include "ipc_peer.h"
#include "kernels/test_kernels.h"
#include "test_util.h"

namespace {

using openreg_test::DeviceBuffer;
using openreg_test::kPeerBytes;
using openreg_test::Peer;
using openreg_test::PeerPattern;
using openreg_test::ReplyPattern;
using openreg_test::RuntimeTest;

bool IsZero(const orIpcMemHandle_t& h) {
  for (char c : h.reserved) {
    if (c != 0) {
      return false;
    }
  }
  return true;
}

using IpcTest = RuntimeTest;

TEST_F(IpcTest, HandleIsSixtyFourOpaqueBytes) {
  OR_REQUIRE_IPC();
  EXPECT_EQ(64u, sizeof(orIpcMemHandle_t));
  EXPECT_EQ(static_cast<size_t>(OR_IPC_HANDLE_SIZE), sizeof(orIpcMemHandle_t));
}

TEST_F(IpcTest, GetMemHandleRejectsWhatIsNotALiveAllocation) {
  OR_REQUIRE_IPC();
  EXPECT_EQ(orErrorInvalidValue, orIpcGetMemHandle(nullptr, nullptr));
  orIpcMemHandle_t handle;
  std::memset(&handle, 0x5a, sizeof(handle));
  EXPECT_EQ(orErrorInvalidDevicePointer, orIpcGetMemHandle(&handle, nullptr));
  EXPECT_TRUE(IsZero(handle)) << "the handle is cleared on failure";
  int on_stack = 0;
  EXPECT_EQ(orErrorInvalidDevicePointer, orIpcGetMemHandle(&handle, &on_stack));
  DeviceBuffer buffer(4096);
  // Like CUDA: the base of an allocation, not a pointer into it.
  EXPECT_EQ(orErrorInvalidDevicePointer,
            orIpcGetMemHandle(&handle, buffer.bytes() + 512));
  void* freed = nullptr;
  OR_ASSERT_OK(orMalloc(&freed, 4096));
  OR_ASSERT_OK(orFree(freed));
  EXPECT_EQ(orErrorInvalidDevicePointer, orIpcGetMemHandle(&handle, freed));
}

TEST_F(IpcTest, SameAllocationSameHandleNewAllocationNewHandle) {
  OR_REQUIRE_IPC();
  void* p = nullptr;
  OR_ASSERT_OK(orMalloc(&p, 8192));
  orIpcMemHandle_t first;
  orIpcMemHandle_t again;
  OR_ASSERT_OK(orIpcGetMemHandle(&first, p));
  OR_ASSERT_OK(orIpcGetMemHandle(&again, p));
  EXPECT_EQ(0, std::memcmp(&first, &again, sizeof(first)));
  OR_ASSERT_OK(orFree(p));
  void* q = nullptr;
  OR_ASSERT_OK(orMalloc(&q, 8192));
  // Usually the same address (best fit); a new handle either way.
  orIpcMemHandle_t second;
  OR_ASSERT_OK(orIpcGetMemHandle(&second, q));
  EXPECT_NE(0, std::memcmp(&first, &second, sizeof(first)));
  OR_ASSERT_OK(orFree(q));
}

TEST_F(IpcTest, OpeningAHandleOfThisProcessFails) {
  OR_REQUIRE_IPC();
  DeviceBuffer buffer(4096);
  orIpcMemHandle_t handle;
  OR_ASSERT_OK(orIpcGetMemHandle(&handle, buffer.get()));
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(orErrorIpcSameProcess, orIpcOpenMemHandle(&p, handle, 0));
  EXPECT_EQ(nullptr, p);
}

TEST_F(IpcTest, OpenRejectsBadArguments) {
  OR_REQUIRE_IPC();
  orIpcMemHandle_t zero{};
  EXPECT_EQ(orErrorInvalidValue, orIpcOpenMemHandle(nullptr, zero, 0));
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(orErrorInvalidValue, orIpcOpenMemHandle(&p, zero, 0));
  EXPECT_EQ(nullptr, p);
  orIpcMemHandle_t garbage;
  for (size_t i = 0; i < sizeof(garbage.reserved); ++i) {
    garbage.reserved[i] = static_cast<char>(i * 37 + 11);
  }
  EXPECT_EQ(orErrorInvalidValue, orIpcOpenMemHandle(&p, garbage, 0));
  DeviceBuffer buffer(4096);
  orIpcMemHandle_t handle;
  OR_ASSERT_OK(orIpcGetMemHandle(&handle, buffer.get()));
  EXPECT_EQ(orErrorInvalidValue, orIpcOpenMemHandle(&p, handle, 2));
}

TEST_F(IpcTest, CloseRejectsWhatWasNotOpened) {
  OR_REQUIRE_IPC();
  EXPECT_EQ(orErrorInvalidValue, orIpcCloseMemHandle(nullptr));
  DeviceBuffer buffer(4096);
  EXPECT_EQ(orErrorInvalidDevicePointer, orIpcCloseMemHandle(buffer.get()));
  int on_stack = 0;
  EXPECT_EQ(orErrorInvalidDevicePointer, orIpcCloseMemHandle(&on_stack));
}

TEST_F(IpcTest, PeerMemoryIsSharedBothWays) {
  OR_REQUIRE_IPC();
  Peer peer;
  ASSERT_TRUE(peer.ok());
  void* p = nullptr;
  OR_ASSERT_OK(
      orIpcOpenMemHandle(&p, peer.handle(), orIpcMemLazyEnablePeerAccess));
  ASSERT_NE(nullptr, p);
  orPointerAttributes attr;
  OR_ASSERT_OK(orPointerGetAttributes(&attr, static_cast<char*>(p) + 100));
  EXPECT_EQ(orMemoryTypeDevice, attr.type);
  EXPECT_EQ(0, attr.device);
  EXPECT_EQ(p, attr.base);
  EXPECT_EQ(openreg_test::RoundUp(kPeerBytes, 512), attr.size);
  // The peer's bytes, read here.
  std::vector<unsigned char> bytes(kPeerBytes);
  OR_ASSERT_OK(orMemcpy(bytes.data(), p, kPeerBytes, orMemcpyDeviceToHost));
  for (size_t i = 0; i < kPeerBytes; ++i) {
    ASSERT_EQ(PeerPattern(i), bytes[i]) << "byte " << i;
  }
  // Bytes written here (a copy, then through the kernel view where the
  // driver has one in this process), read by the peer.
  for (size_t i = 0; i < kPeerBytes; ++i) {
    bytes[i] = ReplyPattern(i);
  }
  OR_ASSERT_OK(orMemcpy(p, bytes.data(), 4096, orMemcpyHostToDevice));
  char* rest = static_cast<char*>(p) + 4096;
  void* kernel = nullptr;
  const orError_t view = orGetKernelPointer(&kernel, rest);
  if (view == orErrorNotSupported) {  // the memory lives in device processes
    OR_ASSERT_OK(orMemcpy(rest, bytes.data() + 4096, kPeerBytes - 4096,
                          orMemcpyHostToDevice));
  } else {
    OR_ASSERT_OK(view);
    std::memcpy(kernel, bytes.data() + 4096, kPeerBytes - 4096);
  }
  EXPECT_EQ('y', peer.Ask('c'));
  // A named kernel reaches it too, on either device (the device that runs
  // a kernel need not be the one the memory belongs to).
  orModule_t module = nullptr;
  OR_ASSERT_OK(orModuleLoad(&module, OPENREG_TEST_KERNELS_DEFAULT));
  orFunction_t fill = nullptr;
  OR_ASSERT_OK(orModuleGetFunction(&fill, module, "or_test_fill_u32"));
  int devices = 0;
  OR_ASSERT_OK(orGetDeviceCount(&devices));
  for (int d = 0; d < devices && d < 2; ++d) {
    OR_ASSERT_OK(orSetDevice(d));
    const OrTestFill params{reinterpret_cast<uint64_t>(p), 256,
                            0xabc0u + static_cast<uint32_t>(d), 0};
    OR_ASSERT_OK(
        orLaunchFunction(nullptr, fill, &params, sizeof(params), nullptr));
    OR_ASSERT_OK(orDeviceSynchronize());
    std::vector<uint32_t> words(256);
    OR_ASSERT_OK(orMemcpy(words.data(), p, 1024, orMemcpyDeviceToHost));
    for (uint32_t w : words) {
      ASSERT_EQ(0xabc0u + static_cast<uint32_t>(d), w) << "device " << d;
    }
  }
  OR_ASSERT_OK(orSetDevice(0));
  OR_ASSERT_OK(orModuleUnload(module));
  // Only the owner frees or exports; the range ends with the allocation.
  EXPECT_EQ(orErrorInvalidDevicePointer, orFree(p));
  orIpcMemHandle_t again;
  EXPECT_EQ(orErrorInvalidDevicePointer, orIpcGetMemHandle(&again, p));
  EXPECT_EQ(orErrorInvalidDevicePointer,
            orMemcpy(bytes.data(), p, attr.size + 1, orMemcpyDeviceToHost));
  OR_EXPECT_OK(orMemset(p, 0, attr.size));
  OR_EXPECT_OK(orIpcCloseMemHandle(p));
  EXPECT_TRUE(peer.Quit());
}

// The communication library's view (orMemGetDmaPointer) of memory opened
// from another process: where a driver gives one, it reads the peer's bytes
// and the peer reads what it wrote, with no copy.
TEST_F(IpcTest, DmaPointerReachesPeerMemory) {
  OR_REQUIRE_IPC();
  Peer peer;
  ASSERT_TRUE(peer.ok());
  void* p = nullptr;
  OR_ASSERT_OK(orIpcOpenMemHandle(&p, peer.handle(), 0));
  void* view = nullptr;
  const orError_t err = orMemGetDmaPointer(&view, p, kPeerBytes);
  if (err == orErrorNotSupported) {
    EXPECT_EQ(nullptr, view);
    OR_EXPECT_OK(orIpcCloseMemHandle(p));
    GTEST_SKIP() << "this driver's collectives stage imported memory";
  }
  OR_ASSERT_OK(err);
  ASSERT_NE(nullptr, view);
  EXPECT_NE(p, view) << "a view of its own, not the device address";
  auto* bytes = static_cast<unsigned char*>(view);
  for (size_t i = 0; i < kPeerBytes; ++i) {
    ASSERT_EQ(PeerPattern(i), bytes[i]) << "byte " << i;
  }
  for (size_t i = 0; i < kPeerBytes; ++i) {
    bytes[i] = ReplyPattern(i);
  }
  EXPECT_EQ('y', peer.Ask('c'));
  void* inside = nullptr;
  OR_ASSERT_OK(orMemGetDmaPointer(&inside, static_cast<char*>(p) + 4097, 100));
  EXPECT_EQ(bytes + 4097, inside);
  EXPECT_EQ(orErrorInvalidDevicePointer,
            orMemGetDmaPointer(&inside, p,
                               openreg_test::RoundUp(kPeerBytes, 512) + 1));
  OR_EXPECT_OK(orIpcCloseMemHandle(p));
  EXPECT_EQ(orErrorInvalidDevicePointer, orMemGetDmaPointer(&inside, p, 1))
      << "closed";
  EXPECT_TRUE(peer.Quit());
}

TEST_F(IpcTest, OpeningTwiceGivesTheSamePointerAndNeedsTwoCloses) {
  OR_REQUIRE_IPC();
  Peer peer;
  ASSERT_TRUE(peer.ok());
  void* a = nullptr;
  void* b = nullptr;
  OR_ASSERT_OK(orIpcOpenMemHandle(&a, peer.handle(), 0));
  OR_ASSERT_OK(orIpcOpenMemHandle(&b, peer.handle(), 0));
  EXPECT_EQ(a, b);
  OR_EXPECT_OK(orIpcCloseMemHandle(a));
  orPointerAttributes attr;
  OR_EXPECT_OK(orPointerGetAttributes(&attr, a));
  EXPECT_EQ(orMemoryTypeDevice, attr.type) << "still open once";
  OR_EXPECT_OK(orIpcCloseMemHandle(b));
  EXPECT_EQ(orErrorInvalidDevicePointer, orIpcCloseMemHandle(a))
      << "closed as often as opened";
  OR_EXPECT_OK(orPointerGetAttributes(&attr, a));
  EXPECT_EQ(orMemoryTypeUnregistered, attr.type);
}

TEST_F(IpcTest, HandleOfFreedMemoryIsStale) {
  OR_REQUIRE_IPC();
  Peer peer;
  ASSERT_TRUE(peer.ok());
  ASSERT_EQ('k', peer.Ask('f'));
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(orErrorInvalidResourceHandle,
            orIpcOpenMemHandle(&p, peer.handle(), 0));
  EXPECT_EQ(nullptr, p);
}

TEST_F(IpcTest, HandleOfAnExitedProcessIsStale) {
  OR_REQUIRE_IPC();
  Peer peer;
  ASSERT_TRUE(peer.ok());
  const orIpcMemHandle_t handle = peer.handle();
  ASSERT_TRUE(peer.Quit());
  void* p = nullptr;
  EXPECT_EQ(orErrorInvalidResourceHandle, orIpcOpenMemHandle(&p, handle, 0));
}

TEST_F(IpcTest, MemoryOfDeviceOneOpensAsDeviceOne) {
  OR_REQUIRE_IPC();
  OR_REQUIRE_DEVICES(2);
  Peer peer(1);
  ASSERT_TRUE(peer.ok());
  void* p = nullptr;
  OR_ASSERT_OK(orIpcOpenMemHandle(&p, peer.handle(), 0));
  orPointerAttributes attr;
  OR_ASSERT_OK(orPointerGetAttributes(&attr, p));
  EXPECT_EQ(1, attr.device);
  // A copy between the imported memory and an allocation of device 0.
  DeviceBuffer local(kPeerBytes);
  OR_ASSERT_OK(orMemcpy(local.get(), p, kPeerBytes, orMemcpyDeviceToDevice));
  unsigned char last = 0;
  OR_ASSERT_OK(
      orMemcpy(&last, local.bytes() + kPeerBytes - 1, 1, orMemcpyDeviceToHost));
  EXPECT_EQ(PeerPattern(kPeerBytes - 1), last);
  OR_EXPECT_OK(orIpcCloseMemHandle(p));
}

}  // namespace
