// The bytes of a serialized boxed call: a fallback call as the device runs
// it, without a host pointer or a host object in it (issue 29, step 3).
//
// The host writes one when it queues a call of the CPU fallback
// (engine/fallback/OpenRegCallEncoder.cpp); the device reads it and runs
// PyTorch's CPU kernel over its own view of device memory
// (engine/kernels/OpenRegBoxedCall.cpp). The same bytes serve both drivers: the
// thread driver's worker reads them in the user's process, the process
// driver's device process reads them as the parameters of the named kernel
// `openreg_boxed_call` of libopenreg_kernels.so. They never leave the
// machine, so numbers are in the host's byte order.
//
// Layout, in order (every field packed, read with memcpy):
//
//   CallHeader
//   the operator's name, then its overload name   (name_len, overload_len)
//   known warnings n_known_warnings x uint64      warning_hash of each
//   storages   n_storages x StorageRecord        device storages, once each
//   tensors    n_tensors  x TensorRecord          + sizes, strides [, bytes]
//   arguments  n_args values, each a Tag and its payload (below)
//   results    n_results x ResultRecord           (kCopyResults only)
//
// One device tensor passed twice is one tensor record, and tensors of one
// device storage share one storage record, so the kernel sees the aliasing
// the caller made. A CPU tensor argument travels as a snapshot of its bytes
// (kInlineStorage). Devices addresses are the device's (what orMalloc gave);
// the kernel translates them (orKernelContext.translate).
//
// Warnings: with kForwardWarnings, the device hands the host what the CPU
// kernel warns (orKernelContext.warn), but for the known warnings, which the
// host raised at the call (the signature's warnings: the CPU kernel gives
// them at every call). The host sets it only when the kernel runs in its own
// process (the thread driver), where TORCH_WARN_ONCE's flags are the host's:
// a device process has flags of its own and would give again a once-warning
// the host already raised, so there the kernel's warnings stay on the device
// (its stderr).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace openreg::call {

constexpr uint32_t kMagic = 0x3143524f;  // "ORC1"
constexpr uint16_t kVersion = 3;

// The hash that names a known warning: FNV-1a of its message.
inline uint64_t warning_hash(const char* text, size_t n) {
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    hash = (hash ^ static_cast<unsigned char>(text[i])) * 1099511628211ull;
  }
  return hash;
}

enum CallFlags : uint8_t {
  kForwardWarnings = 1,  // the kernel's warnings go to the host (see above)
  // The device applies the host's settings (CallHeader::settings) before
  // the call: set when the kernel runs in a process of its own, whose
  // process-wide settings are not the user's.
  kApplySettings = 2,
  // The device may run the kernel on fewer threads than `threads`
  // (orKernelContext::team_threads): outside deterministic mode, or when
  // its results do not depend on its thread count (an elementwise operator
  // whose every element rounds alike in ATen's vectorized and scalar
  // loops); doc:fewer-threads in aten/fallback/OpenRegOpTraits.cpp.
  kFewerThreads = 4,
};

// CallHeader::settings: the host's process-wide settings a CPU kernel reads
// (the launch plan's key has them too, engine/fallback/OpenRegLaunchPlan.cpp,
// host_settings): the default dtype in bits 0-7 (a c10::ScalarType), these
// flags, and the float32 matmul precision (0 highest, 1 high, 2 medium)
// from kMatmulPrecisionShift.
namespace settings {
enum Bit : int {
  kDeterministic = 8,
  kDeterministicWarnOnly,
  kFillUninitializedMemory,
  kWarnAlways,
  kGradMode,
  kInferenceMode,
  kCheckSparseInvariants,
  kMkldnn,
  kDeterministicMkldnn,
  kNnpack,
  kFp16ReductionCpu,
  kMatmulPrecisionShift,
};
}  // namespace settings

enum class Mode : uint8_t {
  // Run the operator; copy each result named in the results section into
  // its tensor (new device tensors the host allocated with the plan's
  // metadata).
  kCopyResults = 0,
  // Run the operator (an out= variant) with the result tensors appended to
  // its arguments: it writes them in place.
  kIntoResults = 1,
  // Run the operator whose results the host does not know yet (the first
  // run of a signature, an operator whose results depend on the data) and
  // answer what it did (the "describe" section below). Only through the
  // kernel openreg_describe_call, whose parameters add where the answer goes.
  kDescribe = 2,
};

