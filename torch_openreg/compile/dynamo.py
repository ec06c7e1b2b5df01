"""The Dynamo device interface of openreg.

Dynamo and Inductor reach a device's runtime only through the class
registered for its name in ``torch._dynamo.device_interface``: device count
and current device, streams and events (Dynamo traces ``Stream``/``Event``
objects and stream contexts through it), synchronization, properties and
memory. Every member here is a ``torch.openreg`` function, so the interface
adds no behaviour of its own.
"""

from typing import Any

import torch
from torch._dynamo.device_interface import (
    DeviceInterface,
    caching_worker_current_devices,
    caching_worker_device_properties,
    register_interface_for_device,
)

from torch_openreg import _C

_NAME = "openreg"


def _index(device: Any) -> int:
    return torch.openreg._get_device_index(device, optional=True)


# [doc:dynamo-interface]
class OpenRegInterface(DeviceInterface):
    device = torch.openreg.device  # type: ignore[assignment]
    Event = torch.openreg.Event  # type: ignore[assignment]
    Stream = torch.openreg.Stream  # type: ignore[assignment]

    class Worker:
        """What compile workers may ask without touching the device: answers
        recorded in the parent process (Inductor's compile workers never
        initialise a device runtime)."""

        @staticmethod
        def set_device(device: int) -> None:
            caching_worker_current_devices[_NAME] = device

        @staticmethod
        def current_device() -> int:
            if _NAME in caching_worker_current_devices:
                return caching_worker_current_devices[_NAME]
            return torch.openreg.current_device()

        @staticmethod
        def get_device_properties(device: Any = None) -> Any:
            if device is None:
                index = OpenRegInterface.Worker.current_device()
            else:
                index = _index(device)
            if _NAME not in caching_worker_device_properties:
                caching_worker_device_properties[_NAME] = [
                    torch.openreg.get_device_properties(i)
                    for i in range(torch.openreg.device_count())
                ]
            return caching_worker_device_properties[_NAME][index]

    current_device = staticmethod(torch.openreg.current_device)
    set_device = staticmethod(torch.openreg.set_device)
    device_count = staticmethod(torch.openreg.device_count)
    stream = staticmethod(torch.openreg.stream)  # type: ignore[assignment]
    current_stream = staticmethod(torch.openreg.current_stream)
    set_stream = staticmethod(torch.openreg.set_stream)  # type: ignore[assignment]
    synchronize = staticmethod(torch.openreg.synchronize)
    get_device_properties = staticmethod(torch.openreg.get_device_properties)  # type: ignore[assignment]
    memory_allocated = staticmethod(torch.openreg.memory_allocated)
    is_bf16_supported = staticmethod(torch.openreg.is_bf16_supported)  # type: ignore[arg-type]

    @staticmethod
    def is_available() -> bool:
        return torch.openreg.is_available()

    @staticmethod
    def exchange_device(device: int) -> int:
        torch.openreg._lazy_init()
        return _C._exchange_device(device)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        # As torch.cuda._maybe_exchange_device: a negative index changes nothing.
        if device < 0:
            return -1
        return OpenRegInterface.exchange_device(device)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch.openreg.set_stream(
            torch.openreg.Stream(
                stream_id=stream_id, device_index=device_index, device_type=device_type
            )
        )

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        """The runtime handle (orStream_t) of the device's current stream."""
        torch.openreg._lazy_init()
        return _C._current_raw_stream(device_idx)

    @staticmethod
    def get_compute_capability(device: Any = None) -> int:
        major, minor = torch.openreg.get_device_capability(device)
        return major * 10 + minor

    @staticmethod
    def is_triton_capable(device: Any = None) -> bool:
        return False  # kernels come from Inductor's C++ code generator


# [/doc:dynamo-interface]


def register() -> None:
    register_interface_for_device(_NAME, OpenRegInterface)
    for index in range(torch.openreg.device_count()):
        register_interface_for_device(f"{_NAME}:{index}", OpenRegInterface)
