"""The device's pointwise kernels with and without an OpenMP team on the host's main thread.

libgomp lets its idle threads spin after a parallel region only while the
process has no more OpenMP threads than CPUs (``GOMP_SPINCOUNT`` in
libgomp's manual); past that they sleep almost at once, and each parallel
region wakes them again. openreg's stream worker leads an OpenMP team of
its own, so a main thread that ran one parallel region itself (a CPU op
on a few million elements) tips the process over on a machine with few
cores, and the device's team regions each pay a wake-up.

Each state runs in a fresh process, on openreg with the thread driver (the
default) only; the CPU is not the subject here:

- ``no host team``: the main thread never ran a parallel region;
- ``host team``: it ran one (``torch.ones(2**22).sum()``) before the device
  starts;
- ``host team released``: as above, then ``omp_pause_resource_all`` (an
  OpenMP 5.0 call, reached through ctypes) released it.

Reported: the best of 5 blocks of 100 calls per operator and size, and each
state's time over the first one's.

Usage: python benchmarks/host_omp_team.py [--out DIR]
Writes DIR/host_omp_team.json and DIR/host_omp_team.png.
"""

import argparse
import ctypes
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
STATES = ("no host team", "host team", "host team released")
SIZES = (65536, 262144, 524288)
OPS = {
    "x + x": lambda x: x + x,
    "exp": torch.exp,
    "gelu": F.gelu,
    "mul_": lambda x: x.mul_(1.0),
}
OMP_PAUSE_SOFT = 1  # omp_pause_resource_t


def release_host_team() -> None:
    """omp_pause_resource_all(omp_pause_soft) in the libgomp this process loaded."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libgomp" in line}
    if len(paths) != 1:
        raise RuntimeError(f"expected one libgomp in the process, found {sorted(paths)}")
    rc = ctypes.CDLL(paths.pop()).omp_pause_resource_all(OMP_PAUSE_SOFT)
    if rc != 0:
        raise RuntimeError(f"omp_pause_resource_all returned {rc}")


def measure(state: str) -> dict[str, float]:
    if state != STATES[0]:
        torch.ones(2**22).sum()  # a parallel region on the main thread
    if state == STATES[2]:
        release_host_team()
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


def plot(results: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(results[STATES[0]])
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(STATES)
    for k, state in enumerate(STATES):
        ratios = [results[state][c] / results[STATES[0]][c] for c in cases]
        ax.bar([i + k * width for i in range(len(cases))], ratios, width, label=state)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks([i + width for i in range(len(cases))], cases, rotation=60, ha="right")
    ax.set_ylabel(f"time / time with {STATES[0]!r}")
    ax.set_title("openreg pointwise kernels and the host's OpenMP team")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", choices=STATES, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return
    results = {}
    for state in STATES:
        out = subprocess.run(
            [sys.executable, __file__, "--measure", state],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        results[state] = json.loads(out.stdout.strip().splitlines()[-1])
    base = results[STATES[0]]
    print(f"{'call':18s}" + "".join(f"{s:>22s}" for s in STATES))
    for case in base:
        cells = "".join(
            f"{results[s][case] * 1e6:12.1f} us ({results[s][case] / base[case]:4.1f}x)"
            for s in STATES
        )
        print(f"{case:18s}{cells}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_omp_team.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out / "host_omp_team.png")
    print(f"wrote {args.out / 'host_omp_team.json'} and {args.out / 'host_omp_team.png'}")


if __name__ == "__main__":
    main()
