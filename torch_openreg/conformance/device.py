"""Device management: count, current device, lazy initialisation, fork.

The lazy-initialisation and fork checks observe one fresh interpreter
(``FRESH_PROBE``): the backend must not initialise itself on import or on
``device_count()``, must apply a seed set before initialisation, must work
in a child forked before initialisation, and must refuse (RuntimeError) in a
child forked after it, as CUDA does.
"""

from __future__ import annotations

import threading

import torch

from .core import Context, check, expect, expect_equal, expect_raises, topic

T = topic("device", "Device management")

# Runs in a fresh interpreter (Context.fresh); leaves its observations in `out`.
FRESH_PROBE = r"""
import signal

def in_child(fn):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        signal.alarm(60)
        try:
            res = fn()
        except BaseException as e:
            res = {"error": f"{type(e).__name__}: {e}"}
        os.write(w, json.dumps(res).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    return json.loads(data) if data else {"error": f"child died (wait status {status})"}

out["init_after_import"] = mod.is_initialized()
out["count"] = mod.device_count()
out["available"] = mod.is_available()
out["accelerator_count"] = torch.accelerator.device_count()
out["init_after_queries"] = mod.is_initialized()

def before_init():
    t = torch.arange(4.0, device=NAME) * 2
    return {"values": t.cpu().tolist()}

out["fork_before_init"] = in_child(before_init)
torch.manual_seed(1234)
out["init_after_seed"] = mod.is_initialized()
first = torch.rand(8, device=NAME).cpu().tolist()
out["init_after_tensor"] = mod.is_initialized()
out["current_at_start"] = [mod.current_device(), torch.accelerator.current_device_index()]
torch.manual_seed(1234)
out["seed_before_init_applied"] = first == torch.rand(8, device=NAME).cpu().tolist()

def after_init():
    r = {"initialized": mod.is_initialized()}
    try:
        torch.empty(1, device=NAME)
        r["device_use"] = "returned normally"
    except Exception as e:
        r["device_use"] = f"{type(e).__name__}: {e}"
    r["cpu_sum"] = torch.ones(3).sum().item()
    try:
        torch.manual_seed(1)
        r["manual_seed"] = "ok"
    except Exception as e:
        r["manual_seed"] = f"{type(e).__name__}: {e}"
    return r

out["fork_after_init"] = in_child(after_init)
"""


def probe(ctx: Context) -> dict:
    return ctx.fresh(FRESH_PROBE)


@check(T)
def count(ctx: Context) -> None:
    """device_count() is at least 1 and equals torch.accelerator.device_count()."""
    expect(ctx.module.device_count() >= 1, f"device_count() is {ctx.module.device_count()}")
    expect_equal(
        torch.accelerator.device_count(),
        ctx.module.device_count(),
        "torch.accelerator.device_count() vs device module",
    )


@check(T)
def is_available(ctx: Context) -> None:
    """is_available() is True in the device module and in torch.accelerator."""
    expect_equal(ctx.module.is_available(), True, "device module is_available()")
    expect_equal(torch.accelerator.is_available(), True, "torch.accelerator.is_available()")


@check(T)
def current_accelerator(ctx: Context) -> None:
    """torch.accelerator.current_accelerator() is torch.device(NAME)."""
    expect_equal(torch.accelerator.current_accelerator(), ctx.device(), "current_accelerator()")


@check(T)
def device_parsing(ctx: Context) -> None:
    """torch.device parses "NAME", "NAME:1" and (NAME, 1) like any device type."""
    d = torch.device(ctx.name)
    expect_equal((d.type, d.index), (ctx.name, None), "torch.device(NAME)")
    expect_equal(torch.device(f"{ctx.name}:1"), torch.device(ctx.name, 1), '"NAME:1" vs (NAME, 1)')
    expect_equal(torch.device(f"{ctx.name}:1").index, 1, "index of NAME:1")


