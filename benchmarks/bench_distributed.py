"""torch.distributed on openreg (orccl over Gloo) vs the same on the CPU with Gloo.

Two cases, each on 2 ranks on 127.0.0.1 (Gloo on the loopback interface, the
process group joined through a file):

- DDP training step: forward, backward (gradients all-reduced by DDP) and SGD
  step of a 512-1024-1024-10 MLP, batch 64 per rank; ratio openreg / CPU time.
  Measured twice: with the ranks left to the scheduler (the row with the
  goal), and with each rank pinned to a core of its own
  (``os.sched_setaffinity`` before any thread starts: one core per rank, as
  one device per rank; informative). Unpinned, openreg's host thread of one
  rank competes with the other rank's kernels on the shared cores. Measured
  a third time with both sides in the same two ranks, a CPU model and an
  openreg model stepping in turn (cpu, openreg, openreg, cpu, ...;
  informative): each pair of steps runs under the same conditions, so this
  ratio does not move with the VM's speed from one process to the next. Its
  check row, "CPU DDP step alternating / alone", compares those CPU steps
  with the CPU-only processes' (openreg running in the same ranks must not
  slow the CPU side).
- all_reduce of 64 MB (16M floats); ratio openreg / CPU bandwidth.

Each side runs in fresh processes (a new process group, a new device), and the
sides alternate over ``--rounds`` rounds; the figures are the medians of the
per-round medians; a ratio is the median of the per-round ratios, with their
range. openreg computes on the host, so the ratio is the cost of the device
layer: kernel views, the communication streams and their ordering.

openreg runs with the environment's driver (``OPENREG_DRIVER``, process by
default); ``make bench`` runs it once per driver. Gloo works on the device
memory itself with either driver (the process driver's view for the
communication library, orMemGetDmaPointer), and on pinned host copies with
``OPENREG_NIC_DMA=0`` (docs/distributed.md).

Usage: python benchmarks/bench_distributed.py [--quick] [--out DIR]
Writes DIR/bench_distributed.json and DIR/bench_distributed.png.
"""

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

WORLD = 2
ALLREDUCE_BYTES = 64 << 20


def _sync(device):
    if device.type == "openreg":
        torch.openreg.synchronize(device)


