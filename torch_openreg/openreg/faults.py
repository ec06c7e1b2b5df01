"""Faults on demand: make the failures of real accelerators happen on purpose.

Each fault is injected where the real one arises (the caching allocator, the
stream worker, the driver, the collective) and reaches the program through
the same path, so a test exercises the program's own error handling:

- ``fail_allocation(device=0, after=0, min_bytes=0)``: the matching device
  allocation raises ``torch.OutOfMemoryError`` as a full device makes it
  (the caching allocator frees its cache and retries first; ``num_ooms`` and
  ``num_alloc_retries`` count it; CUDA's message).
- ``fail_kernel(op="aten::mm", device=0, after=0, sticky=False)``: the
  matching kernel fails on the device; the next synchronization raises
  ``torch.AcceleratorError`` naming the op. ``sticky=True`` is CUDA's
  illegal-address error: every later call on that device raises it, until
  the process ends; other devices keep working.
- ``lose_device(device)``: the device is lost, as after a hardware fault:
  its queued work is dropped and every call that uses it raises
  ``torch.AcceleratorError``; other devices keep working.
- ``crash_device(device, how="segfault")``: a kernel crashes the device's
  process (``OPENREG_DRIVER=process`` only): the device is lost as above,
  and the reason names the signal and the kernel.
- ``warn_on_device(message, device=0)``: a kernel on the device's current
  stream gives ``message`` as a warning, as a kernel that warns on purpose
  would; the next synchronization of the device or one of its streams
  raises it as a Python ``UserWarning``, once.
- ``delay_kernels(device=None, stream=None, max_us=1000, seed=0)``: kernels
  start late by seeded random amounts: a missing ``wait_stream``,
  ``record_stream`` or event wait then gives wrong values reproducibly.
- ``fail_collective(op="allreduce", rank=1, after=0, mode="error")``: that
  rank's part of a collective fails (``"error"``) or never arrives
  (``"hang"``): the other ranks get Gloo's timeout error within the group's
  timeout.

Every function arms its fault at once and returns it; used as a context
manager, the fault is disarmed when the block ends. ``after`` lets that many
matching events pass first; allocation, kernel and collective faults fire
once. ``report()`` lists what was injected and where it surfaced.
``OPENREG_FAULTS`` arms faults for a whole run (``parse_spec``). See
docs/faults.md.
"""

import os
import warnings
from typing import Any

import torch

from torch_openreg import _C

__all__ = [
    "Fault",
    "clear",
    "crash_device",
    "delay_kernels",
    "fail_allocation",
    "fail_collective",
    "shuffle_atomics",
    "fail_kernel",
    "lose_device",
    "parse_spec",
    "report",
    "warn_on_device",
]

ENV_VAR = "OPENREG_FAULTS"


class Fault:
    """An armed fault: ``disarm()`` it, or use it as a context manager."""

    def __init__(self, fault_id: int, description: str) -> None:
        self.id = fault_id
        self.description = description

    def disarm(self) -> None:
        """Disarms the fault (nothing happens if it already fired)."""
        _C._fault_disarm(self.id)

    def __enter__(self) -> "Fault":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.disarm()

    def __repr__(self) -> str:
        return f"<openreg fault {self.id}: {self.description}>"


def _index(device: Any) -> int:
    if isinstance(device, torch.device):
        if device.type != "openreg":
            raise ValueError(f"expected an openreg device, got {device}")
        return 0 if device.index is None else device.index
    if isinstance(device, str):
        return _index(torch.device(device))
    if not isinstance(device, int) or device < 0:
        raise ValueError(f"expected a device index >= 0, got {device!r}")
    return device


