"""Random numbers on openreg: seeding, generator state, torch.Generator("openreg")."""

import pytest
import torch
import torch.nn.functional as F
from conftest import describe

D = "openreg"


def _draw(device=D, n=8, **kw):
    return torch.randn(n, device=device, **kw).cpu()


def test_torch_manual_seed_makes_randn_reproducible():
    torch.manual_seed(1234)
    a = _draw()
    b = _draw()
    torch.manual_seed(1234)
    a2 = _draw()
    b2 = _draw()
    assert torch.equal(a, a2) and torch.equal(b, b2)
    assert not torch.equal(a, b)  # the generator advances
    torch.manual_seed(4321)
    assert not torch.equal(_draw(), a)


def test_torch_manual_seed_seeds_every_device():
    torch.manual_seed(7)
    a0, a1 = _draw("openreg:0"), _draw("openreg:1")
    torch.manual_seed(7)
    assert torch.equal(_draw("openreg:1"), a1)
    assert torch.equal(_draw("openreg:0"), a0)
    assert torch.openreg.initial_seed() == 7
    with torch.openreg.device(1):
        assert torch.openreg.initial_seed() == 7


def test_same_sequence_in_two_processes(py):
    code = """
        import torch
        torch.manual_seed(2024)
        x = torch.randn(6, device="openreg")
        y = torch.rand(3, device="openreg:1")
        print(x.cpu().tolist(), y.cpu().tolist())
    """
    first, second = py(code), py(code)
    assert first.returncode == 0, describe(first)
    assert second.returncode == 0, describe(second)
    assert first.stdout == second.stdout
    # And equal to this process's numbers for the same seed.
    torch.manual_seed(2024)
    x = torch.randn(6, device="openreg")
    y = torch.rand(3, device="openreg:1")
    assert first.stdout.strip() == f"{x.cpu().tolist()} {y.cpu().tolist()}"


def test_openreg_manual_seed_and_initial_seed():
    torch.openreg.manual_seed(99)
    assert torch.openreg.initial_seed() == 99
    a = _draw()
    torch.openreg.manual_seed(99)
    assert torch.equal(_draw(), a)


def test_openreg_manual_seed_only_current_device():
    torch.openreg.manual_seed_all(5)
    with torch.openreg.device(1):
        torch.openreg.manual_seed(9)
        assert torch.openreg.initial_seed() == 9
    assert torch.openreg.initial_seed() == 5


def test_openreg_manual_seed_all():
    torch.openreg.manual_seed_all(31)
    a0, a1 = _draw("openreg:0"), _draw("openreg:1")
    # Both devices got the same seed: their first draws agree.
    assert torch.equal(a0, a1)
    for i in range(torch.openreg.device_count()):
        with torch.openreg.device(i):
            assert torch.openreg.initial_seed() == 31
    torch.openreg.manual_seed_all(31)
    assert torch.equal(_draw("openreg:1"), a1)


def test_openreg_seed_and_seed_all():
    torch.openreg.seed()
    s1 = torch.openreg.initial_seed()
    torch.openreg.seed()
    s2 = torch.openreg.initial_seed()
    assert s1 != s2  # fresh non-deterministic seeds
    torch.openreg.seed_all()
    s = torch.openreg.initial_seed()
    with torch.openreg.device(1):
        assert torch.openreg.initial_seed() == s
    # The seed it reports reproduces the stream.
    a = _draw()
    torch.openreg.manual_seed(s)
    assert torch.equal(_draw(), a)


def test_get_set_rng_state_roundtrip():
    torch.manual_seed(0)
    state = torch.openreg.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu" and state.dim() == 1
    a = _draw()
    b = torch.rand(4, device=D).cpu()
    torch.openreg.set_rng_state(state)
    assert torch.equal(_draw(), a)
    assert torch.equal(torch.rand(4, device=D).cpu(), b)
    # The saved state is a copy: drawing did not change it.
    torch.openreg.set_rng_state(state)
    assert torch.equal(_draw(), a)


@pytest.mark.parametrize("spec", [1, "openreg:1", torch.device("openreg:1")])
def test_get_set_rng_state_of_other_device(spec):
    state = torch.openreg.get_rng_state(spec)
    a = _draw("openreg:1")
    _draw("openreg:0")  # device 0 is independent
    torch.openreg.set_rng_state(state, spec)
    assert torch.equal(_draw("openreg:1"), a)


