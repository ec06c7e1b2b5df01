"""Command line of the fuzzer (run from the repository root).

python -m tests.fuzz run --seconds 600           # long run (make fuzz)
python -m tests.fuzz run --count 500 --blocking  # 500 programs, OPENREG_LAUNCH_BLOCKING=1
python -m tests.fuzz show SEED                   # the program of a seed
python -m tests.fuzz repro SEED > r.py           # minimized standalone repro
"""

from __future__ import annotations

import argparse
import sys

import torch  # noqa: F401

import torch_openreg  # noqa: F401

from . import runner
from .program import repro_source


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz")
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(q):
        q.add_argument("--streams", type=int, default=2, help="streams per program (1-3)")
        q.add_argument("--length", type=int, default=30, help="statements per program")
        q.add_argument(
            "--repeat",
            type=int,
            default=2,
            help="openreg runs per program (the first call of a signature is "
            "synchronous, later ones are queued)",
        )
        q.add_argument(
            "--include-known",
            action="store_true",
            help="also generate what finds the known divergences (KNOWN_ISSUES)",
        )

    r = sub.add_parser("run", help="long run in worker subprocesses")
    common(r)
    r.add_argument("--seconds", type=float, default=600)
    r.add_argument("--count", type=int, default=10**9)
    r.add_argument("--start", type=int, default=0)
    r.add_argument("--blocking", action="store_true", help="OPENREG_LAUNCH_BLOCKING=1")
    r.add_argument("--progress", type=int, default=200)
    r.add_argument("--out", default="build/fuzz")

    c = sub.add_parser("campaign", help="the long run in every mode (make fuzz)")
    common(c)
    c.add_argument("--seconds", type=float, default=600, help="in all")
    c.add_argument("--count", type=int, default=10**9)
    c.add_argument("--start", type=int, default=0)
    c.add_argument("--progress", type=int, default=1000)
    c.add_argument("--out", default="build/fuzz")

    st = sub.add_parser("stress", help="the two-stream block-reuse stress")
    st.add_argument("--seconds", type=float, default=60)
    st.add_argument("--iterations", type=int, default=100, help="rounds per seed")
    st.add_argument("--start", type=int, default=0)

    w = sub.add_parser("worker")
    common(w)
    w.add_argument("--start", type=int, required=True)
    w.add_argument("--count", type=int, required=True)
    w.add_argument("--seconds", type=float, default=0)

    s = sub.add_parser("show", help="print the program of a seed")
    common(s)
    s.add_argument("seed", type=int)

    x = sub.add_parser("repro", help="print a minimized standalone repro of a seed")
    common(x)
    x.add_argument("seed", type=int)
    x.add_argument("--no-shrink", action="store_true")

    args = p.parse_args(argv)
    if args.cmd == "run":
        return runner.long_run(args)
    if args.cmd == "campaign":
        return runner.campaign(args)
    if args.cmd == "stress":
        return runner.stress_run(args)
    if args.cmd == "worker":
        runner.worker_main(args)
        return 0
    if args.cmd == "show":
        print(
            repro_source(
                runner.program_of(args.seed, args.streams, args.length, not args.include_known)
            )
        )
        return 0
    print(
        runner.report(
            args.seed,
            args.streams,
            args.length,
            shrink=not args.no_shrink,
            avoid_known=not args.include_known,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
