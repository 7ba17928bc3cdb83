"""Every operation that takes an array refuses a dead one before it touches memory.

A dead array is a freed one, or a stale one: made before its device's context was rebuilt
(``Device.rebuild()``), whose addresses the rebuilt context hands to new arrays. The walk
below finds the operations itself, so one added later is covered too:

- every public method and property of ``NvArray`` (the protocols among its dunders too);
- every function, class and public method in ``__all__`` of Ignis's public modules with
  a parameter that takes an array: annotated ``NvArray`` (or the safety layer's
  ``SafeArray``, or a type variable bound to it), or documented as one (````NvArray```` in
  the parameter's entry of the docstring, for parameters annotated ``Any``).

Each is called with the dead array in each of its array slots (the others get live
arrays, a ``stream`` parameter a live stream of the current context: the case that used
to slip through). It must raise ``StaleHandleError`` (stale) or ``UseAfterFreeError``
(freed), and until then no backend call may have touched the bytes of the live array
that now owns the dead one's address, nor the other arrays' values changed. The only
operations allowed not to raise are in ``EXEMPT``, each with its reason; they must not
touch memory either. A required argument the walk cannot make up fails the test with
the name to add to ``ARGS`` (or ``CALLS``).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import socket
import sys
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest

import ignis as ig
from ignis.backends.base import OPS

N = 64  # elements of every array in the walk (float32)

# -- what may not raise, and why -------------------------------------------------------
METADATA = ("id", "shape", "dtype", "device", "stream", "owner", "ref_count", "created_at", "numel", "nbytes",
            "ndim", "freed", "is_view", "base", "owns_memory", "generation", "tag", "device_id", "resource",
            "size", "itemsize", "strides", "readonly", "pinned_host", "__len__", "block", "root", "tracked")
EXEMPT: dict[str, str] = {
    **{f"NvArray.{n}": "reads the array's own fields (metadata), never its memory" for n in METADATA},
    "NvArray.__repr__": "never raises: it shows the error instead of the values",
    "NvArray.__array__": "always refuses (TypeError): no implicit host conversion, live or dead",
    "NvArray.__reduce_ex__": "always refuses (TypeError): arrays are not pickled, live or dead",
    "NvArray.__eq__": "always refuses (TypeError): arrays are not compared, live or dead",
    "NvArray.__ne__": "always refuses (TypeError): as __eq__",
    "NvArray.__bool__": "always refuses (TypeError): an array has no truth value, live or dead",
    "NvArray.__delitem__": "always refuses (TypeError): an array's size is fixed, live or dead",
    "NvArray.__hash__": "the object's identity: no field, no memory",
    **{f"NvArray.__{op}__": "arrays have no order: NotImplemented (so TypeError), live or dead"
       for op in ("lt", "le", "gt", "ge")},
    "NvArray.__dlpack_device__": "says where the memory is (device type and ordinal), reads no byte",
    "ignis.array.dlpack_export.device_of": "NvArray.__dlpack_device__'s body (above)",
    "NvArray.free": "gives the block back without touching its bytes (a block of a rebuilt context is only "
                    "forgotten); a freed array raises DoubleFreeError",
    "ignis.array.empty_like": "takes only the template's shape, dtype and stream: the new array is fresh memory",
    "ignis.array.zeros_like": "as empty_like",
    "ignis.array.ones_like": "as empty_like",
    "ignis.array.full_like": "as empty_like",
    "ignis.safety.MemoryContract.release": "ownership bookkeeping, no memory: must work on a dead array",
    "ignis.safety.MemoryContract.assert_owner": "reads the owner field only",
    "ignis.safety.MemoryContract.track": "leak-audit bookkeeping (a weak reference), no memory",
    "ignis.safety.MemoryContract.untrack": "leak-audit bookkeeping, no memory",
    "ignis.ipc.is_imported": "says whether the array maps another process's memory, reads no byte",
    "ignis.ipc.close": "unmaps an imported array's mapping (refuses others): no byte is read or written",
    "NvArray.mark_read_only": "puts a mark on the array object (its later writes refuse): no byte is touched",
    "NvArray.mark_failed": "puts a mark on the array object (its later uses refuse): no byte is touched",
    "NvArray.from_foreign": "a constructor (a class method): it takes no array, so none can be dead",
    "NvArray.from_block": "a constructor (a class method): it takes a resource's block, not an array",
}
if not ig.get_backend().cuda_driver:
    EXEMPT["NvArray.__cuda_array_interface__"] = ("the emulated backend has no CUDA array interface: "
                                                  "AttributeError before anything is exported")
    EXEMPT["ignis.array.dlpack_export.cuda_array_interface"] = "as NvArray.__cuda_array_interface__"

# Object machinery of NvArray, not operations on an array.
PLUMBING = {"__new__", "__init__", "__del__", "__dict__", "__doc__", "__pyx_vtable__", "__weakref__",
            "__module__", "__annotations__", "__reduce_cython__", "__setstate_cython__"}

# Modules not walked: the command line (it runs scripts), and the front ends, whose
# operations take PyTorch tensors and CuPy arrays.
NOT_WALKED = ("ignis.cli", "ignis.torch", "ignis.cupy")


# -- the scene: a dead array, and the live one that owns its address now -----------------
@dataclass
class Scene:
    kind: str                    # "stale" or "freed"
    dev: ig.Device
    dead: ig.NvArray
    new: ig.NvArray              # live, at the dead array's address (where the backend reuses it)
    stream: ig.Stream            # live, of the current context
    tmp: Any
    others: list = field(default_factory=list)
    touched: list = field(default_factory=list)

    def live(self) -> ig.NvArray:
        a = ig.full(N, 3.0, "float32", device=self.dev, stream=self.stream)
        self.others.append(a)
        return a

    @property
    def error(self) -> type:
        return ig.StaleHandleError if self.kind == "stale" else ig.UseAfterFreeError


@pytest.fixture(params=["stale", "freed"])
def scene(request, tmp_path, monkeypatch):
    dev = ig.Device(ig.device_count() - 1)  # rebuilt here; the other tests keep device 0
    if request.param == "stale":
        dev.synchronize()
        dev.rebuild()  # a fresh context: the dead array is its first allocation, as the new one will be
    dead = ig.full(N, 1.0, "float32", device=dev)
    ptr = dead._ptr
    if request.param == "stale":
        dev.synchronize()
        dev.rebuild()
    else:
        dead.free()
    new = ig.full(N, 7.0, "float32", device=dev)
    if ig.get_backend().name == "emulated":  # the emulator hands the address out again
        assert new._ptr == ptr, "the scene needs the new array at the dead one's address"
    sc = Scene(request.param, dev, dead, new, dev.create_stream(), tmp_path)
    dev.synchronize()
    _watch(monkeypatch, dev.backend, new._ptr, new._ptr + new.nbytes, sc.touched)
    yield sc
    monkeypatch.undo()
    dev.synchronize()
    for a in (new, *sc.others):
        if not a.freed and a.owner == "compute":
            a.free()
    sc.stream.close()


def _watch(monkeypatch, backend: Any, lo: int, hi: int, touched: list) -> None:
    """Record every backend call with an argument that points into [lo, hi): the bytes of
    the live array at the dead one's address."""
    def wrap(name: str, fn: Callable) -> Callable:
        def call(*args, **kwargs):
            for v in (*args, *kwargs.values()):
                if type(v) is int and lo <= v < hi:
                    touched.append(f"{name}{args}")
            return fn(*args, **kwargs)
        return call

    for name in (*OPS, "host_view", "host_address", "allocation_view"):
        monkeypatch.setattr(backend, name, wrap(name, getattr(backend, name)))


