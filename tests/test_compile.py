"""torch.compile on openreg: the Dynamo device interface, the Inductor backend
(Inductor's C++ kernels launched on the openreg stream through
csrc/inductor/), a zoo of models compiled vs eager (and vs compiled on the
CPU), forward and backward, the code cache across processes, and the clear
errors for what is not supported.

Inductor writes its code cache in the session's temporary directory
(conftest.py, ``inductor_cache``). Compile times are kept small with small
models.
"""

import copy
import json
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import describe, run_python

from torch_openreg import _C

D = "openreg"
BLOCKING = os.environ.get("OPENREG_LAUNCH_BLOCKING") == "1"


@pytest.fixture(scope="module", autouse=True)
def _inductor_cache(inductor_cache):
    return inductor_cache


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def close(actual, expected, **kw):
    torch.testing.assert_close(actual.cpu(), expected.cpu(), **kw)


# ---------------------------------------------------------------------------
# Registration


def test_dynamo_device_interface():
    from torch._dynamo.device_interface import get_interface_for_device

    iface = get_interface_for_device("openreg")
    assert get_interface_for_device("openreg:1") is iface
    assert get_interface_for_device(torch.device("openreg", 0)) is iface
    assert iface.is_available() and iface.device_count() == 2
    assert iface.current_device() == 0
    with iface.device(1):
        assert iface.current_device() == 1 == torch.openreg.current_device()
    assert iface.current_device() == 0
    assert iface.exchange_device(1) == 0 and iface.current_device() == 1
    assert iface.maybe_exchange_device(0) == 1 and iface.current_device() == 0
    assert iface.maybe_exchange_device(-1) == -1 and iface.current_device() == 0
    props = iface.get_device_properties(1)
    assert props.total_memory == torch.openreg.get_device_properties(1).total_memory
    assert iface.Worker.get_device_properties(0).name == props.name
    major, minor = torch.openreg.get_device_capability()
    assert iface.get_compute_capability() == major * 10 + minor
    assert not iface.is_triton_capable()
    assert iface.is_bf16_supported()
    stream = iface.Stream()
    assert isinstance(stream, torch.Stream) and stream.device.type == D
    with iface.stream(stream):
        assert iface.current_stream() == stream
        x = torch.ones(1000, device=D) * 3
    event = iface.Event()
    event.record(stream)
    iface.synchronize()
    assert event.query()
    assert iface.get_raw_stream(0) != iface.get_raw_stream(1)
    assert iface.memory_allocated() == torch.openreg.memory_allocated()
    assert x.sum().item() == 3000


def test_inductor_backend_is_registered():
    from torch._inductor.codegen.common import (
        get_device_op_overrides,
        get_scheduling_for_device,
        get_wrapper_codegen_for_device,
    )

    from torch_openreg.compile import backend

    assert get_scheduling_for_device(D) is backend.Scheduling
    assert get_wrapper_codegen_for_device(D).supports_caching
    ops = get_device_op_overrides(D)
    assert ops.device_guard(1) == "torch.openreg.device(1)"
    assert ops.synchronize() == "torch.openreg.synchronize()"


def test_the_generated_kernel_entry_point():
    from torch_openreg.compile import inductor

    types = ["const float*", "float*", "const int64_t", "const float"]
    assert inductor.kernel_signature(types) == "rpif"
    entry = inductor.launch_entry(types)
    assert 'extern "C" void openreg_launch(void* const* params)' in entry
    assert "*static_cast<const float* const*>(params[0])" in entry
    assert "*static_cast<const int64_t*>(params[2])" in entry
    with pytest.raises(NotImplementedError, match="argument type 'const double'"):
        inductor.kernel_signature(["const double"])


# ---------------------------------------------------------------------------
# The model zoo: compiled vs eager on openreg, and vs compiled on the CPU


