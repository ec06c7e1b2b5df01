// Unboxed entries into the global fallback for the operators it serves most
// (the structured ones: add, mul, mm, addmm, softmax, ...): a C++ kernel of
// the operator's own signature, so that the dispatcher calls it directly
// instead of boxing the call (BoxedKernelWrapper), which copies every tensor
// argument into a stack. The entry puts its arguments on a BorrowedStack
// (OpenRegBorrowedStack.h: why the copies cost the GIL) and calls the same
// fallback; what the fallback does is unchanged.
//
// The signatures are a fixed list: an operator whose schema matches none
// keeps the boxed fallback. A vendor with its own kernels has no need of
// this file; a vendor that runs many operators through a generic path can
// use it to keep the host's cost per call low.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/infer_schema.h>
#include <c10/core/Scalar.h>
#include <c10/core/ScalarType.h>
#include <torch/library.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "aten/fallback/OpenRegOpTraits.h"
#include "engine/fallback/OpenRegBorrowedStack.h"
#include "engine/fallback/OpenRegFallback.h"
#include "engine/ops/OpenRegDirectBinary.h"

namespace openreg {
namespace {

using at::Tensor;
using c10::Scalar;

// A functional operator: returns one new tensor.
template <class... Args>
struct Functional {
  c10::OperatorHandle op;
  Tensor operator()(Args... args) const {
    BorrowedStack stack;
    stack.reserve(sizeof...(Args));
    (stack.push(args), ...);
    fallback_borrowed(op, stack);
    return stack.take_tensor_result();
  }
};

// An in-place operator: writes and returns its first argument.
template <class... Rest>
struct InPlace {
  c10::OperatorHandle op;
  Tensor& operator()(Tensor& self, Rest... rest) const {
    BorrowedStack stack;
    stack.reserve(1 + sizeof...(Rest));
    stack.push(self);
    (stack.push(rest), ...);
    fallback_borrowed(op, stack);
    return self;
  }
};

// add, sub, mul and div: the direct binary path (OpenRegDirectBinary.h) when
// it takes the call, else the fallback.
template <kernels::BinaryOp Kind>
struct DirectWithAlpha {
  c10::OperatorHandle op;
  std::string name = op_traits(op).display_name;
  Tensor operator()(const Tensor& a, const Tensor& b,
                    const Scalar& alpha) const {
    Tensor out = direct_binary(Kind, name, a, b, &alpha);
    if (out.defined()) {
      return out;
    }
    return Functional<const Tensor&, const Tensor&, const Scalar&>{op}(a, b,
                                                                       alpha);
  }
};

template <kernels::BinaryOp Kind>
struct Direct {
  c10::OperatorHandle op;
  std::string name = op_traits(op).display_name;
  Tensor operator()(const Tensor& a, const Tensor& b) const {
    Tensor out = direct_binary(Kind, name, a, b, nullptr);
    if (out.defined()) {
      return out;
    }
    return Functional<const Tensor&, const Tensor&>{op}(a, b);
  }
};

template <class Kernel, class Sig>
bool register_if(torch::Library& library, const char* name,
                 const c10::OperatorHandle& op) {
  const c10::FunctionSchema inferred =
      c10::inferFunctionSchemaFlattenedReturns<Sig>();
  if (c10::findSchemaDifferences(inferred, op.schema()).has_value()) {
    return false;
  }
  library.impl(name, torch::CppFunction(Kernel{op}));
  return true;
}

// The C++ signature of a kernel follows the schema's mutability, which the
// schema comparison ignores: a functional operator writes no argument.
bool writes_none(const OpTraits& traits) {
  for (size_t i = 0; i < traits.writes.size(); ++i) {
    if (traits.writes[i]) {
      return false;
    }
  }
  for (int r : traits.return_arg) {
    if (r >= 0) {
      return false;
    }
  }
  return true;
}

template <class... Args>
bool functional(torch::Library& library, const char* name,
                const c10::OperatorHandle& op) {
  if (!writes_none(op_traits(op))) {
    return false;
  }
  return register_if<Functional<Args...>, Tensor(Args...)>(library, name, op);
}

template <class... Rest>
bool in_place(torch::Library& library, const char* name,
              const c10::OperatorHandle& op) {
  const OpTraits& traits = op_traits(op);
  // The first argument is the one written and returned.
  if (traits.return_arg.size() != 1 || traits.return_arg[0] != 0 ||
      traits.writes.empty() || !traits.writes[0]) {
    return false;
  }
  for (size_t i = 1; i < traits.writes.size(); ++i) {
    if (traits.writes[i]) {
      return false;
    }
  }
  return register_if<InPlace<Rest...>, Tensor&(Tensor&, Rest...)>(library, name,
                                                                  op);
}

using T = const Tensor&;
using S = const Scalar&;
using OptDims = at::OptionalIntArrayRef;
using OptDtype = std::optional<c10::ScalarType>;

}  // namespace

bool unboxed_entries_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("OPENREG_UNBOXED_ENTRIES");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return on;
}

bool register_unboxed_entry(torch::Library& library, const char* name,
                            const c10::OperatorHandle& op) {
  using kernels::BinaryOp;
  const c10::OperatorName& id = op.schema().operator_name();
  if (id.overload_name == "Tensor" && writes_none(op_traits(op))) {
    if (id.name == "aten::add") {
      return register_if<DirectWithAlpha<BinaryOp::kAdd>, Tensor(T, T, S)>(
          library, name, op);
    }
    if (id.name == "aten::sub") {
      return register_if<DirectWithAlpha<BinaryOp::kSub>, Tensor(T, T, S)>(
          library, name, op);
    }
    if (id.name == "aten::mul") {
      return register_if<Direct<BinaryOp::kMul>, Tensor(T, T)>(library, name,
                                                               op);
    }
    if (id.name == "aten::div") {
      return register_if<Direct<BinaryOp::kDiv>, Tensor(T, T)>(library, name,
                                                               op);
    }
  }
  // The signatures of the structured operators a training step calls most.
  return functional<T>(library, name, op) ||                 // exp, neg
         functional<T, T>(library, name, op) ||              // mul, div, mm
         functional<T, T, S>(library, name, op) ||           // add, sub
         functional<T, S>(library, name, op) ||              // pow, leaky_relu
         functional<T, T, T>(library, name, op) ||           // lerp
         functional<T, T, T, S>(library, name, op) ||        // addcmul
         functional<T, T, T, S, S>(library, name, op) ||     // addmm
         functional<T, int64_t, bool>(library, name, op) ||  // _softmax
         functional<T, T, int64_t, c10::ScalarType>(library, name,
                                                    op) ||  // its backward
         functional<T, OptDims, bool, OptDtype>(library, name, op) ||  // sum
         functional<T, std::string_view>(library, name, op) ||         // gelu
         functional<T, T, std::string_view>(library, name, op) ||
         in_place<>(library, name, op) ||            // exp_
         in_place<T>(library, name, op) ||           // mul_, div_
         in_place<T, S>(library, name, op) ||        // add_
         in_place<S>(library, name, op) ||           // pow_
         in_place<T, T, S, S>(library, name, op) ||  // addmm_
         in_place<T, T, S>(library, name, op);       // addcmul_
}

}  // namespace openreg
