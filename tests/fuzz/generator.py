"""Random fuzz programs: the generator's core (variables, streams, ordering).

The generator runs each statement on the CPU as it emits it, so it always
knows the shapes and dtypes of the live variables, and a seed reproduces a
program exactly. Before a statement it asks the stream model (streams.py)
which waits the statement needs and inserts them, in a randomly chosen form
(``wait_stream``, ``wait_event``, a stream or event ``synchronize``, a
device ``sync()``); before a block is freed (``del``, an ``out=`` argument
that may be resized) it records the block on the other streams that used it
or makes its stream wait. The op vocabulary is in vocab.py.
"""

from __future__ import annotations

import random
import warnings

import torch

from .program import Program, Stmt, exec_stmt, new_namespace, tensor_vars
from .streams import StreamModel

DTYPES = [
    (torch.float32, 40),
    (torch.float64, 8),
    (torch.float16, 8),
    (torch.bfloat16, 8),
    (torch.int64, 12),
    (torch.int32, 6),
    (torch.int16, 2),
    (torch.uint8, 4),
    (torch.bool, 8),
    (torch.complex64, 4),
]


# Divergences the fuzzer found that are not fixed yet (reported in issue 10).
# The generator leaves out statements that would only find them again (each
# is tested as an expected failure in tests/test_fuzz.py); `--include-known`
# keeps them. A predicate sees the statement, its CPU error and whether it
# resized an out= argument.
KNOWN_ISSUES = {
    "out-resized-then-error": (
        "an out= call that raises after resizing its output: the CPU keeps the new shape, "
        "openreg the old one",
        lambda code, err, resized: err is not None and resized,
    ),
    "scalar-overflow-deferred": (
        "a Scalar that does not fit the tensor's dtype (torch.full((2,), -1.5, dtype=uint8)): "
        "the CPU raises at the call, openreg at the next synchronization once the signature "
        "was seen with a value that fits (fill, masked_fill and index_fill check on the host, "
        "kScalarMustFitSelf; other ops converting a Scalar may still defer)",
        lambda code, err, resized: err is not None and "cannot be converted to type" in err[1],
    ),
    "any-all-dims-out": (
        "torch.any/all with a tuple of dims and an out= of another dtype than bool: the CPU "
        "raises, openreg runs PyTorch's generic out= wrapper, which casts",
        lambda code, err, resized: (
            err is not None and "only supports bool tensor for result" in err[1]
        ),
    ),
}


# Kinds of divergence (program.compare) that are known issues: counted apart
# unless --include-known. (Empty since the functional variants of structured
# operators take the CPU kernel's result strides, "size1-strides" included.)
KNOWN_KINDS: tuple[str, ...] = ()

# Errors that depend on tensor values (integer division by a zero element):
# openreg may raise them at the next synchronization, naming the op, as CUDA's
# device-side asserts (CUDA does not raise this one at all); the statement is
# left out. tests/test_fidelity.py covers where such errors surface.
VALUE_DEPENDENT_ERRORS = ("ZeroDivisionError",)


