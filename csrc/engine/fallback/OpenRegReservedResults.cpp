#include "engine/fallback/OpenRegReservedResults.h"

#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <c10/util/accumulate.h>

#include <optional>
#include <utility>
#include <vector>

#include "aten/fallback/OpenRegIValue.h"
#include "engine/fallback/OpenRegLaunchPlan.h"
#include "engine/fallback/OpenRegOutResize.h"
#include "memory/OpenRegAllocator.h"

namespace openreg {

// [doc:reserve-results]
// Device memory for a described call's new results, allocated before the
// device runs it: the sizes come from the operator's Meta kernel (and, for
// empty out= arguments the call grows, from its replay on Meta tensors,
// OpenRegOutResize.h), the blocks from the caching allocator on the call's
// stream, as a CUDA operator sizes and allocates its outputs on the host
// before it launches its kernel. A result the device cannot hold raises
// torch.OutOfMemoryError here, and the device has computed nothing. The
// blocks go to the device with the call: the CPU kernel makes a new storage
// of exactly a block's size in that block
// (engine/kernels/OpenRegReservedBlocks.h), so it writes its result straight
// into device memory, and the answer says which block each new storage is in:
// no copy after the kernel (before, the device made its results in memory of
// its own and copied them over, which cost a first run of l1_loss over 2 x 256
// MB 8 times the CPU's time). A result in no block (no Meta kernel, sizes that
// depend on the data) gets its block when the answer gives its size, and is
// copied. A staged call (OpenRegFallback.cpp) holds the blocks while the host
// computes its results.
//
// A call whose new results are small by its arguments alone reserves
// nothing: the Meta kernel of many operators is Python (torch._refs, which
// torch._meta_registrations puts over the C++ one), 50-100 us a call, and
// the first one a process runs imports torch._dynamo (about 1 s: a first
// torch.relu took 1.0-2.6 s), while copying a result under
// kReserveMinBytes costs microseconds. Those are the calls of a pointwise or
// reduction operator (its results have at most as many elements as its
// tensor arguments broadcast together) that write no argument and whose
// bound is under kReserveMinBytes in the widest dtype. Their results get
// their blocks from the answer; a device too full for them raises
// torch.OutOfMemoryError at the kernel's allocation
// (DescribeParams::workspace_limit), before the kernel computes.
namespace {
constexpr uint64_t kReserveMinBytes = uint64_t{1} << 20;
constexpr uint64_t kWidestElement = 16;  // complex128

bool small_by_arguments(const c10::OperatorHandle& op, const OpTraits& traits,
                        c10::ArrayRef<c10::IValue> args) {
  if (traits.writes_any ||
      !(op.hasTag(at::Tag::pointwise) || op.hasTag(at::Tag::reduction))) {
    return false;
  }
  std::optional<std::vector<int64_t>> shape;
  for (const c10::IValue& v : args) {
    if (v.isTensor() && v.toTensor().defined()) {
      const c10::IntArrayRef sizes = v.toTensor().sizes();
      try {
        shape = shape ? at::infer_size(*shape, sizes) : sizes.vec();
      } catch (const c10::Error&) {
        return false;  // not broadcastable: no bound from the arguments
      }
    } else if (v.isList()) {
      bool tensors = false;
      for_each_tensor(v, [&](const at::Tensor&) { tensors = true; });
      if (tensors) {
        return false;  // a list of tensors: results per element
      }
    }
  }
  return shape.has_value() &&
         static_cast<uint64_t>(c10::multiply_integers(*shape)) *
                 kWidestElement <
             kReserveMinBytes;
}
}  // namespace

std::vector<ReservedBlock> reserve_results(const c10::OperatorHandle& op,
                                           const OpTraits& traits,
                                           c10::ArrayRef<c10::IValue> args) {
  std::vector<ReservedBlock> reserved;
  // Empty out= arguments the call grows (the out= form of factories such as
  // arange): the device makes their new storage in this memory too.
  for (size_t n : empty_out_bytes(traits, args)) {
    reserved.push_back({n, device_allocator()->allocate(n)});
  }
  const auto& returns = op.schema().returns();
  // Only results that are new tensors (not an argument, not a view of one).
  std::vector<bool> fresh(returns.size(), false);
  bool any = false;
  for (size_t r = 0; r < returns.size(); ++r) {
    fresh[r] = traits.return_arg[r] < 0 && returns[r].alias_info() == nullptr;
    any = any || fresh[r];
  }
  if (!any || traits.data_dependent || small_by_arguments(op, traits, args)) {
    return reserved;
  }
  const std::optional<std::vector<c10::IValue>> meta =
      meta_results(traits, args);
  if (!meta.has_value() || meta->size() != returns.size()) {
    return reserved;
  }
  for (size_t r = 0; r < returns.size(); ++r) {
    if (!fresh[r]) {
      continue;
    }
    for_each_tensor((*meta)[r], [&](const at::Tensor& t) {
      if (t.defined() && t.has_storage() && t.storage().nbytes() > 0) {
        const uint64_t n = t.storage().nbytes();
        reserved.push_back({n, device_allocator()->allocate(n)});
      }
    });
  }
  return reserved;
}
// [/doc:reserve-results]

c10::DataPtr take_reserved_block(std::vector<ReservedBlock>& reserved,
                                 uint64_t bytes) {
  // Erased, not only moved from: a moved-from DataPtr still gives its
  // address.
  for (auto it = reserved.begin(); it != reserved.end(); ++it) {
    if (it->bytes == bytes) {
      c10::DataPtr block = std::move(it->block);
      reserved.erase(it);
      return block;
    }
  }
  return c10::DataPtr();
}

}  // namespace openreg
