"""Fuzz programs: how one runs on a device, what is observed, how two runs
are compared, and the standalone repro a program prints as.

A program is a list of Python statements over variables ``t0``, ``t1``, ...
(tensors on ``DEV``) and the helpers of ``prelude.PRELUDE``. It runs once on
the CPU and once on openreg, each in a fresh namespace; per statement the
exception (type and first line) and the warnings are recorded, ``chk``
statements record values the host reads mid-program, and at the end every
live tensor is compared: dtype, shape, strides, storage offset, values, and
which variables share storage.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field

import torch

from .prelude import PRELUDE

# Exception messages and warnings name the device; the comparison does not.
_DEVICE_WORDS = re.compile(r"openreg(:\d+)?|cpu(:\d+)?|PrivateUse1|privateuseone")
_ADDRESS = re.compile(r"0x[0-9a-f]+")
VAR_RE = re.compile(r"\bt\d+\b")


@dataclass
class Stmt:
    """One statement.

    kind: "op" (reads/writes device tensors on the current stream), "mk"
    (makes a tensor from host data), "chk" (the host reads a tensor), "use"
    (switches the current stream to ``arg``), "wait" (stream ``arg[0]`` waits
    for stream ``arg[1]``), "hostsync" (the host waits for stream ``arg``,
    or the whole device if ``arg`` is None), "rec" (record_stream of
    ``writes[0]`` on stream ``arg``), "del" (deletes ``writes[0]``).
    """

    code: str
    kind: str = "op"
    writes: tuple[str, ...] = ()
    arg: object = None
    _compiled: object = field(default=None, repr=False, compare=False)

    @property
    def reads(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(VAR_RE.findall(self.code)))

    def compiled(self):
        if self._compiled is None:
            self._compiled = compile(self.code, "<fuzz>", "exec")
        return self._compiled


@dataclass
class Program:
    seed: int
    n_streams: int
    stmts: list[Stmt]

    def source_lines(self) -> list[str]:
        return [s.code for s in self.stmts]


def new_namespace(dev: str, n_streams: int) -> dict:
    ns = {"DEV": dev, "NSTREAMS": n_streams, "__name__": "fuzz_program"}
    exec(compile(PRELUDE, "<fuzz prelude>", "exec"), ns)
    return ns


def normalize(msg: str) -> str:
    return _ADDRESS.sub("0x?", _DEVICE_WORDS.sub("DEV", msg))


def exec_stmt(ns: dict, stmt: Stmt):
    """Runs one statement: (exception or None, warning messages)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        err = None
        try:
            exec(stmt.compiled(), ns)
        except Exception as e:  # noqa: BLE001  (the type is what is compared)
            err = (type(e).__name__, str(e).strip().split("\n")[0])
    return err, [str(w.message) for w in caught]


def tensor_vars(ns: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in ns.items() if VAR_RE.fullmatch(k) and isinstance(v, torch.Tensor)}


def storage_key(t: torch.Tensor):
    """Identifies the memory block behind t (None for no memory)."""
    st = t.untyped_storage()
    return st.data_ptr() if st.nbytes() > 0 else None


@dataclass
class Observation:
    stmts: list  # per statement: (error or None, [warnings])
    obs: list  # what chk recorded
    final: dict  # name -> (dtype, shape, stride, offset, cpu tensor)
    aliases: list  # sorted groups of names sharing storage
    final_error: object = None  # an exception from the final synchronization


def observe_final(ns: dict, dev: str) -> tuple[dict, list, object]:
    final_error = None
    if dev != "cpu":
        try:
            torch.openreg.synchronize()
        except Exception as e:  # noqa: BLE001
            final_error = (type(e).__name__, str(e).strip().split("\n")[0])
    final = {}
    groups: dict = {}
    for name, t in sorted(tensor_vars(ns).items()):
        try:
            value = t.detach().cpu().clone() if t.layout == torch.strided else None
        except Exception as e:  # noqa: BLE001
            value = ("error", type(e).__name__, str(e).split("\n")[0])
        final[name] = (t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), value)
        # Aliasing is sharing the storage object (empty tensors included).
        groups.setdefault(t.untyped_storage()._cdata, []).append(name)
    aliases = sorted(g for g in groups.values() if len(g) > 1)
    return final, aliases, final_error


def run_program(program: Program, dev: str, upto: int | None = None) -> Observation:
    """Runs program (its first `upto` statements) in a fresh namespace."""
    ns = new_namespace(dev, program.n_streams)
    stmts = program.stmts if upto is None else program.stmts[:upto]
    results = []
    try:
        for stmt in stmts:
            results.append(exec_stmt(ns, stmt))
        final, aliases, final_error = observe_final(ns, dev)
        obs = list(ns["OBS"])
    finally:
        if dev != "cpu":
            # Whatever happened, the next program starts on the default stream
            # with nothing queued.
            torch.openreg.set_stream(torch.openreg.default_stream())
            try:
                torch.openreg.synchronize()
            except Exception:  # noqa: BLE001  (already recorded as final_error)
                pass
        # The prelude's functions refer to the namespace (a reference cycle):
        # clearing it frees the program's device memory now, not at the next
        # full garbage collection.
        ns.clear()
    return Observation(results, obs, final, aliases, final_error)


