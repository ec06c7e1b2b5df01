#include "aten/fallback/OpenRegLaunchPlan.h"

#include <ATen/core/LegacyTypeDispatch.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <string>
#include <unordered_map>

#include "aten/OpenRegLaunch.h"
#include "aten/fallback/OpenRegIValue.h"

namespace openreg {

namespace {

// ---------------------------------------------------------------------------
// Signatures
// ---------------------------------------------------------------------------

enum Tag : int64_t {
  kTensor = 1,
  kUndefined,
  kList,
  kNone,
  kScalarInt,
  kScalarFloat,
  kScalarComplex,
  kScalarBool,
  kInt,
  kDouble,
  kBool,
  kString,
  kGenerator,
  kOther,
};

void append_string(std::vector<int64_t>& key, const std::string& s) {
  key.push_back(static_cast<int64_t>(s.size()));
  for (size_t i = 0; i < s.size(); i += 8) {
    int64_t packed = 0;
    for (size_t j = i; j < std::min(s.size(), i + 8); ++j) {
      packed = (packed << 8) | static_cast<unsigned char>(s[j]);
    }
    key.push_back(packed);
  }
}

// Builds the signature of a call: for each tensor its device side, dtype,
// sizes, strides and flags, and how it aliases the tensors before it (the
// same tensor, or the same storage at which offset); for other arguments
// their value, or only their type where the value cannot change the
// results' metadata (see ArgKey).
class SignatureBuilder {
 public:
  explicit SignatureBuilder(std::vector<int64_t>& key) : key_(key) {}

  void tensor(const at::Tensor& t) {
    if (!t.defined()) {
      key_.push_back(kUndefined);
      return;
    }
    c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    const c10::StorageImpl* storage =
        impl->has_storage() ? impl->unsafe_storage().unsafeGetStorageImpl()
                            : nullptr;
    int64_t same_tensor = -1;
    int64_t same_storage = -1;
    for (size_t i = 0; i < impls_.size(); ++i) {
      if (impls_[i] == impl && same_tensor < 0) {
        same_tensor = static_cast<int64_t>(i);
      }
      if (storage != nullptr && storages_[i] == storage && same_storage < 0) {
        same_storage = static_cast<int64_t>(i);
      }
    }
    impls_.push_back(impl);
    storages_.push_back(storage);
    key_.push_back(kTensor);
    key_.push_back(same_tensor);
    if (same_tensor >= 0) {
      return;  // everything else is that tensor's
    }
    int64_t flags = (is_openreg(t) ? 1 : 0) |
                    (impl->is_wrapped_number() ? 2 : 0) |
                    (t.is_conj() ? 4 : 0) | (t.is_neg() ? 8 : 0) |
                    (t.layout() == c10::kStrided ? 0 : 16);
    key_.push_back(flags);
    key_.push_back(static_cast<int64_t>(t.scalar_type()));
    key_.push_back(t.dim());
    for (int64_t s : t.sizes()) {
      key_.push_back(s);
    }
    if (t.layout() == c10::kStrided) {
      for (int64_t s : t.strides()) {
        key_.push_back(s);
      }
    }
    key_.push_back(same_storage);
    if (same_storage >= 0) {
      // Overlap depends on where the views start; the first view of the
      // storage records its offset too.
      key_.push_back(t.storage_offset());
      key_.push_back(first_offsets_[static_cast<size_t>(same_storage)]);
    }
    first_offsets_.push_back(t.layout() == c10::kStrided ? t.storage_offset()
                                                         : 0);
  }

