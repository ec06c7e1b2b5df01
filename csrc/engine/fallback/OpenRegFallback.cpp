// The global fallback: any ATen operator without an openreg kernel runs
// PyTorch's CPU kernel directly on device memory.
//
// For each call the fallback
//  1. finds the device (the first openreg tensor, or an openreg Device
//     argument) and rejects mixed devices the way CUDA does;
//  2. asks the launch plan (OpenRegLaunchPlan.h) whether the call can be
//     queued: the host knows its results' metadata, its errors and warnings;
//  3. queued (OpenRegQueuedCall.h): replays the warnings, resizes out=
//     arguments and allocates results on the host, captures the arguments
//     (OpenRegCapture.h) and launches the CPU kernel on the current stream;
//  4. otherwise runs the CPU kernel on the calling thread after the stream
//     drained, and maps results back: in-place and out= results are the
//     original device arguments (resized if the kernel resized them), views
//     of an input become device views of the same storage, new tensors are
//     copied into device memory.
//
// What a vendor keeps: the device check, the two paths and the result
// mapping, the registration. SIMULATOR ONLY: running the CPU kernel on
// kernel views (OpenRegKernelView.h); a real device runs its own kernels, or
// copies to the host and back.
#include "engine/fallback/OpenRegFallback.h"

#include <ATen/Context.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/ScalarType.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "aten/OpenRegLaunch.h"
#include "aten/fallback/OpenRegCopyingFallback.h"
#include "aten/fallback/OpenRegDeterminism.h"
#include "aten/fallback/OpenRegFallbackLog.h"
#include "aten/fallback/OpenRegIValue.h"
#include "aten/fallback/OpenRegOpTraits.h"
#include "core/OpenRegFaults.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegInterrupt.h"
#include "core/OpenRegLaunchStats.h"
#include "engine/OpenRegKernelView.h"
#include "engine/fallback/OpenRegBorrowedStack.h"
#include "engine/fallback/OpenRegDescribedCall.h"
#include "engine/fallback/OpenRegLaunchPlan.h"
#include "engine/fallback/OpenRegLayouts.h"
#include "engine/fallback/OpenRegOutResize.h"
#include "engine/fallback/OpenRegQueuedCall.h"
#include "engine/fallback/OpenRegReservedResults.h"
#include "engine/memory/OpenRegKernelScratch.h"
#include "memory/OpenRegAllocator.h"
#include "memory/OpenRegMemcpy.h"
#include "random/OpenRegGenerator.h"

namespace openreg {

namespace {

// Passes warnings on to the handler that was current, keeping a copy.
class ForwardingRecorder : public c10::WarningHandler {
 public:
  ForwardingRecorder() : next_(c10::WarningUtils::get_warning_handler()) {}
  void process(const c10::Warning& warning) override {
    warnings.push_back(warning);
    next_->process(warning);
  }
  std::vector<c10::Warning> warnings;

