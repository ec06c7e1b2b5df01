"""Two-stream stress: blocks freed on one stream and reused on another.

Each round produces a tensor on the default stream, consumes it on a side
stream with queued work (pointwise ops, a fallback reduction into an out=
argument that is resized, views, a gather), hands the result back, frees
both with ``record_stream`` and allocates again at once, so a block reused
before the other stream has passed its last use, a kernel writing through a
wrong alias or a result written on the wrong stream shows as a wrong value.
Every value is checked against the same round on the CPU. Run under
AddressSanitizer (``make SANITIZE=address fuzz``), host-heap corruption shows
as a report instead of a wrong value.
"""

from __future__ import annotations

import random

import torch


def _round(i: int, n: int, k: int, dev: str, side, main, rng_state: int):
    """One round; returns the tensors to check (moved to the CPU later)."""
    g = torch.Generator().manual_seed(rng_state)
    src = torch.randn(n, generator=g)
    idx = torch.randint(0, n, (n // 4,), generator=g)
    on_device = dev != "cpu"
    # Host-to-device copies from pageable memory wait for their stream: made
    # here, on the default stream, so the side stream's work stays queued.
    idx = idx.to(dev)
    a = (src * (i + 1)).to(dev)  # on the default stream, its only allocation
    if on_device:
        side.wait_stream(main)
        torch.openreg.set_stream(side)
    b = a * 2  # allocated on the side stream
    for _ in range(k):
        b.add_(a)  # queued on the side stream, reading a
    out = torch.empty(0, device=dev)
    torch.sum(b.view(-1, 16), 1, out=out)  # fallback, out= resized on the side stream
    view = b[1::3]
    view.mul_(-1)  # in place through a strided view
    picked = torch.gather(b, 0, idx)
    # A complex tensor read on the side stream through conjugate and negative
    # views, recorded through them (record_stream of a view with a math bit
    # once released a clone twice: heap corruption).
    z = torch.complex(a[: n // 2], a[n // 2 :])
    zc = z.conj()
    zsum = (zc * 2).sum() + zc.imag.sum()
    if on_device:
        torch.openreg.set_stream(main)
        a.record_stream(side)  # a was read on the side stream
        zc.record_stream(side)
        zc.imag.record_stream(side)
    del a  # its block may be reused at once on the default stream
    junk = torch.full((n,), float("nan"), device=dev)  # probably a's old block
    if on_device:
        main.wait_stream(side)
    del z, zc
    total = out.sum() + picked.sum() + junk.nan_to_num(0).sum() + zsum.real
    if on_device:
        idx.record_stream(side)
        for t in (b, out, picked, zsum):
            t.record_stream(main)
    return [b, out, picked, total]


def stress(iterations: int = 100, seed: int = 0, device: str = "openreg") -> list[str]:
    """Runs `iterations` rounds on `device` and on the CPU; returns mismatches."""
    rng = random.Random(seed)
    plan = [
        (rng.choice([64, 1024, 16384, 262144]), rng.randint(1, 6), rng.randrange(1 << 30))
        for _ in range(iterations)
    ]
    side = torch.openreg.Stream() if device != "cpu" else None
    main = torch.openreg.current_stream() if device != "cpu" else None
    kept = []
    for i, (n, k, state) in enumerate(plan):
        results = _round(i, n, k, device, side, main, state)
        # Keep a few results alive across rounds, drop the others at once.
        if i % 7 == 0:
            kept.append((i, results))
        else:
            kept.append((i, [r.cpu() for r in results]))
    if device != "cpu":
        torch.openreg.synchronize()
    mismatches = []
    for i, results in kept:
        n, k, state = plan[i]
        expected = _round(i, n, k, "cpu", None, None, state)
        for j, (got, want) in enumerate(zip(results, expected, strict=True)):
            try:
                torch.testing.assert_close(got.cpu(), want, equal_nan=True)
            except AssertionError as e:
                mismatches.append(f"round {i} (n={n}, k={k}) result {j}: {str(e).splitlines()[0]}")
    return mismatches
