"""Which stream orderings a fuzz program needs, as CUDA's semantics define them.

The model follows a program on the CPU (where the stream helpers do nothing)
and tracks, per memory block, which stream wrote and read it at which point
of that stream's queue, and per stream, how far it is ordered after every
other stream (vector clocks: ``wait_stream``/``wait_event`` merge them, a
host synchronization orders everything enqueued later after the waited
work). A program is race-free when

- every access on stream S to a block that stream T wrote (or, for a write,
  read) comes after S waited for that access; and
- every block freed on the host whose memory another stream T used is
  either recorded on T (``record_stream``) or its allocation stream waited
  for T's use first (the caching allocator reuses a block on its own stream
  at once).

The generator asks ``needed_waits``/``needed_for_free`` before emitting a
statement and inserts what is missing; the minimizer checks candidates with
``check``. Accesses are taken conservatively: every variable a statement
names is read, the ones it declares are written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .program import Program, Stmt, exec_stmt, new_namespace, storage_key, tensor_vars


@dataclass
class Block:
    alloc: int  # the stream it was allocated on
    reads: dict = field(default_factory=dict)  # stream -> last seq
    writes: dict = field(default_factory=dict)  # stream -> last seq
    recorded: set = field(default_factory=set)  # record_stream'd streams


class RaceError(Exception):
    pass


class StreamModel:
    def __init__(self, n_streams: int):
        self.n = n_streams
        self.cur = 0
        self.seq = [0] * n_streams
        # clock[s][t]: stream s is ordered after stream t's first clock[s][t] accesses.
        self.clock = [[0] * n_streams for _ in range(n_streams)]
        self.blocks: dict = {}  # storage key -> Block
        self.var_block: dict = {}  # variable -> storage key (None: no memory)

    # -- queries --------------------------------------------------------

    def needed_waits(self, names, writes) -> list[int]:
        """Streams the current stream must wait for before accessing `names`."""
        s = self.cur
        need = set()
        for name in names:
            b = self.blocks.get(self.var_block.get(name))
            if b is None:
                continue
            for t, k in b.writes.items():
                if t != s and self.clock[s][t] < k:
                    need.add(t)
            if name in writes:
                for t, k in b.reads.items():
                    if t != s and self.clock[s][t] < k:
                        need.add(t)
        return sorted(need)

    def needed_for_free(self, key) -> list[int]:
        """Streams whose uses of block `key` are not covered if it is freed now."""
        b = self.blocks.get(key)
        if b is None:
            return []
        need = set()
        for uses in (b.reads, b.writes):
            for t, k in uses.items():
                if t != b.alloc and t not in b.recorded and self.clock[b.alloc][t] < k:
                    need.add(t)
        return sorted(need)

    def sharing(self, name) -> list[str]:
        key = self.var_block.get(name)
        return [v for v, k in self.var_block.items() if k == key and v != name]

    # -- transitions ----------------------------------------------------

    def _wait(self, s: int, t: int) -> None:
        row = self.clock[s]
        row[t] = max(row[t], self.seq[t])
        for x in range(self.n):
            row[x] = max(row[x], self.clock[t][x])

    def _host_waits(self, t: int) -> None:
        # Everything enqueued from now on runs after t's work so far.
        for s in range(self.n):
            if s != t:
                self._wait(s, t)

    def before(self, stmt: Stmt, ns: dict) -> None:
        """Applies the ordering effects of `stmt` (before it runs on the CPU),
        raising RaceError for an access or free the program did not order."""
        k = stmt.kind
        if k == "use":
            self.cur = stmt.arg
        elif k == "wait":
            self._wait(*stmt.arg)
        elif k == "hostsync":
            for t in range(self.n) if stmt.arg is None else [stmt.arg]:
                self._host_waits(t)
        elif k == "rec":
            b = self.blocks.get(self.var_block.get(stmt.writes[0]))
            if b is not None:
                b.recorded.add(stmt.arg)
        elif k in ("op", "mk", "chk"):
            missing = self.needed_waits(stmt.reads, stmt.writes)
            if missing:
                raise RaceError(f"{stmt.code!r} on stream {self.cur} races with {missing}")

    def after(self, stmt: Stmt, ns: dict, err=None) -> None:
        """Updates blocks from the CPU namespace after `stmt` ran (and
        raised `err`)."""
        live = {name: storage_key(t) for name, t in tensor_vars(ns).items()}
        s = self.cur
        if stmt.kind in ("op", "mk", "chk"):
            self.seq[s] += 1
            n = self.seq[s]
            for name in set(stmt.reads) | set(live) - set(self.var_block):
                key = live.get(name)
                if key is None:
                    continue
                b = self.blocks.get(key)
                if b is None:  # new memory: allocated on this stream
                    b = self.blocks[key] = Block(alloc=s)
                if name in stmt.writes or name not in self.var_block:
                    b.writes[s] = n
                else:
                    b.reads[s] = n
        # Blocks no variable refers to any more were freed on the host.
        alive = set(live.values())
        for key in list(self.blocks):
            if key not in alive:
                missing = self.needed_for_free(key)
                del self.blocks[key]
                if missing:
                    raise RaceError(
                        f"{stmt.code!r} frees a block used on streams {missing} "
                        "without record_stream or a wait"
                    )
        self.var_block = live


def check(program: Program) -> str | None:
    """None if the program is race-free, else why not (runs it on the CPU)."""
    ns = new_namespace("cpu", program.n_streams)
    model = StreamModel(program.n_streams)
    try:
        for stmt in program.stmts:
            model.before(stmt, ns)
            err, _ = exec_stmt(ns, stmt)
            model.after(stmt, ns, err)
    except RaceError as e:
        return str(e)
    finally:
        ns.clear()  # a reference cycle through the prelude's functions
    return None
