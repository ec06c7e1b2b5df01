"""Random number generation: seeding through ``torch.manual_seed`` and the
device module, state round trips, ``torch.random.fork_rng``, explicit
``torch.Generator`` objects, per-device generators.

PyTorch seeds a PrivateUse1 device through its device module
(``manual_seed_all``) and forks its RNG through ``get_rng_state``/
``set_rng_state``; a seeding before initialisation is checked in the
``device`` topic's fresh process.
"""

from __future__ import annotations

import torch

from .core import Context, check, expect, expect_equal, expect_raises, topic

T = topic("generator", "Random number generators")


def _draw(ctx: Context, device: int | None = None, generator=None) -> torch.Tensor:
    return torch.rand(64, device=ctx.device(device), generator=generator).cpu()


@check(T)
def torch_manual_seed_reproduces(ctx: Context) -> None:
    """torch.manual_seed(s) makes the device's random numbers repeat."""
    torch.manual_seed(1234)
    a = _draw(ctx)
    torch.manual_seed(1234)
    b = _draw(ctx)
    expect(torch.equal(a, b), "two draws after torch.manual_seed(1234) differ")


@check(T)
def module_manual_seed_reproduces(ctx: Context) -> None:
    """The device module's manual_seed(s) makes the current device's numbers repeat."""
    ctx.module.manual_seed(99)
    a = _draw(ctx)
    ctx.module.manual_seed(99)
    b = _draw(ctx)
    expect(torch.equal(a, b), "two draws after manual_seed(99) differ")


@check(T)
def different_seeds_differ(ctx: Context) -> None:
    """Different seeds give different numbers; consecutive draws differ."""
    torch.manual_seed(1)
    a, a2 = _draw(ctx), _draw(ctx)
    torch.manual_seed(2)
    b = _draw(ctx)
    expect(not torch.equal(a, b), "seeds 1 and 2 give the same numbers")
    expect(not torch.equal(a, a2), "two consecutive draws are equal")


@check(T)
def initial_seed(ctx: Context) -> None:
    """initial_seed() returns the seed given to manual_seed()."""
    ctx.module.manual_seed(4321)
    expect_equal(ctx.module.initial_seed(), 4321, "initial_seed()")
    torch.manual_seed(777)
    expect_equal(ctx.module.initial_seed(), 777, "initial_seed() after torch.manual_seed")


@check(T)
def seed_randomizes(ctx: Context) -> None:
    """seed() picks a new random seed (initial_seed() changes, draws differ)."""
    ctx.module.manual_seed(5)
    a = _draw(ctx)
    ctx.module.seed()
    expect(ctx.module.initial_seed() != 5, "initial_seed() still 5 after seed()")
    expect(not torch.equal(a, _draw(ctx)), "seed() did not change the numbers")


@check(T)
def rng_state_round_trip(ctx: Context) -> None:
    """set_rng_state(get_rng_state()) replays the same numbers; the state is a CPU
    uint8 tensor."""
    state = ctx.module.get_rng_state()
    expect(isinstance(state, torch.Tensor), f"state is a {type(state).__name__}")
    expect_equal((state.dtype, state.device.type), (torch.uint8, "cpu"), "state dtype and device")
    a = _draw(ctx)
    ctx.module.set_rng_state(state)
    expect(torch.equal(a, _draw(ctx)), "numbers after restoring the state differ")


@check(T)
def rng_state_all(ctx: Context) -> None:
    """get_rng_state_all() has one state per device; set_rng_state_all replays all."""
    states = ctx.module.get_rng_state_all()
    expect_equal(len(states), ctx.count, "len(get_rng_state_all())")
    a = [_draw(ctx, i) for i in range(ctx.count)]
    ctx.module.set_rng_state_all(states)
    b = [_draw(ctx, i) for i in range(ctx.count)]
    expect(all(torch.equal(x, y) for x, y in zip(a, b, strict=False)), "replayed numbers differ")


@check(T)
def manual_seed_all_seeds_every_device(ctx: Context) -> None:
    """manual_seed_all(s) seeds every device alike: the same draw repeats on each device."""
    ctx.module.manual_seed_all(2024)
    a = [_draw(ctx, i) for i in range(ctx.count)]
    ctx.module.manual_seed_all(2024)
    b = [_draw(ctx, i) for i in range(ctx.count)]
    for i in range(ctx.count):
        expect(torch.equal(a[i], b[i]), f"device {i} does not repeat after manual_seed_all")


