"""Entry point of the ``torch.backends`` group, called at the end of ``import torch``.

It lives in its own module so that loading it never needs ``torch_openreg``
itself to be importable at that moment: when a program's first line is
``import torch_openreg``, the package is still being imported (it is waiting
for its own ``import torch`` to return) when torch calls this entry point.
"""

import importlib
import sys


# [doc:autoload-load]
def load() -> None:
    """Registers openreg with torch, unless ``import torch_openreg`` is under way."""
    package = sys.modules.get("torch_openreg")
    if package is not None and not getattr(package, "_registered", False):
        # `import torch_openreg` started first and imported torch; it
        # registers the backend itself as soon as `import torch` returns.
        return
    importlib.import_module("torch_openreg")


# [/doc:autoload-load]
