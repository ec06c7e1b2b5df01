// Serialized boxed calls (engine/kernels/OpenRegCallFormat.h) run by the kernel
// library libopenreg_kernels.so through the runtime's named-kernel launch,
// against the same computation on the CPU. ctest runs this binary with each
// driver: under OPENREG_DRIVER=process the calls cross to a device process,
// which runs PyTorch's CPU kernels on its own mapping of device memory.
//
// The calls are written by hand here (the PyTorch layer writes them from the
// dispatcher's stack, engine/fallback/OpenRegCallEncoder.cpp), so this test
// needs the runtime and ATen, not the extension.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <openreg.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/kernels/OpenRegBoxedCall.h"
#include "engine/kernels/OpenRegCallFormat.h"

namespace {

using openreg::call::Mode;
using openreg::call::Tag;
using openreg::call::Writer;

#define OR_ASSERT_OK(expr) ASSERT_EQ(orSuccess, (expr))

// A call, written in the format's order once it is complete.
class CallBuilder {
 public:
  int storage(const void* device, size_t nbytes) {
    Writer(storages_).put(openreg::call::StorageRecord{
        reinterpret_cast<uint64_t>(device), nbytes});
    return n_storages_++;
  }
  int tensor(int storage, const at::Tensor& like, int64_t offset = 0,
             uint8_t flags = 0) {
    Writer w(tensors_);
    openreg::call::TensorRecord rec{};
    rec.storage = static_cast<uint16_t>(storage);
    rec.dtype = static_cast<uint8_t>(like.scalar_type());
    rec.flags = flags;
    rec.ndim = static_cast<uint8_t>(like.dim());
    rec.storage_offset = offset;
    w.put(rec);
    for (int64_t s : like.sizes()) {
      w.put(s);
    }
    for (int64_t s : like.strides()) {
      w.put(s);
    }
    if (storage == openreg::call::kInlineStorage) {
      const at::Tensor c = like.contiguous();
      w.put(static_cast<uint64_t>(c.nbytes()));
      w.put_bytes(c.const_data_ptr(), c.nbytes());
    }
    return n_tensors_++;
  }
  void arg_tensor(int t) {
    put(Tag::kTensor);
    Writer(args_).put(static_cast<uint16_t>(t));
  }
  void arg_int(int64_t v) {
    put(Tag::kInt);
    Writer(args_).put(v);
  }
  void arg_double(double v) {
    put(Tag::kDouble);
    Writer(args_).put(v);
  }
  void arg_generator(uint64_t seed, uint64_t offset) {
    put(Tag::kGenerator);
    Writer(args_).put(seed);
    Writer(args_).put(offset);
  }
  void result(uint16_t ret, int t) {
    Writer(results_).put(
        openreg::call::ResultRecord{ret, -1, static_cast<uint16_t>(t)});
    ++n_results_;
  }
  // The kernel's warnings go to the host (orKernelContext::warn), but for
  // `known` (their messages).
  void forward_warnings(std::vector<std::string> known) {
    flags_ |= openreg::call::kForwardWarnings;
    known_ = std::move(known);
  }
  std::vector<uint8_t> build(const std::string& name,
                             const std::string& overload,
                             Mode mode = Mode::kCopyResults) const {
    std::vector<uint8_t> out;
    Writer w(out);
    openreg::call::CallHeader h{};
    h.magic = openreg::call::kMagic;
    h.version = openreg::call::kVersion;
    h.mode = mode;
    h.flags = flags_;
    h.threads = 1;
    h.name_len = static_cast<uint16_t>(name.size());
    h.overload_len = static_cast<uint16_t>(overload.size());
    h.n_storages = n_storages_;
    h.n_tensors = n_tensors_;
    h.n_args = n_args_;
    h.n_results = n_results_;
    h.n_known_warnings = static_cast<uint16_t>(known_.size());
    w.put(h);
    w.put_bytes(name.data(), name.size());
    w.put_bytes(overload.data(), overload.size());
    for (const std::string& msg : known_) {
      w.put(openreg::call::warning_hash(msg.data(), msg.size()));
    }
    for (const auto* part : {&storages_, &tensors_, &args_, &results_}) {
      w.put_bytes(part->data(), part->size());
    }
    return out;
  }

