"""Serialization: ``torch.save``/``torch.load`` of device tensors (with and
without ``weights_only``), ``map_location`` in its forms, location tags,
storage sharing, backend metadata, pickle and deepcopy.
"""

from __future__ import annotations

import copy
import io
import pickle

import torch

from .core import Context, Skip, check, expect, expect_close, expect_equal, expect_raises, topic

T = topic("serialization", "Serialization")


def _round_trip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


@check(T)
def save_load_weights_only(ctx: Context) -> None:
    """torch.load(weights_only=True) of a saved device tensor gives the same values on
    the same device."""
    src = torch.arange(12.0).reshape(3, 4)
    back = _round_trip(src.to(ctx.name), weights_only=True)
    expect_equal(back.device, ctx.device(0), "loaded device")
    expect_close(back, src, "loaded values")


@check(T)
def save_load_full_pickle(ctx: Context) -> None:
    """torch.load(weights_only=False) of a dict holding device tensors restores it."""
    src = {"a": torch.ones(3, device=ctx.name), "b": [torch.zeros(2, device=ctx.name), 5]}
    back = _round_trip(src, weights_only=False)
    expect_equal(back["a"].device.type, ctx.name, "device of a")
    expect_equal(back["b"][1], 5, "non-tensor entry")
    expect_close(back["b"][0], torch.zeros(2), "values of b[0]")


@check(T)
def location_tag(ctx: Context) -> None:
    """torch.serialization.location_tag of a device tensor's storage is "NAME:index"."""
    t = torch.ones(2, device=ctx.name)
    expect_equal(
        torch.serialization.location_tag(t.untyped_storage()), f"{ctx.name}:0", "location tag"
    )


@check(T)
def map_location_cpu(ctx: Context) -> None:
    """map_location="cpu" loads device tensors onto the CPU."""
    src = torch.arange(5.0)
    back = _round_trip(src.to(ctx.name), map_location="cpu", weights_only=True)
    expect_equal(back.device, torch.device("cpu"), "device")
    expect_close(back, src, "values")


@check(T)
def map_location_to_device(ctx: Context) -> None:
    """map_location=NAME and torch.device(NAME, 0) load CPU tensors onto the device."""
    src = torch.arange(5.0)
    for loc in (ctx.name, ctx.device(0)):
        back = _round_trip(src, map_location=loc, weights_only=True)
        expect_equal(back.device, ctx.device(0), f"device with map_location={loc!r}")
        expect_close(back, src, "values")


@check(T, devices=2)
def map_location_other_index(ctx: Context) -> None:
    """A tensor saved from NAME:1 loads onto NAME:1; a dict map_location moves it to NAME:0."""
    t = torch.arange(3.0, device=ctx.device(1))
    expect_equal(_round_trip(t, weights_only=True).device, ctx.device(1), "default load")
    moved = _round_trip(t, map_location={f"{ctx.name}:1": f"{ctx.name}:0"}, weights_only=True)
    expect_equal(moved.device, ctx.device(0), "with a dict map_location")
    moved = _round_trip(
        t, map_location=lambda s, loc: s.to(device=ctx.device(0)), weights_only=True
    )
    expect_equal(moved.device, ctx.device(0), "with a callable map_location")


@check(T)
def missing_device_index_rejected(ctx: Context) -> None:
    """Loading onto NAME:device_count() raises RuntimeError."""
    expect_raises(
        RuntimeError,
        lambda: _round_trip(torch.ones(2), map_location=ctx.device(ctx.count), weights_only=True),
        f"map_location={ctx.name}:{ctx.count}",
    )


@check(T)
def shared_storage_preserved(ctx: Context) -> None:
    """Two views of one device storage still share it after a round trip."""
    base = torch.arange(10.0, device=ctx.name)
    a, b = _round_trip([base[:5], base[3:]], weights_only=True)
    expect_equal(a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr(), "storages")
    a[4] = -1
    expect_equal(b[1].item(), -1.0, "write through one view seen in the other")


