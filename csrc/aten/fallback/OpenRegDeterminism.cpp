#include "aten/fallback/OpenRegDeterminism.h"

#include <ATen/Context.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/randperm.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <string_view>

#include "core/OpenRegFaults.h"

namespace openreg {

namespace {

std::string_view base_name(std::string_view name) {
  const size_t dot = name.find('.');
  return dot == std::string_view::npos ? name : name.substr(0, dot);
}

bool is_float_or_complex(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() &&
         (v.toTensor().is_floating_point() || v.toTensor().is_complex());
}

// [doc:cuda-determinism-table]
// Operator (schema name), CUDA's name for it in alertNotDeterministic, and
// the condition on the arguments under which CUDA's kernel alerts.
struct Alert {
  std::string_view op;
  const char* cuda_name;
  bool (*when)(c10::ArrayRef<c10::IValue> args);
};

bool always(c10::ArrayRef<c10::IValue>) { return true; }

constexpr Alert kAlerts[] = {
    {"aten::avg_pool3d_backward", "avg_pool3d_backward_cuda", always},
    {"aten::_adaptive_avg_pool2d_backward", "adaptive_avg_pool2d_backward_cuda",
     always},
    {"aten::_adaptive_avg_pool3d_backward", "adaptive_avg_pool3d_backward_cuda",
     always},
    {"aten::adaptive_max_pool2d_backward", "adaptive_max_pool2d_backward_cuda",
     always},
    {"aten::fractional_max_pool2d_backward",
     "fractional_max_pool2d_backward_cuda", always},
    {"aten::fractional_max_pool3d_backward",
     "fractional_max_pool3d_backward_cuda", always},
    {"aten::upsample_linear1d_backward", "upsample_linear1d_backward_out_cuda",
     always},
    {"aten::upsample_bilinear2d_backward",
     "upsample_bilinear2d_backward_out_cuda", always},
    {"aten::_upsample_bilinear2d_aa_backward",
     "upsample_bilinear2d_aa_backward_out_cuda", always},
    {"aten::upsample_bicubic2d_backward",
     "upsample_bicubic2d_backward_out_cuda", always},
    {"aten::_upsample_bicubic2d_aa_backward",
     "upsample_bicubic2d_aa_backward_out_cuda", always},
    {"aten::upsample_trilinear3d_backward",
     "upsample_trilinear3d_backward_out_cuda", always},
    {"aten::reflection_pad1d_backward", "reflection_pad1d_backward_out_cuda",
     always},
    {"aten::reflection_pad2d_backward", "reflection_pad2d_backward_cuda",
     always},
    {"aten::reflection_pad3d_backward", "reflection_pad3d_backward_out_cuda",
     always},
    // nll_loss2d_forward(self, target, weight, reduction, ignore_index): a
    // reduction over the batch.
    {"aten::nll_loss2d_forward", "nll_loss2d_forward_out_cuda_template",
     [](c10::ArrayRef<c10::IValue> a) {
       return a.size() > 3 && a[3].isInt() && a[3].toInt() != 0;
     }},
    {"aten::_ctc_loss_backward", "ctc_loss_backward_gpu", always},
    // _embedding_bag_dense_backward(..., mode, ...): mode 2 is 'max'.
    {"aten::_embedding_bag_dense_backward", "embedding_bag_backward_cuda_max",
     [](c10::ArrayRef<c10::IValue> a) {
       return a.size() > 7 && a[7].isInt() && a[7].toInt() == 2;
     }},
    // put_(self, index, source, accumulate)
    {"aten::put_", "put_",
     [](c10::ArrayRef<c10::IValue> a) {
       return a.size() > 3 && a[3].isBool() && a[3].toBool();
     }},
    {"aten::put", "put_",
     [](c10::ArrayRef<c10::IValue> a) {
       return a.size() > 3 && a[3].isBool() && a[3].toBool();
     }},
    {"aten::histc", "_histc_cuda", always},
    // bincount(self, weights, minlength): with weights.
    {"aten::bincount", "_bincount_cuda",
     [](c10::ArrayRef<c10::IValue> a) {
       return a.size() > 1 && a[1].isTensor() && a[1].toTensor().defined();
     }},
    {"aten::grid_sampler_2d_backward", "grid_sampler_2d_backward_cuda", always},
    {"aten::grid_sampler_3d_backward", "grid_sampler_3d_backward_cuda", always},
    // cumsum(self, dim, dtype): floating point or complex.
    {"aten::cumsum", "cumsum_cuda_kernel",
     [](c10::ArrayRef<c10::IValue> a) {
       return !a.empty() && is_float_or_complex(a[0]);
     }},
    {"aten::cumsum_", "cumsum_cuda_kernel",
     [](c10::ArrayRef<c10::IValue> a) {
       return !a.empty() && is_float_or_complex(a[0]);
     }},
    // scatter_reduce.two(self, dim, index, src, reduce, include_self):
    // 'prod' (sum and mean have a deterministic path).
    {"aten::scatter_reduce", "scatter_reduce_cuda",
     [](c10::ArrayRef<c10::IValue> a) {
       return a.size() > 4 && a[4].isString() && a[4].toStringRef() == "prod";
     }},
    {"aten::scatter_reduce_", "scatter_reduce_cuda",
     [](c10::ArrayRef<c10::IValue> a) {
       return a.size() > 4 && a[4].isString() && a[4].toStringRef() == "prod";
     }},
};
// [/doc:cuda-determinism-table]

}  // namespace

void alert_like_cuda(const OpTraits& traits, c10::ArrayRef<c10::IValue> args) {
  const std::string_view name = base_name(traits.display_name);
  for (const Alert& a : kAlerts) {
    if (a.op == name) {
      if (a.when(args)) {
        at::globalContext().alertNotDeterministic(a.cuda_name);
      }
      return;
    }
  }
  // median.dim (the values and their indices): which of equal medians the
  // indices name depends on the order the threads found them.
  if (traits.display_name == "aten::median.dim" ||
      traits.display_name == "aten::median.dim_values") {
    at::globalContext().alertNotDeterministic(
        "median CUDA with indices output");
  }
}

// [doc:shuffle-atomics]
void shuffle_like_atomics(const OpTraits& traits, torch::jit::Stack* stack) {
  const std::string_view name = base_name(traits.display_name);
  const bool index_add =
      name == "aten::index_add" || name == "aten::index_add_";
  const bool scatter_add =
      name == "aten::scatter_add" || name == "aten::scatter_add_";
  const bool index_put = name == "aten::_index_put_impl_" ||
                         name == "aten::index_put_" ||
                         name == "aten::index_put";
  if (!index_add && !scatter_add && !index_put) {
    return;
  }
  const size_t num_args = traits.writes.size();
  c10::IValue* a = &(*stack)[stack->size() - num_args];
  // index_add(self, dim, index, source, alpha), scatter_add(self, dim,
  // index, src): the entries along `dim`; index_put(self, indices, values,
  // accumulate): one index tensor and the values along their first
  // dimension.
  if (index_put && (num_args < 4 || !a[3].isBool() || !a[3].toBool())) {
    return;  // not accumulating: no atomics on CUDA
  }
  uint64_t seed = 0;
  if (!faults::shuffle_atomics_seed(&seed)) {
    return;
  }
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const auto perm = [seed](int64_t n, const at::Tensor& like) {
    at::Generator gen = at::detail::createCPUGenerator(seed);
    return at::randperm(n, gen, at::TensorOptions(at::kLong))
        .to(like.device(), /*non_blocking=*/false);
  };
  if (index_add || scatter_add) {
    const int64_t dim =
        c10::maybe_wrap_dim(a[1].toInt(), a[2].toTensor().dim());
    const at::Tensor index = a[2].toTensor();
    const at::Tensor source = a[3].toTensor();
    const int64_t n = index.dim() == 0 ? 1 : index.size(index_add ? 0 : dim);
    if (n < 2) {
      return;
    }
    const at::Tensor p = perm(n, index);
    if (index_add) {
      a[2] = index.index_select(0, p);
      a[3] = source.dim() == 0 ? source : source.index_select(dim, p);
    } else {
      a[2] = index.index_select(dim, p);
      a[3] = source.narrow(dim, 0, n).index_select(dim, p);
    }
    return;
  }
  const c10::List<std::optional<at::Tensor>> indices =
      a[1].toOptionalTensorList();
  const at::Tensor values = a[2].toTensor();
  if (indices.size() != 1 || !indices.get(0).has_value() ||
      indices.get(0)->dim() != 1 ||
      indices.get(0)->scalar_type() == at::kBool || values.dim() == 0 ||
      values.size(0) != indices.get(0)->size(0) || values.size(0) < 2) {
    return;
  }
  const at::Tensor p = perm(values.size(0), values);
  c10::List<std::optional<at::Tensor>> shuffled;
  shuffled.push_back(indices.get(0)->index_select(0, p));
  a[1] = shuffled;
  a[2] = values.index_select(0, p);
}
// [/doc:shuffle-atomics]

}  // namespace openreg
