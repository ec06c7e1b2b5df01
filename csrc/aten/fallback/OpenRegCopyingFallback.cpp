// The copying fallback: how a device whose memory the host cannot map runs
// an operator it has no kernel for. This is the fallback a real port starts
// from (the scaffold's --minimal backend registers it alone); openreg's own
// build runs it when OPENREG_FALLBACK=copy, to compare it with the
// simulator's engine (OpenRegFallback.cpp), which runs the CPU kernel on the
// device memory itself.
//
// For each call it
//  1. finds the device and rejects mixed devices as CUDA does (find_device),
//     and makes CUDA's determinism alert;
//  2. copies every device storage among the arguments to the host, whole,
//     once per storage: views, offsets and arguments that share memory keep
//     their layout and their aliasing on the host;
//  3. runs PyTorch's CPU kernel on the calling thread, as PyTorch's own
//     cpu_fallback does, with a host generator made from the device
//     generator's draw for random operators;
//  4. copies back the storages of the arguments the schema marks written
//     (in-place and out= results), after giving the device tensor the
//     metadata the kernel gave the host one (out= resized, set_), and, for
//     the operators whose kernel writes arguments the schema does not mark
//     (kWritesUnannotated in the policy table: native_batch_norm's running
//     statistics), those whose bytes changed;
//  5. maps the results: an in-place or out= result is the device argument;
//     a view of an argument becomes a device view of the same device
//     storage; a new tensor is copied into new device memory.
//
// Only the runtime's copies are used (memory/OpenRegMemcpy.h, orMemcpy*),
// never a host pointer into device memory. Every copy to the host waits for
// the stream, so every call synchronizes: errors are raised at the call.
// Strided tensors only; sparse and nested arguments get a clear error.
#include "aten/fallback/OpenRegCopyingFallback.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "aten/fallback/OpenRegDeterminism.h"
#include "aten/fallback/OpenRegFallbackEntry.h"
#include "aten/fallback/OpenRegFallbackLog.h"
#include "aten/fallback/OpenRegIValue.h"
#include "aten/fallback/OpenRegOpTraits.h"
#include "core/OpenRegFaults.h"
#include "core/OpenRegLaunchStats.h"
#include "core/OpenRegStream.h"
#include "memory/OpenRegAllocator.h"
#include "memory/OpenRegMemcpy.h"
#include "random/OpenRegGenerator.h"

namespace openreg {

bool copying_fallback_selected() {
  static const bool selected = [] {
    const char* env = std::getenv("OPENREG_FALLBACK");
    if (env == nullptr || *env == '\0' || std::strcmp(env, "engine") == 0) {
      return false;
    }
    TORCH_CHECK(std::strcmp(env, "copy") == 0,
                "OPENREG_FALLBACK must be 'engine' (the default: the CPU "
                "kernel on the device memory) or 'copy' (arguments copied to "
                "the host and back), got '",
                env, "'");
    return true;
  }();
  return selected;
}

namespace {

// The host copies of the device storages of one call.
class HostStorages {
 public:
  HostStorages(c10::Device device, const OpenRegStream& stream)
      : device_(device), stream_(stream) {}

  // The CPU tensor over the host copy of `t`'s storage, with t's metadata.
  at::Tensor host_tensor(const at::Tensor& t) {
    TORCH_CHECK_NOT_IMPLEMENTED(
        t.layout() == c10::kStrided && !t.is_nested(),
        "the copying fallback runs strided tensors only, got a ",
        t.is_nested() ? "nested tensor" : "tensor of layout ",
        t.is_nested() ? "" : c10::str(t.layout()));
    TORCH_CHECK(t.device() == device_,
                "Expected all tensors to be on the same device, but found at "
                "least two devices, ",
                device_, " and ", t.device(), "!");
    const c10::Storage& storage = t.storage();
    Entry& e = entry_for(storage);
    at::Tensor h = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(e.host), c10::DispatchKeySet(c10::DispatchKey::CPU),
        t.dtype());
    h.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(),
                                                   t.storage_offset());
    h._set_conj(t.is_conj());
    h._set_neg(t.is_neg());
    return h;
  }

  // Marks the storage of a written argument: copied back after the kernel.
  void mark_written(const at::Tensor& t) {
    auto it = by_device_.find(t.storage().unsafeGetStorageImpl());
    TORCH_INTERNAL_ASSERT(it != by_device_.end());
    entries_[it->second].written = true;
  }

  // The device storage a host storage stands for, if it is one of ours.
  std::optional<c10::Storage> device_storage(const c10::Storage& host) const {
    auto it = by_host_.find(host.unsafeGetStorageImpl());
    if (it == by_host_.end()) {
      return std::nullopt;
    }
    return entries_[it->second].device;
  }

  // Keeps a copy of the bytes of every storage not marked written, for
  // mark_changed(): an operator whose kernel writes arguments its schema
  // does not mark (kWritesUnannotated).
  void snapshot_unwritten() {
    for (Entry& e : entries_) {
      if (!e.written) {
        const auto* bytes = static_cast<const uint8_t*>(e.host.data());
        e.snapshot.assign(bytes, bytes + e.host.nbytes());
      }
    }
  }

