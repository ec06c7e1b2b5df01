"""The device's kernels when the host's main thread runs CPU parallel work.

libgomp lets its idle threads spin after a parallel region only while the
process has no more OpenMP threads than CPUs (``GOMP_SPINCOUNT`` in
libgomp's manual); past that they sleep almost at once, and each parallel
region wakes them again. openreg's stream worker leads an OpenMP team of
its own, so a main thread that keeps the team of one CPU parallel region (a
mean over a few hundred thousand floats will do) tips the process over on a
machine with few cores, and every team region of the device pays a wake-up.
Since stop 54 a launch of a kernel that may use a team releases the
launching thread's idle team first (``release_host_team`` in
csrc/aten/OpenRegLaunch.cpp); this script shows that it does, and what
training steps with CPU work on the host cost against the CPU.

Part 1, openreg with the thread driver (the default) only, each state in a
fresh process: the best of 5 blocks of 100 calls per operator and size,

- ``no host team``: the main thread never ran a parallel region;
- ``host team``: it ran one (``torch.ones(2**22).sum()``) before the device
  starts (before stop 54: 6-7x slower for 65,536 floats).

Part 2, an MLP training step (512-512-512-10, batch 128, AdamW,
``loss.item()`` every 10 steps) on each device, each (case, device) in a
fresh process, the devices alternating over 3 rounds; a ratio is the median
of the per-round ratios openreg / CPU:

- ``no CPU work``: the batches are on the device already;
- ``CPU work at setup``: as above, after dataset statistics computed on the
  CPU (the main thread keeps a team);
- ``CPU work per step``: each batch normalized on the CPU, then copied.

Usage: python benchmarks/host_omp_team.py [--out DIR]
Writes DIR/host_omp_team.json and DIR/host_omp_team.png; about 2 minutes.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
STATES = ("no host team", "host team")
SIZES = (65536, 262144, 524288)
OPS = {
    "x + x": lambda x: x + x,
    "exp": torch.exp,
    "gelu": F.gelu,
    "mul_": lambda x: x.mul_(1.0),
}
STEPS = ("no CPU work", "CPU work at setup", "CPU work per step")
ROUNDS = 3


def measure_calls(state: str) -> dict[str, float]:
    if state != STATES[0]:
        torch.ones(2**22).sum()  # a parallel region on the main thread
    device = torch.device("openreg", 0)
    times = {}
    for n in SIZES:
        x = torch.rand(n, device=device)
        for name, fn in OPS.items():
            for _ in range(50):
                fn(x)
            torch.openreg.synchronize(device)
            best = float("inf")
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(100):
                    fn(x)
                torch.openreg.synchronize(device)
                best = min(best, (time.perf_counter() - t) / 100)
            times[f"{name} @ {n}"] = best
    return times


def measure_step(case: str, device: str) -> float:
    """Seconds per training step, the best of 5 blocks of 30 steps."""
    torch.manual_seed(0)
    width, batch = 512, 128
    model = torch.nn.Sequential(
        torch.nn.Linear(512, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # Neither makes the main thread run a parallel region.
    raw = torch.normal(1.0, 3.0, size=(8, batch, 512))
    target = torch.randint(0, 10, (batch,)).to(device)
    if case == STEPS[0]:
        mean, std = torch.tensor(1.0), torch.tensor(3.0)
    else:
        mean, std = raw.mean(), raw.std()  # parallel regions on the main thread
    # Normalized where the device computes, so that the openreg side of
    # "no CPU work" runs no CPU parallel region on its main thread.
    dmean, dstd = mean.to(device), std.to(device)
    ready = [(raw[i].to(device) - dmean) / dstd for i in range(len(raw))]

    def step(i: int) -> None:
        if case == STEPS[2]:
            x = ((raw[i % len(raw)] - mean) / std).to(device)
        else:
            x = ready[i % len(raw)]
        loss = F.cross_entropy(model(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i % 10 == 0:
            loss.item()

    def sync() -> None:
        if device == "openreg":
            torch.openreg.synchronize()

    for i in range(30):
        step(i)
    sync()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for i in range(30):
            step(i)
        sync()
        best = min(best, (time.perf_counter() - t) / 30)
    return best


def run(*args: str) -> object:
    out = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, timeout=600, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    calls = results["calls"]
    cases = list(calls[STATES[0]])
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(STATES)
    for k, state in enumerate(STATES):
        ratios = [calls[state][c] / calls[STATES[0]][c] for c in cases]
        left.bar([i + k * width for i in range(len(cases))], ratios, width, label=state)
    left.axhline(1.0, color="gray", linewidth=0.8)
    left.set_xticks([i + width / 2 for i in range(len(cases))], cases, rotation=60, ha="right")
    left.set_ylabel(f"time / time with {STATES[0]!r}")
    left.set_title("openreg kernels and the host's OpenMP team")
    left.legend()
    steps = results["steps"]
    right.bar(range(len(STEPS)), [steps[c]["ratio"] for c in STEPS])
    right.axhline(1.0, color="gray", linewidth=0.8)
    right.set_xticks(range(len(STEPS)), STEPS, rotation=30, ha="right")
    right.set_ylabel("openreg / CPU")
    right.set_title("MLP training step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", choices=STATES, help=argparse.SUPPRESS)
    parser.add_argument("--step", choices=STEPS, help=argparse.SUPPRESS)
    parser.add_argument("--device", choices=("cpu", "openreg"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    if args.calls:
        print(json.dumps(measure_calls(args.calls)))
        return
    if args.step:
        print(json.dumps(measure_step(args.step, args.device)))
        return

    calls = {state: run("--calls", state) for state in STATES}
    base = calls[STATES[0]]
    print(f"{'call':18s}" + "".join(f"{s:>22s}" for s in STATES))
    for case in base:
        cells = "".join(
            f"{calls[s][case] * 1e6:12.1f} us ({calls[s][case] / base[case]:4.1f}x)" for s in STATES
        )
        print(f"{case:18s}{cells}")

    times = {case: {"cpu": [], "openreg": []} for case in STEPS}
    for _ in range(ROUNDS):
        for case in STEPS:
            for device in ("cpu", "openreg"):
                times[case][device].append(run("--step", case, "--device", device))
    steps = {}
    print(f"\n{'MLP training step':20s}{'CPU ms':>10s}{'openreg ms':>12s}  openreg / CPU")
    for case in STEPS:
        cpu, dev = times[case]["cpu"], times[case]["openreg"]
        ratios = [d / c for c, d in zip(cpu, dev, strict=True)]
        steps[case] = {"cpu_s": cpu, "openreg_s": dev, "ratio": statistics.median(ratios)}
        print(
            f"{case:20s}{statistics.median(cpu) * 1e3:10.2f}{statistics.median(dev) * 1e3:12.2f}"
            f"  {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]"
        )

    results = {"calls": calls, "steps": steps, "torch": torch.__version__}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_omp_team.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out / "host_omp_team.png")
    print(f"wrote {args.out / 'host_omp_team.json'} and {args.out / 'host_omp_team.png'}")


if __name__ == "__main__":
    main()
