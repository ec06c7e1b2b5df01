"""The device module (``torch.get_device_module(NAME)``) against ``torch.cuda``'s
device-agnostic API: the functions code written for CUDA calls through
``torch.get_device_module(device)`` exist and accept the same parameters
(same names, kinds and order; extra parameters must have defaults), and the
classes and context managers behave alike.

The names are the part of ``torch.cuda`` that means the same on any
accelerator (no CUDA libraries, graphs, IPC, NVTX or sensors); PyTorch itself
calls several of them on a PrivateUse1 module (``torch.random`` calls
``manual_seed_all``, ``get_rng_state``, ``set_rng_state``, ``device_count``
and ``_is_in_bad_fork``).
"""

from __future__ import annotations

import inspect

import torch

from .core import Context, check, expect, expect_close, expect_equal, topic

T = topic("device_module", "Device module vs torch.cuda")

FUNCTIONS = (
    "is_available",
    "device_count",
    "current_device",
    "set_device",
    "synchronize",
    "is_initialized",
    "init",
    "get_device_name",
    "get_device_capability",
    "get_device_properties",
    "is_bf16_supported",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "initial_seed",
    "get_rng_state",
    "set_rng_state",
    "get_rng_state_all",
    "set_rng_state_all",
    "current_stream",
    "default_stream",
    "set_stream",
    "stream",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_stats",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "empty_cache",
    "mem_get_info",
    "_is_in_bad_fork",
    "_lazy_init",
)
CLASSES = ("device", "device_of", "Stream", "Event", "StreamContext")


def _params(obj) -> list[inspect.Parameter] | None:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return None
    if inspect.isclass(obj) and params and params[0].name == "self":
        params = params[1:]
    return [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _compatible(cuda_obj, ours) -> str | None:
    """None if `ours` accepts every call `cuda_obj`'s signature allows, else why not."""
    want, have = _params(cuda_obj), _params(ours)
    if want is None:
        return None  # no signature to compare (a builtin)
    if have is None:
        return "its signature cannot be read"
    by_name = {p.name: p for p in have}
    positional = [p.name for p in have if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_kwargs = _takes(ours, inspect.Parameter.VAR_KEYWORD)
    takes_args = _takes(ours, inspect.Parameter.VAR_POSITIONAL)
    for i, p in enumerate(want):
        q = by_name.get(p.name)
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            if i >= len(positional) and not takes_args:
                return f"parameter {p.name!r} cannot be passed by position {i}"
            if i < len(positional) and positional[i] != p.name and p.kind != p.POSITIONAL_ONLY:
                return f"position {i} is {positional[i]!r}, torch.cuda has {p.name!r}"
        if q is None and p.kind != p.POSITIONAL_ONLY and not takes_kwargs:
            return f"no parameter {p.name!r}"
        if q is not None and p.default is not p.empty and q.default is q.empty:
            return f"parameter {p.name!r} has no default (torch.cuda's is {p.default!r})"
    wanted = {p.name for p in want}
    extra = [q.name for q in have if q.name not in wanted and q.default is q.empty]
    if extra:
        return f"extra required parameters {extra}"
    return None


def _takes(obj, kind) -> bool:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        return any(p.kind == kind for p in inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return False


def _register(name: str) -> None:
    def fn(ctx: Context) -> None:
        ours = getattr(ctx.module, name, None)
        expect(ours is not None, f"the device module has no {name}")
        expect(callable(ours), f"{name} is not callable")
        cuda_obj = getattr(torch.cuda, name, None)
        if cuda_obj is not None:
            problem = _compatible(cuda_obj, ours)
            expect(problem is None, f"{name}: {problem}")

    fn.__name__ = "private" + name if name.startswith("_") else name
    what = "class" if name[0].isupper() or name in ("device", "device_of") else "function"
    fn.__doc__ = f"{name} exists ({what}) and accepts torch.cuda.{name}'s parameters."
    check(T)(fn)


for _name in FUNCTIONS + CLASSES:
    _register(_name)


@check(T)
def stream_is_torch_stream(ctx: Context) -> None:
    """The module's Stream() is a torch.Stream on the current device; current_stream()
    and default_stream() are torch.Streams equal to torch.accelerator's."""
    s = ctx.module.Stream()
    expect(isinstance(s, torch.Stream), f"Stream() is a {type(s).__mro__}")
    expect_equal(s.device, ctx.device(0), "Stream().device")
    expect_equal(
        ctx.module.current_stream(), torch.accelerator.current_stream(), "current_stream()"
    )
    expect(isinstance(ctx.module.default_stream(), torch.Stream), "default_stream() type")


@check(T)
def stream_context_manager(ctx: Context) -> None:
    """module.stream(s) makes s current inside and restores after; stream(None) is a no-op."""
    before = ctx.module.current_stream()
    s = ctx.module.Stream()
    with ctx.module.stream(s):
        expect_equal(ctx.module.current_stream(), s, "inside stream(s)")
    expect_equal(ctx.module.current_stream(), before, "after stream(s)")
    with ctx.module.stream(None):
        expect_equal(ctx.module.current_stream(), before, "inside stream(None)")


@check(T)
def event_api(ctx: Context) -> None:
    """module.Event(enable_timing=True) records, synchronizes, queries and times like
    torch.cuda.Event."""
    start = ctx.module.Event(enable_timing=True)
    end = ctx.module.Event(enable_timing=True)
    start.record()
    ctx.busy(256, steps=4)
    end.record()
    end.synchronize()
    expect_equal(end.query(), True, "query() after synchronize()")
    ms = start.elapsed_time(end)
    expect(isinstance(ms, float) and ms > 0, f"elapsed_time is {ms!r}")


@check(T)
def device_context(ctx: Context) -> None:
    """module.device(i) is a context manager that switches and restores the device."""
    last = ctx.count - 1
    with ctx.module.device(last):
        expect_equal(ctx.module.current_device(), last, "inside")
    expect_equal(ctx.module.current_device(), 0, "after")


@check(T)
def device_of_cpu_noop(ctx: Context) -> None:
    """module.device_of(cpu_tensor) changes nothing (as torch.cuda.device_of)."""
    with ctx.module.device_of(torch.ones(1)):
        expect_equal(ctx.module.current_device(), 0, "inside device_of(CPU tensor)")


@check(T)
def rng_state_module_matches_generator(ctx: Context) -> None:
    """module.get_rng_state(i) equals torch.Generator state of the device's default
    generator replay (set_rng_state(state, i) then draws repeat)."""
    last = ctx.count - 1
    state = ctx.module.get_rng_state(last)
    a = torch.rand(8, device=ctx.device(last)).cpu()
    ctx.module.set_rng_state(state, last)
    expect_close(torch.rand(8, device=ctx.device(last)), a, "draws after set_rng_state")


@check(T)
def memory_functions_agree(ctx: Context) -> None:
    """The module's memory_allocated(i)/memory_reserved(i)/memory_stats(i) equal
    torch.accelerator's for every device."""
    for i in range(ctx.count):
        for fn in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
            expect_equal(
                getattr(ctx.module, fn)(i), getattr(torch.accelerator, fn)(i), f"{fn}({i})"
            )
        expect_equal(
            ctx.module.memory_stats(i)["allocated_bytes.all.current"],
            torch.accelerator.memory_stats(i)["allocated_bytes.all.current"],
            f"memory_stats({i})",
        )


@check(T)
def not_in_bad_fork(ctx: Context) -> None:
    """_is_in_bad_fork() is False in the process that initialised the backend."""
    expect_equal(ctx.module._is_in_bad_fork(), False, "_is_in_bad_fork()")
