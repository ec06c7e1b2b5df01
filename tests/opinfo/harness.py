"""Differential OpInfo harness: every OpInfo sample on the CPU and on openreg.

For each OpInfo in PyTorch's ``op_db``, each CPU-supported dtype and each
sample from ``op.sample_inputs("cpu", dtype)``, the op runs on the CPU and on
openreg copies of the same inputs; the openreg result (moved back to the CPU)
must match the CPU result (``torch.testing.assert_close`` with the default
tolerances for the dtype, ``equal_nan=True``). With ``--grad`` the gradients
of the sum of the floating outputs w.r.t. the floating inputs are compared
too (float32/float64, ops with ``supports_autograd``).

Importable (``run_op``, ``select_ops``, ...; used by ``tests/test_opinfo_slice.py``)
and a CLI::

    .venv/bin/python -m tests.opinfo.harness --dtypes float32 --report r.md
    .venv/bin/python tests/opinfo/harness.py --ops softmax,conv --grad

The CLI runs the ops in a worker subprocess, so an op that kills or hangs the
interpreter is recorded as a failure and the run continues with the next op.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import types
import unittest
import warnings
from dataclasses import dataclass, field

# torch.testing._internal.common_utils imports expecttest (a PyTorch test-only
# dependency) for its TestCase base class; the harness needs none of it.
if "expecttest" not in sys.modules:
    try:
        import expecttest  # noqa: F401
    except ImportError:
        _stub = types.ModuleType("expecttest")
        _stub.TestCase = unittest.TestCase
        _stub.ACCEPT = False
        sys.modules["expecttest"] = _stub

import torch  # noqa: E402

import torch_openreg  # noqa: E402, F401

DEVICE = "openreg"

# OpInfo names containing one of these draw random numbers: the CPU and the
# openreg generators differ, so values cannot be compared.
RANDOM_KEYWORDS = (
    "rand",
    "normal",
    "bernoulli",
    "dropout",
    "multinomial",
    "uniform",
    "exponential",
    "geometric",
    "cauchy",
    "log_normal",
    "poisson",
    "rrelu",
    "fractional_max_pool",
    "lowrank",
)
# Results are uninitialised memory: never comparable.
UNINITIALIZED_OPS = (
    "empty",
    "empty_like",
    "new_empty",
    "new_empty_strided",
    "empty_strided",
    "empty_permuted",
)

# An op whose single sample (CPU + openreg) takes longer than this is cut short.
SLOW_SAMPLE_S = 10.0

# An op still running after this many seconds has the rest of its samples skipped.
OP_BUDGET_S = 60.0

GRAD_DTYPES = (torch.float32, torch.float64)


# ---------------------------------------------------------------------------
# Results


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    def add(self, other: Counts) -> None:
        self.passed += other.passed
        self.failed += other.failed
        self.skipped += other.skipped

    @property
    def ran(self) -> int:
        """Samples that ran on the CPU (and therefore were compared)."""
        return self.passed + self.failed


@dataclass
class OpResult:
    name: str
    forward: Counts = field(default_factory=Counts)
    grad: Counts = field(default_factory=Counts)
    # (mode, dtype, sample index, message)
    failures: list = field(default_factory=list)
    # reason -> number of samples (or op-level reasons with count 0)
    skips: dict = field(default_factory=dict)
    seconds: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def skip(self, counts: Counts, reason: str, n: int = 1) -> None:
        counts.skipped += n
        self.skips[reason] = self.skips.get(reason, 0) + n

    def fail(self, counts: Counts, mode: str, dtype, index: int, message: str) -> None:
        counts.failed += 1
        self.failures.append((mode, str(dtype).replace("torch.", ""), index, message))

    @property
    def total(self) -> Counts:
        c = Counts()
        c.add(self.forward)
        c.add(self.grad)
        return c

    def line(self) -> str:
        c = self.total
        text = f"{self.name}: {c.passed} passed, {c.failed} failed, {c.skipped} skipped"
        if self.failures:
            mode, dtype, index, message = self.failures[0]
            text += f"  [first failure: {mode} {dtype} sample {index}: {message}]"
        return text

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "forward": vars(self.forward),
            "grad": vars(self.grad),
            "failures": [list(f) for f in self.failures],
            "skips": self.skips,
            "seconds": round(self.seconds, 3),
        }

    @classmethod
    def from_json(cls, data: dict) -> OpResult:
        r = cls(data["name"], Counts(**data["forward"]), Counts(**data["grad"]))
        r.failures = [tuple(f) for f in data["failures"]]
        r.skips = dict(data["skips"])
        r.seconds = data.get("seconds", 0.0)
        return r


# ---------------------------------------------------------------------------
# Helpers


def op_db():
    from torch.testing._internal.common_methods_invocations import op_db as db

    return db


def full_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def select_ops(names=None, exact=False):
    """OpInfos whose full name contains (or, with exact, equals) one of names."""
    ops = op_db()
    if not names:
        return list(ops)
    if exact:
        wanted = set(names)
        return [op for op in ops if full_name(op) in wanted]
    return [op for op in ops if any(n in full_name(op) for n in names)]


def parse_dtypes(text):
    if not text:
        return None
    out = []
    for name in text.split(","):
        dtype = getattr(torch, name.strip(), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {name!r}")
        out.append(dtype)
    return out


def skip_reason(op):
    """Why the whole op is not compared, or None."""
    name = full_name(op)
    if any(k in name for k in RANDOM_KEYWORDS):
        return "nondeterministic"
    if op.name in UNINITIALIZED_OPS:
        return "uninitialized output"
    return None


def tree_map(fn, obj):
    """fn applied to every tensor inside nested tuples/lists/dicts/namedtuples."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(tree_map(fn, o) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(tree_map(fn, o) for o in obj)
    if isinstance(obj, dict):
        return {k: tree_map(fn, v) for k, v in obj.items()}
    return obj


