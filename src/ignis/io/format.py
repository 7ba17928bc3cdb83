"""The safetensors format: header parsing (untrusted input) and header writing.

A file is ``u64 little-endian N`` | ``N bytes of UTF-8 JSON`` | data section.
The JSON object maps tensor names to ``{"dtype", "shape", "data_offsets"}``
(offsets relative to the data section) and may hold ``"__metadata__"``, a
string -> string map.

Rules for reading (every file is hostile until the whole header is checked):
- ``N`` is at most ``MAX_HEADER_SIZE`` (100,000,000, the reference's limit)
  and the header must lie inside the file.
- The header is UTF-8 JSON, an object, with no duplicate key at any level, read
  as the reference's parser (serde_json) reads it: no ``NaN`` / ``Infinity``,
  no number outside the double range, ``-0`` and integers outside
  ``[-2**63, 2**64)`` are floats, nesting at most ``MAX_DEPTH`` deep, and no
  string (name, metadata, or a field nobody reads) holding a lone UTF-16
  surrogate (``"\ud800"``: not Unicode, it could not be written back).
- Each tensor has a known dtype (or one given by ``dtype_map``), a shape of
  non-negative ints and two non-negative int offsets, ``begin <= end``, inside
  the data section; ``end - begin`` equals the shape's element count times the
  item size. Empty tensors (a 0 anywhere in the shape, e.g. ``[64, 0]``) hold
  no bytes and are valid.
- The shape can be materialised: at most ``MAX_NDIM`` dimensions and, for an
  empty tensor, its non-zero dimensions times the item size at most
  ``2**63 - 1`` bytes (NumPy's limits). The reference accepts such shapes (say
  ``[0, 2**63]`` or 10,000 dimensions); Ignis refuses them here, where the
  error can say what is wrong, rather than fail later inside NumPy.
- Sorted by offset, the tensors tile the data section: no gap, no overlap, and
  the last one ends at the end of the file.
- Any violation raises ``SafetensorsError`` naming the file, the tensor (where
  there is one) and the problem, before anything is allocated.

Where Ignis is deliberately stricter than the reference ``safetensors``
(``tests/test_io_fuzz.py`` lists each difference): duplicate keys (the
reference keeps the last tensor or metadata value of a repeated name, so two
readers may disagree on a file's contents), shapes that cannot be materialised
(above), and dtypes Ignis has no type for (sub-byte ``F4`` / ``F6_*``, and
``F8_E8M0`` / ``F8_E4M3FNUZ`` / ``F8_E5M2FNUZ`` unless ``dtype_map`` maps them).

Rules for writing (byte-identical to the reference ``safetensors`` library):
- Tensors are sorted by dtype, descending in the reference's ``Dtype`` enum
  order (larger alignment first), then by name; offsets follow that order.
- Compact JSON: ``__metadata__`` first when given, then each tensor as
  ``{"dtype":..,"shape":[..],"data_offsets":[b,e]}``; non-ASCII kept as UTF-8.
- The header is padded with spaces to a multiple of 8 bytes.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from .. import dtypes as _dt
from ..dtypes import DType
from .._types import MAX_EXTENT
from .._types import MAX_NDIM as _MAX_NDIM
from ..errors import SafetensorsError

__all__ = ["SafetensorsError", "TensorEntry", "Header", "MAX_HEADER_SIZE", "MAX_DEPTH", "MAX_NDIM",
           "METADATA_KEY", "read_header", "parse_header", "build_header", "resolve_dtype_map", "sort_key"]

MAX_HEADER_SIZE = 100_000_000
METADATA_KEY = "__metadata__"
MAX_DEPTH = 127                     # serde_json's recursion limit, as the reference applies it
MAX_NDIM = _MAX_NDIM                # NumPy's NPY_MAXDIMS, the arrays' own limit (ignis._types)
_MAX_BYTES = MAX_EXTENT             # NumPy's limit on any array's extent in bytes, the arrays' too
_U64 = (1 << 64) - 1
_I64_MIN = -(1 << 63)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_INT_HAZARD = re.compile(r"-0(?![0-9.eE])|[0-9]{19}")

# The reference's Dtype enum, in declaration (ascending) order; files are
# written sorted by this rank, descending.
_REFERENCE_ORDER = ("BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
                    "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
                    "F64", "I64", "U64")
_RANK = {code: i for i, code in enumerate(_REFERENCE_ORDER)}
# Byte-sized codes of the reference that Ignis has no dtype for (loadable with dtype_map).
_FOREIGN_ITEMSIZE = {"F8_E8M0": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1}
_SUB_BYTE = {"F4", "F6_E2M3", "F6_E3M2"}


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor of a header: ``begin`` / ``end`` are offsets into the data section."""

    name: str
    code: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        """The tensor's size in bytes (``end - begin``)."""
        return self.end - self.begin


