"""What the Python wrapper Inductor generates for openreg calls at run time.

A generated module defines each kernel as

    cpp_fused_add_0 = openreg_compile_kernel(async_compile, 'cpp_fused_add_0', 'ppi', r'''...''')

and calls it as ``cpp_fused_add_0(buf0, arg0_1, 64)``. The C++ source is
Inductor's CPU kernel plus the uniform entry point ``openreg_launch`` (see
``inductor.py``); it is compiled and cached like every Inductor C++ kernel,
and the call goes to ``torch_openreg._C._CompiledKernel``, which queues the
library's path, the symbol and the arguments on the current stream
(``csrc/inductor/``); the device loads the library and runs the kernel.
Nothing here runs a kernel.
"""

import ctypes
from typing import Any

from torch._inductor.async_compile import get_compile_threads
from torch._inductor.codecache import (
    CppCodeCache,
    LambdaFuture,
    _get_cpp_prefix_header,
    clear_on_fresh_cache,
)

from torch_openreg import _C

__all__ = ["OpenRegKernelCodeCache", "compile_kernel", "empty_strided"]

# The symbol every generated kernel library exports.
ENTRY_POINT = "openreg_launch"


@clear_on_fresh_cache
class OpenRegKernelCodeCache(CppCodeCache):
    """Inductor's C++ code cache, built as for CPU kernels (same flags, same
    precompiled ``cpp_prefix.h``) but loaded as a plain library: there is no
    Python binding, because the host never calls a kernel directly."""

    cache: dict[str, Any] = {}
    cache_clear = staticmethod(cache.clear)
    cpp_compile_command_flags = {"include_pytorch": False, "shared": True}

    @classmethod
    def _get_uncompiled_header(cls, device: str) -> str | None:
        return _get_cpp_prefix_header("cpu")


# [doc:compile-kernel]
def _load(name: str, signature: str, library: ctypes.CDLL) -> Any:
    getattr(library, ENTRY_POINT)  # AttributeError now if the build lacks it
    # The device loads the library itself, by path (either driver).
    return _C._CompiledKernel(name, library._name, ENTRY_POINT, signature)


def compile_kernel(async_compile: Any, name: str, signature: str, source: str) -> Any:
    """Compiles (or finds in the cache) one kernel; returns the launcher, or a
    future of it that ``async_compile.wait()`` resolves."""
    if get_compile_threads() <= 1:
        return _load(name, signature, OpenRegKernelCodeCache.load(source))
    get_library = OpenRegKernelCodeCache.load_async(source, submit_fn=async_compile.submit)
    return LambdaFuture(lambda: _load(name, signature, get_library()))


# [/doc:compile-kernel]

# The allocation the wrapper makes for each buffer, on the buffer's device.
empty_strided = _C._empty_strided
