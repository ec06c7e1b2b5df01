"""Shared fixtures and helpers for the openreg test suite.

The suite runs against the default simulated machine (2 devices, 4 GiB
each) and the default allocator options: the OPENREG_* variables and the
settings below are removed from the environment before torch is imported, so
a developer's shell settings cannot change the results.
Tests that need another configuration start a subprocess: ``run_python``
(or the ``py`` fixture around it) is the only way the suite starts one.
"""

import gc
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings

# Environment settings that change what the tests see, besides OPENREG_*.
_SETTINGS = ("TORCH_DEVICE_BACKEND_AUTOLOAD", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")

# Must happen before the runtime (or c10's allocator configuration) reads
# them.
for _var in (
    *_SETTINGS,
    "OPENREG_DEVICE_COUNT",
    "OPENREG_DEVICE_MEMORY",
    "OPENREG_CUDA_SHIM",  # the CUDA migration shim only ever runs in subprocesses
):
    os.environ.pop(_var, None)
# The suite compares warnings with the CPU's; the fallback's own
# once-per-operator notice is tested on its own (test_fallback_log.py).
os.environ["OPENREG_FALLBACK_WARNINGS"] = "0"
# A device-side assert (an index out of range in gather, ...: the default,
# as on CUDA) leaves the device unusable for the rest of the process; the
# suite's in-process tests compare errors with the CPU's, so they run with
# the CPU's errors, and tests/test_device_asserts.py runs the CUDA mode in
# subprocesses (as PyTorch's own CUDA tests of device asserts do).
os.environ.setdefault("OPENREG_DEVICE_ASSERTS", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402

import torch_openreg  # noqa: E402, F401  (explicit: in-process tests never rely on autoload)

DEVICE = "openreg"
DEFAULT_DEVICE_COUNT = 2

# A per-test ceiling (pytest-timeout): a deadlocked stream or a hung child
# process fails its test instead of hanging the whole run.
DEFAULT_TIMEOUT_S = 180


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT_S))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_FAILED] = report.failed


_FAILED = pytest.StashKey[bool]()


@pytest.fixture(autouse=True)
def _isolate_test(request):
    """Every test starts and ends on openreg:0 (some tests switch devices).

    Afterwards it also releases what the test left behind: pytest keeps a
    failing test's traceback in ``sys.last_traceback``, and exceptions form
    reference cycles with their frames. Either would keep the test's device
    tensors alive and skew the allocator statistics later tests check.
    """
    torch.openreg.set_device(0)
    yield
    # Kernels run asynchronously: a kernel error the test left pending is
    # raised here, so it fails the test that caused it, not the next one.
    for index in range(torch.openreg.device_count()):
        torch.openreg.synchronize(index)
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    # A full collection costs ~0.1 s here: only after failures.
    gc.collect() if request.node.stash.get(_FAILED, False) else gc.collect(1)
    torch.openreg.set_device(0)


# ---------------------------------------------------------------------------
# Subprocesses


def device_pids(parent=None):
    """Device ordinal -> pid of the device processes of ``parent`` (default:
    this process) with OPENREG_DRIVER=process: its children named
    openreg-dev<N>. Self-contained, so scripts for a fresh interpreter can
    carry its source (test_process_driver.DEVICE_PIDS)."""
    import os

    parent = os.getpid() if parent is None else parent
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == parent and comm.startswith("openreg-dev"):
            found[int(comm[len("openreg-dev") :])] = int(entry)
    return found


# The suite's mode, which its subprocesses run in too (the whole suite runs
# once per driver and launch mode): a test that needs another sets it.
_MODE = ("OPENREG_DRIVER", "OPENREG_LAUNCH_BLOCKING", "OPENREG_DEVICE_ASSERTS")