@check(T)
def tensor_gets_current_index(ctx: Context) -> None:
    """A tensor created on device NAME (no index) lives on NAME:current_device()."""
    t = torch.empty(2, device=ctx.name)
    expect_equal(t.device, ctx.device(ctx.module.current_device()), "tensor.device")
    expect_equal(t.device.type, ctx.name, "tensor.device.type")
    expect_equal(t.is_cpu, False, "tensor.is_cpu")


@check(T)
def set_device_every_index(ctx: Context) -> None:
    """set_device(i) makes i current for the device module, torch.accelerator and new tensors."""
    for i in range(ctx.count):
        ctx.module.set_device(i)
        expect_equal(ctx.module.current_device(), i, f"current_device() after set_device({i})")
        expect_equal(
            torch.accelerator.current_device_index(), i, f"accelerator index after set_device({i})"
        )
        expect_equal(torch.empty(1, device=ctx.name).device.index, i, "index of a new tensor")


@check(T, devices=2)
def set_device_forms(ctx: Context) -> None:
    """set_device accepts an int, a torch.device and a "NAME:i" string."""
    for form in (1, torch.device(ctx.name, 1), f"{ctx.name}:1"):
        ctx.module.set_device(0)
        ctx.module.set_device(form)
        expect_equal(ctx.module.current_device(), 1, f"current_device() after set_device({form!r})")


@check(T)
def invalid_index_raises(ctx: Context) -> None:
    """An index >= device_count() raises RuntimeError (tensor creation, set_device,
    torch.accelerator.set_device_index) and leaves the current device unchanged."""
    bad = ctx.count
    before = ctx.module.current_device()
    expect_raises(RuntimeError, lambda: torch.empty(1, device=ctx.device(bad)), f"empty on :{bad}")
    expect_raises(RuntimeError, lambda: ctx.module.set_device(bad), f"set_device({bad})")
    expect_raises(
        RuntimeError,
        lambda: torch.accelerator.set_device_index(bad),
        f"torch.accelerator.set_device_index({bad})",
    )
    expect_equal(ctx.module.current_device(), before, "current device after the failed calls")


@check(T, devices=2)
def current_device_is_per_thread(ctx: Context) -> None:
    """The current device is per thread: a new thread starts on device 0 and its
    set_device does not change the creating thread's device."""
    ctx.module.set_device(1)
    seen: dict[str, object] = {}

    def worker() -> None:
        try:
            seen["start"] = ctx.module.current_device()
            ctx.module.set_device(0)
            seen["after"] = ctx.module.current_device()
        except Exception as e:  # reported below
            seen["error"] = f"{type(e).__name__}: {e}"

    t = threading.Thread(target=worker)
    t.start()
    t.join(60)
    expect("error" not in seen, f"the thread raised {seen.get('error')}")
    expect_equal(seen.get("start"), 0, "a new thread's current device")
    expect_equal(ctx.module.current_device(), 1, "main thread's device after the thread's set")


@check(T)
def no_init_on_import(ctx: Context) -> None:
    """A fresh process has not initialised the backend after `import torch` (lazy init)."""
    expect_equal(probe(ctx)["init_after_import"], False, "is_initialized() after import")


@check(T)
def queries_do_not_initialise(ctx: Context) -> None:
    """device_count() and is_available() answer without initialising the backend, with
    the same count as torch.accelerator."""
    p = probe(ctx)
    expect_equal(p["init_after_queries"], False, "is_initialized() after device_count()")
    expect_equal(p["count"], ctx.count, "device_count() in a fresh process")
    expect_equal(p["accelerator_count"], ctx.count, "torch.accelerator.device_count()")
    expect_equal(p["available"], True, "is_available() in a fresh process")


@check(T)
def first_use_initialises(ctx: Context) -> None:
    """The first tensor initialises the backend; device 0 is current at start."""
    p = probe(ctx)
    expect_equal(p["init_after_tensor"], True, "is_initialized() after the first tensor")
    expect_equal(p["current_at_start"], [0, 0], "current device (module, accelerator) at start")


