#include "aten/fallback/OpenRegOpTraits.h"

#include <ATen/Context.h>
#include <ATen/core/enum_tag.h>
#include <c10/util/flat_hash_map.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace openreg {

namespace {

// [doc:fallback-policy]
// Operators that need a behaviour of their own. Everything else follows the
// general rule: run the CPU kernel on the device memory, queued once the
// signature has been verified (OpenRegLaunchPlan.h).
constexpr OpPolicyRow kPolicy[] = {
    {"aten::index", kAcceptsCpuTensors,
     "as on CUDA, index tensors may live on the CPU"},
    {"aten::index.Tensor", kRouteToFallback,
     "the generic kernel runs index's meta function (its checks and the "
     "uint8-mask deprecation warning) and then index.out, whose CPU kernel "
     "runs them again: the warning came twice"},
    {"aten::index_put_", kAcceptsCpuTensors,
     "as on CUDA, index tensors may live on the CPU"},
    {"aten::_index_put_impl_", kAcceptsCpuTensors,
     "as on CUDA, index tensors may live on the CPU"},
    {"aten::index_put", kAcceptsCpuTensors,
     "as on CUDA, index tensors may live on the CPU"},
    {"aten::mse_loss", kRouteToFallback,
     "the generic kernel calls mse_loss.out with a pre-shaped output that the "
     "CPU kernel then resizes, warning about it"},
    {"aten::native_layer_norm", kRouteToFallback,
     "the generic kernel is a decomposition that rounds differently from the "
     "CPU kernel"},
    {"aten::native_layer_norm_backward", kRouteToFallback,
     "the generic kernel is a decomposition that rounds differently from the "
     "CPU kernel"},
    {"aten::native_group_norm", kRouteToFallback,
     "math_group_norm rounds batch norm's output to the input dtype before a "
     "separate addcmul applies weight and bias"},
    {"aten::addr", kRouteToFallback,
     "math_addr rounds beta * self, outer(vec1, vec2) and their sum "
     "separately"},
    {"aten::addr.out", kRouteToFallback,
     "math_addr rounds beta * self, outer(vec1, vec2) and their sum "
     "separately"},
    {"aten::mode.values", kRouteToFallback,
     "the generic mode_out accepts only CPU, CUDA and XPU tensors"},
    {"aten::ldexp.Tensor", kRouteToFallback,
     "the generic kernel computes self * 2**other where no ldexp kernel is "
     "registered, accepting exponent dtypes the CPU rejects"},
    {"aten::ldexp.out", kRouteToFallback,
     "the generic kernel computes self * 2**other where no ldexp kernel is "
     "registered, accepting exponent dtypes the CPU rejects"},
    {"aten::ldexp_", kRouteToFallback,
     "the generic kernel computes self * 2**other where no ldexp kernel is "
     "registered, accepting exponent dtypes the CPU rejects"},
    {"aten::native_batch_norm", kWritesUnannotated,
     "in training it updates running_mean and running_var in place, which "
     "its schema (Tensor? running_mean) does not say"},
    {"aten::arange", kScalarValuesMatter,
     "start, end and step decide the length of the result"},
    {"aten::range", kScalarValuesMatter,
     "start, end and step decide the length of the result"},
    {"aten::histc", kScalarValuesMatter, "min and max are checked on the host"},
    {"aten::fill.Scalar", kScalarMustFitSelf,
     "the value must fit self's dtype (checked at the call, as on the CPU)"},
    {"aten::fill_.Scalar", kScalarMustFitSelf,
     "the value must fit self's dtype (checked at the call, as on the CPU)"},
    {"aten::masked_fill.Scalar", kScalarMustFitSelf,
     "the value must fit self's dtype (checked at the call, as on the CPU)"},
    {"aten::masked_fill_.Scalar", kScalarMustFitSelf,
     "the value must fit self's dtype (checked at the call, as on the CPU)"},
    {"aten::index_fill.int_Scalar", kScalarMustFitSelf,
     "the value must fit self's dtype (checked at the call, as on the CPU)"},
    {"aten::index_fill_.int_Scalar", kScalarMustFitSelf,
     "the value must fit self's dtype (checked at the call, as on the CPU)"},
    // Structured operators whose shape checks read a Scalar's value (their
    // functional variants reach the fallback directly, see
    // route_generic_ops_to_fallback): a new value is a new signature, so
    // its first call runs the CPU kernel and raises at the call.
    {"aten::pow", kScalarValuesMatter,
     "integers to negative integer powers are refused at the call"},
    {"aten::pow_", kScalarValuesMatter,
     "integers to negative integer powers are refused at the call"},
    {"aten::renorm", kScalarValuesMatter,
     "p must be positive and maxnorm non-negative, checked at the call"},
    {"aten::renorm_", kScalarValuesMatter,
     "p must be positive and maxnorm non-negative, checked at the call"},
    {"aten::softshrink", kScalarValuesMatter,
     "lambda must be non-negative, checked at the call"},
    {"aten::linalg_vector_norm", kScalarValuesMatter,
     "some orders have no value on an empty input, refused at the call"},
    {"aten::norm", kScalarValuesMatter,
     "some orders have no value on an empty input, refused at the call"},
    // Elementwise arithmetic, each element one IEEE operation whichever
    // loop computes it (team_size_free adds the conditions on the call).
    {"aten::add", kTeamSizeFree,
     "self + alpha * other: the same bits on any number of threads"},
    {"aten::add_", kTeamSizeFree,
     "self + alpha * other: the same bits on any number of threads"},
    {"aten::sub", kTeamSizeFree,
     "self - alpha * other: the same bits on any number of threads"},
    {"aten::sub_", kTeamSizeFree,
     "self - alpha * other: the same bits on any number of threads"},
    {"aten::mul", kTeamSizeFree,
     "a product: the same bits on any number of threads"},
    {"aten::mul_", kTeamSizeFree,
     "a product: the same bits on any number of threads"},
    {"aten::div.Tensor", kTeamSizeFree,
     "a true quotient: the same bits on any number of threads"},
    {"aten::div_.Tensor", kTeamSizeFree,
     "a true quotient: the same bits on any number of threads"},
    {"aten::div.out", kTeamSizeFree,
     "a true quotient: the same bits on any number of threads"},
    {"aten::div.Scalar", kTeamSizeFree,
     "a true quotient: the same bits on any number of threads"},
    {"aten::div_.Scalar", kTeamSizeFree,
     "a true quotient: the same bits on any number of threads"},
    {"aten::neg", kTeamSizeFree,
     "a sign flip: the same bits on any number of threads"},
    {"aten::neg_", kTeamSizeFree,
     "a sign flip: the same bits on any number of threads"},
};
// [/doc:fallback-policy]

bool matches(std::string_view row, const c10::OperatorName& name) {
  if (row.size() < name.name.size() ||
      row.substr(0, name.name.size()) != name.name) {
    return false;
  }
  std::string_view rest = row.substr(name.name.size());
  if (rest.empty()) {
    return true;  // every overload
  }
  return rest[0] == '.' && rest.substr(1) == name.overload_name;
}

bool is_type(const c10::TypePtr& type, c10::TypeKind kind) {
  if (type->kind() == kind) {
    return true;
  }
  if (auto opt = type->cast<c10::OptionalType>()) {
    return opt->getElementType()->kind() == kind;
  }
  return false;
}

// The overload names of every operator named `name` ("aten::sum": "",
// "dim_IntList", "IntList_out", "out", ...), as registered when first asked.
// Built once: the out= variants looked up here are ATen's, registered when
// libtorch loads.
const std::vector<std::string>& overloads_of(const std::string& name) {
  static const auto* by_name = [] {
    auto* map = new ska::flat_hash_map<std::string, std::vector<std::string>>();
    for (const c10::OperatorName& op :
         c10::Dispatcher::singleton().getAllOpNames()) {
      (*map)[op.name].push_back(op.overload_name);
    }
    return map;
  }();
  static const std::vector<std::string> none;
  auto it = by_name->find(name);
  return it == by_name->end() ? none : it->second;
}

// Whether `out` is an out= variant of the functional `schema`: the same
// arguments (names and types), then one written tensor per result.
bool is_out_variant_of(const c10::FunctionSchema& schema,
                       const c10::OperatorHandle& out) {
  const auto& args = schema.arguments();
  const auto& out_args = out.schema().arguments();
  const size_t n_out = schema.returns().size();
  if (out_args.size() != args.size() + n_out) {
    return false;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() != out_args[i].name() ||
        *args[i].type() != *out_args[i].type()) {
      return false;
    }
  }
  for (size_t i = args.size(); i < out_args.size(); ++i) {
    const c10::AliasInfo* alias = out_args[i].alias_info();
    if (out_args[i].type()->kind() != c10::TypeKind::TensorType ||
        alias == nullptr || !alias->isWrite()) {
      return false;
    }
  }
  return true;
}

