"""Ctrl-C and kernels that never end, as a careful user expects them.

- Ctrl-C (SIGINT) raises KeyboardInterrupt in the user's main thread at once,
  as it does for the same loop on CPU tensors: during Python-level work that
  runs an operator's meta kernel (a lazy import inside it once swallowed the
  interrupt), and during a long synchronization. The devices stay usable and
  their work is not lost (values compared with the CPU).
- A terminal's Ctrl-C reaches the whole process group: with the process
  driver the device processes run in a group of their own and ignore
  SIGINT, so they survive it.
- A kernel that never ends is waited for, as on CUDA, but Ctrl-C ends the
  wait; the opt-in watchdog (OPENREG_KERNEL_TIMEOUT=S) turns S seconds
  without progress into a lost device naming the kernel, as a GPU's TDR
  does.

Every case runs in a fresh interpreter with a bounded time. The waits are
those of asynchronous launches: the cases run with OPENREG_LAUNCH_BLOCKING=0
(with blocking launches and the thread driver a launch waits for its kernel
with the kernel's arguments on the caller's stack, so a kernel that never
returns cannot be abandoned there: docs/faults.md).
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import clean_env, describe, run_python

DRIVERS = ["thread", "process"]
ASYNC = {"OPENREG_LAUNCH_BLOCKING": "0"}

# Sends SIGINT to this process after `delay` seconds, from another thread.
INTERRUPT_LATER = """
import os, signal, threading, time
def interrupt_later(delay):
    threading.Timer(delay, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    return time.monotonic() + delay
"""

LOOP = (
    INTERRUPT_LATER
    + """
import torch
# What runs once per process first: the operator's first run (its meta kernel
# is written in Python and imports torch._dynamo) and assert_close's lazy
# import of DTensor. A KeyboardInterrupt that lands inside an import leaves
# the module half-initialized (a later import re-registers its operators and
# fails), on the CPU too, so the signal is meant for the loop alone.
(torch.ones(64, 64, device="openreg") + 1).cpu()
torch.testing.assert_close(torch.zeros(1), torch.zeros(1))
def run(device):
    a = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)).to(device)
    x, steps = a, 0
    sent = interrupt_later(0.5)
    try:
        while time.monotonic() < sent + 5:
            x = x + 1
            steps += 1
        return None, steps, x
    except KeyboardInterrupt:
        return time.monotonic() - sent, steps, x

late, steps, x = run("openreg")
assert late is not None, "no KeyboardInterrupt in 5 s"
assert late < 1.0, late
# The device is usable afterwards and its work was not lost: x holds
# a + n for the n steps whose launch returned.
a = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
expected = a + float(steps)
torch.testing.assert_close(x.cpu(), expected, atol=1e-3 * steps, rtol=0)
print("OK", round(late, 2), steps)
"""
)


@pytest.mark.parametrize("driver", DRIVERS)
def test_ctrl_c_interrupts_a_loop_of_small_ops_at_once(driver):
    proc = run_python(LOOP, env={"OPENREG_DRIVER": driver}, timeout=60)
    assert proc.returncode == 0 and "OK" in proc.stdout, describe(proc)


LONG_SYNC = (
    INTERRUPT_LATER
    + """
import torch
g = torch.Generator().manual_seed(0)
a = torch.randn(2048, 2048, generator=g)
d = a.to("openreg")
eye = torch.eye(2048, device="openreg")
x = d
for _ in range(2):  # learn the signature first (its first run is synchronous)
    x = x @ eye
torch.openreg.synchronize()
for _ in range(16):  # seconds of queued device work (16 products of 2048^2)
    x = x @ eye
sent = interrupt_later(0.3)
try:
    torch.openreg.synchronize()
    raise SystemExit(f"the synchronization ended without KeyboardInterrupt "
                     f"({time.monotonic() - sent:.2f} s after the signal)")
except KeyboardInterrupt:
    late = time.monotonic() - sent
