#include "distributed/OpenRegProcessGroup.h"

#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "aten/OpenRegLaunch.h"
#include "core/OpenRegException.h"
#include "core/OpenRegFaults.h"
#include "core/OpenRegFunctions.h"
#include "distributed/OpenRegCommTensors.h"
#include "memory/OpenRegAllocator.h"

namespace openreg::distributed {

namespace {

// [doc:c10d-work-state]
// The state of one collective, shared by the Work the caller holds and the
// tasks queued on the streams. Thread-safe.
class CommState {
 public:
  // Called once by the issue-stream task: what Gloo returned, or the
  // error Gloo raised when the call was made.
  void issued(c10::intrusive_ptr<c10d::Work> work, std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      work_ = std::move(work);
      error_ = error;
      issued_ = true;
    }
    cv_.notify_all();
  }

  // Blocks until the collective has finished; rethrows its error.
  void wait() {
    c10::intrusive_ptr<c10d::Work> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return issued_; });
      if (error_) {
        std::rethrow_exception(error_);
      }
      work = work_;
    }
    work->wait();
  }

  // True once the collective has finished (successfully or not).
  bool completed() {
    std::lock_guard<std::mutex> lock(mu_);
    return issued_ && (error_ || work_->isCompleted());
  }

  std::exception_ptr error() {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_ || !issued_ || !work_->isCompleted()) {
      return error_;
    }
    return work_->exception();
  }

 private:
  std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  bool issued_ = false;
  c10::intrusive_ptr<c10d::Work> work_;
  std::exception_ptr error_;
};
// [/doc:c10d-work-state]

// [doc:c10d-abort]
// A collective that did not complete (a dead or hung peer, a mismatch, an
// injected failure) makes its device unusable: every later launch, copy,
// allocation and synchronization on it raises c10d's DistBackendError
// naming the collective. Its outputs were never written, and whatever the
// streams compute after it (DDP's averaged gradients, the optimizer's step)
// would silently use them: ProcessGroupNCCL takes the whole process down
// for that reason (TORCH_NCCL_ASYNC_ERROR_HANDLING). Without this, a future
// completed at launch (below) and waited on by events alone would let
// training go on with gradients that were never averaged.
void abort_device(c10::DeviceIndex device, int rank, const std::string& op,
                  std::exception_ptr error) {
  std::string what;
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    what = e.what_without_backtrace();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown error";
  }
  faults::poison(
      device,
      op + " on rank " + std::to_string(rank) + " did not complete: " + what +
          "\n(openreg:" + std::to_string(device) +
          " is unusable from now on: the collective's outputs were never "
          "written and later work on the device would compute from them, so "
          "every later call on it raises this error, as ProcessGroupNCCL "
          "takes the process down after a failed collective. Restart the "
          "process to recover, e.g. with torchrun --max-restarts.)",
      faults::PoisonKind::kCollective);
}

// Runs on a stream: waits for the collective; if it failed, the device is
// aborted (abort_device) and the next synchronization raises the error.
void wait_or_abort(const std::shared_ptr<CommState>& state,
                   c10::DeviceIndex device, int rank, const std::string& op) {
  try {
    state->wait();
  } catch (...) {
    abort_device(device, rank, op, std::current_exception());
  }
}
// [/doc:c10d-abort]

// [doc:c10d-work]
class OpenRegWork final : public c10d::Work {
 public:
  // `finish`, when given, is the host's end of a staged point-to-point
  // operation (see launch_staged): it waits for Gloo and copies the outputs
  // back, once. `copied_back`, when given, is a staged collective's event
  // on its completion stream, after its outputs are copied back.
  OpenRegWork(int rank, c10d::OpType op, std::string name,
              c10::DeviceIndex device, std::shared_ptr<CommState> state,
              std::vector<at::Tensor> outputs,
              c10::intrusive_ptr<c10::ivalue::Future> future,
              std::function<void()> finish = nullptr,
              std::shared_ptr<c10::Event> copied_back = nullptr)
      : c10d::Work(rank, op),
        name_(std::move(name)),
        device_(device),
        state_(std::move(state)),
        outputs_(std::move(outputs)),
        future_(std::move(future)),
        finish_(std::move(finish)),
        copied_back_(std::move(copied_back)) {}