// The out= variant of a functional operator that has a CPU kernel, with
// the functional arguments followed by one written tensor per result
// (checked, names and types, so a look-alike is never taken). Its overload
// name follows no single rule: "<overload>_out" (where.self_out), "out"
// (mm.out), or another name (sum.IntList_out for sum.dim_IntList,
// gelu_backward.grad_input), so those two are tried first, then every
// overload of the name.
std::optional<c10::OperatorHandle> find_out_variant(
    const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  if (schema.is_mutable() || schema.returns().empty()) {
    return std::nullopt;
  }
  const std::string& overload = schema.overload_name();
  std::vector<std::string> candidates = {
      overload.empty() ? std::string("out") : overload + "_out", "out"};
  for (const std::string& other : overloads_of(schema.name())) {
    if (other != overload && other != candidates[0] && other != "out") {
      candidates.push_back(other);
    }
  }
  for (const std::string& candidate : candidates) {
    auto out = c10::Dispatcher::singleton().findOp({schema.name(), candidate});
    if (out && out->hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
        is_out_variant_of(schema, *out)) {
      return out;
    }
  }
  return std::nullopt;
}

std::unique_ptr<OpTraits> compute_traits(const c10::OperatorHandle& op) {
  auto t = std::make_unique<OpTraits>();
  const c10::FunctionSchema& schema = op.schema();
  t->name = schema.operator_name();
  t->display_name = schema.name();
  if (!schema.overload_name().empty()) {
    t->display_name += "." + schema.overload_name();
  }
  for (const OpPolicyRow& row : kPolicy) {
    if (matches(row.op, t->name)) {
      t->policy |= row.policy;
    }
  }
  // A CPU kernel of its own, or a composite one that serves the CPU.
  t->has_cpu_kernel = op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU);
  t->data_dependent = op.hasTag(at::Tag::dynamic_output_shape) ||
                      op.hasTag(at::Tag::data_dependent_output);
  t->shapes_need_meta_check = schema.name().rfind("aten::", 0) != 0;
  t->has_meta_kernel =
      op.hasComputedKernelForDispatchKey(c10::DispatchKey::Meta);
  t->handle = op;
  const bool doubles_by_type = op.hasTag(at::Tag::pointwise) ||
                               schema.name().rfind("aten::_foreach_", 0) == 0 ||
                               schema.name().rfind("aten::_fused_", 0) == 0;
  const auto& args = schema.arguments();
  for (const c10::Argument& a : args) {
    if (a.name() == "alpha") {
      t->alpha_arg = static_cast<int>(&a - args.data());
    }
    const c10::TypePtr& type = a.type();
    t->generator.push_back(is_type(type, c10::TypeKind::GeneratorType));
    if (is_type(type, c10::TypeKind::DeviceObjType)) {
      t->has_device_arg = true;
    }
    ArgKey key = ArgKey::kValue;
    if ((t->policy & kScalarValuesMatter) == 0) {
      if (is_type(type, c10::TypeKind::NumberType) ||
          (type->kind() == c10::TypeKind::ListType &&
           type->castRaw<c10::ListType>()->getElementType()->kind() ==
               c10::TypeKind::NumberType)) {
        key = ArgKey::kScalar;
      } else if (doubles_by_type && is_type(type, c10::TypeKind::FloatType)) {
        key = ArgKey::kDoubleByType;
      }
    }
    t->arg_keys.push_back(key);
    const c10::AliasInfo* alias = a.alias_info();
    t->writes.push_back(alias != nullptr && alias->isWrite());
    t->writes_any = t->writes_any || t->writes.back();
  }
  for (const c10::Argument& r : schema.returns()) {
    int arg = -1;
    const c10::AliasInfo* alias = r.alias_info();
    if (alias != nullptr && alias->isWrite()) {
      for (size_t i = 0; i < args.size(); ++i) {
        const c10::AliasInfo* a = args[i].alias_info();
        if (a != nullptr && a->beforeSets() == alias->beforeSets()) {
          arg = static_cast<int>(i);
          break;
        }
      }
    }
    t->return_arg.push_back(arg);
  }
  // A structured operator's functional and out= kernels are one kernel
  // (its CompositeExplicitAutogradNonFunctional wrapper allocates the
  // results and calls the out= implementation). Another operator's out=
  // kernel is its own code: taken only for a pointwise one (where.self),
  // and trusted per signature only after the check, which runs it a second
  // time. Not for the others: some write arguments their schema does not
  // mark as written (native_batch_norm's running statistics), so a second
  // run would update them twice.
  const bool structured = op.hasKernelForDispatchKey(
      c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
  const bool pointwise = op.hasTag(at::Tag::pointwise);
  if (structured || pointwise) {
    t->out_variant = find_out_variant(op);
  }
  t->out_variant_pointwise = t->out_variant && structured && pointwise;
  t->foreach_loop = is_foreach_loop(op);
  return t;
}

}  // namespace

