// The queued path of the fallback (OpenRegFallback.cpp): a call whose
// signature has a launch plan does everything the host must do at the call
// (checks, warnings, out= resizes, new results) and queues only the CPU
// kernel, with its arguments captured in a pooled QueuedCall.
#include "engine/fallback/OpenRegQueuedCall.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>
#include <c10/util/SmallVector.h>
#include <openreg.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "aten/OpenRegLaunch.h"
#include "aten/OpenRegResize.h"
#include "core/OpenRegFreeList.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegLaunchStats.h"
#include "core/OpenRegNamedKernels.h"
#include "engine/OpenRegKernelView.h"
#include "engine/fallback/OpenRegCallEncoder.h"
#include "engine/fallback/OpenRegCapture.h"
#include "memory/OpenRegAllocator.h"
#include "random/OpenRegGenerator.h"

namespace openreg {

bool serialized_calls() {
  static const bool on = [] {
    const char* env = std::getenv("OPENREG_SERIALIZED_CALLS");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return on;
}

namespace {

// Drops the warnings the host already raised at the call and passes the
// others on (to the stream's handler, which defers them to the next
// synchronization).
class DropRaisedWarnings : public c10::WarningHandler {
 public:
  explicit DropRaisedWarnings(const std::vector<c10::Warning>& raised)
      : raised_(raised), next_(c10::WarningUtils::get_warning_handler()) {}
  void process(const c10::Warning& warning) override {
    for (const c10::Warning& w : raised_) {
      if (w.msg() == warning.msg()) {
        return;
      }
    }
    next_->process(warning);
  }

 private:
  const std::vector<c10::Warning>& raised_;
  c10::WarningHandler* next_;
};

// [doc:fallback-queued]
// kScalarMustFitSelf: the conversion the CPU kernel makes, with its error.
void check_scalars_fit_self(c10::ArrayRef<c10::IValue> args) {
  const c10::ScalarType dtype = args[0].toTensor().scalar_type();
  for (const c10::IValue& v : args) {
    if (!v.isScalar()) {
      continue;
    }
    const c10::Scalar s = v.toScalar();
    switch (dtype) {
#define OPENREG_CHECK_FITS(T, name) \
  case c10::ScalarType::name:       \
    (void)s.to<T>();                \
    break;
      AT_FORALL_SCALAR_TYPES_WITH_COMPLEX(OPENREG_CHECK_FITS)
#undef OPENREG_CHECK_FITS
      default:
        break;
    }
  }
}

// What a queued call keeps until its kernel has run. Pooled per host thread
// (the closure returns it when the host destroys it, see "task-reclaim" in
// OpenRegLaunch.cpp), so a warm launch allocates nothing for it.
struct QueuedCall {
  std::optional<c10::OperatorHandle> op;
  const OpTraits* traits = nullptr;
  std::shared_ptr<const LaunchPlan> plan;
  bool into_results = false;
  CapturedArgs args;
  // The new results, and where each goes among the operator's returns
  // (return index, list index or -1).
  c10::SmallVector<DeviceTensorRef, 2> results;
  c10::SmallVector<std::pair<size_t, int>, 2> result_slots;
  // Random ops: the argument whose generator the kernel makes from a draw.
  c10::SmallVector<std::pair<size_t, RandomDraw>, 1> draws;
  // The call as bytes (serialized_calls()), the named kernel's parameters:
  // then `args` and `results` are empty (the bytes hold them) and the call
  // comes back to the pool once launched (the launch copies the bytes).
  bool serialized = false;
  std::vector<uint8_t> bytes;

  void clear() {
    op.reset();
    plan.reset();
    args.clear();
    results.clear();
    result_slots.clear();
    draws.clear();
  }
};

// A host thread's queued calls, cleared when they come back.
FreeList<QueuedCall>& call_pool() {
  thread_local FreeList<QueuedCall> pool;
  return pool;
}

struct ReturnToPool {
  void operator()(QueuedCall* c) const noexcept {
    c->clear();
    call_pool().give(c);
  }
};
using PooledCall = std::unique_ptr<QueuedCall, ReturnToPool>;

// The kernel of a call the format cannot carry (captured), on the stream's
// worker.
void run_queued_kernel(QueuedCall& call) {
  DropRaisedWarnings drop(call.plan->warnings);
  const c10::WarningUtils::WarningHandlerGuard guard(&drop);
  for (const auto& [i, draw] : call.draws) {
    call.args.args[i] = kernel_generator(draw);
  }
  KernelViews views;
  if (call.into_results) {
    run_cpu_kernel_into(*call.traits, call.args, call.results, views);
    return;
  }
  torch::jit::Stack out =
      run_cpu_kernel(*call.op, *call.traits, call.args, views);
  for (size_t k = 0; k < call.results.size(); ++k) {
    const auto& [ret, index] = call.result_slots[k];
    const DeviceTensorRef& dst = call.results[k];
    const c10::IValue& v = out[ret];
    at::Tensor result = index < 0 ? v.toTensor() : v.toTensorList()[index];
    TORCH_CHECK(result.defined() &&
                    result.sizes() == c10::IntArrayRef(dst.sizes) &&
                    result.dtype() == dst.dtype,
                "the CPU kernel's result differs from the plan's ",
                c10::IntArrayRef(dst.sizes), " ", dst.dtype);
    views.view(dst).copy_(result);
  }
}

}  // namespace

// A call whose signature is known: everything the host must do happens
// here, at the call; only the CPU kernel is queued.
void run_queued(const c10::OperatorHandle& op, const OpTraits& traits,
                const std::shared_ptr<const LaunchPlan>& plan,
                const torch::jit::Stack& stack, c10::Device device,
                c10::SmallVectorImpl<c10::IValue>* results) {
  const size_t num_args = traits.writes.size();
  const size_t first = stack.size() - num_args;
  if ((traits.policy & kScalarMustFitSelf) != 0) {
    check_scalars_fit_self(
        c10::ArrayRef<c10::IValue>(stack).slice(first, num_args));
  }
  for (const c10::Warning& w : plan->warnings) {
    c10::warn(w);
  }
  // out= arguments take their final shape now, as the CPU kernel would
  // resize them.
  for (const auto& [i, spec] : plan->written) {
    const at::Tensor& t = stack[first + static_cast<size_t>(i)].toTensor();
    if (t.sizes() != c10::IntArrayRef(spec.sizes) ||
        t.strides() != c10::IntArrayRef(spec.strides)) {
      resize_impl(t.unsafeGetTensorImpl(), spec.sizes, spec.strides);
    }
  }
  PooledCall call(call_pool().take());
  c10::SmallVector<at::Tensor, 2> new_results;
  call->op = op;
  call->traits = &traits;
  call->plan = plan;
  // New results, allocated now from the device allocator (the device guard
  // is set), as CUDA's kernels allocate theirs: not through the dispatcher.
  results->clear();
  for (size_t r = 0; r < plan->outputs.size(); ++r) {
    const LaunchPlan::Output& out = plan->outputs[r];
    auto make = [&](size_t k) {
      const TensorSpec& s = out.tensors[k];
      at::Tensor t = at::detail::empty_strided_generic(
          s.sizes, s.strides, device_allocator(),
          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), s.dtype);
      new_results.push_back(t);
      call->result_slots.emplace_back(r,
                                      out.is_list ? static_cast<int>(k) : -1);
      return t;
    };
    if (out.arg >= 0) {
      results->emplace_back();  // the caller's argument
    } else if (out.is_list) {
      c10::List<at::Tensor> list;
      for (size_t k = 0; k < out.tensors.size(); ++k) {
        list.push_back(make(k));
      }
      results->emplace_back(std::move(list));
    } else if (out.tensors.empty()) {
      results->emplace_back(at::Tensor());
    } else {
      results->emplace_back(make(0));
    }
  }
  // Random ops reserve their draw now, in program order; the kernel makes
  // its generator from it when it runs.
  const c10::ArrayRef<c10::IValue> args(stack.data() + first, num_args);
  for (size_t i = 0; i < num_args; ++i) {
    if (traits.generator[i]) {
      std::optional<at::Generator> gen;
      if (args[i].isGenerator()) {
        gen = args[i].toGenerator();
      }
      call->draws.emplace_back(i, reserve_draw(gen, device.index()));
    }
  }
  // A structured functional op whose results are all new single tensors
  // runs its out= variant on them: no host temporary, no copy.
  bool into_results = traits.out_variant.has_value() &&
                      (traits.out_variant_pointwise || plan->into_results);
  for (const LaunchPlan::Output& out : plan->outputs) {
    into_results =
        into_results && out.arg < 0 && !out.is_list && out.tensors.size() == 1;
  }
  call->into_results = into_results;
  call->serialized = false;
  const bool host_kernels = host_kernels_supported();
  if (serialized_calls() || !host_kernels) {
    CallToEncode c;
    c.op = into_results ? &*traits.out_variant : &op;
    c.mode = into_results ? call::Mode::kIntoResults : call::Mode::kCopyResults;
    c.traits = &traits;
    c.args = args;
    c.draws = call->draws;
    c.results = new_results;
    c.result_slots = call->result_slots;
    c.threads = kernel_thread_cap(plan->elements);
    c.forward_warnings = host_kernels;  // the kernel runs in this process
    c.apply_settings = !host_kernels;   // or in a process of its own
    c.known_warnings = plan->warnings;
    call->serialized = encode_call(c, call->bytes);
  }
  if (!call->serialized) {
    TORCH_CHECK_NOT_IMPLEMENTED(
        host_kernels, "openreg: the call of ", traits.display_name,
        " cannot be written as bytes (a CPU tensor argument of more than ",
        OR_MAX_KERNEL_PARAMS,
        " bytes, a non-strided device tensor or a symbolic size), and the "
        "driver runs named kernels only (OPENREG_DRIVER=process)");
    stats::count_op(stats::kCaptured, traits.display_name.c_str());
    capture_arguments(stack, traits, call->args);
    for (const at::Tensor& t : new_results) {
      call->results.emplace_back(t);
    }
    for (const auto& [i, draw] : call->draws) {
      call->args.args[i] = c10::IValue();
    }
  }
  if (!into_results && !new_results.empty()) {
    stats::count_op(stats::kCopied, traits.display_name.c_str());
  }
  if (call->serialized) {
    // The device runs the bytes (kernels/OpenRegKernelLibrary.cpp), with
    // either driver.
    launch_function(device.index(), traits.display_name,
                    named_kernel(NamedKernel::kBoxedCall), call->bytes.data(),
                    call->bytes.size(), plan->elements);
  } else {
    // What the format cannot carry runs from the captured arguments, in
    // this process (the thread driver only, checked above).
    launch_async(
        device.index(), traits.display_name,
        [call = std::move(call)] { run_queued_kernel(*call); }, plan->elements);
  }
}
// [/doc:fallback-queued]

}  // namespace openreg
