"""The CUDA migration shim: CUDA scripts (tests/cuda_scripts/) run on openreg.

Each script is written for CUDA, with the usual ``torch.cuda.is_available()``
fallback to the CPU. The CPU reference runs in this process (no CUDA here, so
the scripts take their CPU path); the shim runs in a subprocess, through
``python -m torch_openreg.run`` or ``import torch_openreg.transfer_to_openreg``.
Data and initial weights come from the CPU generator, so both runs start from
the same values and must end with the same ones.
"""

import runpy
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import describe, run_python

SCRIPTS = Path(__file__).resolve().parent / "cuda_scripts"
NOTICE = "torch_openreg: CUDA is mapped to openreg"


def run_shim(args, cwd, timeout=150, **env):
    """``python *args`` (the shim's entry points) in a fresh interpreter."""
    env = {"OPENREG_FALLBACK_WARNINGS": 0, **env}
    return run_python(None, cwd, env=env, timeout=timeout, args=args)


def run_on_cpu(script, *args):
    """The script's CPU path, in this process (torch.cuda is unavailable here)."""
    saved = sys.argv
    sys.argv = [str(script), *map(str, args)]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = saved


def import_form(script, tmp_path):
    """A copy of the script whose first line imports the shim."""
    copy = tmp_path / f"imported_{script.name}"
    copy.write_text("import torch_openreg.transfer_to_openreg  # noqa\n" + script.read_text())
    return copy


