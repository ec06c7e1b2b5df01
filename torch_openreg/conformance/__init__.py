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

import importlib

# The integration points, in the card's order; importing a topic module
# registers its checks.
TOPIC_MODULES = (
    "device",
    "guard",
    "streams",
    "allocator",
    "pinned",
    "generator",
    "copies",
    "operators",
    "autograd",
    "autocast",
    "serialization",
    "dlpack",
    "profiler",
    "accelerator",
    "device_module",
    "distributed",
    "compile",
    "faults",
    "layouts",
)
for _module in TOPIC_MODULES:
    importlib.import_module(f".{_module}", __name__)

from .core import CHECKS, TOPICS, Context, Result, run, select, summary_line  # noqa: E402
from .report import render  # noqa: E402

__all__ = [
    "CHECKS",
    "TOPIC_MODULES",
    "TOPICS",
    "Context",
    "Result",
    "render",
    "run",
    "select",
    "summary_line",
]
