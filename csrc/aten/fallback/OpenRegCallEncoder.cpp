#include "aten/fallback/OpenRegCallEncoder.h"

#include <ATen/core/jit_type.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>
#include <openreg.h>

#include <limits>
#include <string>

#include "aten/fallback/OpenRegIValue.h"
#include "aten/fallback/OpenRegLaunchPlan.h"

namespace openreg {

namespace {

using call::Tag;

class Encoder {
 public:
  explicit Encoder(std::vector<uint8_t>& out) : w_(out) {}

  // The tensor's index in the call's tensor table, which it joins once per
  // TensorImpl; -1 if the format cannot carry it.
  int tensor(const at::Tensor& t, bool written) {
    if (t.defined()) {
      const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
      for (size_t k = 0; k < tensors_.size(); ++k) {
        if (tensors_[k].impl == impl) {
          tensors_[k].written = tensors_[k].written || written;
          return static_cast<int>(k);
        }
      }
    }
    if (tensors_.size() >= call::kInlineStorage) {
      return -1;
    }
    if (t.defined()) {
      const bool device = is_openreg(t);
      if (t.layout() != c10::kStrided ||
          (!device && t.device().type() != c10::DeviceType::CPU) ||
          t.dim() > std::numeric_limits<uint8_t>::max()) {
        return -1;
      }
    }
    tensors_.push_back(
        {t.defined() ? t.unsafeGetTensorImpl() : nullptr, &t, written});
    return static_cast<int>(tensors_.size() - 1);
  }

  bool value(const c10::IValue& v, bool written) {
    if (v.isNone()) {
      put(Tag::kNone);
    } else if (v.isTensor()) {
      const int k = tensor(v.toTensor(), written);
      if (k < 0) {
        return false;
      }
      put(Tag::kTensor);
      w_.put(static_cast<uint16_t>(k));
    } else if (v.isBool()) {  // before isInt: not a number in a schema
      put(Tag::kBool);
      w_.put(static_cast<uint8_t>(v.toBool()));
    } else if (v.isInt()) {
      put(Tag::kInt);
      w_.put(v.toInt());
    } else if (v.isDouble()) {
      put(Tag::kDouble);
      w_.put(v.toDouble());
    } else if (v.isComplexDouble()) {
      const c10::complex<double> c = v.toComplexDouble();
      put(Tag::kComplex);
      w_.put(c.real());
      w_.put(c.imag());
    } else if (v.isString()) {
      const std::string& s = v.toStringRef();
      put(Tag::kString);
      w_.put(static_cast<uint32_t>(s.size()));
      w_.put_bytes(s.data(), s.size());
    } else if (v.isDevice()) {
      put(Tag::kDevice);
      w_.put(static_cast<int8_t>(v.toDevice().type()));
      w_.put(static_cast<int8_t>(v.toDevice().index()));
    } else if (v.isIntList()) {
      put(Tag::kIntList);
      array(v.toIntList().vec());
    } else if (v.isDoubleList()) {
      put(Tag::kDoubleList);
      array(v.toDoubleList().vec());
    } else if (v.isBoolList()) {
      put(Tag::kBoolList);
      const c10::List<bool> list = v.toBoolList();
      w_.put(static_cast<uint32_t>(list.size()));
      for (bool b : list) {
        w_.put(static_cast<uint8_t>(b));
      }
    } else if (v.isTensorList()) {
      return tensor_list(Tag::kTensorList, v.toListRef());
    } else if (v.isList() && is_optional_tensor_list(v)) {
      return tensor_list(Tag::kOptTensorList, v.toListRef());
    } else if (v.isList() && is_scalar_list(v)) {
      put(Tag::kScalarList);
      w_.put(static_cast<uint32_t>(v.toListRef().size()));
      for (const c10::IValue& e : v.toListRef()) {
        if (!e.isScalar() || !value(e, false)) {
          return false;
        }
      }
    } else {
      return false;  // scalar lists, symbolic ints, tuples, ...
    }
    return true;
  }

  void generator(const RandomDraw& draw) {
    put(Tag::kGenerator);
    w_.put(draw.seed);
    w_.put(draw.offset);
  }

