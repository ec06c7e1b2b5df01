"""The integration guide in docs/ stays true to the tree.

- every quoted block equals the code it quotes (scripts/docs_quotes.py);
- every page is linked from docs/README.md, and every local link resolves;
- every file path written in backticks exists, in the repository or in the
  installed PyTorch (headers such as ``c10/core/Allocator.h``, modules such
  as ``torch/random.py``).
"""

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))

_spec = importlib.util.spec_from_file_location("docs_quotes", ROOT / "scripts" / "docs_quotes.py")
docs_quotes = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = docs_quotes  # dataclasses look the module up
_spec.loader.exec_module(docs_quotes)

TORCH_DIR = Path(torch.__file__).resolve().parent
# Where a path in backticks may live: the repository, PyTorch's C++ include
# directory (c10/..., ATen/..., torch/csrc/...), and site-packages (torch/...).
PATH_ROOTS = (ROOT, TORCH_DIR / "include", TORCH_DIR.parent)
PATH_SUFFIXES = (".py", ".cpp", ".h", ".md", ".toml", ".txt", ".sh", ".json", ".png")
SKIP_DIRS = {".git", ".venv", "build", "__pycache__", ".pytest_cache", ".ruff_cache"}

CODE_SPAN_RE = re.compile(r"`([^`\n]+)`")
PATH_LIKE_RE = re.compile(r"^[\w.\-/]+$")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")


def prose_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, text) of a page outside fenced code blocks."""
    out, fence = [], None
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if fence is None and line.startswith("```"):
            fence = line[: len(line) - len(line.lstrip("`"))]
        elif fence is not None and stripped == fence:
            fence = None
        elif fence is None:
            out.append((number, line))
    return out


def repository_basenames() -> set[str]:
    names = set()
    for _dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        names.update(filenames)
    return names


def test_quotes_match_the_tree():
    problems = docs_quotes.check()
    assert not problems, (
        "Quoted code in docs/ differs from the tree; check the prose, then run "
        "`.venv/bin/python scripts/docs_quotes.py --update`:\n" + "\n".join(problems)
    )


def test_every_page_is_linked_from_the_index():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    linked = {target.split("#")[0] for target in LINK_RE.findall(index)}
    missing = [p.name for p in PAGES if p.name != "README.md" and p.name not in linked]
    assert not missing, f"pages not linked from docs/README.md: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_local_links_resolve(page):
    broken = []
    for number, line in prose_lines(page):
        for target in LINK_RE.findall(line):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue  # URLs, in-page anchors
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.name}:{number}: {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_paths_in_backticks_exist(page):
    basenames = repository_basenames()
    missing = []
    for number, line in prose_lines(page):
        for span in CODE_SPAN_RE.findall(line):
            path = span.split("#")[0]
            if not PATH_LIKE_RE.match(path):
                continue
            if path.startswith(".") and "/" not in path:
                continue  # a file extension (".cpp"), not a path
            if "/" not in path:
                # A bare file name ("OpenRegLaunch.cpp") must name a file of the tree.
                if path.endswith(PATH_SUFFIXES) and path not in basenames:
                    missing.append(f"{page.name}:{number}: {span}")
                continue
            if not any((root / path).exists() for root in PATH_ROOTS):
                missing.append(f"{page.name}:{number}: {span}")
    assert not missing, "paths in backticks that do not exist:\n" + "\n".join(missing)
