// SIMULATOR ONLY. The engine's kernels of libopenreg_kernels.so (the
// library's own are in kernels/OpenRegKernelLibrary.cpp): PyTorch's CPU
// kernels run from serialized calls on the device's memory, openreg's
// fused dropout, the example custom operator, torch.compile's kernels and
// the workspace they share. The process driver's device process loads the
// library with orModuleLoad and launches these with orLaunchFunction.
//
// It links ATen's CPU kernels, never the openreg runtime nor Python:
// everything it needs from the device comes in orKernelContext.
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <dlfcn.h>
#include <omp.h>
#include <openreg.h>
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/kernels/OpenRegBinaryKernels.h"
#include "engine/kernels/OpenRegBoxedCall.h"
#include "engine/kernels/OpenRegCallFormat.h"
#include "engine/kernels/OpenRegCompiledKernelFormat.h"
#include "engine/kernels/OpenRegCustomOpKernels.h"
#include "engine/kernels/OpenRegDropout.h"
#include "engine/kernels/OpenRegParallel.h"
#include "engine/kernels/OpenRegReservedBlocks.h"
#include "engine/kernels/OpenRegWorkspace.h"

namespace {

void* translate(void* state, const void* device_address) {
  auto* ctx = static_cast<orKernelContext*>(state);
  return ctx->translate(ctx, device_address);
}

// A warning of the kernel, for the host (orKernelContext::warn).
void warn(void* state, const char* message) {
  auto* ctx = static_cast<orKernelContext*>(state);
  ctx->warn(ctx, message);
}

// Where this kernel reaches the device address `address`; throws when it is
// not device memory.
void* device_ptr(orKernelContext* ctx, uint64_t address) {
  void* p = ctx->translate(ctx, reinterpret_cast<const void*>(address));
  TORCH_CHECK(p != nullptr, "address 0x", std::hex, address,
              " is not device memory of device ", ctx->device);
  return p;
}

// A kernel's thread count (0: any), for its parallel regions on this
// thread, for the scope of the object.
class KernelThreads {
 public:
  explicit KernelThreads(int threads) {
    const int max = omp_get_max_threads();
    const int want = threads > 0 ? threads : max;
    if (want != max) {
      previous_ = max;
      omp_set_num_threads(want);
    }
  }
  ~KernelThreads() {
    if (previous_ > 0) {
      omp_set_num_threads(previous_);
    }
  }
  KernelThreads(const KernelThreads&) = delete;
  KernelThreads& operator=(const KernelThreads&) = delete;