 private:
  void put(Tag tag) {
    Writer(args_).put(tag);
    ++n_args_;
  }
  std::vector<uint8_t> storages_, tensors_, args_, results_;
  uint16_t n_storages_ = 0, n_tensors_ = 0, n_args_ = 0, n_results_ = 0;
  uint8_t flags_ = 0;
  std::vector<std::string> known_;
};

// A device buffer holding a copy of a CPU tensor's (contiguous) bytes.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) : nbytes(bytes) {
    EXPECT_EQ(orSuccess, orMalloc(&ptr, bytes));
  }
  explicit DeviceBuffer(const at::Tensor& t) : DeviceBuffer(t.nbytes()) {
    const at::Tensor c = t.contiguous();
    EXPECT_EQ(orSuccess, orMemcpy(ptr, c.const_data_ptr(), c.nbytes(),
                                  orMemcpyHostToDevice));
  }
  ~DeviceBuffer() { orFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  // The bytes back, as a tensor shaped like `like` (contiguous).
  at::Tensor read(const at::Tensor& like) const {
    at::Tensor out = at::empty(like.sizes(), like.options());
    EXPECT_EQ(orSuccess, orMemcpy(out.data_ptr(), ptr, out.nbytes(),
                                  orMemcpyDeviceToHost));
    return out;
  }
  void* ptr = nullptr;
  size_t nbytes;
};

class BoxedCallTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* path = std::getenv("OPENREG_KERNELS_LIBRARY");
    ASSERT_EQ(orSuccess,
              orModuleLoad(&module_,
                           path != nullptr ? path : OPENREG_KERNELS_DEFAULT));
    ASSERT_EQ(orSuccess,
              orModuleGetFunction(&call_, module_, "openreg_boxed_call"));
  }
  static void TearDownTestSuite() {
    if (module_ != nullptr) {
      orDeviceSynchronize();
      orModuleUnload(module_);
    }
  }
  // Launches the call on the default stream and waits for it.
  static orError_t Run(const std::vector<uint8_t>& bytes) {
    const orError_t launched =
        orLaunchFunction(nullptr, call_, bytes.data(), bytes.size(), nullptr);
    return launched != orSuccess ? launched : orStreamSynchronize(nullptr);
  }
  static std::string LastMessage() {
    char message[512] = {};
    orStreamGetErrorMessage(nullptr, message, sizeof(message));
    return message;
  }

  static orModule_t module_;
  static orFunction_t call_;
};

orModule_t BoxedCallTest::module_ = nullptr;
orFunction_t BoxedCallTest::call_ = nullptr;

// The suite's module, for helpers outside the fixture.
struct BoxedCallTestAccess : BoxedCallTest {
  static orModule_t module() { return module_; }
};

TEST_F(BoxedCallTest, OutVariantWritesDeviceMemory) {
  const at::Tensor x = at::randn({33, 7});
  const at::Tensor y = at::randn({33, 7});
  DeviceBuffer dx(x), dy(y), dout(x.nbytes());
  CallBuilder c;
  const int sx = c.storage(dx.ptr, dx.nbytes);
  const int sy = c.storage(dy.ptr, dy.nbytes);
  const int so = c.storage(dout.ptr, dout.nbytes);
  c.arg_tensor(c.tensor(sx, x));
  c.arg_tensor(c.tensor(sy, y));
  c.arg_double(2.5);
  c.arg_tensor(c.tensor(so, x, 0, openreg::call::kWritten));
  OR_ASSERT_OK(Run(c.build("aten::add", "out")));
  // The CPU's own add (x + 2.5 * y in two steps rounds differently).
  EXPECT_TRUE(at::allclose(dout.read(x), at::add(x, y, 2.5)));
}

TEST_F(BoxedCallTest, FunctionalResultIsCopiedIntoItsTensor) {
  const at::Tensor a = at::randn({16, 24});
  const at::Tensor b = at::randn({24, 8});
  const at::Tensor expected = at::mm(a, b);
  DeviceBuffer da(a), db(b), dr(expected.nbytes());
  CallBuilder c;
  c.arg_tensor(c.tensor(c.storage(da.ptr, da.nbytes), a));
  c.arg_tensor(c.tensor(c.storage(db.ptr, db.nbytes), b));
  c.result(0, c.tensor(c.storage(dr.ptr, dr.nbytes), expected));
  OR_ASSERT_OK(Run(c.build("aten::mm", "")));
  EXPECT_TRUE(at::allclose(dr.read(expected), expected, 1e-5, 1e-5));
}

