"""openreg's pytest plugin (``pytest --openreg``); see ``plugin.py``.

It lives outside the ``torch_openreg`` package so that pytest can load it at
start without importing torch: importing a submodule of ``torch_openreg``
would import the package, and torch with it, before any conftest ran.
"""
