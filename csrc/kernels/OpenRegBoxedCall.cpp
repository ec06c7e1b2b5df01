#include "kernels/OpenRegBoxedCall.h"

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

#include "kernels/OpenRegCallFormat.h"
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

// [doc:device-settings]
// The host's process-wide settings that a CPU kernel reads (the default
// dtype, deterministic algorithms, warn-always, the CPU backends' switches:
// call::settings), applied in a device process before each call that
// carries them (call::kApplySettings), so its kernels compute, check and
// warn as the host's would. Each is set only when it differs. Grad and
// inference mode are the host's business: the kernel runs below autograd.
void apply_settings(uint64_t word) {
  namespace bits = call::settings;
  at::Context& ctx = at::globalContext();
  auto on = [&](int bit) { return ((word >> bit) & 1) != 0; };
  const auto dtype = static_cast<c10::ScalarType>(word & 0xff);
  if (c10::get_default_dtype_as_scalartype() != dtype) {
    c10::set_default_dtype(c10::scalarTypeToTypeMeta(dtype));
  }
  if (ctx.deterministicAlgorithms() != on(bits::kDeterministic) ||
      ctx.deterministicAlgorithmsWarnOnly() !=
          on(bits::kDeterministicWarnOnly)) {
    ctx.setDeterministicAlgorithms(on(bits::kDeterministic),
                                   on(bits::kDeterministicWarnOnly));
  }
  if (ctx.deterministicFillUninitializedMemory() !=
      on(bits::kFillUninitializedMemory)) {
    ctx.setDeterministicFillUninitializedMemory(
        on(bits::kFillUninitializedMemory));
  }
  if (c10::WarningUtils::get_warnAlways() != on(bits::kWarnAlways)) {
    c10::WarningUtils::set_warnAlways(on(bits::kWarnAlways));
  }
  if (ctx.checkSparseTensorInvariants().value_or(false) !=
      on(bits::kCheckSparseInvariants)) {
    ctx.setCheckSparseTensorInvariants(on(bits::kCheckSparseInvariants));
  }
  if (ctx.userEnabledMkldnn() != on(bits::kMkldnn)) {
    ctx.setUserEnabledMkldnn(on(bits::kMkldnn));
  }
  if (ctx.deterministicMkldnn() != on(bits::kDeterministicMkldnn)) {
    ctx.setDeterministicMkldnn(on(bits::kDeterministicMkldnn));
  }
  if (ctx.userEnabledNNPACK() != on(bits::kNnpack)) {
    ctx.setUserEnabledNNPACK(on(bits::kNnpack));
  }
  if (ctx.allowFP16ReductionCPU() != on(bits::kFp16ReductionCpu)) {
    ctx.setAllowFP16ReductionCPU(on(bits::kFp16ReductionCpu));
  }
  const auto precision =
      static_cast<int>((word >> bits::kMatmulPrecisionShift) & 0x3);
  if (static_cast<int>(ctx.float32MatmulPrecision()) != precision) {
    static const char* const kNames[] = {"highest", "high", "medium"};
    ctx.setFloat32MatmulPrecision(kNames[std::min(precision, 2)]);
  }
}
// [/doc:device-settings]

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