  // The future completes at launch; the collective is complete once Gloo
  // has finished and, staged, its outputs are back on the device.
  bool isCompleted() override {
    return state_->completed() && (!future_ || future_->completed()) &&
           (!copied_back_ || copied_back_->query());
  }
  bool isSuccess() const override {
    return state_->completed() && !state_->error() &&
           (!future_ || (future_->completed() && !future_->hasError()));
  }
  std::exception_ptr exception() const override { return state_->error(); }
  std::vector<at::Tensor> result() override { return outputs_; }

  // Orders the caller's current stream after the collective: a task on it
  // waits for the collective and re-raises its error there (raised at the
  // next synchronization of the stream, naming the collective).
  // Staged: a collective's caller stream waits for its copy-back (the
  // device was aborted before it runs if the collective failed); a
  // point-to-point operation's host waits, copies back and raises the error
  // itself.
  void synchronize() override {
    if (finish_) {
      std::call_once(finished_, finish_);
      return;
    }
    if (copied_back_) {
      copied_back_->block(getCurrentStream(device_).unwrap());
      return;
    }
    launch_async(device_, name_ + " (wait)",
                 [state = state_, device = device_, rank = rank_,
                  name = name_] { wait_or_abort(state, device, rank, name); });
  }

  // Without a timeout the host does not block (as with NCCL); with one, the
  // host waits up to `timeout` and raises the collective's error itself.
  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout != kNoTimeout) {
      const auto until = std::chrono::steady_clock::now() + timeout;
      while (!state_->completed()) {
        TORCH_CHECK(std::chrono::steady_clock::now() < until, "orccl ", name_,
                    ": timed out after ", timeout.count(), " ms");
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      state_->wait();
    }
    synchronize();
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    TORCH_CHECK(future_, "orccl ", name_,
                ": point-to-point work has no future (as with Gloo); use "
                "wait()");
    return future_;
  }

 private:
  std::string name_;
  c10::DeviceIndex device_;
  std::shared_ptr<CommState> state_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::function<void()> finish_;
  std::once_flag finished_;
  std::shared_ptr<c10::Event> copied_back_;
};
// [/doc:c10d-work]

}  // namespace

ProcessGroupOpenReg::ProcessGroupOpenReg(c10::intrusive_ptr<c10d::Backend> gloo,
                                         int rank, int size,
                                         std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size),
      gloo_(std::move(gloo)),
      completion_index_([] {
        // Groups take the completion streams in turn, in creation order.
        static std::atomic<int> next{0};
        return next.fetch_add(1) % kCollectiveCompletionStreams;
      }()),
      timeout_(timeout),
      staged_completions_(std::make_unique<CompletionThread>()),
      staged_issues_(std::make_unique<CompletionThread>()) {
  TORCH_CHECK(gloo_, "orccl: no Gloo process group given");
  TORCH_CHECK(gloo_->getRank() == rank && gloo_->getSize() == size,
              "orccl: the Gloo process group is rank ", gloo_->getRank(),
              " of ", gloo_->getSize(), ", expected rank ", rank, " of ", size);
}

ProcessGroupOpenReg::~ProcessGroupOpenReg() = default;

void ProcessGroupOpenReg::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  gloo_->setTimeout(timeout);
}

void ProcessGroupOpenReg::setSequenceNumberForGroup() {
  gloo_->setSequenceNumberForGroup();
}

uint64_t ProcessGroupOpenReg::getSequenceNumberForGroup() {
  return gloo_->getSequenceNumberForGroup();
}