  void value(const c10::IValue& v, ArgKey how) {
    if (v.isTensor()) {
      tensor(v.toTensor());
    } else if (v.isTensorList() ||
               (v.isList() && !v.toListRef().empty() &&
                (v.toListRef()[0].isTensor() || v.toListRef()[0].isNone()))) {
      key_.push_back(kList);
      if (v.isTensorList()) {
        key_.push_back(static_cast<int64_t>(v.toTensorList().size()));
        for (const at::Tensor& t : v.toTensorList()) {
          tensor(t);
        }
      } else {
        key_.push_back(static_cast<int64_t>(v.toListRef().size()));
        for (const c10::IValue& e : v.toListRef()) {
          e.isTensor() ? tensor(e.toTensor()) : key_.push_back(kNone);
        }
      }
    } else if (v.isNone()) {
      key_.push_back(kNone);
    } else if (v.isBool()) {
      key_.push_back(how == ArgKey::kScalar ? kScalarBool : kBool);
      key_.push_back(v.toBool() ? 1 : 0);
    } else if (v.isInt()) {
      key_.push_back(how == ArgKey::kScalar ? kScalarInt : kInt);
      key_.push_back(v.toInt());
    } else if (v.isDouble()) {
      if (how == ArgKey::kValue) {
        key_.push_back(kDouble);
        const double d = v.toDouble();
        int64_t bits = 0;
        static_assert(sizeof(bits) == sizeof(d));
        std::memcpy(&bits, &d, sizeof(d));
        key_.push_back(bits);
      } else {
        key_.push_back(kScalarFloat);  // the value cannot change metadata
      }
    } else if (v.isComplexDouble()) {
      key_.push_back(kScalarComplex);
      if (how == ArgKey::kValue) {
        std::ostringstream os;
        os << v;
        append_string(key_, os.str());
      }
    } else if (v.isIntList()) {
      key_.push_back(kList);
      key_.push_back(static_cast<int64_t>(v.toListRef().size()));
      for (const c10::IValue& e : v.toListRef()) {
        key_.push_back(e.toInt());
      }
    } else if (v.isList() && how == ArgKey::kScalar) {
      // A Scalar[]: integral values by value, floating ones by type.
      key_.push_back(kList);
      key_.push_back(static_cast<int64_t>(v.toListRef().size()));
      for (const c10::IValue& e : v.toListRef()) {
        value(e, ArgKey::kScalar);
      }
    } else if (v.isGenerator()) {
      key_.push_back(kGenerator);  // which one does not change metadata
    } else if (v.isString()) {
      key_.push_back(kString);
      append_string(key_, v.toStringRef());
    } else {
      std::ostringstream os;
      os << v;
      key_.push_back(kOther);
      append_string(key_, os.str());
    }
  }

 private:
  std::vector<int64_t>& key_;
  std::vector<const c10::TensorImpl*> impls_;
  std::vector<const c10::StorageImpl*> storages_;
  std::vector<int64_t> first_offsets_;
};

uint64_t hash_key(const std::vector<int64_t>& key) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t v : key) {
    h ^= static_cast<uint64_t>(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  }
  return h;
}

// The cache of verdicts: a plan (queueable) or nullptr (synchronous).
class PlanCache {
 public:
  bool find(const std::vector<int64_t>& key, uint64_t hash,
            std::shared_ptr<const LaunchPlan>* plan) {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = map_.find(hash);
    if (it == map_.end()) {
      return false;
    }
    for (const auto& [k, p] : it->second) {
      if (k == key) {
        *plan = p;
        return true;
      }
    }
    return false;
  }

  void insert(std::vector<int64_t> key, std::shared_ptr<const LaunchPlan> p) {
    const uint64_t hash = hash_key(key);
    std::unique_lock<std::shared_mutex> lock(mutex_);
    if (size_ >= kMaxEntries) {
      map_.clear();  // bounded: the shapes of a long-running program change
      size_ = 0;
    }
    auto& bucket = map_[hash];
    for (auto& [k, existing] : bucket) {
      if (k == key) {
        existing = std::move(p);
        return;
      }
    }
    bucket.emplace_back(std::move(key), std::move(p));
    ++size_;
  }

 private:
  static constexpr size_t kMaxEntries = 8192;
  std::shared_mutex mutex_;  // guards map_ and size_
  std::unordered_map<uint64_t,
                     std::vector<std::pair<std::vector<int64_t>,
                                           std::shared_ptr<const LaunchPlan>>>>
      map_;
  size_t size_ = 0;
};

PlanCache& plan_cache() {
  static auto* cache = new PlanCache();  // leaked: used until exit
  return *cache;
}

// ---------------------------------------------------------------------------
// The meta description
// ---------------------------------------------------------------------------

std::atomic<PythonWarningSilencer> g_python_silencer{nullptr};

// Collects the warnings raised on this thread while it lives, without
// passing them on.
class WarningRecorder : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    warnings.push_back(warning);
  }
  std::vector<c10::Warning> warnings;
};

TensorSpec spec_of(const at::Tensor& t) {
  return {t.scalar_type(),
          {t.sizes().begin(), t.sizes().end()},
          {t.strides().begin(), t.strides().end()}};
}

bool same_shape(const at::Tensor& t, const TensorSpec& s) {
  return t.scalar_type() == s.dtype && t.sizes() == c10::IntArrayRef(s.sizes);
}