def _ddp_step(device, rank):
    """A DDP model (512-1024-1024-10 MLP) on `device` and its training step."""
    import torch.distributed as dist  # noqa: F401  (the group exists)
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    ).to(device)
    ddp = DDP(model, device_ids=[rank] if device.type == "openreg" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(64, 512).to(device)
    y = torch.randint(0, 10, (64,)).to(device)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()

    return step


def _timed_once(fn, device) -> float:
    import torch.distributed as dist

    dist.barrier()
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _worker(rank, side, init, steps, pinned, results):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    if pinned:
        # Before any thread of the rank starts: they all inherit the mask.
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    import torch.distributed as dist

    # No backend: Gloo for CPU tensors, orccl for openreg ones (the default).
    dist.init_process_group(init_method=init, rank=rank, world_size=WORLD)
    cpu, dev = torch.device("cpu"), torch.device("openreg", rank)
    if side == "paired":
        # Both sides in the same ranks, steps alternating (cpu, openreg,
        # openreg, cpu, ...): each pair of steps is measured under the same
        # conditions. The "CPU beside openreg / alone" row checks that the
        # CPU steps are not slowed by openreg running in the process.
        steps_of = {"cpu": _ddp_step(cpu, rank), "openreg": _ddp_step(dev, rank)}
        device_of = {"cpu": cpu, "openreg": dev}
        times = {"cpu": [], "openreg": []}
        for i in range(3 + 2 * steps):  # 3 warm-up pairs, then 2 * steps
            order = ("cpu", "openreg") if i % 2 == 0 else ("openreg", "cpu")
            for name in order:
                t = _timed_once(steps_of[name], device_of[name])
                if i >= 3:
                    times[name].append(t)
        out = (statistics.median(times["cpu"]), statistics.median(times["openreg"]))
        steps_of = None
    else:
        device = dev if side == "openreg" else cpu
        step = _ddp_step(device, rank)

        def timed(fn, n):
            return statistics.median(_timed_once(fn, device) for _ in range(n))

        timed(step, 3)  # warm-up: buckets, allocator, Gloo pairs
        step_s = timed(step, steps)
        buf = torch.ones(ALLREDUCE_BYTES // 4, device=device)
        timed(lambda: dist.all_reduce(buf), 2)
        allreduce_s = timed(lambda: dist.all_reduce(buf), max(3, steps // 3))
        out = (step_s, allreduce_s)
        step = buf = None
    if rank == 0:
        results.put(out)
    # Gloo's worker threads drop their last reference to a finished
    # collective's tensors a little after it completes; if the interpreter is
    # already finalizing then, the thread exits inside a destructor and the
    # process aborts (seen on the CPU side, ranks pinned). Release the DDP
    # models and the buffer, and shut the group down, while Python still runs.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    gc.collect()
    # That still left one CPU rank in about ten aborting (exit -6) at
    # finalization: with the result delivered, leave without finalizing.
    results.close()
    results.join_thread()
    os._exit(0)


def run_side(side: str, steps: int, pinned: bool) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/init"
        procs = [
            ctx.Process(target=_worker, args=(r, side, init, steps, pinned, results))
            for r in range(WORLD)
        ]
        # One core per rank, as torchrun's default OMP_NUM_THREADS=1: set
        # before the children start, so every thread of theirs (openreg's
        # stream workers too) gets it.
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            for p in procs:
                p.start()
        finally:
            if saved is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        out = results.get(timeout=600)
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        codes = [p.exitcode for p in procs]
        if codes != [0] * WORLD:
            raise RuntimeError(f"{side} ranks exited with {codes}")
    return out


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 2.5))
    names = [r["case"] for r in rows]
    ratios = [r["ratio"] for r in rows]
    colors = {True: "tab:green", False: "tab:red", None: "tab:gray"}
    ax.barh(names, ratios, color=[colors[r["meets_goal"]] for r in rows])
    for i, r in enumerate(rows):
        if r["goal"] is not None:
            ax.axvline(r["goal"], ymin=i / len(rows), ymax=(i + 1) / len(rows), color="k", ls="--")
        ax.text(r["ratio"], i, f" {r['ratio']:.2f}", va="center")
    ax.set_xlabel("openreg / CPU (dashed: goal; gray: informative)")
    driver = os.environ.get("OPENREG_DRIVER") or "process"
    ax.set_title(f"torch.distributed, 2 ranks, Gloo (OPENREG_DRIVER={driver})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    steps = 6 if args.quick else 20
    rounds = args.rounds or (1 if args.quick else 5)
    driver = os.environ.get("OPENREG_DRIVER") or "process"
    print(f"OPENREG_DRIVER={driver}")
    per_side = {"cpu": [], "openreg": [], "cpu pinned": [], "openreg pinned": [], "paired": []}
    for _ in range(rounds):
        per_side["paired"].append(run_side("paired", steps, pinned=False))
        for side in ("cpu", "openreg"):
            per_side[side].append(run_side(side, steps, pinned=False))
            per_side[f"{side} pinned"].append(run_side(side, steps, pinned=True))

    def med(side, i):
        return statistics.median(r[i] for r in per_side[side])

    # A round runs both sides seconds apart; the VM's speed drifts over
    # minutes, so a ratio is the median of the rounds' ratios (a paired
    # estimate), shown with their range.
    def ratio(pairs, invert=False):
        rs = [o / c for c, o in pairs]
        rs = [1 / r for r in rs] if invert else rs
        return {"ratio": statistics.median(rs), "ratio_range": [min(rs), max(rs)]}

    def across(cpu_side, or_side, i, invert=False):
        pairs = [(c[i], o[i]) for c, o in zip(per_side[cpu_side], per_side[or_side], strict=True)]
        return ratio(pairs, invert)

    def row(case, cpu, openreg, unit, stats, goal):
        return {"case": case, "cpu": cpu, "openreg": openreg, "unit": unit, **stats, "goal": goal}

    bw = ALLREDUCE_BYTES / 1e9
    rows = [
        row(
            "DDP training step",
            med("cpu", 0),
            med("openreg", 0),
            "s",
            across("cpu", "openreg", 0),
            1.05,
        ),
        row(
            "DDP step, sides alternating in one run",
            med("paired", 0),
            med("paired", 1),
            "s",
            ratio(per_side["paired"]),
            None,
        ),
        row(
            "CPU DDP step alternating / alone",
            med("cpu", 0),
            med("paired", 0),
            "s",
            ratio([(c[0], p[0]) for c, p in zip(per_side["cpu"], per_side["paired"], strict=True)]),
            None,
        ),
        row(
            "DDP step, one core per rank",
            med("cpu pinned", 0),
            med("openreg pinned", 0),
            "s",
            across("cpu pinned", "openreg pinned", 0),
            None,
        ),
        row(
            "all_reduce 64 MB (bandwidth)",
            bw / med("cpu", 1),
            bw / med("openreg", 1),
            "GB/s",
            across("cpu", "openreg", 1, invert=True),
            0.9,
        ),
    ]
    for r in rows:
        if r["goal"] is None:
            r["meets_goal"] = None  # informative
        elif r["unit"] == "s":
            r["meets_goal"] = r["ratio"] <= r["goal"]
        else:
            r["meets_goal"] = r["ratio"] >= r["goal"]
    print(f"{'case':40} {'cpu':>12} {'openreg':>12} {'ratio':>7} {'goal':>7} [range]")
    for r in rows:
        fmt = (lambda v: f"{v * 1e3:9.2f} ms") if r["unit"] == "s" else (lambda v: f"{v:7.2f} GB/s")
        goal = "-" if r["goal"] is None else ("<= " if r["unit"] == "s" else ">= ")
        goal += "" if r["goal"] is None else f"{r['goal']:.2f}"
        lo, hi = r["ratio_range"]
        cells = f"{fmt(r['cpu']):>12} {fmt(r['openreg']):>12} {r['ratio']:7.3f} {goal:>7}"
        cells += f" [{lo:.2f}-{hi:.2f}]"
        print(f"{r['case']:40} {cells}")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "driver": driver,
        "world_size": WORLD,
        "rounds": rounds,
        "steps": steps,
        "rows": rows,
        "per_round": per_side,
    }
    (args.out / "bench_distributed.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, args.out / "bench_distributed.png")
    print(f"wrote {args.out / 'bench_distributed.json'} and {args.out / 'bench_distributed.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
