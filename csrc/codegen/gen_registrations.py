"""Generates openreg's aten registrations from csrc/openreg_native_functions.yaml
with PyTorch's own code generator (torchgen, shipped in the torch wheel).

    python csrc/codegen/gen_registrations.py YAML [MORE_YAML ...] OUTPUT_DIR

Several YAML files are merged first (their supported, symint and autograd
lists appended to the first's, which holds backend, cpp_namespace and
class_name): the engine's own kernels live in
csrc/engine/engine_native_functions.yaml.

writes OUTPUT_DIR/PrivateUse1NativeFunctions.h (the struct of kernel
declarations csrc/aten/ defines), OUTPUT_DIR/RegisterPrivateUse1.cpp and,
when the YAML lists autograd kernels, OUTPUT_DIR/RegisterAutogradPrivateUse1.cpp.
This is torchgen.gen_backend_stubs.run, the generator torch_xla and other
out-of-tree backends use, with one difference: torchgen also registers, for
every operator of the list, its out= and in-place variants as "the listed
kernel, then a copy into the out tensor" (what an XLA-style backend wants).
openreg runs the variants it does not list through the fallback instead,
whose CPU kernel makes the CPU's checks (an out= tensor of another dtype is
an error, a resized non-empty one a warning), so those wrappers are not
generated. A wrong YAML fails here with torchgen's message (an unknown
operator: "Found an invalid operator name").
"""

from __future__ import annotations

import sys
from pathlib import Path

LISTS = ("supported", "symint", "autograd")


def merge(yamls: list[str], output_dir: str) -> str:
    """The one YAML torchgen reads: the first file, or all of them merged."""
    if len(yamls) == 1:
        return yamls[0]
    import yaml

    merged = yaml.safe_load(Path(yamls[0]).read_text()) or {}
    for extra in yamls[1:]:
        spec = yaml.safe_load(Path(extra).read_text()) or {}
        unknown = set(spec) - set(LISTS)
        if unknown:
            raise ValueError(f"{extra}: only {', '.join(LISTS)} may be added, got {unknown}")
        for key in LISTS:
            merged[key] = list(merged.get(key) or []) + list(spec.get(key) or [])
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    path = Path(output_dir) / "native_functions_merged.yaml"
    path.write_text(yaml.safe_dump(merged, sort_keys=False))
    return str(path)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(f"usage: {argv[0]} YAML [MORE_YAML ...] OUTPUT_DIR", file=sys.stderr)
        return 2
    yamls, output_dir = argv[1:-1], argv[-1]
    try:
        source_yaml = merge(yamls, output_dir)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 1
    from torchgen import gen_backend_stubs
    from torchgen.dest import register_dispatch_key

    # Only what the YAML lists is registered (see the docstring).
    register_dispatch_key.gets_generated_out_inplace_wrapper = lambda *args: False
    try:
        gen_backend_stubs.run(source_yaml, output_dir, dry_run=False)
    except (AssertionError, ValueError, KeyError) as e:
        print(f"{' + '.join(yamls)}: {e}", file=sys.stderr)
        return 1
    # torchgen writes the autograd registrations only when the YAML lists
    # some; the build always compiles the file.
    autograd = Path(output_dir) / "RegisterAutogradPrivateUse1.cpp"
    if not autograd.exists():
        autograd.write_text(f"// {' + '.join(yamls)}: no autograd kernels.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