@dataclass(frozen=True, slots=True)
class Header:
    """A validated header: entries in file (offset) order."""

    file: str
    entries: tuple[TensorEntry, ...]
    metadata: dict[str, str] | None
    data_start: int   # absolute file offset of the data section
    data_size: int

    def index(self) -> dict[str, TensorEntry]:
        """The entries by tensor name."""
        return {e.name: e for e in self.entries}


def sort_key(code: str, name: str) -> tuple[int, str]:
    """The reference's serialization order: dtype rank descending, then name."""
    return (-_RANK[code], name)


def resolve_dtype_map(dtype_map: Mapping[Any, Any] | None) -> dict[str, DType]:
    """Check a ``dtype_map`` ({safetensors code or dtype: dtype}) and return it keyed by code.

    A mapping reinterprets the bytes (no conversion), so item sizes must match.
    Raises:
        ValueError: an unknown dtype, a sub-byte code, or an item-size mismatch.
    """
    out: dict[str, DType] = {}
    for key, value in (dtype_map or {}).items():
        code = key.safetensors if isinstance(key, DType) else key
        if not isinstance(code, str) or not code:
            raise ValueError(f"dtype_map keys are safetensors dtype codes (e.g. 'F32'), got {key!r}")
        if code not in _RANK:
            try:
                code = _dt.dtype(code).safetensors  # an Ignis dtype name ("float32")
            except ValueError:
                pass  # a code Ignis does not know: the target's item size is taken as its size
        target = _dt.dtype(value)
        if code in _SUB_BYTE:
            raise ValueError(f"dtype_map: {code} packs elements below one byte; Ignis cannot load it")
        size = _known_itemsize(code)
        if size is not None and size != target.itemsize:
            raise ValueError(f"dtype_map maps {code} ({size}-byte elements) to {target.name} "
                             f"({target.itemsize}-byte elements); a mapping reinterprets bytes and cannot "
                             "convert between sizes")
        out[code] = target
    return out


def _known_itemsize(code: str) -> int | None:
    try:
        return _dt.from_safetensors(code).itemsize
    except ValueError:
        return _FOREIGN_ITEMSIZE.get(code)


# -- reading -------------------------------------------------------------------
def _pread_exact(fd: int, n: int, offset: int) -> bytes:
    parts = []
    while n > 0:
        b = os.pread(fd, n, offset)
        if not b:
            break
        parts.append(b)
        n -= len(b)
        offset += len(b)
    return b"".join(parts)


def read_header(fd: int, file: str, dtype_map: Mapping[str, DType] | None = None) -> Header:
    """Read and validate the header of the open regular file ``fd``."""
    size = os.fstat(fd).st_size
    if size < 8:
        raise SafetensorsError(file, f"truncated: the file is {size} bytes, too short for the 8-byte "
                                     "header length")
    (n,) = struct.unpack("<Q", _pread_exact(fd, 8, 0))
    if n > MAX_HEADER_SIZE:
        raise SafetensorsError(file, f"header length {n} exceeds the {MAX_HEADER_SIZE}-byte limit")
    if 8 + n > size:
        raise SafetensorsError(file, f"truncated: header length {n} runs past the end of the "
                                     f"{size}-byte file")
    raw = _pread_exact(fd, n, 8)
    if len(raw) != n:
        raise SafetensorsError(file, "truncated: the file shrank while its header was read")
    return parse_header(raw, file, size, dtype_map)


