"""What an OpenMP parallel region costs after its team idled, slept or ended.

The device's kernels run on an OpenMP team led by the stream's worker
(libgomp, the runtime torch's CPU wheel ships). Between two team regions
libgomp keeps the team's other threads spinning for ``GOMP_SPINCOUNT`` polls
(300,000 by default, milliseconds) and then lets them sleep; a team ended
with ``omp_pause_resource_all`` starts new threads at its next region. On a
2-core machine the spin takes the core the host's Python runs on, and the
alternatives cost each region a wake-up or a thread start. This script
measures those three costs on the main thread with a CPU ``x + x`` of
65,536 floats (one region of two threads), each variant in a fresh process:

- ``back to back``: the next region at once (the team spinning);
- ``after 5 ms``: after a 5 ms sleep (by default still spinning; with
  ``GOMP_SPINCOUNT=1000`` asleep);
- ``after pause``: after ``omp_pause_resource_all`` (new threads), with the
  pause's own time in its own column.

Each with libgomp's default spin and with ``GOMP_SPINCOUNT=1000``; medians of
200 regions. The figures belong to benchmarks/README.md's stop-56 section.

Usage: python benchmarks/omp_wake.py [--out DIR]
Writes DIR/omp_wake.json and DIR/omp_wake.png; about 10 seconds.
"""

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

STATES = ("back to back", "after 5 ms", "after pause")
ENVS = {"default spin": {}, "GOMP_SPINCOUNT=1000": {"GOMP_SPINCOUNT": "1000"}}
OMP_PAUSE_SOFT = 1  # omp_pause_resource_t in omp.h
REGIONS = 200


def libgomp() -> ctypes.CDLL:
    """The libgomp torch loaded (its wheel's copy), for omp_pause_resource_all."""
    path = Path(torch.__file__).parent / "lib" / "libgomp.so.1"
    lib = ctypes.CDLL(str(path) if path.exists() else "libgomp.so.1")
    lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
    lib.omp_pause_resource_all.restype = ctypes.c_int
    return lib


def measure() -> dict[str, float]:
    """Medians in microseconds, in this process."""
    torch.set_num_threads(2)
    x = torch.rand(65536)
    gomp = libgomp()
    for _ in range(50):
        x + x
    out = {}
    for state in STATES:
        regions, pauses = [], []
        for _ in range(REGIONS):
            if state == "after 5 ms":
                time.sleep(0.005)
            elif state == "after pause":
                t = time.perf_counter()
                if gomp.omp_pause_resource_all(OMP_PAUSE_SOFT) != 0:
                    raise RuntimeError("omp_pause_resource_all refused")
                pauses.append(time.perf_counter() - t)
            t = time.perf_counter()
            x + x
            regions.append(time.perf_counter() - t)
        out[state] = statistics.median(regions) * 1e6
        if pauses:
            out["pause itself"] = statistics.median(pauses) * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure()))
        return
    results = {}
    for name, env in ENVS.items():
        proc = subprocess.run(
            [sys.executable, __file__, "--measure"],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=300,
            check=True,
        )
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    columns = (*STATES, "pause itself")
    print(f"{'x + x, 65,536 floats (us)':28s}" + "".join(f"{c:>15s}" for c in columns))
    for name, row in results.items():
        print(f"{name:28s}" + "".join(f"{row[c]:15.1f}" for c in columns))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "omp_wake.json").write_text(
        json.dumps(
            {"torch_version": torch.__version__, "cpus": os.cpu_count(), "medians_us": results},
            indent=2,
        )
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.38
    for i, (name, row) in enumerate(results.items()):
        ax.bar(
            [k + i * width for k in range(len(columns))],
            [row[c] for c in columns],
            width,
            label=name,
        )
    ax.set_xticks([k + width / 2 for k in range(len(columns))], columns)
    ax.set_ylabel("us (median)")
    ax.set_title("a 2-thread OpenMP region of x + x (65,536 floats)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "omp_wake.png", dpi=100)
    print(f"wrote {out / 'omp_wake.json'} and {out / 'omp_wake.png'}")


if __name__ == "__main__":
    main()