def clean_env(**overrides):
    """The current environment without OPENREG_* and _SETTINGS, plus overrides.

    The suite's mode (_MODE: the driver and blocking launches) is kept. An
    override of None removes the variable.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if (k in _MODE or not k.startswith("OPENREG_")) and k not in _SETTINGS
    }
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    return env


def run_python(code, cwd=None, env=None, timeout=120, args=(), launcher=()):
    """Runs a fresh interpreter: the one way tests start one.

    ``python -c code`` (dedented; ``__name__`` is ``"__main__"``), with
    ``args`` as its ``sys.argv[1:]``; or, when ``code`` is None, ``python``
    with ``args`` alone (a script and its arguments, or ``-m module ...``).
    ``launcher`` is a command that runs the interpreter (for instance
    ``unshare --net ...``).
    The child gets clean_env(**env) and runs in ``cwd`` (the test's
    tmp_path, through the ``py`` fixture), or else in a temporary directory
    removed afterwards, so it writes nothing elsewhere. Returns the
    CompletedProcess (text mode, stdout/stderr captured); a child still
    running after ``timeout`` seconds is killed and raises
    subprocess.TimeoutExpired.
    """
    if cwd is None:
        with tempfile.TemporaryDirectory() as tmp:
            return run_python(code, tmp, env, timeout, args, launcher)
    command = [sys.executable] if code is None else [sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(
        [*launcher, *command, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(cwd),
        env=clean_env(**(env or {})),
    )


def describe(proc):
    """Diagnostic text for assertion messages about a subprocess."""
    return (
        f"returncode={proc.returncode}\n"
        f"--- stdout ---\n{proc.stdout}\n"
        f"--- stderr ---\n{proc.stderr}"
    )


def rerun_file_in_blocking_mode(path, timeout, args=()):
    """Runs the test file `path` again in a fresh interpreter with
    OPENREG_LAUNCH_BLOCKING=1 (every launch at its call) and asserts it passed."""
    proc = run_python(
        None,
        env={"OPENREG_LAUNCH_BLOCKING": "1"},
        timeout=timeout,
        args=["-m", "pytest", "-q", "-p", "no:cacheprovider", *args, os.path.abspath(path)],
    )
    assert proc.returncode == 0, describe(proc)
    assert " passed" in proc.stdout and "failed" not in proc.stdout, describe(proc)


@pytest.fixture(scope="session")
def inductor_cache_dir(tmp_path_factory):
    """Inductor's code cache for the session's torch.compile tests, inside
    pytest's temporary directory. One for all of them: the first compile also
    precompiles Inductor's C++ header, the slowest step."""
    return tmp_path_factory.mktemp("inductor_cache")


@pytest.fixture(scope="module")
def inductor_cache(inductor_cache_dir):
    """Makes Inductor use ``inductor_cache_dir`` for a test module (and forget
    its compiled graphs afterwards)."""
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    with temporary_cache_dir(str(inductor_cache_dir)):
        yield inductor_cache_dir
    torch._dynamo.reset()


