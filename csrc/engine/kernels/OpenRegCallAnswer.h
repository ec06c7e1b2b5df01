// A described call's device side, beside its runner (OpenRegBoxedCall.cpp):
// the host's settings applied before a call, and the answer the device
// writes for the host (engine/kernels/OpenRegCallFormat.h, "Described calls").
// Device-side code: ATen and c10 only.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/core/Storage.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "engine/kernels/OpenRegCallFormat.h"

namespace openreg {

// Applies the host's settings word (call::settings) in this process; each
// setting is set only when it differs ("device-settings" in the .cpp).
void apply_settings(uint64_t word);

// The error class of a failure, which the host raises again.
call::ErrorKind error_kind(const c10::Error& e);

// Keeps what a described call warns, for its answer.
class RecordWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    if (warnings.size() < kMost) {
      warnings.push_back(warning);
    }
  }
  static constexpr size_t kMost = 64;
  std::vector<c10::Warning> warnings;
};

// Builds a described call's answer and writes it where the host reads it.
class AnswerWriter {
 public:
  // The header and the warnings; the caller appends the rest.
  std::vector<uint8_t>& begin(call::AnswerHeader h,
                              const RecordWarnings& recorded) {
    h.magic = call::kAnswerMagic;
    h.n_warnings = static_cast<uint16_t>(recorded.warnings.size());
    bytes_.clear();
    call::Writer w(bytes_);
    w.put(h);
    for (const c10::Warning& warning : recorded.warnings) {
      const bool deprecation =
          std::holds_alternative<c10::Warning::DeprecationWarning>(
              warning.type());
      w.put(static_cast<uint8_t>(deprecation));
      w.put(static_cast<uint8_t>(warning.verbatim()));
      const c10::SourceLocation& at = warning.source_location();
      w.put(static_cast<uint32_t>(at.line));
      text(w, at.file != nullptr ? at.file : "");
      text(w, at.function != nullptr ? at.function : "");
      text(w, warning.msg());
    }
    return bytes_;
  }

  // Writes the answer (its size set) if it fits `capacity`, else a header
  // that says how large it is. Returns whether it fit.
  bool finish(uint8_t* answer, size_t capacity) {
    call::AnswerHeader h{};
    std::memcpy(&h, bytes_.data(), sizeof(h));
    h.size = static_cast<uint32_t>(bytes_.size());
    if (bytes_.size() > capacity) {
      call::AnswerHeader too_large{};
      too_large.magic = call::kAnswerMagic;
      too_large.status = call::AnswerStatus::kTooLarge;
      too_large.size = h.size;
      std::memcpy(answer, &too_large, sizeof(too_large));
      return false;
    }
    std::memcpy(bytes_.data(), &h, sizeof(h));
    std::memcpy(answer, bytes_.data(), bytes_.size());
    return true;
  }

  // A failed or unsupported call's answer; nothing is kept. `resized`: the
  // written tensors the kernel resized before it failed.
  std::vector<c10::Storage> fail(
      const RecordWarnings& recorded, call::AnswerStatus status,
      call::ErrorKind kind, const std::string& what, uint8_t* answer,
      size_t capacity, const std::vector<call::ResizedTensor>& resized = {}) {
    call::AnswerHeader h{};
    h.status = status;
    h.n_written = static_cast<uint16_t>(resized.size());
    call::Writer w(begin(h, recorded));
    w.put(kind);
    size_t resized_bytes = 0;
    for (const call::ResizedTensor& r : resized) {
      resized_bytes += 3 + 16 * r.sizes.size();
    }
    // Room for the header, the warnings and the resized tensors: a long
    // message is cut.
    const size_t used = bytes_.size() + 64 + resized_bytes;
    const size_t room = capacity > used ? capacity - used : 0;
    text(w, what.size() > room ? what.substr(0, room) : what);
    for (const call::ResizedTensor& r : resized) {
      w.put(r.tensor);
      w.put(static_cast<uint8_t>(r.sizes.size()));
      for (int64_t v : r.sizes) {
        w.put(v);
      }
      for (int64_t v : r.strides) {
        w.put(v);
      }
    }
    finish(answer, capacity);
    return {};
  }

 private:
  static void text(call::Writer& w, const std::string& s) {
    w.put(static_cast<uint32_t>(s.size()));
    w.put_bytes(s.data(), s.size());
  }

  std::vector<uint8_t> bytes_;
};
// What a described call's CPU kernel did, as the runner hands it over.
struct RanCall {
  c10::ArrayRef<c10::Storage> storages;  // the call's device storages
  c10::ArrayRef<const void*> bases;      // their memory before the kernel
  // The written tensors (kWritten), by their index in the call.
  c10::ArrayRef<std::pair<uint16_t, at::Tensor>> written;
  c10::ArrayRef<c10::IValue> returns;
  // The out= variant to check, and the arguments again (nullptr: no check).
  const c10::OperatorHandle* out_op = nullptr;
  const torch::jit::Stack* args = nullptr;
};

// Writes the answer of a call that ran (the results, new memory, written
// arguments, warnings; or why it cannot be answered) and returns the new
// storages' memory the device keeps for openreg_take_results.
std::vector<c10::Storage> answer_done(const RanCall& ran,
                                      const RecordWarnings& recorded,
                                      AnswerWriter& a, uint8_t* answer,
                                      size_t capacity);

}  // namespace openreg
