// What the fallback knows about an operator before it runs it: the policy
// table (the few operators that need a behaviour of their own, each with its
// reason) and the facts read once from the operator's schema.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace openreg {

// Behaviours an operator may get from the policy table (bit flags).
enum OpPolicy : uint8_t {
  // CPU tensors are accepted beside device tensors (index tensors of
  // indexing ops, as CUDA accepts them).
  kAcceptsCpuTensors = 1 << 0,
  // Registered for PrivateUse1 so the fallback runs the CPU kernel instead of
  // PyTorch's generic kernel for backends (see the reasons in the table).
  kRouteToFallback = 1 << 1,
  // The values of floating-point Scalar arguments decide the results'
  // shapes or are checked on the host: they are part of the signature.
  kScalarValuesMatter = 1 << 2,
  // The CPU kernel converts the Scalar arguments to self's dtype and raises
  // on overflow: a queued call makes the same check on the host (the value
  // is known at the call), so the error is raised at the call.
  kScalarMustFitSelf = 1 << 3,
  // Elementwise arithmetic whose every element rounds alike in ATen's
  // vectorized and scalar loops, so its results do not depend on how many
  // threads compute it: the device may run it on fewer threads than the
  // launch gives (team_size_free).
  kTeamSizeFree = 1 << 4,
  // The CPU kernel writes tensor arguments its schema does not mark as
  // written: a fallback that copies arguments (OpenRegCopyingFallback.cpp)
  // copies back those whose bytes the kernel changed.
  kWritesUnannotated = 1 << 5,
};

// One row of the policy table.
struct OpPolicyRow {
  std::string_view
      op;  // "aten::name" (every overload) or "aten::name.overload"
  uint8_t policy;
  std::string_view reason;
};

// The policy table itself (OpenRegOpTraits.cpp), for registration and docs.
c10::ArrayRef<OpPolicyRow> op_policy_table();

// How a non-tensor argument enters an operator's signature.
enum class ArgKey : uint8_t {
  kValue,         // by value (ints, bools, int lists, strings, dtypes, ...)
  kScalar,        // a Scalar: integral values by value, floating ones by type
  kDoubleByType,  // a float of a pointwise/foreach/fused op: by type
};

// Facts about one operator, computed once (op_traits() caches them).
struct OpTraits {
  c10::OperatorName name{"", ""};
  std::string display_name;  // "aten::add.out"
  uint8_t policy = 0;
  bool has_cpu_kernel = false;
  // A Device argument: the op runs synchronously (it names where results
  // go). Generator arguments do not: a queued launch reserves its draw.
  bool has_device_arg = false;
  // Tagged dynamic_output_shape or data_dependent_output: its results'
  // shapes depend on the data, so it always runs synchronously.
  bool data_dependent = false;
  // An operator outside the aten namespace (a user's library, another
  // library of PyTorch's): nothing guarantees that its tags say whether its
  // results' shapes depend on the data. A signature is learnt only when the
  // operator's Meta kernel (its fake) gives the shapes the first run gave;
  // without one, its calls always run synchronously. `handle` runs it.
  bool shapes_need_meta_check = false;
  bool has_meta_kernel = false;
  std::optional<c10::OperatorHandle> handle;
  std::vector<ArgKey> arg_keys;  // one per argument
  std::vector<bool> writes;      // one per argument: written (alias a!)
  bool writes_any = false;       // some argument is written
  std::vector<bool> generator;   // one per argument: a Generator(?)
  std::vector<int> return_arg;   // one per return: the argument it is, or -1
  // The out= variant of a structured or pointwise functional operator
  // (add.out for add.Tensor, mm.out for mm, sum.IntList_out for
  // sum.dim_IntList, where.self_out): same arguments plus one out tensor per
  // result, with a CPU kernel. A queued call runs it on its pre-allocated
  // results, so the CPU kernel writes them directly instead of into a host
  // temporary: always for structured pointwise operators, whose out= kernels
  // are their functional kernels and write an out of the result's shape and
  // nothing else; for the others only where the first call of the signature
  // showed that the out= kernel writes the same bytes in place
  // (LaunchPlan::into_results: some use their out as scratch of another
  // shape, as mse_loss.out does).
  std::optional<c10::OperatorHandle> out_variant;
  bool out_variant_pointwise = false;  // structured and pointwise
  // A _foreach_ operator whose only kernel is PyTorch's generic one, a loop
  // of one operator per tensor (every backend without its own gets it, the
  // CPU included).
  bool foreach_loop = false;
  // The argument named alpha (add, sub: self + alpha * other), or -1.
  int alpha_arg = -1;
};

// Whether a call's results do not depend on the thread count of its kernel
// (call::kTeamSizeFree): a kTeamSizeFree operator on real dtypes (complex
// products round differently in the vectorized loop) with alpha 1 (the
// vectorized loop fuses alpha * other + self into one rounding).
bool team_size_free(const OpTraits& traits, c10::ArrayRef<c10::IValue> args,
                    c10::ArrayRef<at::Tensor> results);

// Whether the device may run a call on fewer threads than the launch gives
// (call::kFewerThreads): every call outside deterministic mode, the
// team-size-free ones in it (doc:fewer-threads in OpenRegOpTraits.cpp).
bool may_use_fewer_threads(const OpTraits& traits,
                           c10::ArrayRef<c10::IValue> args,
                           c10::ArrayRef<at::Tensor> results);

// The dtype the device receives the call's wrapped numbers in (Python
// numbers made tensors, x + 1), or nullopt to send them as they are
// (doc:wrapped-number-dtype in OpenRegOpTraits.cpp).
std::optional<c10::ScalarType> wrapped_number_dtype(
    const OpTraits& traits, c10::ArrayRef<c10::IValue> args);

// A _foreach_ operator whose only kernel is PyTorch's generic loop
// (OpTraits::foreach_loop).
bool is_foreach_loop(const c10::OperatorHandle& op);

// The traits of `op` (thread-safe; cached per operator).
const OpTraits& op_traits(const c10::OperatorHandle& op);

}  // namespace openreg