# -- discovery -----------------------------------------------------------------------------
_ARRAY_TYPE = re.compile(r"\b(NvArray|SafeArray)\b")


def _takes_array(fn: Any, p: inspect.Parameter, doc: str) -> bool:
    ann = p.annotation
    text = ann if isinstance(ann, str) else repr(ann)
    if _ARRAY_TYPE.search(text):
        return True
    mod = sys.modules.get(getattr(fn, "__module__", "") or "")
    tv = getattr(mod, text, None) if isinstance(ann, str) and mod is not None else ann
    if isinstance(tv, typing.TypeVar) and tv.__bound__ is not None and _ARRAY_TYPE.search(repr(tv.__bound__)):
        return True
    if p.kind is p.VAR_KEYWORD:  # options (``**kw``), never the array
        return False
    # the parameter's entry in the docstring (to the next entry) names ``NvArray`` as what it takes
    m = re.search(rf"^(\s*)\**`{{0,2}}{re.escape(p.name)}`{{0,2}}:(.*(?:\n\1\s+.*)*)", doc, re.M)
    return bool(m and re.search(r"``\(?NvArray\b", m.group(2)))


def _array_slots(fn: Any) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    doc = inspect.getdoc(fn) or ""
    return [p.name for p in sig.parameters.values() if _takes_array(fn, p, doc)]


