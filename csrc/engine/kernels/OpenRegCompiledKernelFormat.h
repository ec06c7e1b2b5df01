// The bytes of a compiled-kernel launch: a kernel Inductor compiled for
// openreg (torch.compile), named by its library and symbol, with its
// arguments as values (issue 29, step 5).
//
// The host writes them in _CompiledKernel's call
// (engine/inductor/OpenRegInductorPython.cpp) and launches the kernel library's
// `openreg_compiled_kernel` with them, with either driver; the device side
// (kernels/OpenRegKernelLibrary.cpp) loads the library once per device
// process with dlopen, finds the symbol, translates the device addresses
// and calls it. Nothing of the host crosses but these bytes, as a CUDA
// launch carries a function handle and its parameter buffer.
//
// Layout, in order (every field packed, read with memcpy):
//
//   CompiledKernelHeader
//   the kernel's name, the library's path, the symbol  (the three lengths)
//   n_args x CompiledKernelArg
//
// The symbol has the uniform signature `void symbol(void* const* params)`,
// params[i] pointing at the value of argument i (cuLaunchKernel's
// kernelParams): a buffer's kernel-view pointer, a scalar tensor's bytes,
// an int64 or a float.
#pragma once

#include <cstdint>

namespace openreg::compiled {

constexpr uint32_t kMagic = 0x4b43524f;  // "ORCK"

struct CompiledKernelHeader {
  uint32_t magic;
  uint32_t n_args;
  uint16_t name_len;
  uint16_t path_len;
  uint16_t symbol_len;
  uint16_t reserved;
  int32_t threads;  // the most threads the kernel's parallel regions use
  uint32_t pad;
};

enum class ArgKind : uint32_t {
  kDevicePointer = 0,  // value: the device address (uint64; 0 for no memory)
  kHostScalar = 1,     // value: the bytes of a one-element CPU tensor
  kInt = 2,            // value: an int64
  kFloat = 3,          // value: a float
};

struct CompiledKernelArg {
  ArgKind kind;
  uint32_t pad;
  uint64_t pad2;
  // Big enough for complex<double>, aligned for it where the host builds it.
  alignas(16) unsigned char value[16];
};

static_assert(sizeof(CompiledKernelHeader) == 24, "packed header");
static_assert(sizeof(CompiledKernelArg) == 32, "packed argument");

}  // namespace openreg::compiled