def tensors_in(obj):
    found = []
    tree_map(found.append, obj)
    return found


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def mismatch_text(exc: AssertionError) -> str:
    """assert_close's headline plus its mismatch statistics, on one line."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return "mismatch: " + "; ".join(lines[:4])[:400]


def synchronize():
    torch.openreg.synchronize()


def compare(actual, expected, path="result"):
    """Raises AssertionError when the openreg result differs from the CPU result."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise AssertionError(f"{path}: expected a tensor, got {type(actual).__name__}")
        torch.testing.assert_close(
            actual.cpu(), expected, equal_nan=True, check_device=False, msg=None
        )
        return
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            raise AssertionError(f"{path}: expected a sequence of {len(expected)}, got {actual!r}")
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            compare(a, e, f"{path}[{i}]")
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            raise AssertionError(f"{path}: dict keys differ")
        for k in expected:
            compare(actual[k], expected[k], f"{path}[{k!r}]")
        return
    if isinstance(expected, float) and isinstance(actual, float):
        if math.isnan(expected) and math.isnan(actual):
            return
    if actual != expected:
        raise AssertionError(f"{path}: {actual!r} != {expected!r}")


def _call(op, sample_input, args, kwargs):
    return op(sample_input, *args, **kwargs)


# ---------------------------------------------------------------------------
# Forward


def check_forward(op, sample):
    """One sample. Returns ("pass"|"skip"|"fail", message)."""
    # Device copies first: the CPU call may modify its inputs in place.
    try:
        dev = tree_map(lambda t: t.to(DEVICE), (sample.input, sample.args, sample.kwargs))
        dev_error = None
    except Exception as exc:  # noqa: BLE001
        dev, dev_error = None, exc
    try:
        expected = _call(op, sample.input, sample.args, sample.kwargs)
    except Exception:  # noqa: BLE001
        return "skip", "cpu raises"
    if dev_error is not None:
        return "fail", f"moving inputs to openreg: {first_line(dev_error)}"
    try:
        actual = _call(op, *dev)
        synchronize()
    except Exception as exc:  # noqa: BLE001
        _drain()
        return "fail", first_line(exc)
    try:
        compare(actual, expected)
    except AssertionError as exc:
        return "fail", mismatch_text(exc)
    except Exception as exc:  # noqa: BLE001
        _drain()
        return "fail", f"comparing: {first_line(exc)}"
    return "pass", ""


