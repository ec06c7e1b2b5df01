#include "engine/fallback/OpenRegLaunchPlan.h"

#include <ATen/Context.h>
#include <ATen/core/enum_tag.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>

#include "aten/OpenRegLaunch.h"
#include "aten/fallback/OpenRegIValue.h"
#include "core/OpenRegInterrupt.h"
#include "engine/kernels/OpenRegCallFormat.h"

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
  c10::SmallVector<const c10::TensorImpl*, 8> impls_;
  c10::SmallVector<const c10::StorageImpl*, 8> storages_;
  c10::SmallVector<int64_t, 8> first_offsets_;
};

// [doc:launch-plan-settings]
// The process-wide and thread-local settings that a CPU kernel reads on the
// host side of a call: what it checks, what it warns about, or what its
// results are. A plan is learnt under one combination of them and replayed
// only under the same combination, so all of them are part of the key (a
// change makes the next call of each signature run synchronously and learn
// again):
//  - the default dtype (torch.set_default_dtype): the result dtype of
//    integer division, of an integer tensor and a float or complex Scalar;
//  - deterministic algorithms, their warn_only flag and the filling of
//    uninitialized memory (torch.use_deterministic_algorithms): a kernel
//    without a deterministic implementation raises or warns at the call;
//  - warn always (torch.set_warn_always): TORCH_WARN_ONCE warns every call;
//  - grad mode and inference mode, which some kernels read;
//  - the sparse invariant checks (torch.sparse.check_sparse_tensor_invariants);
//  - the CPU backend switches a kernel reads to pick its algorithm
//    (torch.backends.mkldnn.enabled and .deterministic, nnpack, the float32
//    matmul precision, reduced-precision fp16 reductions).
// The values a kernel computes are not part of a plan: the kernel reads
// these settings when it runs. torch.set_flush_denormal sets the calling
// CPU thread's floating-point mode; device kernels, which all run on the
// stream workers (first calls included), ignore it, as CUDA's do.
}  // namespace

int64_t host_settings() {
  const at::Context& ctx = at::globalContext();
  namespace bits = call::settings;
  int64_t word =
      static_cast<int64_t>(c10::get_default_dtype_as_scalartype()) & 0xff;
  auto put = [&](int bit, bool on) { word |= static_cast<int64_t>(on) << bit; };
  put(bits::kDeterministic, ctx.deterministicAlgorithms());
  put(bits::kDeterministicWarnOnly, ctx.deterministicAlgorithmsWarnOnly());
  put(bits::kFillUninitializedMemory,
      ctx.deterministicFillUninitializedMemory());
  put(bits::kWarnAlways, c10::WarningUtils::get_warnAlways());
  put(bits::kGradMode, c10::GradMode::is_enabled());
  put(bits::kInferenceMode, c10::InferenceMode::is_enabled());
  put(bits::kCheckSparseInvariants,
      ctx.checkSparseTensorInvariants().value_or(false));
  put(bits::kMkldnn, ctx.userEnabledMkldnn());
  put(bits::kDeterministicMkldnn, ctx.deterministicMkldnn());
  put(bits::kNnpack, ctx.userEnabledNNPACK());
  put(bits::kFp16ReductionCpu, ctx.allowFP16ReductionCPU());
  word |= static_cast<int64_t>(ctx.float32MatmulPrecision())
          << bits::kMatmulPrecisionShift;
  return word;
}
// [/doc:launch-plan-settings]

namespace {

uint64_t hash_key(const std::vector<int64_t>& key) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t v : key) {
    h ^= static_cast<uint64_t>(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  }
  return h;
}

// The plans this thread has learnt: a plan (queueable) or nullptr
// (synchronous), by signature.
class PlanCache {
 public:
  // nullptr if the signature is unknown; else the entry's plan slot.
  const std::shared_ptr<const LaunchPlan>* find(const std::vector<int64_t>& key,
                                                uint64_t hash) const {
    auto it = map_.find(hash);
    if (it == map_.end()) {
      return nullptr;
    }
    for (const auto& [k, p] : it->second) {
      if (k == key) {
        return &p;
      }
    }
    return nullptr;
  }

