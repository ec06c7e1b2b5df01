"""What one queued operator call costs the device's worker, apart from the host.

A diagnostic, not part of ``make bench``. The host times an operator in a
loop as host and worker run together (bench.py's tiny op), which shows the
slower of the two. This isolates the worker: stream B waits for an event
behind a long one-thread matrix product on stream A, the host queues
``--calls`` calls of the operator on B between two timing events meanwhile,
and once A is done, B drains its backlog; the events' elapsed time over the
number of calls is what one call costs the worker (decoding it, building
the CPU views, running the CPU kernel). ``torch.set_num_threads(1)`` keeps
the product on one core, the host on the other.

Cases: ``x + 1`` on 64 floats (a Python number: wrapped-number tensor),
``x + y`` on 64 floats, ``x * 0.5`` on 4096 floats. Each case runs
``--blocks`` drains after warm-up, in a fresh process per case; the table
shows the median and the fastest drain (the cost without interference: on
two cores, an idle worker's spin or the host's wait share them).

Usage: python benchmarks/worker_cost.py [--blocks N] [--calls N] [--out DIR]
Writes DIR/worker_cost.json and DIR/worker_cost.png.
"""

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

CASES = {
    "x + 1 (64 floats)": ("x + 1", 64),
    "x + y (64 floats)": ("x + y", 64),
    "x * 0.5 (4096 floats)": ("x * 0.5", 4096),
}


def worker(case: str, blocks: int, calls: int) -> dict:
    import torch

    import torch_openreg  # noqa: F401

    torch.set_num_threads(1)
    expr, n = CASES[case]
    dev = torch.device("openreg")
    x, y = torch.randn(n, device=dev), torch.randn(n, device=dev)
    fn = eval("lambda x, y: " + expr)
    a = torch.randn(1200, 1200, device=dev)
    A, B = torch.openreg.Stream(), torch.openreg.Stream()

    def drain() -> float:
        with torch.openreg.stream(A):
            a @ a
            behind = torch.openreg.Event()
            behind.record(A)
        with torch.openreg.stream(B):
            B.wait_event(behind)
            start = torch.openreg.Event(enable_timing=True)
            end = torch.openreg.Event(enable_timing=True)
            start.record(B)
            for _ in range(calls):
                fn(x, y)
            end.record(B)
        B.synchronize()
        return start.elapsed_time(end) * 1e-3 / calls  # seconds a call

    for _ in range(3):
        drain()
    times = [drain() for _ in range(blocks)]
    return {"median_s": statistics.median(times), "min_s": min(times), "times": times}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    xs = range(len(rows))
    ax.bar([i - 0.2 for i in xs], [r["median_s"] * 1e6 for r in rows], 0.4, label="median")
    ax.bar([i + 0.2 for i in xs], [r["min_s"] * 1e6 for r in rows], 0.4, label="fastest")
    ax.set_xticks(list(xs), [r["case"] for r in rows])
    ax.set_ylabel("worker us per queued call")
    ax.set_title("The device's worker, per call (host apart)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--calls", type=int, default=800, help="below the queue's 1024")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.blocks, args.calls)))
        return 0
    rows = []
    for case in CASES:
        cmd = [sys.executable, __file__, "--worker", case]
        cmd += ["--blocks", str(args.blocks), "--calls", str(args.calls)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"{case} failed:\n{out.stderr[-3000:]}")
        rows.append({"case": case, **json.loads(out.stdout.strip().splitlines()[-1])})
    print(f"{'case':24} {'median us':>10} {'fastest us':>11}")
    for r in rows:
        print(f"{r['case']:24} {r['median_s'] * 1e6:10.2f} {r['min_s'] * 1e6:11.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": platform.platform(),
        "torch": torch.__version__,
        "blocks": args.blocks,
        "calls": args.calls,
        "rows": rows,
    }
    (args.out / "worker_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, args.out / "worker_cost.png")
    print(f"wrote {args.out / 'worker_cost.json'} and {args.out / 'worker_cost.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