 private:
  int previous_ = 0;
};

// [doc:call-threads]
// The thread count of a serialized call: the one it carries, or, for a call
// that may run on fewer (call::kFewerThreads: outside deterministic mode, or
// one whose results do not depend on it), what the device gives such a
// kernel now (orKernelContext::team_threads: in the simulator,
// one thread fewer while the host runs its own work on the same cores).
//
// SIMULATOR ONLY: after a region of a team, libgomp keeps the team's other
// threads spinning (GOMP_SPINCOUNT), for milliseconds, so that the next
// region starts at once; a worker that now runs its kernels on fewer
// threads leaves them spinning on the core the host is running on. So the
// worker ends its idle team (omp_pause_resource_all, as a launching host
// thread does, see "host-team" in aten/OpenRegLaunch.cpp), and its next
// team kernel starts the threads again:
//  - at once when its last team kernel was one of these, given every thread
//    because the host waited (the backlog a synchronization drains): the
//    host runs again, and only such kernels came lately;
//  - otherwise after kFewerInARow of them in a row, not at the first one: a
//    single elementwise kernel between two matrix products (a residual add)
//    would cost the next product a thread start (the GPT-2 training loop of
//    benchmarks/bench_loops.py took 63 ms a step instead of 57).
// bench.py's host+device loop, 8 fresh processes each: 0.73 of the host's
// and the device's time apart with this, 0.95 with kFewerInARow only, 1.1
// without fewer threads (benchmarks/README.md, stop 55).
int call_threads(const void* params, size_t bytes, orKernelContext* ctx) {
  constexpr int kFewerInARow = 4;
  thread_local int fewer_in_a_row = 0;
  openreg::call::CallHeader h{};
  if (bytes < sizeof(h)) {
    return 0;
  }
  std::memcpy(&h, params, sizeof(h));
  if (h.threads <= 1) {
    return h.threads;
  }
  if ((h.flags & openreg::call::kFewerThreads) != 0 && ctx->version >= 4) {
    const int threads = std::clamp(ctx->team_threads(ctx, h.threads), 1,
                                   static_cast<int>(h.threads));
    if (threads < h.threads) {
      // fewer_in_a_row < 0: the last team kernel was one of these, given
      // every thread while the host waited; the host runs again.
      fewer_in_a_row = fewer_in_a_row < 0 ? kFewerInARow : fewer_in_a_row + 1;
      if (fewer_in_a_row == kFewerInARow && threads == 1) {
        omp_pause_resource_all(omp_pause_soft);
      }
      return threads;
    }
    fewer_in_a_row = -1;
    return h.threads;
  }
  fewer_in_a_row = 0;
  return h.threads;
}
// [/doc:call-threads]

// The parameters of a fixed-layout kernel, or false (after report_error).
template <typename P>
bool read_params(const void* params, size_t bytes, orKernelContext* ctx,
                 const char* kernel, P* out) {
  if (bytes != sizeof(P)) {
    const std::string message =
        std::string(kernel) + ": expected " + std::to_string(sizeof(P)) +
        " parameter bytes, got " + std::to_string(bytes);
    ctx->report_error(ctx, message.c_str());
    return false;
  }
  std::memcpy(out, params, sizeof(P));
  return true;
}

// What a kernel throws becomes its launch's error, naming the operator.
template <typename F>
int run_reporting(orKernelContext* ctx, const std::string& op, F&& f) {
  std::string what;
  try {
    f();
    return 0;
  } catch (const c10::Error& e) {
    what = e.what_without_backtrace();
  } catch (const std::exception& e) {
    what = e.what();
  }
  const std::string message =
      "openreg kernel '" + op + "' failed on the device: " + what;
  ctx->report_error(ctx, message.c_str());
  return 1;
}

// [doc:compiled-kernel-device]
// The entry point `symbol` of the compiled kernel library at `path`, loaded
// on first use and kept for the life of the device (queued launches may
// still need it; ctypes never unloads the host's copy either). Throws with
// dlerror's text when the library or the symbol is missing.
using CompiledEntry = void (*)(void* const* params);

CompiledEntry compiled_entry(const std::string& path,
                             const std::string& symbol) {
  static std::mutex mutex;
  static std::unordered_map<std::string, CompiledEntry> entries;
  const std::string key = path + '\0' + symbol;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = entries.find(key);
  if (it != entries.end()) {
    return it->second;
  }
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    TORCH_CHECK(false, "cannot load the compiled kernel library '", path,
                "': ", why != nullptr ? why : "unknown error");
  }
  void* entry = dlsym(library, symbol.c_str());
  TORCH_CHECK(entry != nullptr, "the compiled kernel library '", path,
              "' has no symbol '", symbol, "'");
  auto fn = reinterpret_cast<CompiledEntry>(entry);
  entries.emplace(key, fn);
  return fn;
}

