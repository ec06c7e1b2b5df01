#include "distributed/OpenRegCommTensors.h"

#include <ATen/ops/empty_strided.h>
#include <c10/core/StorageImpl.h>

#include <utility>

#include "core/OpenRegEngine.h"
#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegStream.h"

namespace openreg::distributed {

namespace {

// This thread's staged tensors, from gloo_alias to the launch that takes
// them (a backend method does both, on one thread).
thread_local std::vector<StagedTensor> t_staged;

// [doc:c10d-staging]
// A pinned host copy of `t` (same sizes and strides), queued on the current
// stream after its work: the host does not wait for it. The group's issue
// thread hands it to Gloo once the copy has run (launch_staged), and the
// collective's end copies it back if the collective writes `t`.
at::Tensor stage(const at::Tensor& t) {
  at::Tensor host = at::empty_strided(
      t.sizes(), t.strides(),
      t.options().device(c10::DeviceType::CPU).pinned_memory(true));
  host.copy_(t, /*non_blocking=*/true);
  t_staged.push_back({t, host});
  return host;
}
// [/doc:c10d-staging]

}  // namespace

bool is_openreg(const at::Tensor& t) {
  return t.device().type() == c10::DeviceType::PrivateUse1;
}

// [doc:c10d-alias]
// A CPU tensor over the host's view of `t`'s bytes (same sizes, strides and
// offset), owning a reference to the device storage: Gloo reads and writes
// device memory in place, and the block cannot be freed and reused while
// Gloo (or its queue) still holds the alias. The view is the kernel view
// when host kernels run on device memory (thread driver), else the one the
// device gives the communication library (orMemGetDmaPointer, as GPUDirect
// RDMA gives a NIC); a device without one has the tensor staged.
at::Tensor gloo_alias(const at::Tensor& t) {
  if (!is_openreg(t)) {
    return t;
  }
  const c10::Storage& storage = t.storage();
  void* base = nullptr;
  if (host_kernels_supported()) {
    TORCH_INTERNAL_ASSERT(engine().kernel_base != nullptr,
                          "host kernels without an engine");
    base = engine().kernel_base(storage);
  } else if (storage.nbytes() > 0) {
    const orError_t err =
        orMemGetDmaPointer(&base, storage.data(), storage.nbytes());
    if (err == orErrorNotSupported) {
      return stage(t);
    }
    OPENREG_CHECK(err);
  }
  auto* keep = new c10::Storage(storage);
  c10::DataPtr data(
      base, keep, [](void* ctx) { delete static_cast<c10::Storage*>(ctx); },
      c10::Device(c10::DeviceType::CPU));
  c10::Storage cpu(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), storage.nbytes(), std::move(data),
      /*allocator=*/nullptr, /*resizable=*/false));
  at::Tensor alias = at::detail::make_tensor<c10::TensorImpl>(
      std::move(cpu), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(),
                                                     t.storage_offset());
  return alias;
}
// [/doc:c10d-alias]

std::vector<at::Tensor> gloo_aliases(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) {
    out.push_back(gloo_alias(t));
  }
  return out;
}

std::vector<std::vector<at::Tensor>> gloo_aliases(
    const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(lists.size());
  for (const auto& ts : lists) {
    out.push_back(gloo_aliases(ts));
  }
  return out;
}

std::vector<at::Tensor> flat(
    std::initializer_list<std::vector<at::Tensor>> parts) {
  std::vector<at::Tensor> out;
  for (const auto& p : parts) {
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& ls) {
  std::vector<at::Tensor> out;
  for (const auto& l : ls) {
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

c10::DeviceIndex common_device(const std::vector<at::Tensor>& tensors,
                               const char* op) {
  c10::DeviceIndex device = -1;
  bool cpu = false;
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) {
      continue;
    }
    if (!is_openreg(t)) {
      cpu = true;
      continue;
    }
    TORCH_CHECK(device == -1 || device == t.device().index(), "orccl ", op,
                ": all openreg tensors of one call must be on one device, got "
                "openreg:",
                static_cast<int>(device), " and ", t.device());
    device = t.device().index();
    TORCH_CHECK(t.layout() == c10::kStrided, "orccl ", op,
                ": only dense tensors are supported, got layout ", t.layout());
    TORCH_CHECK(t.is_contiguous(), "orccl ", op,
                ": tensors must be contiguous, got sizes ", t.sizes(),
                " with strides ", t.strides(), " (call .contiguous() first)");
  }
  TORCH_CHECK(device == -1 || !cpu, "orccl ", op,
              ": cannot mix CPU and openreg tensors in one collective");
  return device;
}

std::vector<StagedTensor> take_staged() {
  std::vector<StagedTensor> staged = std::move(t_staged);
  t_staged.clear();
  return staged;
}

void copy_back(const std::vector<StagedTensor>& staged,
               const std::vector<at::Tensor>& outputs) {
  for (const StagedTensor& s : staged) {
    for (const at::Tensor& out : outputs) {
      if (out.unsafeGetTensorImpl() == s.device.unsafeGetTensorImpl()) {
        s.device.copy_(s.host, /*non_blocking=*/true);
        // The device block is not reused before the copy has run, even if
        // its tensor is freed first (the stream may not be its own).
        s.device.record_stream(
            getCurrentStream(s.device.device().index()).unwrap());
        break;
      }
    }
  }
}

CompletionThread::~CompletionThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
}

void CompletionThread::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_INTERNAL_ASSERT(!stop_, "completion thread posted to after stop");
    tasks_.push_back(std::move(task));
    if (!thread_.joinable()) {
      thread_ = std::thread([this] { run(); });
    }
  }
  cv_.notify_one();
}

void CompletionThread::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) {
        return;  // stopped, nothing left
      }
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace openreg::distributed
