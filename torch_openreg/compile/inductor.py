"""The code generators of openreg's Inductor backend (registered by ``backend.py``).

Inductor needs three things per device type (``torch._inductor.codegen.common``):

- a *scheduling* that turns fused IR nodes into kernels. openreg reuses
  Inductor's C++ (CPU) code generator, ``CppScheduling``, since the simulator
  computes on the host. Only the kernel's definition changes: each kernel
  library also exports ``openreg_launch(void* const* params)``, a uniform
  entry point the launcher in ``csrc/inductor/`` calls on the stream's worker
  with kernel-view pointers;
- a *wrapper code generator* for the Python that allocates buffers, calls
  kernels and extern (dispatcher) kernels. ``PythonWrapperCodegen`` with two
  changes: a kernel call is a plain call of the ``_CompiledKernel`` launcher,
  and buffers are allocated on their own device (``openreg:N``);
- *device op overrides*: the snippets the wrapper writes for device guards,
  synchronization and the raw stream (``backend.py``).

Inductor's C++ wrapper (``cpp_wrapper=True``) and AOTInductor would call the
kernels directly from generated C++ with device pointers; they are refused
with an error naming the mode. The FX wrapper is refused likewise.
"""

from typing import Any

from torch._inductor import config
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.scheduler import BaseSchedulerNode
from torch._inductor.utils import IndentedBuffer, Placeholder, get_fused_kernel_name
from torch._inductor.virtualized import V

from .backend import DEVICE
from .kernels import ENTRY_POINT

__all__ = [
    "OpenRegCppWrapperCodegen",
    "OpenRegFxWrapperCodegen",
    "OpenRegPythonWrapperCodegen",
    "OpenRegScheduling",
]


# [doc:launch-entry]
def kernel_signature(arg_types: list[str]) -> str:
    """One letter per kernel argument: 'p' a buffer the kernel writes, 'r' one
    it only reads, 'i' an int64, 'f' a float."""
    letters = []
    for t in arg_types:
        if t.endswith("*"):
            letters.append("r" if t.startswith("const ") else "p")
        elif t == "const int64_t":
            letters.append("i")
        elif t == "const float":
            letters.append("f")
        else:
            raise NotImplementedError(f"openreg: kernel argument type {t!r} is not supported")
    return "".join(letters)


def launch_entry(arg_types: list[str]) -> str:
    """C++ of the uniform entry point: params[i] points at argument i."""
    args = []
    for i, t in enumerate(arg_types):
        if t.endswith("*"):
            args.append(f"*static_cast<{t} const*>(params[{i}])")
        else:
            scalar = t.removeprefix("const ")
            args.append(f"*static_cast<const {scalar}*>(params[{i}])")
    joined = ",\n        ".join(args)
    return (
        f'extern "C" void {ENTRY_POINT}(void* const* params) {{\n'
        f"    kernel(\n        {joined});\n}}\n"
    )


# [/doc:launch-entry]


class OpenRegScheduling(CppScheduling):
    """Inductor's C++ kernels, defined for the openreg launcher."""

    # [doc:kernel-language]
    # Inductor takes the kernel language of a device it does not know from
    # config.cuda_backend ("triton"; torch/_inductor/utils.py,
    # get_current_backend), which changes how types are propagated while a
    # kernel is generated. openreg generates C++, so it says so meanwhile.
    def codegen_node(self, node):
        with config.patch(cuda_backend="cpp"):
            return super().codegen_node(node)

    def codegen_template(self, template_node, epilogue_nodes, prologue_nodes):
        with config.patch(cuda_backend="cpp"):
            return super().codegen_template(template_node, epilogue_nodes, prologue_nodes)

    def flush(self):
        with config.patch(cuda_backend="cpp"):
            return super().flush()

    # [/doc:kernel-language]

    # [doc:define-kernel]
    def define_kernel(self, src_code, nodes, kernel_args=None):
        wrapper = V.graph.wrapper_code
        if src_code in wrapper.src_to_kernel:
            return wrapper.src_to_kernel[src_code]
        fused_name = (
            get_fused_kernel_name(nodes, config.cpp.descriptive_names)
            if config.cpp.descriptive_names
            else ""
        )
        kernel_name = "_".join(["cpp", fused_name, wrapper.next_kernel_suffix()])
        wrapper.src_to_kernel[src_code] = kernel_name
        src_code = src_code.replace(str(Placeholder.KERNEL_NAME), "kernel")
        src_code = src_code.replace(str(Placeholder.DESCRIPTIVE_NAME), kernel_name)
        src_code = src_code.replace("#pragma CMT", "//")
        args = self.kernel_group.args if kernel_args is None else kernel_args
        _, _, arg_types = args.cpp_argdefs()
        body = IndentedBuffer()
        body.writeline(
            f"openreg_compile_kernel(async_compile, {kernel_name!r}, "
            f"{kernel_signature(arg_types)!r}, r'''"
        )
        body.splice(src_code, strip=True)
        body.splice(launch_entry(arg_types), strip=True)
        body.writeline("''')")
        wrapper.define_kernel(kernel_name, body.getvalue(), gpu=False)
        return kernel_name

    # [/doc:define-kernel]