 private:
  c10::WarningHandler* next_;
};

// [doc:fallback-out-variant-check]
// The first call of a signature of an operator with an out= variant that is
// not structured and pointwise: after its functional CPU kernel ran (`results`,
// CPU tensors), runs its out= variant on new outputs of the same metadata and
// says whether that wrote the same bytes in place, without resizing or
// reallocating them. Only then are later calls queued through the out=
// variant, writing device memory directly instead of copying a host
// temporary into it (mm, addmm, sum, softmax, ...): an out= kernel that
// uses its out as scratch of another shape (mse_loss.out) fails the check.
bool out_variant_matches(const OpTraits& traits,
                         c10::ArrayRef<c10::IValue> originals,
                         c10::ArrayRef<c10::IValue> results, KernelViews& views,
                         c10::DeviceIndex device) {
  if (!traits.out_variant || traits.out_variant_pointwise) {
    return false;
  }
  for (size_t i = 0; i < originals.size(); ++i) {
    if (traits.writes[i] || traits.generator[i]) {
      return false;  // nothing to compare against, or a second draw
    }
  }
  std::vector<at::Tensor> expected;
  for (size_t r = 0; r < results.size(); ++r) {
    if (traits.return_arg[r] >= 0 || !results[r].isTensor()) {
      return false;
    }
    const at::Tensor& t = results[r].toTensor();
    if (!t.defined() || !t.device().is_cpu() || t.layout() != c10::kStrided ||
        t.is_nested() || !t.is_non_overlapping_and_dense() || t.is_conj() ||
        t.is_neg() || views.device_storage_of(t) != nullptr) {
      return false;
    }
    expected.push_back(t);
  }
  std::vector<at::Tensor> outs;
  torch::jit::Stack stack;
  for (const c10::IValue& v : originals) {
    stack.push_back(map_tensors(v, [&](const at::Tensor& t) {
      return is_openreg(t) ? views.view(t) : t;
    }));
  }
  for (const at::Tensor& e : expected) {
    outs.push_back(at::empty_strided(e.sizes(), e.strides(), e.options()));
    stack.emplace_back(outs.back());
  }
  c10::SmallVector<const void*, 4> where;
  for (const at::Tensor& o : outs) {
    where.push_back(o.const_data_ptr());
  }
  DropWarnings drop;  // the functional call raised them already
  bool ok = true;
  run_sync(
      device,
      [&] {
        const c10::WarningUtils::WarningHandlerGuard guard(&drop);
        try {
          at::AutoDispatchBelowADInplaceOrView below_autograd;
          traits.out_variant->redispatchBoxed(
              c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
        } catch (const std::exception& e) {
          if (is_interrupt(e)) {
            throw;  // the user's Ctrl-C, not "the out= variant differs"
          }
          ok = false;
        }
      },
      call_elements(originals));
  for (size_t r = 0; ok && r < outs.size(); ++r) {
    const at::Tensor& o = outs[r];
    const at::Tensor& e = expected[r];
    ok = o.const_data_ptr() == where[r] && o.sizes() == e.sizes() &&
         o.strides() == e.strides() && o.scalar_type() == e.scalar_type() &&
         std::memcmp(o.const_data_ptr(), e.const_data_ptr(),
                     static_cast<size_t>(e.numel()) * e.itemsize()) == 0;
  }
  return ok;
}
// [/doc:fallback-out-variant-check]

// The synchronous path: the CPU kernel on the calling thread, after the
// stream drained. Its errors and warnings reach the caller directly.
void run_synchronously_impl(const c10::OperatorHandle& op,
                            const OpTraits& traits, torch::jit::Stack* stack,
                            c10::Device device, LaunchDecision decision) {
  const size_t num_args = traits.writes.size();
  const size_t first = stack->size() - num_args;
  // Keep the original arguments: in-place results return them.
  std::vector<c10::IValue> originals(stack->begin() + first, stack->end());
  const bool learn = decision.kind == LaunchDecision::kLearn;
  // Random ops reserve their draw now, in program order.
  c10::SmallVector<std::pair<size_t, RandomDraw>, 1> draws;
  for (size_t i = 0; i < num_args; ++i) {
    if (traits.generator[i]) {
      std::optional<at::Generator> gen;
      if (originals[i].isGenerator()) {
        gen = originals[i].toGenerator();
      }
      draws.emplace_back(i, reserve_draw(gen, device.index()));
    }
  }
  const bool device_has_op =
      host_kernels_supported() || !device_lacks_operator(op);
  if (described_calls_enabled() && device_has_op) {
    // The device runs the call and describes its results
    // (OpenRegDescribedCall.h), with either driver.
    SyncRun run;
    if (run_described(op, traits, stack, device, draws, learn,
                      call_elements(originals), &run)) {
      if (learn) {
        const size_t num_rets = traits.return_arg.size();
        learn_launch(
            std::move(decision), traits, originals,
            c10::ArrayRef<c10::IValue>(*stack).slice(stack->size() - num_rets),
            run);
      }
      return;
    }
  }
  // Staged views (a driver without kernel pointers): what the kernel
  // changes is copied back after it ("staged-kernels", OpenRegKernelView.h).
  std::optional<StagedKernelScope> staged_scope;
  if (!host_kernels_supported()) {
    stats::count_op(stats::kStaged, traits.display_name.c_str());
    staged_scope.emplace();
  }
  KernelViews views;
  struct Mutated {
    int arg;
    at::Tensor dev;
    at::Tensor view;
    void* base;
    bool conj;
    bool neg;
  };
  std::vector<Mutated> mutated;
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (traits.generator[i]) {
      for (const auto& [arg, draw] : draws) {
        if (arg == i) {
          v = kernel_generator(draw);
        }
      }
      continue;
    }
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      v = c10::Device(c10::DeviceType::CPU);
      continue;
    }
    // A single mutable tensor may be resized by the kernel (out=, set_);
    // mutable lists (the _foreach_ ops) are only written in place.
    const bool may_resize = traits.writes[i] && v.isTensor();
    v = map_tensors(v, [&](const at::Tensor& t) -> at::Tensor {
      if (!is_openreg(t)) {
        return t;
      }
      at::Tensor view = views.view(t, may_resize);
      if (may_resize) {
        mutated.push_back({static_cast<int>(i), t, view,
                           view.storage().mutable_data(), view.is_conj(),
                           view.is_neg()});
      }
      return view;
    });
  }

