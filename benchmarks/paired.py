"""Paired blocks: fresh processes per side, timing their blocks in turn.

This VM's cores have slow spells of tens of seconds that slow every process
alike (the CPU's own Llama step goes from 53 to 64 ms a step and back), and
whole processes differ from their neighbours too. A ratio of two processes
timed one after the other compares different spells. Here each round starts
one fresh process per side (the CPU, openreg with a driver, ...), each builds
and warms up its case and waits; then the sides time one block each, in a
rotating order, while the others wait on a pipe, and again for the round's
count of turns. A turn's ratio compares blocks timed within a second of each
other.

The serving end (``serve``) runs in the measuring process: it reads "block"
lines on stdin and answers each with one JSON line. The orchestrating end
(``Server``, ``paired_rounds``) starts the processes and collects the answers.
"""

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable


def serve(block: Callable[[], dict]) -> None:
    """Answers each "block" line on stdin with `block()` as a JSON line.

    The caller has built and warmed up its case; block() should run some
    untimed work first, since the process sat idle while the others ran (its
    caches went to them, its device's threads went to sleep).
    """
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "block":
            break
        print(json.dumps(block()), flush=True)


class Server:
    """The orchestrator's end of serve(): one fresh process for one side."""

    def __init__(self, cmd: list[str], env: dict[str, str], what: str) -> None:
        self.what = what
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
        )
        self._expect("ready")

    def _expect(self, want: str | None = None) -> str:
        line = self.proc.stdout.readline()
        if not line or (want is not None and line.strip() != want):
            self.proc.kill()
            self.stderr.seek(0)
            err = self.stderr.read()[-3000:]
            raise RuntimeError(f"{self.what} failed (exit {self.proc.wait()}): {line!r}\n{err}")
        return line

    def block(self) -> dict:
        self.proc.stdin.write("block\n")
        self.proc.stdin.flush()
        return json.loads(self._expect())

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def paired_rounds(
    start: Callable[[str], Server], sides: list[str], rounds: int, turns: int
) -> dict[str, list[dict]]:
    """Each side's block results, turn by turn: `rounds` rounds of fresh
    processes (`start(side)`), each timing `turns` blocks per side in a
    rotating order. Entry i of every side's list comes from the same turn."""
    per: dict[str, list[dict]] = {side: [] for side in sides}
    cycle = 0
    for _ in range(rounds):
        servers: dict[str, Server] = {}
        try:
            for side in sides:
                servers[side] = start(side)
            for _ in range(turns):
                k = cycle % len(sides)
                cycle += 1
                for side in sides[k:] + sides[:k]:
                    per[side].append(servers[side].block())
        finally:
            for server in servers.values():
                server.close()
    return per