  // Marks written the snapshotted storages whose bytes the kernel changed.
  void mark_changed() {
    for (Entry& e : entries_) {
      if (!e.written && e.snapshot.size() == e.host.nbytes() &&
          std::memcmp(e.snapshot.data(), e.host.data(), e.snapshot.size()) !=
              0) {
        e.written = true;
      }
    }
  }

  // After the kernel: the bytes of every written storage back to the
  // device, growing the device storage when the kernel grew the host one.
  void write_back() {
    for (Entry& e : entries_) {
      if (!e.written) {
        continue;
      }
      const size_t nbytes = e.host.nbytes();
      if (nbytes > e.device.nbytes()) {
        e.device.set_data_ptr_noswap(
            allocate_device_memory(nbytes, stream_.unwrap()));
        e.device.set_nbytes(nbytes);
      }
      memcpy_on_stream(e.device.mutable_data(), e.host.data(), nbytes,
                       orMemcpyHostToDevice, stream_);
    }
  }

  // A new device tensor holding `h` (a CPU tensor the kernel made).
  at::Tensor new_device_tensor(const at::Tensor& h) {
    TORCH_CHECK_NOT_IMPLEMENTED(
        h.layout() == c10::kStrided && !h.is_nested(),
        "the copying fallback returns strided tensors only, the CPU kernel "
        "returned a ",
        h.is_nested() ? "nested tensor" : "tensor of layout ",
        h.is_nested() ? "" : c10::str(h.layout()));
    const at::Tensor dense =
        h.is_non_overlapping_and_dense() ? h : h.contiguous();
    at::Tensor d = at::empty_strided(dense.sizes(), dense.strides(),
                                     dense.options().device(device_));
    memcpy_on_stream(d.mutable_data_ptr(), dense.const_data_ptr(),
                     dense.nbytes(), orMemcpyHostToDevice, stream_);
    d._set_conj(dense.is_conj());
    d._set_neg(dense.is_neg());
    return d;
  }

 private:
  struct Entry {
    c10::Storage device;
    c10::Storage host;
    bool written = false;
    std::vector<uint8_t> snapshot;  // snapshot_unwritten()
  };

  Entry& entry_for(const c10::Storage& storage) {
    auto it = by_device_.find(storage.unsafeGetStorageImpl());
    if (it != by_device_.end()) {
      return entries_[it->second];
    }
    const size_t nbytes = storage.nbytes();
    c10::Storage host(c10::Storage::use_byte_size_t(), nbytes,
                      c10::GetCPUAllocator(), /*resizable=*/true);
    if (nbytes != 0) {
      memcpy_blocking(host.mutable_data(), storage.data(), nbytes,
                      orMemcpyDeviceToHost, stream_);
    }
    by_device_.emplace(storage.unsafeGetStorageImpl(), entries_.size());
    by_host_.emplace(host.unsafeGetStorageImpl(), entries_.size());
    entries_.push_back({storage, std::move(host), false, {}});
    return entries_.back();
  }

  c10::Device device_;
  const OpenRegStream& stream_;
  std::vector<Entry> entries_;
  ska::flat_hash_map<const c10::StorageImpl*, size_t> by_device_;
  ska::flat_hash_map<const c10::StorageImpl*, size_t> by_host_;
};

// A device tensor over `storage` with `h`'s metadata.
at::Tensor device_view(const c10::Storage& storage, const at::Tensor& h) {
  at::Tensor d = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      h.dtype());
  d.unsafeGetTensorImpl()->set_sizes_and_strides(h.sizes(), h.strides(),
                                                 h.storage_offset());
  d._set_conj(h.is_conj());
  d._set_neg(h.is_neg());
  return d;
}

}  // namespace