// [doc:c10d-issue-order]
c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::in_issue_order(
    const Issue& issue) {
  if (host_kernels_supported()) {
    return issue();  // launch() hands Gloo its calls in order already
  }
  auto issued =
      std::make_shared<std::promise<c10::intrusive_ptr<c10d::Work>>>();
  std::future<c10::intrusive_ptr<c10d::Work>> work = issued->get_future();
  staged_issues_->post([issued, &issue] {
    try {
      issued->set_value(issue());
    } catch (...) {
      issued->set_exception(std::current_exception());
    }
  });
  return work.get();  // `issue` outlives the task: this thread waits here
}
// [/doc:c10d-issue-order]

// [doc:c10d-one-rank-per-device]
void ProcessGroupOpenReg::check_one_rank_per_device(c10::DeviceIndex device,
                                                    const char* op) {
  std::call_once(devices_checked_, [&] {
    std::vector<at::Tensor> mine{at::full({1}, static_cast<int64_t>(device),
                                          at::TensorOptions(at::kLong))};
    std::vector<std::vector<at::Tensor>> all(1);
    for (int r = 0; r < getSize(); ++r) {
      all[0].push_back(at::empty({1}, at::TensorOptions(at::kLong)));
    }
    try {
      in_issue_order([&] { return gloo_->allgather(all, mine); })->wait();
    } catch (...) {
      // The first collective did not complete (a dead or hung peer): as
      // for any collective, the device is aborted.
      abort_device(device, getRank(), std::string("c10d::") + op,
                   std::current_exception());
      faults::check_not_poisoned(device);  // raises it
      throw;
    }
    for (int r = 0; r < getSize(); ++r) {
      const int64_t other = all[0][static_cast<size_t>(r)].item<int64_t>();
      TORCH_CHECK_WITH(DistBackendError, r == getRank() || other != device,
                       "orccl ", op, ": rank ", getRank(), " and rank ", r,
                       " both use openreg:", static_cast<int>(device),
                       ". NCCL refuses this at its first collective "
                       "(\"Duplicate GPU detected\"): give each rank a "
                       "device of its own, e.g. torch.openreg.set_device(rank "
                       "% torch.openreg.device_count()) with at least as many "
                       "devices as ranks (OPENREG_DEVICE_COUNT), or use Gloo "
                       "on CPU tensors");
    }
  });
}
// [/doc:c10d-one-rank-per-device]

