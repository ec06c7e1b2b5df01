#include "engine/fallback/OpenRegCallEncoder.h"

#include <ATen/core/jit_type.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>
#include <c10/util/TypeCast.h>
#include <openreg.h>

#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "aten/OpenRegLaunch.h"
#include "aten/fallback/OpenRegIValue.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegLaunchStats.h"
#include "core/OpenRegNamedKernels.h"
#include "engine/fallback/OpenRegLaunchPlan.h"

namespace openreg {

namespace {

using call::Tag;

// Appends to a buffer of OR_MAX_KERNEL_PARAMS bytes, the most a call may
// take: what does not fit is a call the format cannot carry. A fixed-size
// value is one bounds check and a copy the compiler inlines, where
// appending to a std::vector (call::Writer) costs a range insert each: a
// queued call writes some thirty values.
class Bytes {
 public:
  static constexpr size_t kCapacity = OR_MAX_KERNEL_PARAMS;

  explicit Bytes(uint8_t* data) : data_(data) {}

  template <typename T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    put_bytes(&value, sizeof(T));
  }
  void put_bytes(const void* p, size_t n) {
    if (n > kCapacity - size_) {
      overflow_ = true;
      return;
    }
    std::memcpy(data_ + size_, p, n);
    size_ += n;
  }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool overflow() const { return overflow_; }

 private:
  uint8_t* data_;
  size_t size_ = 0;
  bool overflow_ = false;
};

// The calling thread's two buffers (the arguments, then the tables), made
// on its first call.
struct Scratch {
  std::unique_ptr<uint8_t[]> body{new uint8_t[Bytes::kCapacity]};
  std::unique_ptr<uint8_t[]> tables{new uint8_t[Bytes::kCapacity]};
};

class Encoder {
 public:
  explicit Encoder(Bytes& out) : w_(out) {}

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
      array<int64_t>(v.toListRef());
    } else if (v.isDoubleList()) {
      put(Tag::kDoubleList);
      array<double>(v.toListRef());
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
  bool tables(Bytes& w, std::vector<c10::Storage>* storages_out,
              std::vector<at::Tensor>* tensors_out) {
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
      // A CPU tensor's dense form: itself, or a contiguous copy.
      const at::Tensor* cpu = nullptr;
      at::Tensor contiguous;
      if (is_openreg(t)) {
        const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
        while (storages[rec.storage] != impl) {
          ++rec.storage;
        }
        rec.storage_offset = t.storage_offset();
      } else {
        // A snapshot of a CPU tensor: its dense bytes, element 0 first.
        cpu = &t;
        if (!t.is_non_overlapping_and_dense()) {
          contiguous = t.contiguous();
          cpu = &contiguous;
        }
        rec.storage = call::kInlineStorage;
      }
      const at::Tensor& shape = cpu != nullptr ? *cpu : t;
      // A Python number, perhaps sent in the dtype the kernel computes in
      // (doc:wrapped-number-dtype in OpenRegOpTraits.cpp).
      const bool wrapped = t.unsafeGetTensorImpl()->is_wrapped_number();
      double as_double = 0;
      float as_float = 0;
      const void* converted = nullptr;
      c10::ScalarType dtype = t.scalar_type();
      if (wrapped && cpu != nullptr && wrapped_dtype_.has_value() &&
          *wrapped_dtype_ != dtype &&
          (dtype == c10::ScalarType::Long ||
           dtype == c10::ScalarType::Double)) {
        const bool from_long = dtype == c10::ScalarType::Long;
        const int64_t i = from_long ? *cpu->const_data_ptr<int64_t>() : 0;
        const double d = from_long ? 0 : *cpu->const_data_ptr<double>();
        dtype = *wrapped_dtype_;
        if (dtype == c10::ScalarType::Float) {
          as_float =
              from_long ? c10::convert<float>(i) : c10::convert<float>(d);
          converted = &as_float;
        } else {
          as_double = c10::convert<double>(i);  // only from int64 here
          converted = &as_double;
        }
      }
      rec.dtype = static_cast<uint8_t>(dtype);
      rec.flags = (t.is_conj() ? call::kConj : 0) |
                  (t.is_neg() ? call::kNeg : 0) |
                  (e.written ? call::kWritten : 0) |
                  (wrapped ? call::kWrappedNumber : 0);
      rec.ndim = static_cast<uint8_t>(t.dim());
      w.put(rec);
      for (int64_t s : shape.sizes()) {
        w.put(s);
      }
      for (int64_t s : shape.strides()) {
        w.put(s);
      }
      if (converted != nullptr) {
        const uint64_t nbytes = c10::elementSize(dtype);
        w.put(nbytes);
        w.put_bytes(converted, nbytes);
      } else if (cpu != nullptr) {
        const uint64_t nbytes = cpu->nbytes();
        if (nbytes > OR_MAX_KERNEL_PARAMS) {
          return false;
        }
        w.put(nbytes);
        w.put_bytes(cpu->const_data_ptr(), nbytes);
      }
    }
    if (storages.size() >= call::kInlineStorage) {
      return false;
    }
    n_storages_ = static_cast<uint16_t>(storages.size());
    return !w.overflow();
  }