@check(T)
def non_contiguous_and_offset(ctx: Context) -> None:
    """A transposed view with a storage offset keeps its strides and offset."""
    src = torch.arange(30.0).reshape(5, 6)
    view = src.to(ctx.name)[1:, 2:].t()
    back = _round_trip(view, weights_only=True)
    expect_equal(
        (back.stride(), back.storage_offset()), (view.stride(), view.storage_offset()), "layout"
    )
    expect_close(back, src[1:, 2:].t(), "values")


@check(T)
def module_state_dict(ctx: Context) -> None:
    """A model's state_dict saved from the device loads into a CPU model with
    map_location="cpu" and gives the same outputs."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8)).to(ctx.name)
    state = _round_trip(model.state_dict(), map_location="cpu", weights_only=True)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8))
    cpu.load_state_dict(state)
    cpu.eval()
    model.eval()
    x = torch.randn(3, 4)
    expect_close(model(x.to(ctx.name)), cpu(x), "outputs")


@check(T)
def optimizer_state(ctx: Context) -> None:
    """An Adam state_dict with device state round trips and resumes identically."""
    torch.manual_seed(0)
    w = torch.randn(5, device=ctx.name, requires_grad=True)
    opt = torch.optim.Adam([w], lr=0.1)
    w.sum().backward()
    opt.step()
    state = _round_trip(opt.state_dict(), weights_only=True)
    exp_avg = state["state"][0]["exp_avg"]
    expect_equal(exp_avg.device.type, ctx.name, "exp_avg device")
    expect_close(exp_avg, opt.state_dict()["state"][0]["exp_avg"], "exp_avg values")


@check(T)
def dtypes_round_trip(ctx: Context) -> None:
    """float16, bfloat16, int8, bool and complex64 device tensors round trip exactly."""
    for dtype in (torch.float16, torch.bfloat16, torch.int8, torch.bool, torch.complex64):
        src = torch.arange(-4, 4).to(dtype)
        back = _round_trip(src.to(ctx.name), weights_only=True)
        expect_equal(back.dtype, dtype, "dtype")
        expect(torch.equal(back.cpu(), src), f"{dtype} values differ")


@check(T)
def backend_metadata(ctx: Context) -> None:
    """The backend metadata PyTorch saves with a tensor (torch._C._get_tensor_metadata)
    comes back from torch.load, with and without weights_only."""
    t = torch.ones(4, device=ctx.name)
    meta = torch._C._get_tensor_metadata(t)
    if not meta:
        raise Skip("the backend attaches no metadata to a new tensor; nothing to round trip")
    for weights_only in (True, False):
        back = _round_trip(t, weights_only=weights_only)
        expect_equal(
            torch._C._get_tensor_metadata(back), meta, f"metadata (weights_only={weights_only})"
        )


@check(T)
def pickle_and_deepcopy(ctx: Context) -> None:
    """pickle and copy.deepcopy of a device tensor give an equal tensor on the device,
    not sharing memory."""
    t = torch.arange(6.0, device=ctx.name)
    for name, dup in (("pickle", pickle.loads(pickle.dumps(t))), ("deepcopy", copy.deepcopy(t))):
        expect_equal(dup.device, t.device, f"{name} device")
        expect(dup.data_ptr() != t.data_ptr(), f"{name} shares memory")
        expect_close(dup, torch.arange(6.0), f"{name} values")


@check(T)
def parameter_round_trip(ctx: Context) -> None:
    """An nn.Parameter on the device keeps its type and requires_grad through save/load."""
    p = torch.nn.Parameter(torch.ones(3, device=ctx.name))
    back = _round_trip(p, weights_only=True)
    expect(isinstance(back, torch.nn.Parameter), f"loaded a {type(back).__name__}")
    expect_equal((back.requires_grad, back.device), (True, ctx.device(0)), "requires_grad, device")
