// Tensors of every layout as a CPU kernel sees them, and back: what both
// fallbacks (OpenRegFallback.cpp for strided tensors, OpenRegLayoutFallback.cpp
// for sparse and nested ones) use to run PyTorch's CPU kernels on device
// memory. SIMULATOR ONLY, like the kernel views they are made of.
//
// A tensor of another layout is a few strided tensors and some metadata:
// sparse COO its indices and values, sparse compressed (CSR, CSC, BSR, BSC)
// its compressed and plain indices and values, a nested (strided) tensor one
// buffer and CPU metadata (sizes, strides, offsets). Its CPU twin has the same
// metadata and kernel views of the same device parts, so a CPU kernel reads
// and writes device memory in place.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "engine/OpenRegKernelView.h"

namespace openreg {

// The CPU tensor a kernel sees for `t`, an openreg tensor of any layout.
at::Tensor kernel_tensor(const at::Tensor& t, KernelViews& views);

// The device tensor for `cpu`, a CPU kernel's result of any layout on
// `device`: parts that are kernel views of this launch's device storages
// alias them (a view of an input), parts the kernel computed in device
// memory (KernelMemoryOnDevice) are taken over, the rest is copied.
at::Tensor device_tensor(const at::Tensor& cpu, const KernelViews& views,
                         c10::Device device);

// After a kernel that may have changed `cpu` (kernel_tensor(dev)) in place,
// beyond its values: brings `dev`'s sizes, strides and parts up to date (an
// out= argument resized, a sparse tensor given new indices and values).
// `base`: the kernel address `cpu`'s storage started at, for a strided one.
void sync_tensor(const at::Tensor& dev, const at::Tensor& cpu,
                 const KernelViews& views, void* base);

}  // namespace openreg