c10::ArrayRef<OpPolicyRow> op_policy_table() { return kPolicy; }

// [doc:team-size-free]
bool team_size_free(const OpTraits& traits, c10::ArrayRef<c10::IValue> args,
                    c10::ArrayRef<at::Tensor> results) {
  if ((traits.policy & kTeamSizeFree) == 0) {
    return false;
  }
  if (traits.alpha_arg >= 0) {
    const c10::IValue& alpha = args[static_cast<size_t>(traits.alpha_arg)];
    if (!alpha.isScalar()) {
      return false;
    }
    const c10::Scalar a = alpha.toScalar();
    const bool one = a.isIntegral(/*includeBool=*/true) ? a.toLong() == 1
                     : a.isFloatingPoint()              ? a.toDouble() == 1.0
                                                        : false;
    if (!one) {
      return false;
    }
  }
  bool real = true;
  for (const c10::IValue& v : args) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      real = real && (!t.defined() || !c10::isComplexType(t.scalar_type()));
    } else if (v.isScalar()) {
      real = real && !v.toScalar().isComplex();
    }
  }
  for (const at::Tensor& t : results) {
    real = real && !c10::isComplexType(t.scalar_type());
  }
  return real;
}
// [/doc:team-size-free]

// [doc:fewer-threads]
// Whether the device may run a call's CPU kernel on fewer threads than the
// launch gives (call::kFewerThreads; the device does so while the host runs
// its own work, orKernelContext::team_threads). PyTorch promises bitwise
// reproducible results only under torch.use_deterministic_algorithms(True)
// (its "Reproducibility" notes; on CUDA, cuDNN's and cuBLAS's algorithms and
// atomics vary from run to run otherwise). So outside that mode every call
// may: the kernels whose partial sums follow the team (matrix products along
// K, reductions, layer_norm's backward) may then differ from run to run in
// their last bits, as a GPU's do. A matrix product whose second thread the
// host's Python preempts would wait for it at its end, so the host's work
// was not hidden behind the device's: the demo's training loop ran at
// 1.04-1.10 of the CPU's time with the full team, and at 0.89-0.96 (its
// bound 0.91-0.93) with every kernel allowed one thread fewer
// (benchmarks/README.md, stop 85). In deterministic mode only the
// team-size-free calls may, and a call gives the CPU's bits for the thread
// count the launch gives.
bool may_use_fewer_threads(const OpTraits& traits,
                           c10::ArrayRef<c10::IValue> args,
                           c10::ArrayRef<at::Tensor> results) {
  return !at::globalContext().deterministicAlgorithms() ||
         team_size_free(traits, args, results);
}
// [/doc:fewer-threads]