def test_get_set_rng_state_all():
    torch.openreg.manual_seed_all(3)
    _draw("openreg:1")  # put the devices in different states
    states = torch.openreg.get_rng_state_all()
    assert len(states) == torch.openreg.device_count()
    assert not torch.equal(states[0], states[1])
    draws = [_draw(f"openreg:{i}") for i in range(2)]
    torch.openreg.set_rng_state_all(states)
    assert all(torch.equal(_draw(f"openreg:{i}"), draws[i]) for i in range(2))


def test_fork_rng_restores_openreg_state():
    torch.manual_seed(11)
    with torch.random.fork_rng(devices=[0, 1], device_type="openreg"):
        inside = _draw()
    after = _draw()
    assert torch.equal(inside, after)


def test_generator_on_second_device():
    g = torch.Generator("openreg:1")
    assert g.device == torch.device("openreg:1")
    g.manual_seed(17)
    assert g.initial_seed() == 17
    a = torch.rand(5, device="openreg:1", generator=g)
    assert a.device == torch.device("openreg:1")
    g.manual_seed(17)
    b = torch.rand(5, device="openreg:1", generator=g)
    assert torch.equal(a.cpu(), b.cpu())
    # The explicit generator does not touch the default one.
    torch.openreg.manual_seed_all(0)
    d1 = _draw("openreg:1")
    torch.openreg.manual_seed_all(0)
    torch.rand(5, device="openreg:1", generator=g)
    assert torch.equal(_draw("openreg:1"), d1)


def test_generator_state_and_clone():
    g = torch.Generator(D).manual_seed(5)
    state = g.get_state()
    a = torch.randn(4, device=D, generator=g).cpu()
    g.set_state(state)
    assert torch.equal(torch.randn(4, device=D, generator=g).cpu(), a)
    g.set_state(state)
    g2 = g.clone_state()
    assert g2.device == g.device
    assert torch.equal(
        torch.rand(4, device=D, generator=g).cpu(), torch.rand(4, device=D, generator=g2).cpu()
    )


def test_cpu_generator_rejected_for_device_op():
    with pytest.raises(RuntimeError, match="openreg generator"):
        torch.rand(3, device=D, generator=torch.Generator())


RANDOM_OPS = {
    "dropout": lambda g: F.dropout(torch.ones(64, device=D), 0.5, training=True),
    "dropout_module": lambda g: torch.nn.Dropout(0.3)(torch.ones(8, 8, device=D)),
    "bernoulli": lambda g: torch.bernoulli(torch.full((64,), 0.5, device=D), generator=g),
    "bernoulli_": lambda g: torch.empty(64, device=D).bernoulli_(0.3, generator=g),
    "normal_": lambda g: torch.empty(64, device=D).normal_(2.0, 0.5, generator=g),
    "uniform_": lambda g: torch.empty(64, device=D).uniform_(-1, 1, generator=g),
    "normal_tensor": lambda g: torch.normal(
        torch.zeros(16, device=D), torch.ones(16, device=D), generator=g
    ),
    "randint": lambda g: torch.randint(0, 100, (32,), device=D, generator=g),
    "randperm": lambda g: torch.randperm(32, device=D, generator=g),
    "multinomial": lambda g: torch.multinomial(torch.ones(10, device=D), 5, generator=g),
    "exponential_": lambda g: torch.empty(16, device=D).exponential_(generator=g),
    "rand_like": lambda g: torch.rand_like(torch.empty(3, 3, device=D)),
}


# dropout and rand_like take no generator argument.
_NO_GENERATOR = {"dropout", "dropout_module", "rand_like"}


@pytest.mark.parametrize(
    "name,which",
    [(n, "default") for n in RANDOM_OPS]
    + [(n, "explicit") for n in RANDOM_OPS if n not in _NO_GENERATOR],
)
def test_random_ops_reproducible_under_seed(name, which):
    fn = RANDOM_OPS[name]

    def run(seed=123):
        if which == "default":
            torch.manual_seed(seed)
            return fn(None)
        return fn(torch.Generator(D).manual_seed(seed))

    a, b = run(), run()
    assert a.device.type == "openreg"
    assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(run(124).cpu(), a.cpu())  # the seed matters


def test_random_ops_have_sane_distributions():
    torch.manual_seed(0)
    kept = F.dropout(torch.ones(20000, device=D), 0.3).cpu()
    values = kept.unique()
    assert values.numel() == 2 and values[0] == 0
    assert values[1].item() == pytest.approx(1 / 0.7)
    assert abs((kept == 0).float().mean().item() - 0.3) < 0.02
    b = torch.bernoulli(torch.full((20000,), 0.25, device=D)).cpu()
    assert abs(b.mean().item() - 0.25) < 0.02
    n = torch.empty(20000, device=D).normal_(2.0, 0.5).cpu()
    assert abs(n.mean().item() - 2.0) < 0.02 and abs(n.std().item() - 0.5) < 0.02
    u = torch.empty(20000, device=D).uniform_(-1, 3).cpu()
    assert u.min().item() >= -1 and u.max().item() < 3 and abs(u.mean().item() - 1) < 0.05