TEST_F(BoxedCallTest, IntoResultsAppendsTheResultsToTheOutVariant) {
  const at::Tensor a = at::randn({64});
  const at::Tensor expected = at::exp(a);
  DeviceBuffer da(a), dr(a.nbytes());
  CallBuilder c;
  c.arg_tensor(c.tensor(c.storage(da.ptr, da.nbytes), a));
  c.result(0, c.tensor(c.storage(dr.ptr, dr.nbytes), a));
  OR_ASSERT_OK(Run(c.build("aten::exp", "out", Mode::kIntoResults)));
  EXPECT_TRUE(at::allclose(dr.read(a), expected));
}

TEST_F(BoxedCallTest, TensorsOfOneStorageAlias) {
  // x[1:] += x[:-1] in place: the CPU kernel sees the overlap and must
  // give what it gives on the CPU.
  const at::Tensor x = at::arange(10, at::kFloat);
  at::Tensor expected = x.clone();
  expected.slice(0, 1).add_(expected.slice(0, 0, 9).clone());
  DeviceBuffer dx(x);
  CallBuilder c;
  const int s = c.storage(dx.ptr, dx.nbytes);
  const at::Tensor part = x.slice(0, 0, 9);
  c.arg_tensor(c.tensor(s, part, 1, openreg::call::kWritten));
  c.arg_tensor(c.tensor(s, part, 0));
  c.arg_int(1);
  // add_ of overlapping tensors: PyTorch refuses partial overlap.
  const orError_t err = Run(c.build("aten::add_", "Tensor"));
  EXPECT_EQ(orErrorLaunchFailure, err);
  EXPECT_NE(LastMessage().find("single memory location"), std::string::npos)
      << LastMessage();
  // Two views of one storage that do not overlap compute.
  CallBuilder ok;
  const int s2 = ok.storage(dx.ptr, dx.nbytes);
  const at::Tensor half = x.slice(0, 0, 5);
  ok.arg_tensor(ok.tensor(s2, half, 5, openreg::call::kWritten));
  ok.arg_tensor(ok.tensor(s2, half, 0));
  ok.arg_int(1);
  OR_ASSERT_OK(Run(ok.build("aten::add_", "Tensor")));
  at::Tensor want = x.clone();
  want.slice(0, 5).add_(want.slice(0, 0, 5));
  EXPECT_TRUE(at::equal(dx.read(x), want));
}

TEST_F(BoxedCallTest, CpuTensorArgumentsTravelInline) {
  const at::Tensor x = at::randn({10, 3});
  const at::Tensor index = at::tensor({7, 0, 3}, at::kLong);
  const at::Tensor expected = at::index_select(x, 0, index);
  DeviceBuffer dx(x), dr(expected.nbytes());
  CallBuilder c;
  c.arg_tensor(c.tensor(c.storage(dx.ptr, dx.nbytes), x));
  c.arg_int(0);
  c.arg_tensor(c.tensor(openreg::call::kInlineStorage, index));
  c.result(0, c.tensor(c.storage(dr.ptr, dr.nbytes), expected));
  OR_ASSERT_OK(Run(c.build("aten::index_select", "")));
  EXPECT_TRUE(at::equal(dr.read(expected), expected));
}

TEST_F(BoxedCallTest, KernelErrorIsTheLaunchErrorAndTheStreamGoesOn) {
  const at::Tensor x = at::randn({10, 3});
  const at::Tensor bad = at::tensor({11}, at::kLong);
  DeviceBuffer dx(x), dr(3 * sizeof(float));
  CallBuilder c;
  c.arg_tensor(c.tensor(c.storage(dx.ptr, dx.nbytes), x));
  c.arg_int(0);
  c.arg_tensor(c.tensor(openreg::call::kInlineStorage, bad));
  c.result(0, c.tensor(c.storage(dr.ptr, dr.nbytes), at::empty({1, 3})));
  EXPECT_EQ(orErrorLaunchFailure, Run(c.build("aten::index_select", "")));
  EXPECT_NE(LastMessage().find("out of range"), std::string::npos)
      << LastMessage();
  // The device was not lost: the next call computes.
  CallBuilder next;
  next.arg_tensor(next.tensor(next.storage(dx.ptr, dx.nbytes), x));
  next.result(0, next.tensor(next.storage(dx.ptr, dx.nbytes), x));
  OR_ASSERT_OK(Run(next.build("aten::neg", "")));
  EXPECT_TRUE(at::equal(dx.read(x), -x));
}

