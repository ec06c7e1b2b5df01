// The c10d backend for openreg tensors ("orccl"): collectives on device memory,
// carried out by PyTorch's Gloo process group and ordered with openreg streams
// the way ProcessGroupNCCL orders NCCL kernels with CUDA streams.
//
// How a collective runs (see OpenRegProcessGroup.cpp). Each device reserves
// communication streams for this (core/OpenRegStream.h): nothing else is
// ever queued on them. One issue stream per device serves every group; each
// group completes on a completion stream of its own (while there are no more
// groups than the device's completion streams; then they share).
//  1. The caller's current stream records an event; the device's issue
//     stream waits for it, so the collective sees every kernel queued before
//     the call.
//  2. A task on the issue stream hands Gloo CPU tensors that alias the device
//     memory through the kernel view (orGetKernelPointer): no copy. The
//     aliases own a reference to the device storage, so the memory stays
//     allocated while Gloo still uses it. Gloo's call returns at once (its
//     own threads do the work), so collectives are issued in launch order and
//     run side by side in Gloo, as they do for CPU tensors.
//  3. For collectives a task on the group's completion stream waits for
//     Gloo to finish, in launch order; the Work's future is completed at
//     launch with events recorded on the completion stream (NCCL's model:
//     the futures of one group do not wait for another group's
//     collectives).
//  4. Work::wait() queues, on the caller's current stream, a task that waits
//     for the collective and re-raises its error: later work on that stream
//     is ordered after the collective, the host does not block, and a failure
//     (mismatch, timeout, dead peer) is raised at the next synchronization
//     naming the collective. wait(timeout) with a timeout blocks the host.
//
// Deadlock freedom: the issue stream never waits for other processes: a
// collective waits there only for work queued before its launch, which can
// only wait for collectives launched before it, issued already. Gloo blocks
// until the peers arrive only on the completion stream (which nothing else
// waits behind) or on Gloo's own threads, never on a stream that user
// kernels need, and no task touches Python (no GIL). Point-to-point
// operations are only issued (not waited for on a stream of their own), so
// matching send/recv pairs issued in any order by two ranks cannot block
// each other.
//
// CPU tensors go straight to Gloo: one process group serves "cpu" and
// "openreg" tensors. With a driver whose device memory lives in another
// process (OPENREG_DRIVER=process) Gloo works on aliases through the view
// the device gives the communication library (orMemGetDmaPointer) or,
// without one (OPENREG_NIC_DMA=0), on pinned host copies copied on the
// current stream; a host thread of the group hands them to Gloo once the
// work queued before has run, so that the host does not wait for the device
// at the call either (OpenRegCommTensors.h, launch_staged).
#pragma once

#include <memory>
#include <mutex>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "core/OpenRegStream.h"
#include "distributed/OpenRegCommTensors.h"

namespace openreg::distributed {

class ProcessGroupOpenReg final : public c10d::Backend {
 public:
  // `gloo` is a ProcessGroupGloo of the same rank and size (created by the
  // Python creator function on its own store prefix); this backend owns it.
  // `timeout`: the group's, which a hung collective of this rank waits
  // (faults::fail_collective).
  ProcessGroupOpenReg(c10::intrusive_ptr<c10d::Backend> gloo, int rank,
                      int size, std::chrono::milliseconds timeout);
  ~ProcessGroupOpenReg() override;

  const std::string getBackendName() const override { return "orccl"; }
  void setTimeout(std::chrono::milliseconds timeout) override;
  // Gloo's sequence numbers (TORCH_DISTRIBUTED_DEBUG=DETAIL's collective
  // checks need them).
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;
  c10::intrusive_ptr<c10d::Backend> gloo() const { return gloo_; }

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input,
      std::vector<int64_t>& output_split_sizes,
      std::vector<int64_t>& input_split_sizes,
      const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors,
                                      int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors,
                                      int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts) override;

 private:
  // What a collective hands to Gloo: a call over the CPU aliases.
  using Issue = std::function<c10::intrusive_ptr<c10d::Work>()>;
  enum class Kind { kCollective, kPointToPoint };

  // Runs `issue` ordered with the current stream of the device of
  // `tensors` (all on one openreg device), or directly when every tensor is
  // a CPU tensor. `outputs` are the Work's result and future value.
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType op, const char* name,
                                        const std::vector<at::Tensor>& tensors,
                                        std::vector<at::Tensor> outputs,
                                        Kind kind, Issue issue);
  // launch() on a driver whose device memory the host's threads cannot
  // compute on: Gloo is called from the group's issue thread, on aliases
  // through the device's DMA view or on the `staged` pinned host copies
  // (OpenRegCommTensors.h).
  c10::intrusive_ptr<c10d::Work> launch_staged(c10d::OpType op,
                                               const std::string& op_name,
                                               c10::DeviceIndex device,
                                               std::vector<StagedTensor> staged,
                                               std::vector<at::Tensor> outputs,
                                               Kind kind, Issue issue);

  // Runs `issue` now, from this thread, in order with the group's staged
  // collectives: with a driver whose device memory the host cannot reach,
  // after those launched before it were handed to Gloo (Gloo matches the
  // ranks' calls by their order), which waits for their staging copies.
  // For the calls that skip launch_staged: CPU tensors, the barrier, the
  // first collective's device check.
  c10::intrusive_ptr<c10d::Work> in_issue_order(const Issue& issue);

  // NCCL's check of its first collective: each rank of a group on a device
  // of its own ("Duplicate GPU detected"). Once per group, on the host,
  // through Gloo (every rank reaches its first collective at the same
  // point of the program's sequence of collectives).
  void check_one_rank_per_device(c10::DeviceIndex device, const char* op);
  std::once_flag devices_checked_;

  c10::intrusive_ptr<c10d::Backend> gloo_;
  // This group's completion stream on each device: the reserved completion
  // stream of this index (groups take them in turn, see the constructor).
  const int completion_index_;
  std::chrono::milliseconds timeout_;
  // The staged collectives' semaphore (launch_staged): the host numbers
  // them at launch, the completion thread writes into this pinned int32 the
  // number of the last one Gloo has finished, and each one's work on the
  // completion stream waits until the word reaches its number
  // (orStreamWaitValue32). Declared before the completion thread, so it
  // outlives the thread's last writes.
  std::mutex staged_mu_;  // guards the two below, and numbers posts in order
  at::Tensor staged_finished_;
  uint32_t staged_launched_ = 0;
  // Where staged collectives complete (launch_staged), in launch order.
  std::unique_ptr<CompletionThread> staged_completions_;
  // Where staged collectives are handed to Gloo, in launch order. Declared
  // last, so destroyed first: its tasks left run before the completions'.
  std::unique_ptr<CompletionThread> staged_issues_;
};

}  // namespace openreg::distributed
