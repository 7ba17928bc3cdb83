"""Triton kernels under the PyTorch front end: each launch is reads and writes of the tensors it
takes, on its launch stream.

Design:
- Where launches are seen: Triton calls ``CompiledKernel.launch_metadata(grid, stream, *args)``
  for every launch once a launch-enter hook is set (Inductor's launchers and ``JITFunction.run``
  alike), with the kernel's arguments in the order of its ``arg_names``. While the front end
  runs, that method is wrapped (and a hook that does nothing is set if none is): the wrapper
  hands the launch to the front end, then returns what Triton's own method returns.
- What a kernel does to each argument (``kernel_roles``), decided once per compiled kernel:
  - Inductor's kernels name their pointers by role: ``in_ptr*`` are read, ``out_ptr*``
    written, ``in_out_ptr*`` read and written.
  - Other kernels (a user's ``@triton.jit``): from the kernel's Triton IR (``asm["ttir"]``),
    the arguments whose pointers reach a ``tt.store`` (or an atomic, or a tensor descriptor
    that is stored through) are written, those that reach a ``tt.load`` read.
  - An argument that cannot be told (no IR, a pointer the analysis does not follow) is read
    without the uninitialized-read check and may have been written (``MAYBE_WRITE``): no
    correct program is reported for it; a race of its writes can be missed.
- Non-tensor arguments (sizes, strides, constexprs) touch nothing.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from ..safety.sanitizer import MAYBE_WRITE, NO_INIT_CHECK, READ, WRITE

__all__ = ["kernel_roles", "ir_roles", "install", "uninstall", "UNKNOWN"]

UNKNOWN = READ | NO_INIT_CHECK | MAYBE_WRITE
_INDUCTOR = (("in_out_ptr", READ | WRITE), ("out_ptr", WRITE), ("in_ptr", READ))
_PARAM = re.compile(r'%([\w.$-]+)\s*:\s*([^%]*?)\s+loc\("([^"]+)"')
_SSA = re.compile(r"%[\w.$#-]+")
_STORES = ("tt.store", "tt.atomic_rmw", "tt.atomic_cas", "tt.descriptor_store", "tt.descriptor_reduce",
           "tt.experimental_descriptor_store", "ttng.async_tma_copy_local_to_global", "tt.descriptor_scatter")
_LOADS = ("tt.load", "tt.descriptor_load", "tt.experimental_descriptor_load", "tt.descriptor_gather",
          "tt.atomic_rmw", "tt.atomic_cas")


def ir_roles(ttir: str) -> dict[str, int] | None:
    """The mode of each pointer argument of the kernel in ``ttir`` (by its source name), or None
    when the IR cannot be read. Pointers no load or store reaches are left out (untouched)."""
    head = next((ln for ln in ttir.splitlines() if "tt.func" in ln and "@" in ln), None)
    if head is None:
        return None
    params = {ssa: name for ssa, typ, name in _PARAM.findall(head) if "ptr" in typ or "tensordesc" in typ}
    if not params and "!tt.ptr" in head:
        return None  # pointer parameters without names: nothing to map them to
    deps: dict[str, set[str]] = {}
    stores: list[list[str]] = []
    loads: list[list[str]] = []
    for raw in ttir.splitlines():
        line = raw.split(" loc(", 1)[0].strip()
        if not line or line.startswith(("tt.func", "}", "module", "#")):
            continue
        lhs, eq, rhs = line.partition(" = ")
        if not eq:
            rhs, lhs = line, ""
        operands = _SSA.findall(rhs)
        op = rhs.split("(", 1)[0].split()[0].strip('"') if rhs.split() else ""
        # Where a pointer comes from: a loaded value is data, not a pointer derived from the one
        # it was loaded through; addptr and advance derive from their first operand only.
        if op in _LOADS:
            came_from: list[str] = []
        elif op in ("tt.addptr", "tt.advance"):
            came_from = operands[:1]
        else:
            came_from = operands
        for res in _SSA.findall(lhs):
            deps.setdefault(res.split("#")[0], set()).update(came_from)
        if "iter_args(" in rhs:  # scf.for iter_args(%p = %x, ...): a loop-carried value comes from its init
            for name, init in re.findall(r"(%[\w.$-]+)\s*=\s*(%[\w.$#-]+)", rhs.split("iter_args(", 1)[1]):
                deps.setdefault(name, set()).add(init)
        if op in _STORES:
            stores.append(operands if op.startswith("tt.atomic") or "descriptor" in op else operands[:1])
        if op in _LOADS:
            loads.append(operands if op.startswith("tt.atomic") or "descriptor" in op else operands[:1])

    def reach(starts: list[str]) -> set[str]:
        seen: set[str] = set()
        todo = [s.split("#")[0] for s in starts]
        while todo:
            v = todo.pop()
            if v in seen:
                continue
            seen.add(v)
            todo.extend(d.split("#")[0] for d in deps.get(v, ()))
        return seen

    written = reach([o for ops in stores for o in ops])
    read = reach([o for ops in loads for o in ops])
    out: dict[str, int] = {}
    for ssa, name in params.items():
        key = "%" + ssa
        mode = (WRITE if key in written else 0) | (READ if key in read else 0)
        if mode:
            out[name] = mode
    return out


def kernel_roles(names: list[str], ttir: str | None) -> list[int | None]:
    """Each argument's mode for a kernel with argument ``names`` (None: not a buffer, or not
    touched); ``UNKNOWN`` where it cannot be told (see the module's description)."""
    if any(n.startswith(p) for n in names for p, _ in _INDUCTOR):
        out: list[int | None] = []
        for n in names:
            out.append(next((m for p, m in _INDUCTOR if n.startswith(p)), UNKNOWN))
        return out
    roles = ir_roles(ttir) if ttir else None
    if roles is None:
        return [UNKNOWN] * len(names)
    return [roles.get(n) for n in names]


# -- the hook --------------------------------------------------------------------------------
_saved: dict[str, Any] = {}


def _noop_hook(metadata: Any) -> None:
    """Set as Triton's launch-enter hook when the program has none: with a hook, every launcher
    calls ``launch_metadata``, where the front end sees the launch."""


def install(on_launch: Callable[[Any, int, tuple], None]) -> bool:
    """Wrap Triton's ``CompiledKernel.launch_metadata`` so that each launch goes to
    ``on_launch(kernel, stream, args)`` first. False when this Triton has no such method."""
    try:
        from triton import knobs
        from triton.compiler.compiler import CompiledKernel
    except ImportError:
        return False
    orig = CompiledKernel.__dict__.get("launch_metadata")
    if orig is None or "launch_metadata" in _saved:
        return orig is not None

    def launch_metadata(self: Any, grid: Any, stream: Any, *args: Any) -> Any:
        on_launch(self, stream, args)
        return orig(self, grid, stream, *args)

    _saved["launch_metadata"] = orig
    CompiledKernel.launch_metadata = launch_metadata
    if knobs.runtime.launch_enter_hook is None:
        knobs.runtime.launch_enter_hook = _noop_hook
        _saved["hook"] = True
    return True


def uninstall() -> None:
    """Undo ``install``."""
    orig = _saved.pop("launch_metadata", None)
    if orig is None:
        return
    from triton import knobs
    from triton.compiler.compiler import CompiledKernel
    CompiledKernel.launch_metadata = orig
    if _saved.pop("hook", False) and knobs.runtime.launch_enter_hook is _noop_hook:
        knobs.runtime.launch_enter_hook = None