TEST_F(BoxedCallTest, MalformedCallsFailWithoutLosingTheDevice) {
  CallBuilder c;
  c.arg_int(1);
  std::vector<uint8_t> bytes = c.build("aten::add", "Tensor");
  bytes.resize(bytes.size() - 3);  // cut inside the last value
  EXPECT_EQ(orErrorLaunchFailure, Run(bytes));
  EXPECT_NE(LastMessage().find("ends early"), std::string::npos)
      << LastMessage();
  CallBuilder unknown;
  EXPECT_EQ(orErrorLaunchFailure, Run(unknown.build("aten::no_such_op", "")));
  EXPECT_NE(LastMessage().find("aten::no_such_op"), std::string::npos)
      << LastMessage();
  OR_ASSERT_OK(orDeviceGetLossReason(0, nullptr, 0));
}

// The device's warnings, taken (orDeviceTakeWarnings).
std::vector<std::string> TakeWarnings() {
  std::vector<std::string> taken;
  EXPECT_EQ(
      orSuccess,
      orDeviceTakeWarnings(
          0,
          [](void* out, const char* message) {
            static_cast<std::vector<std::string>*>(out)->push_back(message);
          },
          &taken));
  return taken;
}

TEST_F(BoxedCallTest, ForwardedWarningsReachTheHostButForTheKnownOnes) {
  // neg.out into a larger out= tensor that the call does not mark written:
  // the CPU kernel resizes it and warns at every call (resize_output).
  const at::Tensor x = at::randn({3});
  DeviceBuffer dx(x), dout(4 * sizeof(float));
  const auto call = [&](bool forward, std::vector<std::string> known) {
    CallBuilder c;
    c.arg_tensor(c.tensor(c.storage(dx.ptr, dx.nbytes), x));
    c.arg_tensor(c.tensor(c.storage(dout.ptr, dout.nbytes), at::empty({4})));
    if (forward) {
      c.forward_warnings(std::move(known));
    }
    return c.build("aten::neg", "out");
  };
  TakeWarnings();  // none left from another test
  OR_ASSERT_OK(Run(call(true, {})));
  OR_ASSERT_OK(Run(call(true, {})));
  const std::vector<std::string> taken = TakeWarnings();
  ASSERT_EQ(2u, taken.size());
  EXPECT_EQ(0u, taken[0].find("An output with one or more elements was "
                              "resized since it had shape [4]"))
      << taken[0];
  EXPECT_EQ(taken[0], taken[1]);
  EXPECT_TRUE(TakeWarnings().empty());  // taken once
  // The host raised it at the call: the device drops it.
  OR_ASSERT_OK(Run(call(true, {"another warning", taken[0]})));
  // Not forwarded: it stays on the device (the thread's handler).
  OR_ASSERT_OK(Run(call(false, {})));
  EXPECT_TRUE(TakeWarnings().empty());
  EXPECT_TRUE(at::equal(dout.read(x), -x));
}

// A described call (Mode::kDescribe) through openreg_describe_call: the
// device runs it and answers in pinned host memory.
class DescribedCall {
 public:
  DescribedCall() {
    EXPECT_EQ(orSuccess, orMallocHost(&answer_, kCapacity));
    EXPECT_EQ(orSuccess, orModuleGetFunction(&describe_, BoxedCallTestModule(),
                                             "openreg_describe_call"));
    EXPECT_EQ(orSuccess, orModuleGetFunction(&take_, BoxedCallTestModule(),
                                             "openreg_take_results"));
  }
  ~DescribedCall() { orFreeHost(answer_); }
  DescribedCall(const DescribedCall&) = delete;
  DescribedCall& operator=(const DescribedCall&) = delete;