// [doc:wrapped-number-dtype]
// A Python number in an arithmetic call (x + 1, x * 0.5) reaches the
// operator as a wrapped-number tensor of int64 or double, and the CPU
// kernel converts it to the dtype of the computation first (type
// promotion in TensorIterator: a new tensor and a copy, 0.6 us of the
// 2-3 us the device spends on an add of 64 floats). When that dtype is
// certain, the host sends the number converted already, as the kernel
// would convert it (c10::convert, the copy kernel's cast), and the device
// skips the temporary. It is certain for the kTeamSizeFree operators
// (add, sub, mul, div: standard type promotion) when `self` is a float or
// double tensor, not itself a number: an int64 or double wrapped number
// never changes the dtype of a floating tensor, and for these two dtypes
// the kernels compute in the dtype itself (a half or bfloat16 kernel reads
// the number in float, from the original tensor). Never a bool (sub
// refuses one, checking the operand's own dtype) nor a complex number
// (which makes the result complex).
std::optional<c10::ScalarType> wrapped_number_dtype(
    const OpTraits& traits, c10::ArrayRef<c10::IValue> args) {
  if ((traits.policy & kTeamSizeFree) == 0 || args.empty() ||
      !args[0].isTensor()) {
    return std::nullopt;
  }
  const at::Tensor& self = args[0].toTensor();
  if (!self.defined() || self.unsafeGetTensorImpl()->is_wrapped_number()) {
    return std::nullopt;
  }
  const c10::ScalarType dtype = self.scalar_type();
  if (dtype != c10::ScalarType::Float && dtype != c10::ScalarType::Double) {
    return std::nullopt;
  }
  return dtype;
}
// [/doc:wrapped-number-dtype]

bool is_foreach_loop(const c10::OperatorHandle& op) {
  return op.schema().name().rfind("aten::_foreach_", 0) == 0 &&
         op.hasKernelForDispatchKey(
             c10::DispatchKey::CompositeExplicitAutograd) &&
         !op.hasKernelForDispatchKey(c10::DispatchKey::CPU);
}

const OpTraits& op_traits(const c10::OperatorHandle& op) {
  // Operators registered from Python can be removed and their memory reused,
  // so a cached entry is checked against the operator's name.
  const void* key = &op.schema();
  thread_local ska::flat_hash_map<const void*, const OpTraits*> local;
  auto it = local.find(key);
  if (it != local.end() && it->second->name == op.schema().operator_name()) {
    return *it->second;
  }
  static std::mutex mutex;  // guards `owned`
  static auto* owned = new std::vector<std::unique_ptr<OpTraits>>();
  std::unique_ptr<OpTraits> traits = compute_traits(op);
  const OpTraits* result = traits.get();
  {
    std::lock_guard<std::mutex> lock(mutex);
    owned->push_back(std::move(traits));
  }
  local[key] = result;
  return *result;
}

}  // namespace openreg
