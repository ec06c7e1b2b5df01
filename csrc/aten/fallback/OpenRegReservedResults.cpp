#include "aten/fallback/OpenRegReservedResults.h"

#include <ATen/core/Tensor.h>

#include <optional>
#include <utility>
#include <vector>

#include "aten/fallback/OpenRegIValue.h"
#include "aten/fallback/OpenRegLaunchPlan.h"
#include "memory/OpenRegAllocator.h"

namespace openreg {

// [doc:reserve-results]
// Device memory for a described call's new results, allocated before the
// device runs it: the sizes come from the operator's Meta kernel, the blocks
// from the caching allocator on the call's stream, as a CUDA operator sizes
// and allocates its outputs on the host before it launches its kernel. A
// result the device cannot hold raises torch.OutOfMemoryError here, and
// the device has computed nothing (before, the device computed the whole
// result in its workspace and the host's allocation failed after). The
// answer's new storages take these blocks (take_reserved_block); without a Meta
// kernel, or for an operator whose results' sizes depend on the data, the
// blocks are allocated when the answer gives the sizes. A staged call
// (OpenRegFallback.cpp) holds them while the host computes its results.
std::vector<ReservedBlock> reserve_results(const c10::OperatorHandle& op,
                                           const OpTraits& traits,
                                           c10::ArrayRef<c10::IValue> args) {
  std::vector<ReservedBlock> reserved;
  const auto& returns = op.schema().returns();
  // Only results that are new tensors (not an argument, not a view of one).
  std::vector<bool> fresh(returns.size(), false);
  bool any = false;
  for (size_t r = 0; r < returns.size(); ++r) {
    fresh[r] = traits.return_arg[r] < 0 && returns[r].alias_info() == nullptr;
    any = any || fresh[r];
  }
  if (!any || traits.data_dependent) {
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
