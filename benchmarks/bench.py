"""openreg vs CPU benchmarks, each device measured in its own fresh process.

Every case runs the same work on the CPU and on ``openreg:0`` and reports
``openreg time / cpu time`` (for the copy: openreg bandwidth / cpu
bandwidth). openreg computes on the host CPU too, so the ratio is the cost
of the device layer, or its gain where the host dispatches while the device
computes.

Method (see benchmarks/README.md): each device runs in fresh Python
processes, never next to the other device, because work on one device can
change the speed of the other in the same process (the OpenMP pools of two
threads compete for the cores). A round of a case starts one process per
device; each builds and warms up the case, then the two time blocks of
``inner`` calls in turn (paired.py), 15 each (5 with ``--quick``), each
block after an untimed one and alone on the cores while the other process
waits; openreg blocks end with ``torch.openreg.synchronize()``. This VM's
speed changes by ~20% for tens of seconds, so a ratio compares blocks timed
within a second of each other: the row's ratio is the median over
``rounds`` (5) rounds of the turns' ratios, its range that of the rounds'
medians, and "best" the ratio of the fastest block of each side. The first
run (one call per process) still alternates whole processes. Unless
``--no-busy``, a second table times three cases, a fresh process per round
and device, while one process per core spins, and compares each device
with itself idle (busy / idle).

Usage: python benchmarks/bench.py [--quick] [--no-busy] [--out DIR]
Writes DIR/bench.json and DIR/bench.png (DIR defaults to benchmarks/results).
"""

import argparse
import datetime
import importlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import paired
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
    x, y = torch.randn(256, 512).to(dev), torch.randint(10, (256,)).to(dev)
    return _train_step(model, x, y)


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

    def steady(fn, warm_s=0.2):
        # Each part runs alone for warm_s before it is timed: the driver
        # chooses the device's OpenMP spin over 40 ms windows
        # (docs/process-driver.md), and a part timed at once ran under the
        # choice the part before it called for (the device-only part under
        # the host-bound loop's short spin: 2-5 times slower).
        end = time.perf_counter() + warm_s
        while time.perf_counter() < end:
            per_step(fn)
        return statistics.median(per_step(fn) for _ in range(5))

    def both():
        device_work()
        host_work()

    device_s = steady(device_work)
    host_s = steady(host_work)
    both_s = steady(both)
    return {"device_s": device_s, "host_s": host_s, "both_s": both_s}


def conv2d(dev):
    torch.manual_seed(0)
    x = torch.randn(1, 64, 56, 56).to(dev)
    w = torch.randn(64, 64, 3, 3).to(dev)
    return lambda: torch.nn.functional.conv2d(x, w, padding=1)


