"""The runtime's own costs under each driver: thread (default) and process.

Runs build/<type>-runtime/runtime/openreg_launch_bench (make bench-runtime
builds it) once per driver per round, each in a fresh process, rounds
alternating which driver goes first, and reports the median of the rounds:

- launch: a named kernel (a one-word fill) queued back to back, per launch;
- round trip: a launch and a stream synchronization each time (what a
  synchronous operator costs on top of its kernel);
- event: record, then query until done (what the caching allocator's reuse
  check costs);
- copies: 64 MB host to device and back, from pinned and pageable memory.

The ratio column is process / thread. There is no CPU column: these are
costs a CPU-only PyTorch does not have at all.

Usage: python benchmarks/bench_runtime.py [--rounds N] [--out DIR]
Writes DIR/bench_runtime.json and DIR/bench_runtime.png.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BINARY = ROOT / "build" / "release-runtime" / "runtime" / "openreg_launch_bench"
DRIVERS = ("thread", "process")
ROWS = [
    # key, label, unit, lower is better
    ("launch_us", "launch (queued)", "us", True),
    ("round_trip_us", "launch + synchronize", "us", True),
    ("event_us", "event record + query", "us", True),
    ("h2d_pinned_gbs", "64 MB H2D, pinned", "GB/s", False),
    ("d2h_pinned_gbs", "64 MB D2H, pinned", "GB/s", False),
    ("h2d_pageable_gbs", "64 MB H2D, pageable", "GB/s", False),
    ("d2h_pageable_gbs", "64 MB D2H, pageable", "GB/s", False),
]


def run_once(driver: str) -> dict:
    env = dict(os.environ, OPENREG_DRIVER=driver, OPENREG_DEVICE_MEMORY="1G")
    out = subprocess.run(
        [str(BINARY)], env=env, capture_output=True, text=True, timeout=300, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    if not BINARY.exists():
        sys.exit(f"{BINARY} is missing: run `make bench-runtime` (it builds it)")
    samples = {d: [] for d in DRIVERS}
    for r in range(args.rounds):
        order = DRIVERS if r % 2 == 0 else DRIVERS[::-1]
        for driver in order:
            samples[driver].append(run_once(driver))
    rows = []
    print(f"{'':24} {'thread':>12} {'process':>12} {'process/thread':>15}")
    for key, label, unit, _ in ROWS:
        med = {d: statistics.median(s[key] for s in samples[d]) for d in DRIVERS}
        ratio = med["process"] / med["thread"] if med["thread"] else float("nan")
        rows.append({"case": label, "unit": unit, **med, "process_over_thread": ratio})
        print(
            f"{label:24} {med['thread']:9.2f} {unit:>2} "
            f"{med['process']:9.2f} {unit:>2} {ratio:15.2f}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"rounds": args.rounds, "rows": rows, "samples": samples}
    (args.out / "bench_runtime.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, args.out / "bench_runtime.png")
    print(f"wrote {args.out / 'bench_runtime.json'} and {args.out / 'bench_runtime.png'}")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, unit in zip(axes, ("us", "GB/s"), strict=True):
        picked = [r for r in rows if r["unit"] == unit]
        xs = range(len(picked))
        ax.bar([x - 0.2 for x in xs], [r["thread"] for r in picked], 0.4, label="thread")
        ax.bar([x + 0.2 for x in xs], [r["process"] for r in picked], 0.4, label="process")
        ax.set_xticks(list(xs), [r["case"] for r in picked], rotation=20, ha="right")
        ax.set_ylabel(unit)
        ax.legend()
    axes[0].set_title("per operation (lower is better)")
    axes[1].set_title("bandwidth (higher is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
