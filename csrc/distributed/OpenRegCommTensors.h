// The tensors a collective hands Gloo, for the orccl backend
// (OpenRegProcessGroup.cpp).
//
// How the communication engine reaches device memory depends on the driver:
//  - the thread driver: Gloo gets CPU tensors that alias the device memory
//    through the kernel view (orGetKernelPointer), no copy: a NIC that DMAs
//    device memory directly (GPUDirect RDMA);
//  - a driver whose device memory lives in another process
//    (OPENREG_DRIVER=process): Gloo gets CPU tensors over the view the device
//    gives the communication library (orMemGetDmaPointer: the arena mapped a
//    second time, read-write, at addresses no device pointer uses), no copy;
//  - without that view (OPENREG_NIC_DMA=0), each device tensor is staged
//    through pinned host memory, which the device copies to and from
//    directly: copied in when the collective is called (after the work
//    queued on the current stream), handed to Gloo, and the tensors the
//    collective writes copied back once it has finished (queued at the call
//    behind a wait on a pinned semaphore the host sets). This is what
//    ProcessGroupGloo does for CUDA tensors, and what a NIC without
//    device-memory access needs. Neither copy makes the host wait.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <thread>
#include <vector>

namespace openreg::distributed {

bool is_openreg(const at::Tensor& t);

// The CPU tensor Gloo works on for `t`: `t` itself for a CPU tensor, an
// alias of its device memory or a pinned host copy of it, staged (see
// above).
at::Tensor gloo_alias(const at::Tensor& t);
std::vector<at::Tensor> gloo_aliases(const std::vector<at::Tensor>& ts);
std::vector<std::vector<at::Tensor>> gloo_aliases(
    const std::vector<std::vector<at::Tensor>>& lists);

// A device tensor and its pinned host copy.
struct StagedTensor {
  at::Tensor device;
  at::Tensor host;
};

// The tensors gloo_alias staged on this thread since the last call, in
// order (and forgets them): a backend method stages, then launches.
std::vector<StagedTensor> take_staged();

// Copies back to the device each staged tensor that is one of `outputs`
// (the tensors the collective writes), queued on the current stream: the
// host does not wait, and the pinned copy is reused only once the copy has
// run (the host allocator's record_event).
void copy_back(const std::vector<StagedTensor>& staged,
               const std::vector<at::Tensor>& outputs);

// A host thread that runs tasks one at a time, in the order they are
// posted: where a group's staged collectives are handed to Gloo once their
// staging copies have run (as the thread driver's issue stream does), and
// where they complete (wait for Gloo, then release the completion stream's
// copy-back), in launch order, as the thread driver's completion stream does.
// Started at the first task; the destructor runs the tasks left, then joins. A
// task must not throw.
class CompletionThread {
 public:
  CompletionThread() = default;
  ~CompletionThread();
  CompletionThread(const CompletionThread&) = delete;
  CompletionThread& operator=(const CompletionThread&) = delete;

  void post(std::function<void()> task);

 private:
  void run();

  std::mutex mu_;  // guards tasks_ and stop_
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

std::vector<at::Tensor> flat(
    std::initializer_list<std::vector<at::Tensor>> parts);
std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& ls);

// The openreg device every openreg tensor of a call is on (-1 if none).
// Gloo needs dense, contiguous tensors.
c10::DeviceIndex common_device(const std::vector<at::Tensor>& tensors,
                               const char* op);

}  // namespace openreg::distributed