@check(T, devices=2)
def manual_seed_is_per_device(ctx: Context) -> None:
    """manual_seed(s) seeds only the current device: device 1's sequence continues."""
    ctx.module.manual_seed_all(10)
    _draw(ctx, 1)
    expected = _draw(ctx, 1)
    ctx.module.manual_seed_all(10)
    _draw(ctx, 1)
    ctx.module.manual_seed(11)  # device 0 only
    expect(torch.equal(_draw(ctx, 1), expected), "manual_seed on device 0 changed device 1")


@check(T)
def fork_rng_restores(ctx: Context) -> None:
    """torch.random.fork_rng(device_type=NAME) restores the device's RNG state on exit."""
    torch.manual_seed(3)
    with torch.random.fork_rng(device_type=ctx.name):
        inside = _draw(ctx)
    after = _draw(ctx)
    expect(torch.equal(inside, after), "the draw after fork_rng is not the one inside")


@check(T)
def fork_rng_isolated_seed(ctx: Context) -> None:
    """A manual_seed inside fork_rng does not leak out of it."""
    torch.manual_seed(8)
    expected = _draw(ctx)
    torch.manual_seed(8)
    with torch.random.fork_rng(device_type=ctx.name):
        torch.manual_seed(12345)
        _draw(ctx)
    expect(torch.equal(_draw(ctx), expected), "the seed inside fork_rng leaked out")


@check(T)
def explicit_generator(ctx: Context) -> None:
    """torch.Generator(device=NAME) seeds reproducibly, is independent of the default
    generator, and reports its device."""
    g = torch.Generator(device=ctx.name)
    expect_equal(g.device, ctx.device(0), "generator.device")
    g.manual_seed(42)
    a = _draw(ctx, generator=g)
    torch.manual_seed(0)
    g.manual_seed(42)
    _draw(ctx)  # default generator draws in between
    expect(torch.equal(a, _draw(ctx, generator=g)), "seeded generator does not repeat")


@check(T)
def generator_state_round_trip(ctx: Context) -> None:
    """Generator.get_state()/set_state() replay the same numbers."""
    g = torch.Generator(device=ctx.name)
    g.manual_seed(7)
    state = g.get_state()
    a = _draw(ctx, generator=g)
    g.set_state(state)
    expect(torch.equal(a, _draw(ctx, generator=g)), "numbers after set_state differ")


@check(T)
def generator_device_mismatch(ctx: Context) -> None:
    """A NAME generator passed to a CPU random op raises RuntimeError (and a CPU
    generator to a device op)."""
    g = torch.Generator(device=ctx.name)
    expect_raises(RuntimeError, lambda: torch.rand(4, generator=g), "CPU op, NAME generator")
    cpu = torch.Generator()
    expect_raises(
        RuntimeError,
        lambda: torch.rand(4, device=ctx.name, generator=cpu),
        "NAME op, CPU generator",
    )


@check(T)
def random_ops_reproduce(ctx: Context) -> None:
    """randn, randint, randperm, normal_, bernoulli, multinomial and dropout repeat
    after the same seed."""

    def draws():
        x = torch.ones(100, device=ctx.name)
        return [
            torch.randn(50, device=ctx.name),
            torch.randint(0, 100, (50,), device=ctx.name),
            torch.randperm(30, device=ctx.name),
            torch.empty(50, device=ctx.name).normal_(2.0, 3.0),
            torch.bernoulli(torch.full((50,), 0.5, device=ctx.name)),
            torch.multinomial(torch.ones(10, device=ctx.name), 5),
            torch.nn.functional.dropout(x, 0.5, training=True),
        ]

    torch.manual_seed(11)
    a = [t.cpu() for t in draws()]
    torch.manual_seed(11)
    b = [t.cpu() for t in draws()]
    names = ["randn", "randint", "randperm", "normal_", "bernoulli", "multinomial", "dropout"]
    bad = [n for n, x, y in zip(names, a, b, strict=False) if not torch.equal(x, y)]
    expect(not bad, f"not reproducible: {bad}")


@check(T)
def random_values_sane(ctx: Context) -> None:
    """rand is in [0, 1), randn has mean ~0 and std ~1, randperm is a permutation."""
    torch.manual_seed(0)
    u = torch.rand(100_000, device=ctx.name).cpu()
    expect(0 <= u.min().item() and u.max().item() < 1, "rand outside [0, 1)")
    n = torch.randn(100_000, device=ctx.name).cpu()
    expect(abs(n.mean().item()) < 0.02, f"randn mean {n.mean().item():.4f}")
    expect(abs(n.std().item() - 1) < 0.02, f"randn std {n.std().item():.4f}")
    p = torch.randperm(1000, device=ctx.name).cpu()
    expect(torch.equal(p.sort().values, torch.arange(1000)), "randperm is not a permutation")