  // What the CPU kernel allocates is device memory of this stream: the
  // results need no copy, and a result the device cannot hold raises out of
  // memory before it is computed (KernelMemoryOnDevice, with the limit of
  // what may spill to host memory instead).
  const c10::Stream stream = getCurrentStream(device.index()).unwrap();
  size_t largest_arg = 0;
  for (const c10::IValue& v : originals) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (t.defined() && t.has_storage()) {
        largest_arg = std::max(largest_arg, t.storage().nbytes());
      }
    });
  }
  std::optional<ForwardingRecorder> recorder;
  std::optional<c10::WarningUtils::WarningHandlerGuard> recording;
  if (learn) {
    recorder.emplace();
    recording.emplace(&*recorder);
  }
  // Staged: the kernel allocates host memory, and results are copied to
  // the device after it. Their device memory is reserved first (the Meta
  // kernel's sizes), so a result the device cannot hold raises before the
  // host computes it; the reservation goes back to the cache just before
  // the copies take their blocks from it.
  const bool staged = staged_scope.has_value();
  std::vector<ReservedBlock> reserved;
  if (staged) {
    reserved = reserve_results(op, traits, originals);
  }
  run_sync(
      device.index(),
      [&] {
        std::optional<KernelMemoryOnDevice> on_device;
        if (!staged) {
          on_device.emplace(stream, largest_arg);
        }
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
      },
      call_elements(originals), traits.display_name.c_str());
  recording.reset();
  if (staged_scope) {
    staged_scope->write_back_changed();
  }

  SyncRun run;
  if (learn) {
    const size_t num_rets = traits.return_arg.size();
    run.out_variant_matches = out_variant_matches(
        traits, originals,
        c10::ArrayRef<c10::IValue>(*stack).slice(stack->size() - num_rets),
        views, device.index());
  }
  for (const Mutated& m : mutated) {
    run.bits_changed = run.bits_changed || m.view.is_conj() != m.conj ||
                       m.view.is_neg() != m.neg;
    if (m.view.sizes() != m.dev.sizes() ||
        m.view.strides() != m.dev.strides()) {
      run.resized.push_back(m.arg);
    }
    sync_tensor(m.dev, m.view, views, m.base);
  }

  reserved.clear();
  const size_t num_rets = traits.return_arg.size();
  const size_t ret_first = stack->size() - num_rets;
  auto convert = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || !t.device().is_cpu()) {
      return t;
    }
    if (t.layout() == c10::kStrided && !t.is_nested() &&
        views.device_storage_of(t) != nullptr) {
      run.returned_view = true;  // a view of an input
    }
    // Of any layout: to_sparse() of a dense tensor is a sparse one.
    return device_tensor(t, views, device);
  };
  for (size_t r = 0; r < num_rets; ++r) {
    c10::IValue& v = (*stack)[ret_first + r];
    if (traits.return_arg[r] >= 0) {
      // An in-place or out= result: the argument it aliases.
      v = originals[static_cast<size_t>(traits.return_arg[r])];
    } else {
      v = map_tensors(v, convert);
    }
  }
  if (learn && (host_kernels_supported() || !device_lacks_operator(op))) {
    // An operator the device lacks stays synchronous: never queued to it.
    run.warnings = std::move(recorder->warnings);
    learn_launch(std::move(decision), traits, originals,
                 c10::ArrayRef<c10::IValue>(*stack).slice(ret_first), run);
  }
}

// An out-of-memory error for the empty out= arguments comes before the run
// (OpenRegOutResize.h).
void run_synchronously(const c10::OperatorHandle& op, const OpTraits& traits,
                       torch::jit::Stack* stack, c10::Device device,
                       LaunchDecision decision) {
  if (traits.writes_any &&
      !(described_calls_enabled() &&
        (host_kernels_supported() || !device_lacks_operator(op)))) {
    // A described call reserves this memory itself (reserve_results).
    const size_t num_args = traits.writes.size();
    check_room_for_empty_outs(traits, torch::jit::last(*stack, num_args),
                              device);
  }
  run_synchronously_impl(op, traits, stack, device, std::move(decision));
}

