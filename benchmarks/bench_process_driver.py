"""Issue 62's goals with each driver: OPENREG_DRIVER=thread and =process.

The same cases as bench.py (see benchmarks/README.md). The per-operator and
dispatch-bound rows time the CPU and both drivers in paired blocks
(paired.py): each round starts a fresh process per side, and the three time
their blocks in turn, so that both drivers meet the same moments of the
machine. The host+device loop (openreg only: the loop's time over its host
and device parts timed apart, a fresh process per round and driver) and the
start-up (the first `torch.ones(1, device="openreg")` after `import torch`,
device synchronized, in a fresh process, absolute seconds). The process driver becomes the
default once it meets every goal the thread driver meets (issue 62); the
last lines say which goals keep them apart.

Usage: python benchmarks/bench_process_driver.py [--rounds N] [--quick] [--out DIR]
Writes DIR/bench_process_driver.json and .png (DIR: benchmarks/results).
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import bench

# case -> most openreg/CPU time (issue 62: "with each driver").
GOALS = {
    "tiny op x+1 (64 floats)": 0.65,
    "dispatch-bound training step": 0.65,
    "MLP with 2 dropouts fwd+bwd": 0.90,
    "MLP training step": 1.05,
    "transformer block training step": 1.05,
    "1024x1024 matmul": 1.05,
}
OVERLAP_GOAL = 0.80
STARTUP = "start-up: first tensor after import torch (s)"
STARTUP_GOAL = 0.3  # seconds

STARTUP_CODE = """
import time, torch
t = time.perf_counter()
torch.ones(1, device="openreg")
torch.openreg.synchronize()
print(time.perf_counter() - t)
"""


def startup_seconds(driver: str) -> float:
    env = dict(os.environ, OPENREG_DRIVER=driver)
    out = subprocess.run(
        [sys.executable, "-c", STARTUP_CODE],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def overlap_row(rounds: int, quick: bool, driver: str) -> dict:
    ov = [bench.run_fresh(bench.OVERLAP, "openreg", quick, driver) for _ in range(rounds)]
    ratios = [o["both_s"] / (o["host_s"] + o["device_s"]) for o in ov]
    return bench.row(
        bench.OVERLAP,
        bench.fmt_time(statistics.median(o["host_s"] + o["device_s"] for o in ov)),
        bench.fmt_time(statistics.median(o["both_s"] for o in ov)),
        statistics.median(ratios),
        min(ratios),
        max(ratios),
        OVERLAP_GOAL,
        True,
        runs=ov,
    )


def startup_row(rounds: int, driver: str) -> dict:
    runs = [startup_seconds(driver) for _ in range(rounds)]
    s = statistics.median(runs)
    # The "ratio" column of this row is seconds, against a goal in seconds.
    return bench.row(
        STARTUP, "-", f"{s:.3f} s", s, min(runs), max(runs), STARTUP_GOAL, True, runs=runs
    )


def main() -> int:
    parser = argparse.ArgumentParser(description="issue 62's goals with each driver")
    parser.add_argument("--rounds", type=int, default=5, help="processes per side (5)")
    parser.add_argument("--quick", action="store_true", help="fewer blocks per process")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    start = time.perf_counter()
    drivers = ("thread", "process")
    # The operator rows: the CPU and both drivers in paired blocks (paired.py),
    # so that both drivers meet the same moments of the machine.
    samples = {}
    for name in GOALS:
        print(f"timing {name}: the CPU and both drivers in turn", flush=True)
        samples[name] = bench.paired_seconds(name, args.rounds, args.quick, list(drivers))
    tables = {}
    for driver in drivers:
        bench.header(f"OPENREG_DRIVER={driver}: paired blocks, {args.rounds} rounds")
        rows = [
            bench.paired_row(name, goal, True, s["cpu"], s[driver], args.rounds)
            for (name, goal), s in zip(GOALS.items(), samples.values(), strict=True)
        ]
        rows.append(overlap_row(args.rounds, args.quick, driver))
        rows.append(startup_row(args.rounds, driver))
        tables[driver] = rows
    elapsed = time.perf_counter() - start
    print()
    for driver, rows in tables.items():
        print(f"OPENREG_DRIVER={driver}: {sum(r['passed'] for r in rows)}/{len(rows)} goals met")
    behind = [
        f"{p['name']}: process {p['ratio']:.2f}, thread {t['ratio']:.2f} (goal {t['goal']})"
        for t, p in zip(tables["thread"], tables["process"], strict=True)
        if t["passed"] and not p["passed"]
    ]
    print("goals the thread driver meets and the process driver misses:")
    print("\n".join(f"  {b}" for b in behind) if behind else "  none")
    print(f"({elapsed:.0f} s)")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "method": "paired blocks (cpu, thread, process); median of the turns' ratios",
        "rounds": args.rounds,
        "quick": args.quick,
        "seconds": elapsed,
        "tables": tables,
        "process_behind": behind,
    }
    (args.out / "bench_process_driver.json").write_text(json.dumps(result, indent=2) + "\n")
    bench.plot(
        {f"OPENREG_DRIVER={d}": rows for d, rows in tables.items()},
        args.out / "bench_process_driver.png",
    )
    print(f"wrote {args.out / 'bench_process_driver.json'} and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
