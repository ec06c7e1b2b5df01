"""Stream sanitizer: finds unsynchronized accesses to the same memory.

Opt-in (``OPENREG_SANITIZE_STREAMS=1`` before import, or ``enable()``). While
it runs, every operator is checked:

- two streams touching the same memory (at least one writing) without an
  event, ``wait_stream`` or host synchronization ordering them, and
- host code reading memory that a device stream still writes (a
  ``non_blocking`` copy into pinned memory read before synchronizing),

raise :class:`StreamRaceError` naming both operators, their streams and where
each was launched from.

How: a ``TorchDispatchMode`` sees every operator with its read and written
tensors (from the schema); the C++ layer reports every event record, stream
wait and host synchronization (``_C._set_sync_trace``). Happens-before is
tracked with vector clocks: each stream counts its launches, an event copies
its stream's clock, a wait merges it, a host synchronization merges into the
host clock, and a launch inherits what the host knows. Memory is tracked per
storage (conservative: disjoint slices of one storage count as the same
memory).

The dispatch mode is thread-local, as every PyTorch dispatch mode is: only
operators run by the thread that called ``enable()`` (or imported openreg
with ``OPENREG_SANITIZE_STREAMS=1``) are checked. Other threads' operators
are not seen; their synchronizations still are.
"""

import os
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode, _push_mode

from torch_openreg import _C

__all__ = ["StreamRaceError", "disable", "enable", "is_enabled"]

HOST = ("host", 0)
StreamKey = tuple[Any, int]


class StreamRaceError(RuntimeError):
    """Two accesses to the same memory without synchronization between them."""


@dataclass
class Access:
    stream: StreamKey
    tick: int
    op: str
    stack: list[str]
    write: bool


@dataclass
class MemoryState:
    last_write: Access | None = None
    reads: list[Access] = field(default_factory=list)
    # Streams named by record_stream on a tensor of this memory: the caching
    # allocator keeps the block from being reused before they pass it.
    recorded: set = field(default_factory=set)


def _describe(stream: StreamKey) -> str:
    if stream == HOST:
        return "the host"
    device, sid = stream
    return f"stream {sid} of openreg:{device}"


class _Sanitizer:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.clocks: dict[StreamKey, dict[StreamKey, int]] = {}
        self.events: dict[int, dict[StreamKey, int]] = {}
        self.memory: dict[int, MemoryState] = {}

    # -- clocks -----------------------------------------------------------
    def clock(self, stream: StreamKey) -> dict[StreamKey, int]:
        return self.clocks.setdefault(stream, {})

    @staticmethod
    def merge(into: dict[StreamKey, int], other: dict[StreamKey, int]) -> None:
        for k, v in other.items():
            if into.get(k, 0) < v:
                into[k] = v

    def happens_before(self, access: Access, stream: StreamKey) -> bool:
        if access.stream == stream:
            return True
        return self.clock(stream).get(access.stream, 0) >= access.tick

    def on_sync(self, kind: str, event: int, stream: int, device: int) -> None:
        with self.lock:
            if kind == "record":
                self.events[event] = dict(self.clock((device, stream)))
            elif kind == "wait":
                self.merge(self.clock((device, stream)), self.events.get(event, {}))
            elif kind == "sync_event":
                self.merge(self.clock(HOST), self.events.get(event, {}))
            elif kind == "sync_stream":
                key = (device, stream)
                self.merge(self.clock(HOST), self.clock(key))
                self.clock(HOST)[key] = self.clock(key).get(key, 0)
            elif kind == "elapsed":
                self.elapsed(event)  # raises StreamRaceError
            elif kind == "sync_device":
                for key in list(self.clocks):
                    if key != HOST and key[0] == device:
                        self.merge(self.clock(HOST), self.clock(key))
                        self.clock(HOST)[key] = self.clock(key).get(key, 0)

    # -- accesses ---------------------------------------------------------
    def launch(self, stream: StreamKey) -> int:
        own = self.clock(stream)
        if stream != HOST:
            # Work launched after a host synchronization runs after it.
            self.merge(own, self.clock(HOST))
        own[stream] = own.get(stream, 0) + 1
        return own[stream]

    def check(self, key: int, access: Access) -> None:
        state = self.memory.setdefault(key, MemoryState())
        conflicts = []
        if state.last_write is not None and not self.happens_before(
            state.last_write, access.stream
        ):
            conflicts.append(state.last_write)
        if access.write:
            conflicts += [r for r in state.reads if not self.happens_before(r, access.stream)]
        if conflicts:
            other = conflicts[0]
            raise StreamRaceError(
                f"openreg stream sanitizer: {'write' if access.write else 'read'} by "
                f"{access.op} on {_describe(access.stream)} races with "
                f"{'write' if other.write else 'read'} by {other.op} on "
                f"{_describe(other.stream)}: no event, wait_stream or synchronize orders "
                "them.\n\n"
                f"{access.op} was launched from:\n{''.join(access.stack)}\n"
                f"{other.op} was launched from:\n{''.join(other.stack)}"
            )
        if access.write:
            state.last_write = access
            state.reads = []
        else:
            state.reads = [r for r in state.reads if r.stream != access.stream] + [access]

    def reuse(self, key: int, access: Access) -> None:
        """A new tensor in memory that had another tensor's accesses: the old
        tensor was freed, and its block handed out again on `access.stream`.
        Accesses from other streams that do not happen before it, and that no
        record_stream announced, race with the new tensor's writes: CUDA's
        sanitizer reports the same (a free without record_stream)."""
        state = self.memory.get(key)
        if state is not None:
            old = ([state.last_write] if state.last_write is not None else []) + state.reads
            for other in old:
                if (
                    other.stream != access.stream
                    and other.stream not in state.recorded
                    and not self.happens_before(other, access.stream)
                ):
                    raise StreamRaceError(
                        f"openreg stream sanitizer: {access.op} on "
                        f"{_describe(access.stream)} gets memory that "
                        f"{other.op} on {_describe(other.stream)} may still "
                        f"{'write' if other.write else 'read'}: the tensor was freed "
                        "without record_stream() for that stream (or a wait before "
                        "the free), so the caching allocator reused its block at "
                        "once.\n\n"
                        f"{access.op} was launched from:\n{''.join(access.stack)}\n"
                        f"{other.op} was launched from:\n{''.join(other.stack)}"
                    )
        self.memory[key] = MemoryState(last_write=access)

    def elapsed(self, end_event: int) -> None:
        """Event.elapsed_time(end): the host must have synchronized with `end`
        (its completion is what the time needs). Checked on the vector clocks,
        not on whether it happened to complete, so blocking launches
        (OPENREG_LAUNCH_BLOCKING=1) do not hide it."""
        recorded = self.events.get(end_event)
        if recorded is None:
            return
        host = self.clock(HOST)
        if any(host.get(k, 0) < v for k, v in recorded.items() if k != HOST):
            raise StreamRaceError(
                "openreg stream sanitizer: Event.elapsed_time() before the host "
                "synchronized with the end event: on a device the time is ready only "
                "once the event has completed (call end.synchronize() or "
                "torch.openreg.synchronize() first)"
            )


