"""Which Python call made a synchronizing openreg operation (sync debug mode).

``torch.openreg.set_sync_debug_mode("warn")`` reports each synchronization
CUDA would make; the C++ layer asks :func:`describe` what the program called,
so that the report says ``Tensor.__bool__ at train.py:12: `if loss > 0:```
rather than only ``aten::_local_scalar_dense``. It looks at the innermost
Python frame outside torch and openreg and at the instruction that frame is
executing.
"""

import builtins
import dis
import linecache
import os
import sys

import torch

_SKIP = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)
_CONDITIONS = {
    "POP_JUMP_FORWARD_IF_FALSE",
    "POP_JUMP_FORWARD_IF_TRUE",
    "POP_JUMP_BACKWARD_IF_FALSE",
    "POP_JUMP_BACKWARD_IF_TRUE",
    "POP_JUMP_IF_FALSE",
    "POP_JUMP_IF_TRUE",
    "JUMP_IF_FALSE_OR_POP",
    "JUMP_IF_TRUE_OR_POP",
    "UNARY_NOT",
}
_BUILTINS = set(dir(builtins))
# A tensor's printing goes through these methods of torch/_tensor.py.
_PRINTING = {"__repr__", "__str__", "__format__"}


def _instruction_call(frame) -> str | None:
    """What the frame's current instruction does to a tensor, if it can tell."""
    try:
        instructions = list(dis.get_instructions(frame.f_code))
    except (TypeError, ValueError):
        return None
    current = None
    for i, ins in enumerate(instructions):
        if ins.offset >= frame.f_lasti:
            current = i
            break
    if current is None:
        return None
    ins = instructions[current]
    if ins.opname in _CONDITIONS:
        return "Tensor.__bool__ (a tensor used as a condition)"
    if ins.opname == "FORMAT_VALUE":
        return "Tensor.__format__ (a tensor in an f-string)"
    if ins.opname in ("CALL", "PRECALL", "CALL_FUNCTION", "CALL_METHOD"):
        callee = _callee(instructions, current)
        if callee is not None and callee.opname in ("LOAD_METHOD", "LOAD_ATTR"):
            return f"Tensor.{callee.argval}()"
        if callee is not None and callee.argval in _BUILTINS:
            return f"{callee.argval}() of a tensor"  # int(t), float(t), list(t)
    return None


def _callee(instructions, current):
    """The instruction that loaded what the call at `current` calls: walking
    back over the arguments by their stack effects."""
    call = instructions[current]
    if call.opname == "PRECALL" and current + 1 < len(instructions):
        call = instructions[current + 1]
    argc = call.arg or 0
    # Back over the `argc` arguments (each an expression that leaves one
    # value); the instruction that goes past them loaded the callable.
    depth = 0
    for i in range(current - 1, -1, -1):
        ins = instructions[i]
        if ins.opname in ("PRECALL", "KW_NAMES", "CACHE", "PUSH_NULL"):
            continue
        try:
            depth += dis.stack_effect(ins.opcode, ins.arg, jump=False)
        except ValueError:
            return None
        if depth > argc:
            return ins
    return None


def describe() -> str:
    frame = sys._getframe(1)
    printing = False
    while frame is not None:
        filename = frame.f_code.co_filename
        if frame.f_code.co_name in _PRINTING and filename.endswith(
            os.path.join("torch", "_tensor.py")
        ):
            printing = True
        if not filename.startswith(_SKIP):
            break
        frame = frame.f_back
    if frame is None:
        return ""
    call = "printing a tensor (Tensor.__repr__)" if printing else _instruction_call(frame)
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    text = f"{where}: `{line}`" if line else where
    return f"{call} at {text}" if call else text