// Runs the op on meta tensors (one meta tensor per device tensor, one meta
// storage per device storage, so aliasing shows as on the device) and
// describes its results, or returns nullptr if it cannot be queued.
std::shared_ptr<LaunchPlan> describe_with_meta(const c10::OperatorHandle& op,
                                               const OpTraits& traits,
                                               const torch::jit::Stack& stack) {
  const size_t num_args = traits.writes.size();
  const size_t first = stack.size() - num_args;
  std::vector<std::pair<c10::StorageImpl*, c10::Storage>> storages;
  std::vector<std::pair<c10::TensorImpl*, at::Tensor>> tensors;
  auto meta_of = [&](const at::Tensor& t) -> at::Tensor {
    if (!is_openreg(t)) {
      return t;
    }
    for (const auto& [impl, m] : tensors) {
      if (impl == t.unsafeGetTensorImpl()) {
        return m;
      }
    }
    c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    const c10::Storage* meta_storage = nullptr;
    for (const auto& [k, st] : storages) {
      if (k == key) {
        meta_storage = &st;
      }
    }
    if (meta_storage == nullptr) {
      storages.emplace_back(
          key,
          c10::Storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                       c10::GetAllocator(c10::DeviceType::Meta),
                       /*resizable=*/true));
      meta_storage = &storages.back().second;
    }
    at::Tensor m = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(*meta_storage),
        c10::DispatchKeySet(c10::DispatchKey::Meta), t.dtype());
    m.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(),
                                                   t.storage_offset());
    m._set_conj(t.is_conj());
    m._set_neg(t.is_neg());
    tensors.emplace_back(t.unsafeGetTensorImpl(), m);
    return m;
  };
  torch::jit::Stack meta_stack;
  std::vector<std::pair<int, at::Tensor>> written;
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& v = stack[first + i];
    meta_stack.push_back(map_tensors(v, meta_of));
    if (traits.writes[i] && v.isTensor()) {
      written.emplace_back(static_cast<int>(i), meta_stack.back().toTensor());
    }
  }
  auto plan = std::make_shared<LaunchPlan>();
  {
    // The meta kernel's warnings are dropped: the CPU kernel raises them.
    WarningRecorder recorder;
    const c10::WarningUtils::WarningHandlerGuard guard(&recorder);
    PythonWarningSilencer silencer = g_python_silencer.load();
    const std::shared_ptr<void> quiet =
        silencer != nullptr ? silencer() : nullptr;
    try {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta),
                         &meta_stack);
    } catch (const std::exception&) {
      return nullptr;  // no meta kernel, data-dependent, or an error
    }
  }
  for (const auto& [i, m] : written) {
    const at::Tensor& dev = stack[first + static_cast<size_t>(i)].toTensor();
    if (m.storage_offset() != dev.storage_offset() ||
        m.is_conj() != dev.is_conj() || m.is_neg() != dev.is_neg()) {
      return nullptr;
    }
    const bool resized =
        m.sizes() != dev.sizes() || m.strides() != dev.strides();
    if (resized) {
      // Resizing at the call would change what the kernel reads if the
      // written tensor's memory is also an input (amax(a, 0, out=a)).
      for (size_t j = 0; j < num_args; ++j) {
        bool shared = false;
        for_each_tensor(stack[first + j], [&](const at::Tensor& t) {
          shared = shared || (j != static_cast<size_t>(i) && t.defined() &&
                              t.storage().is_alias_of(dev.storage()));
        });
        if (shared) {
          return nullptr;
        }
      }
    }
    plan->written.emplace_back(i, spec_of(m));
  }
  auto aliases_input = [&](const at::Tensor& m) {
    for (const auto& [k, st] : storages) {
      if (st.unsafeGetStorageImpl() == m.storage().unsafeGetStorageImpl()) {
        return true;
      }
    }
    return false;
  };
  for (size_t r = 0; r < traits.return_arg.size(); ++r) {
    LaunchPlan::Output out;
    out.arg = traits.return_arg[r];
    const c10::IValue& mv = meta_stack[r];
    if (out.arg >= 0) {
      // An argument it writes: returned as is.
    } else if (mv.isTensor()) {
      const at::Tensor& m = mv.toTensor();
      if (m.defined()) {
        if (m.is_conj() || m.is_neg() || aliases_input(m) ||
            m.layout() != c10::kStrided) {
          return nullptr;
        }
        out.tensors.push_back(spec_of(m));
      }
    } else if (mv.isTensorList()) {
      out.is_list = true;
      for (const at::Tensor& m : mv.toTensorList()) {
        if (!m.defined() || aliases_input(m) || m.is_conj() || m.is_neg()) {
          return nullptr;
        }
        out.tensors.push_back(spec_of(m));
      }
    } else {
      return nullptr;  // a number, a bool, None: the host needs the value
    }
    plan->outputs.push_back(std::move(out));
  }
  return plan;
}

}  // namespace

