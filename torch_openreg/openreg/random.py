"""Random number generation on openreg devices, shaped like torch.cuda.random.

Each device has a default ``torch.Generator``; seeding before initialisation
is queued until the devices start, as for CUDA.
"""

from collections.abc import Iterable

import torch

from torch_openreg import _C

__all__ = [
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "set_rng_state",
    "set_rng_state_all",
]


def _default_generator(index: int) -> torch.Generator:
    return _C._get_default_generator(index)


def _index(device: int | str | torch.device) -> int:
    from . import _get_device_index

    return _get_device_index(device, optional=True)


def get_rng_state(device: int | str | torch.device = "openreg") -> torch.Tensor:
    """The state of a device's default generator, as a CPU ByteTensor."""
    from . import _lazy_init

    _lazy_init()
    return _default_generator(_index(device)).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    from . import device_count

    return [get_rng_state(i) for i in range(device_count())]


def _explicit_index(device: int | str | torch.device) -> int | None:
    """The index named by ``device``, or None for "the current device".

    Validates the argument without initialising the devices (the current
    device is only known after initialisation).
    """
    from . import _get_device_index

    if isinstance(device, str):
        device = torch.device(device)
    if device is None or (
        isinstance(device, torch.device) and device.type == "openreg" and device.index is None
    ):
        return None
    return _get_device_index(device)


def set_rng_state(new_state: torch.Tensor, device: int | str | torch.device = "openreg") -> None:
    """Restores a state returned by get_rng_state.

    Before initialisation the call is queued, as for CUDA; an index-less
    device then means the current device at initialisation.
    """
    from . import _lazy_call, current_device

    # Outside any functorch transform (torch.func.jvp, vmap), whose clone
    # would be a wrapper without storage, as torch.cuda.set_rng_state does:
    # torch.compile restores every device's state while it traces such code.
    with torch._C._DisableFuncTorch():
        state = new_state.clone(memory_format=torch.contiguous_format)
    index = _explicit_index(device)

    def cb() -> None:
        _default_generator(current_device() if index is None else index).set_state(state)

    _lazy_call(cb)


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    """Seeds the current device's default generator."""
    from . import _lazy_call, current_device

    seed = int(seed)
    _lazy_call(lambda: _default_generator(current_device()).manual_seed(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds the default generators of all devices."""
    from . import _lazy_call, device_count

    seed = int(seed)

    def cb() -> None:
        for i in range(device_count()):
            _default_generator(i).manual_seed(seed)

    _lazy_call(cb)


def seed() -> None:
    """Seeds the current device's generator with a random number."""
    from . import _lazy_call, current_device

    _lazy_call(lambda: _default_generator(current_device()).seed())


def seed_all() -> None:
    """Seeds every device with the same random number."""
    from . import _lazy_call, device_count

    def cb() -> None:
        random_seed = _default_generator(0).seed()
        for i in range(1, device_count()):
            _default_generator(i).manual_seed(random_seed)

    _lazy_call(cb)


def initial_seed() -> int:
    """The seed of the current device's default generator."""
    from . import _lazy_init, current_device

    _lazy_init()
    return _default_generator(current_device()).initial_seed()