  // The storage and tensor tables, which the decoder reads before the
  // arguments: written once every argument is known.
  bool tables(std::vector<uint8_t>& head,
              std::vector<c10::Storage>* storages_out,
              std::vector<at::Tensor>* tensors_out) {
    head.clear();
    call::Writer w(head);
    c10::SmallVector<const c10::StorageImpl*, 4> storages;
    c10::SmallVector<call::StorageRecord, 4> records;
    for (const Entry& e : tensors_) {
      if (!e.tensor->defined() || !is_openreg(*e.tensor)) {
        continue;
      }
      const c10::Storage& s = e.tensor->storage();
      bool seen = false;
      for (const c10::StorageImpl* impl : storages) {
        seen = seen || impl == s.unsafeGetStorageImpl();
      }
      if (!seen) {
        storages.push_back(s.unsafeGetStorageImpl());
        records.push_back({reinterpret_cast<uint64_t>(s.data()), s.nbytes()});
        if (storages_out != nullptr) {
          storages_out->push_back(s);
        }
      }
    }
    if (tensors_out != nullptr) {
      for (const Entry& e : tensors_) {
        tensors_out->push_back(*e.tensor);
      }
    }
    for (const call::StorageRecord& r : records) {
      w.put(r);
    }
    for (const Entry& e : tensors_) {
      const at::Tensor& t = *e.tensor;
      call::TensorRecord rec{};
      if (!t.defined()) {
        rec.flags = call::kUndefined;
        w.put(rec);
        continue;
      }
      at::Tensor cpu;
      if (is_openreg(t)) {
        const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
        while (storages[rec.storage] != impl) {
          ++rec.storage;
        }
        rec.storage_offset = t.storage_offset();
      } else {
        // A snapshot of a CPU tensor: its dense bytes, element 0 first.
        cpu = t.is_non_overlapping_and_dense() ? t : t.contiguous();
        rec.storage = call::kInlineStorage;
      }
      const at::Tensor& shape = cpu.defined() ? cpu : t;
      rec.dtype = static_cast<uint8_t>(t.scalar_type());
      rec.flags =
          (t.is_conj() ? call::kConj : 0) | (t.is_neg() ? call::kNeg : 0) |
          (e.written ? call::kWritten : 0) |
          (t.unsafeGetTensorImpl()->is_wrapped_number() ? call::kWrappedNumber
                                                        : 0);
      rec.ndim = static_cast<uint8_t>(t.dim());
      w.put(rec);
      for (int64_t s : shape.sizes()) {
        w.put(s);
      }
      for (int64_t s : shape.strides()) {
        w.put(s);
      }
      if (cpu.defined()) {
        const uint64_t nbytes = cpu.nbytes();
        if (nbytes > OR_MAX_KERNEL_PARAMS) {
          return false;
        }
        w.put(nbytes);
        w.put_bytes(cpu.const_data_ptr(), nbytes);
      }
    }
    if (storages.size() >= call::kInlineStorage) {
      return false;
    }
    n_storages_ = static_cast<uint16_t>(storages.size());
    return true;
  }

  uint16_t n_storages() const { return n_storages_; }
  uint16_t n_tensors() const { return static_cast<uint16_t>(tensors_.size()); }

 private:
  struct Entry {
    const c10::TensorImpl* impl;  // nullptr: an undefined tensor
    // The call's own argument or result, alive while the call is encoded:
    // not a copy, which would take the GIL for a tensor only Python holds
    // (OpenRegBorrowedStack.h).
    const at::Tensor* tensor;
    bool written;
  };

  static bool is_optional_tensor_list(const c10::IValue& v) {
    const c10::TypePtr& element = v.toList().elementType();
    return element->kind() == c10::TypeKind::OptionalType &&
           element->castRaw<c10::OptionalType>()->getElementType()->kind() ==
               c10::TypeKind::TensorType;
  }

  static bool is_scalar_list(const c10::IValue& v) {
    const c10::TypeKind kind = v.toList().elementType()->kind();
    return kind == c10::TypeKind::NumberType ||
           kind == c10::TypeKind::IntType || kind == c10::TypeKind::FloatType ||
           kind == c10::TypeKind::ComplexType ||
           kind == c10::TypeKind::BoolType;
  }

