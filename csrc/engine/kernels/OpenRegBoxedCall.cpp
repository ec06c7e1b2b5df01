#include "engine/kernels/OpenRegBoxedCall.h"

#include <ATen/Context.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "engine/kernels/OpenRegCallAnswer.h"
#include "engine/kernels/OpenRegCallFormat.h"
#include "kernels/OpenRegKernelGenerator.h"

namespace openreg {

namespace {

using call::Reader;
using call::Tag;

// The operator named `name`.`overload` if this process has it.
std::optional<c10::OperatorHandle> lookup_operator(const char* name,
                                                   size_t name_len,
                                                   const char* overload,
                                                   size_t overload_len) {
  return c10::Dispatcher::singleton().findOp(
      {std::string(name, name_len), std::string(overload, overload_len)});
}

// The operator named `name`.`overload`, looked up once per thread.
const c10::OperatorHandle& find_operator(const char* name, size_t name_len,
                                         const char* overload,
                                         size_t overload_len) {
  thread_local std::unordered_map<std::string, c10::OperatorHandle> cache;
  thread_local std::string key;
  key.assign(name, name_len);
  key.push_back('.');
  key.append(overload, overload_len);
  auto it = cache.find(key);
  if (it != cache.end()) {
    return it->second;
  }
  std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findOp(
      {std::string(name, name_len), std::string(overload, overload_len)});
  TORCH_CHECK(op.has_value(), "openreg: the device does not know the operator ",
              key, " of a serialized call");
  return cache.emplace(key, *op).first->second;
}

// A tensor as the call names it, and what the kernel must not change.
struct DecodedTensor {
  at::Tensor view;  // undefined for an undefined tensor
  bool written = false;
  c10::SmallVector<int64_t, 5> sizes;
  c10::SmallVector<int64_t, 5> strides;
  bool conj = false;
  bool neg = false;
};

at::Tensor make_view(const c10::Storage& storage, c10::ScalarType dtype,
                     c10::IntArrayRef sizes, c10::IntArrayRef strides,
                     int64_t offset, uint8_t flags) {
  at::Tensor view = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
      c10::scalarTypeToTypeMeta(dtype));
  view.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  if ((flags & call::kConj) != 0) {
    view._set_conj(true);
  }
  if ((flags & call::kNeg) != 0) {
    view._set_neg(true);
  }
  return view;
}

// Hands the kernel's warnings to a WarningSink, but for the known ones.
class SinkWarnings : public c10::WarningHandler {
 public:
  SinkWarnings(WarningSink sink, c10::ArrayRef<uint64_t> known)
      : sink_(sink), known_(known) {}
  void process(const c10::Warning& warning) override {
    const std::string& msg = warning.msg();
    const uint64_t hash = call::warning_hash(msg.data(), msg.size());
    if (std::find(known_.begin(), known_.end(), hash) == known_.end()) {
      sink_.fn(sink_.state, msg.c_str());
    }
  }

 private:
  WarningSink sink_;
  c10::ArrayRef<uint64_t> known_;
};

class Decoder {
 public:
  Decoder(const void* bytes, size_t size, Translate translate,
          WarningSink warnings)
      : r_(bytes, size), translate_(translate), warnings_(warnings) {}

  void run() {
    torch::jit::Stack stack = decode();
    TORCH_CHECK(h_.mode != call::Mode::kDescribe,
                "openreg: a described call came to openreg_boxed_call");
    if (h_.mode == call::Mode::kIntoResults) {
      for (const call::ResultRecord& rec : results_) {
        stack.emplace_back(tensors_[rec.tensor].view);
      }
    }
    {
      SinkWarnings sink(warnings_, known_);
      std::optional<c10::WarningUtils::WarningHandlerGuard> to_sink;
      if ((h_.flags & call::kForwardWarnings) != 0 && warnings_.fn != nullptr) {
        to_sink.emplace(&sink);
      }
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      op_->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
    }
    check_written();
    if (h_.mode == call::Mode::kCopyResults) {
      copy_results(stack, results_);
    }
  }

