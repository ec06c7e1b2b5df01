"""``python -m torch_openreg.run script.py [args...]``: a CUDA script on openreg.

Also ``python -m torch_openreg.run -m package.module [args...]``. The shim is
activated first (``torch_openreg.migration.activate``), then the script runs
as ``__main__`` with ``sys.argv`` and ``sys.path[0]`` as ``python script.py``
would set them. Processes the script starts inherit ``OPENREG_CUDA_SHIM=1``
and activate the shim at ``import torch`` too.
"""

import os
import runpy
import sys

USAGE = "usage: python -m torch_openreg.run (script.py | -m module) [args...]"


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        raise SystemExit(0 if argv else 2)
    from torch_openreg.migration import activate

    activate()
    if argv[0] == "-m":
        if len(argv) < 2:
            print(USAGE, file=sys.stderr)
            raise SystemExit(2)
        sys.argv = [argv[1], *argv[2:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = argv[0]
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
