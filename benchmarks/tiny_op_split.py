"""The tiny op (``x + 1``, 64 floats) split: the part both devices share, the backend's.

A diagnostic, not part of ``make bench``. A call of ``x + 1`` from Python is
the interpreter, the argument parser (which wraps the ``1`` in a tensor),
autograd's VariableType kernel, then the backend's kernel below autograd,
and the result's release. All but the backend's kernel is the same code on
both devices. Each process times, in alternating blocks of 800 calls:

- ``python``: ``x + 1`` from Python, host time per call;
- ``below``: ``add.Tensor`` redispatched to the backend's key from a C++
  loop (the same wrapped number, the result released each call): the CPU
  kernel on the CPU; openreg's fallback (plan, encoding, result
  allocation, launch) on openreg.

On openreg both are host times: stream B waits behind a long one-thread
matrix product on stream A while the calls are queued on B, so the worker
runs none of them meanwhile.

The shared part is ``python - below`` in the same process. This VM's speed
differs by up to 1.5x from one process to the next, so the script compares
devices through ratios taken inside a process: b = below / shared. The
tiny op's ratio openreg / CPU is then (1 + b_openreg) / (1 + b_cpu), and a
goal r needs b_openreg <= r (1 + b_cpu) - 1.

The C++ loop is compiled with torch.utils.cpp_extension.load_inline into a
temporary directory, once per run (about a minute on 2 cores).

Usage: python benchmarks/tiny_op_split.py [--processes N] [--blocks N] [--goal R] [--out DIR]
Writes DIR/tiny_op_split.json and DIR/tiny_op_split.png.
"""

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CALLS = 800  # below the queue's 1024: the host never waits for the worker

CPP = r"""
#include <torch/extension.h>
#include <ATen/ops/add_ops.h>
#include <chrono>

// Seconds a call of add.Tensor(x, 1) below autograd on the backend's key.
double below_autograd(const at::Tensor& x, int64_t calls) {
  at::Tensor one = at::scalar_tensor(1, at::kLong);
  one.unsafeGetTensorImpl()->set_wrapped_number(true);
  const c10::DispatchKeySet keys(x.is_cpu() ? c10::DispatchKey::CPU
                                            : c10::DispatchKey::PrivateUse1);
  const at::AutoDispatchBelowADInplaceOrView below;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) {
    at::Tensor r = at::_ops::add_Tensor::redispatch(keys, x, one, 1);
  }
  const std::chrono::duration<double> took =
      std::chrono::steady_clock::now() - start;
  return took.count() / static_cast<double>(calls);
}
"""


def worker(device: str, blocks: int, build_dir: str) -> dict:
    import time

    import torch
    from torch.utils.cpp_extension import load_inline

    torch.set_num_threads(1)
    ext = load_inline(
        "tiny_op_split", cpp_sources=CPP, functions=["below_autograd"], build_directory=build_dir
    )

    def python_calls(x):
        start = time.perf_counter()
        for _ in range(CALLS):
            x + 1
        return (time.perf_counter() - start) / CALLS

    parts = {"python": python_calls, "below": lambda x: ext.below_autograd(x, CALLS)}
    if device == "cpu":
        x = torch.randn(64)

        def block(part):
            return parts[part](x)

    else:
        import torch_openreg  # noqa: F401

        x = torch.randn(64, device=device)
        a = torch.randn(1500, 1500, device=device)
        A, B = torch.openreg.Stream(), torch.openreg.Stream()

        def block(part):
            with torch.openreg.stream(A):
                a @ a
                behind = torch.openreg.Event()
                behind.record(A)
            with torch.openreg.stream(B):
                B.wait_event(behind)
                seconds = parts[part](x)
            B.synchronize()
            return seconds

    times = {"python": [], "below": []}
    for i in range(blocks + 3):
        for part in times:
            t = block(part)
            if i >= 3:  # warm-up
                times[part].append(t)
    python = statistics.median(times["python"])
    below = statistics.median(times["below"])
    return {"python_s": python, "below_s": below, "b": below / (python - below), "times": times}


def plot(rows: list[dict], summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    for k, device in enumerate(("cpu", "openreg")):
        mine = [r for r in rows if r["device"] == device]
        xs = [k + 0.1 * (i - len(mine) / 2) for i in range(len(mine))]
        ax.scatter(xs, [r["b"] for r in mine], label=device)
    ax.axhline(summary["b_needed"], color="k", ls="--", label=f"openreg at goal {summary['goal']}")
    ax.set_xticks([0, 1], ["cpu", "openreg"])
    ax.set_ylabel("below autograd / shared part")
    ax.set_title("x + 1 on 64 floats: the backend's part, per process")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3, help="fresh processes per device")
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--goal", type=float, default=0.65, help="bench.py's tiny-op goal")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        device, build_dir = args.worker
        print(json.dumps(worker(device, args.blocks, build_dir)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as build_dir:
        for _ in range(args.processes):
            for device in ("cpu", "openreg"):
                cmd = [sys.executable, __file__, "--worker", device, build_dir]
                cmd += ["--blocks", str(args.blocks)]
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                if out.returncode != 0:
                    raise RuntimeError(f"{device} failed:\n{out.stderr[-3000:]}")
                rows.append({"device": device, **json.loads(out.stdout.strip().splitlines()[-1])})
    print(f"{'device':8} {'python us':>10} {'below us':>9} {'shared us':>10} {'b':>6}")
    for r in rows:
        python, below = r["python_s"] * 1e6, r["below_s"] * 1e6
        print(f"{r['device']:8} {python:10.2f} {below:9.2f} {python - below:10.2f} {r['b']:6.2f}")
    b = {d: statistics.median(r["b"] for r in rows if r["device"] == d) for d in ("cpu", "openreg")}
    summary = {
        "b_cpu": b["cpu"],
        "b_openreg": b["openreg"],
        "ratio": (1 + b["openreg"]) / (1 + b["cpu"]),
        "goal": args.goal,
        "b_needed": args.goal * (1 + b["cpu"]) - 1,
    }
    print(
        f"median b: cpu {b['cpu']:.2f}, openreg {b['openreg']:.2f}; the tiny op's host ratio "
        f"(1 + b_openreg) / (1 + b_cpu) = {summary['ratio']:.2f}\n"
        f"goal {args.goal}: b_openreg <= {summary['b_needed']:.2f}, "
        f"openreg's part below autograd at {summary['b_needed'] / b['openreg']:.2f} of its cost now"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": platform.platform(),
        "torch": torch.__version__,
        "processes": args.processes,
        "blocks": args.blocks,
        "calls": CALLS,
        "rows": rows,
        "summary": summary,
    }
    (args.out / "tiny_op_split.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, summary, args.out / "tiny_op_split.png")
    print(f"wrote {args.out / 'tiny_op_split.json'} and {args.out / 'tiny_op_split.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