class Block(nn.Module):
    """A pre-norm transformer block with causal scaled dot product attention."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.ff(self.ln2(x))


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def cnn():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 10),
    )


ZOO = {
    "mlp": (mlp, lambda: torch.randn(8, 16), lambda: torch.randn(8, 4), F.mse_loss),
    "cnn_batchnorm": (
        cnn,
        lambda: torch.randn(4, 3, 8, 8),
        lambda: torch.randint(0, 10, (4,)),
        F.cross_entropy,
    ),
    "transformer_sdpa": (
        Block,
        lambda: torch.randn(2, 8, 32),
        lambda: torch.randn(2, 8, 32),
        F.mse_loss,
    ),
}


def train_steps(model, device, x, y, loss_fn, compiled, steps=2):
    """Two training steps (forward, backward, SGD); outputs, grads and buffers of each."""
    model = copy.deepcopy(model).to(device)
    run = torch.compile(model, fullgraph=True) if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trace = []
    for _ in range(steps):
        opt.zero_grad()
        out = run(x.to(device))
        loss_fn(out, y.to(device)).backward()
        trace.append(("out", out.detach().cpu()))
        trace += [(f"grad {n}", p.grad.cpu()) for n, p in model.named_parameters()]
        opt.step()
    trace += [(f"buffer {n}", b.cpu()) for n, b in model.named_buffers()]
    trace += [(f"param {n}", p.detach().cpu()) for n, p in model.named_parameters()]
    return trace


@pytest.mark.parametrize("name", ZOO)
def test_zoo_training_compiled_equals_eager_and_compiled_cpu(name):
    make, make_x, make_y, loss_fn = ZOO[name]
    torch.manual_seed(0)
    model, x, y = make(), make_x(), make_y()
    compiled = train_steps(model, D, x, y, loss_fn, compiled=True)
    eager = train_steps(model, D, x, y, loss_fn, compiled=False)
    compiled_cpu = train_steps(model, "cpu", x, y, loss_fn, compiled=True)
    for (what, c), (_, e), (_, cc) in zip(compiled, eager, compiled_cpu, strict=True):
        close(c, e, rtol=1e-4, atol=1e-5, msg=lambda m, w=what: f"{name} {w} vs eager: {m}")
        close(c, cc, rtol=1e-4, atol=1e-5, msg=lambda m, w=what: f"{name} {w} vs CPU: {m}")
    if name == "cnn_batchnorm":  # the running statistics were updated, as in eager
        stats = dict(compiled)
        assert stats["buffer 1.num_batches_tracked"].item() == 2


def test_dynamic_shapes_over_several_sizes():
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)).to(D)
    run = torch.compile(model, dynamic=True)
    for n in (3, 5, 8, 13):
        x = torch.randn(n, 16, device=D, requires_grad=True)
        out = run(x)
        out.sum().backward()
        gx = x.grad.clone()
        x.grad = None
        expected = model(x)
        expected.sum().backward()
        close(out, expected, rtol=1e-5, atol=1e-6)
        close(gx, x.grad, rtol=1e-5, atol=1e-6)
    counters = torch._dynamo.utils.counters["stats"]
    assert counters["unique_graphs"] <= 2  # one graph served every size


def test_dropout_same_seed_same_mask():
    def fn(x):
        return F.dropout(x, 0.5, training=True) * 3

    run = torch.compile(fn)
    x = torch.ones(4096, device=D)
    torch.manual_seed(123)
    first = run(x).cpu()
    torch.manual_seed(123)
    again = run(x).cpu()
    torch.manual_seed(124)
    other = run(x).cpu()
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    kept = (first != 0).float().mean().item()
    assert 0.45 < kept < 0.55
    assert set(first.unique().tolist()) == {0.0, 6.0}  # kept values scaled by 1 / (1 - p)
    # A generator of openreg:1 drives compiled code on openreg:1.
    torch.openreg.manual_seed_all(5)
    on_one = run(torch.ones(4096, device="openreg:1")).cpu()
    torch.openreg.manual_seed_all(5)
    assert torch.equal(on_one, run(torch.ones(4096, device="openreg:1")).cpu())


def test_compiled_optimizer_step_equals_eager():
    torch.manual_seed(0)
    model = nn.Linear(8, 4).to(D)
    twin = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    twin_opt = torch.optim.Adam(twin.parameters(), lr=0.1)

    @torch.compile
    def step():
        opt.step()

    for _ in range(3):
        for p, q in zip(model.parameters(), twin.parameters(), strict=True):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        step()
        twin_opt.step()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        close(p, q)
    for s, t in zip(opt.state.values(), twin_opt.state.values(), strict=True):
        close(s["exp_avg_sq"], t["exp_avg_sq"])
        assert s["step"].item() == t["step"].item() == 3


def test_fullgraph_pointwise_and_reductions_on_openreg_1():
    def fn(x, y):
        return (x.sin() * y).sum(1).relu() + x.mean(), (x @ y.T).softmax(-1)

    run = torch.compile(fn, fullgraph=True)
    x, y = torch.randn(6, 5), torch.randn(6, 5)
    with torch.openreg.device(0):  # the current device is not the tensors'
        a, b = run(x.to("openreg:1"), y.to("openreg:1"))
    assert a.device == torch.device("openreg:1") and b.device == torch.device("openreg:1")
    ea, eb = fn(x, y)
    close(a, ea)
    close(b, eb)


def test_custom_op_compiles_under_inductor():
    def fn(t):
        return torch.ops.openreg.scaled_abs(t, 3.0) + t.sin()

    run = torch.compile(fn, fullgraph=True)
    x = torch.randn(16)
    close(run(x.to(D)), fn(x))


# ---------------------------------------------------------------------------
# The device model: streams, run-ahead, deferred errors


@pytest.mark.skipif(BLOCKING, reason="launches wait in blocking mode")
def test_compiled_kernels_are_queued_on_the_current_stream():
    @torch.compile
    def scale_(x):
        x.mul_(1.0001)

    x = torch.ones(4 * 2**20, device=D)
    scale_(x)  # compile
    side = torch.openreg.Stream()
    side.wait_stream(torch.openreg.current_stream())
    torch.openreg.synchronize()
    with torch.openreg.stream(side):
        for _ in range(40):
            scale_(x)
    pending = not side.query()
    assert torch.openreg.current_stream().query()  # nothing went to the default stream
    torch.openreg.synchronize()
    assert pending, "40 compiled passes over 16 MB finished before the host returned"
    close(x[:4], torch.full((4,), 1.0001**41), rtol=1e-5, atol=0)


def test_compiled_kernels_are_ordered_by_events_between_streams():
    run = torch.compile(lambda x: x * 2 + 1)
    torch.manual_seed(0)
    x = torch.randn(2**20, device=D)
    run(x)  # compile
    side = torch.openreg.Stream()
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        y = run(x)
        done = torch.openreg.Event()
        done.record()
    torch.openreg.current_stream().wait_event(done)
    total = run(y).sum()  # on the default stream, after the event
    close(total, ((x.cpu() * 2 + 1) * 2 + 1).sum(), rtol=1e-4, atol=1e-2)


def test_kernel_error_is_raised_naming_the_compiled_kernel():
    run = torch.compile(lambda a, b: a // b)
    a = torch.arange(8, device=D)
    # Raised at the next synchronization, naming the kernel (with
    # OPENREG_LAUNCH_BLOCKING=1 at the call, from the generated wrapper line).
    name = "" if BLOCKING else r"cpp_fused_floor_divide\w*' failed.*"
    with pytest.raises(RuntimeError, match=name + "ZeroDivisionError"):
        run(a, torch.zeros(8, dtype=torch.long, device=D))
        torch.openreg.synchronize()
    # The stream stays usable.
    close(run(a, torch.full((8,), 2, device=D)), torch.arange(8) // 2)


def test_compiled_kernels_in_the_profiler():
    from torch.profiler import ProfilerActivity, profile

    run = torch.compile(lambda x: (x * 2).cos().sum())
    x = torch.randn(100, device=D)
    run(x)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        run(x)
        torch.openreg.synchronize()
    # The launch on the host (an operator of its own) and the kernel on the
    # device ("[kernel]" when queued, "[sync]" with OPENREG_LAUNCH_BLOCKING=1).
    host = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    device = [e.name for e in prof.events() if e.device_type != torch.autograd.DeviceType.CPU]
    assert any(n.startswith("cpp_fused_cos_mul_sum") for n in host), host
    assert any(n.startswith("cpp_fused_cos_mul_sum") for n in device), device


def test_openreg_runtime_calls_in_a_compiled_function_run_eagerly():
    side = torch.openreg.Stream()

    def fn(x):
        y = x.sin()
        torch.openreg.synchronize()
        with torch.random.fork_rng(device_type="openreg"):
            torch.manual_seed(0)
            noise = torch.rand(x.shape, device=x.device)
        with torch.openreg.stream(side):
            z = y * 2
        side.synchronize()
        return z + noise * 0

    x = torch.randn(32, device=D)
    close(torch.compile(fn)(x), x.cpu().sin() * 2)


# ---------------------------------------------------------------------------
# What is not supported says so


def test_cpp_wrapper_and_aot_inductor_are_refused_clearly():
    run = torch.compile(lambda x: x.sin() + 1, options={"cpp_wrapper": True})
    with pytest.raises(Exception, match="openreg: Inductor's C\\+\\+ wrapper .* not supported"):
        run(torch.randn(4, device=D))


def test_events_inside_a_compiled_region_are_refused_clearly():
    def fn(x):
        event = torch.Event(device=D)
        y = x + 1
        event.record()
        event.synchronize()
        return y * 2

    with pytest.raises(Exception, match="openreg: torch.compile does not support streams"):
        torch.compile(fn)(torch.randn(4, device=D))


# ---------------------------------------------------------------------------
# The compiled-kernel launcher (_C._CompiledKernel) on its own

SOURCE = r"""
extern "C" void kernel(const float* scale, float* out, const int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = out[i] * scale[0] + 1.0f;
}
"""


@pytest.fixture(scope="module")
def launcher():
    from torch._inductor.async_compile import AsyncCompile

    from torch_openreg.compile import inductor, kernels

    types = ["const float*", "float*", "const int64_t"]
    source = SOURCE + inductor.launch_entry(types)
    kernel = kernels.compile_kernel(
        AsyncCompile(), "test_kernel", inductor.kernel_signature(types), source
    )
    return kernel.result() if hasattr(kernel, "result") else kernel


def test_launcher_runs_with_kernel_view_pointers(launcher):
    assert launcher.name == "test_kernel" and launcher.signature == "rpi"
    out = torch.arange(6.0, device=D)
    launcher(torch.full((1,), 2.0, device=D), out, 6)
    close(out, torch.arange(6.0) * 2 + 1)
    launcher(torch.full((1,), 2.0, device=D), out[2:], 2)  # a view: its own offset
    close(out, torch.tensor([1.0, 3.0, 11.0, 15.0, 9.0, 11.0]))


def test_launcher_passes_cpu_scalars_by_value_at_launch(launcher):
    out = torch.ones(4 * 2**20, device=D)
    scale = torch.tensor(2.0)  # one element on the CPU, read by the kernel
    for _ in range(20):
        out.mul_(1.0)  # keep the stream busy
    launcher(scale, out, 4)
    scale.fill_(100.0)  # after the launch: the kernel must not see it
    close(out[:4], torch.full((4,), 3.0))


def test_launcher_rejects_bad_arguments(launcher):
    out = torch.zeros(4, device=D)
    one = torch.ones(1, device=D)
    with pytest.raises(RuntimeError, match="takes 3 arguments .*got 2"):
        launcher(one, out)
    with pytest.raises(RuntimeError, match="argument 0 must be a tensor, got float"):
        launcher(1.0, out, 4)
    with pytest.raises(RuntimeError, match="argument 2 must be an int, got float"):
        launcher(one, out, 4.0)
    with pytest.raises(RuntimeError, match="argument 1 is a cpu tensor of 4 elements that"):
        launcher(one, torch.zeros(4), 4)
    with pytest.raises(RuntimeError, match="argument 0 is a cpu tensor of 3 elements"):
        launcher(torch.ones(3), out, 4)
    with pytest.raises(RuntimeError, match="argument 1 is on openreg:1 but argument 0"):
        launcher(one, out.to("openreg:1"), 4)
    with pytest.raises(RuntimeError, match="bad signature 'rx'"):
        _C._CompiledKernel("k", "/lib.so", "openreg_launch", "rx")
    with pytest.raises(RuntimeError, match="no library path or symbol"):
        _C._CompiledKernel("k", "", "openreg_launch", "r")
    assert torch.equal(out.cpu(), torch.zeros(4))  # nothing ran


def test_launcher_of_a_missing_library_fails_on_the_device(tmp_path):
    # The device loads the library by path when the kernel runs: a library
    # gone by then is the kernel's failure, raised at the synchronization
    # with the path (at the launch with OPENREG_LAUNCH_BLOCKING=1), and the
    # stream goes on.
    kernel = _C._CompiledKernel("k_gone", str(tmp_path / "gone.so"), "openreg_launch", "p")
    out = torch.zeros(4, device=D)
    with pytest.raises(
        RuntimeError, match=r"k_gone.*cannot load the compiled kernel library '.*gone\.so'"
    ):
        kernel(out)
        torch.openreg.synchronize()
    close(out + 1, torch.ones(4))


# ---------------------------------------------------------------------------
# The code cache across processes

CACHED_PROGRAM = """
import json, sys, torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

