"""Lightning, accelerate and the HF Trainer on openreg (tests/framework_scripts/).

Each framework runs in one subprocess (its import alone takes seconds), which
trains the same model on the CPU and on openreg and writes the results as
JSON; the tests here compare them. Skipped with the reason when the
framework is not installed (``pip install -e .[lightning,hf]``).
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import describe, run_in_own_network, run_python

SCRIPTS = Path(__file__).resolve().parent / "framework_scripts"


def needs(*modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"not installed: {', '.join(missing)}")


def run_script(name, tmp_path, *args, timeout=170, own_network=False, **env):
    """Runs framework_scripts/<name> and returns the JSON it wrote.

    With ``own_network`` it runs in network and PID namespaces of its own
    (conftest.run_in_own_network): for scripts whose ranks start TCP stores.
    """
    out = tmp_path / f"{name}.json"
    argv, env = [SCRIPTS / name, out, *args], {"OPENREG_FALLBACK_WARNINGS": 0, **env}
    if own_network:
        proc = run_in_own_network(argv, tmp_path, timeout, **env)
    else:
        proc = run_python(None, tmp_path, env, timeout, argv)
    assert proc.returncode == 0, describe(proc)
    return json.loads(out.read_text())


def assert_same(actual, expected, **tolerances):
    torch.testing.assert_close(torch.tensor(actual), torch.tensor(expected), **tolerances)


def assert_same_weights(actual, expected, **tolerances):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert_same(a, e, **tolerances)


# ---------------------------------------------------------------------------
# Lightning


@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory):
    return run_script("lightning_train.py", tmp_path_factory.mktemp("lightning"))


@needs("lightning")
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_lightning_one_device_matches_cpu(lightning_run, precision):
    assert lightning_run["registered"]
    run = lightning_run[precision]
    assert run["strategy"] == "SingleDeviceStrategy" and run["root_device"] == "openreg:0"
    assert run["devices_seen"] == ["openreg:0"]
    if precision != "32-true":
        assert run["plugin_device"] == "openreg"  # autocast on openreg, not "cuda"
    # Same weights from the same seed, same kernels: the same steps.
    assert_same(run["openreg_losses"], run["cpu_losses"])
    assert_same_weights(run["openreg_weights"], run["cpu_weights"])


@needs("lightning")
def test_lightning_16_mixed_scales_on_openreg(lightning_run):
    run = lightning_run["16-mixed"]
    assert run["devices_seen"] == ["openreg:0"] and run["scaler_device"] == "openreg"
    losses = torch.tensor(run["openreg_losses"])
    assert torch.isfinite(losses).all() and losses[-4:].mean() < losses[:4].mean()
    assert 1.0 <= run["scale"] <= 2.0**16


@needs("lightning")
def test_lightning_ddp_two_devices(lightning_run, tmp_path):
    reason = lightning_run["ddp_skip_reason"]
    if reason:
        pytest.skip(reason)
    # Lightning's stores listen on every interface: their own network, where
    # a fixed port below the ephemeral range (32768-60999) cannot collide
    # with a port a Gloo pair or the first fit's connections took.
    run = run_script("lightning_train.py", tmp_path, "ddp", own_network=True, MASTER_PORT=29500)
    assert run["strategy"] == "DDPStrategy" and run["world_size"] == 2
    assert run["devices_seen"] == ["openreg:0"]  # rank 0's device
    # Gloo on the CPU and orccl on openreg reduce in the same order: equal.
    assert_same(run["openreg_losses"], run["cpu_losses"])
    assert_same_weights(run["openreg_weights"], run["cpu_weights"])


@needs("lightning")
def test_lightning_bad_devices(py):
    proc = py(
        """
        import lightning.pytorch as pl
        for devices in (3, 0, [0, 0], [5], "x"):
            try:
                pl.Trainer(accelerator="openreg", devices=devices, logger=False)
            except Exception as e:  # ours (ValueError, TypeError) or Lightning's own check
                print(type(e).__name__, e)
            else:
                print("accepted", devices)
        """
    )
    assert proc.returncode == 0, describe(proc)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 5 and not any(line.startswith("accepted") for line in lines), lines
    assert "devices=3, but there are 2 openreg devices" in lines[0]


# ---------------------------------------------------------------------------
# accelerate and the HF Trainer (through the migration shim)


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("hf")
    return run_script("hf_train.py", out_dir, out_dir / "trainer", OPENREG_DEVICE_COUNT=1)


@needs("accelerate", "transformers")
def test_accelerate_picks_openreg_and_matches_cpu(hf_run):
    cpu, dev, fp16 = (
        hf_run["accelerate_cpu"],
        hf_run["accelerate_openreg"],
        hf_run["accelerate_fp16"],
    )
    assert cpu["tensor_devices"] == ["cpu"]
    # accelerate chose "cuda" (the shim's torch.cuda), whose tensors are openreg's.
    assert dev["accelerator_device"] == "cuda"
    assert dev["tensor_devices"] == dev["param_devices"] == ["openreg:0"]
    assert_same(dev["losses"], cpu["losses"])
    assert_same_weights(dev["weights"], cpu["weights"])
    # fp16 autocast and a GradScaler on openreg: close to float32, not equal.
    assert fp16["scaler"] and fp16["param_devices"] == ["openreg:0"]
    assert fp16["losses"] != dev["losses"]
    assert_same(fp16["losses"], dev["losses"], rtol=0.1, atol=0.1)


@needs("accelerate", "transformers")
def test_hf_trainer_trains_on_openreg_like_cpu(hf_run):
    cpu, dev, fp16 = hf_run["trainer_cpu"], hf_run["trainer_openreg"], hf_run["trainer_fp16"]
    assert cpu["param_devices"] == ["cpu"] and cpu["n_gpu"] == 0
    assert dev["args_device"] == "cuda:0" and dev["n_gpu"] == 1
    assert dev["param_devices"] == ["openreg:0"]
    assert len(dev["losses"]) == len(cpu["losses"]) == 8
    assert_same(dev["losses"], cpu["losses"])
    assert_same_weights(dev["weights"], cpu["weights"])
    assert fp16["logits_dtypes"] == ["torch.float16"] and fp16["scaler"]
    assert_same(fp16["losses"], dev["losses"], rtol=1e-2, atol=1e-2)