// A kernel Inductor compiled (engine/kernels/OpenRegCompiledKernelFormat.h):
// the one place where its device addresses become kernel-view pointers.
void run_compiled_kernel(const unsigned char* bytes, size_t size,
                         const openreg::compiled::CompiledKernelHeader& h,
                         orKernelContext* ctx) {
  using openreg::compiled::ArgKind;
  using openreg::compiled::CompiledKernelArg;
  const size_t names = sizeof(h) + h.name_len;
  const std::string path(reinterpret_cast<const char*>(bytes) + names,
                         h.path_len);
  const std::string symbol(
      reinterpret_cast<const char*>(bytes) + names + h.path_len, h.symbol_len);
  const CompiledEntry entry = compiled_entry(path, symbol);
  // The arguments, copied to aligned storage: params[i] points into it.
  c10::SmallVector<CompiledKernelArg, 16> args(h.n_args);
  std::memcpy(args.data(), bytes + names + h.path_len + h.symbol_len,
              h.n_args * sizeof(CompiledKernelArg));
  c10::SmallVector<void*, 16> pointers(h.n_args, nullptr);
  c10::SmallVector<void*, 16> params(h.n_args, nullptr);
  for (uint32_t i = 0; i < h.n_args; ++i) {
    CompiledKernelArg& arg = args[i];
    switch (arg.kind) {
      case ArgKind::kDevicePointer: {
        uint64_t address = 0;
        std::memcpy(&address, arg.value, sizeof(address));
        // Empty tensors have no memory (0) and stay so.
        if (address != 0) {
          pointers[i] = device_ptr(ctx, address);
        }
        params[i] = &pointers[i];
        break;
      }
      case ArgKind::kHostScalar:
        pointers[i] = arg.value;
        params[i] = &pointers[i];
        break;
      case ArgKind::kInt:
      case ArgKind::kFloat:
        params[i] = arg.value;
        break;
      default:
        TORCH_CHECK(false, "argument ", i, " has an unknown kind ",
                    static_cast<uint32_t>(arg.kind));
    }
  }
  entry(params.data());
}
// [/doc:compiled-kernel-device]

}  // namespace

// [doc:team-spin]
// SIMULATOR ONLY: how long the device's OpenMP team threads spin after a
// region, as the driver says ("team-spin-choice" in
// runtime/src/device_team.cpp): a device process for its own libgomp, the
// thread driver for the user process's, which its devices share with the
// host's own CPU work. libgomp spins
// GOMP_SPINCOUNT polls (300,000 by default, milliseconds) after a region or
// at a barrier, so that the next region starts at once; but when the
// process has more OpenMP threads than CPUs it spins about 100 polls and
// sleeps, and it checks that at every wait. A kernel-bound loop wants the
// long spin: a region whose team slept pays a futex wake-up (60-140 us on
// this machine). A host-bound loop wants the short one: the spinning team
// thread takes the core the host's Python runs on. The short spin is one
// OpenMP thread more, kept idle: a thread of this library runs an empty
// region of two and keeps its team; the long spin comes back when that
// thread ends its team (omp_pause_resource_all ends the calling thread's
// team only).
namespace {

class TeamSpin {
 public:
  void want(bool short_spin) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (want_short_ == short_spin) {
        return;
      }
      want_short_ = short_spin;
      if (!started_) {
        started_ = true;
        // Named for top -H before it runs (run() waits for mu_): its team
        // thread takes the name too, and it never shows with the name of
        // the thread that sent the hint (a stream worker's, in the thread
        // driver).
        std::thread spin([this] { run(); });
        pthread_setname_np(spin.native_handle(), "openreg-spin");
        spin.detach();
      }
    }
    cv_.notify_one();
  }

 private:
  void run() {
    bool have_short = false;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return want_short_ != have_short; });
      have_short = want_short_;
      lock.unlock();
      if (have_short) {
        // A team of two whose other thread stays idle: one OpenMP thread
        // more than the cores while it lives.
        if (openreg::start_idle_team() < 2) {
          return;  // one thread only: nothing spins
        }
      } else {
        omp_pause_resource_all(omp_pause_soft);  // ends this thread's team
      }
      lock.lock();
    }
  }

  std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  bool want_short_ = false;
  bool started_ = false;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) void openreg_team_spin_hint(
    int host_bound) {
  static TeamSpin* spin = new TeamSpin();  // never destroyed: a detached thread
  if (omp_get_num_procs() >= 2) {
    spin->want(host_bound != 0);
  }
}
// [/doc:team-spin]

