#!/usr/bin/env python3
"""Keeps the code quoted in docs/*.md identical to the code in the tree.

A quote in a page is a marker comment followed directly by a fenced block:

    <!-- quote: csrc/hooks/OpenRegHooks.cpp#hooks-register -->
    ```cpp
    // csrc/hooks/OpenRegHooks.cpp
    ...the lines of the region...
    ```

The source names a region in one of two ways:

``PATH#NAME``
    The lines between a line containing ``[doc:NAME]`` and a line containing
    ``[/doc:NAME]`` (any comment syntax: ``// [doc:x]``, ``# [doc:x]``). Used
    for .cpp, .py, .toml and .yaml files: the markers are plain comments, and whoever
    edits the code sees that it is quoted.

``PATH from "FIRST" to "LAST"`` (or ``PATH from "FIRST"``: that one line)
    From the only line containing FIRST to the first line after it containing
    LAST. A pattern starting with ``^`` must equal the whole line (trailing
    blanks aside); either quote character may delimit a pattern. Used for
    widely included headers, where a marker would cost every user a full
    rebuild, and for files other work is changing.

The block holds a caption comment naming the file, then the region's lines
(marker lines removed, common indentation removed). The language of the fence
follows the file's extension.

    scripts/docs_quotes.py --check    # exit 1 listing every stale or broken quote
    scripts/docs_quotes.py --update   # rewrite the blocks from the tree

``tests/test_docs.py`` runs the check, so ``make test`` fails when code and
docs drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

QUOTE_RE = re.compile(r"^<!--\s*quote:\s*(?P<spec>.+?)\s*-->\s*$")
REGION_SPEC_RE = re.compile(r"^(?P<path>[^\s#]+)#(?P<name>[\w.-]+)$")
ANCHOR_SPEC_RE = re.compile(
    r"^(?P<path>\S+)\s+from\s+(?P<q1>[\"'])(?P<first>.+?)(?P=q1)"
    r"(?:\s+to\s+(?P<q2>[\"'])(?P<last>.+?)(?P=q2))?$"
)
MARKER_RE = re.compile(r"\[(?P<end>/?)doc:(?P<name>[\w.-]+)\]")
FENCE_RE = re.compile(r"^(?P<fence>`{3,})(?P<info>.*)$")

# Where region markers may live (for the list of regions nobody quotes).
MARKED_TREES = ("runtime", "csrc", "torch_openreg", "examples", "benchmarks", "pyproject.toml")

LANGUAGES = {
    ".c": ("c", "//"),
    ".cpp": ("cpp", "//"),
    ".h": ("cpp", "//"),
    ".py": ("python", "#"),
    ".toml": ("toml", "#"),
    ".yaml": ("yaml", "#"),
    ".sh": ("sh", "#"),
    ".txt": ("cmake", "#"),
    "Makefile": ("make", "#"),
}


class QuoteError(Exception):
    """A quote whose source cannot be resolved."""


@dataclasses.dataclass
class Quote:
    page: Path
    line: int  # 1-based line of the marker comment
    spec: str
    start: int  # index of the marker line in the page's lines
    end: int  # index one past the existing fenced block (== start + 1 if none)
    current: str | None  # the existing block, fences included, or None


def language(path: str) -> tuple[str, str]:
    p = Path(path)
    return LANGUAGES.get(p.name) or LANGUAGES.get(p.suffix) or ("text", "#")


def read_source(path: str) -> list[str]:
    full = (ROOT / path).resolve()
    if not full.is_relative_to(ROOT):
        raise QuoteError(f"{path}: outside the repository")
    if not full.is_file():
        raise QuoteError(f"{path}: no such file")
    return full.read_text(encoding="utf-8").splitlines()


def region_lines(lines: list[str], path: str, name: str) -> list[str]:
    starts = [i for i, text in enumerate(lines) if f"[doc:{name}]" in text]
    ends = [i for i, text in enumerate(lines) if f"[/doc:{name}]" in text]
    if not starts:
        raise QuoteError(f"{path}: no region marker [doc:{name}]")
    if len(starts) > 1 or len(ends) > 1:
        raise QuoteError(f"{path}: region [doc:{name}] is marked more than once")
    if not ends or ends[0] < starts[0]:
        raise QuoteError(f"{path}: region [doc:{name}] has no closing [/doc:{name}] after it")
    return lines[starts[0] + 1 : ends[0]]


def matches(pattern: str, text: str) -> bool:
    if pattern.startswith("^"):
        return text.rstrip() == pattern[1:]
    return pattern in text


def anchored_lines(lines: list[str], path: str, first: str, last: str | None) -> list[str]:
    starts = [i for i, text in enumerate(lines) if matches(first, text)]
    if len(starts) != 1:
        found = "no line" if not starts else f"{len(starts)} lines"
        raise QuoteError(f'{path}: "{first}" must be on exactly one line, found on {found}')
    if last is None:
        return lines[starts[0] : starts[0] + 1]
    for i in range(starts[0] + 1, len(lines)):
        if matches(last, lines[i]):
            return lines[starts[0] : i + 1]
    raise QuoteError(f'{path}: no line containing "{last}" after "{first}"')


def render(spec: str) -> str:
    """The fenced block a quote specification stands for."""
    if m := REGION_SPEC_RE.match(spec):
        path = m["path"]
        body = region_lines(read_source(path), path, m["name"])
    elif m := ANCHOR_SPEC_RE.match(spec):
        path = m["path"]
        body = anchored_lines(read_source(path), path, m["first"], m["last"])
    else:
        raise QuoteError(f'cannot parse {spec!r} (PATH#NAME or PATH from "A" to "B")')
    body = [text.rstrip() for text in body if not MARKER_RE.search(text)]
    while body and not body[0]:
        body.pop(0)
    while body and not body[-1]:
        body.pop()
    if not body:
        raise QuoteError(f"{spec}: the region is empty")
    lang, comment = language(path)
    code = textwrap.dedent("\n".join(body))
    fence = "```"
    while fence in code:
        fence += "`"
    return f"{fence}{lang}\n{comment} {path}\n{code}\n{fence}"


def find_quotes(page: Path) -> list[Quote]:
    lines = page.read_text(encoding="utf-8").splitlines()
    quotes = []
    for i, text in enumerate(lines):
        m = QUOTE_RE.match(text)
        if not m:
            continue
        end, current = i + 1, None
        fence = FENCE_RE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if fence:
            close = next(
                (j for j in range(i + 2, len(lines)) if lines[j].strip() == fence["fence"]),
                None,
            )
            if close is not None:
                end = close + 1
                current = "\n".join(lines[i + 1 : end])
        quotes.append(Quote(page, i + 1, m["spec"], i, end, current))
    return quotes


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def check() -> list[str]:
    """Every problem with the quotes of docs/*.md, one message each."""
    problems = []
    for page in pages():
        rel = page.relative_to(ROOT)
        for q in find_quotes(page):
            where = f"{rel}:{q.line}"
            try:
                wanted = render(q.spec)
            except QuoteError as e:
                problems.append(f"{where}: {e}")
                continue
            if q.current is None:
                problems.append(f"{where}: no fenced block after the quote marker for {q.spec}")
            elif q.current != wanted:
                problems.append(f"{where}: stale quote of {q.spec}")
    return problems


def update() -> tuple[list[str], list[str]]:
    """Rewrites every quote block; returns (pages changed, problems left)."""
    changed, problems = [], []
    for page in pages():
        rel = page.relative_to(ROOT)
        lines = page.read_text(encoding="utf-8").splitlines()
        # From the last quote up, so earlier indices stay valid.
        for q in reversed(find_quotes(page)):
            try:
                wanted = render(q.spec)
            except QuoteError as e:
                problems.append(f"{rel}:{q.line}: {e}")
                continue
            lines[q.start + 1 : q.end] = wanted.split("\n")
        text = "\n".join(lines) + "\n"
        if text != page.read_text(encoding="utf-8"):
            page.write_text(text, encoding="utf-8")
            changed.append(str(rel))
    return changed, problems


def defined_regions() -> set[tuple[str, str]]:
    """(path, name) of every region marked in the trees quotes come from."""
    found = set()
    for top in MARKED_TREES:
        base = ROOT / top
        files = [base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []
        for f in files:
            if not f.is_file() or f.suffix not in (".cpp", ".h", ".py", ".toml", ".yaml"):
                continue
            rel = str(f.relative_to(ROOT))
            try:
                text = f.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            for m in MARKER_RE.finditer(text):
                if not m["end"]:
                    found.add((rel, m["name"]))
    return found


def unused_regions() -> list[str]:
    """Regions marked in the tree that no page quotes (clutter, not an error)."""
    used = set()
    for page in pages():
        for q in find_quotes(page):
            if m := REGION_SPEC_RE.match(q.spec):
                used.add((m["path"], m["name"]))
    return sorted(f"{path}#{name}" for path, name in defined_regions() - used)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="fail on stale or broken quotes")
    mode.add_argument("--update", action="store_true", help="rewrite the quotes from the tree")
    args = parser.parse_args(argv)

    if args.update:
        changed, problems = update()
        for rel in changed:
            print(f"updated {rel}")
    else:
        problems = check()
    for region in unused_regions():
        print(f"note: {region} is marked but quoted nowhere")
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        if args.check:
            print(
                f"{len(problems)} problem(s); after checking the code, run "
                "scripts/docs_quotes.py --update",
                file=sys.stderr,
            )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
