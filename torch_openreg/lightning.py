"""Lightning on openreg: ``Trainer(accelerator="openreg", devices=N)``.

``OpenRegAccelerator`` is registered in Lightning's ``AcceleratorRegistry`` as
``"openreg"`` as soon as Lightning's accelerators module is imported (the
``torch_openreg`` import installs a post-import hook, so nothing needs to be
imported by hand). Both distributions are covered: ``lightning``
(``lightning.pytorch``) and ``pytorch_lightning``.

Lightning's accelerator connector hard-codes two choices for accelerators it
does not know, and both would leave openreg unused; ``_patch_connector``
wraps them, for openreg only:

- one device with ``strategy="auto"``: Lightning builds
  ``SingleDeviceStrategy(device="cpu")`` for any accelerator other than
  CUDA/MPS; openreg gets ``SingleDeviceStrategy(device=openreg:N)``;
- ``precision="16-mixed"``/``"bf16-mixed"``: Lightning's ``MixedPrecision``
  autocasts on ``"cuda"`` for any accelerator other than CPU/MPS; openreg
  gets ``MixedPrecision(precision, "openreg")`` (autocast and GradScaler on
  openreg).

Several devices use Lightning's DDP strategy. Its process group backend is
``torch.distributed.Backend.default_device_backend_map["openreg"]`` (openreg's
``orccl``, torch_openreg/distributed.py); ``_patch_ddp`` replaces the CUDA
side stream it builds the DDP module on with an openreg one.
"""

import sys
import types
from typing import Any

import torch

BACKEND = "openreg"
# The two distributions of Lightning: their package prefixes.
PACKAGES = ("lightning.pytorch", "pytorch_lightning")

_classes: dict[str, type] = {}


def parse_devices(devices: Any) -> list[int]:
    """``devices=`` of the Trainer as openreg indices: N, -1, "0,1", [0, 1]."""
    count = torch.openreg.device_count()
    if isinstance(devices, str):
        text = devices.strip()
        if text.lstrip("-").isdigit():
            devices = int(text)
        else:
            devices = [int(part) for part in text.split(",") if part.strip()]
    if isinstance(devices, bool) or not isinstance(devices, (int, list, tuple)):
        raise TypeError(f"devices must be an int, a string or a list of ints, got {devices!r}")
    if isinstance(devices, int):
        if devices == -1:
            return list(range(count))
        if devices <= 0:
            raise ValueError(f"devices={devices}: use a positive number of openreg devices or -1")
        if devices > count:
            raise ValueError(f"devices={devices}, but there are {count} openreg devices")
        return list(range(devices))
    indices = [int(i) for i in devices]
    bad = [i for i in indices if not 0 <= i < count]
    if not indices or bad or len(set(indices)) != len(indices):
        raise ValueError(
            f"devices={list(devices)}: openreg indices must be distinct and in [0, {count})"
        )
    return indices


def _accelerator_class(base: type) -> type:
    """The accelerator, on the ``Accelerator`` base class of one distribution."""

    class OpenRegAccelerator(base):
        """Accelerator for the openreg simulated device."""

        def setup_device(self, device: torch.device) -> None:
            if device.type != BACKEND:
                raise ValueError(f"OpenRegAccelerator needs an openreg device, got {device}")
            torch.openreg.set_device(device)

        def setup(self, trainer: Any) -> None:
            torch.openreg.empty_cache()

        def get_device_stats(self, device: Any) -> dict[str, Any]:
            return torch.openreg.memory_stats(device)

        def teardown(self) -> None:
            torch.openreg.empty_cache()

        @staticmethod
        def parse_devices(devices: Any) -> list[int]:
            return parse_devices(devices)

        @staticmethod
        def get_parallel_devices(devices: Any) -> list[torch.device]:
            return [torch.device(BACKEND, i) for i in devices]

        @staticmethod
        def auto_device_count() -> int:
            return torch.openreg.device_count()

        @staticmethod
        def is_available() -> bool:
            return torch.openreg.is_available()

        @staticmethod
        def name() -> str:
            return BACKEND

        @classmethod
        def register_accelerators(cls, accelerator_registry: Any) -> None:
            accelerator_registry.register(cls.name(), cls, description=cls.__name__)

    OpenRegAccelerator.__module__ = __name__
    return OpenRegAccelerator


