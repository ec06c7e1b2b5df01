// The collectives of the orccl backend: each one checks what Gloo would
// only find out on the stream, takes Gloo's aliases of the device tensors
// (OpenRegCommTensors.h) and hands Gloo's collective to launch() or
// launch_staged() (OpenRegProcessGroup.cpp), which order it with the
// current stream.
#include <ATen/core/ivalue.h>

#include <vector>

#include "core/OpenRegFunctions.h"
#include "distributed/OpenRegCommTensors.h"
#include "distributed/OpenRegProcessGroup.h"

namespace openreg::distributed {

namespace {

void check_reduce_op(const c10d::ReduceOp& op, const char* name) {
  // Checked here, on the host: Gloo would only find out on the stream.
  TORCH_CHECK(
      op != c10d::ReduceOp::PREMUL_SUM, "orccl ", name,
      ": ReduceOp PREMUL_SUM is NCCL's and not supported by Gloo (scale "
      "the input and use SUM)");
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  auto views = gloo_aliases(tensors);
  return launch(
      c10d::OpType::BROADCAST, "broadcast", tensors, tensors, Kind::kCollective,
      [g = gloo_, views, opts]() mutable { return g->broadcast(views, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  check_reduce_op(opts.reduceOp, "allreduce");
  auto views = gloo_aliases(tensors);
  return launch(
      c10d::OpType::ALLREDUCE, "allreduce", tensors, tensors, Kind::kCollective,
      [g = gloo_, views, opts]() mutable { return g->allreduce(views, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceCoalescedOptions& opts) {
  check_reduce_op(opts.reduceOp, "allreduce_coalesced");
  auto views = gloo_aliases(tensors);
  return launch(c10d::OpType::ALLREDUCE_COALESCED, "allreduce_coalesced",
                tensors, tensors, Kind::kCollective,
                [g = gloo_, views, opts]() mutable {
                  return g->allreduce_coalesced(views, opts);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::reduce(
    std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  check_reduce_op(opts.reduceOp, "reduce");
  auto views = gloo_aliases(tensors);
  return launch(
      c10d::OpType::REDUCE, "reduce", tensors, tensors, Kind::kCollective,
      [g = gloo_, views, opts]() mutable { return g->reduce(views, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  auto out = gloo_aliases(outputs);
  auto in = gloo_aliases(inputs);
  return launch(c10d::OpType::ALLGATHER, "allgather",
                flat({flat(outputs), inputs}), flat(outputs), Kind::kCollective,
                [g = gloo_, out, in, opts]() mutable {
                  return g->allgather(out, in, opts);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  auto out = gloo_alias(output);
  auto in = gloo_alias(input);
  return launch(c10d::OpType::_ALLGATHER_BASE, "_allgather_base",
                {output, input}, {output}, Kind::kCollective,
                [g = gloo_, out, in, opts]() mutable {
                  return g->_allgather_base(out, in, opts);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  auto out = gloo_aliases(outputs);
  auto in = gloo_aliases(inputs);
  return launch(c10d::OpType::ALLGATHER_COALESCED, "allgather_coalesced",
                flat({flat(outputs), inputs}), flat(outputs), Kind::kCollective,
                [g = gloo_, out, in, opts]() mutable {
                  return g->allgather_coalesced(out, in, opts);
                });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupOpenReg::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  auto out = gloo_aliases(outputs);
  auto in = gloo_aliases(inputs);
  return launch(c10d::OpType::COALESCED, "allgather_into_tensor_coalesced",
                flat({outputs, inputs}), outputs, Kind::kCollective,
                [g = gloo_, out, in, opts]() mutable {
                  return g->allgather_into_tensor_coalesced(out, in, opts);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  auto out = gloo_aliases(outputs);
  auto in = gloo_aliases(inputs);
  return launch(c10d::OpType::GATHER, "gather", flat({flat(outputs), inputs}),
                flat(outputs), Kind::kCollective,
                [g = gloo_, out, in, opts]() mutable {
                  return g->gather(out, in, opts);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  auto out = gloo_aliases(outputs);
  auto in = gloo_aliases(inputs);
  return launch(c10d::OpType::SCATTER, "scatter", flat({outputs, flat(inputs)}),
                outputs, Kind::kCollective,
                [g = gloo_, out, in, opts]() mutable {
                  return g->scatter(out, in, opts);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  check_reduce_op(opts.reduceOp, "reduce_scatter");
  auto out = gloo_aliases(outputs);
  auto in = gloo_aliases(inputs);
  return launch(c10d::OpType::REDUCE_SCATTER, "reduce_scatter",
                flat({outputs, flat(inputs)}), outputs, Kind::kCollective,
                [g = gloo_, out, in, opts]() mutable {
                  return g->reduce_scatter(out, in, opts);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input,
    const c10d::ReduceScatterOptions& opts) {
  check_reduce_op(opts.reduceOp, "_reduce_scatter_base");
  auto out = gloo_alias(output);
  auto in = gloo_alias(input);
  return launch(c10d::OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base",
                {output, input}, {output}, Kind::kCollective,
                [g = gloo_, out, in, opts]() mutable {
                  return g->_reduce_scatter_base(out, in, opts);
                });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupOpenReg::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  check_reduce_op(opts.reduceOp, "reduce_scatter_tensor_coalesced");
  auto out = gloo_aliases(outputs);
  auto in = gloo_aliases(inputs);
  return launch(c10d::OpType::COALESCED, "reduce_scatter_tensor_coalesced",
                flat({outputs, inputs}), outputs, Kind::kCollective,
                [g = gloo_, out, in, opts]() mutable {
                  return g->reduce_scatter_tensor_coalesced(out, in, opts);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::alltoall_base(
    at::Tensor& output, at::Tensor& input,
    std::vector<int64_t>& output_split_sizes,
    std::vector<int64_t>& input_split_sizes,
    const c10d::AllToAllOptions& opts) {
  auto out = gloo_alias(output);
  auto in = gloo_alias(input);
  return launch(
      c10d::OpType::ALLTOALL_BASE, "alltoall_base", {output, input}, {output},
      Kind::kCollective,
      [g = gloo_, out, in, os = output_split_sizes, is = input_split_sizes,
       opts]() mutable { return g->alltoall_base(out, in, os, is, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::alltoall(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts) {
  auto out = gloo_aliases(outputs);
  auto in = gloo_aliases(inputs);
  return launch(c10d::OpType::ALLTOALL, "alltoall", flat({outputs, inputs}),
                outputs, Kind::kCollective,
                [g = gloo_, out, in, opts]() mutable {
                  return g->alltoall(out, in, opts);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::send(
    std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  auto views = gloo_aliases(tensors);
  return launch(c10d::OpType::SEND, "send", tensors, {}, Kind::kPointToPoint,
                [g = gloo_, views, dst_rank, tag]() mutable {
                  return g->send(views, dst_rank, tag);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::recv(
    std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  auto views = gloo_aliases(tensors);
  return launch(c10d::OpType::RECV, "recv", tensors, tensors,
                Kind::kPointToPoint,
                [g = gloo_, views, src_rank, tag]() mutable {
                  return g->recv(views, src_rank, tag);
                });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::recvAnysource(
    std::vector<at::Tensor>& tensors, int tag) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      common_device(tensors, "recv") < 0,
      "orccl: recv from any source is not supported for openreg tensors "
      "(the source would be known only after the stream ran); pass src=");
  return gloo_->recvAnysource(tensors, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupOpenReg::barrier(
    const c10d::BarrierOptions& opts) {
  // A host-side rendezvous: the device work queued so far finishes first, as
  // ProcessGroupNCCL's barrier (a device all-reduce the host waits for) does.
  if (is_initialized()) {
    const c10::DeviceIndex device =
        opts.device && opts.device->type() == c10::DeviceType::PrivateUse1
            ? opts.device->index()
            : current_device();
    if (device >= 0) {
      getCurrentStream(device).synchronize();
    }
  }
  return in_issue_order([&] { return gloo_->barrier(opts); });
}

}  // namespace openreg::distributed
