"""out= arguments after a failed call, and out of memory before host work.

- When a call with out= raises, the CPU (and CUDA's structured kernels) have
  resized `out` already, in the kernel's meta step: openreg leaves it in the
  same state (csrc/engine/fallback/OpenRegOutResize.h).
- A factory that cannot fit on the device raises torch.OutOfMemoryError
  before the host computes anything: the device allocation comes first, as
  a CUDA operator allocates its outputs before its kernel runs, so the
  host's memory does not grow by the result's size first. An operator whose
  results' sizes depend on the data (nonzero, masked_select,
  repeat_interleave) raises it when its kernel asks for one buffer larger
  than the device has free.
"""

import pytest
import torch
from conftest import describe, run_python

DEVICE = "openreg"


def _failing_calls(d):
    """(name, arguments maker, call, the tensor whose state is compared)."""

    def cumsum():
        src = torch.arange(3, device=d)
        out = torch.zeros(2, dtype=torch.bool, device=d)
        return out, lambda: torch.cumsum(src, 0, out=out)

    def cat_into_an_input():
        a = torch.ones(2, 3, device=d)
        b = torch.ones(2, 3, device=d)
        return a, lambda: torch.cat([a, b], out=a)

    def sum_into_its_input():
        x = torch.ones(2, 3, device=d)
        return x, lambda: torch.sum(x, 1, out=x)

    def amax_into_its_input():
        x = torch.ones(2, 3, device=d)
        return x, lambda: torch.amax(x, 1, out=x)

    def mm_wrong_dtype():
        a = torch.ones(2, 3, device=d)
        out = torch.empty(0, dtype=torch.int64, device=d)
        return out, lambda: torch.mm(a, a.t(), out=out)

    return {
        "cumsum": cumsum,
        "cat_into_an_input": cat_into_an_input,
        "sum_into_its_input": sum_into_its_input,
        "amax_into_its_input": amax_into_its_input,
        "mm_wrong_dtype": mm_wrong_dtype,
    }


@pytest.mark.parametrize("name", sorted(_failing_calls("cpu")))
def test_out_after_a_failed_call_is_resized_as_on_the_cpu(name):
    results = {}
    for d in ("cpu", DEVICE):
        out, call = _failing_calls(d)[name]()
        with _quiet():
            try:
                call()
                raised = None
            except Exception as e:  # noqa: BLE001  (compared below)
                raised = type(e)
        results[d] = (raised, tuple(out.shape), out.stride(), out.dtype)
    assert results["cpu"][0] is not None, results  # the case raises on the CPU
    assert results[DEVICE] == results["cpu"], results


class _quiet:
    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        self._w.__exit__(*exc)
        return False


def test_a_learnt_out_variant_still_resizes_a_fresh_out_at_every_call():
    # The host resizes an empty out= before the first run (the device writes
    # into it), and the queued calls after it resize theirs too.
    for n in (5, 5, 5, 7):
        out = torch.empty(0, device=DEVICE)
        torch.arange(0, n, out=out)
        assert torch.equal(out.cpu(), torch.arange(0, n, dtype=torch.float32))


# Each factory asks for ~1 GiB of a 256 MiB device. Every one is first called
# small (imports, learnt signatures), then big: it must raise openreg's
# OutOfMemoryError, and the process's peak RSS may not grow by more than a
# fraction of the result.
FACTORIES = """
import resource, sys, torch
def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
d = "openreg"
f64 = torch.float64
cases = {
    "arange": lambda n: torch.arange(0, n, device=d),
    "arange_start_step": lambda n: torch.arange(0, 2 * n, 2, device=d),
    "linspace": lambda n: torch.linspace(0, 1, n, dtype=f64, device=d),
    "logspace": lambda n: torch.logspace(0, 1, n, dtype=f64, device=d),
    "full": lambda n: torch.full((n,), 1.5, dtype=f64, device=d),
    "zeros": lambda n: torch.zeros(n, dtype=f64, device=d),
    "ones": lambda n: torch.ones(n, dtype=f64, device=d),
    "empty": lambda n: torch.empty(n, dtype=f64, device=d),
    "eye": lambda n: torch.eye(int(n ** 0.5), dtype=f64, device=d),
    "rand": lambda n: torch.rand(n, dtype=f64, device=d),
    "randn": lambda n: torch.randn(n, dtype=f64, device=d),
    "randint": lambda n: torch.randint(0, 9, (n,), device=d),
    "randperm": lambda n: torch.randperm(n, device=d),
    "tril_indices": lambda n: torch.tril_indices(int((n) ** 0.5), int((n) ** 0.5), device=d),
    "triu_indices": lambda n: torch.triu_indices(int((n) ** 0.5), int((n) ** 0.5), device=d),
    "zeros_like": lambda n: torch.zeros_like(torch.empty(n, dtype=f64, device="meta"), device=d),
    "full_like": lambda n: torch.full_like(torch.empty(n, dtype=f64, device="meta"), 2.0, device=d),
    "cat": lambda n: torch.cat([torch.ones(n // 8, dtype=f64, device=d)] * 8),
    "repeat": lambda n: torch.ones(n // 128, dtype=f64, device=d).repeat(128),
    # Results whose sizes depend on the data: one allocation of the kernel may
    # not exceed what the device has free.
    "nonzero": lambda n: torch.ones(n // 4, dtype=torch.bool, device=d).nonzero(),
    "masked_select": lambda n: torch.ones(n // 64, device=d).expand(64, n // 64).masked_select(
        torch.ones(1, dtype=torch.bool, device=d)
    ),
    "repeat_interleave": lambda n: torch.repeat_interleave(
        torch.full((16,), n // 16, device=d)
    ),
}
small, big = 1 << 10, 1 << 27  # 2^27 8-byte elements: 1 GiB
for name, make in cases.items():
    make(small).sum().item()
torch.openreg.synchronize()
for name, make in cases.items():
    before = peak_mb()
    try:
        make(big)
        torch.openreg.synchronize()
        outcome = "no error"
    except torch.OutOfMemoryError:
        outcome = "OOM"
    except Exception as e:
        outcome = type(e).__name__ + ": " + str(e)[:100]
    print(name, outcome, round(peak_mb() - before))
try:
    torch.arange(0, 2 ** 40, device=d)
    print("arange_2**40 no error 0")
except torch.OutOfMemoryError:
    print("arange_2**40 OOM 0")
"""


def test_factories_raise_out_of_memory_before_the_host_computes():
    proc = run_python(FACTORIES, env={"OPENREG_DEVICE_MEMORY": "256M"}, timeout=170)
    assert proc.returncode == 0, describe(proc)
    rows = [line.rsplit(" ", 2) for line in proc.stdout.strip().splitlines()]
    assert len(rows) == 23, describe(proc)
    for name, outcome, grown_mb in rows:
        # The inputs of cat and repeat are on the device already (a device
        # page counts in this process's RSS with the thread driver).
        assert outcome == "OOM", (name, outcome)
        assert int(grown_mb) < 160, (name, grown_mb, proc.stdout)