  // [doc:described-call-device]
  // A described call: the CPU kernel runs, then the answer says what it
  // did, in terms the host can map back to its own tensors: the call's
  // storages by index, new memory by index, a failure by its error class.
  std::vector<c10::Storage> describe(const std::string& out_name,
                                     const std::string& out_overload,
                                     uint8_t* answer, size_t capacity) {
    if (!knows_operator()) {
      AnswerWriter a;
      return a.fail(
          RecordWarnings(), call::AnswerStatus::kUnknownOperator,
          call::ErrorKind::kNotImplemented,
          "the device has no operator " + boxed_call_name(r_.rest(), r_.left()),
          answer, capacity);
    }
    torch::jit::Stack stack = decode();
    TORCH_CHECK(h_.mode == call::Mode::kDescribe,
                "openreg: openreg_describe_call got a call of mode ",
                static_cast<int>(h_.mode));
    c10::SmallVector<const void*, 4> bases;
    for (const c10::Storage& s : storages_) {
      bases.push_back(s.data());
    }
    // The arguments again, for the out= variant's check.
    const torch::jit::Stack args =
        out_name.empty() ? torch::jit::Stack{} : stack;
    AnswerWriter a;
    RecordWarnings recorded;
    {
      const c10::WarningUtils::WarningHandlerGuard guard(&recorded);
      try {
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        op_->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU),
                             &stack);
      } catch (const c10::Error& e) {
        return a.fail(recorded, call::AnswerStatus::kFailed, error_kind(e),
                      e.what_without_backtrace(), answer, capacity,
                      resized_written());
      } catch (const std::exception& e) {
        return a.fail(recorded, call::AnswerStatus::kFailed,
                      call::ErrorKind::kOther, e.what(), answer, capacity,
                      resized_written());
      }
    }
    c10::SmallVector<std::pair<uint16_t, at::Tensor>, 2> written;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (tensors_[i].written) {
        written.emplace_back(static_cast<uint16_t>(i), tensors_[i].view);
      }
    }
    const size_t n_returns = op_->schema().returns().size();
    TORCH_CHECK(stack.size() >= n_returns, "openreg: the kernel left ",
                stack.size(), " values for ", n_returns, " returns");
    RanCall ran;
    ran.storages = storages_;
    ran.bases = bases;
    ran.written = written;
    ran.returns =
        c10::ArrayRef<c10::IValue>(stack).slice(stack.size() - n_returns);
    if (!out_name.empty()) {
      ran.out_op = &find_operator(out_name.data(), out_name.size(),
                                  out_overload.data(), out_overload.size());
      ran.args = &args;
    }
    return answer_done(ran, recorded, a, answer, capacity);
  }
  // [/doc:described-call-device]

 private:
  // The written tensors the CPU kernel resized before it raised (as on the
  // CPU, its out= arguments keep their new shape): their index and new
  // sizes and strides, for a failed call's answer.
  std::vector<call::ResizedTensor> resized_written() const {
    std::vector<call::ResizedTensor> out;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const DecodedTensor& t = tensors_[i];
      if (!t.written || !t.view.defined() ||
          (t.view.sizes() == c10::IntArrayRef(t.sizes) &&
           t.view.strides() == c10::IntArrayRef(t.strides))) {
        continue;
      }
      call::ResizedTensor r;
      r.tensor = static_cast<uint16_t>(i);
      r.sizes.assign(t.view.sizes().begin(), t.view.sizes().end());
      r.strides.assign(t.view.strides().begin(), t.view.strides().end());
      out.push_back(std::move(r));
    }
    return out;
  }

  // Whether this process has the call's operator with a CPU kernel (not
  // one registered in the host's process only).
  bool knows_operator() const {
    call::CallHeader h{};
    if (r_.left() < sizeof(h)) {
      return true;  // decode() says what is wrong
    }
    std::memcpy(&h, r_.rest(), sizeof(h));
    if (r_.left() < sizeof(h) + size_t{h.name_len} + h.overload_len) {
      return true;
    }
    const char* name = reinterpret_cast<const char*>(r_.rest()) + sizeof(h);
    const std::optional<c10::OperatorHandle> op =
        lookup_operator(name, h.name_len, name + h.name_len, h.overload_len);
    return op.has_value() &&
           op->hasComputedKernelForDispatchKey(c10::DispatchKey::CPU);
  }

  // The call's header and tables, then its arguments as a stack.
  torch::jit::Stack decode() {
    const auto h = r_.get<call::CallHeader>();
    TORCH_CHECK(h.magic == call::kMagic && h.version == call::kVersion,
                "openreg: not a serialized call of version ", call::kVersion,
                " (magic ", h.magic, ", version ", h.version, ")");
    const char* name = reinterpret_cast<const char*>(r_.take(h.name_len));
    const char* overload =
        reinterpret_cast<const char*>(r_.take(h.overload_len));
    const c10::OperatorHandle& op =
        find_operator(name, h.name_len, overload, h.overload_len);
    h_ = h;  // storage() reads the mode
    if ((h.flags & call::kApplySettings) != 0) {
      apply_settings(h.settings);
    }
    c10::SmallVector<uint64_t, 2> known(h.n_known_warnings);
    for (uint64_t& hash : known) {
      hash = r_.get<uint64_t>();
    }
    storages_.reserve(h.n_storages);
    for (uint16_t i = 0; i < h.n_storages; ++i) {
      storages_.push_back(storage(r_.get<call::StorageRecord>()));
    }
    tensors_.reserve(h.n_tensors);
    for (uint16_t i = 0; i < h.n_tensors; ++i) {
      tensors_.push_back(tensor());
    }
    torch::jit::Stack stack;
    stack.reserve(h.n_args + h.n_results);
    for (uint16_t i = 0; i < h.n_args; ++i) {
      stack.push_back(value());
    }
    c10::SmallVector<call::ResultRecord, 2> results(h.n_results);
    for (call::ResultRecord& rec : results) {
      rec = r_.get<call::ResultRecord>();
      TORCH_CHECK(rec.tensor < tensors_.size(), "openreg: result tensor ",
                  rec.tensor, " of ", tensors_.size());
    }
    TORCH_CHECK(r_.done(), "openreg: a serialized call has trailing bytes");
    op_ = &op;
    known_ = std::move(known);
    results_ = std::move(results);
    return stack;
  }

  c10::Storage storage(const call::StorageRecord& rec) {
    void* base = nullptr;
    if (rec.address != 0) {
      const void* device = reinterpret_cast<const void*>(rec.address);
      base = translate_.fn(translate_.state, device);
      TORCH_CHECK(base != nullptr, "openreg: the device address ", device,
                  " of a serialized call is not device memory");
    }
    // Non-owning: the device memory outlives the kernel (stream order). A
    // described call may resize its out= arguments, as the CPU kernel
    // would: their storage then moves to memory the answer names.
    c10::DataPtr data(base, c10::Device(c10::DeviceType::CPU));
    const bool describe = h_.mode == call::Mode::kDescribe;
    return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), rec.nbytes, std::move(data),
        describe ? c10::GetCPUAllocator() : nullptr, describe));
  }

  DecodedTensor tensor() {
    const auto rec = r_.get<call::TensorRecord>();
    DecodedTensor t;
    t.sizes.resize(rec.ndim);
    t.strides.resize(rec.ndim);
    for (int64_t& s : t.sizes) {
      s = r_.get<int64_t>();
    }
    for (int64_t& s : t.strides) {
      s = r_.get<int64_t>();
    }
    if ((rec.flags & call::kUndefined) != 0) {
      return t;
    }
    const auto dtype = static_cast<c10::ScalarType>(rec.dtype);
    TORCH_CHECK(rec.dtype < static_cast<uint8_t>(c10::ScalarType::NumOptions),
                "openreg: a serialized tensor has dtype number ",
                static_cast<int>(rec.dtype));
    t.written = (rec.flags & call::kWritten) != 0;
    t.conj = (rec.flags & call::kConj) != 0;
    t.neg = (rec.flags & call::kNeg) != 0;
    if (rec.storage == call::kInlineStorage) {
      // A CPU tensor's snapshot: dense, element 0 first. Copied out of the
      // parameters (which need not be aligned) into memory of its own,
      // without a dispatched allocation: a Python number's (a few bytes)
      // goes to the decoder's own aligned space.
      const auto nbytes = r_.get<uint64_t>();
      const uint8_t* data = r_.take(nbytes);
      const int64_t numel = c10::multiply_integers(t.sizes);
      TORCH_CHECK(numel * static_cast<int64_t>(c10::elementSize(dtype)) ==
                      static_cast<int64_t>(nbytes),
                  "openreg: a CPU tensor of ", numel, " ", dtype,
                  " elements comes with ", nbytes, " bytes");
      c10::DataPtr owned;
      if (nbytes <= sizeof(Small) && small_used_ < kSmall) {
        void* at = &small_[small_used_++];
        std::memcpy(at, data, nbytes);
        owned = c10::DataPtr(at, c10::Device(c10::DeviceType::CPU));
      } else {
        owned = c10::GetCPUAllocator()->allocate(nbytes);
        std::memcpy(owned.get(), data, nbytes);
      }
      c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(
          c10::StorageImpl::use_byte_size_t(), nbytes, std::move(owned),
          nullptr, false));
      t.view = make_view(storage, dtype, t.sizes, t.strides, 0, rec.flags);
      if ((rec.flags & call::kWrappedNumber) != 0) {
        t.view.unsafeGetTensorImpl()->set_wrapped_number(true);
      }
      return t;
    }
    TORCH_CHECK(rec.storage < storages_.size(), "openreg: storage ",
                rec.storage, " of ", storages_.size());
    t.view = make_view(storages_[rec.storage], dtype, t.sizes, t.strides,
                       rec.storage_offset, rec.flags);
    return t;
  }

  const at::Tensor& tensor_at(uint16_t index) {
    TORCH_CHECK(index < tensors_.size(), "openreg: tensor ", index, " of ",
                tensors_.size());
    return tensors_[index].view;
  }

  template <typename T>
  std::vector<T> array() {
    std::vector<T> out(r_.get<uint32_t>());
    for (T& v : out) {
      v = r_.get<T>();
    }
    return out;
  }

  c10::IValue value() {
    switch (r_.get<Tag>()) {
      case Tag::kNone:
        return c10::IValue();
      case Tag::kTensor:
        return tensor_at(r_.get<uint16_t>());
      case Tag::kInt:
        return r_.get<int64_t>();
      case Tag::kDouble:
        return r_.get<double>();
      case Tag::kBool:
        return r_.get<uint8_t>() != 0;
      case Tag::kComplex: {
        const auto re = r_.get<double>();
        const auto im = r_.get<double>();
        return c10::complex<double>(re, im);
      }
      case Tag::kString: {
        const auto n = r_.get<uint32_t>();
        return std::string(reinterpret_cast<const char*>(r_.take(n)), n);
      }
      case Tag::kDevice: {
        const auto type = r_.get<int8_t>();
        const auto index = r_.get<int8_t>();
        return c10::Device(static_cast<c10::DeviceType>(type), index);
      }
      case Tag::kIntList:
        return array<int64_t>();
      case Tag::kDoubleList:
        return array<double>();
      case Tag::kBoolList: {
        c10::List<bool> list;
        for (uint8_t b : array<uint8_t>()) {
          list.push_back(b != 0);
        }
        return list;
      }
      case Tag::kTensorList: {
        c10::List<at::Tensor> list;
        for (uint16_t i : array<uint16_t>()) {
          list.push_back(tensor_at(i));
        }
        return list;
      }
      case Tag::kOptTensorList: {
        c10::List<std::optional<at::Tensor>> list;
        for (uint16_t i : array<uint16_t>()) {
          list.push_back(i == call::kNoTensor
                             ? std::optional<at::Tensor>()
                             : std::optional<at::Tensor>(tensor_at(i)));
        }
        return list;
      }
      case Tag::kScalarList: {
        c10::impl::GenericList list(c10::NumberType::get());
        const auto n = r_.get<uint32_t>();
        for (uint32_t i = 0; i < n; ++i) {
          c10::IValue v = value();
          TORCH_CHECK(v.isScalar(), "openreg: a scalar list holds ",
                      v.tagKind());
          list.push_back(std::move(v));
        }
        return list;
      }
      case Tag::kGenerator: {
        const auto seed = r_.get<uint64_t>();
        const auto offset = r_.get<uint64_t>();
        return kernel_generator(seed, offset);
      }
    }
    TORCH_CHECK(false, "openreg: a serialized call has an unknown value tag");
  }

  // A written argument keeps the shape the host gave it at the call.
  void check_written() const {
    for (const DecodedTensor& t : tensors_) {
      if (!t.written) {
        continue;
      }
      TORCH_CHECK(t.view.sizes() == c10::IntArrayRef(t.sizes) &&
                      t.view.strides() == c10::IntArrayRef(t.strides),
                  "the CPU kernel resized an out= argument of shape ",
                  c10::IntArrayRef(t.sizes), " to ", t.view.sizes(),
                  " on the device; the host should have resized it at the "
                  "call");
      TORCH_INTERNAL_ASSERT(
          t.conj == t.view.is_conj() && t.neg == t.view.is_neg(),
          "the CPU kernel changed the conjugate/negative bit of its out= "
          "argument in a queued launch (such signatures run synchronously)");
    }
  }

  void copy_results(const torch::jit::Stack& out,
                    c10::ArrayRef<call::ResultRecord> results) {
    for (const call::ResultRecord& rec : results) {
      TORCH_CHECK(rec.ret < out.size(), "openreg: return ", rec.ret, " of ",
                  out.size());
      const c10::IValue& v = out[rec.ret];
      const at::Tensor result =
          rec.index < 0 ? v.toTensor() : v.toTensorList()[rec.index];
      const at::Tensor& dst = tensors_[rec.tensor].view;
      TORCH_CHECK(result.defined() && result.sizes() == dst.sizes() &&
                      result.dtype() == dst.dtype(),
                  "the CPU kernel's result differs from the plan's ",
                  dst.sizes(), " ", dst.dtype());
      dst.copy_(result);
    }
  }

  // Space for small CPU tensors (Python numbers), which must outlive every
  // view of them: the decoder lives until the call has run.
  struct alignas(16) Small {
    unsigned char bytes[16];
  };
  static constexpr size_t kSmall = 4;
  Small small_[kSmall];
  size_t small_used_ = 0;

  call::CallHeader h_{};
  const c10::OperatorHandle* op_ = nullptr;
  c10::SmallVector<uint64_t, 2> known_;
  c10::SmallVector<call::ResultRecord, 2> results_;
  Reader r_;
  Translate translate_;
  WarningSink warnings_;
  c10::SmallVector<c10::Storage, 4> storages_;
  c10::SmallVector<DecodedTensor, 4> tensors_;
};

}  // namespace

