"""torch.compile on openreg over OpInfo samples: compiled vs eager, both on openreg.

For each OpInfo and dtype, the first ``limit`` samples made on openreg run
eagerly and through ``torch.compile`` (Inductor, the openreg backend), each
on its own clone of the sample; the results must match
(``torch.testing.assert_close`` with ``RTOL``/``ATOL`` for floating results:
Inductor's C++ kernels use vectorized math functions and reassociate
reductions, so they are close to the eager CPU kernels, not bit-equal).
Eager openreg itself is compared with the CPU by ``harness.py``.

Skipped, with the reason: samples eager openreg rejects or cannot make (both
reported by ``harness.py``), ops that draw random numbers or return
uninitialized memory (``harness.skip_reason``).

Importable (``run_op``; ``tests/test_compile_opinfo.py`` runs a slice) and a
CLI for longer runs (``make compile-zoo``)::

    .venv/bin/python -m tests.opinfo.compiled --ops softmax,sum --limit 3
    .venv/bin/python -m tests.opinfo.compiled --eager-slice --limit 3 --report r.md
    .venv/bin/python -m tests.opinfo.compiled --limit 1   # every OpInfo (about 40 min on 2 cores)

The CLI keeps Inductor's code cache in a temporary directory unless
``TORCHINDUCTOR_CACHE_DIR`` is set.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

import torch

from . import harness

RTOL = {torch.float32: 1e-4, torch.float64: 1e-7}
ATOL = {torch.float32: 1e-5, torch.float64: 1e-7}

# The OpInfos `make test` compiles (float32; int64 too for INT64).
SLICE = [
    "abs",
    "exp",
    "sigmoid",
    "erf",
    "add",
    "mul",
    "div.floor_rounding",
    "pow",
    "atan2",
    "remainder",
    "maximum",
    "sum",
    "mean",
    "amax",
    "var",
    "argmax",
    "logsumexp",
    "addmm",
    "softmax",
    "log_softmax",
    "nn.functional.layer_norm",
    "nn.functional.gelu",
    "nn.functional.cross_entropy",
    "nn.functional.max_pool2d",
    "index_select",
    "gather",
    "scatter_add",
    "where",
    "clamp",
    "cat",
    "cumsum",
]
INT64 = {"add", "mul", "sum", "cumsum", "where", "clamp"}


@dataclass
class Result:
    name: str
    ran: int = 0
    passed: int = 0
    skips: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"{self.name}: {self.passed}/{self.ran} passed"
            f"{f', {len(self.skips)} skipped' if self.skips else ''}"
        )


def _clone(obj):
    return harness.tree_map(lambda t: t.clone(), obj)


def _compare(actual, expected, dtype):
    if isinstance(expected, torch.Tensor) and expected.is_floating_point():
        torch.testing.assert_close(
            actual.cpu(),
            expected.cpu(),
            rtol=RTOL.get(dtype),
            atol=ATOL.get(dtype),
            equal_nan=True,
        )
        return
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual.cpu(), expected.cpu(), equal_nan=True)
        return
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected), actual
        for a, e in zip(actual, expected, strict=True):
            _compare(a, e, dtype)
        return
    assert actual == expected, f"{actual!r} != {expected!r}"


def check_sample(op, sample, dtype) -> tuple[str, str]:
    """Compiled vs eager on one sample: ("pass", ""), ("fail", why) or ("skip", why)."""
    inp, args, kwargs = sample.input, sample.args, sample.kwargs
    try:
        expected = op(*_clone((inp, *args)), **_clone(kwargs))
        harness.synchronize()
    except Exception as exc:  # noqa: BLE001  (eager rejects the sample: not compared)
        return "skip", f"eager raises: {harness.first_line(exc)}"

    def fn(x, *a, **k):
        return op.op(x, *a, **k)

    torch._dynamo.reset()
    try:
        actual = torch.compile(fn)(*_clone((inp, *args)), **_clone(kwargs))
        harness.synchronize()
    except Exception as exc:  # noqa: BLE001
        return "fail", harness.first_line(exc)
    try:
        _compare(actual, expected, dtype)
    except AssertionError as exc:
        return "fail", harness.mismatch_text(exc)
    return "pass", ""


def run_op(op, dtypes=(torch.float32,), limit=2) -> Result:
    result = Result(harness.full_name(op))
    reason = harness.skip_reason(op)
    if reason:
        result.skips.append(reason)
        return result
    for dtype in dtypes:
        if dtype not in op.supported_dtypes("cpu"):
            continue
        torch.manual_seed(harness.SEED)
        samples = iter(op.sample_inputs(harness.DEVICE, dtype))
        for index in range(limit):
            try:
                sample = next(samples)
            except StopIteration:
                break
            except Exception as exc:  # noqa: BLE001  (harness.py reports these)
                result.skips.append(
                    f"{dtype}: making samples on openreg: {harness.first_line(exc)}"
                )
                break
            status, why = check_sample(op, sample, dtype)
            if status == "skip":
                result.skips.append(f"{dtype} sample {index}: {why}")
                continue
            result.ran += 1
            if status == "pass":
                result.passed += 1
            else:
                result.failures.append(f"{dtype} sample {index}: {why}")
    torch._dynamo.reset()
    return result


def dtypes_for(name):
    return (torch.float32, torch.int64) if name in INT64 else (torch.float32,)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated name substrings (default: all)")
    parser.add_argument("--slice", action="store_true", help="the ops of make test")
    parser.add_argument(
        "--eager-slice",
        action="store_true",
        help="the 70 ops of tests/test_opinfo_slice.py (make compile-zoo)",
    )
    parser.add_argument("--limit", type=int, default=3, help="samples per op and dtype")
    parser.add_argument("--dtypes", default="float32", help="e.g. float32,int64")
    parser.add_argument("--report", help="write a markdown report here")
    args = parser.parse_args(argv)
    torch.openreg.set_fallback_warnings(False)
    if args.slice:
        ops = harness.select_ops(SLICE, exact=True)
    elif args.eager_slice:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from test_opinfo_slice import FLOAT_OPS

        ops = harness.select_ops(FLOAT_OPS, exact=True)
    else:
        ops = harness.select_ops(args.ops.split(",") if args.ops else None)
    dtypes = harness.parse_dtypes(args.dtypes)
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    start = time.time()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or tmp
        with temporary_cache_dir(cache):
            for op in ops:
                t = time.time()
                r = run_op(op, dtypes, args.limit)
                results.append(r)
                print(f"{r.line()}  ({time.time() - t:.1f}s)", flush=True)
                for f in r.failures:
                    print(f"    FAIL {f}", flush=True)
    ran = sum(r.ran for r in results)
    passed = sum(r.passed for r in results)
    print(
        f"{passed} passed, {ran - passed} failed  ({len(results)} ops, {time.time() - start:.0f}s)"
    )
    if args.report:
        with open(args.report, "w") as f:
            f.write("# torch.compile on openreg: OpInfo samples, compiled vs eager\n\n")
            f.write(f"`{' '.join(sys.argv)}`: {passed}/{ran} samples passed\n\n")
            for r in results:
                f.write(f"- {r.line()}\n")
                for x in r.failures:
                    f.write(f"  - FAIL {x}\n")
                for x in r.skips:
                    f.write(f"  - skip {x}\n")
    return 0 if passed == ran else 1


if __name__ == "__main__":
    sys.exit(main())
