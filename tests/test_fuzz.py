"""The random-program fuzzer (tests/fuzz/) in the test command.

A bounded slice with fixed seeds (the long run is ``make fuzz``), the
two-stream block-reuse stress, the fuzzer's own checks (a seed reproduces a
program, the stream model rejects a racy program, a divergence is found,
minimized and printed as a standalone repro), and the divergences the fuzzer
found: fixed ones as regression tests, open ones as expected failures with
their minimal repro.
"""

import os

import pytest
import torch
from conftest import describe, run_python
from fuzz.minimize import minimize
from fuzz.program import Program, Stmt, compare, repro_source, run_program
from fuzz.runner import run_seed
from fuzz.streams import check
from fuzz.vocab import generate

D = "openreg"

# (streams, first seed, programs): ~450 programs of ~30 statements. Each
# program runs twice on openreg: the first call of a signature runs
# synchronously and is verified, later calls are queued.
SLICES = [(2, 0, 120), (2, 120, 120), (3, 100000, 120), (1, 200000, 90)]


@pytest.mark.parametrize(
    ("streams", "start", "count"), SLICES, ids=[f"{s}streams-{a}" for s, a, _ in SLICES]
)
def test_random_programs_match_the_cpu(streams, start, count):
    failures = []
    for seed in range(start, start + count):
        outcome = run_seed(seed, streams, 30, repeat=2)
        if outcome.divergences:
            failures.append(f"seed {seed}: {outcome.divergences[0]}")
    assert not failures, (
        f"{len(failures)} programs diverge from the CPU; a minimized repro of one: "
        f"python -m tests.fuzz repro SEED --streams {streams}\n" + "\n".join(failures[:10])
    )


def _in_subprocess(tmp_path, code):
    """Runs code in a fresh interpreter (a heap corruption aborts it, not pytest)."""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    run = run_python(
        f"import sys; sys.path.insert(0, {tests_dir!r})\n{code}", tmp_path, timeout=170
    )
    assert run.returncode == 0, describe(run)
    return run.stdout


def test_two_stream_block_reuse_stress(tmp_path):
    out = _in_subprocess(
        tmp_path, "import torch\nfrom fuzz.stress import stress\nprint(stress(60, 1))"
    )
    assert out.strip().endswith("[]"), out


# --- the fuzzer's own checks ----------------------------------------------


def test_a_seed_reproduces_its_program():
    a, b = generate(7, 2, 30), generate(7, 2, 30)
    assert a.source_lines() == b.source_lines()
    assert a.source_lines() != generate(8, 2, 30).source_lines()


def test_programs_use_every_kind_of_statement():
    kinds = set()
    code = ""
    for seed in range(40):
        program = generate(seed, 2, 30)
        kinds |= {s.kind for s in program.stmts}
        code += "\n".join(program.source_lines())
    assert {"op", "mk", "chk", "use", "wait", "hostsync", "rec", "del"} <= kinds
    for needle in ("out=", "wait_event", "wait_stream", "as_strided", ".permute(", "[::", "_("):
        assert needle in code, needle


def test_generated_programs_are_race_free():
    for seed in range(20):
        assert check(generate(seed, 3, 30)) is None, seed


def _racy_program():
    # t0 is written on stream 1 and read on stream 0 without a wait.
    return Program(
        0,
        2,
        [
            Stmt("t0 = mk((64,), torch.float32, 1)", "mk"),
            Stmt("S[1].wait_stream(S[0])", "wait", arg=(1, 0)),
            Stmt("use(S[1])", "use", arg=1),
            Stmt("t0.mul_(2)", writes=("t0",)),
            Stmt("use(S[0])", "use", arg=0),
            Stmt("t1 = t0 + 1"),
        ],
    )


def test_the_stream_model_rejects_races():
    program = _racy_program()
    assert "races" in check(program)
    fixed = Program(
        0,
        2,
        program.stmts[:5]
        + [Stmt("S[0].wait_stream(S[1])", "wait", arg=(0, 1))]
        + program.stmts[5:],
    )
    assert check(fixed) is None
    # A block used on stream 1 and freed without record_stream or a wait.
    freed = Program(
        0,
        2,
        fixed.stmts[:4] + [Stmt("use(S[0])", "use", arg=0), Stmt("del t0", "del", writes=("t0",))],
    )
    assert "frees a block" in check(freed)


def _planted_divergence():
    # Differs on purpose: the statement reads the device name.
    return Program(
        0,
        1,
        [
            Stmt("t0 = mk((3,), torch.float32, 5)", "mk"),
            Stmt("t1 = t0 * 2"),
            Stmt("t2 = t0 + (1 if DEV == 'cpu' else 2)"),
            Stmt("t3 = t1 - 1"),
        ],
    )


