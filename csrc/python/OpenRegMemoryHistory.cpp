#include "python/OpenRegMemoryHistory.h"

#include <torch/csrc/Export.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/utils/pybind.h>

#include <vector>

#include "memory/OpenRegAllocator.h"

// Declared in torch/csrc/profiler/python/combined_traceback.h, which
// includes a JSON library the wheel does not ship; exported by
// libtorch_python.
namespace torch {
TORCH_API std::vector<pybind11::object> py_symbolize(
    std::vector<CapturedTraceback*>& to_symbolize);
TORCH_PYTHON_API void installCapturedTracebackPython();
}  // namespace torch

namespace openreg {

namespace py = pybind11;

namespace {

using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;

std::shared_ptr<c10::GatheredContext> gather_python() {
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true,
                                          /*cpp=*/false);
}

std::shared_ptr<c10::GatheredContext> gather_with_cpp() {
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true,
                                          /*cpp=*/true);
}

// `enabled`: None, "state" or "all"; `context`: None, "state", "alloc" or
// "all"; `stacks`: "python" or "all" (torch.cuda.memory's meanings).
void record_history(std::optional<std::string> enabled,
                    std::optional<std::string> context,
                    const std::string& stacks, size_t max_entries, bool clear) {
  TORCH_CHECK(!enabled || *enabled == "state" || *enabled == "all",
              "_record_memory_history: enabled must be None, 'state' or "
              "'all', got '",
              *enabled, "'");
  TORCH_CHECK(!context || *context == "state" || *context == "alloc" ||
                  *context == "all",
              "_record_memory_history: context must be None, 'state', "
              "'alloc' or 'all', got '",
              *context, "'");
  TORCH_CHECK(stacks == "python" || stacks == "all",
              "_record_memory_history: stacks must be 'python' or 'all', got '",
              stacks, "'");
  allocator::HistorySettings settings;
  if (enabled) {
    torch::installCapturedTracebackPython();
    settings.trace = *enabled == "all";
    settings.max_entries = max_entries;
    settings.when = !context              ? RecordContext::NEVER
                    : *context == "state" ? RecordContext::STATE
                    : *context == "alloc" ? RecordContext::ALLOC
                                          : RecordContext::ALL;
    // Live blocks always keep their allocation stack while enabled.
    if (settings.when == RecordContext::NEVER) {
      settings.when = RecordContext::STATE;
    }
    settings.recorder = stacks == "all" ? &gather_with_cpp : &gather_python;
  }
  record_memory_history(settings, clear);
}

const char* action_name(TraceEntry::Action a) {
  switch (a) {
    case TraceEntry::ALLOC:
      return "alloc";
    case TraceEntry::FREE_REQUESTED:
      return "free_requested";
    case TraceEntry::FREE_COMPLETED:
      return "free_completed";
    case TraceEntry::SEGMENT_ALLOC:
      return "segment_alloc";
    case TraceEntry::SEGMENT_FREE:
      return "segment_free";
    case TraceEntry::SEGMENT_MAP:
      return "segment_map";
    case TraceEntry::SEGMENT_UNMAP:
      return "segment_unmap";
    case TraceEntry::SNAPSHOT:
      return "snapshot";
    case TraceEntry::OOM:
      return "oom";
  }
  return "unknown";
}

// Symbolizes contexts in one pass (frames are shared between stacks).
class Frames {
 public:
  // Remembers where the frames of `context` go (nullptr: none).
  void want(const std::shared_ptr<c10::GatheredContext>& context,
            py::dict target) {
    if (context) {
      stacks_.push_back(torch::getCapturedTracebackFromContext(context));
      targets_.push_back(std::move(target));
    } else {
      target["frames"] = py::list();
    }
  }
  void fill() {
    std::vector<py::object> frames = torch::py_symbolize(stacks_);
    for (size_t i = 0; i < frames.size(); ++i) {
      targets_[i]["frames"] = frames[i];
    }
  }

 private:
  std::vector<torch::CapturedTraceback*> stacks_;
  std::vector<py::dict> targets_;
};

// torch.cuda.memory._snapshot()'s dictionary: segments with their blocks
// (and the stacks that allocated them), and each device's trace.
py::dict snapshot_full() {
  Frames frames;
  py::list segments;
  for (const auto& seg : memory_snapshot()) {
    py::dict d;
    d["device"] = static_cast<int>(seg.device);
    d["address"] = seg.address;
    d["total_size"] = seg.total_size;
    d["allocated_size"] = seg.allocated_size;
    d["active_size"] = seg.active_size;
    d["requested_size"] = seg.requested_size;
    d["stream"] = reinterpret_cast<intptr_t>(seg.stream);  // a StreamId
    d["segment_type"] = seg.is_large ? "large" : "small";
    d["segment_pool_id"] = py::make_tuple(0, 0);
    d["is_expandable"] = false;
    frames.want(nullptr, d);
    py::list blocks;
    size_t address = seg.address;
    for (const auto& b : seg.blocks) {
      py::dict bd;
      bd["address"] = address;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested_size;
      bd["state"] = b.allocated ? "active_allocated"
                    : b.active  ? "active_awaiting_free"
                                : "inactive";
      frames.want(b.context_when_allocated, bd);
      blocks.append(bd);
      address += b.size;
    }
    d["blocks"] = blocks;
    segments.append(d);
  }
  py::list traces;
  for (const auto& device : memory_traces()) {
    py::list entries;
    for (const TraceEntry& e : device) {
      py::dict d;
      d["action"] = action_name(e.action_);
      d[e.action_ == TraceEntry::OOM ? "device_free" : "addr"] = e.addr_;
      d["size"] = e.size_;
      d["stream"] = reinterpret_cast<intptr_t>(e.stream_);
      d["time_us"] = static_cast<int64_t>(e.time_.approx_t_);
      d["compile_context"] = e.compile_context_;
      d["user_metadata"] = e.user_metadata_;
      frames.want(e.context_, d);
      entries.append(d);
    }
    traces.append(entries);
  }
  frames.fill();
  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = traces;
  out["allocator_settings"] = py::dict();
  out["external_annotations"] = py::list();
  return out;
}

}  // namespace

void init_memory_history_bindings(py::module_& m) {
  m.def("_record_memory_history", &record_history, py::arg("enabled"),
        py::arg("context"), py::arg("stacks"), py::arg("max_entries"),
        py::arg("clear_history"));
  m.def("_memory_snapshot_full", &snapshot_full);
}

}  // namespace openreg
