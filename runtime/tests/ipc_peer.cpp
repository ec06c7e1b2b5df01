// The IPC tests' peer process (see ipc_peer.h).
#include "ipc_peer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace openreg_test {

namespace {

bool ReadAll(int fd, void* data, size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = read(fd, p, n);
    if (got <= 0) {
      return false;
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool WriteAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = write(fd, p, n);
    if (put <= 0) {
      return false;
    }
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

}  // namespace

// Commands: 'c' checks that the buffer holds ReplyPattern (answers 'y' or
// 'n'), 'f' frees the buffer (answers 'k'), 'q' (or end of input) exits.
TEST(IpcPeer, Serve) {
  const char* mode = std::getenv("OPENREG_IPC_PEER");
  if (mode == nullptr) {
    GTEST_SKIP() << "run by the IpcTest tests as their peer process";
  }
  ASSERT_EQ(orSuccess, orSetDevice(std::atoi(mode)));
  void* buffer = nullptr;
  ASSERT_EQ(orSuccess, orMalloc(&buffer, kPeerBytes));
  std::vector<unsigned char> bytes(kPeerBytes);
  for (size_t i = 0; i < kPeerBytes; ++i) {
    bytes[i] = PeerPattern(i);
  }
  ASSERT_EQ(orSuccess,
            orMemcpy(buffer, bytes.data(), kPeerBytes, orMemcpyHostToDevice));
  orIpcMemHandle_t handle;
  ASSERT_EQ(orSuccess, orIpcGetMemHandle(&handle, buffer));
  ASSERT_TRUE(WriteAll(3, &handle, sizeof(handle)));
  char command = 0;
  while (ReadAll(4, &command, 1) && command != 'q') {
    char answer = '?';
    if (command == 'c') {
      ASSERT_EQ(orSuccess, orMemcpy(bytes.data(), buffer, kPeerBytes,
                                    orMemcpyDeviceToHost));
      answer = 'y';
      for (size_t i = 0; i < kPeerBytes; ++i) {
        if (bytes[i] != ReplyPattern(i)) {
          answer = 'n';
        }
      }
    } else if (command == 'f') {
      ASSERT_EQ(orSuccess, orFree(buffer));
      answer = 'k';
    }
    ASSERT_TRUE(WriteAll(3, &answer, 1));
  }
}

Peer::Peer(int device) {
  int to_test[2];
  int to_peer[2];
  EXPECT_EQ(0, pipe2(to_test, O_CLOEXEC));
  EXPECT_EQ(0, pipe2(to_peer, O_CLOEXEC));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_test[1], 3);
  posix_spawn_file_actions_adddup2(&actions, to_peer[0], 4);
  // gtest's report of the peer would interleave with ours; failures still
  // reach stderr.
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "OPENREG_IPC_PEER=", 17) != 0) {
      env_strings.emplace_back(*e);
    }
  }
  env_strings.push_back("OPENREG_IPC_PEER=" + std::to_string(device));
  std::vector<char*> env;
  for (auto& s : env_strings) {
    env.push_back(s.data());
  }
  env.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  std::string filter = "--gtest_filter=IpcPeer.Serve";
  char* argv[] = {exe.data(), filter.data(), nullptr};
  EXPECT_EQ(
      0, posix_spawn(&pid_, exe.c_str(), &actions, nullptr, argv, env.data()));
  posix_spawn_file_actions_destroy(&actions);
  close(to_test[1]);
  close(to_peer[0]);
  from_peer_ = to_test[0];
  to_peer_ = to_peer[1];
  ok_ = ReadAll(from_peer_, &handle_, sizeof(handle_));
  EXPECT_TRUE(ok_) << "the peer did not send its handle";
}

char Peer::Ask(char command) {
  char answer = 0;
  EXPECT_TRUE(WriteAll(to_peer_, &command, 1));
  EXPECT_TRUE(ReadAll(from_peer_, &answer, 1));
  return answer;
}

bool Peer::Quit() {
  if (pid_ <= 0) {
    return true;
  }
  const char q = 'q';
  WriteAll(to_peer_, &q, 1);
  close(to_peer_);
  close(from_peer_);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace openreg_test