assert late < 0.5, late
# The work went on: the result is still a (times the identity, 18 times).
torch.testing.assert_close(x.cpu(), a)
print("OK", round(late, 3))
"""
)


@pytest.mark.parametrize("driver", DRIVERS)
def test_ctrl_c_interrupts_a_long_synchronize_and_the_work_goes_on(driver):
    proc = run_python(LONG_SYNC, env={"OPENREG_DRIVER": driver, **ASYNC}, timeout=120)
    assert proc.returncode == 0 and "OK" in proc.stdout, describe(proc)


TERMINAL = """
import sys, time, torch
a = torch.randn(256, 256, device="openreg"); x = a
# The loop's operators once first: their first run imports torch._dynamo (a
# meta kernel written in Python), and a KeyboardInterrupt raised inside an
# import's exec() of a string makes CPython exit with SIGINT at the end even
# once it was caught (its unhandled-interrupt flag is global), on the CPU too.
((x @ a) / 16).sum().item()
print("ready", flush=True)
try:
    start = time.monotonic()
    while time.monotonic() - start < 20:
        x = (x @ a) / 16
    print("no interrupt", flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
print("after", torch.ones(3, device="openreg").sum().item(), flush=True)
"""


def test_terminal_ctrl_c_leaves_device_processes_alive(tmp_path):
    # What a terminal does on Ctrl-C: SIGINT to the foreground process group.
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(TERMINAL)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=clean_env(OPENREG_DRIVER="process", OPENREG_FALLBACK_WARNINGS="0"),
        start_new_session=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, (out, err)
    assert out.split() == ["KeyboardInterrupt", "after", "3.0"], (out, err)
    assert "lost" not in err and "Fatal" not in err, err


HUNG_KERNEL = (
    INTERRUPT_LATER
    + """
import sys, torch
# A user's operator whose CPU kernel never returns, run on the device
# through the CPU fallback.
@torch.library.custom_op("test_interrupts::hang", mutates_args=(), device_types="cpu")
def hang(x: torch.Tensor) -> torch.Tensor:
    time.sleep(3600)
    return x.clone()

@hang.register_fake
def _(x):
    return torch.empty_like(x)

x = torch.ones(4, device="openreg")
torch.openreg.synchronize()
start = time.monotonic()
if sys.argv[1] == "ctrl-c":
    interrupt_later(0.5)
try:
    hang(x)
    torch.openreg.synchronize()
    print("no error")
except KeyboardInterrupt:
    print("KeyboardInterrupt", round(time.monotonic() - start, 1))
except torch.AcceleratorError as e:
    print("AcceleratorError", round(time.monotonic() - start, 1), str(e).replace("\\n", " "))
# The other device is not affected.
print("other", torch.ones(2, device="openreg:1").sum().item())
sys.stdout.flush()
os._exit(0)
"""
)


def test_a_kernel_that_never_ends_waits_until_ctrl_c():
    # Thread driver: the kernel runs on a device thread of this process.
    proc = run_python(
        HUNG_KERNEL, env={"OPENREG_DRIVER": "thread", **ASYNC}, args=["ctrl-c"], timeout=60
    )
    lines = proc.stdout.split("\n")
    assert lines[0].split()[0] == "KeyboardInterrupt", describe(proc)
    assert float(lines[0].split()[1]) < 2, describe(proc)
    assert lines[1] == "other 2.0", describe(proc)


def test_the_watchdog_loses_a_device_whose_kernel_never_ends():
    proc = run_python(
        HUNG_KERNEL,
        env={"OPENREG_DRIVER": "thread", "OPENREG_KERNEL_TIMEOUT": "1", **ASYNC},
        args=["watchdog"],
        timeout=60,
    )
    first, other = proc.stdout.split("\n")[:2]
    assert first.startswith("AcceleratorError"), describe(proc)
    assert float(first.split()[1]) < 4, describe(proc)
    assert "reset by the watchdog" in first and "OPENREG_KERNEL_TIMEOUT=1" in first, first
    assert "test_interrupts::hang" in first, first
    assert other == "other 2.0", describe(proc)


STOPPED_DEVICE = (
    INTERRUPT_LATER
    + """
import sys, torch
sys.path.insert(0, sys.argv[2])
from conftest import device_pids
x = torch.ones(256, 256, device="openreg")
(x @ x).sum().item()  # learnt: the next product is queued
pid = device_pids()[0]
os.kill(pid, signal.SIGSTOP)  # the device makes no progress from now on
def state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
while state(pid) != "T":  # the stop is asynchronous
    time.sleep(0.001)
y = x @ x
start = time.monotonic()
if sys.argv[1] == "ctrl-c":
    interrupt_later(0.5)
try:
    torch.openreg.synchronize()
    print("no error")
except KeyboardInterrupt:
    print("KeyboardInterrupt", round(time.monotonic() - start, 1))
except torch.AcceleratorError as e:
    print("AcceleratorError", round(time.monotonic() - start, 1), str(e).replace("\\n", " "))
if sys.argv[1] == "ctrl-c":
    os.kill(pid, signal.SIGCONT)
    print("after", y[0, 0].item())
sys.stdout.flush()
os._exit(0)
"""
)


@pytest.mark.parametrize("mode", ["ctrl-c", "watchdog"])
def test_a_stopped_device_process_waits_until_ctrl_c_or_the_watchdog(mode):
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    env = {"OPENREG_DRIVER": "process", **ASYNC}
    if mode == "watchdog":
        env["OPENREG_KERNEL_TIMEOUT"] = "1"
    proc = run_python(STOPPED_DEVICE, env=env, args=[mode, tests_dir], timeout=60)
    lines = proc.stdout.split("\n")
    if mode == "ctrl-c":
        assert lines[0].split()[0] == "KeyboardInterrupt", describe(proc)
        assert float(lines[0].split()[1]) < 2, describe(proc)
        assert lines[1] == "after 256.0", describe(proc)  # resumed, not lost
    else:
        assert lines[0].startswith("AcceleratorError"), describe(proc)
        assert float(lines[0].split()[1]) < 4, describe(proc)
        assert "reset by the watchdog" in lines[0] and "stopped" in lines[0], lines[0]


@pytest.mark.parametrize("value", ["-1", "abc", "1e9", " 5"])
def test_a_bad_kernel_timeout_is_refused(value):
    proc = run_python(
        "import torch; torch.ones(1, device='openreg')",
        env={"OPENREG_KERNEL_TIMEOUT": value},
    )
    assert proc.returncode != 0, describe(proc)
    assert "OPENREG_KERNEL_TIMEOUT" in proc.stderr, describe(proc)