@pytest.mark.parametrize("form", ["run", "import"])
def test_amp_dataloader_checkpoint_training_matches_cpu(tmp_path, form):
    script = SCRIPTS / "train_amp.py"
    (tmp_path / "cpu").mkdir()
    (tmp_path / "shim").mkdir()
    run_on_cpu(script, tmp_path / "cpu")
    if form == "run":
        proc = run_shim(["-m", "torch_openreg.run", str(script), "shim"], tmp_path)
    else:
        proc = run_shim([str(import_form(script, tmp_path)), "shim"], tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert proc.stderr.count(NOTICE) == 1, proc.stderr
    expected = torch.load(tmp_path / "cpu" / "result.pt")
    actual = torch.load(tmp_path / "shim" / "result.pt")
    assert expected["param_device"] == "cpu" and actual["param_device"] == "openreg:0"
    assert actual["memory_allocated"] > 0  # torch.cuda.memory_allocated() counted openreg's
    assert len(actual["losses"]) == 3 * 8
    # Same float16 autocast policy for these ops on both, same kernels: equal.
    torch.testing.assert_close(actual["losses"], expected["losses"])
    torch.testing.assert_close(actual["weights"], expected["weights"])
    assert actual["scale"] == expected["scale"]


def test_stream_overlap_idiom_matches_cpu(tmp_path):
    script = SCRIPTS / "overlap.py"
    run_on_cpu(script, tmp_path / "cpu.pt")
    proc = run_shim(["-m", "torch_openreg.run", str(script), "shim.pt"], tmp_path)
    assert proc.returncode == 0, describe(proc)
    expected = torch.load(tmp_path / "cpu.pt")
    actual = torch.load(tmp_path / "shim.pt")
    assert actual["device"] == "openreg:0"
    torch.testing.assert_close(actual["result"], expected["result"])


def test_every_device_entry_point(tmp_path):
    # A checkpoint as a CUDA machine writes it: storages tagged "cuda:1".
    registry = torch.serialization._package_registry
    entry = (-1, lambda storage: "cuda:1" if storage.device.type == "cpu" else None, None)
    registry.insert(0, entry)
    try:
        torch.save({"w": torch.tensor([1.0, 2.0])}, tmp_path / "cuda_tagged.pt")
    finally:
        registry.remove(entry)
    proc = run_shim([str(SCRIPTS / "entry_points.py"), str(tmp_path)], tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.strip().endswith("OK"), describe(proc)
    assert proc.stderr.count(NOTICE) == 1, proc.stderr


def test_cuda_only_api_raises_naming_the_call(tmp_path):
    proc = run_shim(["-m", "torch_openreg.run", str(SCRIPTS / "cuda_graph.py")], tmp_path)
    assert proc.returncode == 1, describe(proc)
    assert "replayed" not in proc.stdout
    assert "CudaApiNotSupportedError: torch.cuda.CUDAGraph is CUDA-specific" in proc.stderr, (
        describe(proc)
    )


def test_spawned_worker_inherits_the_shim(tmp_path):
    proc = run_shim(["-m", "torch_openreg.run", str(SCRIPTS / "spawn_worker.py")], tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.split("\n")[0] == "openreg:0 [0.0, 2.0, 4.0, 6.0] 2", describe(proc)
    assert proc.stderr.count(NOTICE) == 1, proc.stderr  # the worker stays quiet


def test_run_usage_errors(tmp_path):
    proc = run_shim(["-m", "torch_openreg.run"], tmp_path, timeout=60)
    assert proc.returncode == 2 and "usage: python -m torch_openreg.run" in proc.stderr
    proc = run_shim(["-m", "torch_openreg.run", str(tmp_path / "missing.py")], tmp_path, 60)
    assert proc.returncode == 1 and "missing.py" in proc.stderr, describe(proc)


def test_compiled_training_matches_cpu(tmp_path):
    script = SCRIPTS / "compile_train.py"
    run_on_cpu(script, tmp_path / "cpu.pt")
    proc = run_shim(
        ["-m", "torch_openreg.run", str(script), "shim.pt"],
        tmp_path,
        timeout=170,
        TORCHINDUCTOR_CACHE_DIR=tmp_path / "inductor",
    )
    assert proc.returncode == 0, describe(proc)
    expected = torch.load(tmp_path / "cpu.pt")
    actual = torch.load(tmp_path / "shim.pt")
    assert actual["device"] == "openreg:0"
    torch.testing.assert_close(actual["losses"], expected["losses"])
    torch.testing.assert_close(actual["weights"], expected["weights"])


def test_cuda_edges_under_the_shim(tmp_path):
    proc = run_shim(
        ["-m", "torch_openreg.run", str(SCRIPTS / "shim_edges.py"), str(tmp_path)], tmp_path
    )
    assert proc.returncode == 0, describe(proc)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["patch"] == "patched patched True", describe(proc)
    assert lines["arch"] == "[] ''"
    assert lines["generator"] == "openreg:0 True True"
    # autocast ran in float16; two FutureWarnings, naming what the user wrote.
    assert lines["amp"] == "torch.float16 2 True", describe(proc)
    assert lines["snapshot"] == "True True True", describe(proc)


def test_a_scripted_module_with_autocast_compiles_under_the_shim(tmp_path):
    # The shim's wrappers of torch.set_autocast_enabled & co. stay TorchScript's
    # builtin operators (torch.autocast's methods call them). TorchScript's own
    # autocast pass knows CUDA and the CPU only: inside a scripted region the
    # CUDA autocast state is set, so openreg's operators keep float32 there
    # (docs/migration.md).
    script = tmp_path / "scripted_autocast.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch

            class M(torch.nn.Module):
                def forward(self, x):
                    with torch.autocast("cuda", dtype=torch.float16):
                        return x @ x

            x = torch.ones(2, 2, device="cuda")
            scripted = torch.jit.script(M())
            print("scripted", scripted(x).dtype, M()(x).dtype)
            """
        )
    )
    proc = run_shim(["-m", "torch_openreg.run", str(script)], tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert "scripted torch.float32 torch.float16" in proc.stdout, describe(proc)


def test_fullgraph_compile_under_the_shim(tmp_path):
    # Found by the third-party slice (make thirdparty, roma's tests): under
    # the shim, torch.compile(fullgraph=True) failed on a Tensor method
    # written in Python (Tensor.unflatten: Dynamo could not trace its super()
    # call through the shim's torch-function mode), and on
    # torch.is_autocast_enabled, whose wrapper Dynamo did not fold.
    script = tmp_path / "fullgraph.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch

            def f(x):
                if torch.is_autocast_enabled(x.device.type):
                    x = x.float()
                return torch.stack([x, x * 2], dim=-1).flatten(-2).unflatten(-1, (4, 2))

            x = torch.randn(3, 4, device="cuda")
            g = torch.compile(f, fullgraph=True, backend="aot_eager")
            print("values", torch.equal(g(x).cpu(), f(x.cpu())), g(x).device)
            with torch.autocast("cuda", dtype=torch.float16):
                print("autocast", g(x.half()).dtype)
            """
        )
    )
    proc = run_shim(
        ["-m", "torch_openreg.run", str(script)],
        tmp_path,
        timeout=170,
        TORCHINDUCTOR_CACHE_DIR=tmp_path / "inductor",
    )
    assert proc.returncode == 0, describe(proc)
    assert "values True openreg:0" in proc.stdout, describe(proc)
    # x.device.type is "openreg": the shim's documented caveat, so the
    # autocast branch (which asks about "openreg") is taken, as on CUDA.
    assert "autocast torch.float32" in proc.stdout, describe(proc)
