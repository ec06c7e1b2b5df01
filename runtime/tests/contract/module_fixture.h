// The fixture of the named-kernel contract tests: the test kernel library
// (tests/kernels/test_kernels.cpp, loaded from OPENREG_TEST_KERNELS, default
// the build's), pinned words for gates and probes, a gate launch.
#pragma once

#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/test_kernels.h"
#include "test_util.h"

namespace openreg_test {

inline const char* KernelsPath() {
  const char* env = std::getenv("OPENREG_TEST_KERNELS");
  return env != nullptr ? env : OPENREG_TEST_KERNELS_DEFAULT;
}

class ModuleTest : public RuntimeTest {
 protected:
  void SetUp() override {
    RuntimeTest::SetUp();
    ASSERT_EQ(orSuccess, orModuleLoad(&module_, KernelsPath()))
        << "test kernel library " << KernelsPath();
  }
  void TearDown() override {
    if (module_ != nullptr) {
      EXPECT_EQ(orSuccess, orModuleUnload(module_));
    }
    RuntimeTest::TearDown();
  }
  orFunction_t Function(const char* name) {
    orFunction_t fn = nullptr;
    EXPECT_EQ(orSuccess, orModuleGetFunction(&fn, module_, name)) << name;
    return fn;
  }

 public:
  template <typename P>
  orError_t Launch(orStream_t stream, const char* name, const P& params) {
    return orLaunchFunction(stream, Function(name), &params, sizeof(params),
                            nullptr);
  }

  orModule_t module_ = nullptr;
};

// Pinned words the gate kernel and probes use (host memory the device
// reaches directly).
class PinnedWords {
 public:
  explicit PinnedWords(size_t n) {
    EXPECT_EQ(orSuccess, orMallocHost(&ptr_, n * sizeof(uint32_t)));
    std::memset(ptr_, 0, n * sizeof(uint32_t));
  }
  ~PinnedWords() { EXPECT_EQ(orSuccess, orFreeHost(ptr_)); }
  PinnedWords(const PinnedWords&) = delete;
  PinnedWords& operator=(const PinnedWords&) = delete;
  volatile uint32_t& operator[](size_t i) {
    return static_cast<volatile uint32_t*>(ptr_)[i];
  }
  uint64_t address(size_t i) {
    return reinterpret_cast<uint64_t>(static_cast<uint32_t*>(ptr_) + i);
  }

 private:
  void* ptr_ = nullptr;
};

// A gate kernel launched on a stream, opened by the test (or at scope end).
class GateLaunch {
 public:
  GateLaunch(ModuleTest* test, orStream_t stream) : words_(2), stream_(stream) {
    OrTestGate g{words_.address(0), words_.address(1)};
    EXPECT_EQ(orSuccess, test->Launch(stream, "or_test_gate", g));
  }
  // Opens the gate and waits for the kernel to leave it before its words
  // are freed.
  ~GateLaunch() {
    Open();
    EXPECT_EQ(orSuccess, orStreamSynchronize(stream_));
  }
  GateLaunch(const GateLaunch&) = delete;
  GateLaunch& operator=(const GateLaunch&) = delete;
  void WaitEntered() {
    while (words_[0] == 0) {
      std::this_thread::yield();
    }
  }
  void Open() { words_[1] = 1; }

 private:
  PinnedWords words_;
  orStream_t stream_;
};

inline std::vector<uint32_t> ReadBack(const DeviceBuffer& buf, size_t count) {
  std::vector<uint32_t> host(count, 0);
  EXPECT_EQ(orSuccess,
            orMemcpy(host.data(), buf.get(), count * sizeof(uint32_t),
                     orMemcpyDeviceToHost));
  return host;
}

}  // namespace openreg_test