def _public_modules() -> list[Any]:
    mods = []
    for info in pkgutil.walk_packages(ig.__path__, "ignis."):
        name = info.name
        if any(part.startswith("_") for part in name.split(".")[1:]) or name.startswith(NOT_WALKED):
            continue
        mods.append(importlib.import_module(name))
    return mods


def operations() -> list[tuple[str, str, Any]]:
    """(name, kind, target): kind "attr" (read the attribute of the array), "method" (an
    NvArray method), "function" (a callable with array slots)."""
    ops: dict[str, tuple[str, str, Any]] = {}
    for name, v in vars(ig.NvArray).items():
        if name in PLUMBING or (name.startswith("_") and not name.startswith("__")):
            continue
        key = f"NvArray.{name}"
        if isinstance(v, staticmethod):
            ops[key] = (key, "function", getattr(ig.NvArray, name))
        elif callable(v) or hasattr(v, "__get__") and not hasattr(v, "__set__"):
            ops[key] = (key, "method", name)
        else:
            ops[key] = (key, "attr", name)
    seen: set[int] = set()
    for mod in _public_modules():
        for n in getattr(mod, "__all__", ()):
            obj = getattr(mod, n, None)
            if obj is ig.NvArray or obj is None:
                continue
            cands = []
            if isinstance(obj, type):
                if issubclass(obj, BaseException):
                    continue
                cands.append((f"{mod.__name__}.{n}", obj))
                cands += [(f"{mod.__name__}.{n}.{m}", getattr(obj, m)) for m in dir(obj)
                          if not m.startswith("_") and callable(getattr(obj, m, None))]
            elif callable(obj):
                cands.append((f"{mod.__name__}.{n}", obj))
            for key, fn in cands:
                if id(fn) in seen or not _array_slots(fn):
                    continue
                seen.add(id(fn))
                ops.setdefault(key, (key, "function", fn))
    return sorted(ops.values())


# -- arguments -------------------------------------------------------------------------------
# What a required (or stream) parameter of that name gets; sc is the Scene, t the array in
# the slot being walked.
ARGS: dict[str, Callable[[Scene, Any], Any]] = {
    "stream": lambda sc, t: sc.stream,
    "value": lambda sc, t: 1.0,
    "a": lambda sc, t: 1.0,               # axpy's scalar
    "stride": lambda sc, t: 1,
    "offset": lambda sc, t: 0,
    "start_row": lambda sc, t: 0,
    "data": lambda sc, t: np.zeros(N, np.float32),
    "shape": lambda sc, t: (-1,),
    "key": lambda sc, t: 0,
    "dim": lambda sc, t: 0,
    "start": lambda sc, t: 0,
    "length": lambda sc, t: 1,
    "by": lambda sc, t: "io",
    "owner": lambda sc, t: "io",
    "new_owner": lambda sc, t: "io",
    "peer": lambda sc, t: 0,
    "protocol": lambda sc, t: 4,
    "path": lambda sc, t: str(sc.tmp / "walk.safetensors"),
    "arrays": lambda sc, t: {"t": t},
    "uses": lambda sc, t: [(t, "read")],
    "sock": lambda sc, t: sc.sock(),
    "dtype": lambda sc, t: "float32",
}

