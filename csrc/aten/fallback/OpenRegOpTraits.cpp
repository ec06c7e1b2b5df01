#include "aten/fallback/OpenRegOpTraits.h"

#include <ATen/core/enum_tag.h>
#include <c10/util/flat_hash_map.h>

#include <memory>
#include <mutex>

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

// The out= variant of a structured functional operator: "<overload>_out"
// or "out", with the functional arguments followed by one written tensor per
// result (checked, names and types, so a look-alike is never taken).
std::optional<c10::OperatorHandle> find_out_variant(
    const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  if (!op.hasKernelForDispatchKey(
          c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
      schema.is_mutable() || schema.returns().empty()) {
    return std::nullopt;
  }
  const std::string& overload = schema.overload_name();
  for (const std::string& candidate :
       {overload.empty() ? std::string("out") : overload + "_out",
        std::string("out")}) {
    auto out = c10::Dispatcher::singleton().findOp({schema.name(), candidate});
    if (!out || !out->hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
      continue;
    }
    const auto& args = schema.arguments();
    const auto& out_args = out->schema().arguments();
    const size_t n_out = schema.returns().size();
    if (out_args.size() != args.size() + n_out) {
      continue;
    }
    bool same = true;
    for (size_t i = 0; i < args.size() && same; ++i) {
      same = args[i].name() == out_args[i].name() &&
             *args[i].type() == *out_args[i].type();
    }
    for (size_t i = args.size(); i < out_args.size() && same; ++i) {
      const c10::AliasInfo* alias = out_args[i].alias_info();
      same = out_args[i].type()->kind() == c10::TypeKind::TensorType &&
             alias != nullptr && alias->isWrite();
    }
    if (same) {
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
  t->out_variant = find_out_variant(op);
  t->out_variant_pointwise = t->out_variant && op.hasTag(at::Tag::pointwise);
  t->foreach_loop = is_foreach_loop(op);
  return t;
}

}  // namespace

c10::ArrayRef<OpPolicyRow> op_policy_table() { return kPolicy; }

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
