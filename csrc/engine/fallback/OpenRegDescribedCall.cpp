#include "engine/fallback/OpenRegDescribedCall.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <openreg.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "aten/OpenRegLaunch.h"
#include "core/OpenRegException.h"
#include "core/OpenRegFunctions.h"
#include "core/OpenRegInterrupt.h"
#include "core/OpenRegLaunchStats.h"
#include "core/OpenRegNamedKernels.h"
#include "core/OpenRegStream.h"
#include "core/OpenRegSynchronize.h"
#include "engine/fallback/OpenRegCallEncoder.h"
#include "engine/fallback/OpenRegDescribedAnswer.h"
#include "engine/fallback/OpenRegDeviceAssert.h"
#include "engine/fallback/OpenRegLaunchPlan.h"
#include "engine/fallback/OpenRegReservedResults.h"
#include "engine/kernels/OpenRegCallFormat.h"
#include "memory/OpenRegAllocator.h"

namespace openreg {

namespace {

bool writes_anything(const OpTraits& traits) {
  for (bool w : traits.writes) {
    if (w) {
      return true;
    }
  }
  return false;
}

std::mutex& lacking_mutex() {
  static std::mutex m;
  return m;
}

std::unordered_set<std::string>& lacking() {
  static auto* names = new std::unordered_set<std::string>();
  return *names;
}

std::string operator_key(const c10::OperatorHandle& op) {
  return op.schema().name() + "." + op.schema().overload_name();
}

}  // namespace

bool device_lacks_operator(const c10::OperatorHandle& op) {
  const std::lock_guard<std::mutex> lock(lacking_mutex());
  return !lacking().empty() && lacking().count(operator_key(op)) > 0;
}

// [doc:load-operator-library]
void load_operator_library(const std::string& path) {
  lazy_init();
  orModule_t module = nullptr;
  char log[1024];
  const orError_t err = orModuleLoadEx(&module, path.c_str(), log, sizeof(log));
  TORCH_CHECK(
      err == orSuccess, "openreg: cannot load the operator library '", path,
      "' into the devices: ", log[0] != '\0' ? log : orGetErrorString(err),
      ". A device process runs no Python: a library that needs it "
      "(a Python extension module) cannot be loaded there; put the "
      "operators in a library linked to libtorch only.");
  // Kept with its registrations until the process ends (module leaked).
  (void)module;
  // An operator the devices lacked may come from this library.
  const std::lock_guard<std::mutex> lock(lacking_mutex());
  lacking().clear();
}
// [/doc:load-operator-library]

bool described_calls_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("OPENREG_DESCRIBED_CALLS");
    return env == nullptr || std::string(env) != "0";
  }();
  return enabled;
}