  // Wrapped numbers go to the device in this dtype, if set.
  void set_wrapped_number_dtype(std::optional<c10::ScalarType> dtype) {
    wrapped_dtype_ = dtype;
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

  // A list of ints or doubles, its elements read in place.
  template <typename T>
  void array(c10::ArrayRef<c10::IValue> values) {
    w_.put(static_cast<uint32_t>(values.size()));
    for (const c10::IValue& v : values) {
      if constexpr (std::is_same_v<T, double>) {
        w_.put(v.toDouble());
      } else {
        w_.put(v.toInt());
      }
    }
  }

  void put(Tag tag) { w_.put(tag); }

  Bytes& w_;
  std::optional<c10::ScalarType> wrapped_dtype_;
  c10::SmallVector<Entry, 4> tensors_;
  uint16_t n_storages_ = 0;
};

}  // namespace

bool encode_call(const CallToEncode& c, std::vector<uint8_t>& out) {
  TORCH_INTERNAL_ASSERT(c.op != nullptr && c.traits != nullptr);
  TORCH_INTERNAL_ASSERT(c.results.size() == c.result_slots.size());
  out.clear();
  // The arguments and results first (they build the tensor table), then the
  // tables; in the thread's buffers, so that a warm call allocates nothing.
  thread_local Scratch scratch;
  Bytes body(scratch.body.get());
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
  for (const call::ResultRecord& r : results) {
    body.put(r);
  }
  if (c.storages != nullptr) {
    c.storages->clear();
  }
  if (c.tensors != nullptr) {
    c.tensors->clear();
  }
  enc.set_wrapped_number_dtype(wrapped_number_dtype(*c.traits, c.args));
  Bytes tables(scratch.tables.get());
  if (body.overflow() || !enc.tables(tables, c.storages, c.tensors)) {
    return false;
  }
  const c10::FunctionSchema& schema = c.op->schema();
  const std::string& name = schema.name();
  const std::string& overload = schema.overload_name();
  call::CallHeader h{};
  h.magic = call::kMagic;
  h.version = call::kVersion;
  h.mode = c.mode;
  h.flags =
      (c.forward_warnings ? call::kForwardWarnings : 0) |
      (c.apply_settings ? call::kApplySettings : 0) |
      (may_use_fewer_threads(*c.traits, c.args, c.results) ? call::kFewerThreads
                                                           : 0);
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
  const size_t total = sizeof(h) + name.size() + overload.size() +
                       h.n_known_warnings * sizeof(uint64_t) + tables.size() +
                       body.size();
  if (total > OR_MAX_KERNEL_PARAMS) {
    return false;
  }
  out.resize(total);
  uint8_t* p = out.data();
  auto append = [&p](const void* data, size_t n) {
    std::memcpy(p, data, n);
    p += n;
  };
  append(&h, sizeof(h));
  append(name.data(), name.size());
  append(overload.data(), overload.size());
  for (size_t i = 0; i < h.n_known_warnings; ++i) {
    const std::string& msg = c.known_warnings[i].msg();
    const uint64_t hash = call::warning_hash(msg.data(), msg.size());
    append(&hash, sizeof(hash));
  }
  append(tables.data(), tables.size());
  append(body.data(), body.size());
  TORCH_INTERNAL_ASSERT(p == out.data() + out.size());
  return true;
}

bool launch_boxed_call(c10::DeviceIndex device, const std::string& op_name,
                       const c10::OperatorHandle& op,
                       c10::ArrayRef<c10::IValue> args,
                       c10::ArrayRef<at::Tensor> results, int64_t elements) {
  c10::SmallVector<at::Tensor, 4> defined;
  c10::SmallVector<std::pair<size_t, int>, 4> slots;
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].defined()) {
      defined.push_back(results[i]);
      slots.emplace_back(i, -1);
    }
  }
  CallToEncode call;
  call.op = &op;
  call.mode = call::Mode::kCopyResults;
  call.traits = &op_traits(op);
  call.args = args;
  call.results = defined;
  call.result_slots = slots;
  call.threads = kernel_thread_cap(elements);
  call.forward_warnings = host_kernels_supported();  // see OpenRegCallFormat.h
  thread_local std::vector<uint8_t> bytes;
  if (!encode_call(call, bytes)) {
    return false;
  }
  if (!defined.empty()) {
    stats::count_op(stats::kCopied, op_name.c_str());
  }
  launch_function(device, op_name, named_kernel(NamedKernel::kBoxedCall),
                  bytes.data(), bytes.size(), elements);
  return true;
}

}  // namespace openreg