// [doc:copying-fallback]
void copying_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpTraits& traits = op_traits(op);
  TORCH_CHECK_NOT_IMPLEMENTED(
      traits.has_cpu_kernel, "The operator '", traits.display_name,
      "' has no openreg kernel, and the CPU fallback cannot run it because "
      "it has no CPU kernel either.");
  const size_t num_args = traits.writes.size();
  const size_t first = stack->size() - num_args;
  if (traits.foreach_loop &&
      spans_devices(torch::jit::last(*stack, num_args))) {
    // A _foreach_ list over several devices: the generic loop, one operator
    // per tensor (each reaches this fallback on its own device), as CUDA's
    // foreach kernels do when they cannot launch a list at once.
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    return;
  }
  const c10::Device device =
      find_device(traits, torch::jit::last(*stack, num_args));
  const c10::DeviceGuard guard(device);
  if (C10_UNLIKELY(at::globalContext().deterministicAlgorithms())) {
    alert_like_cuda(traits, torch::jit::last(*stack, num_args));
  }
  note_fallback(op, traits.display_name);
  stats::count(stats::kHostCopied);
  // The call is the kernel, run now: a sticky error of the device, or a
  // failure injected for this operator (torch.openreg.faults), is raised
  // at the call, as for any synchronous kernel.
  faults::check_not_poisoned(device.index());
  if (C10_UNLIKELY(faults::armed())) {
    if (std::optional<std::string> failure =
            faults::kernel_fails(device.index(), traits.display_name)) {
      faults::surfaced(device.index(), "the call (it runs synchronously)");
      throw c10::AcceleratorError({__func__, __FILE__, __LINE__},
                                  orErrorLaunchFailure,
                                  "openreg kernel '" + traits.display_name +
                                      "' failed on the device: " + *failure);
    }
  }

  const OpenRegStream stream = getCurrentStream(device.index());
  HostStorages host(device, stream);
  // The device arguments, for in-place results and written tensors.
  std::vector<c10::IValue> originals(stack->begin() + first, stack->end());
  struct Written {
    at::Tensor dev;
    at::Tensor host;
  };
  std::vector<Written> written;
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (traits.generator[i]) {
      std::optional<at::Generator> gen;
      if (v.isGenerator()) {
        gen = v.toGenerator();
      }
      v = kernel_generator(reserve_draw(gen, device.index()));
      continue;
    }
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      v = c10::Device(c10::DeviceType::CPU);
      continue;
    }
    v = map_tensors(v, [&](const at::Tensor& t) -> at::Tensor {
      if (!is_openreg(t)) {
        return t;  // a CPU scalar, or CPU indices the policy table allows
      }
      at::Tensor h = host.host_tensor(t);
      if (traits.writes[i]) {
        host.mark_written(t);
        written.push_back({t, h});
      }
      return h;
    });
  }

  const bool writes_unannotated = (traits.policy & kWritesUnannotated) != 0;
  if (writes_unannotated) {
    host.snapshot_unwritten();
  }
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }
  if (writes_unannotated) {
    host.mark_changed();
  }

  // Written arguments take the metadata the kernel gave their host copies.
  for (Written& w : written) {
    c10::TensorImpl* impl = w.dev.unsafeGetTensorImpl();
    const std::optional<c10::Storage> dev_storage =
        host.device_storage(w.host.storage());
    if (!dev_storage) {
      // The kernel gave it storage of its own (set_ to a new tensor).
      impl->set_storage_keep_dtype(host.new_device_tensor(w.host).storage());
    } else if (dev_storage->unsafeGetStorageImpl() !=
               w.dev.storage().unsafeGetStorageImpl()) {
      impl->set_storage_keep_dtype(*dev_storage);  // set_ to an argument
    }
    if (w.dev.sizes() != w.host.sizes() ||
        w.dev.strides() != w.host.strides() ||
        w.dev.storage_offset() != w.host.storage_offset()) {
      impl->set_sizes_and_strides(w.host.sizes(), w.host.strides(),
                                  w.host.storage_offset());
    }
    impl->_set_conj(w.host.is_conj());
    impl->_set_neg(w.host.is_neg());
  }
  host.write_back();

  const size_t num_rets = traits.return_arg.size();
  const size_t ret_first = stack->size() - num_rets;
  for (size_t r = 0; r < num_rets; ++r) {
    c10::IValue& v = (*stack)[ret_first + r];
    if (traits.return_arg[r] >= 0) {
      v = originals[static_cast<size_t>(traits.return_arg[r])];
      continue;
    }
    v = map_tensors(v, [&](const at::Tensor& h) -> at::Tensor {
      if (!h.defined() || !h.device().is_cpu()) {
        return h;
      }
      if (h.layout() == c10::kStrided && !h.is_nested()) {
        if (const std::optional<c10::Storage> s =
                host.device_storage(h.storage())) {
          return device_view(*s, h);  // a view of an argument
        }
      }
      return host.new_device_tensor(h);
    });
  }
}
// [/doc:copying-fallback]

// [doc:copy-through-host]
void copy_through_host(const at::Tensor& src, const at::Tensor& dst) {
  const auto on_device = [](const at::Tensor& t) {
    return t.device().type() == c10::DeviceType::PrivateUse1;
  };
  std::optional<OpenRegStream> dst_stream;
  std::optional<HostStorages> dst_host;
  at::Tensor host_dst = dst;
  if (on_device(dst)) {
    dst_stream.emplace(getCurrentStream(dst.device().index()));
    dst_host.emplace(dst.device(), *dst_stream);
    host_dst = dst_host->host_tensor(dst);
    dst_host->mark_written(dst);
  }
  // The source's host copy: the destination's when they share a device (an
  // overlap is then the CPU's to refuse), its own device's otherwise.
  std::optional<OpenRegStream> src_stream;
  std::optional<HostStorages> src_host;
  at::Tensor host_src = src;
  if (on_device(src)) {
    if (dst_host && src.device() == dst.device()) {
      host_src = dst_host->host_tensor(src);
    } else {
      src_stream.emplace(getCurrentStream(src.device().index()));
      src_host.emplace(src.device(), *src_stream);
      host_src = src_host->host_tensor(src);
    }
  }
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    host_dst.copy_(host_src);
  }
  if (dst_host) {
    dst_host->write_back();
  }
}
// [/doc:copy-through-host]

}  // namespace openreg