// [doc:c10d-launch]
c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::launch(
    c10d::OpType op, const char* name, const std::vector<at::Tensor>& tensors,
    std::vector<at::Tensor> outputs, Kind kind, Issue issue) {
  std::vector<StagedTensor> staged = take_staged();
  const c10::DeviceIndex device = common_device(tensors, name);
  if (device < 0) {
    return in_issue_order(issue);  // CPU tensors only: plain Gloo
  }
  if (kind == Kind::kCollective) {
    check_one_rank_per_device(device, name);
  }
  const std::string op_name = std::string("c10d::") + name;
  const OpenRegStream current = getCurrentStream(device);
  const OpenRegStream issue_stream =
      getReservedStream(device, ReservedStream::kCollectiveIssue);

  // 1. The issue stream waits for the work queued so far.
  c10::Event ready(c10::DeviceType::PrivateUse1);
  ready.record(current.unwrap());
  ready.block(issue_stream.unwrap());

  // 2. Gloo is called from the issue stream, in launch order. The call only
  // hands the work to Gloo's threads, so the next collective is issued as
  // soon as it is ready, not when this one finishes: Gloo runs them side by
  // side, as it does for CPU tensors. The worker computes nothing (elements
  // 0: no thread pool).
  auto state = std::make_shared<CommState>();
  const bool collective = kind == Kind::kCollective;
  // faults::fail_collective: this rank's part fails, or never arrives (its
  // peers wait in Gloo until the group's timeout; so does this rank).
  const faults::CollectiveFault fault =
      faults::collective_fault(name, getRank());
  if (fault.action != 0) {
    const int64_t id = faults::last_collective_fault();
    const auto timeout = timeout_;
    issue = [fault, id, timeout]() -> c10::intrusive_ptr<c10d::Work> {
      std::string msg = fault.message;
      if (fault.action == 2) {
        std::this_thread::sleep_for(timeout);
        msg += ": timed out after " + std::to_string(timeout.count()) + " ms";
      }
      faults::surfaced_fault(id,
                             "the collective's wait or the next "
                             "synchronization, as c10d's DistBackendError");
      throw c10::DistBackendError({__func__, __FILE__, __LINE__}, msg);
    };
  }
  if (!host_kernels_supported()) {
    return launch_staged(op, op_name, device, std::move(staged),
                         std::move(outputs), kind, std::move(issue));
  }
  {
    const c10::StreamGuard on_issue(issue_stream.unwrap());
    launch_async(
        device, op_name,
        [state, issue = std::move(issue), collective] {
          c10::intrusive_ptr<c10d::Work> work;
          try {
            work = issue();
          } catch (...) {
            state->issued(nullptr, std::current_exception());
            if (collective) {
              return;  // raised by the completion stream's task
            }
            throw;
          }
          state->issued(work, nullptr);
        },
        /*elements=*/0);
  }
  if (!collective) {
    // Point-to-point: issued only, and waited for by Work::wait().
    return c10::make_intrusive<OpenRegWork>(getRank(), op, op_name, device,
                                            std::move(state),
                                            std::move(outputs), nullptr);
  }

  // 3. The group's completion stream waits for each of its collectives to
  // finish, in launch order, and re-raises its error there (reported by the
  // next synchronization of the device).
  const OpenRegStream completion = getReservedStream(
      device, ReservedStream::kCollectiveCompletion, completion_index_);
  const c10::StreamGuard on_completion(completion.unwrap());
  launch_async(
      device, op_name,
      [state, device, rank = getRank(), op_name] {
        wait_or_abort(state, device, rank, op_name);
      },
      /*elements=*/0);

  // 4. The future completes at launch; its events, recorded on the
  // completion stream, make whoever waits on it wait for the collective.
  auto future = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()),
      std::vector<c10::Device>{
          c10::Device(c10::DeviceType::PrivateUse1, device)});
  future->markCompleted(c10::IValue(outputs));
  return c10::make_intrusive<OpenRegWork>(getRank(), op, op_name, device,
                                          std::move(state), std::move(outputs),
                                          std::move(future));
}
// [/doc:c10d-launch]

namespace {

// A staged collective's failure, as c10d's DistBackendError naming it (the
// thread driver names it through the stream task that raises it).
std::exception_ptr named_error(const std::string& op, std::exception_ptr e) {
  std::string what;
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& error) {
    what = error.what_without_backtrace();
  } catch (const std::exception& error) {
    what = error.what();
  } catch (...) {
    return e;
  }
  return std::make_exception_ptr(c10::DistBackendError(
      {__func__, __FILE__, __LINE__}, op + " failed: " + what));
}

}  // namespace