struct CallHeader {
  uint32_t magic;
  uint16_t version;
  Mode mode;
  uint8_t flags;    // CallFlags
  int32_t threads;  // the most threads the kernel's parallel regions use
  uint16_t name_len;
  uint16_t overload_len;
  uint16_t n_storages;
  uint16_t n_tensors;
  uint16_t n_args;
  uint16_t n_results;
  uint16_t n_known_warnings;
  uint16_t reserved;
  uint64_t settings;  // with kApplySettings: the host's (namespace settings)
};

struct StorageRecord {
  uint64_t address;  // device address of the first byte; 0: empty
  uint64_t nbytes;
};

constexpr uint16_t kInlineStorage = 0xffff;  // a CPU snapshot follows
constexpr uint16_t kNoTensor = 0xffff;       // an absent optional tensor

enum TensorFlags : uint8_t {
  kConj = 1,
  kNeg = 2,
  kWrappedNumber = 4,  // a Python number made a tensor (type promotion)
  kWritten = 8,        // a written argument: must keep its sizes and strides
  kUndefined = 16,     // an undefined tensor
};

struct TensorRecord {
  uint16_t storage;  // index into storages, or kInlineStorage
  uint8_t dtype;     // c10::ScalarType
  uint8_t flags;     // TensorFlags
  uint8_t ndim;
  uint8_t reserved[3];
  int64_t storage_offset;  // elements
  // then ndim sizes, ndim strides (int64); for kInlineStorage, a uint64
  // byte count and the bytes of the dense tensor starting at element 0.
};

enum class Tag : uint8_t {
  kNone = 0,
  kTensor,         // uint16 tensor index
  kInt,            // int64
  kDouble,         // double
  kBool,           // uint8
  kComplex,        // two doubles
  kString,         // uint32 length, bytes
  kDevice,         // int8 type, int8 index
  kIntList,        // uint32 n, n int64
  kDoubleList,     // uint32 n, n double
  kBoolList,       // uint32 n, n uint8
  kTensorList,     // uint32 n, n uint16 tensor indices
  kOptTensorList,  // uint32 n, n uint16 (kNoTensor: none)
  kGenerator,      // uint64 seed, uint64 offset: the launch's random draw
  kScalarList,     // uint32 n, n values, each kInt, kDouble, kComplex or kBool
};

struct ResultRecord {
  uint16_t ret;     // index among the operator's returns
  int16_t index;    // index in a Tensor[] return, or -1
  uint16_t tensor;  // index into tensors
};

// ---------------------------------------------------------------------------
// Described calls (Mode::kDescribe). The host does not know the call's
// results, so the device runs it and answers: the parameters of
// openreg_describe_call are a DescribeParams, the out= variant's name and
// overload (empty: no check), then the serialized call. The device writes
// its answer to `answer` (pinned host memory, which both sides reach) and
// keeps the memory of the new results until openreg_take_results copies
// them into the device blocks the host allocated from the answer's sizes
// (or drops them: no addresses). `token` names the kept results between
// the two kernels.
//
// The answer, in order:
//   AnswerHeader
//   warnings    n_warnings x (uint8 deprecation, uint8 verbatim, uint32
//               line, then file, function and message, each uint32 n and n
//               bytes): what the kernel warned, where in its source
//   error       (kFailed, kUnsupported) uint8 ErrorKind, uint32 n, n bytes,
//               then (kFailed) n_written x (uint16 tensor, uint8 ndim, ndim
//               sizes, ndim strides): the written tensors the kernel resized
//               before it raised (the CPU's out= arguments keep that shape)
//   new storages  n_new_storages x (uint64 byte size, int64 the reserved
//               block it is made in, -1: memory of the device's own)
//   replaced    n_replaced x (uint16 call storage, uint16 new storage): a
//               device storage of the call the kernel reallocated (resize_
//               of an out= argument); its tensors keep naming it
//   written     n_written x (uint16 tensor, TensorAnswer): every written
//               tensor (kWritten) after the kernel
//   returns     n_returns values: kNone, kTensor + TensorAnswer, kInt,
//               kDouble, kBool, kComplex, kTensorList (uint32 n, n
//               TensorAnswer) as in the arguments
// ---------------------------------------------------------------------------

constexpr uint32_t kAnswerMagic = 0x3141524f;  // "ORA1"