def test_divergences_are_found_minimized_and_printed(tmp_path):
    program = _planted_divergence()
    found = compare(program, run_program(program, "cpu"), run_program(program, D))
    assert [d.signature() for d in found] == [("final", "t2")]
    small = minimize(program, found[0].signature())
    assert small.source_lines() == [
        "t0 = mk((3,), torch.float32, 5)",
        "t2 = t0 + (1 if DEV == 'cpu' else 2)",
    ]
    path = tmp_path / "repro.py"
    path.write_text(repro_source(small, found))
    run = run_python(None, tmp_path, args=[path])
    assert run.returncode == 0, describe(run)
    assert "DIVERGES from the CPU" in run.stdout and "t2 differs" in run.stdout


def test_a_race_free_program_prints_a_clean_repro(tmp_path):
    path = tmp_path / "repro.py"
    path.write_text(repro_source(generate(3, 2, 20)))
    run = run_python(None, tmp_path, args=[path])
    assert run.returncode == 0, describe(run)
    assert run.stdout.strip().endswith("same as the CPU")


# --- divergences the fuzzer found ------------------------------------------


def test_record_stream_of_conjugate_and_negative_views(tmp_path):
    # PyTorch's Conjugate/Negative fallback released a clone twice for
    # record_stream (a write argument, no result): "free(): corrupted unsorted
    # chunks" within a few hundred calls. It passes through them now.
    _in_subprocess(
        tmp_path,
        """
import torch
s = torch.openreg.default_stream()
for make_view in (lambda z: z.conj(), lambda z: z.conj().imag):
    for i in range(400):
        z = torch.randn(5, 4, 1, 2, dtype=torch.complex64).to("openreg")
        view = make_view(z)
        assert view.is_conj() or view.is_neg()
        view.record_stream(s)
        w = z.cpu()
print("ok")
""",
    )


def test_a_view_of_an_empty_tensor_shares_its_storage():
    # unfold runs through the fallback: its CPU result was matched to the
    # device storage by address, which an empty storage does not have, so the
    # "view" was a new tensor and did not see the storage grow.
    for d in ("cpu", D):
        base = torch.empty(4, 0, device=d)
        view = base.unfold(0, 3, 1)
        torch.add(torch.ones(2, device=d), 1, out=base)  # grows base's storage
        assert view.untyped_storage().nbytes() == 8, d
        assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr(), d


def test_copy_into_empty_message_names_the_broadcast_shape():
    for d in ("cpu", D):
        with pytest.raises(RuntimeError) as e:
            torch.empty(0, device=d).copy_(torch.ones(3, 3, 1, 0, device=d))
        assert "doesn't match the broadcast shape [3, 3, 1, 0]" in str(e.value)


def _both(fn):
    out = []
    for d in ("cpu", D):
        try:
            out.append(("ok", fn(d)))
        except RuntimeError as e:
            out.append(("error", str(e).split("\n")[0]))
        torch.openreg.synchronize()
    return out


def test_out_resized_before_an_error_keeps_its_shape():
    def fn(d):
        values = torch.empty(0, device=d)
        indices = torch.empty(0, device=d)  # not int64: min raises after resizing values
        try:
            torch.min(torch.ones(3, 4, device=d), 0, out=(values, indices))
        except RuntimeError:
            pass
        return tuple(values.shape)

    cpu, dev = _both(fn)
    assert dev == cpu


def test_scalar_that_does_not_fit_the_dtype_raises_at_the_call():
    x = torch.zeros(3, dtype=torch.uint8, device=D)
    x.fill_(2.5)
    x.fill_(2.5)  # the signature is queued from now on
    raised_at_the_call = False
    try:
        x.fill_(-1.5)  # the CPU raises "value cannot be converted to type uint8_t ..."
    except RuntimeError:
        raised_at_the_call = True
    try:
        torch.openreg.synchronize()
    except RuntimeError:
        pass  # where openreg raises it today
    assert raised_at_the_call


@pytest.mark.xfail(strict=True, reason="open: any/all.dims out= runs PyTorch's generic kernel")
@pytest.mark.parametrize("op", ["any", "all"])
def test_any_all_with_dims_reject_a_non_bool_out(op):
    def fn(d):
        out = torch.zeros(4, 2, dtype=torch.float64, device=d)
        getattr(torch, op)(torch.ones(4, 2, 2, 4, device=d), (1, 3), out=out)
        return out.dtype

    cpu, dev = _both(fn)
    assert dev == cpu


def test_float_op_on_odd_size1_strides_has_the_cpu_strides():
    # Found by the fuzzer: PyTorch's generic kernel for the functional variant
    # of a structured op computed the result's strides on the device tensors;
    # routed to the fallback, the result takes the CPU kernel's strides.
    def fn(d):
        t = torch.full((2, 4, 5), 7, dtype=torch.bool, device=d)
        return torch.exp2(t.as_strided((1, 1, 3), (3, 1, 3), 15)).stride()

    cpu, dev = _both(fn)
    assert dev == cpu