def fn(x):
    return F.dropout(x.sin(), 0.5, training=True) * 7 + 1

torch.manual_seed(42)
out = torch.compile(fn)(torch.ones(512, device="openreg"))
torch.save(out.cpu(), sys.argv[1])
print(json.dumps(dict(counters["inductor"])))
"""


def test_code_cache_is_hit_by_a_second_process(tmp_path, inductor_cache):
    script = tmp_path / "program.py"
    script.write_text(CACHED_PROGRAM)
    env = {"TORCHINDUCTOR_CACHE_DIR": str(inductor_cache), "OPENREG_FALLBACK_WARNINGS": "0"}
    if BLOCKING:
        env["OPENREG_LAUNCH_BLOCKING"] = "1"
    runs = []
    for name in ("first", "second"):
        proc = run_python(
            f"import runpy, sys; sys.argv = ['p', {str(tmp_path / name)!r}]; "
            f"runpy.run_path({str(script)!r}, run_name='__main__')",
            cwd=tmp_path,
            env=env,
            timeout=170,
        )
        assert proc.returncode == 0, describe(proc)
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first.get("fxgraph_cache_miss", 0) >= 1, first
    assert second.get("fxgraph_cache_hit", 0) >= 1 and not second.get("fxgraph_cache_miss"), second
    # Same seed, same dropout mask, in another process.
    assert torch.equal(torch.load(tmp_path / "first"), torch.load(tmp_path / "second"))
