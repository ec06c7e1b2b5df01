"""pytest plugin of openreg: a test session on the simulated device, with checks.

Registered through the ``pytest11`` entry point, so installing torch_openreg
makes it known to pytest, and it does nothing until asked (``--openreg`` or
the ini option ``openreg = true``). It imports torch only then: a session
without it pays nothing, and a conftest that sets openreg's environment
variables before importing torch still comes first.

Options (``pytest --help``, group "openreg"):

- ``--openreg``: use the plugin; the other options imply it.
- ``--openreg-cuda``: run the session under the CUDA shim
  (``torch_openreg.migration``), as ``python -m torch_openreg.run -m pytest``.
- ``--openreg-default-device``: ``torch.set_default_device("openreg")``.
- ``--openreg-leaks``: a test that passed but left device memory allocated
  (after ``gc.collect()``) errors at teardown, naming the bytes and device.
- ``--openreg-sanitizer``: the stream sanitizer checks every test; a race
  fails the test with ``StreamRaceError``.
- ``--openreg-sync-debug=warn|error``: sync debug mode during each test;
  with ``warn`` the summary lists the tests that synchronized most.

Always: a device error that surfaces when the test ends (the next
synchronization, as CUDA would report it in the next test) fails the test
that caused it; a device the test left unusable (lost, or poisoned by a
device-side assert) is named in the summary, and with pytest-xdist the
worker ends after that test so xdist starts a fresh one with new devices.
The session summary counts the tests that used openreg, the operators that
fell back to the CPU and the peak device memory, over every xdist worker.

Fixtures (always available): ``openreg_faults`` (``torch.openreg.faults``,
cleared before and after the test) and ``openreg_device``
(``torch.device("openreg")``).
"""

from __future__ import annotations

import gc
import os
import sys
import warnings
from collections import Counter
from typing import Any

import pytest

_SYNC_DEBUG_MARK = "called a synchronizing "


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("openreg", "openreg simulated device")
    group.addoption("--openreg", action="store_true", help="run the session with openreg's checks")
    group.addoption(
        "--openreg-cuda",
        action="store_true",
        help="run the session under the CUDA shim (torch.cuda is openreg)",
    )
    group.addoption(
        "--openreg-default-device",
        action="store_true",
        help='torch.set_default_device("openreg") for the session',
    )
    group.addoption(
        "--openreg-leaks",
        action="store_true",
        help="error at teardown when a passed test left device memory allocated",
    )
    group.addoption(
        "--openreg-sanitizer",
        action="store_true",
        help="the stream sanitizer checks every test",
    )
    group.addoption(
        "--openreg-sync-debug",
        choices=("warn", "error"),
        default=None,
        help="sync debug mode during each test",
    )
    parser.addini("openreg", "use the openreg plugin (as --openreg)", type="bool", default=False)


def _enabled(config: pytest.Config) -> bool:
    opt = config.option
    return bool(
        opt.openreg
        or opt.openreg_cuda
        or opt.openreg_default_device
        or opt.openreg_leaks
        or opt.openreg_sanitizer
        or opt.openreg_sync_debug
        or config.getini("openreg")
    )


