"""The op vocabulary of the fuzzer and ``generate``, the program generator.

Each action emits one or a few statements: pointwise ops with broadcasting,
type promotion, Python and 0-dim scalars (functional, method, in-place,
operator and ``out=`` forms); reductions; matmuls; indexing, gather/scatter,
index_put and masks with valid indices; cat/stack/split; views (steps,
transpose, permute, expand, as_strided within the storage, dtype views,
conjugate views, ...); copies and conversions; host reads; stream switches;
deletions. ``out=`` arguments are of the right shape, a wrong shape, empty,
another dtype, or an existing variable (a view, an input).

Indices are always in range and writes through duplicate indices only
accumulate, so every program has one well-defined result.
"""

from __future__ import annotations

import math

import torch

from .generator import GeneratorCore
from .program import VAR_RE, Program

# fmt: off
UNARY = [
    "neg", "abs", "exp", "sin", "cos", "sqrt", "relu", "sigmoid", "floor", "ceil", "round",
    "sign", "logical_not", "bitwise_not", "reciprocal", "tanh", "log1p", "square", "frac",
    "trunc", "sgn", "erf", "rsqrt", "exp2", "expm1", "log", "signbit", "isnan", "isinf",
    "nan_to_num", "positive", "angle", "deg2rad", "logit", "sinc", "asin", "atan", "sinh",
]
UNARY_ARGS = {
    "clamp": ["min=-1, max=2", "min=0.5", "max=1"],
    "round": ["decimals=1"],
    "pow": ["2", "0.5", "-1", "3"],
    "nan_to_num": ["nan=0.0, posinf=1.0"],
    "logit": ["eps=1e-3"],
    "hardtanh": [],
}
BINARY = [
    "add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "maximum",
    "minimum", "pow", "atan2", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
    "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
    "bitwise_right_shift", "hypot", "copysign", "fmax", "fmin", "heaviside", "xlogy", "gcd",
    "ldexp", "nextafter", "float_power",
]
SYMBOLS = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "floor_divide": "//", "remainder": "%",
    "pow": "**", "bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^",
    "bitwise_left_shift": "<<", "bitwise_right_shift": ">>", "eq": "==", "ne": "!=", "lt": "<",
    "le": "<=", "gt": ">", "ge": ">=",
}
REDUCTIONS = [
    "sum", "mean", "prod", "amax", "amin", "argmax", "argmin", "any", "all", "std", "var",
    "logsumexp", "norm", "nansum", "count_nonzero", "cumsum", "cumprod", "logcumsumexp",
    "softmax", "log_softmax", "nanmean",
]
PAIR_REDUCTIONS = ["max", "min", "median", "mode", "cummax", "cummin", "aminmax", "var_mean"]
SCALARS = [
    "2", "-3", "0", "1", "2.5", "-0.5", "1e-3", "0.0", "True", "False", 'float("nan")', "(1+2j)",
    "7",
]
INDEX_KINDS = [
    "gather", "scatter", "scatter_add", "scatter_reduce", "index_select", "index_add",
    "index_copy", "index_fill", "getitem", "setitem", "index_put", "mask", "masked_fill", "take",
    "put",
]
MISC_KINDS = [
    "clone", "contiguous", "to", "copy_", "fill_", "zero_", "flip", "roll", "tril", "sort",
    "topk", "diff", "repeat", "nonzero", "unique", "item", "masked_select", "cumsum_",
    "softmax_nn", "argsort", "kthvalue", "searchsorted", "one_hot", "embedding", "pad", "isclose",
    "equal",
]
# fmt: on