# PyTorch's TCPStore listens on every interface, whatever address it is
# given, and so do torchrun's agent and Lightning's DDP stores (torch 2.13:
# `ss -ltnp` shows them on *:<port>). Tests whose children start a store run
# them in network and PID namespaces of their own (`unshare`, no privileges
# needed): the only interface is the namespace's loopback, so nothing listens
# beyond it and no port of another program can collide; and when the
# launched interpreter ends or is killed at the timeout, the kernel ends every
# process it started (a rank left waiting on a store cannot outlive its test
# or hold its output pipes open). The prelude brings `lo` up (a new namespace
# starts with it down), then execs Python with the arguments given.
_OWN_NETWORK = ("unshare", "--net", "--pid", "--fork", "--kill-child", "--map-root-user")
_LO_UP_THEN_EXEC = """
import fcntl, os, socket, struct, sys
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH", b"lo", 0)))[1]
fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def run_in_own_network(args, cwd, timeout, **env):
    """``python *args`` in its own network and PID namespaces (see above).

    Skips where namespaces cannot be created; a run past ``timeout`` seconds
    fails with the output it printed so far.
    """
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to keep TCP stores off the network")
    probe = run_python("pass", cwd, timeout=30, launcher=_OWN_NETWORK)
    if probe.returncode != 0:
        pytest.skip(f"cannot create network and PID namespaces here: {probe.stderr.strip()}")
    try:
        return run_python(_LO_UP_THEN_EXEC, cwd, env, timeout, args, _OWN_NETWORK)
    except subprocess.TimeoutExpired as e:
        out = [
            x.decode(errors="replace") if isinstance(x, bytes) else x or ""
            for x in (e.stdout, e.stderr)
        ]
        pytest.fail(
            f"python {' '.join(map(str, args))} still ran after {timeout} s\n"
            f"--- stdout so far ---\n{out[0][-3000:]}\n--- stderr so far ---\n{out[1][-6000:]}"
        )


@pytest.fixture
def py(tmp_path):
    """``py(code, **env)`` runs code in a subprocess inside tmp_path (see run_python)."""

    def run(code, timeout=120, args=(), launcher=(), **env):
        return run_python(code, tmp_path, env, timeout, args, launcher)

    return run


# ---------------------------------------------------------------------------
# Comparing device results with CPU results


def tree_map(fn, obj):
    """Applies fn to every tensor inside nested tuples/lists/dicts."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple (torch.return_types)
        return type(obj)(*(tree_map(fn, o) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(tree_map(fn, o) for o in obj)
    if isinstance(obj, dict):
        return {k: tree_map(fn, v) for k, v in obj.items()}
    return obj


def to_device(obj, device=DEVICE):
    return tree_map(lambda t: t.to(device), obj)


def tensors_in(obj):
    found = []
    tree_map(found.append, obj)
    return found


def assert_on_device(obj, device=DEVICE):
    """Every tensor in obj lives on `device` (a type like "openreg" or "openreg:1")."""
    want = torch.device(device)
    for t in tensors_in(obj):
        assert t.device.type == want.type, f"result on {t.device}, expected {want}"
        if want.index is not None:
            assert t.device == want, f"result on {t.device}, expected {want}"


def assert_close_cpu(actual_device, expected_cpu, **kwargs):
    """Moves the device result to the CPU and compares it with the CPU result."""
    actual = tree_map(lambda t: t.cpu(), actual_device)
    kwargs.setdefault("equal_nan", True)
    torch.testing.assert_close(actual, expected_cpu, **kwargs)


def run_both(fn, *args, device=DEVICE, **kwargs):
    """fn on CPU inputs and on device copies of them; returns (cpu, device) results.

    The device copies are made first, so fn may modify its inputs in place.
    """
    dev_args = to_device(args, device)
    dev_kwargs = to_device(kwargs, device)
    expected = fn(*args, **kwargs)
    actual = fn(*dev_args, **dev_kwargs)
    return expected, actual


def check_against_cpu(fn, *args, device=DEVICE, compare_kwargs=None, **kwargs):
    """Runs fn on CPU and on `device`, checks the placement and the values."""
    expected, actual = run_both(fn, *args, device=device, **kwargs)
    assert_on_device(actual, device)
    assert_close_cpu(actual, expected, **(compare_kwargs or {}))
    return actual


# ---------------------------------------------------------------------------
# Comparing what a user sees: outcome, value or message, warnings


def observe(fn, device):
    """``((kind, value or first line of the message), warning messages)`` of fn(device).

    kind is "ok" or the exception's type; tensors in the value are moved to
    the CPU after the device synchronized, so a deferred kernel error counts
    as the call's.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = tree_map(lambda t: t.cpu(), fn(device))
            if device != "cpu":
                torch.openreg.synchronize()
            outcome = ("ok", value)
        except Exception as e:  # noqa: BLE001  (the type is what is compared)
            outcome = (type(e), str(e).split("\n")[0])
    return outcome, [str(w.message) for w in caught]


def assert_same_observation(cpu, dev, device=DEVICE, exact=False):
    """Two ``observe`` results agree: the same outcome type; close values of
    the same dtypes (equal bits with ``exact``) or the same message; the same
    warnings. Device names are replaced by "cpu" before comparing."""
    (kind_cpu, val_cpu), warn_cpu = cpu
    (kind_dev, val_dev), warn_dev = dev
    assert kind_dev == kind_cpu, (val_cpu, val_dev)
    if kind_cpu == "ok" and tensors_in(val_cpu):
        tolerance = {"rtol": 0, "atol": 0} if exact else {}
        torch.testing.assert_close(val_dev, val_cpu, equal_nan=True, **tolerance)
    elif kind_cpu == "ok":
        assert val_dev == val_cpu
    else:
        assert val_dev.replace(device, "cpu") == val_cpu, (val_cpu, val_dev)
    assert [w.replace(device, "cpu") for w in warn_dev] == warn_cpu, (warn_cpu, warn_dev)
