"""``import torch_openreg.transfer_to_openreg``: run code written for CUDA on openreg.

Importing this module activates the migration shim for the rest of the
process (``torch_openreg.migration.activate``): ``"cuda"`` devices,
``.cuda()``, ``torch.cuda.*``, ``torch.autocast("cuda")`` and
``torch.amp.GradScaler("cuda")`` run on openreg. Import it before the code
that uses CUDA (in a notebook: the first cell). What is mapped, and what
cannot be: docs/migration.md.
"""

from torch_openreg.migration import activate

activate()