def accelerator_class(package: str = "lightning.pytorch") -> type:
    """``OpenRegAccelerator`` for ``package`` (imports it)."""
    if package not in _classes:
        module = __import__(f"{package}.accelerators", fromlist=["Accelerator"])
        _register(module)
    return _classes[package]


def _package_of(module_name: str) -> str:
    return next(p for p in PACKAGES if module_name.startswith(p + "."))


# [doc:lightning-register]
def _register(accelerators: types.ModuleType) -> None:
    """Adds ``"openreg"`` to a freshly imported ``<package>.accelerators``."""
    package = _package_of(accelerators.__name__)
    if package in _classes:
        return
    cls = _accelerator_class(accelerators.Accelerator)
    _classes[package] = cls
    if BACKEND not in accelerators.AcceleratorRegistry:
        cls.register_accelerators(accelerators.AcceleratorRegistry)
        # [/doc:lightning-register]


def _patch_connector(connector_module: types.ModuleType) -> None:
    """Wraps the two openreg-blind choices of ``_AcceleratorConnector`` (module docstring)."""
    package = _package_of(connector_module.__name__)
    connector = connector_module._AcceleratorConnector
    if getattr(connector._choose_strategy, "_openreg", False):
        return
    choose_strategy = connector._choose_strategy
    init_precision = connector._check_and_init_precision
    strategies = sys.modules[f"{package}.strategies"]
    mixed_precision = sys.modules[f"{package}.plugins.precision"].MixedPrecision

    def is_openreg(self: Any) -> bool:
        cls = _classes.get(package)
        return cls is not None and isinstance(getattr(self, "accelerator", None), cls)

    # [doc:lightning-connector]
    def _choose_strategy(self: Any) -> Any:
        if is_openreg(self) and self._num_nodes_flag <= 1 and len(self._parallel_devices) <= 1:
            return strategies.SingleDeviceStrategy(device=self._parallel_devices[0])
        return choose_strategy(self)

    def _check_and_init_precision(self: Any) -> Any:
        if (
            is_openreg(self)
            and self._precision_plugin_flag is None
            and self._precision_flag in ("16-mixed", "bf16-mixed")
            and isinstance(self.strategy, (strategies.SingleDeviceStrategy, strategies.DDPStrategy))
        ):
            self._validate_precision_choice()
            return mixed_precision(self._precision_flag, BACKEND)
        return init_precision(self)
        # [/doc:lightning-connector]

    _choose_strategy._openreg = True
    connector._choose_strategy = _choose_strategy
    connector._check_and_init_precision = _check_and_init_precision


def _patch_ddp(ddp_module: types.ModuleType) -> None:
    """DDPStrategy builds the DDP module inside ``torch.cuda.stream(torch.cuda.Stream())``.

    On openreg the same is done with an openreg side stream (DDP broadcasts
    the parameters from rank 0 while it is built), and the current stream
    then waits for it, so the first step reads the broadcast values.
    """
    strategy = ddp_module.DDPStrategy
    original = strategy._setup_model
    if getattr(original, "_openreg", False):
        return

    def _setup_model(self: Any, model: Any) -> Any:
        if self.root_device.type != BACKEND:
            return original(self, model)
        from torch.nn.parallel import DistributedDataParallel

        side = torch.openreg.Stream()
        with torch.openreg.stream(side):
            wrapped = DistributedDataParallel(
                module=model, device_ids=self.determine_ddp_device_ids(), **self._ddp_kwargs
            )
        torch.openreg.current_stream().wait_stream(side)
        return wrapped

    _setup_model._openreg = True
    strategy._setup_model = _setup_model


def install() -> None:
    """Registers openreg with Lightning whenever (and if ever) Lightning is imported."""
    from torch_openreg._post_import import when_imported

    for package in PACKAGES:
        when_imported(f"{package}.accelerators", _register)
        when_imported(f"{package}.trainer.connectors.accelerator_connector", _patch_connector)
        when_imported(f"{package}.strategies.ddp", _patch_ddp)