# Callables whose arguments are not one per parameter name.
CALLS: dict[str, Callable[[Scene, Any, Any], tuple[tuple, dict]]] = {
    # launch(kernel, grid, block, *args): the built-in copy's arrays are (dst, src)
    "ignis.array.launch": lambda sc, t, other: ((ig.kernels.kernel("copy", 4), 1, N, *t, N), {"stream": sc.stream}),
}


def _instance(cls_name: str, sc: Scene) -> Any:
    if cls_name == "ignis.safety.MemoryContract":
        return ig.contract
    if cls_name == "ignis.collective.Communicator":
        return sc.communicator()
    raise AssertionError(f"the walk has no instance of {cls_name} to call its methods on: add one to _instance")


def _call(sc: Scene, key: str, kind: str, target: Any, slot: str) -> Any:
    """Call operation ``key`` with the dead array in ``slot`` (live arrays in the others)."""
    if kind == "attr":
        return getattr(sc.dead, target)
    if kind == "method":
        fn = getattr(ig.NvArray, target)
        slots = ["self", *_array_slots(fn)]
    else:
        fn = target
        slots = _array_slots(fn)
    if key in CALLS:
        arrays = [sc.dead if s == slot else sc.live() for s in ("dst", "src")]
        args, kwargs = CALLS[key](sc, arrays, None)
        return fn(*args, **kwargs)
    owner = None
    # A method of a class: a Python function, or one compiled from a .py (a Cython function).
    is_fn = inspect.isfunction(fn) or (type(fn).__name__ == "cython_function_or_method"
                                       and "." in key.rsplit(".", 1)[0])
    if kind == "function" and is_fn and "." in fn.__qualname__ and not isinstance(fn, type):
        cls_key = key.rsplit(".", 1)[0]
        static = isinstance(inspect.getattr_static(_cls(cls_key), fn.__name__, None), staticmethod)
        if not static:
            owner = _instance(cls_key, sc)
    if kind == "method":
        owner = sc.dead if slot == "self" else sc.live()
    sig = _signature(key, fn)
    args: list = []
    kwargs: dict = {}
    for p in sig.parameters.values():
        if p.name in ("self", "cls") and owner is not None:
            continue
        if p.name in slots:
            arr = sc.dead if p.name == slot else sc.live()
            v = ARGS[p.name](sc, arr) if p.name in ("arrays", "uses") else arr
        elif p.name in ARGS and (p.default is inspect.Parameter.empty or p.name == "stream"):
            v = ARGS[p.name](sc, None)
        elif p.default is not inspect.Parameter.empty or p.kind in (p.VAR_KEYWORD,):
            continue
        else:
            raise AssertionError(f"{key}: no argument for required parameter {p.name!r}: add it to ARGS")
        if p.kind is p.VAR_POSITIONAL:
            args.extend(v)
        elif p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = v
        else:
            args.append(v)
    bound = getattr(owner, fn.__name__) if owner is not None else fn
    return bound(*args, **kwargs)


# The parameters of NvArray's C-level slots, which have no signature to read.
SLOT_PARAMS = {"__getitem__": ("key",), "__setitem__": ("key", "value"), "__delitem__": ("key",), "__len__": (),
               "__repr__": ()}


def _signature(key: str, fn: Any) -> inspect.Signature:
    try:
        return inspect.signature(fn)
    except ValueError:
        name = key.rsplit(".", 1)[1]
        assert name in SLOT_PARAMS, f"{key} has no signature to read: add its parameters to SLOT_PARAMS"
        return inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY)
                                  for n in ("self", *SLOT_PARAMS[name])])


def _cls(dotted: str) -> type:
    mod, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(mod), name)


def _slots_of(key: str, kind: str, target: Any) -> list[str]:
    if kind == "attr":
        return ["self"]
    if key in CALLS:
        return ["dst", "src"]
    if kind == "method":
        return ["self", *_array_slots(getattr(ig.NvArray, target))]
    return _array_slots(target)