  // Runs `call` and waits; the answer is then at answer(). `reserved`: the
  // device memory the results may be made in.
  orError_t Run(
      const std::vector<uint8_t>& call,
      const std::vector<openreg::call::ReservedBlock>& reserved = {}) {
    openreg::call::DescribeParams p{};
    p.answer = reinterpret_cast<uint64_t>(answer_);
    p.capacity = kCapacity;
    p.token = p.answer;
    p.call_bytes = static_cast<uint32_t>(call.size());
    p.n_reserved = static_cast<uint32_t>(reserved.size());
    const size_t table = reserved.size() * sizeof(openreg::call::ReservedBlock);
    std::vector<uint8_t> params(sizeof(p) + call.size() + table);
    std::memcpy(params.data(), &p, sizeof(p));
    std::memcpy(params.data() + sizeof(p), call.data(), call.size());
    if (table != 0) {
      std::memcpy(params.data() + sizeof(p) + call.size(), reserved.data(),
                  table);
    }
    const orError_t err = orLaunchFunction(nullptr, describe_, params.data(),
                                           params.size(), nullptr);
    return err != orSuccess ? err : orStreamSynchronize(nullptr);
  }
  // The kept results go to `addresses` (none: dropped).
  orError_t Take(std::vector<uint64_t> addresses) {
    const openreg::call::TakeResultsParams p{
        reinterpret_cast<uint64_t>(answer_), addresses.size()};
    std::vector<uint8_t> params(sizeof(p) + addresses.size() * 8);
    std::memcpy(params.data(), &p, sizeof(p));
    std::memcpy(params.data() + sizeof(p), addresses.data(),
                addresses.size() * 8);
    const orError_t err =
        orLaunchFunction(nullptr, take_, params.data(), params.size(), nullptr);
    return err != orSuccess ? err : orStreamSynchronize(nullptr);
  }
  openreg::call::Reader answer() const { return {answer_, kCapacity}; }

 private:
  static orModule_t BoxedCallTestModule();
  static constexpr size_t kCapacity = 1 << 16;
  void* answer_ = nullptr;
  orFunction_t describe_ = nullptr;
  orFunction_t take_ = nullptr;
};

orModule_t DescribedCall::BoxedCallTestModule() {
  return BoxedCallTestAccess::module();
}

std::string Text(openreg::call::Reader& r) {
  const auto n = r.get<uint32_t>();
  return std::string(reinterpret_cast<const char*>(r.take(n)), n);
}

TEST_F(BoxedCallTest, DescribedCallAnswersItsResultsAndTheHostTakesThem) {
  using openreg::call::AnswerHeader;
  using openreg::call::AnswerStatus;
  const at::Tensor x = at::tensor({0.f, 3.f, 0.f, 5.f, 1.f});
  const at::Tensor expected = at::nonzero(x);  // 3x1 int64: data-dependent
  DeviceBuffer dx(x);
  DescribedCall described;
  CallBuilder c;
  c.arg_tensor(c.tensor(c.storage(dx.ptr, dx.nbytes), x));
  OR_ASSERT_OK(described.Run(c.build("aten::nonzero", "", Mode::kDescribe)));
  openreg::call::Reader r = described.answer();
  const auto h = r.get<AnswerHeader>();
  ASSERT_EQ(openreg::call::kAnswerMagic, h.magic);
  ASSERT_EQ(AnswerStatus::kDone, h.status);
  ASSERT_EQ(0, h.n_warnings);
  ASSERT_EQ(1, h.n_new_storages);
  ASSERT_EQ(0, h.n_replaced);
  ASSERT_EQ(0, h.n_written);
  ASSERT_EQ(1, h.n_returns);
  EXPECT_EQ(expected.nbytes(), r.get<uint64_t>());
  EXPECT_EQ(-1, r.get<int64_t>());  // in no reserved block
  ASSERT_EQ(Tag::kTensor, r.get<Tag>());
  const auto t = r.get<openreg::call::TensorAnswer>();
  EXPECT_EQ(openreg::call::Where::kNewStorage, t.where);
  EXPECT_EQ(0, t.storage);
  EXPECT_EQ(static_cast<uint8_t>(at::kLong), t.dtype);
  ASSERT_EQ(2, t.ndim);
  EXPECT_EQ(3, r.get<int64_t>());
  EXPECT_EQ(1, r.get<int64_t>());
  DeviceBuffer dr(expected.nbytes());
  OR_ASSERT_OK(described.Take({reinterpret_cast<uint64_t>(dr.ptr)}));
  EXPECT_TRUE(at::equal(dr.read(expected), expected));
}

