"""Runs fuzz programs against the CPU: in process, or as a long run in
worker subprocesses that survive crashes.

A worker runs seeds in order and prints one line per program; the parent
reads them, so a worker killed by a signal (an abort in malloc, a
segmentation fault) names the seed it was running, and the parent starts a
new worker at the next seed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from .generator import KNOWN_KINDS
from .minimize import minimize
from .program import Program, compare, repro_source, run_program
from .vocab import generate


@dataclass
class Outcome:
    seed: int
    divergences: list = field(default_factory=list)
    statements: int = 0


def run_seed(
    seed: int, n_streams: int, length: int, repeat: int = 1, avoid_known: bool = True
) -> Outcome:
    program = generate(seed, n_streams, length, avoid_known)
    cpu = run_program(program, "cpu")
    divergences = []
    for _ in range(repeat):
        dev = run_program(program, "openreg")
        divergences = [
            d for d in compare(program, cpu, dev) if not (avoid_known and d.kind in KNOWN_KINDS)
        ]
        if divergences:
            break
    return Outcome(seed, divergences, len(program.stmts))


def program_of(seed: int, n_streams: int, length: int, avoid_known: bool = True) -> Program:
    return generate(seed, n_streams, length, avoid_known)


def report(
    seed: int, n_streams: int, length: int, shrink: bool = True, avoid_known: bool = True
) -> str:
    """The repro (minimized if asked) of a diverging seed, as Python source."""
    program = generate(seed, n_streams, length, avoid_known)
    cpu = run_program(program, "cpu")
    for _ in range(2):  # the second run queues what the first verified
        divergences = compare(program, cpu, run_program(program, "openreg"))
        if divergences:
            break
    if not divergences:
        return f"# seed {seed}: no divergence on this run\n"
    if shrink:
        program = minimize(program, divergences[0].signature())
    return repro_source(program, divergences)


def worker_main(args) -> None:
    """Runs seeds [start, start + count) and prints a JSON line each."""
    deadline = time.monotonic() + args.seconds if args.seconds else None
    seed = args.start
    while seed < args.start + args.count:
        if deadline is not None and time.monotonic() > deadline:
            break
        print(json.dumps({"start": seed}), flush=True)
        outcome = run_seed(seed, args.streams, args.length, args.repeat, not args.include_known)
        print(
            json.dumps(
                {
                    "seed": seed,
                    "statements": outcome.statements,
                    "divergences": [str(d) for d in outcome.divergences],
                    "families": [d.family() for d in outcome.divergences],
                }
            ),
            flush=True,
        )
        seed += 1


def long_run(args) -> int:
    """The `make fuzz` run: workers over seeds until the time or count is up."""
    os.makedirs(args.out, exist_ok=True)
    deadline = time.monotonic() + args.seconds
    env = dict(os.environ)
    if args.blocking:
        env["OPENREG_LAUNCH_BLOCKING"] = "1"
    seed = args.start
    end = args.start + args.count
    programs = statements = 0
    failures: dict = {}  # signature -> first seed
    crashes = []
    started = time.monotonic()
    while seed < end and time.monotonic() < deadline:
        remaining = max(int(deadline - time.monotonic()), 1)
        cmd = [
            sys.executable,
            "-m",
            "tests.fuzz",
            "worker",
            "--start",
            str(seed),
            "--count",
            str(end - seed),
            "--seconds",
            str(remaining),
            "--streams",
            str(args.streams),
            "--length",
            str(args.length),
            "--repeat",
            str(args.repeat),
        ] + (["--include-known"] if args.include_known else [])
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        current = None
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "start" in msg:
                current = msg["start"]
                continue
            programs += 1
            statements += msg["statements"]
            seed = msg["seed"] + 1
            current = None
            if msg["divergences"]:
                # The first divergence of a program: later ones often follow from it.
                family, text = msg["families"][0], msg["divergences"][0]
                if family not in failures:
                    failures[family] = [msg["seed"], text, 0]
                    print(f"seed {msg['seed']}: {text}", flush=True)
                failures[family][2] += 1
            if args.progress and programs % args.progress == 0:
                print(
                    f"{programs} programs, {statements} statements, "
                    f"{len(failures)} distinct divergences, {len(crashes)} crashes, "
                    f"{time.monotonic() - started:.0f} s",
                    flush=True,
                )
        code = proc.wait()
        if code != 0:
            why = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
            print(f"seed {current}: worker died ({why})", flush=True)
            crashes.append((current, why))
            seed = (current if current is not None else seed) + 1
    summary = {
        "programs": programs,
        "statements": statements,
        "streams": args.streams,
        "blocking": bool(args.blocking),
        "seconds": round(time.monotonic() - started),
        "first_seed": args.start,
        "next_seed": seed,
        "divergences": [
            {"family": f, "programs": n, "first_seed": s, "divergence": t}
            for f, (s, t, n) in sorted(failures.items(), key=lambda kv: -kv[1][2])
        ],
        "crashes": [{"seed": s, "why": w} for s, w in crashes],
    }
    path = os.path.join(args.out, "summary.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    print(
        f"{programs} programs ({statements} statements, {args.streams} streams"
        f"{', blocking' if args.blocking else ''}) in {summary['seconds']} s: "
        f"{len(failures)} distinct divergences, {len(crashes)} crashes; {path}"
    )
    for s, text, n in sorted(failures.values(), key=lambda v: -v[2]):
        print(f"  {n} programs, first seed {s}: {text}")
    for s, why in crashes:
        print(f"  seed {s}: crash ({why})")
    return 1 if failures or crashes else 0


def stress_run(args) -> int:
    """The long two-stream stress: rounds of stress() until time is up."""
    from .stress import stress

    deadline = time.monotonic() + args.seconds
    seed = args.start
    rounds = 0
    failures = []
    while time.monotonic() < deadline:
        print(f"stress seed {seed}", flush=True)  # a crash names its seed
        failures += stress(args.iterations, seed)
        rounds += args.iterations
        seed += 1
    print(
        f"stress: {rounds} rounds on 2 streams (seeds {args.start}-{seed - 1}): "
        f"{len(failures)} mismatches"
    )
    for f in failures[:20]:
        print("  " + f)
    return 1 if failures else 0


def campaign(args) -> int:
    """`make fuzz`: the long run in every mode, `args.seconds` in all."""
    parts = [
        ("2 streams", 0.35, dict(streams=2, start=args.start, blocking=False)),
        ("3 streams", 0.25, dict(streams=3, start=args.start + 10**7, blocking=False)),
        ("1 stream", 0.1, dict(streams=1, start=args.start + 2 * 10**7, blocking=False)),
        ("blocking", 0.15, dict(streams=2, start=args.start + 3 * 10**7, blocking=True)),
    ]
    code = 0
    for name, share, opts in parts:
        print(f"== {name}", flush=True)
        sub = argparse.Namespace(**vars(args))
        sub.seconds = max(args.seconds * share, 5)
        sub.out = os.path.join(args.out, name.replace(" ", "-"))
        for k, v in opts.items():
            setattr(sub, k, v)
        code |= long_run(sub)
    print("== stress", flush=True)
    sub = argparse.Namespace(**vars(args))
    sub.seconds = max(args.seconds * 0.15, 5)
    sub.iterations = 100
    code |= stress_run(sub)
    return code