class _OpenRegWrapperMixin:
    """What the openreg wrappers change in PythonWrapperCodegen."""

    # [doc:wrapper-kernel-call]
    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        if device.type != DEVICE:
            return super()._generate_kernel_call_helper(  # type: ignore[misc]
                kernel_name, call_args, device=device, **kwargs
            )
        if kwargs.get("triton", True):
            raise NotImplementedError(
                f"openreg: Triton kernel {kernel_name} cannot run on openreg "
                "(its kernels come from Inductor's C++ code generator)"
            )
        # The _CompiledKernel launcher queues the kernel on the current stream.
        self.writeline(self.wrap_kernel_call(kernel_name, call_args))  # type: ignore[attr-defined]

    def make_allocation(
        self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False
    ):
        if device.type != DEVICE:
            return super().make_allocation(  # type: ignore[misc]
                name, device, dtype, shape, stride, allocation_shape, is_pinned
            )
        # On the buffer's own device: openreg generates no device guards.
        sizes = self.codegen_python_shape_tuple(shape)  # type: ignore[attr-defined]
        strides = self.codegen_python_shape_tuple(stride)  # type: ignore[attr-defined]
        allocation = sizes
        if allocation_shape is not None:
            allocation = self.codegen_python_shape_tuple(allocation_shape)  # type: ignore[attr-defined]
        out = f"{name} = empty_strided_openreg({allocation}, {strides}, {dtype}, {device.index})"
        if allocation != sizes:
            out += f".as_strided({sizes}, {strides})"
        return out

    # [/doc:wrapper-kernel-call]


class OpenRegPythonWrapperCodegen(_OpenRegWrapperMixin, PythonWrapperCodegen):
    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return OpenRegSubgraphWrapperCodegen(
                subgraph_name, parent_wrapper, partition_signatures
            )
        return OpenRegPythonWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        self.imports.splice(
            """
                from torch_openreg.compile.kernels import compile_kernel as openreg_compile_kernel
                from torch_openreg.compile.kernels import empty_strided as empty_strided_openreg
            """,
            strip=True,
        )


class OpenRegSubgraphWrapperCodegen(_OpenRegWrapperMixin, SubgraphPythonWrapperCodegen):
    """Subgraphs (cond, while_loop, invoke_subgraph) share the root's imports."""


def _refuse(mode: str) -> Any:
    raise NotImplementedError(
        f"openreg: Inductor's {mode} is not supported on openreg: it would call "
        "the kernels from generated C++ with device pointers instead of through "
        "the openreg launcher. Use the default Python wrapper (cpp_wrapper=False, "
        "torch.compile rather than AOTInductor)."
    )


class OpenRegCppWrapperCodegen(PythonWrapperCodegen):
    """Registered so that cpp_wrapper=True and AOTInductor fail with a clear error."""

    @staticmethod
    def create(*args: Any, **kwargs: Any) -> Any:
        return _refuse("C++ wrapper (cpp_wrapper=True, AOTInductor)")


class OpenRegFxWrapperCodegen(PythonWrapperCodegen):
    """Registered so that the FX wrapper fails with a clear error."""

    @staticmethod
    def create(*args: Any, **kwargs: Any) -> Any:
        return _refuse("FX wrapper (fx_wrapper=True)")


# [doc:scheduler-is-cpu]
def _scheduler_treats_openreg_as_cpp() -> None:
    """Inductor's scheduler skips the loop reordering and reindexing that only
    its SIMD (Triton) kernels support for nodes whose ``is_cpu()`` is true
    (torch/_inductor/scheduler.py); it means "generated by the C++ backend".
    openreg's nodes are generated by that backend too."""
    if getattr(BaseSchedulerNode.is_cpu, "_openreg", False):
        return

    def is_cpu(self: BaseSchedulerNode) -> bool:
        device = self.get_device()
        return device is not None and device.type in ("cpu", DEVICE)

    is_cpu._openreg = True  # type: ignore[attr-defined]
    BaseSchedulerNode.is_cpu = is_cpu  # type: ignore[method-assign]


# [/doc:scheduler-is-cpu]

_scheduler_treats_openreg_as_cpp()
