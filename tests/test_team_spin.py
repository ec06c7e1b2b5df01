"""How long the device's OpenMP team spins after a region (OPENREG_TEAM_SPIN).

docs/process-driver.md, "The device's OpenMP team": a device process
chooses for its own libgomp, the thread driver for the user process's, which
its devices share with the host. The choice changes timing only: every
setting gives the CPU's values, and in deterministic mode the same bits
(outside it a kernel may run on fewer threads while the host runs, and a
product's or a reduction's last bits follow the timing: doc:fewer-threads
in csrc/aten/fallback/OpenRegOpTraits.cpp). The short spin is an idle
team of two threads named ``openreg-spin`` (a thread of the kernel library
and its OpenMP team thread) beside the device's own: these tests count
them, in the device process or in the user's.
"""

import inspect
import json

import pytest
from conftest import describe, device_pids

DRIVERS = {
    "process": {"OPENREG_DRIVER": "process", "OPENREG_LAUNCH_BLOCKING": None},
    "thread": {"OPENREG_DRIVER": "thread", "OPENREG_LAUNCH_BLOCKING": None},
}

SPIN_THREADS = (
    "\nimport os\n"
    + inspect.getsource(device_pids)
    + """
def spin_threads():
    # The threads named openreg-spin in the process that runs device 0.
    pid = device_pids().get(0, os.getpid())
    count = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                count += f.read().strip() == "openreg-spin"
        except OSError:
            pass  # ended meanwhile
    return count
def wait_for_spin_threads(want, seconds=20):
    deadline = time.monotonic() + seconds
    while spin_threads() != want and time.monotonic() < deadline:
        time.sleep(0.02)
    return spin_threads()
"""
)

TRAIN = (
    SPIN_THREADS
    + """
import copy, hashlib, json, time, torch, torch_openreg
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)  # bits that do not follow the timing
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10))
x, y = torch.randn(256, 512), torch.randint(0, 10, (256,))
def train(device):
    m = copy.deepcopy(model).to(device)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in m.parameters()]
cpu_losses, cpu_params = train("cpu")
losses, params = train("openreg")
for got, want in zip(params, cpu_params):
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
torch.testing.assert_close(losses, cpu_losses, rtol=1e-4, atol=1e-5)
threads = wait_for_spin_threads(WANT) if WANT else spin_threads()
digest = hashlib.sha256(b"".join(p.numpy().tobytes() for p in params)).hexdigest()
print(json.dumps({"spin_threads": threads, "digest": digest}))
"""
)


def last_json(proc):
    assert proc.returncode == 0, describe(proc)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("driver", sorted(DRIVERS))
def test_team_spin_settings_keep_the_values(py, driver):
    out = {}
    for spin, want in (("long", 0), ("short", 2), ("auto", 0)):
        script = TRAIN.replace("WANT", str(want))
        out[spin] = last_json(py(script, OPENREG_TEAM_SPIN=spin, **DRIVERS[driver]))
    assert out["long"]["digest"] == out["short"]["digest"] == out["auto"]["digest"], out
    assert out["long"]["spin_threads"] == 0, out  # libgomp's own spin: no idle team
    assert out["short"]["spin_threads"] == 2, out


HOST_BOUND_THEN_IDLE = (
    SPIN_THREADS
    + """
import json, time, torch, torch_openreg
x = torch.zeros(4096, device="openreg")
# Host-bound: a kernel a millisecond, the host's own work (a sleep here)
# between them. The device is busy far less than half of each window.
adds = 0
deadline = time.monotonic() + 30
while spin_threads() != 2 and time.monotonic() < deadline:
    for _ in range(50):
        x.add_(1)
        adds += 1
        time.sleep(0.001)
during = spin_threads()
# Every device idle: in the thread driver, after a window (40 ms) the team of
# the short spin ends, and its thread waits for the next hint.
after = wait_for_spin_threads(1, seconds=IDLE_SECONDS)
values = bool((x.cpu() == adds).all())
print(json.dumps({"during": during, "after": after, "values": values}))
"""
)


@pytest.mark.parametrize("driver", sorted(DRIVERS))
def test_a_host_bound_loop_gets_the_short_spin(py, driver):
    # OPENREG_TEAM_SPIN=auto (the default): a loop whose host runs beside a
    # mostly idle device gets the short spin. In the thread driver the host's
    # own CPU work shares the process's libgomp, so an idle device sets the
    # long spin back; a device process keeps its choice (nothing of the
    # host's runs there).
    # A device process's choice is checked after 0.5 s, 12 windows.
    script = HOST_BOUND_THEN_IDLE.replace("IDLE_SECONDS", "20" if driver == "thread" else "0.5")
    out = last_json(py(script, OPENREG_TEAM_SPIN="auto", **DRIVERS[driver]))
    assert out["values"], out
    assert out["during"] == 2, out
    if driver == "thread":
        assert out["after"] == 1, out
    else:
        assert out["after"] == 2, out


def test_a_bad_team_spin_setting_is_refused(py):
    proc = py(
        "import torch, torch_openreg; torch.ones(1, device='openreg')", OPENREG_TEAM_SPIN="fast"
    )
    assert proc.returncode != 0
    assert "OPENREG_TEAM_SPIN='fast' is not 'auto'" in proc.stderr, describe(proc)
