// The operators whose CUDA kernels check values with a device-side assert
// (CUDA_KERNEL_ASSERT, CUDA_KERNEL_ASSERT_VERBOSE, at::_assert_async) instead
// of a check on the host, from PyTorch's CUDA kernels
// (aten/src/ATen/native/cuda): an index out of range in ScatterGatherKernel,
// IndexKernel, Indexing and EmbeddingBag; a target out of [0, C) in Loss,
// NLLLoss2d and MultiMarginLoss; a probability outside [0, 1] in
// DistributionTemplates (bernoulli) and Loss (binary_cross_entropy); a bad
// distribution in MultinomialKernel; a bad index in MaxUnpooling and
// FractionalMaxPool; negative lengths in SegmentReduce; a false
// _assert_async. docs/catches.md lists the conditions. Shared by the host
// and the device side: header only, no dependency.
#pragma once

#include <cstring>
#include <string_view>

namespace openreg {

// `name`: a schema name with or without its overload ("aten::gather",
// "aten::scatter.src", "aten::index_select.out").
inline bool asserts_on_device(std::string_view name) {
  const size_t dot = name.find('.');
  if (dot != std::string_view::npos) {
    name = name.substr(0, dot);
  }
  static constexpr std::string_view kOps[] = {
      "aten::gather",
      "aten::scatter",
      "aten::scatter_",
      "aten::scatter_add",
      "aten::scatter_add_",
      "aten::scatter_reduce",
      "aten::scatter_reduce_",
      "aten::index",
      "aten::index_put",
      "aten::index_put_",
      "aten::_index_put_impl_",
      "aten::index_fill",
      "aten::index_fill_",
      "aten::index_copy",
      "aten::index_copy_",
      "aten::take",
      "aten::put",
      "aten::put_",
      "aten::masked_scatter",
      "aten::masked_scatter_",
      "aten::index_select",
      "aten::index_add",
      "aten::index_add_",
      "aten::index_reduce",
      "aten::index_reduce_",
      "aten::nll_loss_forward",
      "aten::nll_loss_backward",
      "aten::nll_loss2d_forward",
      "aten::nll_loss2d_backward",
      "aten::binary_cross_entropy",
      "aten::multi_margin_loss",
      "aten::multinomial",
      "aten::bernoulli",
      "aten::bernoulli_",
      "aten::_embedding_bag",
      "aten::_embedding_bag_forward_only",
      "aten::max_unpool2d",
      "aten::max_unpool3d",
      "aten::fractional_max_pool2d_backward",
      "aten::fractional_max_pool3d_backward",
      "aten::segment_reduce",
      "aten::_segment_reduce_backward",
      "aten::_assert_async",
      "aten::_functional_assert_async",
  };
  for (std::string_view op : kOps) {
    if (op == name) {
      return true;
    }
  }
  return false;
}

}  // namespace openreg