def test_dropout_is_identity_in_eval():
    x = torch.randn(10, device=D)
    assert torch.equal(F.dropout(x, 0.5, training=False).cpu(), x.cpu())


def test_manual_seed_before_initialisation(py):
    proc = py(
        """
        import torch
        torch.openreg.manual_seed(1)          # queued: nothing is initialised yet
        assert not torch.openreg.is_initialized()
        first = torch.randn(5, device="openreg").cpu()
        assert torch.openreg.initial_seed() == 1
        torch.openreg.manual_seed(1)          # now applied at once
        second = torch.randn(5, device="openreg").cpu()
        print(torch.equal(first, second), first.tolist())
        """
    )
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.startswith("True "), describe(proc)


def test_seeding_all_devices_before_initialisation(py):
    proc = py(
        """
        import torch
        torch.manual_seed(8)  # what most scripts do first, before any device use
        assert not torch.openreg.is_initialized()
        a0 = torch.rand(3, device="openreg:0").cpu()
        a1 = torch.rand(3, device="openreg:1").cpu()
        torch.manual_seed(8)
        print(torch.equal(a0, torch.rand(3, device="openreg:0").cpu()),
              torch.equal(a1, torch.rand(3, device="openreg:1").cpu()))
        """
    )
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.strip() == "True True", describe(proc)


def test_set_rng_state_before_initialisation(py, tmp_path):
    torch.manual_seed(5)
    torch.randn(3, device="openreg:1")  # some state that is not a fresh seed
    torch.save(torch.openreg.get_rng_state(1), tmp_path / "state.pt")
    expected = torch.randn(6, device="openreg:1").cpu()
    proc = py(
        """
        import torch
        state = torch.load("state.pt")
        torch.openreg.set_rng_state(state, 1)  # queued until initialisation
        assert not torch.openreg.is_initialized()
        print(torch.randn(6, device="openreg:1").cpu().tolist())
        """
    )
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.strip() == str(expected.tolist())


def test_set_rng_state_default_device_does_not_initialise(py, tmp_path):
    # As torch.cuda.set_rng_state: with the default device the call is queued
    # (the device index is resolved at initialisation), so a process can still
    # fork safely afterwards.
    torch.manual_seed(6)
    torch.save(torch.openreg.get_rng_state(0), tmp_path / "state0.pt")
    expected = torch.rand(4, device="openreg:0").cpu()
    proc = py(
        """
        import torch
        torch.openreg.set_rng_state(torch.load("state0.pt"))
        print("initialised", torch.openreg.is_initialized())
        print(torch.rand(4, device="openreg:0").cpu().tolist())
        """
    )
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.splitlines() == ["initialised False", str(expected.tolist())]


def test_set_rng_state_rejects_other_device_types():
    with pytest.raises(ValueError, match="openreg"):
        torch.openreg.set_rng_state(torch.openreg.get_rng_state(), "cpu")


def test_openreg_seed_alone_governs_dropout():
    x = torch.ones(4096, device="openreg")
    torch.openreg.manual_seed(7)
    a = torch.nn.functional.dropout(x, 0.5)
    torch.manual_seed(123)  # the CPU generator must not matter
    torch.openreg.manual_seed(7)
    b = torch.nn.functional.dropout(x, 0.5)
    assert torch.equal(a.cpu(), b.cpu())
    assert set(a.cpu().unique().tolist()) == {0.0, 2.0}
    assert 1500 < int((a.cpu() == 0).sum()) < 2600


# ---------------------------------------------------------------------------
# Random kernels are queued: the host reserves each launch's draw


RANDOM_PROGRAM = """
import sys, torch
torch.openreg.manual_seed(7)
x = torch.ones(64, 64, device="openreg")
g = torch.Generator("openreg").manual_seed(3)
out = [
    torch.nn.functional.dropout(x, 0.3),
    torch.randn(5, 7, device="openreg"),
    torch.empty(100, device="openreg").uniform_(-1, 2),
    torch.empty(100, device="openreg").normal_(generator=g),
    torch.bernoulli(torch.full((50,), 0.4, device="openreg")),
    torch.randperm(20, device="openreg"),
    torch.multinomial(torch.ones(10, device="openreg"), 5),
    torch.randint(0, 9, (30,), device="openreg", generator=g),
]
side = torch.openreg.Stream()
side.wait_stream(torch.openreg.current_stream())
with torch.openreg.stream(side):
    out.append(torch.rand(40, device="openreg"))
torch.openreg.current_stream().wait_stream(side)
out.append(torch.tensor([torch.openreg.default_generators[0].get_offset()]))
torch.save([t.cpu() for t in out], sys.argv[1] if len(sys.argv) > 1 else "out.pt")
"""


