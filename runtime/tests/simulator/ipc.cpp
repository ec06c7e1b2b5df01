// The simulator's IPC facts (not required of a driver): a mapping of
// another process's memory outlives that process (the memfd stays alive;
// CUDA requires the owner to live on), and host code touching imported
// memory dies with the diagnostic, naming the owner process.
#include <vector>

#include "ipc_peer.h"
#include "test_util.h"

namespace {

using openreg_test::kPeerBytes;
using openreg_test::Peer;
using openreg_test::PeerPattern;
using openreg_test::RuntimeTest;

using IpcTest = RuntimeTest;

TEST_F(IpcTest, OpenMemoryOutlivesItsOwner) {
  Peer peer;
  ASSERT_TRUE(peer.ok());
  void* p = nullptr;
  OR_ASSERT_OK(orIpcOpenMemHandle(&p, peer.handle(), 0));
  ASSERT_TRUE(peer.Quit());
  std::vector<unsigned char> bytes(kPeerBytes);
  OR_ASSERT_OK(orMemcpy(bytes.data(), p, kPeerBytes, orMemcpyDeviceToHost));
  EXPECT_EQ(PeerPattern(kPeerBytes - 1), bytes[kPeerBytes - 1]);
  OR_EXPECT_OK(orIpcCloseMemHandle(p));
}

// Host code touching imported memory dies with the diagnostic, as for the
// arena ("threadsafe" death test: the child re-runs this test alone).
void TouchImportedMemory() {
  Peer peer;
  void* p = nullptr;
  if (!peer.ok() || orIpcOpenMemHandle(&p, peer.handle(), 0) != orSuccess) {
    return;
  }
  volatile char c = *static_cast<volatile char*>(p);
  (void)c;
}

TEST(IpcDeathTest, HostAccessToImportedMemoryDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(TouchImportedMemory(),
               "host code accessed device memory at 0x[0-9a-f]+ \\(device 0, "
               "memory imported from process [0-9]+");
}

}  // namespace