// The error class of a failure, which the host raises again.
call::ErrorKind error_kind(const c10::Error& e) {
  using call::ErrorKind;
  if (dynamic_cast<const c10::IndexError*>(&e) != nullptr) {
    return ErrorKind::kIndex;
  }
  if (dynamic_cast<const c10::ValueError*>(&e) != nullptr) {
    return ErrorKind::kValue;
  }
  if (dynamic_cast<const c10::TypeError*>(&e) != nullptr) {
    return ErrorKind::kType;
  }
  if (dynamic_cast<const c10::NotImplementedError*>(&e) != nullptr) {
    return ErrorKind::kNotImplemented;
  }
  if (dynamic_cast<const c10::LinAlgError*>(&e) != nullptr) {
    return ErrorKind::kLinAlg;
  }
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) {
    return ErrorKind::kOutOfMemory;
  }
  if (dynamic_cast<const c10::EnforceFiniteError*>(&e) != nullptr) {
    return ErrorKind::kEnforceFinite;
  }
  return ErrorKind::kError;
}

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

  // A failed or unsupported call's answer; nothing is kept.
  std::vector<c10::Storage> fail(const RecordWarnings& recorded,
                                 call::AnswerStatus status,
                                 call::ErrorKind kind, const std::string& what,
                                 uint8_t* answer, size_t capacity) {
    call::AnswerHeader h{};
    h.status = status;
    call::Writer w(begin(h, recorded));
    w.put(kind);
    // Room for the header and the warnings: a long message is cut.
    const size_t room =
        capacity > bytes_.size() + 64 ? capacity - bytes_.size() - 64 : 0;
    text(w, what.size() > room ? what.substr(0, room) : what);
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
                      e.what_without_backtrace(), answer, capacity);
      } catch (const std::exception& e) {
        return a.fail(recorded, call::AnswerStatus::kFailed,
                      call::ErrorKind::kOther, e.what(), answer, capacity);
      }
    }
    // Call storages the kernel reallocated (resize_ of an out= argument).
    std::vector<c10::Storage> fresh;
    c10::SmallVector<std::pair<uint16_t, uint16_t>, 2> replaced;
    for (size_t k = 0; k < storages_.size(); ++k) {
      if (storages_[k].data() != bases[k]) {
        replaced.emplace_back(static_cast<uint16_t>(k),
                              static_cast<uint16_t>(fresh.size()));
        fresh.push_back(storages_[k]);
      }
    }
    std::string unsupported;
    auto locate = [&](const c10::Storage& s) -> std::pair<call::Where, size_t> {
      for (size_t k = 0; k < storages_.size(); ++k) {
        if (s.unsafeGetStorageImpl() == storages_[k].unsafeGetStorageImpl()) {
          return {call::Where::kCallStorage, k};
        }
      }
      for (size_t j = 0; j < fresh.size(); ++j) {
        if (s.unsafeGetStorageImpl() == fresh[j].unsafeGetStorageImpl()) {
          return {call::Where::kNewStorage, j};
        }
      }
      fresh.push_back(s);
      return {call::Where::kNewStorage, fresh.size() - 1};
    };
    auto tensor_answer = [&](call::Writer& w, const at::Tensor& t) {
      call::TensorAnswer rec{};
      if (!t.defined()) {
        rec.where = call::Where::kUndefined;
        w.put(rec);
        return;
      }
      if (t.layout() != c10::kStrided || t.is_nested() ||
          !t.device().is_cpu() || !t.has_storage() || t._is_zerotensor() ||
          c10::isQIntType(t.scalar_type()) || t.dim() > 255) {
        if (unsupported.empty()) {
          std::ostringstream why;
          why << "a result of layout " << t.layout() << ", device "
              << t.device() << ", dtype " << t.scalar_type()
              << (t._is_zerotensor() ? " (a zero tensor)" : "");
          unsupported = why.str();
        }
        rec.where = call::Where::kUndefined;
        w.put(rec);
        return;
      }
      const auto [where, index] = locate(t.storage());
      rec.where = where;
      rec.storage = static_cast<uint16_t>(index);
      rec.dtype = static_cast<uint8_t>(t.scalar_type());
      rec.flags =
          (t.is_conj() ? call::kConj : 0) | (t.is_neg() ? call::kNeg : 0);
      rec.ndim = static_cast<uint8_t>(t.dim());
      rec.storage_offset = t.storage_offset();
      w.put(rec);
      for (int64_t s : t.sizes()) {
        w.put(s);
      }
      for (int64_t s : t.strides()) {
        w.put(s);
      }
    };
    // Written tensors, then the returns (they may name new storages).
    std::vector<uint8_t> written_bytes;
    call::Writer written(written_bytes);
    uint16_t n_written = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (tensors_[i].written) {
        written.put(static_cast<uint16_t>(i));
        tensor_answer(written, tensors_[i].view);
        ++n_written;
      }
    }
    const size_t n_returns = op_->schema().returns().size();
    TORCH_CHECK(stack.size() >= n_returns, "openreg: the kernel left ",
                stack.size(), " values for ", n_returns, " returns");
    const c10::ArrayRef<c10::IValue> returns =
        c10::ArrayRef<c10::IValue>(stack).slice(stack.size() - n_returns);
    std::vector<uint8_t> returns_bytes;
    call::Writer ret(returns_bytes);
    for (const c10::IValue& v : returns) {
      if (v.isNone()) {
        ret.put(Tag::kNone);
      } else if (v.isTensor()) {
        ret.put(Tag::kTensor);
        tensor_answer(ret, v.toTensor());
      } else if (v.isBool()) {
        ret.put(Tag::kBool);
        ret.put(static_cast<uint8_t>(v.toBool()));
      } else if (v.isInt()) {
        ret.put(Tag::kInt);
        ret.put(v.toInt());
      } else if (v.isDouble()) {
        ret.put(Tag::kDouble);
        ret.put(v.toDouble());
      } else if (v.isComplexDouble()) {
        const c10::complex<double> c = v.toComplexDouble();
        ret.put(Tag::kComplex);
        ret.put(c.real());
        ret.put(c.imag());
      } else if (v.isTensorList()) {
        const c10::List<at::Tensor> list = v.toTensorList();
        ret.put(Tag::kTensorList);
        ret.put(static_cast<uint32_t>(list.size()));
        for (const at::Tensor& t : list) {
          tensor_answer(ret, t);
        }
      } else if (unsupported.empty()) {
        unsupported = std::string("a result of type ") + v.tagKind();
      }
    }
    if (!unsupported.empty()) {
      return a.fail(recorded, call::AnswerStatus::kUnsupported,
                    call::ErrorKind::kNotImplemented, unsupported, answer,
                    capacity);
    }
    const bool matches =
        !out_name.empty() &&
        out_variant_matches(out_name, out_overload, args, returns, fresh);
    // What the host keeps: owned memory (a CPU argument's snapshot may live
    // in this decoder).
    for (c10::Storage& s : fresh) {
      if (s.data_ptr().get_deleter() == nullptr && s.nbytes() > 0) {
        c10::DataPtr owned = c10::GetCPUAllocator()->allocate(s.nbytes());
        std::memcpy(owned.get(), s.data(), s.nbytes());
        s = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
            c10::StorageImpl::use_byte_size_t(), s.nbytes(), std::move(owned),
            nullptr, false));
      }
    }
    call::AnswerHeader h{};
    h.status = call::AnswerStatus::kDone;
    h.out_variant_matches = matches ? 1 : 0;
    h.n_new_storages = static_cast<uint16_t>(fresh.size());
    h.n_replaced = static_cast<uint16_t>(replaced.size());
    h.n_written = n_written;
    h.n_returns = static_cast<uint16_t>(n_returns);
    TORCH_CHECK(fresh.size() < call::kInlineStorage,
                "openreg: a described call made ", fresh.size(),
                " new storages");
    std::vector<uint8_t>& body = a.begin(h, recorded);
    call::Writer w(body);
    for (const c10::Storage& s : fresh) {
      w.put(static_cast<uint64_t>(s.nbytes()));
    }
    for (const auto& [k, j] : replaced) {
      w.put(k);
      w.put(j);
    }
    w.put_bytes(written_bytes.data(), written_bytes.size());
    w.put_bytes(returns_bytes.data(), returns_bytes.size());
    if (!a.finish(answer, capacity)) {
      fresh.clear();  // the host cannot take them
    }
    return fresh;
  }
  // [/doc:described-call-device]

 private:
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

  // The out= variant `name`.`overload` run on new outputs like `returns`
  // (the functional results): did it write the same bytes in place, without
  // resizing or reallocating them? As the host's check of a staged first run
  // (aten/fallback/OpenRegFallback.cpp, "fallback-out-variant-check").
  bool out_variant_matches(const std::string& name, const std::string& overload,
                           const torch::jit::Stack& args,
                           c10::ArrayRef<c10::IValue> returns,
                           c10::ArrayRef<c10::Storage> fresh) const {
    std::vector<at::Tensor> expected;
    for (const c10::IValue& v : returns) {
      if (!v.isTensor()) {
        return false;
      }
      const at::Tensor& t = v.toTensor();
      bool is_new = false;
      for (const c10::Storage& s : fresh) {
        is_new = is_new ||
                 t.storage().unsafeGetStorageImpl() == s.unsafeGetStorageImpl();
      }
      if (!t.defined() || !is_new || !t.is_non_overlapping_and_dense() ||
          t.is_conj() || t.is_neg()) {
        return false;
      }
      expected.push_back(t);
    }
    const c10::OperatorHandle& out_op = find_operator(
        name.data(), name.size(), overload.data(), overload.size());
    torch::jit::Stack stack = args;
    std::vector<at::Tensor> outs;
    c10::SmallVector<const void*, 2> where;
    for (const at::Tensor& e : expected) {
      outs.push_back(at::empty_strided(e.sizes(), e.strides(), e.options()));
      where.push_back(outs.back().const_data_ptr());
      stack.emplace_back(outs.back());
    }
    RecordWarnings dropped;  // the functional run gave them already
    try {
      const c10::WarningUtils::WarningHandlerGuard guard(&dropped);
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      out_op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU),
                             &stack);
    } catch (const std::exception&) {
      return false;
    }
    for (size_t r = 0; r < outs.size(); ++r) {
      const at::Tensor& o = outs[r];
      const at::Tensor& e = expected[r];
      if (o.const_data_ptr() != where[r] || o.sizes() != e.sizes() ||
          o.strides() != e.strides() || o.scalar_type() != e.scalar_type() ||
          std::memcmp(o.const_data_ptr(), e.const_data_ptr(),
                      static_cast<size_t>(e.numel()) * e.itemsize()) != 0) {
        return false;
      }
    }
    return true;
  }

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