struct DescribeParams {
  uint64_t answer;    // pinned host address of the answer
  uint64_t capacity;  // its bytes
  uint64_t token;     // names the kept results
  uint16_t out_name_len;
  uint16_t out_overload_len;
  uint32_t call_bytes;
  // After the call's bytes: n_reserved x ReservedBlock, the device memory
  // the host allocated for the results before the launch; a new storage of
  // exactly a block's size is made in it (engine/kernels/OpenRegWorkspace.h).
  uint32_t n_reserved;
  uint32_t reserved_pad;
  // The most bytes one allocation of the call's CPU kernel may take (0: no
  // limit): what the device has free (at least 1), for a call that reserved
  // nothing (results' sizes that depend on the data, a small call that
  // skipped its Meta kernel, engine/fallback/OpenRegReservedResults.cpp). A
  // larger one raises torch.OutOfMemoryError before the kernel fills it, as
  // it could not fit on a device either.
  uint64_t workspace_limit;
};

struct ReservedBlock {
  uint64_t address;  // device address
  uint64_t bytes;
};

// openreg_take_results: a TakeResultsParams, then n uint64 device addresses
// (one per new storage of the answer, in order; 0 for an empty one).
struct TakeResultsParams {
  uint64_t token;
  uint64_t n;  // 0: drop the kept results
};

enum class AnswerStatus : uint8_t {
  kDone = 0,
  kFailed = 1,       // the CPU kernel threw: the error section says what
  kUnsupported = 2,  // a result the answer cannot carry (the error says)
  kTooLarge = 3,     // the answer needs AnswerHeader::size bytes
  // The device has no such operator (one registered in the host's process
  // only, such as a CPU kernel written in Python): nothing ran.
  kUnknownOperator = 4,
};

// The c10 error class of a failure, which the host raises again.
enum class ErrorKind : uint8_t {
  kError = 0,  // c10::Error (RuntimeError)
  kIndex,
  kValue,
  kType,
  kNotImplemented,
  kLinAlg,
  kOutOfMemory,
  kEnforceFinite,
  kOther,  // a std::exception
};

// A written tensor a failed call's kernel resized (see the answer above).
struct ResizedTensor {
  uint16_t tensor = 0;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
};

struct AnswerHeader {
  uint32_t magic;
  AnswerStatus status;
  uint8_t out_variant_matches;  // the out= variant's check passed
  uint16_t n_warnings;
  uint32_t size;  // bytes of the whole answer
  uint16_t n_new_storages;
  uint16_t n_replaced;
  uint16_t n_written;
  uint16_t n_returns;
};

enum class Where : uint8_t {
  kUndefined = 0,    // an undefined tensor
  kCallStorage = 1,  // a view of one of the call's device storages
  kNewStorage = 2,   // memory the kernel allocated
};

struct TensorAnswer {
  Where where;
  uint8_t dtype;
  uint8_t flags;  // TensorFlags: kConj, kNeg
  uint8_t ndim;
  uint16_t storage;  // index among the call's storages or the new ones
  uint16_t reserved;
  int64_t storage_offset;
  // then ndim sizes, ndim strides (int64)
};

// Appends packed values to a byte buffer.
class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) {}

  template <typename T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    put_bytes(&value, sizeof(T));
  }
  void put_bytes(const void* data, size_t n) {
    // Appended without zero-filling first (resize would). The host's
    // encoder of queued calls, the hot path, writes into fixed buffers of
    // its own instead (engine/fallback/OpenRegCallEncoder.cpp).
    const auto* p = static_cast<const uint8_t*>(data);
    out_.insert(out_.end(), p, p + n);
  }
  size_t size() const { return out_.size(); }
  uint8_t* at(size_t offset) { return out_.data() + offset; }

 private:
  std::vector<uint8_t>& out_;
};

// Reads packed values, checking every read against the end: a short or
// corrupt buffer is an error, never a read past it.
class Reader {
 public:
  Reader(const void* data, size_t size)
      : p_(static_cast<const uint8_t*>(data)), end_(p_ + size) {}

  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T value;
    std::memcpy(&value, take(sizeof(T)), sizeof(T));
    return value;
  }
  const uint8_t* take(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) {
      throw std::runtime_error(
          "openreg: a serialized call ends early (wanted " + std::to_string(n) +
          " more bytes, " + std::to_string(end_ - p_) + " left)");
    }
    const uint8_t* at = p_;
    p_ += n;
    return at;
  }
  bool done() const { return p_ == end_; }
  const uint8_t* rest() const { return p_; }
  size_t left() const { return static_cast<size_t>(end_ - p_); }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace openreg::call
