"""Whether a two-thread matrix product and the host's Python overlap here.

openreg's device runs the kernels on an OpenMP team of both cores while the
host's Python dispatches the next ones; bench_loops.py's bound assumes the
device's kernels use whatever the host leaves of the cores. This diagnostic
asks that of the machine alone, without openreg: one process runs a loop of
CPU ``a @ b`` (512 x 1024 x 1024 float32, torch's two threads) and another a
pure-Python loop, timed each alone (D and P) and then both started together
(W). On two cores, if the product used any free core, W would be D + P/2;
if the two did not overlap at all, D + P. The table gives the share of P/2
hidden, (D + P - W) / (P/2), median over the repeats, and W against the
default spin's W (a setting that hides more may still take longer, its
products alone being slower), for libgomp's default
spin (its threads spin about a millisecond at a barrier or after a region),
``OMP_WAIT_POLICY=PASSIVE`` and ``GOMP_SPINCOUNT=100`` (the short spin that
openreg's team takes in a host-bound loop, `doc:team-spin`). The figures
belong to benchmarks/README.md's stop-80 section.

Usage: python benchmarks/gemm_overlap.py [--repeats N] [--out DIR]
Writes DIR/gemm_overlap.json and DIR/gemm_overlap.png; about 2 minutes.
"""

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

SHAPE = (512, 1024, 1024)
PRODUCTS = 200
PY_ITERATIONS = 3_000_000
ENVS = {
    "default spin": {},
    "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "GOMP_SPINCOUNT=100": {"GOMP_SPINCOUNT": "100"},
}


def products(env: dict, ready, go, out) -> None:
    # Set before torch loads libgomp, which reads them once.
    os.environ.update(env)
    import torch

    m, k, n = SHAPE
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(20):
        a @ b
    ready.set()
    go.wait()
    t0 = time.perf_counter()
    for _ in range(PRODUCTS):
        a @ b
    out.put(("products", time.perf_counter() - t0))


def python_loop(env: dict, ready, go, out) -> None:
    ready.set()
    go.wait()
    t0 = time.perf_counter()
    s = 0
    for i in range(PY_ITERATIONS):
        s += i * i % 7
    out.put(("python", time.perf_counter() - t0))


def timed(which: list, env: dict) -> float:
    """Wall seconds from the start signal until every process in `which`
    has finished its loop (each process started fresh and warmed up)."""
    ctx = mp.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()
    procs, readies = [], []
    for target in which:
        ready = ctx.Event()
        readies.append(ready)
        procs.append(ctx.Process(target=target, args=(env, ready, go, out)))
    for p in procs:
        p.start()
    for ready in readies:
        ready.wait(timeout=120)
    t0 = time.perf_counter()
    go.set()
    for _ in procs:
        out.get(timeout=300)
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(timeout=60)
    return wall


def measure(env: dict, repeats: int) -> dict:
    rows = []
    for _ in range(repeats):
        d = timed([products], env)
        p = timed([python_loop], env)
        w = timed([products, python_loop], env)
        rows.append({"D": d, "P": p, "W": w, "hidden": (d + p - w) / (p / 2)})
    return {"repeats": rows, "hidden": statistics.median(r["hidden"] for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    results = {}
    print(
        f"{'setting':24} {'D s':>6} {'P s':>6} {'W s':>6} {'W / default W':>13} "
        f"{'hidden of P/2':>14}"
    )
    first_w = None
    for name, env in ENVS.items():
        r = measure(env, args.repeats)
        results[name] = r
        med = {k: statistics.median(x[k] for x in r["repeats"]) for k in ("D", "P", "W")}
        spread = [x["hidden"] for x in r["repeats"]]
        first_w = first_w or med["W"]
        r["W_over_default_W"] = med["W"] / first_w
        print(
            f"{name:24} {med['D']:6.3f} {med['P']:6.3f} {med['W']:6.3f} "
            f"{med['W'] / first_w:13.2f} "
            f"{r['hidden']:6.2f} [{min(spread):.2f}, {max(spread):.2f}]"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gemm_overlap.json").write_text(
        json.dumps(
            {
                "shape": SHAPE,
                "products": PRODUCTS,
                "python_iterations": PY_ITERATIONS,
                "method": "D, P alone, W together, each a fresh process per loop; "
                "hidden = (D + P - W) / (P / 2), 1 = the bound, 0 = no overlap",
                "results": results,
            },
            indent=2,
        )
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(results)
    for i, name in enumerate(names):
        ys = [x["hidden"] for x in results[name]["repeats"]]
        ax.scatter([i] * len(ys), ys, color="tab:blue", alpha=0.6)
        ax.hlines(results[name]["hidden"], i - 0.25, i + 0.25, color="black")
    ax.axhline(1.0, color="tab:red", linewidth=0.8, label="the bound (D + P/2)")
    ax.axhline(0.0, color="gray", linewidth=0.8, label="no overlap (D + P)")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("share of P/2 hidden")
    ax.set_title("2-thread matmul loop beside a Python loop, 2 cores")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "gemm_overlap.png", dpi=100)
    print(f"wrote {args.out / 'gemm_overlap.json'} and {args.out / 'gemm_overlap.png'}")


if __name__ == "__main__":
    main()