def test_random_numbers_are_the_same_queued_and_blocking(py, tmp_path):
    results = []
    for blocking in ("0", "1"):
        out = py(RANDOM_PROGRAM.replace('"out.pt"', f'"out{blocking}.pt"'),
                 OPENREG_LAUNCH_BLOCKING=blocking)  # fmt: skip
        assert out.returncode == 0, out.stderr
        results.append(torch.load(tmp_path / f"out{blocking}.pt"))
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
    # And the same again in a new process (a pure function of seed and order).
    out = py(RANDOM_PROGRAM.replace('"out.pt"', '"again.pt"'))
    assert out.returncode == 0, out.stderr
    for a, b in zip(results[0], torch.load(tmp_path / "again.pt"), strict=True):
        assert torch.equal(a, b)


@pytest.mark.skipif(
    __import__("os").environ.get("OPENREG_LAUNCH_BLOCKING") == "1",
    reason="launches wait in blocking mode",
)
def test_dropout_is_queued():
    x = torch.ones(2048, 2048, device="openreg")
    torch.nn.functional.dropout(x, 0.1)  # first call of the signature: checked
    torch.openreg.synchronize()
    masks = [torch.nn.functional.dropout(x, 0.1) for _ in range(8)]
    assert not torch.openreg.current_stream().query(), "the host waited for dropout"
    kept = [(m != 0).float().mean().item() for m in masks]
    assert all(0.88 < k < 0.92 for k in kept)
    assert len({m.sum().item() for m in masks}) == 8  # eight different masks


def test_offset_counts_launches_and_can_be_set():
    g = torch.Generator("openreg").manual_seed(11)
    assert g.get_offset() == 0
    a = torch.empty(10, device="openreg").uniform_(generator=g)
    assert g.get_offset() == 1
    torch.empty(10, device="openreg").uniform_(generator=g)
    assert g.get_offset() == 2
    g.set_offset(0)
    assert torch.equal(torch.empty(10, device="openreg").uniform_(generator=g).cpu(), a.cpu())
    state = g.get_state()
    assert state.numel() == 16  # seed and offset, as CUDA's Philox state
    b = torch.empty(10, device="openreg").uniform_(generator=g)
    g.set_state(state)
    assert torch.equal(torch.empty(10, device="openreg").uniform_(generator=g).cpu(), b.cpu())
    with pytest.raises(RuntimeError, match="16 bytes"):
        g.set_state(torch.zeros(5056, dtype=torch.uint8))


# ---------------------------------------------------------------------------
# Fused dropout: one kernel, Philox4x32-10 keyed by the launch's draw


def _philox_block(seed, offset, index):
    """Philox4x32-10 (Salmon et al. 2011), written out independently of the C++."""
    m = 0xFFFFFFFF
    c = [index & m, index >> 32, offset & m, offset >> 32]
    k0, k1 = seed & m, seed >> 32
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & m, (k1 + 0xBB67AE85) & m
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & m, (p0 >> 32) ^ c[3] ^ k1, p0 & m]
    return c


def test_philox_reference_matches_the_published_known_answers():
    assert _philox_block(0, 0, 0) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    ones = 2**64 - 1
    assert _philox_block(ones, ones, ones) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]