class Generator(GeneratorCore):
    # -- operands -------------------------------------------------------

    def inline_view(self, name: str) -> str:
        """`name` itself, or now and then a non-contiguous view of it."""
        t = self.t(name)
        if t.dim() == 0 or not self.chance(0.15):
            return name
        options = [f"{name}[::2]", f"{name}.transpose(0, -1)", f"{name}.unsqueeze(0)"]
        if t.dim() == 2:
            options.append(f"{name}.t()")
        return self.rng.choice(options)

    def broadcast_shape_of(self, shape) -> tuple[int, ...]:
        shape = list(shape)
        if shape and self.chance(0.5):
            shape = shape[self.rng.randint(0, len(shape)) :]
        return tuple(1 if self.chance(0.3) else s for s in shape)

    def second(self, a: str, cpu_scalars: bool = False) -> str:
        """The second operand of an op with `a`. CPU 0-dim tensors only with
        cpu_scalars: CUDA accepts them in binary ops only (TensorIterator's
        allow_cpu_scalars), and openreg follows CUDA, not the CPU, there."""
        ta = self.t(a)
        r = self.rng.random()
        if r < 0.2:
            return self.rng.choice(SCALARS)
        if r < 0.28 and cpu_scalars:
            v = self.rng.choice(["2.5", "3", "True", "-1"])
            return f"torch.tensor({v})" if self.chance(0.6) else f"torch.tensor({v}, device=DEV)"
        if r < 0.6:

            def fits(t):
                torch.broadcast_shapes(t.shape, ta.shape)
                return True

            name = self.pick(fits)
            if name is not None:
                return self.inline_view(name)
        if r < 0.63:
            return self.inline_view(self.get())  # any shape: maybe an error
        dtype = ta.dtype if self.chance(0.5) else self.dtype()
        return self.make(self.broadcast_shape_of(ta.shape), dtype)

    def out_arg(self, like: torch.Tensor | None, args: str = "", pointwise: bool = False) -> str:
        """An out= argument for a result like `like` (a guess) of a call
        with arguments `args`.

        An input is only reused as out= by a pointwise op and if it has the
        result's shape: a call that resizes an output which is also its input
        reads memory that the resize left uninitialized (the CPU's own result
        varies from run to run), and a matmul or reduction writing its input
        while reading it has no defined result (CPU and CUDA kernels differ)."""
        shape = tuple(like.shape) if like is not None else self.shape()
        dtype = like.dtype if like is not None else self.dtype()
        r = self.rng.random()
        if r < 0.2:
            existing = self.pick()
            if existing is not None:
                t = self.t(existing)
                inputs = {self.model.var_block.get(n) for n in VAR_RE.findall(args)}
                if self.model.var_block.get(existing) not in inputs or (
                    pointwise and like is not None and t.shape == like.shape
                ):
                    return existing
        name = self.new_name()
        if r < 0.5:
            code = f"torch.full({shape}, 7, dtype={dtype}, device=DEV)"
        elif r < 0.7:
            code = f"torch.empty(0, dtype={dtype}, device=DEV)"
        elif r < 0.85:
            code = f"torch.zeros({self.shape()}, dtype={dtype}, device=DEV)"
        else:
            code = f"torch.zeros({shape}, dtype={self.dtype()}, device=DEV)"
        if self.chance(0.15) and len(shape) >= 2 and 0 not in shape:
            # A non-contiguous out= of the right shape.
            code = f"torch.full({shape[::-1]}, 7, dtype={dtype}, device=DEV).mT"
            if len(shape) > 2:
                code = (
                    f"torch.full({shape[:-2] + shape[::-1][:2]}, 7, dtype={dtype}, device=DEV).mT"
                )
        self.emit(f"{name} = {code}")
        return name if name in self.ns else self.make(shape, dtype)

    def result_like(self, expr: str):
        v = self.cpu_eval(expr)
        if isinstance(v, (tuple, list)):
            v = v[0] if v else None
        return v if isinstance(v, torch.Tensor) else None

    def call(self, fn_expr: str, args: str, method=None, pointwise: bool = False):
        """Emits fn(args) in one of its forms: new variable, method, out=."""
        form = self.pick_weighted([("fn", 5), ("method", 2), ("out", 3)])
        if form == "method" and method is not None:
            name = self.new_name()
            self.emit(f"{name} = {method}")
            return
        if form == "out":
            o = self.out_arg(self.result_like(f"{fn_expr}({args})"), args, pointwise)
            self.emit(f"{fn_expr}({args}, out={o})", out=(o,))
            return
        name = self.new_name()
        self.emit(f"{name} = {fn_expr}({args})")

    # -- actions --------------------------------------------------------

    def a_unary(self):
        a = self.get()
        op = self.rng.choice(UNARY + list(UNARY_ARGS))
        choices = UNARY_ARGS.get(op)
        extra = (", " + self.rng.choice(choices)) if choices else ""
        if op == "hardtanh":
            self.emit(f"{self.new_name()} = torch.nn.functional.hardtanh({self.inline_view(a)})")
            return
        if self.chance(0.3) and hasattr(torch.Tensor, op + "_"):
            self.emit(f"{a}.{op}_({extra[2:]})", writes=(a,))
            return
        self.call(
            f"torch.{op}", self.inline_view(a) + extra, f"{a}.{op}({extra[2:]})", pointwise=True
        )

    def a_binary(self):
        a = self.get()
        op = self.rng.choice(BINARY)
        b = self.second(a, cpu_scalars=True)
        kw = ""
        if op in ("add", "sub") and self.chance(0.2):
            kw = ", alpha=" + self.rng.choice(["2", "0.5", "-1"])
        if op == "div" and self.chance(0.3):
            kw = ", rounding_mode=" + self.rng.choice(['"trunc"', '"floor"'])
        r = self.rng.random()
        if r < 0.25 and hasattr(torch.Tensor, op + "_"):
            self.emit(f"{a}.{op}_({b}{kw})", writes=(a,))
        elif r < 0.4 and op in SYMBOLS:
            if self.chance(0.3) and op not in ("eq", "ne", "lt", "le", "gt", "ge"):
                self.emit(f"{a} {SYMBOLS[op]}= {b}", writes=(a,))
            else:
                self.emit(f"{self.new_name()} = {a} {SYMBOLS[op]} {b}")
        else:
            args = f"{self.inline_view(a)}, {b}{kw}"
            self.call(f"torch.{op}", args, f"{a}.{op}({b}{kw})", pointwise=True)

    def a_ternary(self):
        a = self.get()
        ta = self.t(a)
        kind = self.rng.choice(["where", "addcmul", "addcdiv", "lerp", "clamp"])
        b = self.second(a)
        if kind == "where":
            cond = self.rng.choice([f"{a} > 0", self.get(lambda t: t.dtype == torch.bool)])
            self.call("torch.where", f"{cond}, {a}, {b}", pointwise=True)
        elif kind in ("addcmul", "addcdiv"):
            c = self.second(a)
            value = self.rng.choice(["", ", value=0.5", ", value=2"])
            if self.chance(0.3):
                self.emit(f"{a}.{kind}_({b}, {c}{value})", writes=(a,))
            else:
                self.call(f"torch.{kind}", f"{a}, {b}, {c}{value}", pointwise=True)
        elif kind == "lerp":
            w = self.rng.choice(["0.3", self.make(self.broadcast_shape_of(ta.shape), ta.dtype)])
            if self.chance(0.3):
                self.emit(f"{a}.lerp_({b}, {w})", writes=(a,))
            else:
                self.call("torch.lerp", f"{a}, {b}, {w}", pointwise=True)
        else:
            lo = self.make(self.broadcast_shape_of(ta.shape), ta.dtype)
            self.call("torch.clamp", f"{a}, min={lo}, max={b}", pointwise=True)

    def dim_arg(self, t: torch.Tensor) -> str:
        n = max(t.dim(), 1)
        r = self.rng.random()
        if r < 0.04:
            return str(n)  # out of range
        if r < 0.12 and t.dim() >= 2:
            d = self.rng.sample(range(t.dim()), 2)
            return f"({d[0]}, {d[1]})"
        return str(self.rng.randint(-n, n - 1))

    def a_reduce(self):
        a = self.get()
        ta = self.t(a)
        if self.chance(0.25):
            op = self.rng.choice(PAIR_REDUCTIONS)
            if op == "median" and any(
                st == 0 and n > 1 for st, n in zip(ta.stride(), ta.shape, strict=True)
            ):
                # PyTorch's CPU median along a dim reads uninitialized memory
                # for an expanded input: torch.median(torch.tensor(5.).expand(4), 0)
                # gives 4.6e-41 (the CPU's own result is garbage).
                op = "max"
            d = self.dim_arg(ta)
            if op == "aminmax":
                args = f"{a}, dim={d}"
            elif op == "var_mean":
                args = f"{a}, {d}"
            else:
                args = f"{a}, {d}" + (", keepdim=True" if self.chance(0.3) else "")
            r = self.rng.random()
            if r < 0.4:
                self.emit(f"{self.new_name()}, {self.new_name()} = torch.{op}({args})")
            elif r < 0.7:
                field = "[0]" if op in ("aminmax", "var_mean") else ".values"
                self.emit(f"{self.new_name()} = torch.{op}({args}){field}")
            else:
                like = self.result_like(f"torch.{op}({args})")
                o1 = self.out_arg(like, args)
                o2 = self.out_arg(None if like is None else like.long(), args)
                self.emit(f"torch.{op}({args}, out=({o1}, {o2}))", out=(o1, o2))
            return
        op = self.rng.choice(REDUCTIONS)
        first = self.inline_view(a)
        args = first
        needs_dim = op in ("cumsum", "cumprod", "logcumsumexp", "softmax", "log_softmax")
        if needs_dim or self.chance(0.7):
            d = self.dim_arg(ta)
            if needs_dim and d.startswith("("):
                d = "0"
            args += f", {d}"
            if not needs_dim and op not in ("count_nonzero",) and self.chance(0.4):
                args += ", keepdim=True"
        if op in ("sum", "prod", "mean", "cumsum", "nansum", "softmax") and self.chance(0.2):
            args += f", dtype={self.dtype()}"
        self.call(f"torch.{op}", args, method=f"{first}.{op}({args[len(first) + 2 :]})")

    def a_matmul(self):
        dtype = self.pick_weighted(
            [
                (torch.float32, 6),
                (torch.float64, 2),
                (torch.float16, 1),
                (torch.bfloat16, 1),
                (torch.int64, 1),
                (torch.complex64, 1),
            ]
        )
        m, k, n = (self.rng.choice([1, 2, 3, 4, 5, 7, 17]) for _ in range(3))

        def operand(rows, cols):
            if self.chance(0.3):
                return self.make((cols, rows), dtype) + ".t()"
            name = self.pick(lambda t: tuple(t.shape) == (rows, cols) and t.dtype == dtype)
            return name if name is not None and self.chance(0.5) else self.make((rows, cols), dtype)

        kind = self.rng.choice(
            [
                "mm",
                "matmul",
                "bmm",
                "addmm",
                "mv",
                "dot",
                "outer",
                "einsum",
                "@",
                "baddbmm",
                "linear",
            ]
        )
        if kind in ("mm", "matmul"):
            self.call(f"torch.{kind}", f"{operand(m, k)}, {operand(k, n)}")
        elif kind == "@":
            self.emit(f"{self.new_name()} = {operand(m, k)} @ {operand(k, n)}")
        elif kind in ("bmm", "baddbmm"):
            b = self.rng.randint(1, 3)
            x, y = self.make((b, m, k), dtype), self.make((b, k, n), dtype)
            if kind == "bmm":
                self.call("torch.bmm", f"{x}, {y}")
            else:
                self.call("torch.baddbmm", f"{self.make((b, m, n), dtype)}, {x}, {y}, alpha=0.5")
        elif kind == "addmm":
            bias = self.make(self.rng.choice([(m, n), (n,), (1, n)]), dtype)
            self.call("torch.addmm", f"{bias}, {operand(m, k)}, {operand(k, n)}, beta=2")
        elif kind == "mv":
            self.call("torch.mv", f"{operand(m, k)}, {self.make((k,), dtype)}")
        elif kind == "dot":
            self.call("torch.dot", f"{self.make((k,), dtype)}, {self.make((k,), dtype)}")
        elif kind == "outer":
            self.call("torch.outer", f"{self.make((m,), dtype)}, {self.make((n,), dtype)}")
        elif kind == "linear":
            w = operand(n, k)
            self.emit(f"{self.new_name()} = torch.nn.functional.linear({operand(m, k)}, {w})")
        else:
            self.emit(
                f'{self.new_name()} = torch.einsum("ij,jk->ik", {operand(m, k)}, {operand(k, n)})'
            )

    def index_tensor(self, shape, high, dim=None) -> str:
        return f"ix({tuple(shape)}, {high}, {self.seed_value()}{'' if dim is None else f', {dim}'})"

    def a_index(self):
        a = self.get(lambda t: t.dim() >= 1 and t.numel() > 0)
        ta = self.t(a)
        if ta.dim() == 0 or ta.numel() == 0:
            return
        d = self.rng.randrange(ta.dim())
        size = ta.shape[d]
        kind = self.rng.choice(INDEX_KINDS)
        dev = ".to(DEV)"
        if kind in ("gather", "scatter", "scatter_add", "scatter_reduce"):
            shape = [self.rng.randint(1, s) for s in ta.shape]
            if kind == "gather":
                shape[d] = self.rng.randint(1, 4)
                self.call("torch.gather", f"{a}, {d}, {self.index_tensor(shape, size)}{dev}")
                return
            unique = kind == "scatter"
            idx = self.index_tensor(shape, size, d if unique else None) + dev
            src = self.make(shape, ta.dtype if self.chance(0.8) else self.dtype())
            if kind == "scatter" and self.chance(0.3):
                src = self.rng.choice(["2.0", "-1", "True"])
            extra = ""
            if kind == "scatter_reduce":
                reduce = self.rng.choice(['"sum"', '"prod"', '"amax"', '"amin"', '"mean"'])
                extra = f", reduce={reduce}, include_self={self.rng.choice(['True', 'False'])}"
            if self.chance(0.6):
                self.emit(f"{a}.{kind}_({d}, {idx}, {src}{extra})", writes=(a,))
            else:
                self.call(f"torch.{kind}", f"{a}, {d}, {idx}, {src}{extra}")
            return
        n = self.rng.randint(1, 4)
        if kind == "index_select":
            self.call("torch.index_select", f"{a}, {d}, {self.index_tensor((n,), size)}{dev}")
        elif kind in ("index_add", "index_copy", "index_fill"):
            unique = kind == "index_copy"
            n = min(n, size) if unique else n
            idx = self.index_tensor((n,), size, 0 if unique else None) + dev
            if kind == "index_fill":
                self.emit(
                    f"{a}.index_fill_({d}, {idx}, {self.rng.choice(SCALARS[:8])})", writes=(a,)
                )
                return
            shape = list(ta.shape)
            shape[d] = n
            src = self.make(shape, ta.dtype if self.chance(0.85) else self.dtype())
            alpha = ", alpha=2" if kind == "index_add" and self.chance(0.3) else ""
            if self.chance(0.6):
                self.emit(f"{a}.{kind}_({d}, {idx}, {src}{alpha})", writes=(a,))
            else:
                self.call(f"torch.{kind}", f"{a}, {d}, {idx}, {src}{alpha}")
        elif kind == "getitem":
            where = "" if self.chance(0.3) else dev  # CPU indices are accepted, as on CUDA
            idx = self.index_tensor((n,), ta.shape[0]) + where
            sel = self.rng.choice(
                [
                    f"[{idx}]",
                    f"[{idx}, ...]",
                    f"[..., {self.index_tensor((n,), ta.shape[-1])}{where}]",
                    f"[[0, {ta.shape[0] - 1}]]",
                ]
            )
            self.emit(f"{self.new_name()} = {a}{sel}")
        elif kind in ("setitem", "index_put"):
            accumulate = kind == "index_put" and self.chance(0.5)
            n = n if accumulate else min(n, ta.shape[0])
            where = "" if self.chance(0.3) else dev
            idx = self.index_tensor((n,), ta.shape[0], None if accumulate else 0) + where
            vshape = (n,) + tuple(ta.shape[1:])
            value = self.rng.choice(
                [self.rng.choice(SCALARS[:8]), self.make(self.broadcast_shape_of(vshape), ta.dtype)]
            )
            if kind == "setitem":
                if self.chance(0.4):
                    sl = self.rng.choice(
                        [
                            "[::2]",
                            "[1:]",
                            "[..., :1]",
                            "[0]",
                            "[:, ::3]" if ta.dim() > 1 else "[-1:]",
                        ]
                    )
                    value = self.rng.choice(SCALARS[:8] + [f"{a}{sl}.flip(0)", f"{a}{sl} * 2"])
                    self.emit(f"{a}{sl} = {value}", writes=(a,))
                else:
                    self.emit(f"{a}[{idx}] = {value}", writes=(a,))
            else:
                if not value.startswith("t"):
                    value = f"torch.tensor({value}, dtype={ta.dtype}, device=DEV)"
                self.emit(
                    f"{a}.index_put_(({idx},), {value}, accumulate={accumulate})", writes=(a,)
                )
        elif kind == "mask":
            self.emit(
                f"{self.new_name()} = {a}[{a} > 0]"
                if ta.dtype != torch.bool
                else f"{self.new_name()} = {a}[{a}]"
            )
        elif kind == "masked_fill":
            mask = self.get(
                lambda t: t.dtype == torch.bool,
                shape=self.broadcast_shape_of(ta.shape),
                dtype=torch.bool,
            )
            if self.chance(0.5):
                self.emit(f"{a}.masked_fill_({mask}, {self.rng.choice(SCALARS[:8])})", writes=(a,))
            else:
                self.call("torch.masked_fill", f"{a}, {mask}, {self.rng.choice(SCALARS[:8])}")
        elif kind == "take":
            self.call("torch.take", f"{a}, {self.index_tensor((n,), ta.numel())}{dev}")
        else:
            accumulate = self.chance(0.5)
            n = n if accumulate else min(n, ta.numel())
            idx = self.index_tensor((n,), ta.numel(), None if accumulate else 0) + dev
            src = self.make((n,), ta.dtype)
            self.emit(f"{a}.put_({idx}, {src}, accumulate={accumulate})", writes=(a,))

    def a_cat(self):
        a = self.get(lambda t: t.dim() >= 1)
        ta = self.t(a)
        if ta.dim() == 0:
            return
        r = self.rng.random()
        if r < 0.6:
            d = self.rng.randrange(ta.dim())
            shape = list(ta.shape)
            shape[d] = self.rng.randint(0, 3)
            parts = [a, self.make(shape, ta.dtype if self.chance(0.8) else self.dtype())]
            if self.chance(0.3):
                parts.append(self.inline_view(a))
            self.call("torch.cat", f"[{', '.join(parts)}], {d}")
        elif r < 0.8:
            b = self.make(tuple(ta.shape), ta.dtype)
            self.call("torch.stack", f"[{a}, {b}], {self.rng.randint(0, ta.dim())}")
        else:
            d = self.rng.randrange(ta.dim())
            how = self.rng.choice(
                [
                    f"split({self.rng.randint(1, 3)}, {d})",
                    f"chunk({self.rng.randint(1, 3)}, {d})",
                    f"unbind({d})",
                    f"tensor_split(2, {d})",
                ]
            )
            parts = self.cpu_eval(f"{a}.{how}")
            if parts:
                self.emit(f"{self.new_name()} = {a}.{how}[{self.rng.randrange(len(parts))}]")

    def a_view(self):
        a = self.get()
        ta = self.t(a)
        nd = ta.dim()
        options = ["unsqueeze", "flatten", "view", "reshape", "detach", "expand", "as_strided"]
        if nd >= 1:
            options += ["slice", "slice", "select", "narrow", "unfold", "squeeze", "flip_view"]
        if nd >= 2:
            options += ["transpose", "permute", "t_mT", "diagonal", "movedim"]
        if ta.dtype.is_complex:
            options += ["real", "conj", "view_as_real"]
        if ta.element_size() in (2, 4, 8) and ta.dtype != torch.bool:
            options.append("dtype_view")
        kind = self.rng.choice(options)
        expr = None
        if kind == "slice":
            parts = []
            for s in ta.shape:
                start = self.rng.randint(0, max(s - 1, 0))
                step = self.rng.choice([1, 1, 2, 3])
                parts.append(self.rng.choice([":", f"{start}::{step}", f"::{step}", f"{start}:"]))
            expr = f"{a}[{', '.join(parts)}]"
        elif kind == "select":
            d = self.rng.randrange(nd)
            expr = f"{a}.select({d}, {self.rng.randint(-1, max(ta.shape[d] - 1, 0))})"
        elif kind == "narrow":
            d = self.rng.randrange(nd)
            s = ta.shape[d]
            start = self.rng.randint(0, s)
            expr = f"{a}.narrow({d}, {start}, {self.rng.randint(0, s - start)})"
        elif kind == "unfold":
            d = self.rng.randrange(nd)
            size, step = self.rng.randint(1, max(ta.shape[d], 1)), self.rng.randint(1, 2)
            expr = f"{a}.unfold({d}, {size}, {step})"
        elif kind == "squeeze":
            expr = f"{a}.squeeze({self.rng.randrange(nd)})"
        elif kind == "flip_view":
            expr = f"{a}[{self.rng.randint(0, max(ta.shape[0] - 1, 0))}:]"
        elif kind == "unsqueeze":
            expr = f"{a}.unsqueeze({self.rng.randint(-nd - 1, nd)})"
        elif kind == "flatten":
            expr = f"{a}.flatten()"
        elif kind in ("view", "reshape"):
            n = ta.numel()
            shape = [n] if n == 0 else self.factor(n)
            expr = f"{a}.{kind}({tuple(shape)})" if self.chance(0.8) else f"{a}.{kind}(-1)"
        elif kind == "detach":
            expr = f"{a}.detach()"
        elif kind == "expand":
            shape = [self.rng.randint(1, 3)] if self.chance(0.5) else []
            shape += [self.rng.randint(2, 3) if s == 1 else s for s in ta.shape]
            expr = f"{a}.expand({tuple(shape)})"
        elif kind == "as_strided":
            expr = self.as_strided(a)
        elif kind == "transpose":
            i, j = self.rng.sample(range(nd), 2)
            expr = f"{a}.transpose({i}, {j})"
        elif kind == "permute":
            perm = list(range(nd))
            self.rng.shuffle(perm)
            expr = f"{a}.permute({tuple(perm)})"
        elif kind == "t_mT":
            expr = f"{a}.t()" if nd == 2 else f"{a}.mT"
        elif kind == "diagonal":
            expr = f"{a}.diagonal({self.rng.randint(-1, 1)}, 0, 1)"
        elif kind == "movedim":
            expr = f"{a}.movedim({self.rng.randrange(nd)}, {self.rng.randrange(nd)})"
        elif kind == "real":
            expr = f"{a}.{self.rng.choice(['real', 'imag'])}"
        elif kind == "conj":
            expr = f"{a}.conj()"
        elif kind == "view_as_real":
            expr = f"torch.view_as_real({a})"
        elif kind == "dtype_view":
            same = {
                1: [torch.uint8, torch.int8],
                2: [torch.int16, torch.float16, torch.bfloat16],
                4: [torch.int32, torch.float32],
                8: [torch.int64, torch.float64],
            }
            target = self.rng.choice(same.get(ta.element_size(), [ta.dtype]))
            expr = f"{a}.view({target})"
        if expr is not None:
            self.emit(f"{self.new_name()} = {expr}")

    def factor(self, n: int) -> list[int]:
        dims = []
        while n > 1 and len(dims) < 3:
            divisors = [d for d in range(2, n + 1) if n % d == 0]
            d = self.rng.choice(divisors)
            dims.append(d)
            n //= d
        dims.append(n)
        self.rng.shuffle(dims)
        return dims

    def as_strided(self, a: str) -> str | None:
        ta = self.t(a)
        limit = ta.untyped_storage().nbytes() // ta.element_size()
        if limit == 0:
            return None
        rank = self.rng.randint(1, 3)
        size = [self.rng.randint(1, 4) for _ in range(rank)]
        stride = [self.rng.randint(0, 4) for _ in range(rank)]
        span = sum((s - 1) * st for s, st in zip(size, stride, strict=True))
        if span >= limit:
            size, stride, span = [1] * rank, [1] * rank, 0
        offset = self.rng.randint(0, limit - 1 - span)
        return f"{a}.as_strided({tuple(size)}, {tuple(stride)}, {offset})"

    def a_misc(self):
        a = self.get()
        ta = self.t(a)
        kind = self.rng.choice(MISC_KINDS)
        name = self.new_name()
        nd = ta.dim()
        if kind == "clone":
            fmt = self.rng.choice(
                ["", "memory_format=torch.preserve_format", "memory_format=torch.contiguous_format"]
                + (["memory_format=torch.channels_last"] if nd == 4 else [])
            )
            self.emit(f"{name} = {a}.clone({fmt})")
        elif kind == "contiguous":
            self.emit(f"{name} = {self.inline_view(a)}.contiguous()")
        elif kind == "to":
            self.emit(f"{name} = {a}.to({self.dtype()}{', copy=True' if self.chance(0.2) else ''})")
        elif kind == "copy_":
            b = self.second(a)
            if b[0].isdigit() or b[0] in "-(Tf":
                b = self.make(self.broadcast_shape_of(ta.shape), self.dtype())
            if self.chance(0.1):
                b = self.rng.choice([f"{a}.flip(0)", f"{a}[::-1]" if False else f"{a}.t()"])
            self.emit(f"{a}.copy_({b})", writes=(a,))
        elif kind == "fill_":
            self.emit(f"{a}.fill_({self.rng.choice(SCALARS[:8])})", writes=(a,))
        elif kind == "zero_":
            self.emit(f"{a}.zero_()", writes=(a,))
        elif kind == "flip" and nd:
            self.call("torch.flip", f"{a}, ({self.rng.randrange(nd)},)")
        elif kind == "roll" and nd:
            self.call("torch.roll", f"{a}, {self.rng.randint(-3, 3)}, {self.rng.randrange(nd)}")
        elif kind == "tril" and nd >= 2:
            which = self.rng.choice(["tril", "triu"])
            k = self.rng.randint(-1, 1)
            if self.chance(0.4):
                self.emit(f"{a}.{which}_({k})", writes=(a,))
            else:
                self.call(f"torch.{which}", f"{self.inline_view(a)}, {k}")
        elif kind == "sort" and nd:
            d = self.rng.randrange(nd)
            desc = self.rng.choice(["True", "False"])
            if self.chance(0.3):
                like = self.result_like(f"torch.sort({a}, dim={d})")
                o1 = self.out_arg(like, a)
                o2 = self.out_arg(None if like is None else like.long(), a)
                self.emit(
                    f"torch.sort({a}, dim={d}, descending={desc}, stable=True, out=({o1}, {o2}))",
                    out=(o1, o2),
                )
            else:
                self.emit(
                    f"{name}, {self.new_name()} = torch.sort({a}, dim={d}, "
                    f"descending={desc}, stable=True)"
                )
        elif kind == "topk" and nd:
            d = self.rng.randrange(nd)
            k = self.rng.randint(0, max(ta.shape[d], 1))
            self.emit(f"{name}, {self.new_name()} = torch.topk({a}, {k}, {d})")
        elif kind == "kthvalue" and nd:
            d = self.rng.randrange(nd)
            k = self.rng.randint(1, max(ta.shape[d], 1))
            self.emit(f"{name} = torch.kthvalue({a}, {k}, {d}).values")
        elif kind == "argsort" and nd:
            self.emit(f"{name} = torch.argsort({a}, dim={self.rng.randrange(nd)}, stable=True)")
        elif kind == "diff" and nd:
            self.emit(f"{name} = torch.diff({a}, dim={self.rng.randrange(nd)})")
        elif kind == "repeat":
            reps = tuple(self.rng.randint(1, 2) for _ in range(max(nd, 1)))
            self.emit(f"{name} = {a}.repeat({reps})")
        elif kind == "nonzero":
            self.emit(f"{name} = torch.nonzero({a})")
        elif kind == "unique":
            self.emit(f"{name} = torch.unique({a}, sorted=True)")
        elif kind == "masked_select":
            self.emit(f"{name} = torch.masked_select({a}, {a} != 0)")
        elif kind == "item":
            self.emit(f"chk({a}.sum().item())" if ta.numel() else f"chk({a}.numel())", kind="chk")
        elif kind == "cumsum_" and nd:
            self.emit(f"{a}.cumsum_({self.rng.randrange(nd)})", writes=(a,))
        elif kind == "softmax_nn" and nd:
            self.emit(f"{name} = torch.nn.functional.softmax({a}, dim=-1)")
        elif kind == "searchsorted":
            boundaries = self.make((5,), ta.dtype)
            self.emit(f"{name} = torch.searchsorted({boundaries}.sort().values, {a})")
        elif kind == "one_hot":
            self.emit(
                f"{name} = torch.nn.functional.one_hot({self.index_tensor(ta.shape, 4)}.to(DEV), 4)"
            )
        elif kind == "embedding":
            w = self.make((6, 3), self.float_dtype())
            idx = self.index_tensor((self.rng.randint(1, 4),), 6)
            self.emit(f"{name} = torch.nn.functional.embedding({idx}.to(DEV), {w})")
        elif kind == "pad" and nd:
            self.emit(f"{name} = torch.nn.functional.pad({a}, (1, 2), value=3)")
        elif kind == "isclose":
            self.emit(f"{name} = torch.isclose({a}, {self.second(a)})")
        elif kind == "equal":
            self.emit(f"chk(torch.equal({a}, {self.second(a)}))", kind="chk")

    def a_autograd(self):
        """A small differentiable expression and its backward pass (the
        engine runs it on the device's thread, on the forward's streams)."""
        x = self.get(
            lambda t: t.dtype in (torch.float32, torch.float64) and t.numel() > 0,
            dtype=self.rng.choice([torch.float32, torch.float64]),
        )
        leaf = self.new_name()
        self.emit(f"{leaf} = {x}.detach().clone().requires_grad_()")
        if leaf not in self.ns:
            return
        w = self.second(leaf)
        if VAR_RE.search(w):
            # Only the new leaf takes part: an older leaf's AccumulateGrad made
            # on another stream draws PyTorch's stream-mismatch warning for
            # devices with streams (CUDA's too, not the CPU's).
            w = f"({w}).detach()"
        body = self.rng.choice(
            [
                f"({leaf}.sin() * {leaf}).sum()",
                f"({leaf} * {w}).exp().mean()",
                f"torch.nn.functional.softmax({leaf}, -1).pow(2).sum()",
                f"({leaf} @ {leaf}.mT).sum()",
                f"{leaf}.relu().norm()",
                f"torch.where({leaf} > 0, {leaf}, {leaf} * 0.1).sum()",
                f"({leaf}.flip(0)[::2] ** 2).sum()",
                f"{leaf}.cumsum(-1).logsumexp(-1).sum()",
                f"({leaf}.unsqueeze(0).expand(2, *{leaf}.shape) * 3).sum()",
            ]
        )
        y = self.new_name()
        self.emit(f"{y} = {body}")
        self.emit(f"{y}.backward()", writes=(leaf,))
        self.emit(f"{self.new_name()} = {leaf}.grad")

    def a_chk(self):
        a = self.pick()
        if a is not None:
            self.emit(
                f"chk({self.inline_view(a)}{', nb=True' if self.chance(0.3) else ''})", kind="chk"
            )

    def a_del(self):
        a = self.pick()
        if a is not None and len(self.vars()) > 3:
            self.delete(a)

    def a_sync_noise(self):
        if self.n_streams > 1:
            self.order_after(self.rng.randrange(self.n_streams))

    def a_rec(self):
        a = self.pick()
        if a is not None and self.n_streams > 1:
            s = self.rng.randrange(self.n_streams)
            self.emit(f"rec({a}, S[{s}])", kind="rec", writes=(a,), arg=s)


ACTIONS = [
    ("a_unary", 10),
    ("a_binary", 16),
    ("a_ternary", 4),
    ("a_reduce", 10),
    ("a_matmul", 6),
    ("a_index", 12),
    ("a_cat", 5),
    ("a_view", 14),
    ("a_misc", 10),
    ("a_chk", 4),
    ("a_del", 4),
    ("switch_stream", 9),
    ("a_sync_noise", 2),
    ("a_rec", 2),
    ("a_autograd", 3),
]


def generate(seed: int, n_streams: int = 2, length: int = 30, avoid_known: bool = True) -> Program:
    """The program of `seed` (about `length` statements)."""
    g = Generator(seed, n_streams, avoid_known)
    for _ in range(g.rng.randint(1, 3)):
        g.make()
    while len(g.stmts) < length:
        action = g.pick_weighted(ACTIONS)
        if action == "switch_stream" and n_streams == 1:
            continue
        getattr(g, action)()
    # The end: back on the default stream (the runner synchronizes).
    if g.model.cur != 0:
        g.emit("use(S[0])", kind="use", arg=0)
    return g.program()


__all__ = ["generate", "Generator", "math"]