def _drain():
    """A kernel error left pending must not be blamed on the next sample."""
    for _ in range(3):
        try:
            synchronize()
            return
        except Exception:  # noqa: BLE001, S112
            continue


# ---------------------------------------------------------------------------
# Gradients


def _leaf_copy(t, device):
    if not isinstance(t, torch.Tensor):
        return t
    copy = t.detach().to(device) if device != "cpu" else t.detach().clone()
    if t.requires_grad:
        copy.requires_grad_(True)
    return copy


def _grad_once(op, sample, device):
    inputs = tree_map(lambda t: _leaf_copy(t, device), (sample.input, sample.args, sample.kwargs))
    wrt = [t for t in tensors_in(inputs) if t.requires_grad and t.is_floating_point()]
    out = _call(op, *inputs)
    out = sample.output_process_fn_grad(out)
    outs = [t for t in tensors_in(out) if t.is_floating_point() and t.requires_grad and t.grad_fn]
    if not wrt or not outs:
        return None
    total = sum(o.sum() for o in outs)
    grads = torch.autograd.grad(total, wrt, allow_unused=True)
    return [g.detach() if g is not None else None for g in grads]


def check_grad(op, sample):
    try:
        expected = _grad_once(op, sample, "cpu")
    except Exception:  # noqa: BLE001
        return "skip", "cpu raises"
    if expected is None:
        return "skip", "no differentiable input/output"
    try:
        actual = _grad_once(op, sample, DEVICE)
        synchronize()
    except Exception as exc:  # noqa: BLE001
        _drain()
        return "fail", first_line(exc)
    try:
        compare(actual, expected, "grad")
    except AssertionError as exc:
        return "fail", mismatch_text(exc)
    except Exception as exc:  # noqa: BLE001
        _drain()
        return "fail", f"comparing: {first_line(exc)}"
    return "pass", ""


# ---------------------------------------------------------------------------
# One op


def _samples(op, dtype, requires_grad):
    return op.sample_inputs("cpu", dtype, requires_grad=requires_grad)


