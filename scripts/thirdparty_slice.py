"""make thirdparty: a third-party library's own device tests on openreg,
compared with the CPU (docs/ci.md, "A real suite").

The library is RoMa (``roma``, rotation representations; pure Python beside
torch). Its tests pick ``torch.device(0)`` when ``torch.cuda.is_available()``,
else the CPU, so the same files run on the CPU with plain pytest and on
openreg through the plugin's CUDA shim (``pytest --openreg-cuda``), as a CI
job would run them. The tests come from the release's sdist on PyPI; all of
it happens in a temporary directory. Prints a table of outcomes and the tests
that pass on the CPU and not on openreg, and writes
benchmarks/results/thirdparty_roma.json.
"""

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE, VERSION = "roma", "1.8.0"


def fetch_tests(tmp: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
        + [f"{PACKAGE}=={VERSION}", "-d", str(tmp / "sdist")],
        check=True,
    )
    (archive,) = (tmp / "sdist").glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if "/test/" in m.name and m.isfile()]
        tar.extractall(tmp / "src", members=members, filter="data")
    # The sdist's root is a package of its own: its tests run from a directory
    # that holds only them, and import the installed roma.
    (tests,) = (tmp / "src").glob("*/test")
    target = tmp / "run" / "test"
    target.parent.mkdir()
    tests.rename(target)
    return target.parent


def run(where: Path, label: str, options: list[str], timeout: int) -> tuple[dict, float]:
    xml = where / f"{label}.xml"
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"]
        + options
        + ["test"],
        cwd=where,
        timeout=timeout,
        stdout=subprocess.DEVNULL,
        check=False,
    )
    seconds = time.perf_counter() - start
    outcomes = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = (
                    (child.get("message") or "").splitlines()[0][:160]
                    if child.get("message")
                    else ""
                )
                break
        outcomes[name] = (outcome, message)
    return outcomes, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=int, default=900, help="seconds for each run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = fetch_tests(Path(tmp))
        cpu, cpu_s = run(where, "cpu", [], args.timeout)
        dev, dev_s = run(where, "openreg", ["--openreg-cuda"], args.timeout)
    passed_cpu = [n for n, (o, _) in cpu.items() if o == "passed"]
    passed_both = [n for n in passed_cpu if dev.get(n, ("missing", ""))[0] == "passed"]
    lost = {n: dev.get(n, ("missing", "")) for n in passed_cpu if n not in passed_both}
    gained = [n for n, (o, _) in dev.items() if o == "passed" and cpu.get(n, ("",))[0] != "passed"]
    rate = len(passed_both) / max(1, len(passed_cpu))
    print(f"{PACKAGE} {VERSION}: its own tests, CPU (plain pytest) vs openreg (--openreg-cuda)")
    print("| | tests | passed | seconds |\n|---|---|---|---|")
    print(f"| CPU | {len(cpu)} | {len(passed_cpu)} | {cpu_s:.1f} |")
    print(f"| openreg | {len(dev)} | {sum(o == 'passed' for o, _ in dev.values())} | {dev_s:.1f} |")
    print(
        f"passing on openreg of those passing on the CPU: {len(passed_both)}/{len(passed_cpu)}"
        f" = {100 * rate:.1f}%"
    )
    for name, (outcome, message) in sorted(lost.items()):
        print(f"  {outcome}: {name}: {message}")
    if gained:
        print(f"passing on openreg only: {len(gained)}")
    out = ROOT / "benchmarks" / "results" / "thirdparty_roma.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "package": PACKAGE,
                "version": VERSION,
                "cpu": {k: v[0] for k, v in cpu.items()},
                "openreg": {k: list(v) for k, v in dev.items()},
                "rate": rate,
                "seconds": {"cpu": cpu_s, "openreg": dev_s},
            },
            indent=1,
        )
    )
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