class _Session:
    """The plugin's state for one pytest process (a worker under xdist)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        opt = config.option
        self.leaks = opt.openreg_leaks
        self.sanitize = opt.openreg_sanitizer
        self.sync_debug = opt.openreg_sync_debug
        self.worker = getattr(config, "workerinput", None) is not None
        if opt.openreg_cuda:
            from torch_openreg.migration import activate

            activate()
        import torch

        import torch_openreg  # noqa: F401  (registers the device if autoload is off)

        self.torch = torch
        self.openreg = torch.openreg
        if opt.openreg_default_device:
            torch.set_default_device("openreg")
        self.used = 0  # tests during which openreg allocated or launched
        self.tests = 0
        self.leaked: list[str] = []
        self.unusable: dict[int, str] = {}  # device -> "test: error"
        self.syncs: Counter[str] = Counter()
        self.start: dict[int, int] = {}
        self.start_activity = 0
        self.end_worker = False

    # -- per-device state --------------------------------------------------
    def devices(self) -> list[int]:
        if not self.openreg.is_initialized():
            return []
        return list(range(self.openreg.device_count()))

    def activity(self) -> int:
        """Allocations made plus tasks launched, over every device."""
        total = 0
        for d in self.devices():
            total += self.openreg.memory_stats(d).get("allocation.all.allocated", 0)
        stats = self.openreg._launch_stats()
        for key in ("queued", "synchronous", "launches"):
            value = stats.get(key, 0)
            total += value if isinstance(value, int) else 0
        return total

    def setup(self, item: pytest.Item) -> None:
        self.tests += 1
        self.start = {d: self.openreg.memory_allocated(d) for d in self.devices()}
        self.start_activity = self.activity()
        if self.sanitize:
            self.openreg.sanitizer.enable()
        if self.sync_debug:
            # Every report counts (pytest's per-test warning filters undo
            # this), not only the first from a line, as Python's default.
            warnings.filterwarnings("always", message=_SYNC_DEBUG_MARK)
            self.openreg.set_sync_debug_mode(self.sync_debug)

    def after_call(self) -> None:
        """Ends the per-test modes before fixtures are torn down."""
        if self.sync_debug:
            self.openreg.set_sync_debug_mode("default")
        if self.sanitize:
            self.openreg.sanitizer.disable()

    def check_devices(self, nodeid: str) -> BaseException | None:
        """Synchronizes every device: an error the test's work raises there is
        the test's; a device that keeps raising is unusable for good."""
        first: BaseException | None = None
        for d in self.devices():
            if d in self.unusable:
                continue
            try:
                self.openreg.synchronize(d)
                continue
            except Exception as error:  # AcceleratorError, DistBackendError, ...
                first = first or error
            try:
                self.openreg.synchronize(d)
            except Exception as error:
                self.unusable[d] = f"{nodeid}: {str(error).splitlines()[0]}"
                if self.worker:
                    self.end_worker = True
        return first

    def teardown(self, item: pytest.Item, passed: bool) -> None:
        error = self.check_devices(item.nodeid)
        if self.activity() != self.start_activity:
            self.used += 1
        if error is not None and passed:  # a failed test has its own error
            raise RuntimeError(
                f"openreg: the device reported an error when {item.nodeid} ended "
                f"(its work raised it at the next synchronization): {error}"
            ) from error
        if not (self.leaks and passed):
            return
        gc.collect()
        for d in self.devices():
            now = self.openreg.memory_allocated(d)
            before = self.start.get(d, 0)
            if now > before:
                self.leaked.append(f"{item.nodeid}: {now - before} bytes on openreg:{d}")
                raise AssertionError(
                    f"openreg: {item.nodeid} left {now - before} bytes allocated on "
                    f"openreg:{d} ({before} bytes when it started, {now} when it ended, "
                    "after gc.collect()); a tensor the test made is still referenced"
                )

    def summary(self) -> dict[str, Any]:
        peak = 0
        for d in self.devices():
            peak = max(peak, self.openreg.max_memory_allocated(d))
        return {
            "tests": self.tests,
            "used": self.used,
            "fallback_ops": sorted(self.openreg.fallback_ops()),
            "peak_bytes": peak,
            "leaked": self.leaked,
            "unusable": [f"openreg:{d} in {why}" for d, why in sorted(self.unusable.items())],
            "syncs": dict(self.syncs),
        }


_KEY = pytest.StashKey[_Session]()
_SUMMARY_PROPERTY = "openreg_worker_summary"
_RESULTS = pytest.StashKey[list]()


def _session(config: pytest.Config) -> _Session | None:
    return config.stash.get(_KEY, None)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_RESULTS] = []
    if _enabled(config):
        state = _Session(config)
        config.stash[_KEY] = state
        _STATE[:] = [state]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    state = _session(item.config)
    if state is not None:
        state.setup(item)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    state = _session(item.config)
    try:
        return (yield)
    finally:
        if state is not None:
            state.after_call()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    result = yield  # the test's fixtures are gone now
    state = _session(item.config)
    if state is not None:
        reports = getattr(item, "_openreg_reports", {})
        passed = all(r.passed for r in reports.values()) and "call" in reports
        state.teardown(item, passed)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if not hasattr(item, "_openreg_reports"):
        item._openreg_reports = {}
    item._openreg_reports[report.when] = report
    state = _session(item.config)
    if state is not None and state.end_worker and report.when == "teardown":
        # The worker ends after this test (see below): its summary travels
        # with the last report, which xdist sends to the controller.
        report.user_properties.append((_SUMMARY_PROPERTY, state.summary()))
    return report