@check(T)
def seed_before_init_is_kept(ctx: Context) -> None:
    """torch.manual_seed before initialisation does not initialise, and is applied
    when the backend initialises (same numbers as seeding after)."""
    p = probe(ctx)
    expect_equal(p["init_after_seed"], False, "is_initialized() after torch.manual_seed")
    expect_equal(p["seed_before_init_applied"], True, "rand after a seed set before init")


@check(T)
def fork_before_init_child_works(ctx: Context) -> None:
    """A child forked before initialisation can use the device."""
    child = probe(ctx)["fork_before_init"]
    expect("error" not in child, f"the child failed: {child.get('error')}")
    expect_equal(child["values"], [0.0, 2.0, 4.0, 6.0], "the child's computation")


@check(T)
def fork_after_init_refuses(ctx: Context) -> None:
    """In a child forked after initialisation, using the device raises RuntimeError
    mentioning the fork (CUDA: "Cannot re-initialize CUDA in forked subprocess")."""
    child = probe(ctx)["fork_after_init"]
    expect("error" not in child, f"the child failed: {child.get('error')}")
    use = child["device_use"]
    expect(use.startswith("RuntimeError:"), f"device use in the child: {use[:200]}")
    expect("fork" in use.lower(), f"the error does not mention the fork: {use[:200]}")


@check(T)
def fork_after_init_cpu_still_works(ctx: Context) -> None:
    """In a child forked after initialisation, CPU work and torch.manual_seed still
    work and is_initialized() is False."""
    child = probe(ctx)["fork_after_init"]
    expect("error" not in child, f"the child failed: {child.get('error')}")
    expect_equal(child["cpu_sum"], 3.0, "CPU computation in the child")
    expect_equal(child["manual_seed"], "ok", "torch.manual_seed in the child")
    expect_equal(child["initialized"], False, "is_initialized() in the child")


@check(T)
def init_is_idempotent(ctx: Context) -> None:
    """init() may be called again after initialisation; is_initialized() stays True."""
    ctx.module.init()
    ctx.module.init()
    expect_equal(ctx.module.is_initialized(), True, "is_initialized()")


@check(T)
def properties(ctx: Context) -> None:
    """get_device_properties(i) has a name and total_memory equal to the total of
    torch.accelerator.get_memory_info(i), for every device."""
    for i in range(ctx.count):
        props = ctx.module.get_device_properties(i)
        expect(isinstance(getattr(props, "name", None), str), f"device {i}: properties.name")
        total = getattr(props, "total_memory", None)
        expect(isinstance(total, int) and total > 0, f"device {i}: total_memory is {total!r}")
        free, acc_total = torch.accelerator.get_memory_info(i)
        expect_equal(acc_total, total, f"device {i}: get_memory_info total vs total_memory")
        expect(0 <= free <= total, f"device {i}: free {free} not within [0, {total}]")


@check(T)
def capability(ctx: Context) -> None:
    """get_device_capability() is a (major, minor) pair of ints; torch.accelerator's
    capability lists float32 among the supported dtypes."""
    cap = ctx.module.get_device_capability()
    expect(
        isinstance(cap, tuple) and len(cap) == 2 and all(isinstance(v, int) for v in cap),
        f"get_device_capability() is {cap!r}",
    )
    dtypes = torch.accelerator.get_device_capability().get("supported_dtypes", set())
    expect(
        torch.float32 in dtypes, f"supported_dtypes lacks torch.float32: {sorted(map(str, dtypes))}"
    )


@check(T)
def synchronize_every_device(ctx: Context) -> None:
    """synchronize(i) works for every device index, by int, torch.device and None."""
    for i in range(ctx.count):
        ctx.module.synchronize(i)
        ctx.module.synchronize(ctx.device(i))
    ctx.module.synchronize()
    ctx.module.synchronize(None)
