"""The edges of torch.cuda a CUDA user meets, under the shim: patching its
attributes, the memory-snapshot tools, get_arch_list, torch.Generator on
"cuda", the deprecated torch.cuda.amp spellings. Prints one line per check."""

import pickle
import sys
import unittest.mock
import warnings

import torch

out_dir = sys.argv[1]

# mock.patch of a torch.cuda name, then of a private one: both restored.
with unittest.mock.patch("torch.cuda.set_rng_state", lambda *a: "patched"):
    inside = torch.cuda.set_rng_state(None)
state = torch.cuda.get_rng_state()
torch.cuda.set_rng_state(state)  # the real one again
with unittest.mock.patch("torch.cuda._lazy_init", lambda: "patched"):
    private = torch.cuda._lazy_init()
print("patch", inside, private, torch.cuda._lazy_init is not None)

print("arch", torch.cuda.get_arch_list(), repr(torch.cuda.get_gencode_flags()))

g = torch.Generator(device="cuda").manual_seed(3)
a = torch.randn(4, device="cuda", generator=g)
b = torch.randn(4, device="cuda", generator=torch.Generator("cuda").manual_seed(3))
print("generator", g.device, isinstance(g, torch.Generator), torch.equal(a.cpu(), b.cpu()))

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.cuda.amp.autocast():
        half = (torch.ones(2, 2, device="cuda") @ torch.ones(2, 2, device="cuda")).dtype
    torch.cuda.amp.GradScaler()
messages = [str(w.message) for w in caught]
print("amp", half, len(messages), all("torch.cuda.amp." in m for m in messages))

torch.cuda.memory._record_memory_history(max_entries=1000)
kept = torch.empty(3 << 20, device="cuda")
snapshot = torch.cuda.memory._snapshot()
torch.cuda.memory._dump_snapshot(f"{out_dir}/snapshot.pickle")
torch.cuda.memory._record_memory_history(enabled=None)
actions = [e["action"] for e in snapshot["device_traces"][0]]
live = [
    b
    for s in snapshot["segments"]
    for b in s["blocks"]
    if b["state"] == "active_allocated" and b["size"] == 3 << 22
]
with open(f"{out_dir}/snapshot.pickle", "rb") as f:
    dumped = pickle.load(f)
from torch.cuda import _memory_viz  # noqa: E402  (the viewer reads it)

print(
    "snapshot",
    actions[:2] == ["segment_alloc", "alloc"],
    any(f["filename"].endswith("shim_edges.py") for f in live[0]["frames"]),
    len(_memory_viz.trace_plot(dumped)) > 0,
)