_state = _Sanitizer()


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _key(t: torch.Tensor) -> int | None:
    if t.device.type == "meta" or t.numel() == 0:
        return None
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:
        return None


# Operators that touch no data: their tensor arguments are not accesses.
_NO_DATA = {"record_stream", "set_", "resize_", "detach", "alias", "lift_fresh"}


def _touches_data(func) -> bool:
    if func._schema.name.split("::")[-1] in _NO_DATA:
        return False
    # View operators only compute metadata.
    return not any(
        r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns
    )


class _Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.name == "aten::record_stream" and len(args) >= 2:
            self._record_stream(args[0], args[1])
        if not _touches_data(func):
            return func(*args, **kwargs)
        reads: list[torch.Tensor] = []
        writes: list[torch.Tensor] = []
        for i, arg in enumerate(func._schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            is_write = arg.alias_info is not None and arg.alias_info.is_write
            (writes if is_write else reads).extend(_tensors(value))
        result = func(*args, **kwargs)
        known = {_key(t) for t in reads + writes}
        # New outputs are fresh memory: their history starts here (a reused
        # block of the caching allocator is not the tensor that was freed).
        fresh = [t for t in _tensors(result) if _key(t) not in known]
        non_blocking = kwargs.get("non_blocking", False) or (
            len(args) > 2 and func.__name__.startswith("copy_") and bool(args[2])
        )
        self._record(str(func), reads, writes, fresh, non_blocking)
        return result

    @staticmethod
    def _record_stream(tensor: torch.Tensor, stream: Any) -> None:
        key = _key(tensor)
        if key is None or tensor.device.type != "openreg":
            return
        with _state.lock:
            state = _state.memory.setdefault(key, MemoryState())
            state.recorded.add((tensor.device.index, stream.stream_id))

    def _record(self, op: str, reads, writes, fresh, non_blocking: bool) -> None:
        # The stream an operator runs on is its destination's (what it writes,
        # or its new outputs): a copy from openreg:1 to openreg:0 is ordered
        # on openreg:0 (after waiting for the source, which the
        # synchronization trace reports).
        devices = [t.device for t in writes + fresh + reads if t.device.type == "openreg"]
        stack = traceback.format_stack(limit=12)[:-3]
        with _state.lock:
            if devices:
                device = devices[0].index
                sid = torch.openreg.current_stream(device).stream_id
                stream = (device, sid)
            else:
                stream = HOST
            tick = _state.launch(stream)
            for t in fresh:
                key = _key(t)
                if key is not None and t.device.type == "openreg":
                    _state.reuse(key, Access(stream, tick, op, stack, True))
            for tensors, write in ((reads, False), (writes, True)):
                for t in tensors:
                    key = _key(t)
                    if key is None:
                        continue
                    # CPU memory is tracked only when a device stream wrote it
                    # asynchronously (a non_blocking copy into pinned memory).
                    if t.device.type == "cpu" and stream != HOST and not (write and non_blocking):
                        continue
                    if t.device.type == "cpu" and stream == HOST and key not in _state.memory:
                        continue
                    _state.check(key, Access(stream, tick, op, stack, write))


_mode: _Mode | None = None


def enable() -> None:
    """Starts checking every operator on this thread's dispatch (idempotent)."""
    global _mode
    if _mode is not None:
        return
    _C._set_sync_trace(_state.on_sync)
    _mode = _Mode()
    _push_mode(_mode)


def disable() -> None:
    """Stops checking and forgets the access history."""
    global _mode, _state
    if _mode is None:
        return
    _pop_mode()
    _mode = None
    _C._set_sync_trace(None)
    _state = _Sanitizer()


def is_enabled() -> bool:
    return _mode is not None


if os.environ.get("OPENREG_SANITIZE_STREAMS") == "1":
    enable()