# ---------------------------------------------------------------------------
# Comparison


def _values_differ(a: torch.Tensor, b: torch.Tensor) -> str | None:
    if a.dtype.is_floating_point or a.dtype.is_complex:
        try:
            torch.testing.assert_close(b, a, equal_nan=True, check_stride=False)
        except AssertionError as e:
            return "; ".join(line for line in str(e).strip().split("\n") if line)
        return None
    if not torch.equal(a, b):
        diff = (a != b).nonzero()
        return f"{diff.shape[0]} of {a.numel()} elements differ, first at {diff[0].tolist()}"
    return None


def _compare_values(cpu, dev) -> str | None:
    if isinstance(cpu, torch.Tensor) and isinstance(dev, torch.Tensor):
        if cpu.dtype != dev.dtype or cpu.shape != dev.shape:
            return f"cpu {cpu.dtype}{list(cpu.shape)} vs openreg {dev.dtype}{list(dev.shape)}"
        return _values_differ(cpu, dev)
    if isinstance(cpu, float) and isinstance(dev, float):
        if cpu == dev or (math.isnan(cpu) and math.isnan(dev)):
            return None
        return None if math.isclose(cpu, dev, rel_tol=1e-5, abs_tol=1e-8) else f"{cpu} vs {dev}"
    return None if cpu == dev or repr(cpu) == repr(dev) else f"{cpu!r} vs {dev!r}"


@dataclass
class Divergence:
    kind: str  # error, message, warnings, chk, final, strides, aliases, sync
    where: str  # the statement's code or the variable's name
    detail: str

    def signature(self) -> tuple[str, str]:
        return (self.kind, self.where)

    def family(self) -> str:
        """The divergence with names and numbers blanked, to group repeats."""
        where = re.sub(r"\d+", "#", VAR_RE.sub("T", self.where))
        first = self.detail.split(" vs ")[-1][:60]
        return f"[{self.kind}] {where} -> {re.sub(r'[0-9]+', '#', VAR_RE.sub('T', first))}"

    def __str__(self) -> str:
        return f"[{self.kind}] {self.where}: {self.detail}"


# Warnings the CPU runs of this process gave. With OPENREG_DRIVER=process
# the first run of a signature runs in the device's process, whose
# TORCH_WARN_ONCE flags are its own: a once-warning the CPU gave earlier in
# this process comes once more from the device (docs/process-driver.md,
# "Warnings"), and is not a divergence.
_CPU_WARNED: set[str] = set()
# TORCH_WARN_ONCE messages of CPU kernels the fuzz's programs reach, which
# the host may have given earlier outside any compared statement.
_KNOWN_ONCE = (
    "Casting complex values to real discards the imaginary part",
    "ComplexHalf support is experimental",
)


def _once_more_from_the_device(w_cpu: list, w_dev: list) -> list:
    """w_dev without the warnings the CPU gave earlier in this process and
    not at this statement, when the device runs in a process of its own."""
    if not torch.openreg._named_kernels_only():
        return w_dev
    here = {normalize(w) for w in w_cpu}

    def once_more(w: str) -> bool:
        n = normalize(w)
        return n not in here and (n in _CPU_WARNED or w.startswith(_KNOWN_ONCE))

    return [w for w in w_dev if not once_more(w)]