WALK = [(key, kind, target, slot) for key, kind, target in operations() for slot in _slots_of(key, kind, target)]


def _scene_extras(sc: Scene) -> None:
    socks: list = []
    comms: list = []

    def sock():
        a, b = socket.socketpair()
        socks.extend((a, b))
        return a

    def communicator():
        if not comms:
            from ignis.collective.launch import free_port
            try:
                comms.append(ig.collective.init_process_group(rank=0, world_size=1, master_port=free_port(),
                                                              timeout=10, device=sc.dev))
            except (ImportError, ig.CollectiveError, ig.UnsupportedError) as e:  # no NCCL on this GPU host
                pytest.skip(f"no one-rank process group here: {type(e).__name__}: {e}")
        return comms[0]

    sc.sock, sc.communicator = sock, communicator
    sc._cleanup = (socks, comms)


@pytest.mark.parametrize("key,kind,target,slot", WALK, ids=[f"{k}[{s}]" for k, _, _, s in WALK])
def test_dead_array_refused_before_memory_is_touched(scene, key, kind, target, slot):
    sc = scene
    _scene_extras(sc)
    try:
        try:
            out = _call(sc, key, kind, target, slot)
            if hasattr(out, "__enter__") and not isinstance(out, ig.NvArray):
                with out:
                    pass
        except sc.error:
            pass
        except Exception as e:
            if key not in EXEMPT:
                raise AssertionError(f"{key} with a {sc.kind} array in {slot!r} raised {type(e).__name__}, not "
                                     f"{sc.error.__name__}: {e}") from e
        else:
            assert key in EXEMPT, f"{key} accepted a {sc.kind} array in {slot!r}"
        assert not sc.touched, f"{key} touched the memory now owned by another array: {sc.touched[:3]}"
        sc.dev.synchronize()
        np.testing.assert_array_equal(sc.new.to_numpy(), np.full(N, 7.0, np.float32),
                                      err_msg=f"{key} changed the array at the dead one's address")
        for a in sc.others:
            if not a.freed:
                np.testing.assert_array_equal(a.to_numpy(), np.full(N, 3.0, np.float32),
                                              err_msg=f"{key} changed a live argument")
    finally:
        socks, comms = sc._cleanup
        for c in comms:
            ig.collective.destroy_process_group()
        for s in socks:
            s.close()


def test_the_walk_finds_every_operation_named_in_the_issue():
    """The operations the stale-array defect was reported through, each in the walk."""
    keys = {k for k, _, _, _ in WALK}
    for k in ("ignis.array.builtins.fill", "ignis.array.builtins.copy", "ignis.array.builtins.axpy",
              "ignis.array.builtins.gather", "NvArray.copy_", "NvArray.write_rows", "NvArray.access",
              "NvArray.use", "NvArray.access_all", "ignis.io.save_safetensors", "NvArray.__dlpack__",
              "ignis.ipc.export", "ignis.collective.Communicator.all_reduce", "ignis.array.launch",
              "NvArray.device_ptr", "ignis.memory.holds_poison", "ignis.safety.GpuRef", "ignis.interop.from_dlpack"):
        assert k in keys, k
    assert set(EXEMPT) - {"NvArray.__cuda_array_interface__", "ignis.array.dlpack_export.cuda_array_interface"} \
        <= keys, "an exemption names no operation of the walk"


def test_block_of_a_rebuilt_context_refused_by_its_resource():
    """The memory layer's block use: a block of a resource made before the rebuild is refused
    on a stream of the new context (nothing queued, no address handed on)."""
    dev = ig.Device(ig.device_count() - 1)
    pool = ig.PoolResource(device=dev)
    blk = pool.allocate(1024)
    dev.synchronize()
    dev.rebuild()
    s = dev.create_stream()
    try:
        with pytest.raises(ig.StaleHandleError, match="context rebuilt"):
            pool.prepare_block_use(blk, s, ig.Access.WRITE)
        pool.deallocate(blk)  # forgotten: its memory went with the context
    finally:
        s.close()