// [doc:c10d-launch-staged]
// A driver whose device memory the host's threads cannot compute on (the
// process driver): Gloo works on aliases through the device's DMA view or,
// without one, on pinned host copies (gloo_alias: copies queued on the
// current stream after its work). The caller does not wait: the group's
// issue thread waits for an event recorded after the work queued so far
// (and the copies) and then calls Gloo, in launch order; Gloo's call
// returns at once, so collectives still run side by side. The rest is
// queued at launch on the group's completion stream: a wait on the group's
// pinned semaphore for this collective's number (orStreamWaitValue32), the
// copies of its outputs back to the device if staged, and the future's
// events, so the future completes at
// launch and nothing in the caller waits for the collective, as with the
// thread driver (DDP's backward goes on while its buckets are reduced).
// When Gloo has finished, the group's completion thread, in launch order,
// writes the number (orHostWriteValue32), which releases the stream; if the
// collective failed, it aborts the device first (abort_device), so nothing
// computes from outputs that were never written. A point-to-point operation
// copies back in wait(), on the caller's stream.
c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::launch_staged(
    c10d::OpType op, const std::string& op_name, c10::DeviceIndex device,
    std::vector<StagedTensor> staged, std::vector<at::Tensor> outputs,
    Kind kind, Issue issue) {
  auto state = std::make_shared<CommState>();
  auto copied = std::make_shared<c10::Event>(c10::DeviceType::PrivateUse1);
  copied->record(getCurrentStream(device).unwrap());
  staged_issues_->post([state, copied, issue = std::move(issue)] {
    try {
      copied->synchronize();  // the staging copies have run
      state->issued(issue(), nullptr);
    } catch (...) {
      state->issued(nullptr, std::current_exception());
    }
  });
  if (kind == Kind::kPointToPoint) {
    auto finish = [state, op_name, staged = std::move(staged), outputs] {
      try {
        state->wait();
        copy_back(staged, outputs);
      } catch (...) {
        std::rethrow_exception(named_error(op_name, std::current_exception()));
      }
    };
    return c10::make_intrusive<OpenRegWork>(
        getRank(), op, op_name, device, std::move(state), std::move(outputs),
        nullptr, std::move(finish));
  }
  const c10::Stream completion =
      getReservedStream(device, ReservedStream::kCollectiveCompletion,
                        completion_index_)
          .unwrap();
  auto future = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()),
      std::vector<c10::Device>{
          c10::Device(c10::DeviceType::PrivateUse1, device)});
  auto copied_back = std::make_shared<c10::Event>(c10::DeviceType::PrivateUse1);
  std::lock_guard<std::mutex> lock(staged_mu_);  // numbers posts in order
  if (!staged_finished_.defined()) {
    staged_finished_ =
        at::zeros({1}, at::TensorOptions(at::kInt).pinned_memory(true));
  }
  void* word = staged_finished_.data_ptr();
  const uint32_t number = ++staged_launched_;
  {
    // On the completion stream, queued now: wait until Gloo has finished
    // this collective (the completion thread's signal), copy its outputs
    // back, then the future's events and the Work's.
    const c10::StreamGuard on_completion(completion);
    const orStream_t native = getCurrentStream(device).native();
    OPENREG_CHECK(orStreamWaitValue32(native, word, number, 0));
    // The word is not reused before the wait has passed.
    host_allocator()->record_event(
        word, staged_finished_.storage().data_ptr().get_context(), completion);
    copy_back(staged, outputs);
    future->markCompleted(c10::IValue(outputs));
    copied_back->record(completion);
  }
  staged_completions_->post([state, word, number, op_name,
                             staged = std::move(staged), device,
                             rank = getRank()] {
    try {
      state->wait();
    } catch (...) {
      // The copy-back and everything after it on the device must not run
      // as if the collective had finished: the device is unusable first.
      abort_device(device, rank, op_name, std::current_exception());
    }
    // Releases the completion stream (the pinned copies Gloo wrote are then
    // copied back, or the device is aborted). It cannot fail (the word is
    // this group's pinned memory); if it did, the stream would wait forever,
    // so the process stops with the reason rather than hang.
    const orError_t err = orHostWriteValue32(word, number);
    if (err != orSuccess) {
      std::fprintf(stderr, "openreg: orHostWriteValue32 failed: %s\n",
                   orGetErrorString(err));
      std::abort();
    }
  });
  return c10::make_intrusive<OpenRegWork>(
      getRank(), op, op_name, device, std::move(state), std::move(outputs),
      std::move(future), nullptr, std::move(copied_back));
}
// [/doc:c10d-launch-staged]

}  // namespace openreg::distributed