// [doc:fallback-dispatch]
// `borrowed`: the call came through an unboxed entry (OpenRegUnboxedEntry),
// and `stack` is its stack, whose tensor arguments are borrowed. The queued
// path only reads the arguments; every other path owns them first.
void fallback_call(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                   BorrowedStack* borrowed) {
  const OpTraits& traits = op_traits(op);
  TORCH_CHECK_NOT_IMPLEMENTED(
      traits.has_cpu_kernel, "The operator '", traits.display_name,
      "' has no openreg kernel, and the CPU fallback cannot run it because "
      "it has no CPU kernel either.");
  const size_t num_args = traits.writes.size();
  if (traits.foreach_loop &&
      spans_devices(torch::jit::last(*stack, num_args))) {
    // Lists over several devices are allowed, one operator per tensor, as
    // CUDA's foreach kernels do when they cannot launch a list at once: the
    // generic loop (the kernel the CPU's dispatch entry holds) on the
    // device tensors themselves, each operator dispatched and checked alone.
    if (borrowed != nullptr) {
      borrowed->own();
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    return;
  }
  if (C10_UNLIKELY(copying_fallback_selected())) {
    // OPENREG_FALLBACK=copy: the fallback of a device the host cannot map,
    // for comparison with this engine (OpenRegCopyingFallback.h).
    if (borrowed != nullptr) {
      borrowed->own();
    }
    copying_fallback(op, stack);
    return;
  }
  const c10::Device device =
      find_device(traits, torch::jit::last(*stack, num_args));
  const c10::DeviceGuard guard(device);
  // As CUDA's kernels (OpenRegDeterminism.h): an alert in deterministic
  // mode, atomics' orders when armed.
  if (C10_UNLIKELY(at::globalContext().deterministicAlgorithms())) {
    alert_like_cuda(traits, torch::jit::last(*stack, num_args));
  } else if (C10_UNLIKELY(faults::armed())) {
    if (borrowed != nullptr) {
      borrowed->own();
    }
    shuffle_like_atomics(traits, stack);
  }
  note_fallback(op, traits.display_name);
  LaunchDecision decision = plan_launch(traits, *stack);
  if (decision.kind == LaunchDecision::kQueue) {
    stats::count(stats::kQueued);
    c10::SmallVector<c10::IValue, 4> results;
    run_queued(op, traits, decision.plan, *stack, device, &results);
    // An in-place or out= result is the argument itself: borrowed again
    // when the argument is.
    const size_t first = stack->size() - num_args;
    c10::SmallVector<bool, 4> is_borrow(results.size(), false);
    if (borrowed != nullptr) {
      borrowed->reserve(stack->size() + results.size());
    }
    for (size_t r = 0; r < results.size(); ++r) {
      const int arg = decision.plan->outputs[r].arg;
      if (arg < 0) {
        continue;
      }
      const size_t index = first + static_cast<size_t>(arg);
      if (borrowed != nullptr && borrowed->is_borrowed(index)) {
        results[r] = borrowed->borrow(index);
        is_borrow[r] = true;
      } else {
        results[r] = (*stack)[index];
      }
    }
    if (borrowed != nullptr) {
      borrowed->drop_front(first + num_args);
      for (size_t r = 0; r < results.size(); ++r) {
        borrowed->push_result(std::move(results[r]), is_borrow[r]);
      }
      return;
    }
    torch::jit::drop(*stack, num_args);
    for (c10::IValue& r : results) {
      stack->push_back(std::move(r));
    }
    return;
  }
  if (borrowed != nullptr) {
    borrowed->own();
  }
  stats::count_op(decision.kind == LaunchDecision::kLearn ? stats::kLearned
                                                          : stats::kSynchronous,
                  traits.display_name.c_str());
  if (traits.data_dependent) {
    // The host needs the results' sizes, as CUDA's nonzero, masked_select,
    // unique or boolean-mask indexing do: a synchronization CUDA's sync
    // debug mode reports (a signature's first run synchronizes only
    // because openreg learns it, and is not reported).
    warn_or_error_on_sync(traits.display_name.c_str());
  }
  run_synchronously(op, traits, stack, device, std::move(decision));
}

// [/doc:fallback-dispatch]

}  // namespace

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  fallback_call(op, stack, nullptr);
}

void fallback_borrowed(const c10::OperatorHandle& op, BorrowedStack& stack) {
  // Only fallback_call() receives the stack as a vector, and it owns it
  // before anything that would change a borrowed entry.
  fallback_call(op, const_cast<torch::jit::Stack*>(&stack.stack()), &stack);
}

}  // namespace openreg
