// A peer process for the IPC tests: this test binary again (posix_spawn of
// /proc/self/exe), running only IpcPeer.Serve (in ipc_peer.cpp) with
// OPENREG_IPC_PEER=<device>. The peer allocates kPeerBytes on that device,
// fills them with PeerPattern, writes the 64 handle bytes to fd 3, then obeys
// one-byte commands read from fd 4: 'c' checks that the buffer holds
// ReplyPattern (answers 'y' or 'n'), 'f' frees it (answers 'k'), 'q' (or end
// of input) exits. A contract-test peer loads the same driver (the loader
// exports OPENREG_DRIVER_LIBRARY for it).
#pragma once

#include <openreg.h>
#include <sys/types.h>

#include <cstddef>

namespace openreg_test {

constexpr size_t kPeerBytes = 3 * 4096 + 512;  // not a whole number of pages

inline unsigned char PeerPattern(size_t i) {
  return static_cast<unsigned char>(i * 7 + 3);
}
inline unsigned char ReplyPattern(size_t i) {
  return static_cast<unsigned char>(255 - i % 251);
}

// The peer process seen from the test: started by the constructor, ended by
// Quit() or the destructor.
class Peer {
 public:
  explicit Peer(int device = 0);
  ~Peer() { Quit(); }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  bool ok() const { return ok_; }
  const orIpcMemHandle_t& handle() const { return handle_; }

  // Sends a command, returns the answer.
  char Ask(char command);
  // Ends the peer and waits until it has exited; true if it exited cleanly.
  bool Quit();

 private:
  pid_t pid_ = -1;
  int from_peer_ = -1;
  int to_peer_ = -1;
  bool ok_ = false;
  orIpcMemHandle_t handle_{};
};

}  // namespace openreg_test