def _train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, optimizer=torch.optim.SGD):
    """One classification training step: forward, cross-entropy, backward, optimizer step."""
    opt = optimizer(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    step.opt = opt  # for the peak-memory measurement
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


def dispatch_step(dev):
    """A training step too small for the kernels to dominate: dispatch-bound."""
    torch.manual_seed(0)
    layers = [m for _ in range(6) for m in (nn.Linear(64, 64), nn.ReLU())]
    model = nn.Sequential(*layers, nn.Linear(64, 10)).to(dev)
    x, y = torch.randn(32, 64).to(dev), torch.randint(10, (32,)).to(dev)
    return _train_step(model, x, y, torch.optim.AdamW)


def dropout_mlp(dev):
    """Forward and backward of a 256-wide MLP with two Dropout(0.1)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(256, 10),
    ).to(dev)
    x = torch.randn(128, 256).to(dev)

    def step():
        for p in model.parameters():
            p.grad = None
        model(x).sum().backward()

    return step


# name -> (factory, inner calls per block, blocks (full, quick), goal, goal is a max,
# busy goal (None: not measured busy): openreg's slowdown on the busy machine
# (busy / idle) at most this times the CPU's slowdown)
CASES = {
    "tiny op x+1 (64 floats)": (tiny_add, 2000, (15, 5), 0.65, True, 1.0),
    "dispatch-bound training step": (dispatch_step, 50, (15, 5), 0.65, True, 1.0),
    "MLP with 2 dropouts fwd+bwd": (dropout_mlp, 20, (15, 5), 0.90, True, 1.0),
    "conv2d 64ch 56x56": (conv2d, 5, (15, 5), 1.05, True, None),
    "transformer block training step": (transformer_step, 3, (15, 5), 1.05, True, None),
    "1024x1024 matmul": (matmul, 10, (15, 5), 1.05, True, None),
    "MLP training step": (mlp_step, 5, (15, 5), 1.05, True, None),
    "small CNN training step": (cnn_step, 3, (15, 5), 1.05, True, None),
    "16M-float add a+b": (big_add, 5, (15, 5), 1.05, True, None),
    "torch.empty(1024)": (empty, 5000, (15, 5), 1.2, True, None),
    "64 MB pinned H2D copy (bandwidth)": (copy_64mb, 5, (15, 5), 0.9, False, None),
}

# The first call of a large operation in a fresh process (a first run is
# synchronous on openreg: the device makes its results in the device memory
# the host reserved for them; before, it made them in its own memory and
# copied them over). One call per process, alternate rounds.
FIRST_RUN = "first run: l1_loss of 2x256 MB f64"
FIRST_RUN_GOAL = 1.5


def first_run_seconds(dev: torch.device) -> float:
    g = torch.Generator().manual_seed(0)
    n = 1 << 25  # 256 MB of float64 each
    x = torch.randn(n, dtype=torch.float64, generator=g).to(dev)
    y = torch.randn(n, dtype=torch.float64, generator=g).to(dev)
    torch.ones(4, device=dev).add(1).sum().item()  # workers
    # What a process's first Python Meta kernel imports (about 1 s; openreg
    # runs the Meta kernel of a large first run to reserve its results, and
    # l1_loss's is torch._refs'): this row is the large first run's memory
    # path; the import is once per process (benchmarks/README.md, stop 79).
    importlib.import_module("torch._dynamo")
    sync(dev)
    start = time.perf_counter()
    torch.nn.functional.l1_loss(x, y).item()
    return time.perf_counter() - start


# Measured in one openreg process each (not a CPU/openreg ratio of two processes).
CONTAMINATION = "CPU step after openreg / fresh"
PEAK = "MLP training step peak memory"
OVERLAP = "host+device loop / (host + device)"


# --- inside a measuring process ----------------------------------------------
def measure_case(name: str, device: torch.device, quick: bool) -> dict:
    make, inner, blocks, *_ = CASES[name]
    fn = make(device)
    for _ in range(2):  # warm up: plans, allocator pools, worker threads
        time_per_op(fn, device, inner)
    times = [time_per_op(fn, device, inner) for _ in range(blocks[1] if quick else blocks[0])]
    return {"seconds": statistics.median(times), "blocks": times}


def cpu_step_seconds(step, blocks: int = 7) -> float:
    return statistics.median(time_per_op(step, CPU, 50) for _ in range(blocks))


def measure_contamination() -> dict:
    """A CPU training step before and after the same process trained on openreg."""
    cpu = dispatch_step(CPU)
    cpu_step_seconds(cpu, 2)
    fresh = cpu_step_seconds(cpu)
    dev = dispatch_step(DEVICE)
    for _ in range(5):
        time_per_op(dev, DEVICE, 50)
    after = cpu_step_seconds(cpu)
    time.sleep(1.0)
    later = cpu_step_seconds(cpu)
    return {"fresh_s": fresh, "after_s": after, "one_second_later_s": later}


def measure(name: str, device: str, quick: bool) -> dict:
    if name == CONTAMINATION:
        return measure_contamination()
    if name == PEAK:
        return {"bytes": training_step_peak_bytes(torch.device(device))}
    if name == OVERLAP:
        return host_overlap()
    if name == FIRST_RUN:
        return {"seconds": first_run_seconds(torch.device(device))}
    return measure_case(name, torch.device(device), quick)


def serve_case(name: str, device_name: str, quick: bool) -> None:
    """A fresh process holding one case, timing a block of `inner` calls
    whenever the orchestrator asks (paired.serve)."""
    make, inner, *_ = CASES[name]
    device = torch.device(device_name)
    fn = make(device)
    for _ in range(2):  # warm up: plans, allocator pools, worker threads
        time_per_op(fn, device, inner)

    def block() -> dict:
        time_per_op(fn, device, inner)  # untimed: the process sat idle
        return {"seconds": time_per_op(fn, device, inner)}

    paired.serve(block)


# --- the orchestrator ---------------------------------------------------------
def run_fresh(name: str, device: str, quick: bool, driver: str | None = None) -> dict:
    """Runs `measure(name, device)` in a new Python process (OPENREG_DRIVER=driver;
    None: this process's setting, the default driver when unset)."""
    cmd = [sys.executable, __file__, "--measure", name, "--device", device]
    if quick:
        cmd.append("--quick")
    env = dict(os.environ, **({"OPENREG_DRIVER": driver} if driver else {}))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{name} on {device} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def spin_code(parent: int) -> str:
    """Python source of a spinner: burns a core until `parent` is no longer its parent.

    A spinner that outlives bench.py (killed with SIGKILL, say, where no finally
    runs) would slow every later timing on the machine, so each one checks
    about every millisecond whether it was reparented and then exits.
    """
    return f"import os\nwhile os.getppid() == {parent}:\n    for _ in range(100_000): pass\n"


class Spinners:
    """Processes that keep every core busy while the busy table is measured.

    __exit__ kills them (on an exception, Ctrl-C or SIGTERM too: see
    raise_on_sigterm); they also exit by themselves if this process dies.
    """

    def __init__(self, count: int):
        self.count = count
        self.procs: list[subprocess.Popen] = []

    def __enter__(self):
        spin = spin_code(os.getpid())
        try:
            for _ in range(self.count):
                self.procs.append(subprocess.Popen([sys.executable, "-c", spin]))
            time.sleep(0.5)
        except BaseException:  # __exit__ does not run when __enter__ raises
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []


def raise_on_sigterm() -> None:
    """Makes SIGTERM raise SystemExit, so that `with` blocks (the spinners) clean up."""

    def handler(signum, frame):
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def fmt_time(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


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


def row(
    name, cpu_col, dev_col, ratio, lo, hi, goal, goal_is_max, best=None, last=None, **extra
) -> dict:
    """Prints a table row and returns it; the last column is `best`, or `last` if given."""
    passed = ratio <= goal if goal_is_max else ratio >= goal
    goal_col = f"{'<=' if goal_is_max else '>='}{goal}"
    best_col = last if last is not None else "-" if best is None else f"{best:.2f}"
    print(
        f"{name:36s} {cpu_col:>10s} {dev_col:>10s} {ratio:7.2f} {goal_col:>7s} "
        f"[{lo:.2f}-{hi:.2f}] {best_col:>5s}" + ("" if passed else "  (missed)"),
        flush=True,
    )
    if best is not None:
        extra["best_ratio"] = best
    return {
        "name": name,
        "ratio": ratio,
        "ratio_range": [lo, hi],
        "goal": goal,
        "goal_is_max": goal_is_max,
        "passed": passed,
        **extra,
    }


def alternate(name: str, rounds: int, quick: bool, driver: str | None = None) -> dict:
    """Seconds per call of `name` in `rounds` fresh processes per device, in turn."""
    runs = {"cpu": [], "openreg": []}
    for r in range(rounds):
        order = ("cpu", "openreg") if r % 2 == 0 else ("openreg", "cpu")
        for device in order:
            runs[device].append(run_fresh(name, device, quick, driver)["seconds"])
    return runs


def start_server(name: str, side: str, quick: bool) -> paired.Server:
    """A fresh `--serve` process timing `name` for `side`: "cpu", "openreg"
    (this process's driver) or a driver's name."""
    device = "cpu" if side == "cpu" else "openreg"
    cmd = [sys.executable, __file__, "--serve", name, "--device", device]
    if quick:
        cmd.append("--quick")
    driver = side if side in ("thread", "process") else None
    env = dict(os.environ, **({"OPENREG_DRIVER": driver} if driver else {}))
    return paired.Server(cmd, env, f"{name} on {side}")


def paired_seconds(name: str, rounds: int, quick: bool, sides: list[str]) -> dict:
    """Seconds per call of `name`, block by block, for "cpu" and each openreg
    side (paired.py): `rounds` rounds of fresh processes timing their blocks
    in turn. Entry i of every side's list comes from the same turn."""
    turns = CASES[name][2][1 if quick else 0]
    per = paired.paired_rounds(
        lambda side: start_server(name, side, quick), ["cpu", *sides], rounds, turns
    )
    return {side: [m["seconds"] for m in blocks] for side, blocks in per.items()}


def paired_row(
    name: str, goal: float, goal_is_max: bool, cpu: list[float], dev: list[float], rounds: int
) -> dict:
    """The row of one openreg side against the CPU's blocks of the same turns:
    the ratio is the median of the turns' ratios, the range that of the
    rounds' medians (a round: one pair of processes), "best" the fastest
    block of each side."""
    ratios = [d / c for c, d in zip(cpu, dev, strict=True)]
    turns = len(ratios) // rounds
    per_round = [statistics.median(ratios[i : i + turns]) for i in range(0, len(ratios), turns)]
    ratio, best = statistics.median(ratios), min(dev) / min(cpu)
    cpu_s, dev_s = statistics.median(cpu), statistics.median(dev)
    if not goal_is_max:  # bandwidth: higher is better
        ratio, per_round, best = 1 / ratio, [1 / p for p in per_round], 1 / best
        mb = COPY_BYTES / 1e9
        cpu_col, dev_col = f"{mb / cpu_s:.2f} GB/s", f"{mb / dev_s:.2f} GB/s"
    else:
        cpu_col, dev_col = fmt_time(cpu_s), fmt_time(dev_s)
    return row(
        name,
        cpu_col,
        dev_col,
        ratio,
        min(per_round),
        max(per_round),
        goal,
        goal_is_max,
        best=best,
        inner=CASES[name][1],
        cpu_seconds=cpu,
        openreg_seconds=dev,
    )


def compare_case(name: str, goal: float, goal_is_max: bool, rounds: int, quick: bool) -> dict:
    """openreg (this process's driver) against the CPU. A case of CASES is
    timed in paired blocks; the first run, one call per process, in `rounds`
    fresh processes per device, in turn."""
    if name in CASES:
        s = paired_seconds(name, rounds, quick, ["openreg"])
        return paired_row(name, goal, goal_is_max, s["cpu"], s["openreg"], rounds)
    runs = alternate(name, rounds, quick)
    per_round = [d / c for c, d in zip(runs["cpu"], runs["openreg"], strict=True)]
    cpu_s, dev_s = statistics.median(runs["cpu"]), statistics.median(runs["openreg"])
    return row(
        name,
        fmt_time(cpu_s),
        fmt_time(dev_s),
        dev_s / cpu_s,
        min(per_round),
        max(per_round),
        goal,
        goal_is_max,
        best=min(runs["openreg"]) / min(runs["cpu"]),
        inner=1,
        cpu_seconds=runs["cpu"],
        openreg_seconds=runs["openreg"],
    )


def header(title: str) -> None:
    line = (
        f"{'benchmark':36s} {'cpu':>10s} {'openreg':>10s} {'ratio':>7s} {'goal':>7s} "
        "[range]      best"
    )
    print(f"\n{title}\n{line}\n{'-' * len(line)}", flush=True)


def idle_table(rounds: int, quick: bool) -> list[dict]:
    header(f"idle machine: paired blocks of fresh processes, {rounds} rounds")
    rows = [compare_case(n, c[3], c[4], rounds, quick) for n, c in CASES.items()]
    rows.append(compare_case(FIRST_RUN, FIRST_RUN_GOAL, True, rounds, quick))

    runs = [run_fresh(CONTAMINATION, "openreg", quick) for _ in range(rounds)]
    ratios = [r["after_s"] / r["fresh_s"] for r in runs]
    later = [r["one_second_later_s"] / r["fresh_s"] for r in runs]
    fresh = statistics.median(r["fresh_s"] for r in runs)
    after = statistics.median(r["after_s"] for r in runs)
    rows.append(
        row(
            CONTAMINATION,
            fmt_time(fresh),
            fmt_time(after),
            statistics.median(ratios),
            min(ratios),
            max(ratios),
            1.05,
            True,
            runs=runs,
            one_second_later_ratio=statistics.median(later),
        )
    )

    cpu_peak = run_fresh(PEAK, "cpu", quick)["bytes"]
    dev_peak = run_fresh(PEAK, "openreg", quick)["bytes"]
    ratio = dev_peak / cpu_peak
    mib = f"{cpu_peak / 2**20:.2f} MiB", f"{dev_peak / 2**20:.2f} MiB"
    rows.append(row(PEAK, *mib, ratio, ratio, ratio, 1.1, True, cpu_bytes=cpu_peak))

    ov = [run_fresh(OVERLAP, "openreg", quick) for _ in range(rounds)]
    ratios = [o["both_s"] / (o["host_s"] + o["device_s"]) for o in ov]
    both = statistics.median(o["both_s"] for o in ov)
    apart = statistics.median(o["host_s"] + o["device_s"] for o in ov)
    rows.append(
        row(
            OVERLAP,
            fmt_time(apart),
            fmt_time(both),
            statistics.median(ratios),
            min(ratios),
            max(ratios),
            0.80,
            True,
            runs=ov,
        )
    )
    return rows


def busy_table(rounds: int, quick: bool, idle_rows: list[dict]) -> list[dict]:
    """Each device busy against itself idle: how much the spinners slow it down.

    A ratio of openreg busy to the CPU busy says little: with two spinning
    processes the CPU's OpenMP team collapses (its dispatch-bound step went
    from 0.57 ms idle to 64 ms busy), so openreg looked good against it
    whatever it did. The goal is on openreg's own slowdown (busy / idle, the
    idle medians of this run), against the CPU's: the device layer must not
    make a program more fragile under load than the CPU is.
    """
    cores = os.cpu_count() or 2
    idle = {r["name"]: r for r in idle_rows}
    line = (
        f"{'benchmark':36s} {'cpu busy':>10s} {'or busy':>10s} {'or slow':>7s} {'goal':>7s} "
        "[range]  cpu slow"
    )
    print(
        f"\nbusy machine: {cores} spinning processes (one per core), {rounds} rounds; "
        "slow = busy / idle time of the same device\n"
        f"{line}\n{'-' * len(line)}",
        flush=True,
    )
    rows = []
    with Spinners(cores):
        for name, case in CASES.items():
            if case[5] is None:
                continue
            runs = alternate(name, rounds, quick)
            cpu_idle = statistics.median(idle[name]["cpu_seconds"])
            dev_idle = statistics.median(idle[name]["openreg_seconds"])
            cpu_busy = statistics.median(runs["cpu"])
            dev_busy = statistics.median(runs["openreg"])
            per_round = [d / dev_idle for d in runs["openreg"]]
            goal = round(case[5] * cpu_busy / cpu_idle, 2)
            rows.append(
                row(
                    name,
                    fmt_time(cpu_busy),
                    fmt_time(dev_busy),
                    dev_busy / dev_idle,
                    min(per_round),
                    max(per_round),
                    goal,
                    True,
                    last=f"{cpu_busy / cpu_idle:.2f}",
                    goal_rule=f"<= {case[5]} x the CPU's slowdown",
                    cpu_seconds=runs["cpu"],
                    openreg_seconds=runs["openreg"],
                    cpu_slowdown=cpu_busy / cpu_idle,
                    openreg_over_cpu_busy=dev_busy / cpu_busy,
                )
            )
    return rows


def plot(tables: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = [len(rows) for rows in tables.values()]
    fig, axes = plt.subplots(
        1, len(tables), figsize=(4 + 0.9 * sum(widths), 5.5), gridspec_kw={"width_ratios": widths}
    )
    axes = axes if len(tables) > 1 else [axes]
    for ax, (title, rows) in zip(axes, tables.items(), strict=True):
        xs = range(len(rows))
        colors = ["tab:green" if r["passed"] else "tab:red" for r in rows]
        lo = [r["ratio"] - r["ratio_range"][0] for r in rows]
        hi = [r["ratio_range"][1] - r["ratio"] for r in rows]
        ax.bar(xs, [r["ratio"] for r in rows], color=colors, width=0.6, yerr=[lo, hi], capsize=3)
        for x, r in zip(xs, rows, strict=True):
            ax.hlines(r["goal"], x - 0.4, x + 0.4, colors="black", linestyles="--", linewidth=1.5)
            top = max(r["ratio_range"][1], r["goal"])
            ax.annotate(
                f"{r['ratio']:.2f}",
                (x, top),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.axhline(1.0, color="gray", linewidth=0.8)
        labels = [r["name"] + f"\n{'<=' if r['goal_is_max'] else '>='}{r['goal']}" for r in rows]
        ax.set_xticks(list(xs), labels, fontsize=7, rotation=60, ha="right")
        ax.set_title("busy: openreg busy / openreg idle" if title == "busy" else title, fontsize=10)
        ax.set_ylim(0, max(max(r["ratio_range"][1] for r in rows), 1.3) * 1.15)
    axes[0].set_ylabel("openreg / cpu (time; bandwidth for the copy)")
    fig.suptitle("openreg vs CPU, paired blocks of fresh processes (dashed: goal; bars: range)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description="openreg/CPU time ratios")
    parser.add_argument("--quick", action="store_true", help="1 round, fewer blocks")
    parser.add_argument("--no-busy", action="store_true", help="skip the busy-machine table")
    parser.add_argument("--rounds", type=int, default=None, help="processes per device (5)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results",
        help="output directory (default benchmarks/results)",
    )
    parser.add_argument(
        "--only", help="only the cases whose name contains this text (idle table, no extra rows)"
    )
    parser.add_argument(
        "--fallback",
        choices=("engine", "copy"),
        default="engine",
        help="openreg's fallback (OPENREG_FALLBACK): the engine (default) or the copying "
        "fallback of a port (docs/operators.md); copy writes to results/fallback-copy",
    )
    parser.add_argument(
        "--driver",
        choices=("process", "thread"),
        default=None,
        help="openreg's driver (OPENREG_DRIVER; default: the environment's, else process); "
        "bench_process_driver.py runs issue 62's rows with both",
    )
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--device", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.device, args.quick)))
        return 0
    if args.serve:
        serve_case(args.serve, args.device, args.quick)
        return 0
    os.environ["OPENREG_FALLBACK"] = args.fallback  # inherited by every fresh process
    if args.driver:
        os.environ["OPENREG_DRIVER"] = args.driver
    driver = os.environ.get("OPENREG_DRIVER") or "process"
    print(f"OPENREG_DRIVER={driver}, OPENREG_FALLBACK={args.fallback}")
    if args.fallback == "copy" and args.out == parser.get_default("out"):
        args.out = args.out / "fallback-copy"

    raise_on_sigterm()
    rounds = args.rounds or (1 if args.quick else 5)
    t_start = time.perf_counter()
    busy = other_cpu_use()
    if busy > 0.1:
        print(f"warning: other processes use {busy:.0%} of the CPUs; the ratios will be noisy")
    if args.only:
        header(f"idle machine, cases matching {args.only!r}: {rounds} rounds")
        selected = [(n, c[3], c[4]) for n, c in CASES.items() if args.only in n]
        if args.only in FIRST_RUN:
            selected.append((FIRST_RUN, FIRST_RUN_GOAL, True))
        tables = {"idle": [compare_case(n, g, m, rounds, args.quick) for n, g, m in selected]}
    else:
        tables = {"idle": idle_table(rounds, args.quick)}
    if not args.no_busy and not args.only:
        tables["busy"] = busy_table(rounds, args.quick, tables["idle"])
    rows = [r for t in tables.values() for r in t]
    met = sum(r["passed"] for r in rows)
    elapsed = time.perf_counter() - t_start
    print(
        f"\n{met}/{len(rows)} goals met in {elapsed:.0f} s (ratio: openreg/cpu time, "
        "or openreg/cpu bandwidth for the copy; range: over the rounds)"
    )

    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "method": "paired blocks of fresh processes; median of the turns' ratios",
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cpu_busy_at_start": busy,
            "python": sys.version.split()[0],
        },
        "torch_version": torch.__version__,
        "quick": args.quick,
        "fallback": args.fallback,
        "driver": driver,
        "rounds": rounds,
        "seconds": elapsed,
        "tables": tables,
    }
    (args.out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(tables, args.out / "bench.png")
    print(f"wrote {args.out / 'bench.json'} and {args.out / 'bench.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