TEST_F(BoxedCallTest, DescribedCallMakesItsResultInTheReservedBlock) {
  // The host reserved the result's device memory (the size its Meta kernel
  // gives): the CPU kernel writes into it, the answer says so, and the take
  // copies nothing.
  using openreg::call::AnswerHeader;
  const at::Tensor x = at::randn({1 << 15});  // 128 KiB: a workspace size
  const at::Tensor expected = at::neg(x);
  DeviceBuffer dx(x);
  DeviceBuffer block(expected.nbytes());
  DescribedCall described;
  CallBuilder c;
  c.arg_tensor(c.tensor(c.storage(dx.ptr, dx.nbytes), x));
  OR_ASSERT_OK(described.Run(
      c.build("aten::neg", "", Mode::kDescribe),
      {{reinterpret_cast<uint64_t>(block.ptr), expected.nbytes()}}));
  openreg::call::Reader r = described.answer();
  const auto h = r.get<AnswerHeader>();
  ASSERT_EQ(openreg::call::AnswerStatus::kDone, h.status);
  ASSERT_EQ(1, h.n_new_storages);
  EXPECT_EQ(expected.nbytes(), r.get<uint64_t>());
  EXPECT_EQ(0, r.get<int64_t>());  // made in reserved block 0
  EXPECT_TRUE(at::equal(block.read(expected), expected));  // before the take
  OR_ASSERT_OK(described.Take({reinterpret_cast<uint64_t>(block.ptr)}));
  EXPECT_TRUE(at::equal(block.read(expected), expected));
}

TEST_F(BoxedCallTest, DescribedCallAnswersAFailureWithItsClass) {
  // The CPU kernel's error is the answer, not the launch's: the host raises
  // it with its class (an IndexError here), and the stream goes on.
  const at::Tensor x = at::randn({10, 3});
  DeviceBuffer dx(x);
  DescribedCall described;
  CallBuilder c;
  c.arg_tensor(c.tensor(c.storage(dx.ptr, dx.nbytes), x));
  c.arg_int(0);
  c.arg_tensor(
      c.tensor(openreg::call::kInlineStorage, at::tensor({11}, at::kLong)));
  OR_ASSERT_OK(
      described.Run(c.build("aten::index_select", "", Mode::kDescribe)));
  openreg::call::Reader r = described.answer();
  const auto h = r.get<openreg::call::AnswerHeader>();
  ASSERT_EQ(openreg::call::AnswerStatus::kFailed, h.status);
  EXPECT_EQ(openreg::call::ErrorKind::kIndex,
            r.get<openreg::call::ErrorKind>());
  const std::string what = Text(r);
  EXPECT_NE(what.find("out of range"), std::string::npos) << what;
  // An operator the device does not have: nothing runs, the answer says so.
  CallBuilder unknown;
  OR_ASSERT_OK(
      described.Run(unknown.build("mylib::no_such_op", "", Mode::kDescribe)));
  r = described.answer();
  EXPECT_EQ(openreg::call::AnswerStatus::kUnknownOperator,
            r.get<openreg::call::AnswerHeader>().status);
}

void* Identity(void*, const void* p) { return const_cast<void*>(p); }

TEST_F(BoxedCallTest, RandomDrawGivesTheSameBitsOnTheDeviceAsHere) {
  // The draw (seed, offset) alone decides the numbers, wherever the
  // kernel runs: on the device, and in this process over host memory.
  const at::Tensor x = at::zeros({1000});
  DeviceBuffer dx(x);
  at::Tensor here = x.clone();
  auto call = [&](const void* data, size_t nbytes) {
    CallBuilder c;
    c.arg_tensor(
        c.tensor(c.storage(data, nbytes), x, 0, openreg::call::kWritten));
    c.arg_double(0.3);
    c.arg_generator(1234, 56);
    return c.build("aten::bernoulli_", "float");
  };
  OR_ASSERT_OK(Run(call(dx.ptr, dx.nbytes)));
  const std::vector<uint8_t> local = call(here.data_ptr(), here.nbytes());
  openreg::run_boxed_call(local.data(), local.size(), {&Identity, nullptr});
  const at::Tensor device = dx.read(x);
  EXPECT_TRUE(at::equal(device, here));
  EXPECT_GT(device.sum().item<float>(), 200);
  EXPECT_LT(device.sum().item<float>(), 400);
}

}  // namespace
