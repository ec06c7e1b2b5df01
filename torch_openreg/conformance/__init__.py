"""A conformance kit for PyTorch accelerator backends on PrivateUse1.

    python -m torch_openreg.conformance --device NAME [--report card.md] [--only TOPIC,...]

It finds the backend through public PyTorch APIs only
(``torch.get_device_module(NAME)``, ``torch.accelerator``,
``torch.device(NAME)``) and never imports openreg, so any PrivateUse1 backend
can run it unchanged (``docs/conformance.md`` says how). Each integration
point is one module here; each check is a function whose docstring states
what PyTorch expects (CUDA's semantics for device behaviour, the CPU's for
values and errors). The result is a Markdown report card.
"""

from . import (  # noqa: F401  (importing a topic module registers its checks, in the card's order)
    accelerator,
    allocator,
    autocast,
    autograd,
    compile,
    copies,
    device,
    device_module,
    distributed,
    dlpack,
    generator,
    guard,
    operators,
    pinned,
    profiler,
    serialization,
    streams,
)
from .core import CHECKS, TOPICS, Context, Result, run, select, summary_line
from .report import render

__all__ = ["CHECKS", "TOPICS", "Context", "Result", "render", "run", "select", "summary_line"]
