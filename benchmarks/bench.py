"""openreg vs CPU micro-benchmarks, measured in one process.

Every case runs the same work on the CPU and on ``openreg:0`` and reports
``openreg time / cpu time`` (for the copy: openreg bandwidth / cpu
bandwidth). openreg computes on the host CPU too, so the ratio is the cost of
the device layer itself: dispatch, kernel launch, allocation and copies.

Method: for each case, warm up, then alternate timed blocks on the CPU and on
openreg (alternating spreads machine noise over both); each block runs the
operation ``inner`` times and, for openreg, ends with ``torch.openreg.synchronize()``.
The time per operation is the median over the blocks.

Usage: python benchmarks/bench.py [--quick] [--out DIR]
Writes DIR/bench.json and DIR/bench.png (DIR defaults to benchmarks/results).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

DEVICE = torch.device("openreg", 0)
CPU = torch.device("cpu")


def sync(device: torch.device) -> None:
    if device.type == "openreg":
        torch.openreg.synchronize(device)


def time_per_op(fn: Callable[[], object], device: torch.device, inner: int) -> float:
    """Seconds per call of fn, over one block of `inner` calls (synchronized)."""
    sync(device)
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    sync(device)
    return (time.perf_counter() - start) / inner


def compare(make: Callable[[torch.device], Callable[[], object]], inner: int, reps: int):
    """Seconds per op of each block on the CPU and on openreg, measured alternately."""
    fns = {dev: make(dev) for dev in (CPU, DEVICE)}
    for dev, fn in fns.items():  # warmup: caches, allocator pools, worker threads
        for _ in range(2):
            time_per_op(fn, dev, inner)
    times = {CPU: [], DEVICE: []}
    for _ in range(reps):
        for dev, fn in fns.items():
            times[dev].append(time_per_op(fn, dev, inner))
    return times[CPU], times[DEVICE]


# --- the cases: each returns a zero-argument callable doing one operation ----
def tiny_add(dev):
    x = torch.randn(64).to(dev)
    return lambda: x + 1


def big_add(dev):
    a, b = torch.randn(16 * 2**20).to(dev), torch.randn(16 * 2**20).to(dev)
    return lambda: a + b


def matmul(dev):
    a, b = torch.randn(1024, 1024).to(dev), torch.randn(1024, 1024).to(dev)
    return lambda: a @ b


def mlp_step(dev):
    torch.manual_seed(0)  # the same initial weights on both devices
    model = nn.Sequential(
        nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(256, 512).to(dev), torch.randint(10, (256,)).to(dev)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    step.opt = opt  # for the peak-memory measurement
    return step


def training_step_peak_bytes(dev: torch.device) -> int:
    """Peak bytes allocated during one MLP training step, above what was live before.

    Gradients are dropped first, so every allocation of the step is seen. On
    openreg the allocator's peak statistic answers; on the CPU the profiler's
    memory events, summed in time order.
    """
    step = mlp_step(dev)
    step()  # warm up (optimizer state, lazy initialisation)
    step.opt.zero_grad(set_to_none=True)
    if dev.type == "cpu":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
        events = [
            (e.start_ns(), e.nbytes())
            for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
        ]
        live = peak = 0
        for _, nbytes in sorted(events):
            live += nbytes
            peak = max(peak, live)
        return peak
    sync(dev)
    base = torch.openreg.memory_allocated(dev)
    torch.openreg.reset_peak_memory_stats(dev)
    step()
    sync(dev)
    return torch.openreg.max_memory_allocated(dev) - base


def host_overlap() -> dict:
    """A loop whose steps do device work and Python work: on a device that
    runs asynchronously the two overlap, so a step costs less than their sum."""
    x = torch.ones(2**20, device=DEVICE)

    def device_work():
        for _ in range(4):
            x.mul_(1.0)

    def host_work():
        total = 0
        for i in range(6000):
            total += i * i
        return total

    def per_step(fn, steps=30):
        sync(DEVICE)
        t = time.perf_counter()
        for _ in range(steps):
            fn()
        sync(DEVICE)
        return (time.perf_counter() - t) / steps

    for _ in range(3):
        per_step(lambda: (device_work(), host_work()))
    device_s = statistics.median(per_step(device_work) for _ in range(5))
    host_s = statistics.median(per_step(host_work) for _ in range(5))
    both_s = statistics.median(per_step(lambda: (device_work(), host_work())) for _ in range(5))
    return {"device_s": device_s, "host_s": host_s, "both_s": both_s}


def conv2d(dev):
    torch.manual_seed(0)
    x = torch.randn(1, 64, 56, 56).to(dev)
    w = torch.randn(64, 64, 3, 3).to(dev)
    return lambda: torch.nn.functional.conv2d(x, w, padding=1)


def _train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def cnn_step(dev):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 10),
    ).to(dev)
    x, y = torch.randn(32, 3, 32, 32).to(dev), torch.randint(10, (32,)).to(dev)
    return _train_step(model, x, y)


def transformer_step(dev):
    torch.manual_seed(0)
    block = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
    model = nn.Sequential(block, nn.Flatten(), nn.Linear(64 * 128, 10)).to(dev)
    x, y = torch.randn(16, 64, 128).to(dev), torch.randint(10, (16,)).to(dev)
    return _train_step(model, x, y)


def empty(dev):
    return lambda: torch.empty(1024, device=dev)


COPY_BYTES = 64 * 2**20


def copy_64mb(dev):
    n = COPY_BYTES // 4
    if dev.type == "cpu":  # baseline: CPU tensor -> CPU tensor
        src, dst = torch.randn(n), torch.empty(n)
    else:  # pinned host memory -> device
        src, dst = torch.randn(n).pin_memory(), torch.empty(n, device=dev)
    return lambda: dst.copy_(src, non_blocking=True)


# name, factory, inner calls per block, reps (full, quick), goal, goal is a max?
CASES = [
    ("tiny op x+1 (64 floats)", tiny_add, 2000, (25, 5), 1.25, True),
    ("16M-float add a+b", big_add, 5, (25, 5), 1.05, True),
    ("1024x1024 matmul", matmul, 10, (25, 5), 1.05, True),
    ("MLP training step", mlp_step, 5, (25, 5), 1.05, True),
    ("conv2d 64ch 56x56", conv2d, 5, (25, 5), 1.05, True),
    ("small CNN training step", cnn_step, 3, (15, 5), 1.05, True),
    ("transformer block training step", transformer_step, 3, (15, 5), 1.05, True),
    ("torch.empty(1024)", empty, 5000, (25, 5), 1.2, True),
    ("64 MB pinned H2D copy (bandwidth)", copy_64mb, 5, (25, 5), 0.9, False),
]


def other_cpu_use(seconds: float = 0.5) -> float:
    """Fraction of all CPUs busy during `seconds` while this process sleeps (Linux)."""

    def ticks() -> tuple[int, int]:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        return sum(values), values[3] + values[4]  # total, idle + iowait

    try:
        total0, idle0 = ticks()
        time.sleep(seconds)
        total1, idle1 = ticks()
    except OSError:
        return 0.0
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def fmt_time(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.8))
    xs = range(len(rows))
    colors = ["tab:green" if r["passed"] else "tab:red" for r in rows]
    ax.bar(xs, [r["ratio"] for r in rows], color=colors, width=0.6)
    for x, r in zip(xs, rows, strict=True):
        ax.hlines(r["goal"], x - 0.4, x + 0.4, colors="black", linestyles="--", linewidth=1.5)
        top = max(r["ratio"], r["goal"])  # keep the value clear of the goal line
        ax.annotate(
            f"{r['ratio']:.2f}",
            (x, top),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
        )
    ax.axhline(1.0, color="gray", linewidth=0.8)
    labels = [
        r["name"].replace(" (", "\n(") + f"\ngoal {'<=' if r['goal_is_max'] else '>='}{r['goal']}"
        for r in rows
    ]
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("openreg / cpu  (time; bandwidth for the copy)")
    ax.set_title("openreg vs CPU (dashed: goal; green: goal met, red: missed)")
    ax.set_ylim(0, max(max(r["ratio"] for r in rows), 1.3) * 1.15)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    # The CPU fallback names each operator it serves once; not news here.
    torch.openreg.set_fallback_warnings(False)
    parser = argparse.ArgumentParser(description="openreg/CPU time ratios")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results",
        help="output directory (default benchmarks/results)",
    )
    args = parser.parse_args()
    torch.openreg.init()
    t_start = time.perf_counter()
    busy = other_cpu_use()
    if busy > 0.1:
        print(f"warning: other processes use {busy:.0%} of the CPUs; the ratios will be noisy")

    rows = []
    header = (
        f"{'benchmark':36s} {'cpu':>10s} {'openreg':>10s} {'ratio':>7s} {'goal':>7s} [quartiles]"
    )
    print(header)
    print("-" * len(header))
    for name, make, inner, reps, goal, goal_is_max in CASES:
        cpu_times, dev_times = compare(make, inner, reps[1] if args.quick else reps[0])
        cpu_s, dev_s = statistics.median(cpu_times), statistics.median(dev_times)
        # The ratio is the median of the ratios of adjacent blocks (measured
        # alternately), which cancels slow drifts of the machine's speed;
        # the quartiles of those ratios show the spread.
        pairs = [d / c for c, d in zip(cpu_times, dev_times, strict=True)]
        if not goal_is_max:  # bandwidth ratio, higher is better
            pairs = [1 / r for r in pairs]
        q1, ratio, q3 = statistics.quantiles(pairs, n=4)
        passed = ratio <= goal if goal_is_max else ratio >= goal
        if goal_is_max:
            cpu_col, dev_col = fmt_time(cpu_s), fmt_time(dev_s)
        else:
            cpu_col = f"{COPY_BYTES / cpu_s / 1e9:.2f} GB/s"
            dev_col = f"{COPY_BYTES / dev_s / 1e9:.2f} GB/s"
        goal_col = f"{'<=' if goal_is_max else '>='}{goal}"
        mark = "" if passed else "  (missed)"
        print(
            f"{name:36s} {cpu_col:>10s} {dev_col:>10s} {ratio:7.2f} {goal_col:>7s} "
            f"[{q1:.2f}-{q3:.2f}]{mark}",
            flush=True,
        )
        rows.append(
            {
                "name": name,
                "cpu_seconds": cpu_s,
                "openreg_seconds": dev_s,
                "ratio": ratio,
                "ratio_quartiles": [q1, q3],
                "goal": goal,
                "goal_is_max": goal_is_max,
                "passed": passed,
                "inner": inner,
                "cpu_block_seconds": cpu_times,
                "openreg_block_seconds": dev_times,
            }
        )

    cpu_peak = training_step_peak_bytes(torch.device("cpu"))
    dev_peak = training_step_peak_bytes(DEVICE)
    ratio = dev_peak / cpu_peak
    name = "MLP training step peak memory"
    print(
        f"{name:36s} {cpu_peak / 2**20:7.2f} MiB {dev_peak / 2**20:7.2f} MiB "
        f"{ratio:7.2f} {'<=1.1':>7s}" + ("" if ratio <= 1.1 else "  (missed)")
    )
    rows.append(
        {
            "name": name,
            "cpu_bytes": cpu_peak,
            "openreg_bytes": dev_peak,
            "ratio": ratio,
            "goal": 1.1,
            "goal_is_max": True,
            "passed": ratio <= 1.1,
        }
    )

    ov = host_overlap()
    ratio = ov["both_s"] / (ov["host_s"] + ov["device_s"])
    name = "host+device loop / (host + device)"
    print(
        f"{name:36s} {fmt_time(ov['host_s'] + ov['device_s']):>10s} {fmt_time(ov['both_s']):>10s} "
        f"{ratio:7.2f} {'<1.0':>7s}" + ("" if ratio < 1.0 else "  (missed)")
    )
    rows.append(
        {
            "name": name,
            **ov,
            "ratio": ratio,
            "goal": 1.0,
            "goal_is_max": True,
            "passed": ratio < 1.0,
        }
    )

    met = sum(r["passed"] for r in rows)
    elapsed = time.perf_counter() - t_start
    print(
        f"{met}/{len(rows)} goals met in {elapsed:.1f} s "
        "(ratio: openreg/cpu time, or openreg/cpu bandwidth for the copy)"
    )

    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cpu_busy_at_start": busy,
            "python": sys.version.split()[0],
        },
        "torch_version": torch.__version__,
        "openreg_device": torch.openreg.get_device_name(DEVICE),
        "quick": args.quick,
        "seconds": elapsed,
        "rows": rows,
    }
    (args.out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, args.out / "bench.png")
    print(f"wrote {args.out / 'bench.json'} and {args.out / 'bench.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
