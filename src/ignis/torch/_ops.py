"""Which bytes an aten op reads and writes, from its schema's alias annotations.

Rules (one ``OpSpec`` per ``OpOverload``, built on first sight and cached):
- A tensor argument without an alias annotation is read. One annotated as
  written (``Tensor(a!)``) is written: an ``out=`` argument and the self of an
  in-place op that overwrites without reading (``fill_``, ``copy_``, ``zero_``,
  the random fills, the scatters) is written only; the self of any other
  in-place op is read and written. One annotated as a view (``Tensor(a)``)
  is not touched: views, reshapes and ``detach`` move no bytes.
- A returned tensor without an alias annotation is fresh: the op wrote it.
  The ``empty`` family returns memory nobody wrote (the uninitialized-read
  check starts there). ``new_*`` and ``*_like`` factories read only their
  input's metadata. Returns that alias an input are that input's access.
- Ops that touch no bytes (metadata queries, ops that change a view in place)
  are inactive: the dispatch mode only runs them. ``record_stream``,
  ``copy_``, ``_to_copy`` and ``resize_`` are special (streams, pinned host
  memory, reallocation).
- Collectives (``c10d``, the functional collectives of ``_c10d_functional`` and
  their relatives) carry no alias annotations: their roles come from a table
  (``_COLLECTIVES``). Each is special (``"collective"``): its buffers are read and
  written on the stream the communication library runs it on, after what its
  issuing stream queued before the call (see ``TorchFrontEnd.collective``). An
  op of another library without a kernel in this table is read as its schema
  says; a tensor argument it does not annotate is read without the
  uninitialized-read check and counts as possibly written after it
  (``MAYBE_WRITE``): a schema that leaves out a write must not make a correct
  program's later read look uninitialized.
- Data-dependent gathers (``index``, ``embedding``, ``gather``) read rows an
  index picks: their span is the whole source, so they skip the
  uninitialized-read check (the race check keeps the span).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ..safety.sanitizer import MAYBE_WRITE, NO_INIT_CHECK, OUTPUT, READ, WRITE

__all__ = ["OpSpec", "Role", "classify", "SPECS", "BROADCAST", "REDUCE", "P2P"]

_FACTORY = re.compile(r"(new_.*|.*_like)$")
_EMPTY = frozenset({"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
                    "_empty_affine_quantized", "_empty_per_channel_affine_quantized"})
# In-place ops whose self is overwritten, not read (the rest read it too).
_OVERWRITE = frozenset({"fill_", "zero_", "copy_", "normal_", "uniform_", "random_", "exponential_", "geometric_",
                        "cauchy_", "log_normal_", "bernoulli_", "index_put_", "_index_put_impl_", "masked_fill_",
                        "index_fill_", "scatter_", "masked_scatter_", "index_copy_", "fill_diagonal_", "put_",
                        "_foreach_zero_", "_foreach_copy_"})
_METADATA = frozenset({"sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size", "stride",
                       "storage_offset", "numel", "dim", "is_same_size", "is_pinned", "is_contiguous",
                       "is_coalesced", "_has_compatible_shallow_copy_type", "is_complex", "is_floating_point",
                       "is_signed", "is_conj", "is_neg", "is_inference", "set_", "_nested_tensor_size",
                       "_version", "output_nr", "_is_zerotensor", "result_type", "can_cast", "promote_types",
                       "retain_grad", "requires_grad_", "_assert_tensor_metadata", "is_set_to", "_nnz",
                       "_debug_has_internal_overlap", "resize_as_sparse_", "sparse_resize_", "detach_",
                       "_propagate_xla_data", "record_stream", "_pin_memory", "pin_memory"})
_INDEXED = {"index": "self", "_unsafe_index": "self", "index_select": "self", "gather": "self",
            "embedding": "weight", "take": "self", "take_along_dim": "self", "_embedding_bag": "weight",
            "_embedding_bag_forward_only": "weight", "embedding_bag": "weight"}
_SPECIAL = {"record_stream": "record_stream", "copy_": "copy", "_to_copy": "to_copy", "resize_": "resize"}
_TENSORS = {"Tensor": False, "Optional[Tensor]": False, "List[Tensor]": True, "List[Optional[Tensor]]": True}
# Namespaces whose ops' schemas are trusted to annotate every write (the rest: ``MAYBE_WRITE``).
_ANNOTATED = frozenset({"aten", "prims", "quantized", "_quantized", "rngprims", "profiler"})

# -- collectives ----------------------------------------------------------------------------
# Modes that depend on the calling rank (resolved per call: ``Role.mode_for``).
BROADCAST = -1  # the root sends (reads), the others receive (write)
REDUCE = -2     # the root reduces into it (reads and writes), the others send (read)
P2P = -3        # batch_p2p_ops: each tensor's own entry of op_list says "isend" or "irecv"
_RW, _R, _W = READ | WRITE, READ, WRITE
_CLONE = OUTPUT | WRITE      # a fresh output the op fills on the issuing stream before the launch
_ALLOC = OUTPUT              # a fresh output the collective fills
# op base name -> (roles on the communication stream, roles on the issuing stream); a role's key
# is an argument's name or "#i", the op's i-th return.
_C10D: dict[str, tuple[dict[str, int], dict[str, int]]] = {
    "allreduce_": ({"tensors": _RW}, {}),
    "allreduce_coalesced_": ({"tensors": _RW}, {}),
    "broadcast_": ({"tensors": BROADCAST}, {}),
    "reduce_": ({"tensors": REDUCE}, {}),
    "allgather_": ({"input_tensors": _R, "output_tensors": _W}, {}),
    "_allgather_base_": ({"input_tensor": _R, "output_tensor": _W}, {}),
    "allgather_coalesced_": ({"input_list": _R, "output_lists": _W}, {}),
    "allgather_into_tensor_coalesced_": ({"inputs": _R, "outputs": _W}, {}),
    "reduce_scatter_": ({"input_tensors": _R, "output_tensors": _W}, {}),
    "_reduce_scatter_base_": ({"input_tensor": _R, "output_tensor": _W}, {}),
    "reduce_scatter_tensor_coalesced_": ({"inputs": _R, "outputs": _W}, {}),
    "alltoall_": ({"input_tensors": _R, "output_tensors": _W}, {}),
    "alltoall_base_": ({"input": _R, "output": _W}, {}),
    "gather_": ({"input_tensors": _R, "output_tensors": _W}, {}),
    "scatter_": ({"input_tensors": _R, "output_tensors": _W}, {}),
    "send": ({"tensors": _R}, {}),
    "recv_": ({"tensors": _W}, {}),
    "recv_any_source_": ({"tensors": _W}, {}),
    "barrier": ({}, {}),
    "monitored_barrier_": ({}, {}),
}
_FUNCTIONAL: dict[str, tuple[dict[str, int], dict[str, int]]] = {
    "all_reduce": ({"#0": _RW}, {"input": _R, "self": _R, "#0": _CLONE}),
    "all_reduce_": ({"input": _RW}, {}),
    "all_reduce_coalesced": ({"#0": _RW}, {"inputs": _R, "self": _R, "#0": _CLONE}),
    "all_reduce_coalesced_": ({"inputs": _RW}, {}),
    "all_gather_into_tensor": ({"input": _R, "shard": _R, "#0": _W}, {"#0": _ALLOC}),
    "all_gather_into_tensor_coalesced": ({"inputs": _R, "input": _R, "#0": _W}, {"#0": _ALLOC}),
    "all_gather_into_tensor_out": ({"input": _R, "out": _W}, {}),
    "reduce_scatter_tensor": ({"input": _R, "#0": _W}, {"#0": _ALLOC}),
    "reduce_scatter_tensor_coalesced": ({"inputs": _R, "#0": _W}, {"#0": _ALLOC}),
    "reduce_scatter_tensor_out": ({"input": _R, "out": _W}, {}),
    "all_to_all_single": ({"input": _R, "#0": _W}, {"#0": _ALLOC}),
    "shard_dim_alltoall": ({"input": _R, "#0": _W}, {"#0": _ALLOC}),
    "broadcast": ({"#0": _RW | NO_INIT_CHECK}, {"input": _R, "self": _R, "#0": _CLONE}),
    "broadcast_": ({"input": BROADCAST}, {}),
    "isend": ({"tensor": _R, "self": _R}, {}),
    "irecv": ({"tensor": _W, "self": _W}, {}),
    "batch_p2p_ops": ({"tensors": P2P}, {}),
}
_COLLECTIVES = {"c10d": _C10D, "_c10d_functional": _FUNCTIONAL, "_c10d_functional_autograd": _FUNCTIONAL,
                "c10d_functional": _FUNCTIONAL, "_dtensor": _FUNCTIONAL}
# Ops of those namespaces that touch no bytes (waits are seen as the event waits they are).
_COLLECTIVE_INACTIVE = frozenset({"wait_tensor", "_wrap_tensor_autograd", "check_for_nan"})


class Role:
    """One tensor argument (or return) of a collective: its name, where it is (``ret``: the
    op's ``pos``-th return, else its ``pos``-th argument) and its mode bits (or ``BROADCAST``,
    ``REDUCE``, ``P2P``: resolved per call)."""

    __slots__ = ("name", "pos", "ret", "mode")

    def __init__(self, name: str, pos: int, ret: bool, mode: int) -> None:
        self.name, self.pos, self.ret, self.mode = name, pos, ret, mode

    def __repr__(self) -> str:
        return f"<Role {self.name} mode={self.mode}>"

    def value(self, args: tuple, kwargs: dict | None, out: Any, multi: bool) -> Any:
        """What this role names in one call: a tensor, a list of them or a list of lists."""
        if self.ret:
            if not multi:
                return out if self.pos == 0 else None
            return out[self.pos] if isinstance(out, (tuple, list)) and self.pos < len(out) else None
        if self.pos < len(args):
            return args[self.pos]
        return kwargs.get(self.name) if kwargs else None


def flatten(v: Any, found: list, kind: type = torch.Tensor) -> list:
    """The tensors in ``v`` (a tensor, or lists of them, nested), appended to ``found``; or
    the values of another ``kind`` (a collective's ``Work``: ``torch.ScriptObject``)."""
    if isinstance(v, kind):
        found.append(v)
    elif isinstance(v, (list, tuple)):
        for e in v:
            flatten(e, found, kind)
    return found


class OpSpec:
    """How one ``OpOverload`` touches its tensors.

    ``inputs``: ``(position, name, mode, is_list)`` per touched tensor argument
    (mode bits from ``ignis.safety.sanitizer``); ``outputs``: ``(index, mode, is_list)``
    per fresh returned tensor; ``multi``: the op returns a tuple; ``special``:
    the name of a special handling, or None; ``active``: whether the op touches
    bytes at all."""

    __slots__ = ("op", "name", "call", "inputs", "outputs", "multi", "special", "active", "comm", "issue", "native")

    def __init__(self, op: Any, name: str, inputs: tuple, outputs: tuple, multi: bool, special: str | None,
                 active: bool, comm: tuple = (), issue: tuple = ()) -> None:
        self.op, self.name = op, name
        self.call = getattr(op, "_op", op)  # the C++ overload itself: one Python call less
        self.inputs, self.outputs, self.multi = inputs, outputs, multi
        self.special, self.active = special, active
        # A collective's ``Role``s: on the stream the communication runs on, and on the issuing
        # stream before the launch (a functional collective's fresh output).
        self.comm, self.issue = comm, issue
        self.native: Any = None  # the observer library's form of inputs and outputs (the front end's, at first use)

    def __repr__(self) -> str:
        def m(mode: int) -> str:
            return "".join(c for bit, c in ((READ, "r"), (WRITE, "w"), (OUTPUT, "o"), (NO_INIT_CHECK, "n"))
                           if mode & bit)
        ins = ", ".join(f"{n}:{m(md)}{'[]' if ls else ''}" for _, n, md, ls in self.inputs)
        outs = ", ".join(f"#{i}:{m(md)}" for i, md, _ in self.outputs)
        flags = f" special={self.special}" if self.special else ""
        if self.special == "collective":
            ins = ", ".join(f"{r.name}:{m(r.mode) if r.mode >= 0 else r.mode}" for r in self.comm)
            outs = ", ".join(f"{r.name}:{m(r.mode)}" for r in self.issue)
        return f"<OpSpec {self.name} in=({ins}) out=({outs}){flags}{'' if self.active else ' inactive'}>"

    def reads(self) -> list[str]:
        """Names of the arguments the op reads (a collective's: on its communication stream;
        a role that depends on the rank counts as both)."""
        if self.special == "collective":
            return [r.name for r in self.comm if r.mode < 0 or r.mode & READ]
        return [n for _, n, md, _ in self.inputs if md & READ]

    def writes(self) -> list[str]:
        """Names of the arguments the op writes (as ``reads``)."""
        if self.special == "collective":
            return [r.name for r in self.comm if r.mode < 0 or r.mode & WRITE]
        return [n for _, n, md, _ in self.inputs if md & WRITE]


SPECS: dict[Any, OpSpec] = {}


def classify(op: Any) -> OpSpec:
    """The cached ``OpSpec`` of an ``OpOverload`` (built from its schema on first call)."""
    spec = SPECS.get(op)
    if spec is None:
        spec = SPECS[op] = _build(op)
    return spec


def _build(op: Any) -> OpSpec:
    schema = getattr(op, "_schema", None)
    if schema is None:  # a higher-order operator: nothing to read from a schema
        return OpSpec(op, str(op), (), (), False, None, False)
    ns, _, base = schema.name.partition("::")
    name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
    tags = getattr(op, "tags", ())
    if (base in _METADATA or torch.Tag.inplace_view in tags) and base not in _SPECIAL:
        return OpSpec(op, name, (), (), False, None, False)
    table = _COLLECTIVES.get(ns)
    if table is not None:
        return _collective(op, name, schema, table.get(base), base)
    trusted = ns in _ANNOTATED
    factory = bool(_FACTORY.match(base))
    empty = base in _EMPTY
    indexed = _INDEXED.get(base)
    inputs = []
    for pos, a in enumerate(schema.arguments):
        many = _TENSORS.get(str(a.type))
        if many is None:
            continue
        ai = a.alias_info
        if ai is None:
            if factory:
                continue  # new_* / *_like: the input's metadata only
            if trusted:
                mode = READ | (NO_INIT_CHECK if a.name == indexed else 0)
            else:  # another library's schema may leave out a write
                mode = READ | NO_INIT_CHECK | MAYBE_WRITE
        elif ai.is_write:
            mode = WRITE if (a.is_out or base in _OVERWRITE) else READ | WRITE
        else:
            continue  # a view of the input: no bytes move
        inputs.append((pos, a.name, mode, many))
    outputs = []
    for i, r in enumerate(schema.returns):
        many = _TENSORS.get(str(r.type))
        if many is None or r.alias_info is not None:
            continue
        outputs.append((i, OUTPUT if empty else OUTPUT | WRITE, many))
    special = _SPECIAL.get(base) if trusted else None
    if special == "record_stream":
        inputs = []
    active = bool(inputs or outputs or special)
    return OpSpec(op, name, tuple(inputs), tuple(outputs), len(schema.returns) > 1, special, active)


def _collective(op: Any, name: str, schema: Any, roles: tuple | None, base: str) -> OpSpec:
    """The spec of a collective, from the table (a collective's schema says nothing of its roles).
    One the table does not know: every tensor it takes is read and written on the stream it
    runs on, without the uninitialized-read check (a received buffer may be fresh)."""
    multi = len(schema.returns) > 1
    if base in _COLLECTIVE_INACTIVE:
        return OpSpec(op, name, (), (), multi, None, False)
    args = {a.name: i for i, a in enumerate(schema.arguments)}
    if roles is None:
        comm = tuple(Role(a.name, i, False, READ | WRITE | NO_INIT_CHECK) for i, a in enumerate(schema.arguments)
                     if "Tensor" in str(a.type))
        return OpSpec(op, name, (), (), multi, "collective", True, comm, ())

    def resolve(side: dict[str, int]) -> tuple:
        out = []
        for key, mode in side.items():
            if key.startswith("#"):
                i = int(key[1:])
                if i < len(schema.returns):
                    out.append(Role(key, i, True, mode))
            elif key in args:
                out.append(Role(key, args[key], False, mode))
        return tuple(out)
    return OpSpec(op, name, (), (), multi, "collective", True, resolve(roles[0]), resolve(roles[1]))