class _Duplicate(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _Duplicate(k)
            seen.add(k)
    return d


def _is_count(x: Any) -> bool:
    return type(x) is int and x >= 0


# Numbers as serde_json (the reference's parser) reads them: integers that fit a u64 or an
# i64 are integers, other numbers are doubles, and a double out of range is an error.
def _parse_int(text: str) -> int | float:
    if text == "-0":
        return -0.0
    try:
        v = int(text)
    except ValueError:  # more digits than Python converts (4300): far outside any double
        raise ValueError(f"number {text[:20]}... is out of range") from None
    if _I64_MIN <= v <= _U64:
        return v
    return _parse_float(text)


def _parse_float(text: str) -> float:
    v = float(text)
    if v in (float("inf"), float("-inf")):
        raise ValueError(f"number {_clip(text)} is out of range")
    return v


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _unicode(s: str) -> bool:
    """False for a string holding a lone UTF-16 surrogate (from a ``\\ud800`` escape)."""
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_value(value: Any, depth: int) -> str | None:
    """Why a JSON value (at nesting ``depth``, 1 for the header's object) fails the
    reference's parser: nested deeper than ``MAX_DEPTH``, or a string with a lone
    surrogate. None when it passes."""
    stack = [(value, depth)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, str):
            if not _unicode(v):
                return f"a string holds a lone UTF-16 surrogate ({_clip(v)}), which is not Unicode"
        elif isinstance(v, (dict, list)):
            if d > MAX_DEPTH:
                return f"the JSON nests deeper than {MAX_DEPTH} levels"
            if isinstance(v, dict):
                for k, item in v.items():
                    stack.append((k, d))
                    stack.append((item, d + 1))
            else:
                stack.extend((item, d + 1) for item in v)
    return None


def parse_header(raw: bytes, file: str, file_size: int,
                 dtype_map: Mapping[str, DType] | None = None) -> Header:
    """Validate header bytes ``raw`` of a ``file_size``-byte file; return its entries in offset order."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SafetensorsError(file, f"header is not valid UTF-8 (byte {e.start})") from None
    try:
        # Only a "-0" or a long run of digits needs the integer hook (a Python call per integer).
        parse_int = _parse_int if _INT_HAZARD.search(text) else None
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_int=parse_int, parse_float=_parse_float,
                         parse_constant=_reject_constant)
    except _Duplicate as e:
        raise SafetensorsError(file, f"duplicate key {e.args[0]!r} in the header JSON",
                               tensor=e.args[0]) from None
    except RecursionError:
        raise SafetensorsError(file, "header JSON nests too deeply") from None
    except ValueError as e:
        raise SafetensorsError(file, f"header is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise SafetensorsError(file, f"header JSON is a {type(obj).__name__}, not an object")
    # A lone surrogate can only come from an escape: look for strings holding one only then.
    surrogates = _SURROGATE_ESCAPE.search(text) is not None
    data_start = 8 + len(raw)
    data_size = file_size - data_start
    dmap = dtype_map or {}
    metadata = None
    entries: list[TensorEntry] = []
    for name, info in obj.items():
        if name == METADATA_KEY:
            if info is None:
                continue
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise SafetensorsError(file, "__metadata__ must map strings to strings")
            if surrogates:
                why = _check_value(info, 2)
                if why is not None:
                    raise SafetensorsError(file, f"__metadata__: {why}")
            metadata = info
            continue
        if surrogates and not _unicode(name):
            raise SafetensorsError(file, "the tensor name holds a lone UTF-16 surrogate, which is not Unicode "
                                         "(the reference refuses it and no file could be saved with it)",
                                   tensor=name)
        entries.append(_entry(file, name, info, data_size, dmap))
    entries.sort(key=lambda e: (e.begin, e.end))
    expect = 0
    prev: TensorEntry | None = None
    for e in entries:
        if e.begin < expect:
            raise SafetensorsError(file, f"data_offsets [{e.begin}, {e.end}] overlap tensor {prev.name!r} "
                                         f"[{prev.begin}, {prev.end}]", tensor=e.name)
        if e.begin > expect:
            after = f"the previous tensor {prev.name!r} ends at {expect}" if prev else \
                "the data section begins at 0"
            raise SafetensorsError(file, f"gap: data_offsets begin at {e.begin}, but {after}", tensor=e.name)
        expect = e.end
        prev = e
    if expect != data_size:
        raise SafetensorsError(file, f"the tensors cover {expect} bytes of the {data_size}-byte data "
                                     f"section; {data_size - expect} trailing bytes belong to no tensor",
                               tensor=prev.name if prev else None)
    return Header(file, tuple(entries), metadata, data_start, data_size)


_FIELDS = ("dtype", "shape", "data_offsets")


def _entry(file: str, name: str, info: Any, data_size: int, dmap: Mapping[str, DType]) -> TensorEntry:
    def bad(problem: str) -> SafetensorsError:
        return SafetensorsError(file, problem, tensor=name)

    if not isinstance(info, dict):
        raise bad(f"entry is a {type(info).__name__}, not an object with dtype, shape and data_offsets")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in info]
    if missing:
        raise bad(f"entry lacks {', '.join(missing)}")
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if len(info) > 3:  # fields nobody reads must still parse as the reference parses them
        for key, value in info.items():
            if key not in _FIELDS:
                why = _check_value(key, 2) or _check_value(value, 3)
                if why is not None:
                    raise bad(f"field {_clip(key)}: {why}")
    if not isinstance(code, str):
        raise bad(f"dtype {code!r} is not a string")
    dt = dmap.get(code)
    if dt is None:
        try:
            dt = _dt.from_safetensors(code)
        except ValueError:
            hint = " (pass dtype_map to load it as an Ignis dtype of the same size)" \
                if code in _FOREIGN_ITEMSIZE else ""
            raise bad(f"unknown dtype {code[:40]!r}{hint}") from None
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise bad(f"shape {_clip(shape)} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise bad(f"data_offsets {_clip(offsets)} is not a pair of non-negative integers")
    begin, end = offsets
    if end < begin:
        raise bad(f"data_offsets [{begin}, {end}] end before they begin")
    if end > data_size:
        raise bad(f"truncated: data_offsets [{begin}, {end}] run past the end of the {data_size}-byte "
                  "data section")
    if len(shape) > MAX_NDIM:
        raise bad(f"shape has {len(shape)} dimensions; arrays have at most {MAX_NDIM}")
    if 0 in shape:  # an empty tensor: no bytes, but NumPy must still be able to describe it
        numel = 0
        extent = dt.itemsize
        for d in shape:
            extent *= d or 1
            if extent > _MAX_BYTES:
                raise bad(f"empty shape {_clip(shape)} of {code} cannot be materialised: its non-zero "
                          f"dimensions span more than 2**63 - 1 bytes")
    else:
        numel = 1
        for d in shape:
            numel *= d
            if numel > data_size:  # stop early: hostile shapes can make huge products
                break
    if numel * dt.itemsize != end - begin:
        raise bad(f"shape {_clip(shape)} of {code} needs "
                  f"{'more than ' + str(data_size) if numel > data_size else numel * dt.itemsize} bytes, "
                  f"but data_offsets [{begin}, {end}] hold {end - begin}")
    return TensorEntry(name, code, dt, tuple(shape), begin, end)


def _clip(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 80 else r[:77] + "..."


# -- writing -------------------------------------------------------------------
def _json_str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def build_header(tensors: Iterable[tuple[str, str, tuple[int, ...], int]],
                 metadata: Mapping[str, str] | None) -> tuple[bytes, list[tuple[str, int, int]]]:
    """Header bytes (padded) for ``(name, code, shape, nbytes)`` tuples, and each
    tensor's ``(name, begin, end)`` in file order (the reference's order).

    Raises:
        ValueError: a name or metadata string that is not valid Unicode, or a
            header over ``MAX_HEADER_SIZE``.
    """
    ordered = sorted(tensors, key=lambda t: sort_key(t[1], t[0]))
    parts = []
    if metadata is not None:
        parts.append(f'"{METADATA_KEY}":{{'
                     + ",".join(f"{_json_str(k)}:{_json_str(v)}" for k, v in metadata.items()) + "}")
    layout = []
    offset = 0
    for name, code, shape, nbytes in ordered:
        end = offset + nbytes
        parts.append(f'{_json_str(name)}:{{"dtype":"{code}","shape":[{",".join(map(str, shape))}],'
                     f'"data_offsets":[{offset},{end}]}}')
        layout.append((name, offset, end))
        offset = end
    try:
        raw = ("{" + ",".join(parts) + "}").encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"a tensor name or metadata string is not valid Unicode ({e.reason})") from None
    raw += b" " * (-len(raw) % 8)
    if len(raw) > MAX_HEADER_SIZE:
        raise ValueError(f"the header would be {len(raw)} bytes, over the {MAX_HEADER_SIZE}-byte limit "
                         "readers enforce; save fewer tensors per file")
    return struct.pack("<Q", len(raw)) + raw, layout