class GeneratorCore:
    def __init__(self, seed: int, n_streams: int, avoid_known: bool = True):
        self.avoid_known = avoid_known
        self.seed = seed
        self.rng = random.Random(seed)
        self.n_streams = n_streams
        self.ns = new_namespace("cpu", n_streams)
        self.model = StreamModel(n_streams)
        self.stmts: list[Stmt] = []
        self.counter = 0

    # -- randomness -----------------------------------------------------

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick_weighted(self, pairs):
        items, weights = zip(*pairs, strict=True)
        return self.rng.choices(items, weights)[0]

    def dtype(self) -> torch.dtype:
        return self.pick_weighted(DTYPES)

    def float_dtype(self) -> torch.dtype:
        return self.pick_weighted(
            [(torch.float32, 6), (torch.float64, 2), (torch.float16, 1), (torch.bfloat16, 1)]
        )

    def dim_size(self) -> int:
        r = self.rng.random()
        if r < 0.02:
            return 0
        if r < 0.06:
            return self.rng.choice([17, 33, 64])
        return self.rng.randint(1, 6)

    def shape(self, rank: int | None = None) -> tuple[int, ...]:
        if rank is None:
            rank = self.pick_weighted([(0, 4), (1, 25), (2, 35), (3, 26), (4, 10)])
        return tuple(self.dim_size() for _ in range(rank))

    def seed_value(self) -> int:
        return self.rng.randrange(1 << 20)

    # -- variables ------------------------------------------------------

    def new_name(self) -> str:
        name = f"t{self.counter}"
        self.counter += 1
        return name

    def vars(self, pred=None) -> list[str]:
        out = []
        for name, t in tensor_vars(self.ns).items():
            try:
                if pred is None or pred(t):
                    out.append(name)
            except Exception:  # noqa: BLE001  (a predicate that does not apply)
                pass
        return sorted(out, key=lambda n: int(n[1:]))

    def t(self, name: str) -> torch.Tensor:
        return self.ns[name]

    def pick(self, pred=None) -> str | None:
        names = self.vars(pred)
        return self.rng.choice(names) if names else None

    def cpu_eval(self, expr: str):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                return eval(expr, self.ns)  # noqa: S307  (the generator's own code)
            except Exception:  # noqa: BLE001
                return None

    # -- making tensors ---------------------------------------------------

    def mk_expr(self, shape, dtype) -> str:
        shape = tuple(shape)
        special = (dtype.is_floating_point or dtype.is_complex) and self.chance(0.1)
        if self.chance(0.08):
            return f"mkp({shape}, {dtype}, {self.seed_value()})"
        extra = ", special=True" if special else ""
        return f"mk({shape}, {dtype}, {self.seed_value()}{extra})"

    def make(self, shape=None, dtype=None) -> str:
        """Emits a statement making a new tensor; returns its name."""
        shape = self.shape() if shape is None else shape
        dtype = self.dtype() if dtype is None else dtype
        name = self.new_name()
        if self.chance(0.8):
            self.emit(f"{name} = {self.mk_expr(shape, dtype)}", kind="mk")
        else:
            factory = self.rng.choice(["zeros", "ones", "full", "arange"])
            shape = tuple(shape)
            if factory == "full":
                value = "True" if dtype == torch.bool else self.rng.choice(["2", "-1.5", "0.25"])
                code = f"torch.full({shape}, {value}, dtype={dtype}, device=DEV)"
            elif factory == "arange":
                n = 1
                for s in shape:
                    n *= s
                code = f"torch.arange({n}, device=DEV).to({dtype}).reshape({shape})"
            else:
                code = f"torch.{factory}({shape}, dtype={dtype}, device=DEV)"
            self.emit(f"{name} = {code}")
        return name

    def get(self, pred=None, shape=None, dtype=None, p_new: float = 0.25) -> str:
        """An existing variable satisfying pred, or a new tensor."""
        if not self.chance(p_new):
            name = self.pick(pred)
            if name is not None:
                return name
        name = self.make(shape, dtype)
        return name if name in self.ns else self.make((3, 4), torch.float32)

    # -- emitting -------------------------------------------------------

    def order_after(self, t: int) -> None:
        """Orders the current stream after everything stream t enqueued."""
        s = self.model.cur
        form = self.pick_weighted(
            [
                ("wait_stream", 40),
                ("wait_event", 30),
                ("stream_sync", 10),
                ("event_sync", 10),
                ("sync", 10),
            ]
        )
        if form == "wait_stream":
            self.emit(f"S[{s}].wait_stream(S[{t}])", kind="wait", arg=(s, t))
        elif form == "wait_event":
            self.emit(f"S[{s}].wait_event(S[{t}].record_event())", kind="wait", arg=(s, t))
        elif form == "stream_sync":
            self.emit(f"S[{t}].synchronize()", kind="hostsync", arg=t)
        elif form == "event_sync":
            self.emit(f"S[{t}].record_event().synchronize()", kind="hostsync", arg=t)
        else:
            self.emit("sync()", kind="hostsync", arg=None)

    def cover_free(self, name: str) -> None:
        """Makes freeing `name`'s block safe now (record_stream or a wait)."""
        key = self.model.var_block.get(name)
        for t in self.model.needed_for_free(key):
            alloc = self.model.blocks[key].alloc
            form = self.pick_weighted([("rec", 60), ("wait", 25), ("host", 15)])
            if form == "rec":
                self.emit(f"rec({name}, S[{t}])", kind="rec", writes=(name,), arg=t)
            elif form == "wait":
                self.emit(f"S[{alloc}].wait_stream(S[{t}])", kind="wait", arg=(alloc, t))
            else:
                self.emit(f"S[{t}].synchronize()", kind="hostsync", arg=t)

    def emit(self, code: str, kind: str = "op", writes=(), arg=None, out=()):
        """Emits a statement, preceded by the orderings it needs; `out`
        names arguments the statement may resize. Returns its CPU error."""
        stmt = Stmt(code, kind, tuple(writes) + tuple(out), arg)
        if kind in ("op", "mk", "chk"):
            for name in out:
                if name in self.ns:
                    self.cover_free(name)
            for t in self.model.needed_waits(stmt.reads, stmt.writes):
                self.order_after(t)
        shapes = {n: tuple(self.ns[n].shape) for n in out if n in self.ns}
        self.model.before(stmt, self.ns)
        err, _ = exec_stmt(self.ns, stmt)
        self.model.after(stmt, self.ns, err)
        self.stmts.append(stmt)
        resized = any(
            n in self.ns and tuple(self.ns[n].shape) != shape for n, shape in shapes.items()
        )
        known = self.avoid_known and any(
            pred(code, err, resized) for _, pred in KNOWN_ISSUES.values()
        )
        if known or (err is not None and err[0] in VALUE_DEPENDENT_ERRORS):
            self.retract()
            return ("Retracted", "a known divergence")
        if err is not None:
            # A failed out= call may have resized its output first: its new
            # elements were never written, so the variable goes.
            for n, shape in shapes.items():
                if n in self.ns and tuple(self.ns[n].shape) != shape:
                    self.delete(n)
        return err

    def retract(self) -> None:
        """Drops the last statement: replays the others on a fresh CPU."""
        self.stmts.pop()
        self.ns = new_namespace("cpu", self.n_streams)
        self.model = StreamModel(self.n_streams)
        for stmt in self.stmts:
            self.model.before(stmt, self.ns)
            err, _ = exec_stmt(self.ns, stmt)
            self.model.after(stmt, self.ns, err)

    def delete(self, name: str) -> None:
        if not self.model.sharing(name):
            self.cover_free(name)
        self.emit(f"del {name}", kind="del", writes=(name,))

    def switch_stream(self) -> None:
        k = self.rng.randrange(self.n_streams)
        if k != self.model.cur:
            self.emit(f"use(S[{k}])", kind="use", arg=k)

    def program(self) -> Program:
        return Program(self.seed, self.n_streams, list(self.stmts))