void run_boxed_call(const void* bytes, size_t size, Translate translate,
                    WarningSink warnings) {
  Decoder(bytes, size, translate, warnings).run();
}

std::vector<c10::Storage> describe_boxed_call(const void* bytes, size_t size,
                                              Translate translate,
                                              const std::string& out_name,
                                              const std::string& out_overload,
                                              uint8_t* answer,
                                              size_t capacity) {
  TORCH_CHECK(capacity >= sizeof(call::AnswerHeader),
              "openreg: a described call's answer needs at least ",
              sizeof(call::AnswerHeader), " bytes, got ", capacity);
  return Decoder(bytes, size, translate, {})
      .describe(out_name, out_overload, answer, capacity);
}

std::string boxed_call_name(const void* bytes, size_t size) {
  call::CallHeader h{};
  if (bytes == nullptr || size < sizeof(h)) {
    return "";
  }
  std::memcpy(&h, bytes, sizeof(h));
  if (size < sizeof(h) + size_t{h.name_len} + h.overload_len) {
    return "";
  }
  const char* text = static_cast<const char*>(bytes) + sizeof(h);
  std::string name(text, h.name_len);
  if (h.overload_len > 0) {
    name.append(".").append(text + h.name_len, h.overload_len);
  }
  return name;
}

}  // namespace openreg
