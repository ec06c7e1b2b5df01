#include "engine/inductor/OpenRegCompiledKernel.h"

#include <ATen/record_function.h>
#include <c10/util/SmallVector.h>
#include <openreg.h>

#include <cstring>
#include <limits>

#include "aten/OpenRegLaunch.h"
#include "core/OpenRegNamedKernels.h"

namespace openreg::inductor {

std::string compiled_kernel_prefix(const std::string& name,
                                   const std::string& path,
                                   const std::string& symbol) {
  constexpr size_t kMax = std::numeric_limits<uint16_t>::max();
  TORCH_CHECK(
      name.size() <= kMax && path.size() <= kMax && symbol.size() <= kMax,
      "openreg compiled kernel: name, library path and symbol are at "
      "most ",
      kMax, " bytes each, got ", name.size(), ", ", path.size(), " and ",
      symbol.size());
  compiled::CompiledKernelHeader h{};
  h.magic = compiled::kMagic;
  h.name_len = static_cast<uint16_t>(name.size());
  h.path_len = static_cast<uint16_t>(path.size());
  h.symbol_len = static_cast<uint16_t>(symbol.size());
  std::string prefix(reinterpret_cast<const char*>(&h), sizeof(h));
  prefix += name;
  prefix += path;
  prefix += symbol;
  return prefix;
}

// [doc:compiled-kernel-launch]
void launch_compiled_kernel(c10::DeviceIndex device, const std::string& name,
                            const std::string& prefix,
                            c10::ArrayRef<compiled::CompiledKernelArg> args) {
  // The launch as an operator of its own in the profiler (compiled kernels
  // are called from the generated wrapper, not through the dispatcher).
  RECORD_FUNCTION(name, std::vector<c10::IValue>());
  const size_t bytes =
      prefix.size() + args.size() * sizeof(compiled::CompiledKernelArg);
  TORCH_CHECK(bytes <= OR_MAX_KERNEL_PARAMS, "openreg compiled kernel ", name,
              ": ", args.size(), " arguments take ", bytes,
              " parameter bytes, more than a launch carries (",
              OR_MAX_KERNEL_PARAMS, ")");
  TORCH_INTERNAL_ASSERT(prefix.size() >=
                        sizeof(compiled::CompiledKernelHeader));
  c10::SmallVector<unsigned char, 1024> params(bytes);
  std::memcpy(params.data(), prefix.data(), prefix.size());
  compiled::CompiledKernelHeader h{};
  std::memcpy(&h, params.data(), sizeof(h));
  h.n_args = static_cast<uint32_t>(args.size());
  h.threads = kernel_thread_cap(-1);
  std::memcpy(params.data(), &h, sizeof(h));
  if (!args.empty()) {
    std::memcpy(params.data() + prefix.size(), args.data(),
                args.size() * sizeof(compiled::CompiledKernelArg));
  }
  launch_function(device, name, named_kernel(NamedKernel::kCompiledKernel),
                  params.data(), params.size());
}
// [/doc:compiled-kernel-launch]

}  // namespace openreg::inductor
