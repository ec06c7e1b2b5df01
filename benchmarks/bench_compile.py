"""torch.compile on openreg vs torch.compile on the CPU, and vs eager openreg.

Three training steps (forward, backward, SGD step; the model compiled with
``torch.compile``, the optimizer eager):

- MLP: 512-1024-1024-10, batch 256;
- CNN: two 3x3 convolutions with BatchNorm and ReLU, max pooling, a linear
  classifier, batch 32 of 3x32x32;
- transformer block: pre-norm, 4-head causal scaled dot product attention,
  GELU MLP, width 256, batch 8 of 128 tokens.

Each (case, side) runs in a fresh process: ``eager-cpu``, ``compiled-cpu``,
and ``eager-openreg`` and ``compiled-openreg`` once per driver
(``--drivers``, both by default: ``OPENREG_DRIVER=thread`` and ``process``,
issue 62's "with each driver"). A round starts one process per side for a
case; each compiles and warms up, then the sides time blocks of ``--steps``
(5) steps in turn, 6 turns (2 with ``--quick``), in a rotating order, each
alone while the others wait (paired.py: this VM's speed changes by ~20% for
tens of seconds, so ratios compare blocks timed seconds apart). The rounds
share one Inductor code cache (a temporary directory), so only the first
compiles from scratch. Compilation and warm-up steps are not timed; each
block follows one untimed step, times each step (``time.perf_counter``,
openreg synchronized at the end of the step) and reports the median. The
ratio is the median of the turns' ratios, with their range; the times shown
are the medians over the blocks.

Reported: compiled openreg / compiled CPU time per driver (issue 62's goal
<= 1.0: the same generated kernels, and the device computes while the host
dispatches), and the speed-up of compiling on each device (eager / compiled
time, each a median of per-turn ratios), printed but not a goal: openreg's
speed-up over the CPU's is the eager ratio divided by the compiled one, so
it rewards a slow eager openreg. Before each round the script waits, up to a
minute, for the machine to be idle (other processes using < 10 % of the
CPUs), as bench.py does, and records how busy it found it.

The workers use PyTorch's default thread count unless ``--threads N``
(``OMP_NUM_THREADS=N`` for every worker). On a loaded 2-core machine,
multi-threaded kernels on the host thread suffer from oversubscription more
than the same kernels on openreg's stream worker, which skews the ratio;
``--threads 1`` compares the device layer alone.

Usage: python benchmarks/bench_compile.py [--quick] [--rounds N] [--threads N]
       [--drivers thread,process] [--out DIR]
Writes DIR/bench_compile.json and DIR/bench_compile.png.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import paired
from bench import other_cpu_use  # benchmarks/bench.py: the same idle check

CASES = ("mlp", "cnn", "transformer")
SIDES = ("eager-cpu", "compiled-cpu", "eager-openreg", "compiled-openreg")
DRIVERS = ("thread", "process")


def sides(drivers) -> list[tuple[str, str, str | None]]:
    """(label, worker side, OPENREG_DRIVER) of every process a round runs."""
    out = [(s, s, None) for s in SIDES[:2]]
    for d in drivers:
        out += [(f"{s}/{d}", s, d) for s in SIDES[2:]]
    return out


GOAL = 1.0  # compiled openreg / compiled CPU


def _model(case):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    if case == "mlp":
        model = nn.Sequential(
            nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
        )
        return model, torch.randn(256, 512), torch.randint(0, 10, (256,)), F.cross_entropy
    if case == "cnn":
        model = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(4),
            nn.Flatten(),
            nn.Linear(32 * 8 * 8, 10),
        )
        return model, torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,)), F.cross_entropy

    class Block(nn.Module):
        def __init__(self, dim=256, heads=4):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
            return x + self.ff(self.ln2(x))

    return Block(), torch.randn(8, 128, 256), torch.randn(8, 128, 256), F.mse_loss


def serve(case: str, side: str, steps: int) -> None:
    """One (case, side) in this process: compile and warm up, then time a
    block of `steps` steps whenever the orchestrator asks (paired.serve)."""
    import torch

    torch.manual_seed(0)
    model, x, y, loss_fn = _model(case)
    device = torch.device(side.split("-")[1])
    model, x, y = model.to(device), x.to(device), y.to(device)
    run = model if side.startswith("eager") else torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def sync():
        if device.type == "openreg":
            torch.openreg.synchronize()

    def step():
        opt.zero_grad()
        loss_fn(run(x), y).backward()
        opt.step()

    start = time.perf_counter()
    for _ in range(3):  # the first step compiles
        step()
    sync()
    warmup_s = time.perf_counter() - start

    def block() -> dict:
        step()  # untimed: the process sat idle while the others ran
        times = []
        for _ in range(steps):
            sync()
            t = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t)
        return {"median_s": statistics.median(times), "times": times, "warmup_s": warmup_s}

    paired.serve(block)


def start_server(
    case: str, label: str, steps: int, cache: str, threads: int | None, drivers
) -> paired.Server:
    side, driver = next((s, d) for lab, s, d in sides(drivers) if lab == label)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, OPENREG_FALLBACK_WARNINGS="0")
    if driver:
        env["OPENREG_DRIVER"] = driver
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, __file__, "--serve", case, side, "--steps", str(steps)]
    return paired.Server(cmd, env, f"{case} {label}")


def wait_for_idle(limit: float = 0.10, timeout: float = 60.0) -> float:
    """Waits until other processes use < `limit` of the CPUs (at most `timeout` s)."""
    deadline = time.monotonic() + timeout
    busy = other_cpu_use()
    while busy >= limit and time.monotonic() < deadline:
        busy = other_cpu_use()
    return busy


def paired_ratios(per_turn, case, num, den) -> list[float]:
    """Per-turn ratios num/den of the blocks' median step times."""
    return [
        n["median_s"] / d["median_s"]
        for n, d in zip(per_turn[case][num], per_turn[case][den], strict=True)
    ]


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 1.2 + 0.5 * len(rows)))
    names = [f"{r['case']} ({r['driver']})" for r in rows]
    ratios = [r["ratio"] for r in rows]
    ax1.barh(names, ratios, color=["tab:green" if r["meets_goal"] else "tab:red" for r in rows])
    ax1.axvline(GOAL, color="k", ls="--")
    for i, r in enumerate(ratios):
        ax1.text(r, i, f" {r:.2f}", va="center")
    ax1.set_xlabel(f"compiled openreg / compiled CPU (goal <= {GOAL})")
    pos = range(len(rows))
    ax2.barh([p + 0.2 for p in pos], [r["speedup"] for r in rows], 0.4, label="openreg")
    ax2.barh([p - 0.2 for p in pos], [r["speedup_cpu"] for r in rows], 0.4, label="cpu")
    ax2.set_yticks(list(pos), names)
    ax2.axvline(1.0, color="k", ls=":")
    for i, r in enumerate(rows):
        ax2.text(r["speedup"], i + 0.2, f" {r['speedup']:.2f}x", va="center")
        ax2.text(r["speedup_cpu"], i - 0.2, f" {r['speedup_cpu']:.2f}x", va="center")
    ax2.set_xlabel("speed-up of compiling: eager / compiled")
    ax2.legend(loc="lower right", fontsize=8)
    fig.suptitle("torch.compile training steps")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, one round")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the workers")
    parser.add_argument("--drivers", default=",".join(DRIVERS), help="comma-separated")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--serve", nargs=2, metavar=("CASE", "SIDE"), help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=None, help="steps per block (5)")
    args = parser.parse_args()
    steps = args.steps or 5
    if args.serve:
        serve(*args.serve, steps)
        return 0
    rounds = args.rounds or (1 if args.quick else 5)
    turns = 2 if args.quick else 6
    cases = args.cases.split(",")
    drivers = [d for d in args.drivers.split(",") if d]
    labels = sides(drivers)
    per_turn = {c: {label: [] for label, _, _ in labels} for c in cases}
    busy = []
    with tempfile.TemporaryDirectory() as cache:
        for _ in range(rounds):
            busy.append(wait_for_idle())
            for case in cases:

                def start(label, case=case):
                    return start_server(case, label, steps, cache, args.threads, drivers)

                got = paired.paired_rounds(start, [lab for lab, _, _ in labels], 1, turns)
                for label, blocks in got.items():
                    per_turn[case][label] += blocks
    rows = []
    for case in cases:
        med = {
            label: statistics.median(r["median_s"] for r in per_turn[case][label])
            for label, _, _ in labels
        }
        for d in drivers:
            eager, compiled = f"eager-openreg/{d}", f"compiled-openreg/{d}"
            # Each ratio is the median of the turns' ratios (blocks timed
            # seconds apart: a paired estimate), with their range.
            turn_ratios = paired_ratios(per_turn, case, compiled, "compiled-cpu")
            ratio = statistics.median(turn_ratios)
            speedup = statistics.median(paired_ratios(per_turn, case, eager, compiled))
            speedup_cpu = statistics.median(
                paired_ratios(per_turn, case, "eager-cpu", "compiled-cpu")
            )
            rows.append(
                {
                    "case": f"{case} training step",
                    "driver": d,
                    "eager-cpu": med["eager-cpu"],
                    "compiled-cpu": med["compiled-cpu"],
                    "eager-openreg": med[eager],
                    "compiled-openreg": med[compiled],
                    "ratio": ratio,
                    "ratio_range": [min(turn_ratios), max(turn_ratios)],
                    "goal": GOAL,
                    "meets_goal": ratio <= GOAL,
                    "speedup": speedup,
                    "speedup_cpu": speedup_cpu,
                }
            )
    cols = "".join(f" {s:>16}" for s in SIDES)
    print(f"{'case':24} {'driver':8}{cols} {'ratio':>6} {'goal':>5} [ratio range]  speed-up")
    for r in rows:
        cells = "".join(f" {r[s] * 1e3:13.2f} ms" for s in SIDES)
        print(
            f"{r['case']:24} {r['driver']:8}{cells} {r['ratio']:6.2f} {'<=' + str(GOAL):>5}"
            f" [{r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}]"
            f"  {r['speedup']:.2f}x / {r['speedup_cpu']:.2f}x"
            + ("" if r["meets_goal"] else "  (missed)")
        )
    print(
        "speed-up: eager / compiled on openreg and on the CPU (printed, not a goal: "
        "it is the eager ratio over the compiled one)"
    )
    threads = args.threads or "default"
    print(
        f"threads: {threads}; other processes used "
        f"{', '.join(f'{b:.0%}' for b in busy)} of the CPUs before each round"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "rounds": rounds,
        "steps": steps,
        "turns": turns,
        "threads": args.threads or "default",
        "busy_before_rounds": busy,
        "rows": rows,
        "per_turn": per_turn,
    }
    (args.out / "bench_compile.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, args.out / "bench_compile.png")
    print(f"wrote {args.out / 'bench_compile.json'} and {args.out / 'bench_compile.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