def _expected_mask(seed, offset, n, keep):
    threshold = int(keep * 2**24)
    bits = [x for b in range((n + 3) // 4) for x in _philox_block(seed, offset, b)]
    return torch.tensor([(x >> 8) < threshold for x in bits[:n]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_fused_dropout_values(dtype):
    torch.openreg.manual_seed(2024)
    gen = torch.openreg.default_generators[0]
    x = torch.randn(37, 11).to(dtype)
    x[0, 0], x[0, 1], x[1, 0] = float("nan"), float("inf"), float("-inf")
    offset = gen.get_offset()
    out, mask = torch.native_dropout(x.to(D), 0.3, True)
    assert gen.get_offset() == offset + 1  # one launch, one draw
    expected = _expected_mask(2024, offset, x.numel(), 0.7).view(37, 11)
    assert torch.equal(mask.cpu(), expected)
    # The CPU's arithmetic on the CPU's values (a dropped NaN or inf is NaN).
    assert torch.equal(out.cpu().isnan(), (x * expected).isnan())
    ref = x * expected * (1 / 0.7)
    assert torch.allclose(out.cpu(), ref, rtol=0, atol=0, equal_nan=True)
    grad = torch.randn(37, 11).to(dtype)
    back = torch.ops.aten.native_dropout_backward(grad.to(D), mask, 1 / 0.7)
    assert torch.equal(back.cpu(), grad * expected * (1 / 0.7))


def test_fused_dropout_split_over_threads():
    # 3 * 16384 + 7 elements: the kernel and its backward split into chunks
    # of at least 16384 elements (the last one ragged) over the worker's
    # OpenMP team; the mask is the same stream whatever the split. The
    # numbers are computed 32 blocks at a time (a chunk can start inside a
    # batch), with an offset whose high word is not zero.
    n = 3 * 16384 + 7
    torch.openreg.manual_seed(77)
    gen = torch.openreg.default_generators[0]
    gen.set_offset(2**33 + 5)
    offset = gen.get_offset()
    x = torch.randn(n)
    out, mask = torch.native_dropout(x.to(D), 0.25, True)
    back = torch.ops.aten.native_dropout_backward(out, mask, 1 / 0.75)
    expected = _expected_mask(77, offset, n, 0.75)
    assert torch.equal(mask.cpu(), expected)
    ref = x * expected * (1 / 0.75)
    assert torch.equal(out.cpu(), ref)
    assert torch.equal(back.cpu(), ref * expected * (1 / 0.75))


def test_fused_dropout_layouts_and_autograd():
    torch.openreg.manual_seed(5)
    base = torch.randn(64, 48)
    on_device = base.to(D)
    # A dense permutation keeps its strides (one fused kernel); a strided
    # view takes the composed path. Either way: input * mask * scale.
    for xd in (on_device.t(), on_device[::2, ::3]):
        out, mask = torch.native_dropout(xd, 0.25, True)
        assert out.shape == xd.shape and mask.dtype == torch.bool
        if xd.is_contiguous() or xd.t().is_contiguous():
            assert out.stride() == xd.stride() and mask.stride() == xd.stride()
        assert torch.equal(out.cpu(), xd.cpu() * mask.cpu() * (1 / 0.75))
    w = torch.randn(32, 16, requires_grad=True)
    wd = w.detach().to(D).requires_grad_()
    y = F.dropout(wd, 0.5)
    (y * 3).sum().backward()
    kept = (y.detach().cpu() != 0).float()
    assert torch.equal(wd.grad.cpu(), kept * 3 * 2)
    assert 0.35 < kept.mean().item() < 0.65


def test_fused_dropout_edge_probabilities():
    x = torch.randn(100, device=D)
    out, mask = torch.native_dropout(x, 0.0, True)
    assert bool(mask.all()) and torch.equal(out.cpu(), x.cpu())
    out, mask = torch.native_dropout(x, 1.0, True)
    assert not bool(mask.any()) and torch.equal(out.cpu(), torch.zeros(100))
    with pytest.raises(RuntimeError, match="Bool"):
        torch.ops.aten.native_dropout_backward(x, x, 2.0)


def test_rng_state_under_a_functorch_transform():
    # torch.compile reads every device's RNG state while it traces, also
    # inside torch.func.jvp / vmap (found with roma's test_jvp_torch_compile
    # under the CUDA shim): the state is a plain CPU tensor there too, as
    # the CPU generator's (torch.get_rng_state) is.
    def f(x):
        state = torch.openreg.get_rng_state()
        return x * state.float().sum(), state

    def g(x):
        state = torch.get_rng_state()
        return x * state.float().sum(), state

    expected = torch.openreg.get_rng_state()
    x = torch.ones(3, device=D)
    (_, state), (tangent, _) = torch.func.jvp(f, (x,), (x,))
    assert torch.equal(state, expected)
    assert state.device.type == "cpu" and state.dtype == torch.uint8
    _, (cpu_tangent, _) = torch.func.jvp(g, (x.cpu(),), (x.cpu(),))
    scale = expected.float().sum() / torch.get_rng_state().float().sum()
    torch.testing.assert_close(tangent.cpu(), cpu_tangent * scale)
    states = torch.func.vmap(lambda t: t * torch.openreg.get_rng_state().float().sum())(
        torch.ones(2, 3, device=D)
    )
    assert states.shape == (2, 3)

    def h(x):  # what torch.compile does around a traced frame
        torch.openreg.set_rng_state(torch.openreg.get_rng_state())
        return x * 2

    _, tangent = torch.func.jvp(h, (x,), (x,))
    assert torch.equal(tangent.cpu(), torch.full((3,), 2.0))
    assert torch.equal(torch.openreg.get_rng_state(), expected)
