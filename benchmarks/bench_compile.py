"""torch.compile on openreg vs torch.compile on the CPU, and vs eager openreg.

Three training steps (forward, backward, SGD step; the model compiled with
``torch.compile``, the optimizer eager):

- MLP: 512-1024-1024-10, batch 256;
- CNN: two 3x3 convolutions with BatchNorm and ReLU, max pooling, a linear
  classifier, batch 32 of 3x32x32;
- transformer block: pre-norm, 4-head causal scaled dot product attention,
  GELU MLP, width 256, batch 8 of 128 tokens.

Each (case, side) runs in a fresh process: ``compiled-cpu``,
``compiled-openreg`` and ``eager-openreg``; the sides alternate over
``--rounds`` rounds and share one Inductor code cache (a temporary
directory), so only the first round compiles from scratch. Compilation and
warm-up steps are not timed: a worker times each step (``time.perf_counter``,
openreg synchronized at the end of the step) and reports the median. The
ratio is the median of the rounds' ratios (each round runs the sides seconds
apart, while the VM's speed drifts over minutes), with their range; the
times shown are the medians over the rounds.

Reported: compiled openreg / compiled CPU time (goal <= 1.05: the device
layer adds launch and stream costs to the same generated kernels) and the
speed-up of compiling on openreg (eager openreg / compiled openreg time).

The workers use PyTorch's default thread count unless ``--threads N``
(``OMP_NUM_THREADS=N`` for every worker). On a loaded 2-core machine,
multi-threaded kernels on the host thread suffer from oversubscription more
than the same kernels on openreg's stream worker, which skews the ratio;
``--threads 1`` compares the device layer alone.

Usage: python benchmarks/bench_compile.py [--quick] [--rounds N] [--threads N] [--out DIR]
Writes DIR/bench_compile.json and DIR/bench_compile.png.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = ("mlp", "cnn", "transformer")
SIDES = ("compiled-cpu", "compiled-openreg", "eager-openreg")
GOAL = 1.05


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


def worker(case: str, side: str, steps: int) -> dict:
    """One (case, side) in this process: compile, warm up, time `steps` steps."""
    import torch

    torch.manual_seed(0)
    model, x, y, loss_fn = _model(case)
    device = torch.device("cpu" if side == "compiled-cpu" else "openreg")
    model, x, y = model.to(device), x.to(device), y.to(device)
    run = model if side == "eager-openreg" else torch.compile(model)
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
    times = []
    for _ in range(steps):
        sync()
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)
    return {"median_s": statistics.median(times), "times": times, "warmup_s": warmup_s}


def run_worker(case: str, side: str, steps: int, cache: str, threads: int | None) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, OPENREG_FALLBACK_WARNINGS="0")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", case, side, "--steps", str(steps)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{case} {side} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 2.8))
    names = [r["case"] for r in rows]
    ratios = [r["ratio"] for r in rows]
    ax1.barh(names, ratios, color=["tab:green" if r["meets_goal"] else "tab:red" for r in rows])
    ax1.axvline(GOAL, color="k", ls="--")
    for i, r in enumerate(ratios):
        ax1.text(r, i, f" {r:.2f}", va="center")
    ax1.set_xlabel(f"compiled openreg / compiled CPU (goal <= {GOAL})")
    speedups = [r["speedup"] for r in rows]
    ax2.barh(names, speedups, color="tab:blue")
    ax2.axvline(1.0, color="k", ls=":")
    for i, s in enumerate(speedups):
        ax2.text(s, i, f" {s:.2f}x", va="center")
    ax2.set_xlabel("speed-up: eager / compiled openreg")
    fig.suptitle("torch.compile training steps")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, one round")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the workers")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--worker", nargs=2, metavar=("CASE", "SIDE"), help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    steps = args.steps or (5 if args.quick else 30)
    if args.worker:
        print(json.dumps(worker(*args.worker, steps)))
        return 0
    rounds = args.rounds or (1 if args.quick else 5)
    cases = args.cases.split(",")
    per_round = {c: {s: [] for s in SIDES} for c in cases}
    with tempfile.TemporaryDirectory() as cache:
        for _ in range(rounds):
            for case in cases:
                for side in SIDES:
                    per_round[case][side].append(run_worker(case, side, steps, cache, args.threads))
    rows = []
    for case in cases:
        med = {s: statistics.median(r["median_s"] for r in per_round[case][s]) for s in SIDES}
        # Each round runs the three sides one after the other, so the ratio
        # of a round compares figures taken seconds apart; the VM's speed
        # drifts over minutes, so the ratio is the median of the rounds'
        # ratios (a paired estimate), with their range.
        round_ratios = [
            o["median_s"] / c["median_s"]
            for c, o in zip(
                per_round[case]["compiled-cpu"], per_round[case]["compiled-openreg"], strict=True
            )
        ]
        ratio = statistics.median(round_ratios)
        rows.append(
            {
                "case": f"{case} training step",
                **{side: med[side] for side in SIDES},
                "ratio": ratio,
                "ratio_range": [min(round_ratios), max(round_ratios)],
                "goal": GOAL,
                "meets_goal": ratio <= GOAL,
                "speedup": med["eager-openreg"] / med["compiled-openreg"],
            }
        )
    header = f"{'case':28} {'compiled cpu':>13} {'compiled openreg':>17} {'eager openreg':>14}"
    print(f"{header} {'ratio':>7} {'goal':>7} {'speed-up':>9} [ratio range]")
    for r in rows:
        cells = " ".join(
            f"{r[s] * 1e3:{w}.2f} ms" for s, w in zip(SIDES, (10, 14, 11), strict=True)
        )
        print(
            f"{r['case']:28} {cells} {r['ratio']:7.3f} {'<= ' + str(GOAL):>7} {r['speedup']:8.2f}x"
            f" [{r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}]"
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
        "threads": args.threads or "default",
        "rows": rows,
        "per_round": per_round,
    }
    (args.out / "bench_compile.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, args.out / "bench_compile.png")
    print(f"wrote {args.out / 'bench_compile.json'} and {args.out / 'bench_compile.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
