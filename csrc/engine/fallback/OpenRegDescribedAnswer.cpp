// SIMULATOR ONLY: the host's side of a described call's answer (see the
// header).
#include "engine/fallback/OpenRegDescribedAnswer.h"

#include <c10/core/ScalarType.h>
#include <openreg.h>

#include <cstring>
#include <mutex>
#include <unordered_set>
#include <utility>

#include "aten/OpenRegLaunch.h"
#include "core/OpenRegException.h"
#include "core/OpenRegNamedKernels.h"

namespace openreg {

namespace {

std::mutex& pool_mutex() {
  static std::mutex m;
  return m;
}

std::vector<uint8_t*>& pool() {
  static auto* p = new std::vector<uint8_t*>();  // kept until exit
  return *p;
}

// openreg_take_results only copies bytes, on the worker alone: no OpenMP
// team (the launch's `elements`, OpenRegLaunch.h).
constexpr int64_t kCopiesOnly = 0;

// A source location's strings for the life of the process (a warning
// keeps pointers to them); a few hundred files at most.
const char* interned(const std::string& s) {
  static std::mutex mutex;
  static auto* strings = new std::unordered_set<std::string>();
  const std::lock_guard<std::mutex> lock(mutex);
  return strings->insert(s).first->c_str();
}

}  // namespace

AnswerBuffer::AnswerBuffer() {
  {
    const std::lock_guard<std::mutex> lock(pool_mutex());
    if (!pool().empty()) {
      data_ = pool().back();
      pool().pop_back();
    }
  }
  if (data_ == nullptr) {
    void* p = nullptr;
    OPENREG_CHECK(orMallocHost(&p, kAnswerBytes));
    data_ = static_cast<uint8_t*>(p);
  }
  std::memset(data_, 0, sizeof(call::AnswerHeader));
}

AnswerBuffer::~AnswerBuffer() {
  if (abandoned_) {
    return;  // the device may still write it: never reused
  }
  const std::lock_guard<std::mutex> lock(pool_mutex());
  pool().push_back(data_);
}

KeptOnDevice::~KeptOnDevice() {
  if (!armed_) {
    return;
  }
  try {
    const call::TakeResultsParams p{token_, 0};
    launch_function(device_, "openreg_take_results",
                    named_kernel(NamedKernel::kTakeResults), &p, sizeof(p),
                    kCopiesOnly);
  } catch (const std::exception&) {
    // The device is lost or failing: what it kept goes with it, or with
    // the next call of this token.
  }
}

void KeptOnDevice::take(c10::ArrayRef<uint64_t> addresses) {
  std::vector<uint8_t> params(sizeof(call::TakeResultsParams) +
                              addresses.size() * sizeof(uint64_t));
  const call::TakeResultsParams p{token_, addresses.size()};
  std::memcpy(params.data(), &p, sizeof(p));
  std::memcpy(params.data() + sizeof(p), addresses.data(),
              addresses.size() * sizeof(uint64_t));
  launch_function(device_, "openreg_take_results",
                  named_kernel(NamedKernel::kTakeResults), params.data(),
                  params.size(), kCopiesOnly);
  armed_ = false;
}

void raise_device_error(call::ErrorKind kind, std::string what) {
  const c10::SourceLocation where{__func__, __FILE__, __LINE__};
  switch (kind) {
    case call::ErrorKind::kIndex:
      throw c10::IndexError(where, std::move(what));
    case call::ErrorKind::kValue:
      throw c10::ValueError(where, std::move(what));
    case call::ErrorKind::kType:
      throw c10::TypeError(where, std::move(what));
    case call::ErrorKind::kNotImplemented:
      throw c10::NotImplementedError(where, std::move(what));
    case call::ErrorKind::kLinAlg:
      throw c10::LinAlgError(where, std::move(what));
    case call::ErrorKind::kOutOfMemory:
      throw c10::OutOfMemoryError(where, std::move(what));
    case call::ErrorKind::kEnforceFinite:
      throw c10::EnforceFiniteError(where, std::move(what));
    default:
      throw c10::Error(where, std::move(what));
  }
}

std::string read_text(call::Reader& r) {
  const auto n = r.get<uint32_t>();
  return std::string(reinterpret_cast<const char*>(r.take(n)), n);
}

std::vector<c10::Warning> read_warnings(call::Reader& r, uint16_t count) {
  std::vector<c10::Warning> warnings;
  for (uint16_t i = 0; i < count; ++i) {
    const bool deprecation = r.get<uint8_t>() != 0;
    const bool verbatim = r.get<uint8_t>() != 0;
    c10::Warning::warning_variant_t type = c10::UserWarning{};
    if (deprecation) {
      type = c10::DeprecationWarning{};
    }
    const auto line = r.get<uint32_t>();
    const char* file = interned(read_text(r));
    const char* function = interned(read_text(r));
    warnings.emplace_back(type, c10::SourceLocation{function, file, line},
                          read_text(r), verbatim);
  }
  return warnings;
}

TensorDesc read_tensor_desc(call::Reader& r) {
  TensorDesc d;
  d.rec = r.get<call::TensorAnswer>();
  if (d.rec.where == call::Where::kUndefined) {
    return d;
  }
  TORCH_INTERNAL_ASSERT(
      d.rec.dtype < static_cast<uint8_t>(c10::ScalarType::NumOptions),
      "openreg: an answer names dtype ", static_cast<int>(d.rec.dtype));
  d.sizes.resize(d.rec.ndim);
  d.strides.resize(d.rec.ndim);
  for (int64_t& s : d.sizes) {
    s = r.get<int64_t>();
  }
  for (int64_t& s : d.strides) {
    s = r.get<int64_t>();
  }
  return d;
}

}  // namespace openreg
