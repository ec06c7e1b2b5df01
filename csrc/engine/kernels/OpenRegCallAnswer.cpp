#include "engine/kernels/OpenRegCallAnswer.h"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/ScalarType.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <sstream>
#include <utility>

#include "engine/kernels/OpenRegReservedBlocks.h"

namespace openreg {

using call::Tag;

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

namespace {

// The out= variant `out_op` run on new outputs like `returns`
// (the functional results): did it write the same bytes in place, without
// resizing or reallocating them? As the host's check of a staged first run
// (engine/fallback/OpenRegFallback.cpp, "fallback-out-variant-check").
bool out_variant_matches(const c10::OperatorHandle& out_op,
                         const torch::jit::Stack& args,
                         c10::ArrayRef<c10::IValue> returns,
                         c10::ArrayRef<c10::Storage> fresh) {
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
    out_op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
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

}  // namespace

// [doc:described-call-answer]
std::vector<c10::Storage> answer_done(const RanCall& ran,
                                      const RecordWarnings& recorded,
                                      AnswerWriter& a, uint8_t* answer,
                                      size_t capacity) {
  // Call storages the kernel reallocated (resize_ of an out= argument).
  std::vector<c10::Storage> fresh;
  c10::SmallVector<std::pair<uint16_t, uint16_t>, 2> replaced;
  for (size_t k = 0; k < ran.storages.size(); ++k) {
    if (ran.storages[k].data() != ran.bases[k]) {
      replaced.emplace_back(static_cast<uint16_t>(k),
                            static_cast<uint16_t>(fresh.size()));
      fresh.push_back(ran.storages[k]);
    }
  }
  std::string unsupported;
  auto locate = [&](const c10::Storage& s) -> std::pair<call::Where, size_t> {
    for (size_t k = 0; k < ran.storages.size(); ++k) {
      if (s.unsafeGetStorageImpl() == ran.storages[k].unsafeGetStorageImpl()) {
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
    if (t.layout() != c10::kStrided || t.is_nested() || !t.device().is_cpu() ||
        !t.has_storage() || t._is_zerotensor() ||
        c10::isQIntType(t.scalar_type()) || t.dim() > 255) {
      if (unsupported.empty()) {
        std::ostringstream why;
        why << "a result of layout " << t.layout() << ", device " << t.device()
            << ", dtype " << t.scalar_type()
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
    rec.flags = (t.is_conj() ? call::kConj : 0) | (t.is_neg() ? call::kNeg : 0);
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
  for (const auto& [index, view] : ran.written) {
    written.put(index);
    tensor_answer(written, view);
    ++n_written;
  }
  const c10::ArrayRef<c10::IValue> returns = ran.returns;
  const size_t n_returns = returns.size();
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
      ran.out_op != nullptr &&
      out_variant_matches(*ran.out_op, *ran.args, returns, fresh);
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
              "openreg: a described call made ", fresh.size(), " new storages");
  std::vector<uint8_t>& body = a.begin(h, recorded);
  call::Writer w(body);
  for (const c10::Storage& s : fresh) {
    w.put(static_cast<uint64_t>(s.nbytes()));
    w.put(static_cast<int64_t>(kernels::reserved_block_of(s.data())));
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
// [/doc:described-call-answer]

}  // namespace openreg
