"""The kit's registry, the context a check receives, and the runner.

A check is a function ``fn(ctx)`` registered with ``@check(topic)``. Its
docstring is the expectation printed on the card. It passes by returning,
fails by raising ``Failure`` (whose message shows how the backend differs from
the expectation; any other exception fails the check too, with its type and
message), and is skipped by raising ``Skip`` (whose message is the reason).

Everything here uses public PyTorch APIs and the device name only.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

# ---------------------------------------------------------------------------
# Outcomes


class Skip(Exception):
    """The check cannot run on this backend or machine; the message says why."""


class Failure(AssertionError):
    """The backend differs from the expectation; the message says how."""


PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


def expect(condition: object, message: str) -> None:
    if not condition:
        raise Failure(message)


def expect_equal(actual: object, expected: object, what: str) -> None:
    if actual != expected:
        raise Failure(f"{what}: got {actual!r}, expected {expected!r}")


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(_to_cpu(o) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(o) for o in obj)
    return obj


def expect_close(actual: Any, expected: Any, what: str, **tolerances: Any) -> None:
    """``actual`` (moved to the CPU) equals ``expected`` as assert_close judges."""
    tolerances.setdefault("equal_nan", True)
    try:
        torch.testing.assert_close(_to_cpu(actual), _to_cpu(expected), **tolerances)
    except AssertionError as e:
        lines = [line for line in str(e).splitlines() if line.strip()]
        raise Failure(f"{what}: " + " ".join(lines[:4])) from None


def expect_raises(
    exceptions: type[BaseException] | tuple[type[BaseException], ...],
    fn: Callable[[], object],
    what: str,
    contains: Sequence[str] = (),
) -> BaseException:
    """``fn()`` raises one of ``exceptions`` whose message contains every string."""
    names = (
        exceptions.__name__
        if isinstance(exceptions, type)
        else " or ".join(e.__name__ for e in exceptions)
    )
    try:
        fn()
    except exceptions as e:
        missing = [s for s in contains if s.lower() not in str(e).lower()]
        if missing:
            raise Failure(
                f"{what}: {type(e).__name__} raised, but its message does not mention "
                f"{missing}: {str(e)[:300]!r}"
            ) from None
        return e
    except Exception as e:
        raise Failure(
            f"{what}: raised {type(e).__name__} ({str(e)[:200]!r}), expected {names}"
        ) from None
    raise Failure(f"{what}: returned normally, expected {names}")


# ---------------------------------------------------------------------------
# Registry


@dataclasses.dataclass(frozen=True)
class Check:
    topic: str
    name: str
    expectation: str
    fn: Callable[[Context], None]
    devices: int  # how many devices the check needs

    @property
    def id(self) -> str:
        return f"{self.topic}.{self.name}"


TOPICS: dict[str, str] = {}  # key -> title, in the card's order
CHECKS: list[Check] = []


def topic(key: str, title: str) -> str:
    TOPICS[key] = title
    return key


# [doc:conformance-check]
def check(topic_key: str, devices: int = 1) -> Callable[[Callable], Callable]:
    """Registers ``fn`` as a check of ``topic_key``; its docstring is the expectation."""

    def register(fn: Callable[[Context], None]) -> Callable[[Context], None]:
        if topic_key not in TOPICS:
            raise ValueError(f"unknown topic {topic_key!r}")
        expectation = " ".join((fn.__doc__ or "").split())
        if not expectation:
            raise ValueError(f"check {fn.__name__} has no docstring (its expectation)")
        if any(c.topic == topic_key and c.name == fn.__name__ for c in CHECKS):
            raise ValueError(f"check {topic_key}.{fn.__name__} registered twice")
        CHECKS.append(Check(topic_key, fn.__name__, expectation, fn, devices))
        return fn

    return register


# [/doc:conformance-check]


# ---------------------------------------------------------------------------
# Context


_RESULT_TAG = "@@conformance-result@@"


class Context:
    """What a check knows about the backend: its name, device module and count."""

    def __init__(self, name: str, imports: Sequence[str] = (), subprocess_timeout: float = 120):
        self.name = name
        self.imports = list(imports)
        self.subprocess_timeout = subprocess_timeout
        self.module = torch.get_device_module(name)
        self.count = int(self.module.device_count())
        self._fresh_cache: dict[str, dict] = {}
        self.scratch: dict[str, Any] = {}  # per-run state checks may share

    def device(self, index: int | None = None) -> torch.device:
        return torch.device(self.name) if index is None else torch.device(self.name, index)

    def busy(self, n: int = 512, steps: int = 12, device: int | None = None) -> torch.Tensor:
        """Queues work that takes a while on the current stream; returns its result.

        The result is exactly ``1/n`` everywhere (``(J/n) @ (J/n) == J/n`` for a
        power of two ``n``), so checks can verify it was computed.
        """
        a = torch.full((n, n), 1.0 / n, device=self.device(device))
        for _ in range(steps):
            a = a @ a
        return a

    def synchronize_all(self) -> None:
        for index in range(self.count):
            torch.accelerator.synchronize(index)

    def fresh(self, code: str, timeout: float | None = None) -> dict:
        """Runs ``code`` in a fresh interpreter; returns the dict it leaves in ``out``.

        The snippet sees ``torch``, ``NAME`` (the device name), ``mod`` (the
        device module, from ``torch.get_device_module``) and ``out``. Results
        are cached per snippet, so checks can share one process.
        """
        if code in self._fresh_cache:
            return self._fresh_cache[code]
        program = "\n".join(
            [
                "import importlib, json, os, sys",
                "import torch",
                *(f"importlib.import_module({m!r})" for m in self.imports),
                f"NAME = {self.name!r}",
                "mod = torch.get_device_module(NAME)",
                "out = {}",
                textwrap.dedent(code),
                f"print({_RESULT_TAG!r} + json.dumps(out), flush=True)",
            ]
        )
        with tempfile.TemporaryDirectory(prefix="conformance-") as tmp:
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", program],
                    capture_output=True,
                    text=True,
                    cwd=tmp,
                    timeout=timeout or self.subprocess_timeout,
                )
            except subprocess.TimeoutExpired:
                raise Failure(
                    f"a fresh process did not finish within {timeout or self.subprocess_timeout} s"
                ) from None
        for line in proc.stdout.splitlines():
            if line.startswith(_RESULT_TAG):
                result = json.loads(line[len(_RESULT_TAG) :])
                self._fresh_cache[code] = result
                return result
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
        raise Failure(f"a fresh process exited with {proc.returncode} before reporting:\n{tail}")


def load_backend(imports: Iterable[str]) -> None:
    """Imports the modules a backend needs when it is not autoloaded by ``import torch``."""
    for module in imports:
        importlib.import_module(module)


# ---------------------------------------------------------------------------
# Runner


@dataclasses.dataclass
class Result:
    check: Check
    status: str  # PASSED | FAILED | SKIPPED
    detail: str = ""  # the difference (failed) or the reason (skipped)


class _Watchdog:
    """Ends the run if one check hangs, after reporting what finished."""

    def __init__(self, on_timeout: Callable[[Check, float], None]):
        self._on_timeout = on_timeout
        self._lock = threading.Lock()
        self._armed: tuple[Check, float, float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="conformance-watchdog", daemon=True)
        self._thread.start()

    def arm(self, chk: Check, seconds: float) -> None:
        with self._lock:
            self._armed = (chk, time.monotonic() + seconds, seconds)

    def disarm(self) -> None:
        with self._lock:
            self._armed = None

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                armed = self._armed
            if armed is not None and time.monotonic() > armed[1]:
                self._on_timeout(armed[0], armed[2])


def select(topics: Sequence[str] | None) -> list[Check]:
    if not topics:
        return list(CHECKS)
    unknown = [t for t in topics if t not in TOPICS]
    if unknown:
        raise ValueError(f"unknown topic(s) {unknown}; known: {', '.join(TOPICS)}")
    return [c for c in CHECKS if c.topic in topics]


def _describe(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {first[:400]}" if first else type(e).__name__


def run_one(ctx: Context, chk: Check) -> Result:
    if ctx.count < chk.devices:
        return Result(chk, SKIPPED, f"needs {chk.devices} devices, the backend reports {ctx.count}")
    streams = [torch.accelerator.current_stream(i) for i in range(ctx.count)]
    current = torch.accelerator.current_device_index()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            chk.fn(ctx)
        result = Result(chk, PASSED)
    except Skip as e:
        result = Result(chk, SKIPPED, str(e))
    except Failure as e:
        result = Result(chk, FAILED, str(e))
    except Exception as e:
        result = Result(chk, FAILED, f"raised {_describe(e)}")
    # Undo what the check left behind; a deferred device error belongs to it.
    try:
        for index, stream in enumerate(streams):
            if torch.accelerator.current_stream(index) != stream:
                torch.accelerator.set_stream(stream)
        torch.accelerator.set_device_index(current)
        ctx.synchronize_all()
    except Exception as e:
        if result.status == PASSED:
            result = Result(chk, FAILED, f"left a device error behind: {_describe(e)}")
    gc.collect(1)
    return result


def run(
    ctx: Context,
    checks: Sequence[Check],
    timeout: float = 120,
    on_result: Callable[[Result], None] | None = None,
    on_hang: Callable[[list[Result], Result], None] | None = None,
) -> list[Result]:
    """Runs ``checks`` in order. A check running longer than ``timeout`` seconds
    ends the process (after ``on_hang`` reported the results so far)."""
    results: list[Result] = []

    def hung(chk: Check, seconds: float) -> None:
        failed = Result(chk, FAILED, f"did not finish within {seconds:.0f} s; the run stopped")
        if on_hang is not None:
            on_hang(results, failed)
        os._exit(3)

    watchdog = _Watchdog(hung)
    # Whatever PyTorch caches on disk during the run (Inductor's generated
    # code) goes to a temporary directory, unless the user chose a place.
    tmp = tempfile.TemporaryDirectory(prefix="conformance-run-")
    cache_var = "TORCHINDUCTOR_CACHE_DIR"
    own_cache = cache_var not in os.environ
    if own_cache:
        os.environ[cache_var] = os.path.join(tmp.name, "inductor")
    try:
        for chk in checks:
            watchdog.arm(chk, timeout)
            result = run_one(ctx, chk)
            watchdog.disarm()
            results.append(result)
            if on_result is not None:
                on_result(result)
    finally:
        watchdog.stop()
        if own_cache:
            os.environ.pop(cache_var, None)
        tmp.cleanup()
    return results


def counts(results: Iterable[Result]) -> tuple[int, int, int]:
    results = list(results)
    return tuple(sum(r.status == s for r in results) for s in (PASSED, FAILED, SKIPPED))


def summary_line(results: Iterable[Result]) -> str:
    passed, failed, skipped = counts(results)
    return f"{passed} passed, {failed} failed, {skipped} skipped"
