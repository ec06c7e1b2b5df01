// SIMULATOR ONLY: the host's side of a described call's answer
// (engine/kernels/OpenRegCallFormat.h, "described calls"; the device writes
// it in engine/kernels/OpenRegCallAnswer.cpp): the pinned buffer the device
// writes it into, the device memory the device keeps for the results until
// the host takes it, and the readers of its parts. run_described
// (OpenRegDescribedCall.cpp) puts them together.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/kernels/OpenRegCallFormat.h"

namespace openreg {

// An answer's room: the header, the warnings and a few thousand tensors.
constexpr size_t kAnswerBytes = size_t{1} << 20;

// A pinned host buffer for one answer (the device writes it, the host reads
// it after the synchronization), leased from a pool: first runs happen on
// any thread, a few at a time.
class AnswerBuffer {
 public:
  AnswerBuffer();
  ~AnswerBuffer();
  AnswerBuffer(const AnswerBuffer&) = delete;
  AnswerBuffer& operator=(const AnswerBuffer&) = delete;

  // The host stopped waiting for the answer before the device gave it (the
  // user's Ctrl-C): the buffer is left to the device.
  void abandon() { abandoned_ = true; }
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_ = nullptr;
  bool abandoned_ = false;
};

// The device keeps a described call's new memory until the host takes it:
// on every way out that does not take it (an error, an allocation that
// fails), the device is told to drop it.
class KeptOnDevice {
 public:
  KeptOnDevice(c10::DeviceIndex device, uint64_t token)
      : device_(device), token_(token) {}
  ~KeptOnDevice();
  KeptOnDevice(const KeptOnDevice&) = delete;
  KeptOnDevice& operator=(const KeptOnDevice&) = delete;

  // The results go into `addresses` (device blocks), in stream order.
  void take(c10::ArrayRef<uint64_t> addresses);
  void nothing_kept() { armed_ = false; }

 private:
  c10::DeviceIndex device_;
  uint64_t token_;
  bool armed_ = true;
};

// Raises a failure of the device's CPU kernel with its own class, as the
// CPU would have.
[[noreturn]] void raise_device_error(call::ErrorKind kind, std::string what);

// A length-prefixed text of the answer.
std::string read_text(call::Reader& r);

// The answer's `count` warnings, their source locations kept for the life
// of the process (a warning keeps pointers to them).
std::vector<c10::Warning> read_warnings(call::Reader& r, uint16_t count);

// A tensor of the answer: where its storage is, and its metadata.
struct TensorDesc {
  call::TensorAnswer rec{};
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
};
TensorDesc read_tensor_desc(call::Reader& r);

}  // namespace openreg
