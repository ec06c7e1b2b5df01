"""The helpers every fuzz program runs with, as source text.

The fuzzer executes this text in each program's namespace (with ``DEV`` and
``NSTREAMS`` set) and prints it at the top of every repro, so a repro runs
exactly the code the fuzzer ran. On the CPU the stream helpers do nothing;
on openreg ``S[0]`` is the default stream and ``S[1:]`` are side streams.
"""

PRELUDE = '''
import torch


def mk(shape, dtype, seed, special=False):
    """A tensor of reproducible values, made on the CPU and copied to DEV."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        t = torch.rand(shape, generator=g) < 0.5
    elif dtype.is_floating_point or dtype.is_complex:
        real = torch.float64 if dtype.is_floating_point else torch.complex128
        t = (torch.randn(shape, generator=g, dtype=real) * 3).to(dtype)
        if special and t.numel() > 0:
            flat = t.view(-1)
            picks = torch.randint(0, flat.numel(), (4,), generator=g)
            for i, v in zip(picks.tolist(), (float("nan"), float("inf"), -float("inf"), -0.0)):
                flat[i] = v
    elif dtype == torch.uint8:
        t = torch.randint(0, 10, shape, generator=g, dtype=dtype)
    else:
        t = torch.randint(-6, 7, shape, generator=g, dtype=dtype)
    return t.to(DEV)


def mkp(shape, dtype, seed):
    """As mk, through pinned memory and a non_blocking copy on openreg."""
    t = mk(shape, dtype, seed).cpu()
    if DEV == "cpu":
        return t
    return t.pin_memory().to(DEV, non_blocking=True)


def ix(shape, high, seed, dim=None):
    """Valid int64 indices in [0, high) (a CPU tensor); with dim, unique
    along dim (shape[dim] <= high), for writes whose order would matter."""
    g = torch.Generator().manual_seed(seed)
    if dim is None:
        return torch.randint(0, high, shape, generator=g)
    full = list(shape)
    full[dim] = high
    perm = torch.rand(full, generator=g).argsort(dim=dim)
    return perm.narrow(dim, 0, shape[dim]).contiguous()


if DEV == "cpu":

    class _Event:
        def record(self, stream=None):
            pass

        def synchronize(self):
            pass

    class _Stream:
        def wait_stream(self, other):
            pass

        def wait_event(self, event):
            pass

        def record_event(self, event=None):
            return event if event is not None else _Event()

        def synchronize(self):
            pass

    S = [_Stream() for _ in range(NSTREAMS)]

    def use(s):
        pass

    def rec(t, s):
        pass

    def sync():
        pass

else:
    S = [torch.openreg.default_stream()] + [
        torch.openreg.Stream(priority=-1 if i == 2 else 0) for i in range(1, NSTREAMS)
    ]

    def use(s):
        torch.openreg.set_stream(s)

    def rec(t, s):
        t.record_stream(s)

    def sync():
        torch.openreg.synchronize()


OBS = []


def chk(t, nb=False):
    """The host reads t on the current stream (non_blocking: into pinned
    memory, then waits for the current stream)."""
    if not isinstance(t, torch.Tensor):
        OBS.append(t)
    elif nb and DEV != "cpu":
        h = t.to("cpu", non_blocking=True)
        torch.openreg.current_stream().synchronize()
        OBS.append(h.clone())
    else:
        OBS.append(t.cpu().clone())
'''