def compare(program: Program, cpu: Observation, dev: Observation) -> list[Divergence]:
    out: list[Divergence] = []
    for stmt, (e_cpu, w_cpu), (e_dev, w_dev) in zip(
        program.stmts, cpu.stmts, dev.stmts, strict=True
    ):
        w_dev = _once_more_from_the_device(w_cpu, w_dev)
        _CPU_WARNED.update(normalize(w) for w in w_cpu)
        if (e_cpu is None) != (e_dev is None) or (e_cpu and e_cpu[0] != e_dev[0]):
            out.append(Divergence("error", stmt.code, f"cpu {e_cpu} vs openreg {e_dev}"))
        elif e_cpu and normalize(e_cpu[1]) != normalize(e_dev[1]):
            out.append(Divergence("message", stmt.code, f"cpu {e_cpu[1]!r} vs {e_dev[1]!r}"))
        if [normalize(w) for w in w_cpu] != [normalize(w) for w in w_dev]:
            out.append(Divergence("warnings", stmt.code, f"cpu {w_cpu} vs openreg {w_dev}"))
    if dev.final_error is not None:
        out.append(Divergence("sync", "final synchronize", str(dev.final_error)))
    if len(cpu.obs) != len(dev.obs):
        out.append(Divergence("chk", "count", f"{len(cpu.obs)} vs {len(dev.obs)}"))
    chks = [s.code for s in program.stmts if s.kind == "chk"]
    for i, (a, b) in enumerate(zip(cpu.obs, dev.obs, strict=False)):
        detail = _compare_values(a, b)
        if detail:
            where = chks[i] if i < len(chks) else f"chk #{i}"
            out.append(Divergence("chk", where, detail))
    if sorted(cpu.final) != sorted(dev.final):
        out.append(Divergence("final", "variables", f"{sorted(cpu.final)} vs {sorted(dev.final)}"))
    for name in sorted(set(cpu.final) & set(dev.final)):
        dt, shape, stride, offset, value = cpu.final[name]
        dt2, shape2, stride2, offset2, value2 = dev.final[name]
        if (dt, shape) != (dt2, shape2):
            out.append(
                Divergence("final", name, f"cpu {dt}{list(shape)} vs openreg {dt2}{list(shape2)}")
            )
            continue
        if math.prod(shape) > 0 and (stride, offset) != (stride2, offset2):
            # Strides that differ only where the size is 1 are their own kind
            # (once a known issue: the generic structured kernels computed
            # them on the device tensors; tests/test_fuzz.py keeps the case).
            differ = [i for i in range(len(shape)) if stride[i] != stride2[i]]
            size1 = offset == offset2 and all(shape[i] == 1 for i in differ)
            out.append(
                Divergence(
                    "size1-strides" if size1 else "strides",
                    name,
                    f"cpu {stride} +{offset} vs openreg {stride2} +{offset2}",
                )
            )
        detail = _compare_values(value, value2)
        if detail:
            out.append(Divergence("final", name, detail))
    if cpu.aliases != dev.aliases:
        out.append(Divergence("aliases", "storage sharing", f"cpu {cpu.aliases} vs {dev.aliases}"))
    return out


# ---------------------------------------------------------------------------
# Repro

_REPRO_MAIN = '''
def run(dev):
    """Runs the statements on dev: per statement (error, warnings), chk values, final tensors."""
    import warnings
    ns = {"DEV": dev, "NSTREAMS": NSTREAMS}
    exec(PRELUDE, ns)
    steps = []
    for code in STMTS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            err = None
            try:
                exec(code, ns)
            except Exception as e:
                err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        steps.append((err, [str(w.message) for w in caught]))
    if dev != "cpu":
        torch.openreg.synchronize()
    final = {k: v.cpu() for k, v in ns.items() if k[:1] == "t" and k[1:].isdigit()
             and isinstance(v, torch.Tensor)}
    if dev != "cpu":
        torch.openreg.set_stream(torch.openreg.default_stream())
    return steps, ns["OBS"], final


def same(a, b):
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.is_floating_point or a.dtype.is_complex:
            return torch.allclose(a, b, equal_nan=True)
        return torch.equal(a, b)
    return a == b or a != a and b != b


ok = True
for attempt in range(2):  # the first call of a signature runs synchronously, later ones are queued
    cpu_steps, cpu_obs, cpu_final = run("cpu")
    dev_steps, dev_obs, dev_final = run("openreg")
    for code, c, d in zip(STMTS, cpu_steps, dev_steps):
        if (c[0] is None) != (d[0] is None) or (c[0] and c[0].split(":")[0] != d[0].split(":")[0]):
            print(f"run {attempt}: {code!r} raised differently: cpu {c[0]} / openreg {d[0]}")
            ok = False
        if len(c[1]) != len(d[1]):
            print(f"run {attempt}: {code!r} warned differently: cpu {c[1]} / openreg {d[1]}")
            ok = False
    for i, (a, b) in enumerate(zip(cpu_obs, dev_obs)):
        if not same(a, b):
            print(f"run {attempt}: chk #{i} differs:\\ncpu {a}\\nopenreg {b}")
            ok = False
    for k in cpu_final:
        if k not in dev_final or not same(cpu_final[k], dev_final[k]):
            print(f"run {attempt}: {k} differs:\\ncpu {cpu_final[k]}\\nopenreg {dev_final.get(k)}")
            ok = False
print("same as the CPU" if ok else "DIVERGES from the CPU")
'''


def repro_source(program: Program, divergences: list[Divergence] | None = None) -> str:
    lines = [
        f'"""openreg fuzz repro (seed {program.seed}, {program.n_streams} streams).',
        "",
        "Runs the statements below on the CPU and on openreg and prints every difference.",
    ]
    if divergences:
        lines += ["", "Seen by the fuzzer:"] + [f"  {d}" for d in divergences]
    lines += ['"""', "import torch", "", f"NSTREAMS = {program.n_streams}"]
    lines.append('PRELUDE = r"""' + PRELUDE.replace('"""', "'''") + '"""')
    lines.append("STMTS = [")
    lines += [f"    {code!r}," for code in program.source_lines()]
    lines.append("]")
    return "\n".join(lines) + "\n" + _REPRO_MAIN
