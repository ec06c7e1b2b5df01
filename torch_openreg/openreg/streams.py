"""Streams and events of openreg, shaped like torch.cuda's.

``torch.openreg.Stream`` and ``torch.openreg.Event`` are ``torch.Stream`` and
``torch.Event`` bound to openreg (all their methods work: ``wait_stream``,
``wait_event``, ``record_event``, ``query``, ``synchronize``, ``record``,
``elapsed_time``); the C++ side is the device guard in csrc/core.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from torch_openreg import _C

__all__ = [
    "Event",
    "Stream",
    "StreamContext",
    "current_stream",
    "default_stream",
    "is_current_stream_capturing",
    "set_stream",
    "stream",
]


def _index(device: Any) -> int:
    from . import _get_device_index

    return _get_device_index(device, optional=True)


class Stream(torch.Stream):
    """An in-order queue of device work.

    ``Stream(device=None, priority=0)`` creates a new stream (lower priority
    numbers run first, as on CUDA; the range is ``(0, -1)``).
    ``Stream(stream_id=..., device_index=..., device_type=...)`` wraps an
    existing stream, e.g. one handed over as ids by other code.
    """

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> "Stream":
        if "stream_id" in kwargs:
            return super().__new__(cls, **kwargs)
        from . import _lazy_init

        _lazy_init()
        return super().__new__(cls, device=f"openreg:{_index(device)}", priority=priority)

    @property
    def priority(self) -> int:
        return _C._stream_priority(self.stream_id, self.device_index)

    def __repr__(self) -> str:
        return (
            f"<torch.openreg.Stream device=openreg:{self.device_index} stream_id={self.stream_id}>"
        )


class Event:
    """A marker in a stream: record, query, synchronize, wait, elapsed_time.

    ``torch.openreg.Event(...)`` returns a ``torch.Event`` on openreg (PyTorch's
    event methods accept only that exact type, so this is a factory).
    """

    def __new__(  # type: ignore[misc]
        cls,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
        external: bool = False,
    ) -> torch.Event:
        if interprocess:
            raise NotImplementedError(
                "openreg events cannot be shared between processes (interprocess=True)"
            )
        if external:
            raise NotImplementedError(
                "openreg has no graph capture, so no external events (external=True)"
            )
        return torch.Event(
            device="openreg",
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )


def _wrap(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device: Any = None) -> Stream:
    """The stream the current thread launches work on for a device."""
    from . import _lazy_init

    _lazy_init()
    return _wrap(torch.accelerator.current_stream(_index(device)))


def default_stream(device: Any = None) -> Stream:
    """The default stream of a device (stream id 0)."""
    from . import _lazy_init

    _lazy_init()
    index = _index(device)
    base = torch.accelerator.current_stream(index)
    return Stream(
        stream_id=_C._default_stream_id(index), device_index=index, device_type=base.device_type
    )


def is_current_stream_capturing() -> bool:
    """False: openreg has no graph capture (torch.accelerator.Graph is unsupported)."""
    return False


def set_stream(stream: torch.Stream) -> None:
    """Makes ``stream`` current for its device on this thread."""
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager making a stream current (and its device), then restoring both."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self._prev_device = -1
        self._prev_streams: list[torch.Stream] = []

    def __enter__(self) -> "StreamContext":
        if self.stream is None:
            return self
        self._prev_device = torch.accelerator.current_device_index()
        self._prev_streams = [
            torch.accelerator.current_stream(self.stream.device_index),
            torch.accelerator.current_stream(self._prev_device),
        ]
        torch.accelerator.set_device_index(self.stream.device_index)
        torch.accelerator.set_stream(self.stream)
        return self

    def __exit__(self, *args: object) -> None:
        if self.stream is None:
            return
        for s in self._prev_streams:
            torch.accelerator.set_stream(s)
        torch.accelerator.set_device_index(self._prev_device)


@contextmanager
def stream(stream: torch.Stream | None) -> Iterator[None]:
    """``with torch.openreg.stream(s):`` runs the block's work on ``s``."""
    with StreamContext(stream):
        yield