  bool tensor_list(Tag tag, c10::ArrayRef<c10::IValue> list) {
    put(tag);
    w_.put(static_cast<uint32_t>(list.size()));
    for (const c10::IValue& e : list) {
      if (e.isNone()) {
        w_.put(call::kNoTensor);
        continue;
      }
      if (!e.isTensor()) {
        return false;
      }
      const int k = tensor(e.toTensor(), false);
      if (k < 0) {
        return false;
      }
      w_.put(static_cast<uint16_t>(k));
    }
    return true;
  }

  template <typename T>
  void array(const std::vector<T>& values) {
    w_.put(static_cast<uint32_t>(values.size()));
    w_.put_bytes(values.data(), values.size() * sizeof(T));
  }

  void put(Tag tag) { w_.put(tag); }

  call::Writer w_;
  c10::SmallVector<Entry, 4> tensors_;
  uint16_t n_storages_ = 0;
};

}  // namespace

bool encode_call(const CallToEncode& c, std::vector<uint8_t>& out) {
  TORCH_INTERNAL_ASSERT(c.op != nullptr && c.traits != nullptr);
  TORCH_INTERNAL_ASSERT(c.results.size() == c.result_slots.size());
  out.clear();
  // The arguments and results first (they build the tensor table), then the
  // tables; kept per thread, so that a warm call allocates nothing.
  thread_local std::vector<uint8_t> body;
  thread_local std::vector<uint8_t> tables;
  body.clear();
  Encoder enc(body);
  for (size_t i = 0; i < c.args.size(); ++i) {
    bool drawn = false;
    for (const auto& [arg, draw] : c.draws) {
      if (arg == i) {
        enc.generator(draw);
        drawn = true;
      }
    }
    if (drawn) {
      continue;
    }
    const bool written = c.traits->writes[i] && c.args[i].isTensor() &&
                         is_openreg(c.args[i].toTensor());
    if (!enc.value(c.args[i], written)) {
      return false;
    }
  }
  c10::SmallVector<call::ResultRecord, 2> results;
  for (size_t k = 0; k < c.results.size(); ++k) {
    const int t = enc.tensor(c.results[k], false);
    if (t < 0) {
      return false;
    }
    results.push_back({static_cast<uint16_t>(c.result_slots[k].first),
                       static_cast<int16_t>(c.result_slots[k].second),
                       static_cast<uint16_t>(t)});
  }
  call::Writer tail(body);
  for (const call::ResultRecord& r : results) {
    tail.put(r);
  }
  if (c.storages != nullptr) {
    c.storages->clear();
  }
  if (c.tensors != nullptr) {
    c.tensors->clear();
  }
  if (!enc.tables(tables, c.storages, c.tensors)) {
    return false;
  }
  const c10::FunctionSchema& schema = c.op->schema();
  const std::string& name = schema.name();
  const std::string& overload = schema.overload_name();
  call::CallHeader h{};
  h.magic = call::kMagic;
  h.version = call::kVersion;
  h.mode = c.mode;
  h.flags = (c.forward_warnings ? call::kForwardWarnings : 0) |
            (c.apply_settings ? call::kApplySettings : 0);
  if (c.apply_settings) {
    h.settings = static_cast<uint64_t>(host_settings());
  }
  h.threads = c.threads;
  h.name_len = static_cast<uint16_t>(name.size());
  h.overload_len = static_cast<uint16_t>(overload.size());
  h.n_storages = enc.n_storages();
  h.n_tensors = enc.n_tensors();
  h.n_args = static_cast<uint16_t>(c.args.size());
  h.n_results = static_cast<uint16_t>(results.size());
  h.n_known_warnings =
      static_cast<uint16_t>(c.forward_warnings ? c.known_warnings.size() : 0);
  call::Writer w(out);
  w.put(h);
  w.put_bytes(name.data(), name.size());
  w.put_bytes(overload.data(), overload.size());
  for (size_t i = 0; i < h.n_known_warnings; ++i) {
    const std::string& msg = c.known_warnings[i].msg();
    w.put(call::warning_hash(msg.data(), msg.size()));
  }
  w.put_bytes(tables.data(), tables.size());
  w.put_bytes(body.data(), body.size());
  return out.size() <= OR_MAX_KERNEL_PARAMS;
}

}  // namespace openreg
