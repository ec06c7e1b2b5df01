"""The Markdown report card: a summary table, one section per integration
point with its counts, every check with its outcome, and the closing line
``N passed, N failed, N skipped``.

The card holds nothing that changes from run to run on the same machine and
PyTorch (no timings, no addresses), so a backend can keep its card in its
docs and check it for staleness.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .core import FAILED, PASSED, SKIPPED, TOPICS, Result, counts, summary_line

_MARK = {PASSED: "passed", FAILED: "**FAILED**", SKIPPED: "skipped"}


def _one_line(text: str) -> str:
    return " / ".join(line.strip() for line in text.splitlines() if line.strip())


def render(name: str, device_count: int, results: Sequence[Result]) -> str:
    by_topic: dict[str, list[Result]] = {}
    for r in results:
        by_topic.setdefault(r.check.topic, []).append(r)
    topics = [t for t in TOPICS if t in by_topic]

    lines = [
        f"# Conformance report card: `{name}`",
        "",
        f"PyTorch {torch.__version__}, {device_count} device(s), "
        f"{len(results)} checks over {len(topics)} integration points.",
        "",
        "| integration point | topic | passed | failed | skipped |",
        "|---|---|---:|---:|---:|",
    ]
    for t in topics:
        p, f, s = counts(by_topic[t])
        lines.append(f"| {TOPICS[t]} | `{t}` | {p} | {f} | {s} |")
    p, f, s = counts(results)
    lines += [f"| **total** | | {p} | {f} | {s} |", ""]

    for t in topics:
        p, f, s = counts(by_topic[t])
        lines += [f"## {TOPICS[t]} (`{t}`): {p} passed, {f} failed, {s} skipped", ""]
        for r in by_topic[t]:
            lines.append(f"- {_MARK[r.status]} `{r.check.id}`: {r.check.expectation}")
            if r.status == FAILED:
                lines.append(f"  - difference: {_one_line(r.detail)}")
            elif r.status == SKIPPED:
                lines.append(f"  - reason: {_one_line(r.detail)}")
        lines.append("")
    lines.append(summary_line(results))
    return "\n".join(lines) + "\n"