void set_python_warning_silencer(PythonWarningSilencer fn) {
  g_python_silencer.store(fn);
}

// [doc:launch-plan]
LaunchDecision plan_launch(const c10::OperatorHandle& op,
                           const OpTraits& traits,
                           const torch::jit::Stack& stack) {
  LaunchDecision d;
  if (launch_blocking() || traits.has_device_arg) {
    return d;  // synchronous
  }
  const size_t num_args = traits.writes.size();
  const size_t first = stack.size() - num_args;
  // Written tensors must be device tensors (the CPU side of a call is the
  // host's, never written from the device's queue).
  for (size_t i = 0; i < num_args; ++i) {
    if (traits.writes[i]) {
      bool host = false;
      for_each_tensor(stack[first + i], [&](const at::Tensor& t) {
        host = host || (t.defined() && !is_openreg(t));
      });
      if (host) {
        return d;
      }
    }
  }
  d.key.reserve(64);
  d.key.push_back(reinterpret_cast<int64_t>(&traits));
  SignatureBuilder builder(d.key);
  for (size_t i = 0; i < num_args; ++i) {
    builder.value(stack[first + i], traits.arg_keys[i]);
  }
  std::shared_ptr<const LaunchPlan> plan;
  if (plan_cache().find(d.key, hash_key(d.key), &plan)) {
    if (plan != nullptr) {
      d.kind = LaunchDecision::kQueue;
      d.plan = std::move(plan);
    }
    return d;
  }
  // First call of this signature: describe it with the meta kernel, run it
  // synchronously, and compare.
  d.candidate = describe_with_meta(op, traits, stack);
  if (d.candidate == nullptr) {
    plan_cache().insert(std::move(d.key), nullptr);
    return d;
  }
  d.kind = LaunchDecision::kSyncThenVerify;
  return d;
}
// [/doc:launch-plan]

void verify_launch(LaunchDecision decision, const OpTraits& traits,
                   c10::ArrayRef<c10::IValue> args,
                   c10::ArrayRef<c10::IValue> results,
                   const std::vector<c10::Warning>& warnings,
                   bool bits_changed) {
  TORCH_INTERNAL_ASSERT(decision.kind == LaunchDecision::kSyncThenVerify);
  std::shared_ptr<LaunchPlan> plan = std::move(decision.candidate);
  plan->warnings = warnings;
  bool agrees = !bits_changed;
  for (const auto& [i, spec] : plan->written) {
    const at::Tensor& t = args[static_cast<size_t>(i)].toTensor();
    agrees = agrees && t.sizes() == c10::IntArrayRef(spec.sizes) &&
             t.strides() == c10::IntArrayRef(spec.strides);
  }
  for (size_t r = 0; agrees && r < plan->outputs.size(); ++r) {
    LaunchPlan::Output& out = plan->outputs[r];
    if (out.arg >= 0) {
      continue;
    }
    const c10::IValue& v = results[r];
    if (out.is_list) {
      agrees =
          v.isTensorList() && v.toTensorList().size() == out.tensors.size();
      for (size_t k = 0; agrees && k < out.tensors.size(); ++k) {
        const at::Tensor t = v.toTensorList()[k];
        agrees = t.defined() && same_shape(t, out.tensors[k]);
        if (agrees) {
          out.tensors[k].strides.assign(t.strides().begin(), t.strides().end());
        }
      }
    } else if (out.tensors.empty()) {
      agrees = v.isNone() || (v.isTensor() && !v.toTensor().defined());
    } else {
      agrees = v.isTensor() && v.toTensor().defined() &&
               same_shape(v.toTensor(), out.tensors[0]);
      if (agrees) {
        // The CPU kernel's layout, which the meta kernel may not know.
        const at::Tensor& t = v.toTensor();
        out.tensors[0].strides.assign(t.strides().begin(), t.strides().end());
      }
    }
  }
  plan_cache().insert(
      std::move(decision.key),
      agrees ? std::shared_ptr<const LaunchPlan>(std::move(plan)) : nullptr);
}

}  // namespace openreg
