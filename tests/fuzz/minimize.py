"""Shrinks a diverging program to the statements the divergence needs.

Delta debugging over statements: drop chunks, then single statements, while
the reduced program is still race-free (streams.check) and still shows a
divergence with the same signature (kind and statement or variable). Stream
statements (switches, waits, syncs, record_stream) are only dropped when the
program stays race-free without them, so a minimized program never diverges
because of a race the shrinking introduced.
"""

from __future__ import annotations

from .program import Program, compare, run_program
from .streams import check


def diverges(program: Program, signature, runs: int = 2) -> bool:
    if check(program) is not None:
        return False
    cpu = run_program(program, "cpu")
    for _ in range(runs):
        dev = run_program(program, "openreg")
        if any(d.signature() == signature for d in compare(program, cpu, dev)):
            return True
    return False


def minimize(program: Program, signature, budget: int = 400) -> Program:
    stmts = list(program.stmts)
    tries = 0

    def attempt(candidate) -> bool:
        nonlocal tries
        tries += 1
        return diverges(Program(program.seed, program.n_streams, candidate), signature)

    chunk = max(len(stmts) // 2, 1)
    while chunk >= 1 and tries < budget:
        i = 0
        changed = False
        while i < len(stmts) and tries < budget:
            candidate = stmts[:i] + stmts[i + chunk :]
            if candidate and attempt(candidate):
                stmts = candidate
                changed = True
            else:
                i += chunk
        if not changed:
            chunk //= 2
    return Program(program.seed, program.n_streams, stmts)
