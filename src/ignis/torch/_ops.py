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
  memory, reallocation); ``c10d`` collectives read and write every tensor.
- Data-dependent gathers (``index``, ``embedding``, ``gather``) read rows an
  index picks: their span is the whole source, so they skip the
  uninitialized-read check (the race check keeps the span).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ..safety.sanitizer import NO_INIT_CHECK, OUTPUT, READ, WRITE

__all__ = ["OpSpec", "classify", "SPECS"]

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


class OpSpec:
    """How one ``OpOverload`` touches its tensors.

    ``inputs``: ``(position, name, mode, is_list)`` per touched tensor argument
    (mode bits from ``ignis.safety.sanitizer``); ``outputs``: ``(index, mode, is_list)``
    per fresh returned tensor; ``multi``: the op returns a tuple; ``special``:
    the name of a special handling, or None; ``active``: whether the op touches
    bytes at all."""

    __slots__ = ("op", "name", "call", "inputs", "outputs", "multi", "special", "active")

    def __init__(self, op: Any, name: str, inputs: tuple, outputs: tuple, multi: bool, special: str | None,
                 active: bool) -> None:
        self.op, self.name = op, name
        self.call = getattr(op, "_op", op)  # the C++ overload itself: one Python call less
        self.inputs, self.outputs, self.multi = inputs, outputs, multi
        self.special, self.active = special, active

    def __repr__(self) -> str:
        def m(mode: int) -> str:
            return "".join(c for bit, c in ((READ, "r"), (WRITE, "w"), (OUTPUT, "o"), (NO_INIT_CHECK, "n"))
                           if mode & bit)
        ins = ", ".join(f"{n}:{m(md)}{'[]' if ls else ''}" for _, n, md, ls in self.inputs)
        outs = ", ".join(f"#{i}:{m(md)}" for i, md, _ in self.outputs)
        flags = f" special={self.special}" if self.special else ""
        return f"<OpSpec {self.name} in=({ins}) out=({outs}){flags}{'' if self.active else ' inactive'}>"

    def reads(self) -> list[str]:
        """Names of the arguments the op reads."""
        return [n for _, n, md, _ in self.inputs if md & READ]

    def writes(self) -> list[str]:
        """Names of the arguments the op writes."""
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
    factory = bool(_FACTORY.match(base))
    empty = base in _EMPTY
    collective = ns == "c10d"
    indexed = _INDEXED.get(base)
    inputs = []
    for pos, a in enumerate(schema.arguments):
        many = _TENSORS.get(str(a.type))
        if many is None:
            continue
        ai = a.alias_info
        if collective:
            mode = READ | WRITE if many else READ  # the buffers a collective reduces or fills in place
        elif ai is None:
            if factory:
                continue  # new_* / *_like: the input's metadata only
            mode = READ | (NO_INIT_CHECK if a.name == indexed else 0)
        elif ai.is_write:
            mode = WRITE if (a.is_out or base in _OVERWRITE) else READ | WRITE
        else:
            continue  # a view of the input: no bytes move
        inputs.append((pos, a.name, mode, many))
    outputs = []
    if not collective:
        for i, r in enumerate(schema.returns):
            many = _TENSORS.get(str(r.type))
            if many is None or r.alias_info is not None:
                continue
            outputs.append((i, OUTPUT if empty else OUTPUT | WRITE, many))
    special = _SPECIAL.get(base)
    if base == "record_stream":
        inputs = []
    active = bool(inputs or outputs or special)
    return OpSpec(op, name, tuple(inputs), tuple(outputs), len(schema.returns) > 1, special, active)