// A serialized boxed call (engine/kernels/OpenRegCallFormat.h). What the CPU
// kernel throws becomes the launch's error message, naming the operator as
// the host's deferred errors do. What it warns goes to
// orKernelContext::warn when the call says so (the kernel runs in the
// host's process, the thread driver), but for the warnings the host raised
// at the call; else to this thread's handler (a device process's stderr:
// its TORCH_WARN_ONCE flags are not the host's, see OpenRegCallFormat.h).
extern "C" __attribute__((visibility("default"))) int openreg_boxed_call(
    const void* params, size_t bytes, orKernelContext* ctx) {
  // The operator, for a lost device's message and a failure's.
  const std::string op = openreg::boxed_call_name(params, bytes);
  if (ctx->version >= 2) {
    ctx->describe(ctx, op.c_str());
  }
  return run_reporting(ctx, op, [&] {
    const KernelThreads threads(call_threads(params, bytes, ctx));
    const openreg::kernels::WorkspaceScope workspace;
    openreg::WarningSink warnings;
    if (ctx->version >= 3) {
      warnings = {&warn, ctx};
    }
    openreg::run_boxed_call(params, bytes, {&translate, ctx}, warnings);
  });
}

// [doc:described-call-kernels]
// A described call (call::Mode::kDescribe, engine/kernels/OpenRegCallFormat.h):
// the first run of a signature, or a call whose results depend on the data. The
// CPU kernel runs here as for openreg_boxed_call; the answer goes to pinned
// host memory, and the new results' memory waits, under the call's token,
// for openreg_take_results, which copies it into the blocks the host
// allocated from the answer (or drops it). A failure of the CPU kernel is
// in the answer, for the host to raise with its own class; only a malformed
// call fails the launch.
namespace {

std::mutex& kept_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::unordered_map<uint64_t, std::vector<c10::Storage>>& kept_results() {
  static auto* kept =
      new std::unordered_map<uint64_t, std::vector<c10::Storage>>();
  return *kept;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int openreg_describe_call(
    const void* params, size_t bytes, orKernelContext* ctx) {
  openreg::call::DescribeParams p{};
  const auto* base = static_cast<const char*>(params);
  if (bytes < sizeof(p)) {
    ctx->report_error(ctx, "openreg_describe_call: parameters too short");
    return 1;
  }
  std::memcpy(&p, params, sizeof(p));
  const size_t names = sizeof(p) + p.out_name_len + p.out_overload_len;
  const size_t expected =
      names + p.call_bytes +
      size_t{p.n_reserved} * sizeof(openreg::call::ReservedBlock);
  if (bytes != expected) {
    const std::string message =
        "openreg_describe_call: " + std::to_string(bytes) +
        " parameter bytes, the header says " + std::to_string(expected);
    ctx->report_error(ctx, message.c_str());
    return 1;
  }
  const char* call = base + names;
  const std::string op = openreg::boxed_call_name(call, p.call_bytes);
  if (ctx->version >= 2) {
    ctx->describe(ctx, op.c_str());
  }
  return run_reporting(ctx, op, [&] {
    const KernelThreads threads(call_threads(call, p.call_bytes, ctx));
    const openreg::kernels::WorkspaceScope workspace;
    std::vector<std::pair<void*, size_t>> blocks;
    for (uint32_t i = 0; i < p.n_reserved; ++i) {
      openreg::call::ReservedBlock b{};
      std::memcpy(&b, call + p.call_bytes + i * sizeof(b), sizeof(b));
      blocks.emplace_back(device_ptr(ctx, b.address), b.bytes);
    }
    const openreg::kernels::ReservedResults reserved(std::move(blocks));
    const openreg::kernels::AllocationLimit limit(p.workspace_limit, op);
    auto* answer = static_cast<uint8_t*>(
        ctx->translate(ctx, reinterpret_cast<const void*>(p.answer)));
    TORCH_CHECK(answer != nullptr, "the answer's address 0x", std::hex,
                p.answer, " is not memory the device reaches");
    std::vector<c10::Storage> kept = openreg::describe_boxed_call(
        call, p.call_bytes, {&translate, ctx},
        std::string(base + sizeof(p), p.out_name_len),
        std::string(base + sizeof(p) + p.out_name_len, p.out_overload_len),
        answer, p.capacity);
    const std::lock_guard<std::mutex> lock(kept_mutex());
    if (kept.empty()) {
      kept_results().erase(p.token);
    } else {
      kept_results()[p.token] = std::move(kept);
    }
  });
}

extern "C" __attribute__((visibility("default"))) int openreg_take_results(
    const void* params, size_t bytes, orKernelContext* ctx) {
  openreg::call::TakeResultsParams p{};
  if (bytes < sizeof(p)) {
    ctx->report_error(ctx, "openreg_take_results: parameters too short");
    return 1;
  }
  std::memcpy(&p, params, sizeof(p));
  if (bytes != sizeof(p) + p.n * sizeof(uint64_t)) {
    ctx->report_error(ctx, "openreg_take_results: wrong parameter size");
    return 1;
  }
  std::vector<c10::Storage> kept;
  {
    const std::lock_guard<std::mutex> lock(kept_mutex());
    auto it = kept_results().find(p.token);
    if (it != kept_results().end()) {
      kept = std::move(it->second);
      kept_results().erase(it);
    }
  }
  if (p.n == 0) {
    return 0;  // dropped
  }
  return run_reporting(ctx, "openreg_take_results", [&] {
    TORCH_CHECK(kept.size() == p.n, "the host took ", p.n,
                " results of a described call that made ", kept.size());
    const auto* addresses = static_cast<const char*>(params) + sizeof(p);
    for (size_t j = 0; j < kept.size(); ++j) {
      uint64_t address = 0;
      std::memcpy(&address, addresses + j * sizeof(address), sizeof(address));
      const size_t nbytes = kept[j].nbytes();
      void* to = nbytes > 0 ? device_ptr(ctx, address) : nullptr;
      if (nbytes > 0 && to != kept[j].data()) {  // not made in place
        std::memcpy(to, kept[j].data(), nbytes);
      }
    }
  });
}
// [/doc:described-call-kernels]

// openreg's fused dropout (engine/kernels/OpenRegDropout.h), forward and
// backward: the same functions the thread driver's workers run.
extern "C" __attribute__((visibility("default"))) int openreg_dropout(
    const void* params, size_t bytes, orKernelContext* ctx) {
  openreg::kernels::DropoutParams p;
  if (!read_params(params, bytes, ctx, "openreg_dropout", &p)) {
    return 1;
  }
  return run_reporting(ctx, "aten::native_dropout", [&] {
    const KernelThreads threads(p.threads);
    openreg::kernels::dropout(device_ptr(ctx, p.in), device_ptr(ctx, p.out),
                              static_cast<bool*>(device_ptr(ctx, p.mask)), p.n,
                              static_cast<c10::ScalarType>(p.dtype),
                              p.threshold, p.scale, p.seed, p.offset);
  });
}

extern "C" __attribute__((visibility("default"))) int openreg_dropout_backward(
    const void* params, size_t bytes, orKernelContext* ctx) {
  openreg::kernels::DropoutBackwardParams p;
  if (!read_params(params, bytes, ctx, "openreg_dropout_backward", &p)) {
    return 1;
  }
  return run_reporting(ctx, "aten::native_dropout_backward", [&] {
    const KernelThreads threads(p.threads);
    openreg::kernels::dropout_backward(
        device_ptr(ctx, p.grad),
        static_cast<const bool*>(device_ptr(ctx, p.mask)),
        device_ptr(ctx, p.out), p.n, static_cast<c10::ScalarType>(p.dtype),
        p.scale);
  });
}

// The direct binary path's kernel (engine/kernels/OpenRegBinaryKernels.h).
extern "C" __attribute__((visibility("default"))) int openreg_binary(
    const void* params, size_t bytes, orKernelContext* ctx) {
  openreg::kernels::BinaryParams p;
  if (!read_params(params, bytes, ctx, "openreg_binary", &p)) {
    return 1;
  }
  static constexpr const char* kNames[] = {"aten::add", "aten::sub",
                                           "aten::mul", "aten::div"};
  const char* name = p.op >= 0 && p.op < 4 ? kNames[p.op] : "openreg_binary";
  return run_reporting(ctx, name, [&] {
    openreg::kernels::binary(
        static_cast<openreg::kernels::BinaryOp>(p.op), device_ptr(ctx, p.a),
        p.b_is_number != 0 ? nullptr : device_ptr(ctx, p.b),
        device_ptr(ctx, p.out), p.n, static_cast<c10::ScalarType>(p.dtype),
        p.b_is_number != 0, p.number);
  });
}

// The example custom operator's device kernel
// (engine/kernels/OpenRegCustomOpKernels.h).
extern "C" __attribute__((visibility("default"))) int openreg_scaled_abs(
    const void* params, size_t bytes, orKernelContext* ctx) {
  openreg::kernels::ScaledAbsParams p;
  if (!read_params(params, bytes, ctx, "openreg_scaled_abs", &p)) {
    return 1;
  }
  return run_reporting(ctx, "openreg::scaled_abs", [&] {
    const KernelThreads threads(p.threads);
    openreg::kernels::scaled_abs(device_ptr(ctx, p.in), device_ptr(ctx, p.out),
                                 p.n, static_cast<c10::ScalarType>(p.dtype),
                                 p.scale);
  });
}

// torch.compile's kernels (engine/kernels/OpenRegCompiledKernelFormat.h), with
// either driver: the launch names the library and the symbol, and the
// device loads it. A compiled kernel reports no error; one that faults
// loses the device (process driver), naming the kernel.
extern "C" __attribute__((visibility("default"))) int openreg_compiled_kernel(
    const void* params, size_t bytes, orKernelContext* ctx) {
  openreg::compiled::CompiledKernelHeader h{};
  const auto* data = static_cast<const unsigned char*>(params);
  if (bytes >= sizeof(h)) {
    std::memcpy(&h, data, sizeof(h));
  }
  const size_t expected = sizeof(h) + h.name_len + h.path_len + h.symbol_len +
                          static_cast<size_t>(h.n_args) *
                              sizeof(openreg::compiled::CompiledKernelArg);
  if (bytes < sizeof(h) || h.magic != openreg::compiled::kMagic ||
      bytes != expected) {
    const std::string message =
        "openreg_compiled_kernel: malformed parameters (" +
        std::to_string(bytes) + " bytes, expected " + std::to_string(expected) +
        ")";
    ctx->report_error(ctx, message.c_str());
    return 1;
  }
  const std::string name(reinterpret_cast<const char*>(data) + sizeof(h),
                         h.name_len);
  if (ctx->version >= 2) {
    ctx->describe(ctx, name.c_str());
  }
  return run_reporting(ctx, name, [&] {
    const KernelThreads threads(h.threads);
    run_compiled_kernel(data, bytes, h, ctx);
  });
}

// torch.openreg.empty_cache: frees the blocks the workspace keeps
// (engine/kernels/OpenRegWorkspace.h). No parameters.
extern "C" __attribute__((visibility("default"))) int openreg_release_workspace(
    const void* /*params*/, size_t /*bytes*/, orKernelContext* /*ctx*/) {
  openreg::kernels::release_workspace();
  return 0;
}