  void insert(std::vector<int64_t> key, std::shared_ptr<const LaunchPlan> p) {
    if (size_ >= kMaxEntries) {
      map_.clear();  // bounded: the shapes of a long-running program change
      size_ = 0;
    }
    const uint64_t hash = hash_key(key);
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
  ska::flat_hash_map<uint64_t,
                     std::vector<std::pair<std::vector<int64_t>,
                                           std::shared_ptr<const LaunchPlan>>>>
      map_;
  size_t size_ = 0;
};

PlanCache& plan_cache() {
  thread_local PlanCache cache;
  return cache;
}

// The cache's mark of a signature whose first run warned: its next call
// runs synchronously too and the plan is learnt from that one.
const std::shared_ptr<const LaunchPlan>& relearn_mark() {
  static const auto mark = std::make_shared<const LaunchPlan>();
  return mark;
}

TensorSpec spec_of(const at::Tensor& t) {
  return {t.scalar_type(),
          {t.sizes().begin(), t.sizes().end()},
          {t.strides().begin(), t.strides().end()}};
}

}  // namespace

int64_t call_elements(c10::ArrayRef<c10::IValue> args) {
  int64_t elements = -1;
  for (const c10::IValue& v : args) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (t.defined()) {
        elements = std::max(elements, t.numel());
      }
    });
  }
  return elements;
}

// [doc:launch-plan]
LaunchDecision plan_launch(const OpTraits& traits,
                           const torch::jit::Stack& stack) {
  LaunchDecision d;
  // OPENREG_LAUNCH_BLOCKING=1 plans alike: a queued call's launch waits for
  // it (launch_function), so blocking runs the same kernels, at the call.
  if (traits.has_device_arg || traits.data_dependent) {
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
  // The signature, built in a buffer this thread reuses.
  thread_local std::vector<int64_t> key;
  key.clear();
  key.push_back(reinterpret_cast<int64_t>(&traits));
  key.push_back(host_settings());
  SignatureBuilder builder(key);
  for (size_t i = 0; i < num_args; ++i) {
    builder.value(stack[first + i], traits.arg_keys[i]);
  }
  const std::shared_ptr<const LaunchPlan>* known =
      plan_cache().find(key, hash_key(key));
  if (known == nullptr) {
    d.kind = LaunchDecision::kLearn;  // first call: run it and learn
    d.key = key;
  } else if (*known == relearn_mark()) {
    d.kind = LaunchDecision::kLearn;
    d.key = key;
    d.relearn = true;
  } else if (*known != nullptr) {
    d.kind = LaunchDecision::kQueue;
    d.plan = *known;
  }
  return d;
}
// [/doc:launch-plan]

namespace {

bool same_shape(const at::Tensor& meta, const at::Tensor& run) {
  return meta.defined() == run.defined() &&
         (!run.defined() || (meta.sizes().equals(run.sizes()) &&
                             meta.scalar_type() == run.scalar_type()));
}

// [doc:fallback-meta-check]
// Whether the operator's Meta kernel, given the call's metadata, returns the
// shapes and dtypes its first run returned (OpTraits::shapes_need_meta_check):
// an operator whose results' shapes depend on the data has no Meta kernel,
// or one that raises (a fake with a dynamic size), or one that disagrees.
bool meta_agrees(const OpTraits& traits, c10::ArrayRef<c10::IValue> args,
                 c10::ArrayRef<c10::IValue> results) {
  const std::optional<std::vector<c10::IValue>> given =
      meta_results(traits, args);
  if (!given.has_value()) {
    return false;
  }
  const std::vector<c10::IValue>& stack = *given;
  if (stack.size() != results.size()) {
    return false;
  }
  for (size_t r = 0; r < results.size(); ++r) {
    const c10::IValue& run = results[r];
    const c10::IValue& meta = stack[r];
    if (traits.return_arg[r] >= 0) {
      continue;  // an argument it writes
    }
    if (run.isTensor()) {
      if (!meta.isTensor() || !same_shape(meta.toTensor(), run.toTensor())) {
        return false;
      }
    } else if (run.isTensorList()) {
      if (!meta.isTensorList() ||
          meta.toTensorList().size() != run.toTensorList().size()) {
        return false;
      }
      for (size_t i = 0; i < run.toTensorList().size(); ++i) {
        if (!same_shape(meta.toTensorList()[i], run.toTensorList()[i])) {
          return false;
        }
      }
    }
  }
  return true;
}
// [/doc:fallback-meta-check]

}  // namespace

std::optional<std::vector<c10::IValue>> meta_results(
    const OpTraits& traits, c10::ArrayRef<c10::IValue> args) {
  if (!traits.has_meta_kernel || !traits.handle.has_value()) {
    return std::nullopt;
  }
  torch::jit::Stack stack;
  stack.reserve(args.size());
  DropWarnings drop;  // the call's own run gives the operator's warnings
  try {
    for (const c10::IValue& v : args) {
      stack.push_back(to_meta_device(map_tensors(v, [](const at::Tensor& t) {
        return t.defined() ? at::empty_strided(t.sizes(), t.strides(),
                                               t.options().device(c10::kMeta))
                           : t;
      })));
    }
    const c10::WarningUtils::WarningHandlerGuard quiet(&drop);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    traits.handle->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta),
                                   &stack);
  } catch (const std::exception& e) {
    if (is_interrupt(e)) {
      throw;  // Ctrl-C in a meta kernel written in Python: the user's
    }
    return std::nullopt;
  }
  return std::move(stack);
}