// [doc:described-call-host]
bool run_described(const c10::OperatorHandle& op, const OpTraits& traits,
                   torch::jit::Stack* stack, c10::Device device,
                   c10::ArrayRef<std::pair<size_t, RandomDraw>> draws,
                   bool check_out_variant, int64_t elements, SyncRun* run) {
  const size_t num_args = traits.writes.size();
  const size_t first = stack->size() - num_args;
  const std::vector<c10::IValue> args(stack->begin() + first, stack->end());
  // The device runs the CPU kernel: an openreg Device argument (a factory's)
  // is the CPU there.
  std::vector<c10::IValue> sent = args;
  for (c10::IValue& v : sent) {
    if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      v = c10::Device(c10::DeviceType::CPU);
    }
  }
  std::vector<c10::Storage> storages;  // the call's, by the answer's index
  std::vector<at::Tensor> tensors;
  std::vector<uint8_t> bytes;
  CallToEncode c;
  c.op = &op;
  c.mode = call::Mode::kDescribe;
  c.traits = &traits;
  c.args = sent;
  c.draws = draws;
  c.threads = kernel_thread_cap(elements);
  c.apply_settings = !host_kernels_supported();
  c.storages = &storages;
  c.tensors = &tensors;
  if (!encode_call(c, bytes)) {
    return false;
  }
  std::string out_name;
  std::string out_overload;
  // As the staged run's check (out_variant_matches in OpenRegFallback.cpp):
  // not for a pointwise operator, whose out= variant always serves, nor for
  // one that writes an argument or draws random numbers, which a second
  // run would write or draw again.
  bool check = check_out_variant && traits.out_variant.has_value() &&
               !traits.out_variant_pointwise;
  for (size_t i = 0; check && i < num_args; ++i) {
    check = !traits.writes[i] && !traits.generator[i];
  }
  if (check) {
    out_name = traits.out_variant->schema().name();
    out_overload = traits.out_variant->schema().overload_name();
  }
  AnswerBuffer answer;
  call::DescribeParams p{};
  p.answer = reinterpret_cast<uint64_t>(answer.data());
  p.capacity = kAnswerBytes;
  // Unique per call: a call's results may still wait for their take on
  // one stream while the next described call runs on another.
  static std::atomic<uint64_t> next_token{1};
  p.token = next_token.fetch_add(1, std::memory_order_relaxed);
  p.out_name_len = static_cast<uint16_t>(out_name.size());
  p.out_overload_len = static_cast<uint16_t>(out_overload.size());
  p.call_bytes = static_cast<uint32_t>(bytes.size());
  const size_t size =
      sizeof(p) + out_name.size() + out_overload.size() + bytes.size();
  if (size > OR_MAX_KERNEL_PARAMS) {
    return false;
  }
  // The results' device memory first: an out of memory is raised before the
  // device works, and the device makes the results in it (no copy after).
  std::vector<ReservedBlock> reserved = reserve_results(op, traits, args);
  const size_t n_reserved =
      std::min(reserved.size(),
               (OR_MAX_KERNEL_PARAMS - size) / sizeof(call::ReservedBlock));
  p.n_reserved = static_cast<uint32_t>(n_reserved);
  if (reserved.empty()) {
    // Nothing was reserved (sizes that depend on the data, a small call, no
    // Meta kernel): one allocation of the kernel may not take more than the
    // device has free (DescribeParams::workspace_limit).
    p.workspace_limit = std::max<size_t>(1, device_free_bytes(device.index()));
  }
  std::vector<uint8_t> params(size + n_reserved * sizeof(call::ReservedBlock));
  uint8_t* at = params.data();
  std::memcpy(at, &p, sizeof(p));
  at += sizeof(p);
  std::memcpy(at, out_name.data(), out_name.size());
  at += out_name.size();
  std::memcpy(at, out_overload.data(), out_overload.size());
  at += out_overload.size();
  std::memcpy(at, bytes.data(), bytes.size());
  at += bytes.size();
  for (size_t i = 0; i < n_reserved; ++i) {
    const call::ReservedBlock b{
        reinterpret_cast<uint64_t>(reserved[i].block.get()), reserved[i].bytes};
    std::memcpy(at + i * sizeof(b), &b, sizeof(b));
  }

  stats::count_op(stats::kDescribed, traits.display_name.c_str());
  KeptOnDevice kept(device.index(), p.token);
  launch_function(device.index(), traits.display_name,
                  named_kernel(NamedKernel::kDescribeCall), params.data(),
                  params.size(), elements);
  // The host needs the answer now: the call's own synchronization, which
  // raises first what queued work before it deferred. Ctrl-C may end it (a
  // user's kernel that never returns): the device then keeps the answer
  // buffer; the results' device memory is freed in stream order, after the
  // call.
  {
    const OpenRegStream stream = getCurrentStream(device.index());
    const InterruptibleWait interruptible;
    // An operator whose results' sizes depend on the data synchronizes on
    // CUDA too; any other first run only because openreg learns it.
    std::optional<InternalWait> internal;
    if (!traits.data_dependent) {
      internal.emplace();
    }
    try {
      const CallsOwnWait own;  // a failure is raised at this call
      stream.synchronize();
    } catch (...) {
      if (orStreamQuery(stream.native()) != orSuccess) {
        answer.abandon();
      }
      throw;
    }
  }

  call::Reader r(answer.data(), kAnswerBytes);
  const auto h = r.get<call::AnswerHeader>();
  TORCH_INTERNAL_ASSERT(h.magic == call::kAnswerMagic,
                        "openreg: the device gave no answer for ",
                        traits.display_name);
  if (h.status == call::AnswerStatus::kTooLarge) {
    kept.nothing_kept();
    TORCH_CHECK_NOT_IMPLEMENTED(
        !writes_anything(traits), "openreg: the answer of ",
        traits.display_name, " on the device needs ", h.size,
        " bytes, more than the ", kAnswerBytes, " bytes it may have");
    return false;  // it changed nothing: run it staged
  }
  std::vector<c10::Warning> warnings = read_warnings(r, h.n_warnings);
  if (h.status == call::AnswerStatus::kUnknownOperator) {
    kept.nothing_kept();
    const std::lock_guard<std::mutex> lock(lacking_mutex());
    lacking().insert(operator_key(op));
    return false;  // nothing ran: the host runs it
  }
  if (h.status != call::AnswerStatus::kDone) {
    kept.nothing_kept();
    const auto kind = r.get<call::ErrorKind>();
    std::string what = read_text(r);
    if (h.status == call::AnswerStatus::kUnsupported) {
      TORCH_CHECK_NOT_IMPLEMENTED(
          !writes_anything(traits), "openreg: ", traits.display_name,
          " returned ", what, " on the device, which its answer cannot carry");
      return false;  // it changed nothing: run it staged
    }
    for (const c10::Warning& w : warnings) {
      c10::warn(w);
    }
    // [doc:failed-call-resized]
    // What the kernel resized before it raised keeps the new shape, as on
    // the CPU: `torch.cumsum(arange(3), 0, out=<2 bools>)` raises with
    // `out` of size 3. The device memory is allocated here; its contents
    // are unspecified, as after the CPU's resize.
    for (uint16_t i = 0; i < h.n_written; ++i) {
      const auto index = r.get<uint16_t>();
      const auto ndim = r.get<uint8_t>();
      std::vector<int64_t> sizes(ndim);
      std::vector<int64_t> strides(ndim);
      for (int64_t& v : sizes) {
        v = r.get<int64_t>();
      }
      for (int64_t& v : strides) {
        v = r.get<int64_t>();
      }
      TORCH_INTERNAL_ASSERT(index < tensors.size());
      at::Tensor dev = tensors[index];
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      dev.resize_(sizes);
      if (dev.strides() != c10::IntArrayRef(strides)) {
        dev.as_strided_(sizes, strides, dev.storage_offset());
      }
    }
    // [/doc:failed-call-resized]
    if (kind != call::ErrorKind::kOutOfMemory &&
        defer_device_assert(traits, stack, device, what)) {
      run->returned_view = true;  // never learnt: the device is unusable
      return true;
    }
    raise_device_error(kind, std::move(what));
  }
  for (const c10::Warning& w : warnings) {
    c10::warn(w);
  }

  // Device blocks for the new memory: the blocks reserved before the launch
  // where the Meta kernel gave the size, the others from the caching
  // allocator on this stream now (an out of memory is raised here, the
  // device keeps what it computed until `kept` drops it).
  std::vector<uint64_t> sizes(h.n_new_storages);
  std::vector<int64_t> made_in(h.n_new_storages);  // a reserved block, or -1
  for (size_t i = 0; i < sizes.size(); ++i) {
    sizes[i] = r.get<uint64_t>();
    made_in[i] = r.get<int64_t>();
  }
  std::vector<c10::DataPtr> blocks(sizes.size());
  // First the results the device made in their reserved block (no copy:
  // the device skips them when it hands the results over), then the others
  // take reserved blocks by size, or new ones below.
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (made_in[i] >= 0) {
      TORCH_INTERNAL_ASSERT(static_cast<size_t>(made_in[i]) < reserved.size() &&
                            reserved[made_in[i]].block.get() != nullptr &&
                            reserved[made_in[i]].bytes == sizes[i]);
      blocks[i] = std::move(reserved[made_in[i]].block);
    }
  }
  reserved.erase(std::remove_if(reserved.begin(), reserved.end(),
                                [](const ReservedBlock& b) {
                                  return b.block.get() == nullptr;
                                }),
                 reserved.end());
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (made_in[i] < 0) {
      blocks[i] = take_reserved_block(reserved, sizes[i]);
    }
  }
  reserved.clear();  // what no result took goes back before more is taken
  std::vector<uint64_t> addresses;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (blocks[i].get() == nullptr) {
      blocks[i] = sizes[i] == 0 ? c10::DataPtr(nullptr, device)
                                : device_allocator()->allocate(sizes[i]);
    }
    addresses.push_back(reinterpret_cast<uint64_t>(blocks[i].get()));
  }
  if (sizes.empty()) {
    kept.nothing_kept();
  } else {
    TORCH_CHECK_NOT_IMPLEMENTED(
        sizeof(call::TakeResultsParams) + addresses.size() * sizeof(uint64_t) <=
            OR_MAX_KERNEL_PARAMS,
        "openreg: ", traits.display_name, " made ", addresses.size(),
        " new tensors on the device, more than one launch can take");
    kept.take(addresses);
  }

  // Call storages the kernel reallocated (an out= argument it grew).
  for (uint16_t i = 0; i < h.n_replaced; ++i) {
    const auto k = r.get<uint16_t>();
    const auto j = r.get<uint16_t>();
    TORCH_INTERNAL_ASSERT(k < storages.size() && j < blocks.size());
    c10::StorageImpl* impl = storages[k].unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(),
                "Trying to resize storage that is not resizable");
    impl->set_data_ptr_noswap(std::move(blocks[j]));
    impl->set_nbytes(sizes[j]);
  }
  std::vector<std::optional<c10::Storage>> fresh(blocks.size());
  auto storage_of = [&](const TensorDesc& d) -> c10::Storage {
    const size_t i = d.rec.storage;
    if (d.rec.where == call::Where::kCallStorage) {
      TORCH_INTERNAL_ASSERT(i < storages.size());
      return storages[i];
    }
    TORCH_INTERNAL_ASSERT(i < blocks.size());
    if (!fresh[i]) {
      fresh[i] = c10::Storage(c10::Storage::use_byte_size_t(), sizes[i],
                              std::move(blocks[i]), device_allocator(),
                              /*resizable=*/true);
    }
    return *fresh[i];
  };
  // A result; `in_place`: the argument it returns instead.
  auto make_tensor = [&](const TensorDesc& d, bool in_place) -> at::Tensor {
    if (d.rec.where == call::Where::kUndefined || in_place) {
      return at::Tensor();
    }
    run->returned_view =
        run->returned_view || d.rec.where == call::Where::kCallStorage;
    at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
        storage_of(d), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
        c10::scalarTypeToTypeMeta(static_cast<c10::ScalarType>(d.rec.dtype)));
    t.unsafeGetTensorImpl()->set_sizes_and_strides(d.sizes, d.strides,
                                                   d.rec.storage_offset);
    t._set_conj((d.rec.flags & call::kConj) != 0);
    t._set_neg((d.rec.flags & call::kNeg) != 0);
    return t;
  };

  // Written arguments take the metadata the kernel gave them.
  for (uint16_t i = 0; i < h.n_written; ++i) {
    const auto index = r.get<uint16_t>();
    const TensorDesc d = read_tensor_desc(r);
    TORCH_INTERNAL_ASSERT(index < tensors.size() &&
                          d.rec.where != call::Where::kUndefined);
    const at::Tensor& dev = tensors[index];
    c10::TensorImpl* impl = dev.unsafeGetTensorImpl();
    const c10::Storage storage = storage_of(d);
    if (storage.unsafeGetStorageImpl() !=
        dev.storage().unsafeGetStorageImpl()) {
      impl->set_storage_keep_dtype(storage);
    }
    const bool resized = dev.sizes() != c10::IntArrayRef(d.sizes) ||
                         dev.strides() != c10::IntArrayRef(d.strides);
    if (resized || dev.storage_offset() != d.rec.storage_offset) {
      impl->set_sizes_and_strides(d.sizes, d.strides, d.rec.storage_offset);
    }
    const bool conj = (d.rec.flags & call::kConj) != 0;
    const bool neg = (d.rec.flags & call::kNeg) != 0;
    run->bits_changed =
        run->bits_changed || dev.is_conj() != conj || dev.is_neg() != neg;
    impl->_set_conj(conj);
    impl->_set_neg(neg);
    if (resized) {
      for (size_t a = 0; a < num_args; ++a) {
        if (traits.writes[a] && args[a].isTensor() &&
            args[a].toTensor().unsafeGetTensorImpl() == impl) {
          run->resized.push_back(static_cast<int>(a));
        }
      }
    }
  }

  // The returns: in-place and out= results are the arguments themselves.
  TORCH_INTERNAL_ASSERT(h.n_returns == traits.return_arg.size(),
                        "openreg: the device answered ", h.n_returns,
                        " returns of ", traits.display_name, ", which has ",
                        traits.return_arg.size());
  std::vector<c10::IValue> results;
  for (size_t ret = 0; ret < h.n_returns; ++ret) {
    const bool in_place = traits.return_arg[ret] >= 0;
    c10::IValue v;
    switch (r.get<call::Tag>()) {
      case call::Tag::kNone:
        break;
      case call::Tag::kTensor:
        v = make_tensor(read_tensor_desc(r), in_place);
        break;
      case call::Tag::kBool:
        v = r.get<uint8_t>() != 0;
        break;
      case call::Tag::kInt:
        v = r.get<int64_t>();
        break;
      case call::Tag::kDouble:
        v = r.get<double>();
        break;
      case call::Tag::kComplex: {
        const auto re = r.get<double>();
        const auto im = r.get<double>();
        v = c10::complex<double>(re, im);
        break;
      }
      case call::Tag::kTensorList: {
        c10::List<at::Tensor> list;
        const auto n = r.get<uint32_t>();
        for (uint32_t k = 0; k < n; ++k) {
          list.push_back(make_tensor(read_tensor_desc(r), in_place));
        }
        v = std::move(list);
        break;
      }
      default:
        TORCH_INTERNAL_ASSERT(false, "openreg: an answer has an unknown tag");
    }
    if (in_place) {
      v = args[static_cast<size_t>(traits.return_arg[ret])];
    }
    results.push_back(std::move(v));
  }
  run->out_variant_matches = h.out_variant_matches != 0;
  run->warnings = std::move(warnings);
  torch::jit::drop(*stack, num_args);
  for (c10::IValue& v : results) {
    stack->push_back(std::move(v));
  }
  return true;
}
// [/doc:described-call-host]

}  // namespace openreg
