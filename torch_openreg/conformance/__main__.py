"""Command line: ``python -m torch_openreg.conformance --device NAME``.

Prints the report card (Markdown) on stdout, progress on stderr, and exits
with 1 when a check failed (2 for bad arguments, 3 when a check hung).
"""

from __future__ import annotations

import argparse
import sys

import torch

from . import TOPICS, Context, render, run, select, summary_line
from .core import FAILED, load_backend


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m torch_openreg.conformance",
        description="Checks a PyTorch accelerator backend against the contract of every "
        "integration point and prints a Markdown report card.",
    )
    p.add_argument(
        "--device",
        help="the backend's device type (default: torch.accelerator.current_accelerator())",
    )
    p.add_argument("--report", metavar="PATH", help="also write the card to PATH")
    p.add_argument(
        "--only", metavar="TOPIC,...", help=f"run these topics only ({', '.join(TOPICS)})"
    )
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (for a backend that `import torch` does not autoload); "
        "repeatable, also used by the fresh processes some checks start",
    )
    p.add_argument("--list", action="store_true", help="list the checks and exit")
    p.add_argument(
        "--timeout", type=float, default=120, help="seconds one check may take (default 120)"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    topics = [t.strip() for t in args.only.split(",") if t.strip()] if args.only else None
    try:
        checks = select(topics)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.list:
        for c in checks:
            print(f"{c.id}: {c.expectation}")
        print(f"{len(checks)} checks over {len({c.topic for c in checks})} topics")
        return 0

    load_backend(args.imports)
    name = args.device
    if name is None:
        accelerator = torch.accelerator.current_accelerator()
        if accelerator is None:
            print("error: no accelerator found; pass --device NAME", file=sys.stderr)
            return 2
        name = accelerator.type
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or accelerator.type != name:
        print(
            f"error: {name!r} is not the current accelerator "
            f"(torch.accelerator.current_accelerator() is {accelerator}); "
            "is the backend installed, or does it need --import?",
            file=sys.stderr,
        )
        return 2
    ctx = Context(name, imports=args.imports, subprocess_timeout=args.timeout)

    def progress(result):
        if not args.quiet:
            detail = f": {result.detail.splitlines()[0]}" if result.detail else ""
            print(f"[{result.status}] {result.check.id}{detail}", file=sys.stderr, flush=True)

    def emit(results):
        card = render(name, ctx.count, results)
        if args.report:
            with open(args.report, "w", encoding="utf-8") as f:
                f.write(card)
        sys.stdout.write(card)
        sys.stdout.flush()

    def hang(results, failed):
        progress(failed)
        emit([*results, failed])

    results = run(ctx, checks, timeout=args.timeout, on_result=progress, on_hang=hang)
    emit(results)
    if not args.quiet:
        print(summary_line(results), file=sys.stderr)
    return 1 if any(r.status == FAILED for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