void learn_launch(LaunchDecision decision, const OpTraits& traits,
                  c10::ArrayRef<c10::IValue> args,
                  c10::ArrayRef<c10::IValue> results, const SyncRun& run) {
  TORCH_INTERNAL_ASSERT(decision.kind == LaunchDecision::kLearn);
  if (!run.warnings.empty() && !decision.relearn) {
    // Which of these warnings the kernel gives at every call shows at the
    // second call.
    plan_cache().insert(std::move(decision.key), relearn_mark());
    return;
  }
  auto plan = std::make_shared<LaunchPlan>();
  bool queueable = !run.bits_changed && !run.returned_view;
  // Storages of the tensor arguments: resizing an out= argument at the call
  // would change what the kernel reads if its memory is also an input
  // (amax(a, 0, out=a)).
  c10::SmallVector<const c10::StorageImpl*, 8> storages;
  for (const c10::IValue& v : args) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (t.defined() && t.has_storage()) {
        storages.push_back(t.storage().unsafeGetStorageImpl());
      }
    });
  }
  plan->elements = call_elements(args);
  for (size_t i = 0; queueable && i < args.size(); ++i) {
    if (!traits.writes[i] || !args[i].isTensor()) {
      continue;
    }
    const at::Tensor& t = args[i].toTensor();
    plan->written.emplace_back(static_cast<int>(i), spec_of(t));
    const bool resized = std::find(run.resized.begin(), run.resized.end(),
                                   static_cast<int>(i)) != run.resized.end();
    if (resized && std::count(storages.begin(), storages.end(),
                              t.storage().unsafeGetStorageImpl()) > 1) {
      queueable = false;
    }
  }
  for (size_t r = 0; queueable && r < traits.return_arg.size(); ++r) {
    LaunchPlan::Output out;
    out.arg = traits.return_arg[r];
    const c10::IValue& v = results[r];
    if (out.arg >= 0) {
      // An argument it writes: returned as is.
    } else if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.defined() && (t.layout() != c10::kStrided || t.is_nested())) {
        queueable = false;  // sparse or nested: synchronous
      } else if (t.defined()) {
        queueable = !t.is_conj() && !t.is_neg();
        out.tensors.push_back(spec_of(t));
      }
    } else if (v.isTensorList()) {
      out.is_list = true;
      for (const at::Tensor& t : v.toTensorList()) {
        queueable = queueable && t.defined() && t.layout() == c10::kStrided &&
                    !t.is_nested() && !t.is_conj() && !t.is_neg();
        if (queueable) {
          out.tensors.push_back(spec_of(t));
        }
      }
    } else {
      queueable = false;  // a number, a bool, None: the host needs the value
    }
    plan->outputs.push_back(std::move(out));
  }
  // An operator of a user's library says nothing of its results' shapes
  // but through its Meta kernel: learnt only when that agrees.
  queueable = queueable && (!traits.shapes_need_meta_check ||
                            meta_agrees(traits, args, results));
  plan->warnings = run.warnings;
  plan->into_results = run.out_variant_matches;
  plan_cache().insert(
      std::move(decision.key),
      queueable ? std::shared_ptr<const LaunchPlan>(plan) : nullptr);
}

}  // namespace openreg