def _end_worker_after_the_test(state: _Session) -> None:
    """Under xdist, once the worker has told the controller the test is
    complete, ends the worker: the device the test made unusable cannot come
    back in this process, and xdist replaces a worker that ended with a new
    one (new devices) for the tests left, up to ``--max-worker-restart``."""
    for plugin in state.config.pluginmanager.get_plugins():
        if type(plugin).__name__ == "WorkerInteractor" and hasattr(plugin, "sendevent"):
            send = plugin.sendevent

            def sendevent(name: str, send=send, **kwargs: object) -> None:
                send(name, **kwargs)
                if name == "runtest_protocol_complete":
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(3)

            plugin.sendevent = sendevent
            return


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    result = yield
    state = _session(item.config)
    if state is not None and state.end_worker:
        _end_worker_after_the_test(state)
    return result


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """xdist's controller: the summary of a worker that ends after this test."""
    for name, value in getattr(report, "user_properties", ()):
        if name == _SUMMARY_PROPERTY and _STATE and _is_xdist_controller(_STATE[0].config):
            _STATE[0].config.stash[_RESULTS].append(value)
            node = getattr(report, "node", None)
            _ENDED[getattr(getattr(node, "gateway", None), "id", None)] = report.nodeid


_ENDED: dict[Any, str] = {}  # xdist worker id -> the test after which it ended


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched: Any) -> None:
    """xdist's controller: a worker the plugin ended had received the next
    tests already, and xdist blames the first of them for the "crash". That
    test never ran: it goes back in the queue, for a new worker."""
    worker = getattr(getattr(report, "node", None), "gateway", None)
    cause = _ENDED.get(getattr(worker, "id", None))
    if cause is None:
        return  # a real crash of the worker: xdist's report stands
    sched.mark_test_pending(crashitem)
    report.outcome = "rerun"
    report.longrepr = (
        f"not run on worker {worker.id!r}, which ended after {cause} left an openreg device "
        "unusable; run again on a new worker"
    )


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config):
    if report.outcome == "rerun":
        return "rerun", "R", ("RERUN", {"yellow": True})
    return None


def pytest_warning_recorded(warning_message: warnings.WarningMessage, when: str, nodeid: str):
    state = _STATE[0] if _STATE else None
    if state is None or _is_xdist_controller(state.config) or not nodeid:
        return
    if _SYNC_DEBUG_MARK not in str(warning_message.message):
        return
    state.syncs[nodeid] += 1


_STATE: list[_Session] = []  # this process's session, for the warning hook


def _is_xdist_controller(config: pytest.Config) -> bool:
    return config.pluginmanager.has_plugin("dsession")


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = _session(session.config)
    if state is None:
        return
    summary = state.summary()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["openreg"] = summary
    elif not _is_xdist_controller(session.config):  # else the workers' summaries
        session.config.stash[_RESULTS].append(summary)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist's controller: a worker's summary (absent if the worker ended early)."""
    summary = getattr(node, "workeroutput", {}).get("openreg")
    if summary is not None:
        node.config.stash[_RESULTS].append(summary)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not _enabled(config):
        return
    results = config.stash.get(_RESULTS, [])
    tr = terminalreporter
    tr.section("openreg")
    if not results:
        tr.write_line("no summary (every worker ended early)")
        return
    tests = sum(r["tests"] for r in results)
    used = sum(r["used"] for r in results)
    ops = sorted({op for r in results for op in r["fallback_ops"]})
    peak = max(r["peak_bytes"] for r in results)
    tr.write_line(f"tests that used openreg: {used} of {tests} run")
    tr.write_line(f"peak device memory allocated: {_size(peak)}")
    shown = ", ".join(ops[:20]) + (f", ... ({len(ops)} in all)" if len(ops) > 20 else "")
    tr.write_line(f"operators that fell back to the CPU: {len(ops)}" + (f": {shown}" * bool(ops)))
    for r in results:
        for line in r["unusable"]:
            tr.write_line(f"device made unusable: {line}")
        for line in r["leaked"]:
            tr.write_line(f"leaked: {line}")
    syncs: Counter[str] = Counter()
    for r in results:
        syncs.update(r["syncs"])
    for nodeid, n in syncs.most_common(10):
        tr.write_line(f"synchronizations reported by sync debug: {n} in {nodeid}")


@pytest.fixture
def openreg_faults():
    """``torch.openreg.faults``, cleared before and after the test
    (docs/faults.md); faults that change the process for good (``sticky``,
    ``lose_device``) belong in a subprocess or an xdist worker."""
    import torch

    import torch_openreg  # noqa: F401

    faults = torch.openreg.faults
    faults.clear()
    yield faults
    faults.clear()


@pytest.fixture
def openreg_device():
    import torch

    import torch_openreg  # noqa: F401

    return torch.device("openreg")