def _count(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def fail_allocation(device: Any = 0, after: int = 0, min_bytes: int = 0) -> Fault:
    """The (after+1)-th allocation of at least ``min_bytes`` on ``device`` fails."""
    d, a, m = _index(device), _count("after", after), _count("min_bytes", min_bytes)
    fid = _C._fault_fail_allocation(d, a, m)
    return Fault(fid, f"fail_allocation(device={d}, after={a}, min_bytes={m})")


def fail_kernel(
    op: str = "aten::mm", device: Any = 0, after: int = 0, sticky: bool = False
) -> Fault:
    """The (after+1)-th kernel of operator ``op`` ("aten::mm", "aten::add.Tensor",
    "aten::copy_", ...) on ``device`` fails on the device."""
    if not isinstance(op, str) or not op:
        raise ValueError(f"op must name an operator such as 'aten::mm', got {op!r}")
    d, a = _index(device), _count("after", after)
    _warn_if_unknown_operator(op)
    fid = _C._fault_fail_kernel(op, d, a, bool(sticky))
    return Fault(fid, f"fail_kernel(op={op!r}, device={d}, after={a}, sticky={bool(sticky)})")


def _warn_if_unknown_operator(op: str) -> None:
    """A fault for an operator that does not exist would never fire: say so."""
    names = set(torch._C._dispatch_get_all_op_names())
    # The names kernels run under: operators ("aten::mm", "aten::add.Tensor")
    # and the collectives of the process group ("c10d::allreduce").
    if op in names or op + ".default" in names or op.startswith("c10d::"):
        return
    import difflib

    close = difflib.get_close_matches(op, names, n=3)
    hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    warnings.warn(
        f"fail_kernel: no operator is named {op!r}{hint}; the fault never fires. "
        "Name it as the fallback log does: 'aten::mm', 'aten::add.Tensor'.",
        stacklevel=3,
    )


def lose_device(device: Any, reason: str = "lost (torch.openreg.faults.lose_device)") -> None:
    """Makes ``device`` lost for the rest of the process (it cannot be undone)."""
    _C._lose_device(_index(device), reason)


def crash_device(device: Any, how: str = "segfault") -> None:
    """Launches a kernel that crashes ``device``'s process (``how``: "segfault",
    a write through a null pointer, or "abort"), as a faulty kernel would.

    Needs ``OPENREG_DRIVER=process``: the device is then lost (every call that
    uses it raises ``torch.AcceleratorError`` naming the device, the signal and
    the kernel) and the program goes on; other devices keep working. With the
    thread driver the device runs in this process, so this raises instead of
    crashing it (use :func:`lose_device`)."""
    kinds = {"segfault": 1, "abort": 2}
    if how not in kinds:
        raise ValueError(f"how must be 'segfault' or 'abort', got {how!r}")
    _C._crash_device(_index(device), kinds[how])


def warn_on_device(message: str, device: Any = 0) -> None:
    """Queues, on ``device``'s current stream, a kernel that gives ``message``
    as a device warning (``orKernelContext::warn``). The device keeps it until
    the next synchronization of the device or one of its streams, which
    raises it as a ``UserWarning``, once, as CUDA prints a kernel's ``printf``
    output at a synchronization."""
    if not isinstance(message, str) or not message:
        raise ValueError(f"message must be a non-empty str, got {message!r}")
    _C._warn_on_device(_index(device), message)


def delay_kernels(
    device: Any = None, stream: Any = None, max_us: int = 1000, seed: int = 0
) -> Fault:
    """Kernels of ``device`` (None: every device), or of ``stream`` only, start
    late by a random 0..max_us microseconds, drawn in launch order from
    ``seed``."""
    stream_id = -1
    if stream is not None:
        if not isinstance(stream, torch.Stream) or stream.device.type != "openreg":
            raise ValueError(f"stream must be an openreg torch.Stream, got {stream!r}")
        stream_id = stream.stream_id
        device = stream.device if device is None else device
    d = -1 if device is None else _index(device)
    if not isinstance(max_us, int) or not 1 <= max_us <= 10_000_000:
        raise ValueError(f"max_us must be an integer in [1, 10000000], got {max_us!r}")
    s = _count("seed", seed)
    fid = _C._fault_delay_kernels(d, stream_id, max_us, s)
    where = "every device" if d < 0 else f"device {d}"
    if stream_id >= 0:
        where += f", stream {stream_id}"
    return Fault(fid, f"delay_kernels({where}, max_us={max_us}, seed={s})")


def fail_collective(
    op: str = "allreduce", rank: int = 1, after: int = 0, mode: str = "error"
) -> Fault:
    """Rank ``rank``'s (after+1)-th collective ``op`` ("allreduce", "broadcast",
    "allgather", ...) on openreg tensors fails, or never arrives."""
    if mode not in ("error", "hang"):
        raise ValueError(f"mode must be 'error' or 'hang', got {mode!r}")
    r, a = _count("rank", rank), _count("after", after)
    fid = _C._fault_fail_collective(op, r, a, mode == "hang")
    return Fault(fid, f"fail_collective(op={op!r}, rank={r}, after={a}, mode={mode!r})")


def shuffle_atomics(seed: int | None = None) -> Fault:
    """Accumulations that use atomics on CUDA (``index_add_``, ``scatter_add_``,
    ``index_put_(accumulate=True)``) add their entries in a random order, a new
    one at each call (from ``seed``; None: a random seed), as CUDA's atomics
    do from run to run: floating-point results then differ between seeds, so
    a test that needs one order to pass shows it. Off in deterministic mode
    (``torch.use_deterministic_algorithms(True)``), as on CUDA, where those
    operators take a deterministic path."""
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little") >> 1
    s = _count("seed", seed)
    fid = _C._fault_shuffle_atomics(s)
    return Fault(fid, f"shuffle_atomics(seed={s})")


def report() -> list[dict[str, Any]]:
    """What was injected and where it surfaced (None while it has not)."""
    return _C._fault_report()


def clear() -> None:
    """Disarms every fault and empties the report (a lost device stays lost)."""
    _C._fault_disarm_all()
    _C._fault_clear_report()


# --- OPENREG_FAULTS -----------------------------------------------------------

_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_SPEC_FAULTS = {
    "fail_allocation": (fail_allocation, {"device": "int", "after": "int", "min_bytes": "size"}),
    "fail_kernel": (fail_kernel, {"op": "str", "device": "int", "after": "int", "sticky": "bool"}),
    "delay_kernels": (delay_kernels, {"device": "int", "max_us": "int", "seed": "int"}),
    "fail_collective": (
        fail_collective,
        {"op": "str", "rank": "int", "after": "int", "mode": "str"},
    ),
    "shuffle_atomics": (shuffle_atomics, {"seed": "int"}),
}


def _value(kind: str, text: str, where: str) -> Any:
    if kind == "str":
        return text
    if kind == "bool":
        if text.lower() in ("1", "true", "yes"):
            return True
        if text.lower() in ("0", "false", "no"):
            return False
        raise ValueError(f"{ENV_VAR}: {where}: expected true or false, got {text!r}")
    scale = 1
    if kind == "size" and text[-1:].lower() in _SUFFIXES:
        scale, text = _SUFFIXES[text[-1].lower()], text[:-1]
    if not text.isdigit():
        raise ValueError(f"{ENV_VAR}: {where}: expected a non-negative integer, got {text!r}")
    return int(text) * scale


def parse_spec(spec: str) -> list[tuple[Any, dict[str, Any]]]:
    """Parses an ``OPENREG_FAULTS`` string into (function, arguments) pairs.

    Faults are separated by ``;``; each is ``name:key=value,key=value`` (or
    just ``name`` for the defaults), for example
    ``fail_allocation:after=100,min_bytes=1M;fail_kernel:op=aten::mm,sticky=true``.
    Sizes take K, M or G. A bad part raises ValueError naming it.
    """
    parsed = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, rest = part.partition(":")
        name = name.strip()
        if name == "lose_device":
            raise ValueError(
                f"{ENV_VAR}: {part!r}: lose_device cannot be armed for a whole run (a device "
                "lost before the program starts is one it never had: set "
                "OPENREG_DEVICE_COUNT); call torch.openreg.faults.lose_device() instead"
            )
        if name not in _SPEC_FAULTS:
            raise ValueError(
                f"{ENV_VAR}: unknown fault {name!r} in {part!r}; known: {', '.join(_SPEC_FAULTS)}"
            )
        fn, keys = _SPEC_FAULTS[name]
        kwargs = {}
        for item in filter(None, (i.strip() for i in rest.split(","))):
            key, eq, text = item.partition("=")
            key = key.strip()
            if not eq or key not in keys:
                raise ValueError(
                    f"{ENV_VAR}: {part!r}: bad argument {item!r}; {name} takes "
                    f"{', '.join(k + '=...' for k in keys)}"
                )
            kwargs[key] = _value(keys[key], text.strip(), f"{part!r}, {key}")
        parsed.append((fn, kwargs))
    return parsed


def _arm_from_environment() -> list[Fault]:
    spec = os.environ.get(ENV_VAR, "")
    armed = []
    for fn, kwargs in parse_spec(spec):
        try:
            armed.append(fn(**kwargs))
        except ValueError as e:
            raise ValueError(f"{ENV_VAR}: {fn.__name__} with {kwargs}: {e}") from None
    return armed