def run_op(op, dtypes=None, grad=False, limit_samples=None, forward=True) -> OpResult:
    """Every (dtype, sample) of one OpInfo; returns the counts and messages.

    Warnings are silenced: samples deliberately hit deprecated or degenerate
    cases, and the same warning comes from the CPU and the openreg call.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _run_op(op, dtypes, grad, limit_samples, forward)


def _run_op(op, dtypes, grad, limit_samples, forward) -> OpResult:
    result = OpResult(full_name(op))
    start = time.perf_counter()
    reason = skip_reason(op)
    supported = op.supported_dtypes("cpu")
    chosen = [d for d in (dtypes or sorted(supported, key=str)) if d in supported]
    if reason is not None:
        # Counted as one skipped entry per dtype (no sample was generated).
        if forward:
            result.skip(result.forward, reason, len(chosen))
        result.seconds = time.perf_counter() - start
        return result
    modes = []
    if forward:
        modes.append(("forward", result.forward, check_forward, False))
    if grad and op.supports_autograd:
        modes.append(("grad", result.grad, check_grad, True))
    for mode, counts, check, requires_grad in modes:
        for dtype in chosen:
            if mode == "grad" and dtype not in GRAD_DTYPES:
                continue
            if _run_dtype(op, result, mode, counts, check, dtype, requires_grad, limit_samples):
                break  # too slow: the rest of this op is skipped
    result.seconds = time.perf_counter() - start
    return result


def result_start(result):
    return result.started


def _run_dtype(op, result, mode, counts, check, dtype, requires_grad, limit_samples):
    """Returns True when the op turned out to be too slow to continue."""
    try:
        samples = iter(_samples(op, dtype, requires_grad))
    except Exception as exc:  # noqa: BLE001
        result.skip(counts, f"sample_inputs raises ({type(exc).__name__})")
        return False
    index = 0
    while limit_samples is None or index < limit_samples:
        try:
            sample = next(samples)
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001
            result.skip(counts, f"sample_inputs raises ({type(exc).__name__})")
            break
        t0 = time.perf_counter()
        status, message = check(op, sample)
        elapsed = time.perf_counter() - t0
        if status == "pass":
            counts.passed += 1
        elif status == "fail":
            result.fail(counts, mode, dtype, index, message)
        else:
            result.skip(counts, message)
        index += 1
        if time.perf_counter() - result_start(result) > OP_BUDGET_S:
            result.skip(counts, f"slow: op exceeded its {OP_BUDGET_S:.0f} s budget", 0)
            return True
        if elapsed > SLOW_SAMPLE_S:
            result.skip(
                counts, f"slow: a {dtype} sample took {elapsed:.1f} s > {SLOW_SAMPLE_S:.0f} s", 0
            )
            return True
    return False


# ---------------------------------------------------------------------------
# Reports


def totals(results):
    fwd, grd = Counts(), Counts()
    for r in results:
        fwd.add(r.forward)
        grd.add(r.grad)
    return fwd, grd


def pct(counts: Counts) -> str:
    if counts.ran == 0:
        return "n/a (no sample ran on the CPU)"
    return f"{100.0 * counts.passed / counts.ran:.2f}% ({counts.passed}/{counts.ran})"


def write_report(path, results, command, elapsed, grad):
    fwd, grd = totals(results)
    if path.endswith(".json"):
        data = {
            "command": command,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "torch": torch.__version__,
            "seconds": round(elapsed, 1),
            "forward": vars(fwd),
            "grad": vars(grd),
            "ops": [r.to_json() for r in results],
        }
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
        return
    lines = [
        "# OpInfo differential run (openreg vs CPU)",
        "",
        f"- Command: `{command}`",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M:%S')}, torch {torch.__version__}, "
        f"{elapsed / 60:.1f} min",
        f"- OpInfos: {len(results)}",
        f"- Forward: {fwd.passed} passed, {fwd.failed} failed, {fwd.skipped} skipped; "
        f"pass rate {pct(fwd)}",
    ]
    if grad:
        lines.append(
            f"- Gradient: {grd.passed} passed, {grd.failed} failed, {grd.skipped} skipped; "
            f"pass rate {pct(grd)}"
        )
    lines += [
        "",
        "Pass rate = passed / samples that ran on the CPU (CPU-raising and skipped "
        "samples are not counted).",
        "",
        "## Failing ops",
        "",
        "| op | failed | passed | first failure |",
        "|---|---|---|---|",
    ]
    failing = sorted((r for r in results if r.failures), key=lambda r: -len(r.failures))
    for r in failing:
        mode, dtype, index, message = r.failures[0]
        msg = message.replace("|", "\\|")
        lines.append(
            f"| {r.name} | {r.total.failed} | {r.total.passed} | {mode} {dtype} #{index}: {msg} |"
        )
    lines += ["", "## Every failure", ""]
    for r in failing:
        lines.append(f"### {r.name}")
        lines.append("")
        for mode, dtype, index, message in r.failures:
            lines.append(f"- {mode} {dtype} sample {index}: {message}")
        lines.append("")
    lines += ["## Skip reasons", "", "| op | reason | samples |", "|---|---|---|"]
    for r in results:
        for reason, n in sorted(r.skips.items()):
            lines.append(f"| {r.name} | {reason.replace('|', '/')} | {n} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------
# CLI: a worker subprocess runs the ops and streams one JSON line per op; the
# parent restarts it after the op that crashed or hung it.

HANG_TIMEOUT_S = 300.0


def _worker(args):
    names = [n for n in args.worker_ops.split("\n") if n]
    ops = {full_name(op): op for op in select_ops(names, exact=True)}
    dtypes = parse_dtypes(args.dtypes)
    with open(args.worker_out, "a") as out:
        for name in names:
            out.write(json.dumps({"start": name}) + "\n")
            out.flush()
            r = run_op(ops[name], dtypes, args.grad, args.limit_samples)
            out.write(json.dumps({"done": r.to_json()}) + "\n")
            out.flush()
    return 0


def _run_isolated(names, args):
    import tempfile

    results = {}
    remaining = list(names)
    here = os.path.abspath(__file__)
    while remaining:
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as tmp:
            out_path = tmp.name
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as tmp:
            tmp.write("\n".join(remaining))
            ops_path = tmp.name
        cmd = [sys.executable, here, "--worker-ops-file", ops_path, "--worker-out", out_path]
        if args.dtypes:
            cmd += ["--dtypes", args.dtypes]
        if args.grad:
            cmd.append("--grad")
        if args.limit_samples is not None:
            cmd += ["--limit-samples", str(args.limit_samples)]
        # stderr (warnings, crash messages) goes to a file: a pipe nobody
        # reads until the end would fill up and block the worker.
        err_file = tempfile.TemporaryFile("w+")
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file, text=True)
        seen, current, last_change = 0, None, time.monotonic()
        stderr_tail = ""
        while True:
            done = proc.poll() is not None
            with open(out_path) as f:
                lines = f.read().splitlines()
            for line in lines[seen:]:
                try:
                    msg = json.loads(line)
                except json.JSONDecodeError:
                    break
                seen += 1
                last_change = time.monotonic()
                if "start" in msg:
                    current = msg["start"]
                else:
                    r = OpResult.from_json(msg["done"])
                    results[r.name] = r
                    remaining.remove(r.name)
                    current = None
                    print(r.line(), flush=True)
            if done:
                err_file.seek(0)
                stderr_tail = err_file.read().strip().splitlines()[-1:]
                break
            if current is not None and time.monotonic() - last_change > HANG_TIMEOUT_S:
                proc.kill()
                proc.wait()
                stderr_tail = [f"no progress for {HANG_TIMEOUT_S:.0f} s (killed)"]
                break
            time.sleep(0.2)
        err_file.close()
        os.unlink(out_path)
        os.unlink(ops_path)
        if current is not None:
            r = OpResult(current)
            detail = stderr_tail[0] if stderr_tail else ""
            r.fail(
                r.forward,
                "forward",
                "-",
                -1,
                f"worker process died (returncode {proc.returncode}) {detail}"[:300],
            )
            results[current] = r
            remaining.remove(current)
            print(r.line(), flush=True)
        elif remaining and proc.returncode != 0:
            # Died before starting an op (e.g. import error): give up.
            raise SystemExit(f"worker failed: returncode {proc.returncode} {stderr_tail}")
    return [results[n] for n in names if n in results]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ops", help="comma-separated name substrings")
    p.add_argument("--dtypes", help="comma-separated, e.g. float32,int64")
    p.add_argument("--grad", action="store_true", help="also compare gradients")
    p.add_argument("--report", help="write a report (.json, otherwise markdown)")
    p.add_argument("--limit-samples", type=int, default=None)
    p.add_argument(
        "--in-process", action="store_true", help="no worker subprocess (a crash ends the run)"
    )
    p.add_argument("--worker-ops-file", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker_ops_file:
        with open(args.worker_ops_file) as f:
            args.worker_ops = f.read()
        return _worker(args)

    names = [n.strip() for n in args.ops.split(",")] if args.ops else None
    parse_dtypes(args.dtypes)  # validate early
    ops = select_ops(names)
    start = time.perf_counter()
    if args.in_process:
        results = []
        for op in ops:
            r = run_op(op, parse_dtypes(args.dtypes), args.grad, args.limit_samples)
            print(r.line(), flush=True)
            results.append(r)
    else:
        results = _run_isolated([full_name(op) for op in ops], args)
    elapsed = time.perf_counter() - start

    fwd, grd = totals(results)
    print()
    print(f"ops: {len(results)}, time {elapsed:.1f} s")
    print(f"forward pass rate: {pct(fwd)}")
    if args.grad:
        print(f"gradient pass rate: {pct(grd)}")
    if args.report:
        command = "python -m tests.opinfo.harness " + " ".join(
            sys.argv[1:] if argv is None else argv
        )
        write_report(args.report, results, command.strip(), elapsed, args.grad)
        print(f"report: {args.report}")
    total = Counts()
    total.add(fwd)
    total.add(grd)
    # The closing summary line (read by CI): forward + gradient checks.
    print(f"{total.passed} passed, {total.failed} failed, {total.skipped} skipped")
    return 1 if total.failed else 0


if __name__ == "__main__":
    sys.exit(main())
