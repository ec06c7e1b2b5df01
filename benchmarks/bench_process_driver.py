"""openreg on the process driver (OPENREG_DRIVER=process) against the CPU.

The same cases, method and fresh processes as bench.py (see
benchmarks/README.md); only the openreg side's processes run each device in a
process of its own (issue 29). Printed beside them: the same cases on the
thread driver, measured in the same run, so the two drivers are compared
under the same machine conditions.

Usage: python benchmarks/bench_process_driver.py [--rounds N] [--quick] [--out DIR]
Writes DIR/bench_process_driver.json and .png (DIR: benchmarks/results).
"""

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import bench

# The process driver's goals (issue 29): case -> most openreg/CPU time.
GOALS = {
    "tiny op x+1 (64 floats)": 1.5,
    "dispatch-bound training step": 1.0,
    "MLP training step": 1.05,
    "1024x1024 matmul": 1.05,
}


def main() -> int:
    parser = argparse.ArgumentParser(description="process driver / CPU time ratios")
    parser.add_argument("--rounds", type=int, default=5, help="processes per side (5)")
    parser.add_argument("--quick", action="store_true", help="fewer blocks per process")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    start = time.perf_counter()
    tables = {}
    for driver in ("process", "thread"):
        bench.header(f"OPENREG_DRIVER={driver}: fresh process per side, {args.rounds} rounds")
        tables[driver] = [
            bench.compare_case(name, goal, True, args.rounds, args.quick, driver)
            for name, goal in GOALS.items()
        ]
    met = sum(r["passed"] for r in tables["process"])
    elapsed = time.perf_counter() - start
    print(f"\nprocess driver: {met}/{len(GOALS)} goals met ({elapsed:.0f} s)")
    print("(thread driver rows: the same goals, for comparison only)")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "method": "each (case, device, driver) in a fresh process; median of the rounds",
        "rounds": args.rounds,
        "quick": args.quick,
        "seconds": elapsed,
        "tables": tables,
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
