"""ig.io: safetensors straight to and from device memory.

Round trips for every dtype (empty and 0-d tensors, metadata); interchange
with the reference ``safetensors`` package both ways, bit-exact, and
byte-identical files; empty tensors; hostile headers (explicit cases and a
hypothesis fuzz; ``test_io_fuzz`` compares with the reference case by case)
that raise only ``SafetensorsError`` and leak nothing; files cut short or
rewritten between open and load; errors in the middle of the pipeline, failed
destroys, and ring buffers held while a queued copy may still use them;
ownership ("io" during, "compute" after); a file larger than the chunk size
and the pinned ring; the ``ignis load`` command.
"""

from __future__ import annotations

from contextlib import closing
import argparse
import gc
import io as _stdio
import json
import os
import pickle
import struct
import threading
import warnings
from collections import Counter

import numpy as np
import pytest

import ignis as ig
from ignis import dtypes as D
from ignis.array import hostcopy
from ignis.cli.io import add_parser, run as cli_run
from ignis.io import PipelineOptions, SafetensorsError
from ignis.io import pipeline as io_pipeline

from helpers import current_resource

SMALL = PipelineOptions(chunk_bytes=1 << 20, buffers=3, workers=2, streams=2)


@pytest.fixture
def st():
    return pytest.importorskip("safetensors", minversion="0.7")  # 0.7 added C64


@pytest.fixture
def stnp():
    pytest.importorskip("safetensors", minversion="0.7")
    import safetensors.numpy as stnp
    return stnp


@pytest.fixture(autouse=True)
def fresh_resource():
    """Each test allocates from a resource of its own, so that a leak check counts only
    that test's allocations (garbage other tests left behind is freed at random times)."""
    from ignis.memory import current
    mr = ig.PoolResource(current.default_upstream(ig.Device(0)))
    try:
        with current_resource(mr):
            yield mr
    finally:
        gc.collect()
        mr.trim()


def outstanding() -> tuple[int, int]:
    """(device bytes the current resource has handed out, pinned bytes handed out)."""
    gc.collect()
    return ig.get_current_resource(0).bytes_outstanding, hostcopy.pinned_pool().bytes_outstanding


def rand(dt: ig.DType, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random bytes viewed as ``dt`` (every bit pattern, NaNs included)."""
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)
    return raw.view(dt.numpy).reshape(shape)


def host_bytes(a: ig.NvArray) -> bytes:
    return a.to_numpy().tobytes()


def assert_same(arrays: dict, expected: dict) -> None:
    assert list(sorted(arrays)) == list(sorted(expected))
    for name, want in expected.items():
        got = arrays[name]
        assert got.shape == want.shape, name
        assert got.dtype.numpy == want.dtype, name
        assert host_bytes(got) == want.tobytes(), name


def every_dtype_tensors() -> dict[str, np.ndarray]:
    out = {}
    for i, name in enumerate(ig.dtypes.names()):
        dt = ig.dtype(name)
        out[f"{name}.weight"] = rand(dt, (5, 7), seed=i)
        out[f"{name}.empty"] = rand(dt, (0, 3), seed=i)
        out[f"{name}.scalar"] = rand(dt, (), seed=i)
    return out


def write_file(path, header, data: bytes = b"", length: int | None = None) -> str:
    """A safetensors-like file: ``header`` is an object (dumped) or raw bytes."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(raw) if length is None else length
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", n) + raw + data)
    return str(path)


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


# -- round trips -------------------------------------------------------------------
def test_roundtrip_every_dtype_empty_and_scalar(tmp_path):
    before = outstanding()
    tensors = every_dtype_tensors()
    src = {k: ig.from_numpy(v) for k, v in tensors.items()}
    path = tmp_path / "all.safetensors"
    ig.io.save_safetensors(src, path, metadata={"format": "ignis", "note": "ünïcode"})
    for separate in (False, True):
        out = ig.io.load_safetensors(path, separate=separate)
        assert_same(out, tensors)
        assert all(a.owner == "compute" for a in out.values())
        assert all(a.owns_memory == (separate and a.nbytes > 0) for a in out.values())
        del out
    with ig.io.safe_open(path) as f:
        assert f.metadata() == {"format": "ignis", "note": "ünïcode"}
        assert f.keys() == sorted(tensors)
    del src
    assert outstanding() == before


def test_views_are_aligned_and_keep_the_allocation_alive(tmp_path):
    before = outstanding()
    tensors = every_dtype_tensors()
    path = tmp_path / "v.safetensors"
    ig.io.save_safetensors({k: ig.from_numpy(v) for k, v in tensors.items()}, path)
    out = ig.io.load_safetensors(path)
    assert all(a.is_view and a.device_ptr % a.dtype.itemsize == 0 for a in out.values())
    keep = out.pop("float64.weight")
    del out
    gc.collect()
    assert host_bytes(keep) == tensors["float64.weight"].tobytes()
    del keep
    assert outstanding() == before


def test_save_through_a_symlink_writes_the_file_it_names(tmp_path):
    """The finished file is renamed over the path: through a link, the file the link names
    is the one replaced, and the link stays a link (a dangling one: its file is created)."""
    a = ig.from_numpy(np.arange(8, dtype=np.float32))
    target = tmp_path / "data" / "model.safetensors"
    target.parent.mkdir()
    target.write_bytes(b"old contents")
    link = tmp_path / "model.safetensors"
    link.symlink_to(target)
    ig.io.save_safetensors({"a": a}, link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    np.testing.assert_array_equal(ig.io.load_safetensors(target)["a"].to_numpy(), np.arange(8))
    dangling = tmp_path / "later.safetensors"
    dangling.symlink_to(tmp_path / "data" / "later.safetensors")
    ig.io.save_safetensors({"a": a}, dangling)
    assert dangling.is_symlink() and (tmp_path / "data" / "later.safetensors").is_file()
    assert sorted(os.listdir(tmp_path / "data")) == ["later.safetensors", "model.safetensors"]  # no temp left


@pytest.mark.parametrize("kind", ["fifo", "link to a character device", "directory"])
def test_save_refuses_a_path_that_is_no_regular_file(tmp_path, kind):
    """Renaming the finished file over a special file would replace it: refused before anything
    is written, the special file left as it was."""
    import stat
    a = ig.from_numpy(np.arange(8, dtype=np.float32))
    path = tmp_path / "out.safetensors"
    if kind == "fifo":
        os.mkfifo(path)
        check = stat.S_ISFIFO
    elif kind == "directory":
        path.mkdir()
        check = stat.S_ISDIR
    else:
        if not os.path.exists("/dev/null"):
            pytest.skip("no /dev/null")
        path.symlink_to("/dev/null")
        check = stat.S_ISCHR
    with pytest.raises(OSError, match="a save writes a whole file"):
        ig.io.save_safetensors({"a": a}, path)
    assert check(os.stat(path).st_mode)
    assert kind != "link to a character device" or path.is_symlink()
    assert os.listdir(tmp_path) == ["out.safetensors"]  # no temporary file left behind
    assert a.owner == "compute"


def test_empty_file_and_no_tensors(tmp_path, stnp):
    path = tmp_path / "empty.safetensors"
    ig.io.save_safetensors({}, path)
    assert path.read_bytes() == stnp.save({})
    assert ig.io.load_safetensors(path) == {}
    ig.io.save_safetensors({}, path, metadata={"a": "b"})
    assert path.read_bytes() == stnp.save({}, metadata={"a": "b"})
    assert ig.io.safe_open(path).metadata() == {"a": "b"}



@pytest.mark.parametrize("where", ["first", "middle", "last", "alone"])
def test_empty_tensors_are_valid_both_ways(tmp_path, stnp, where):
    """Issue #14 item 11: a [64, 0] tensor (which save_safetensors writes and the
    reference reads) loads, wherever it falls in the file, with either layout."""
    empty = np.zeros((64, 0), np.float32)
    tensors = {"a.w": rand(D.float64, (3, 2), 1), "z.b": rand(D.int8, (5,), 2)}
    tensors = {"alone": {}, "first": {"0.e": empty, **tensors}, "middle": {"b.e": empty, **tensors},
               "last": {**tensors, "zz.e": empty}}[where] or {"e": empty}
    mine, theirs = tmp_path / "mine.safetensors", tmp_path / "theirs.safetensors"
    ig.io.save_safetensors({k: ig.from_numpy(v) for k, v in tensors.items()}, mine)
    theirs.write_bytes(stnp.save(tensors))
    assert mine.read_bytes() == theirs.read_bytes()
    assert {k: v.shape for k, v in stnp.load_file(str(mine)).items()} == {k: v.shape for k, v in tensors.items()}
    before = outstanding()
    for separate in (False, True):
        out = ig.io.load_safetensors(mine, separate=separate)
        assert_same(out, tensors)
        del out
    assert outstanding() == before


# -- the reference library, both ways -----------------------------------------------------
def test_files_written_by_safetensors_load_bit_exactly(tmp_path, stnp):
    tensors = every_dtype_tensors()
    path = tmp_path / "ref.safetensors"
    stnp.save_file(tensors, str(path), metadata={"framework": "np"})
    out = ig.io.load_safetensors(path)
    assert_same(out, tensors)
    assert list(out) == list(ig.io.safe_open(path)._index)  # file order
    assert ig.io.safe_open(path).metadata() == {"framework": "np"}


@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt"}])
def test_files_written_by_ignis_are_byte_identical_to_safetensors(tmp_path, stnp, metadata):
    tensors = every_dtype_tensors()
    tensors["naïve \"quoted\"\n\x01name"] = rand(D.float32, (3,), seed=99)
    tensors["zz"] = rand(D.bfloat16, (4, 4), seed=98)
    path = tmp_path / "ig.safetensors"
    ig.io.save_safetensors({k: ig.from_numpy(v) for k, v in tensors.items()}, path, metadata=metadata)
    assert path.read_bytes() == stnp.save(tensors, metadata=metadata)


def test_files_written_by_ignis_load_bit_exactly_in_safetensors(tmp_path, st, stnp):
    tensors = every_dtype_tensors()
    meta = {"a": "1", "b": "two", "ключ": "значение"}
    # The NumPy API reads every dtype NumPy has (not bfloat16 / float8): load_file.
    numpy_api = {k: v for k, v in tensors.items()
                 if v.dtype not in (D.bfloat16.numpy, D.float8_e4m3fn.numpy, D.float8_e5m2.numpy)}
    path = tmp_path / "np.safetensors"
    ig.io.save_safetensors({k: ig.from_numpy(v) for k, v in numpy_api.items()}, path, metadata=meta)
    loaded = stnp.load_file(str(path))
    assert loaded.keys() == numpy_api.keys()
    for k, v in numpy_api.items():
        assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape and loaded[k].tobytes() == v.tobytes()
    with st.safe_open(str(path), framework="np") as f:
        assert f.metadata() == meta
    # Every dtype, through the reference's raw deserializer.
    path = tmp_path / "all.safetensors"
    ig.io.save_safetensors({k: ig.from_numpy(v) for k, v in tensors.items()}, path, metadata=meta)
    views = dict(st.deserialize(path.read_bytes()))
    assert views.keys() == tensors.keys()
    for k, v in tensors.items():
        assert views[k]["dtype"].upper() in (ig.dtype(v.dtype).safetensors, ig.dtype(v.dtype).name.upper())
        assert list(views[k]["shape"]) == list(v.shape)
        assert bytes(views[k]["data"]) == v.tobytes()


# -- a file larger than the chunk size and the ring ------------------------------------------
def test_large_file_through_a_small_ring(tmp_path, stnp):
    before = outstanding()
    tensors = {
        "a.f32": rand(D.float32, (2_500_001, 2), seed=1),     # ~20 MB, not a whole number of chunks
        "b.bf16": rand(D.bfloat16, (1_000, 4_099), seed=2),   # ~8 MB
        "c.u8": rand(D.uint8, (6_000_017,), seed=3),          # ~6 MB, odd size
        "d.i64": rand(D.int64, (700_001,), seed=4),           # ~5.6 MB
        "e.small": rand(D.float16, (3,), seed=5),
    }
    ref = tmp_path / "ref.safetensors"
    stnp.save_file(tensors, str(ref))
    assert ref.stat().st_size > 39_000_000
    total = sum(v.nbytes for v in tensors.values())
    for reader in ("mmap", "pread"):
        seen = []
        opts = PipelineOptions(chunk_bytes=1 << 20, buffers=3, workers=2, streams=2, reader=reader)
        out = ig.io.load_safetensors(ref, options=opts, progress=lambda d, t: seen.append((d, t)))
        assert_same(out, tensors)
        assert seen[0] == (0, total) and seen[-1] == (total, total) and len(seen) > 30
        assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
    mine = tmp_path / "ig.safetensors"
    saved = []
    for writer in ("pwrite", "mmap"):
        opts = PipelineOptions(chunk_bytes=1 << 20, buffers=3, workers=2, streams=2, writer=writer)
        ig.io.save_safetensors(out, mine, options=opts, progress=lambda d, t: saved.append((d, t)))
        assert mine.read_bytes() == ref.read_bytes(), writer
    assert saved[-1][0] == saved[-1][1] == total
    again = ig.io.load_safetensors(mine, options=SMALL, separate=True, names=["c.u8", "a.f32"])
    assert list(again) == ["a.f32", "c.u8"]
    assert host_bytes(again["c.u8"]) == tensors["c.u8"].tobytes()
    assert host_bytes(again["a.f32"]) == tensors["a.f32"].tobytes()
    del out, again
    assert outstanding() == before


def test_plan_chunks_merges_and_splits():
    runs = [(100, 1000, 10), (110, 1010, 5), (200, 2000, 30)]
    assert io_pipeline.plan_chunks(runs, 16, gap_bytes=0) == [
        (100, 15, [(0, 1000, 15)]), (200, 16, [(0, 2000, 16)]), (216, 14, [(0, 2016, 14)])]
    assert io_pipeline.plan_chunks(runs, 1 << 20, gap_bytes=100) == [
        (100, 130, [(0, 1000, 15), (100, 2000, 30)])]


# -- layout, subsets, dtype_map -------------------------------------------------------------
def test_misaligned_file_layout_loads_aligned(tmp_path):
    a = rand(D.uint8, (3,), 1)
    b = rand(D.float32, (5,), 2)
    c = rand(D.float64, (2,), 3)
    d = rand(D.int16, (7,), 4)
    header = {"a": entry("U8", [3], 0, 3), "b": entry("F32", [5], 3, 23), "c": entry("F64", [2], 23, 39),
              "d": entry("I16", [7], 39, 53)}
    path = write_file(tmp_path / "mis.safetensors", header, a.tobytes() + b.tobytes() + c.tobytes() + d.tobytes())
    with pytest.raises(SafetensorsError, match="no tensor of this name") as e:
        ig.io.load_safetensors(path, names=["b", "nope"])
    assert e.value.tensor == "nope"
    del e
    expected = {"a": a, "b": b, "c": c, "d": d}
    out = ig.io.load_safetensors(path)
    assert_same(out, expected)
    assert all(x.device_ptr % x.dtype.itemsize == 0 for x in out.values())
    sub = ig.io.load_safetensors(path, names=["d", "b"])
    assert list(sub) == ["b", "d"]
    assert_same(sub, {"b": b, "d": d})


def test_dtype_map_reinterprets_bytes(tmp_path):
    f = rand(D.float32, (4, 4), 7)
    path = write_file(tmp_path / "m.safetensors", {"w": entry("F32", [4, 4], 0, 64)}, f.tobytes())
    out = ig.io.load_safetensors(path, dtype_map={"F32": "int32"})
    assert out["w"].dtype is D.int32 and host_bytes(out["w"]) == f.tobytes()
    with pytest.raises(ValueError, match="cannot convert between sizes"):
        ig.io.load_safetensors(path, dtype_map={"F32": "float16"})
    e8 = rand(D.uint8, (6,), 8)
    path = write_file(tmp_path / "e8.safetensors", {"s": entry("F8_E8M0", [6], 0, 6)}, e8.tobytes())
    with pytest.raises(SafetensorsError, match="unknown dtype 'F8_E8M0'.*dtype_map"):
        ig.io.load_safetensors(path)
    out = ig.io.load_safetensors(path, dtype_map={"F8_E8M0": D.uint8})
    assert out["s"].dtype is D.uint8 and host_bytes(out["s"]) == e8.tobytes()


def test_safe_open_is_lazy_and_closes(tmp_path):
    tensors = {"b": rand(D.float32, (3, 3), 1), "a": rand(D.int8, (9,), 2)}
    path = tmp_path / "s.safetensors"
    ig.io.save_safetensors({k: ig.from_numpy(v) for k, v in tensors.items()}, path)
    with ig.io.safe_open(path, device=0) as f:
        assert f.keys() == ["a", "b"] and len(f) == 2 and "a" in f and "zz" not in f
        assert f.metadata() is None
        assert f.info("b").shape == (3, 3) and f.info("b").code == "F32"
        b = f.get("b")
        assert b.owns_memory and b.owner == "compute" and host_bytes(b) == tensors["b"].tobytes()
        assert host_bytes(f.get_tensor("a")) == tensors["a"].tobytes()
        with pytest.raises(SafetensorsError, match="no tensor"):
            f.get("zz")
    assert f.is_closed
    with pytest.raises(ig.ClosedError):
        f.get("a")


def test_load_on_a_stream(tmp_path):
    dev = ig.Device(0)
    path = tmp_path / "s.safetensors"
    x = rand(D.float32, (1000,), 3)
    ig.io.save_safetensors({"x": ig.from_numpy(x)}, path)
    with closing(dev.create_stream()) as s:
        out = ig.io.load_safetensors(path, stream=s, options=SMALL)
        assert out["x"].stream is s
        assert out["x"].to_numpy().tobytes() == x.tobytes()
        with pytest.raises(TypeError):
            ig.io.load_safetensors(path, stream="nope")
        del out


# -- hostile files ----------------------------------------------------------------------------
F32x2 = entry("F32", [2], 0, 8)
HOSTILE = {
    "short file": (b"\x01\x02\x03", None, "too short for the 8-byte header length", None),
    "header over the limit": (struct.pack("<Q", 100_000_001) + b"{}", None, "exceeds the 100000000-byte limit",
                              None),
    "header past eof": (struct.pack("<Q", 1000) + b"{}", None, "runs past the end", None),
    "not utf-8": (b'{"\xff": 1}', b"", "not valid UTF-8", None),
    "bad json": (b'{"a": ', b"", "not valid JSON", None),
    "not an object": (b"[1, 2]", b"", "not an object", None),
    "deep nesting": (b"[" * 100_000, b"", "", None),
    "duplicate tensor": (b'{"a":' + json.dumps(F32x2).encode() + b',"a":' + json.dumps(F32x2).encode() + b"}",
                         bytes(8), "duplicate key 'a'", "a"),
    "duplicate field": (b'{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}', bytes(8),
                        "duplicate key 'dtype'", "dtype"),
    "entry not an object": ({"a": [1, 2]}, b"", "not an object", "a"),
    "missing field": ({"a": {"dtype": "F32", "shape": [2]}}, bytes(8), "lacks data_offsets", "a"),
    "unknown dtype": ({"a": entry("F33", [2], 0, 8)}, bytes(8), "unknown dtype 'F33'", "a"),
    "dtype not a string": ({"a": entry(7, [2], 0, 8)}, bytes(8), "not a string", "a"),
    "negative dim": ({"a": entry("F32", [-2], 0, 8)}, bytes(8), "not a list of non-negative", "a"),
    "bool dim": ({"a": entry("F32", [True, 2], 0, 8)}, bytes(8), "not a list of non-negative", "a"),
    "float dim": ({"a": entry("F32", [2.0], 0, 8)}, bytes(8), "not a list of non-negative", "a"),
    "offsets not a pair": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4, 8]}}, bytes(8),
                           "not a pair", "a"),
    "offsets reversed": ({"a": entry("F32", [0], 8, 0)}, bytes(8), "end before they begin", "a"),
    "offsets past eof": ({"a": entry("F32", [4], 0, 16)}, bytes(8), "run past the end", "a"),
    "truncated data": ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 8, 16)}, bytes(12),
                       "run past the end", "b"),
    "overlap": ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, bytes(12), "overlap", "b"),
    "gap": ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 12, 20)}, bytes(20), "gap", "b"),
    "gap at start": ({"a": entry("F32", [2], 4, 12)}, bytes(12), "gap", "a"),
    "trailing bytes": ({"a": entry("F32", [2], 0, 8)}, bytes(12), "4 trailing bytes", "a"),
    "size mismatch": ({"a": entry("F32", [3], 0, 8)}, bytes(8), "needs 12 bytes", "a"),
    "huge shape": ({"a": entry("F32", [2 ** 62, 2 ** 62, 2 ** 62], 0, 8)}, bytes(8), "needs more than", "a"),
    "metadata not strings": ({"__metadata__": {"a": 1}, "x": entry("U8", [1], 0, 1)}, bytes(1),
                             "__metadata__ must map strings", None),
    "metadata a list": ({"__metadata__": ["a"]}, b"", "__metadata__ must map strings", None),
    # Issue #14 item 11: what cannot be materialised, or what the reference's parser refuses.
    "empty shape too big for numpy": ({"a": entry("F32", [0, 2 ** 63], 0, 0)}, b"", "cannot be materialised",
                                      "a"),
    "empty shape spans too much": ({"a": entry("U8", [0, 2 ** 40, 2 ** 40], 0, 0)}, b"",
                                   "cannot be materialised", "a"),
    "dim beyond u64": ({"a": entry("F32", [0, 2 ** 70], 0, 0)}, b"", "not a list of non-negative", "a"),
    "10,000 dimensions": ({"a": entry("F32", [1] * 10_000, 0, 4)}, bytes(4), "10000 dimensions", "a"),
    "minus zero dim": (b'{"a":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}}', b"",
                       "not a list of non-negative", "a"),
    "lone surrogate name": (b'{"\\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', bytes(1),
                            "lone UTF-16 surrogate", "\ud800"),
    "lone surrogate in metadata": (b'{"__metadata__":{"k":"x\\udc00"}}', b"", "lone UTF-16 surrogate", None),
    "lone surrogate in an unread field": (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],'
                                          b'"x":["\\ud83d"]}}', bytes(1), "lone UTF-16 surrogate", "a"),
    "NaN in an unread field": (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":NaN}}', bytes(1),
                               "NaN is not a JSON value", None),
    "number out of range": (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1e400}}', bytes(1),
                            "out of range", None),
    "integer out of range": (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":' + b"9" * 400 + b"}}",
                             bytes(1), "out of range", None),
    "unread field too deep": (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":' + b"[" * 126 +
                              b"]" * 126 + b"}}", bytes(1), "deeper than 127", "a"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_files_raise_safetensors_error(tmp_path, case):
    header, data, problem, tensor = HOSTILE[case]
    path = tmp_path / "bad.safetensors"
    if data is None:
        path.write_bytes(header)
    else:
        write_file(path, header, data)
    before = outstanding()
    with pytest.raises(SafetensorsError) as e:
        ig.io.load_safetensors(path)
    err = e.value
    assert isinstance(err, ValueError) and isinstance(err, ig.IgnisError)
    assert err.file == str(path) and str(path) in str(err)
    assert problem in err.problem
    assert err.tensor == tensor
    if tensor is not None:
        assert repr(tensor) in str(err)
    assert outstanding() == before
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and again.problem == err.problem


def test_not_a_regular_file_never_hangs(tmp_path):
    with pytest.raises(SafetensorsError, match="not a regular file"):
        ig.io.load_safetensors(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = []
    t = threading.Thread(target=lambda: done.append(pytest.raises(SafetensorsError, ig.io.load_safetensors,
                                                                  fifo)), daemon=True)
    t.start()
    t.join(10)
    assert done, "loading a FIFO hung"
    with pytest.raises(FileNotFoundError):
        ig.io.load_safetensors(tmp_path / "missing.safetensors")


def _fuzz_base() -> bytes:
    pytest.importorskip("safetensors", minversion="0.7")
    import safetensors.numpy as stnp
    return stnp.save({"w": rand(D.float32, (3, 4), 1), "b": rand(D.float16, (5,), 2),
                      "i": rand(D.int8, (0, 2), 3), "s": rand(D.float64, (), 4)}, metadata={"k": "v"})


def test_fuzz_hostile_headers(tmp_path):
    hyp = pytest.importorskip("hypothesis")
    from hypothesis import strategies as hs

    base = _fuzz_base()
    (n,) = struct.unpack("<Q", base[:8])
    header = json.loads(base[8:8 + n])
    data = base[8 + n:]
    json_values = hs.recursive(
        hs.none() | hs.booleans() | hs.integers(-2 ** 70, 2 ** 70) | hs.floats(allow_nan=True) |
        hs.sampled_from(["F32", "F16", "I8", "F64", "BF16", "BOOL", "X", ""]) | hs.text(max_size=5),
        lambda inner: hs.lists(inner, max_size=4) | hs.dictionaries(hs.text(max_size=4), inner, max_size=3),
        max_leaves=8)

    def mutate_json(args):
        name, field, value = args
        h = json.loads(json.dumps(header))
        if name not in h:
            h[name] = value
        elif field is None or not isinstance(h[name], dict):
            h[name] = value
        else:
            h[name][field] = value
        return struct.pack("<Q", len(json.dumps(h))) + json.dumps(h).encode() + data

    def shift(args):
        name, db, de, code = args
        h = json.loads(json.dumps(header))
        b, e = h[name]["data_offsets"]
        h[name]["data_offsets"] = [b + db, e + de]
        if code is not None:
            h[name]["dtype"] = code
        raw = json.dumps(h).encode()
        return struct.pack("<Q", len(raw)) + raw + data

    def flip(edits):
        b = bytearray(base)
        for pos, val in edits:
            b[8 + pos % n] = val
        return bytes(b)

    mutations = hs.one_of(
        hs.integers(0, len(base) - 1).map(lambda k: base[:k]),
        hs.integers(0, 2 ** 64 - 1).map(lambda k: struct.pack("<Q", k) + base[8:]),
        hs.lists(hs.tuples(hs.integers(0, n), hs.integers(0x20, 0x7E) | hs.integers(0, 255)),
                 min_size=1, max_size=6).map(flip),
        hs.tuples(hs.sampled_from(["w", "b", "i", "s"]), hs.integers(-12, 12), hs.integers(-12, 12),
                  hs.none() | hs.sampled_from(["U8", "I16", "F32", "F64", "C64", "F8_E8M0"])).map(shift),
        hs.tuples(hs.sampled_from(["w", "b", "i", "s", "__metadata__", "new"]),
                  hs.sampled_from([None, "dtype", "shape", "data_offsets", "k"]), json_values).map(mutate_json),
        hs.binary(max_size=64).map(lambda b: struct.pack("<Q", len(b)) + b + data),
        hs.tuples(hs.integers(0, len(data)), hs.binary(max_size=16)).map(
            lambda t: base[:8 + n] + data[:t[0]] + t[1]),
    )
    path = tmp_path / "fuzz.safetensors"
    before = outstanding()

    @hyp.settings(max_examples=300, deadline=None, database=None,
                  suppress_health_check=list(hyp.HealthCheck))
    @hyp.given(mutations)
    def check(blob):
        path.write_bytes(blob)
        try:
            out = ig.io.load_safetensors(path)
        except SafetensorsError:
            pass
        else:
            assert all(a.to_numpy().nbytes == a.nbytes for a in out.values())
            del out
        assert outstanding() == before

    check()


# -- errors in the middle of the pipeline -------------------------------------------------------
def _big_file(tmp_path) -> tuple[str, dict]:
    tensors = {"x": rand(D.float32, (1_500_000,), 1), "y": rand(D.bfloat16, (900_000,), 2)}
    path = tmp_path / "big.safetensors"
    ig.io.save_safetensors({k: ig.from_numpy(v) for k, v in tensors.items()}, path)
    return str(path), tensors


def test_copy_failure_mid_load_frees_everything(tmp_path, backend):
    path, _ = _big_file(tmp_path)
    before = outstanding()
    backend.inject_fault("memcpy_htod_async", nth=4)
    with pytest.raises(ig.DriverError, match="injected"):
        ig.io.load_safetensors(path, options=SMALL)
    assert outstanding() == before


@pytest.mark.parametrize("failure", ["eio", "shrunk"])
def test_read_failure_mid_load_frees_everything(tmp_path, monkeypatch, failure):
    path, tensors = _big_file(tmp_path)
    before = outstanding()
    real = os.preadv
    calls = []

    def preadv(fd, bufs, offset):
        calls.append(offset)
        if len(calls) == 3:
            if failure == "eio":
                raise OSError(5, "Input/output error")
            return 0
        return real(fd, bufs, offset)

    monkeypatch.setattr(io_pipeline.os, "preadv", preadv)
    expected = OSError if failure == "eio" else SafetensorsError
    with pytest.raises(expected) as e:
        ig.io.load_safetensors(path, options=SMALL, separate=(failure == "shrunk"))
    if failure == "shrunk":
        assert "truncated" in e.value.problem
    monkeypatch.undo()
    assert outstanding() == before
    assert_same(ig.io.load_safetensors(path, options=SMALL), tensors)


def test_file_cut_short_under_the_mmap_reader(tmp_path, monkeypatch):
    path, _ = _big_file(tmp_path)
    if not io_pipeline._populate_ok[0]:
        pytest.skip("the kernel lacks MADV_POPULATE_READ: a file cut short under a mapping is a SIGBUS")
    before = outstanding()
    real = io_pipeline._populate
    calls = []

    def populate(addr, length, file, write):
        calls.append(addr)
        if len(calls) == 3:
            os.truncate(path, 4096)
        return real(addr, length, file, write)

    monkeypatch.setattr(io_pipeline, "_populate", populate)
    with pytest.raises(SafetensorsError, match="truncated"):
        ig.io.load_safetensors(path, options=PipelineOptions(chunk_bytes=1 << 20, buffers=3, workers=1,
                                                             reader="mmap"))
    assert outstanding() == before


_TRUNCATE_SCRIPT = r"""
import json, os, sys
import numpy as np
import ignis as ig
from ignis.io import PipelineOptions, SafetensorsError, pipeline
from ignis.io.format import read_header

path = sys.argv[1]
x = np.arange(1_500_000, dtype=np.float32)   # 6 MB: six 1 MiB chunks through a ring of three
results = []
for reader in ("default", "mmap"):
    opts = None if reader == "default" else PipelineOptions(chunk_bytes=1 << 20, buffers=3, workers=2,
                                                              reader="mmap")
    for cut in ("nothing", "header", "page", "half", "all but one byte"):
        ig.io.save_safetensors({"x": ig.from_numpy(x)}, path)
        full = os.path.getsize(path)
        size = {"nothing": 0, "header": full - x.nbytes, "page": 4096, "half": full // 2,
                "all but one byte": full - 1}[cut]
        with ig.io.safe_open(path, options=opts) as f:
            os.truncate(path, size)
            try:
                out = f.load()
                results.append([reader, cut, "returned", bool((out["x"].to_numpy() == x).all())])
            except SafetensorsError as e:
                results.append([reader, cut, "SafetensorsError", e.problem])
    # The reader's own guard, without the loader's size check: the pipeline alone on a file cut short.
    ig.io.save_safetensors({"x": ig.from_numpy(x)}, path)
    fd = os.open(path, os.O_RDONLY)
    header = read_header(fd, path)
    dst = ig.empty(x.shape, "float32")
    chunks = pipeline.plan_chunks([(header.data_start, dst.device_ptr, x.nbytes)], 1 << 20)
    os.truncate(path, header.data_start + x.nbytes // 2)
    try:
        pipeline.load(fd, chunks, dst.stream, opts or PipelineOptions())
        results.append([reader, "pipeline", "returned", None])
    except EOFError as e:
        results.append([reader, "pipeline", "EOFError", str(e)])
    os.close(fd)
print(json.dumps(results))
"""


def test_file_cut_short_between_open_and_load_is_an_error_never_a_crash(tmp_path):
    """Issue #14 item 5: a file truncated between safe_open and load() is a
    SafetensorsError on the default reader and on the mmap reader, never a crash
    (the mmap reader read past its mapping: a SIGBUS, or other memory returned as
    tensor data). Run in a child process, since the failure being guarded is a signal."""
    import subprocess
    import sys
    assert PipelineOptions().reader == "pread"
    run = subprocess.run([sys.executable, "-c", _TRUNCATE_SCRIPT, str(tmp_path / "t.safetensors")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"the loader crashed (exit {run.returncode}): {run.stderr[-2000:]}"
    results = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(results) == 12
    for reader, cut, outcome, detail in results:
        if cut == "pipeline":
            assert outcome == "EOFError" and "shrank" in detail, (reader, outcome, detail)
        else:
            assert outcome == "SafetensorsError", (reader, cut, outcome, detail)
            assert "the file changed since its header was read" in detail and "size went from" in detail


def test_file_modified_in_place_is_an_error_not_other_data(tmp_path):
    """A file rewritten in place (same size) before or during a load raises: the
    header no longer describes it, so its bytes are not returned as the tensors."""
    import time
    path, tensors = _big_file(tmp_path)
    before = outstanding()

    def rewrite():
        time.sleep(0.05)  # past the file system's timestamp granularity
        with open(path, "r+b") as fh:
            fh.seek(-4, os.SEEK_END)
            fh.write(b"\xff\xff\xff\xff")

    with ig.io.safe_open(path, options=SMALL) as f:
        rewrite()
        with pytest.raises(SafetensorsError, match="changed since its header was read: it was modified"):
            f.load()
    assert outstanding() == before

    path, tensors = _big_file(tmp_path)
    calls = []

    def progress(done, total):  # runs on the loading thread while chunks are in flight
        calls.append(done)
        if len(calls) == 2:
            rewrite()

    with ig.io.safe_open(path, options=SMALL) as f:
        with pytest.raises(SafetensorsError, match="changed while it was read"):
            f.load(progress=progress)
    assert len(calls) >= 2
    assert outstanding() == before
    # Renamed over (the usual way to replace a file): the open file keeps its contents.
    path, tensors = _big_file(tmp_path)
    with ig.io.safe_open(path, options=SMALL) as f:
        other = tmp_path / "other.safetensors"
        ig.io.save_safetensors({"z": ig.zeros((3,))}, other)
        os.replace(other, path)
        assert_same(f.load(), tensors)


def test_progress_callback_error_frees_everything(tmp_path):
    path, _ = _big_file(tmp_path)
    before = outstanding()

    def progress(done, total):
        if done > 2 << 20:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ig.io.load_safetensors(path, options=SMALL, progress=progress)
    assert outstanding() == before


def test_copy_failure_mid_save_leaves_no_file(tmp_path, backend):
    arrays = {"x": ig.from_numpy(rand(D.float32, (1_500_000,), 1))}
    target = tmp_path / "out.safetensors"
    target.write_bytes(b"previous")
    before = outstanding()
    backend.inject_fault("memcpy_dtoh_async", nth=3)
    with pytest.raises(ig.DriverError):
        ig.io.save_safetensors(arrays, target, options=SMALL)
    assert target.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.safetensors"]
    assert arrays["x"].owner == "compute"
    assert outstanding() == before


# -- a host buffer a queued copy uses is never handed out again (issue #14, items 3 and 12) -------
ONE_STREAM = PipelineOptions(chunk_bytes=1 << 20, buffers=3, workers=2, streams=1)


class _Gate:
    """Holds a stream: work queued on it after the gate waits until ``open()``."""

    def __init__(self, stream: ig.Stream) -> None:
        self.event = threading.Event()
        stream.launch_host_func(lambda: self.event.wait(30))

    def open(self) -> None:
        self.event.set()


def _record_pinned(monkeypatch) -> list[int]:
    """Record the pointer of every pinned buffer handed out from now on."""
    pool = hostcopy.pinned_pool()
    real = pool.allocate
    ptrs: list[int] = []

    def allocate(nbytes):
        buf = real(nbytes)
        ptrs.append(buf.ptr)
        return buf

    monkeypatch.setattr(pool, "allocate", allocate)
    return ptrs


def _reclaim_until_free(timeout: float = 10.0) -> None:
    import time
    deadline = time.monotonic() + timeout
    while io_pipeline.held_bytes() and time.monotonic() < deadline:
        io_pipeline.reclaim_held()
        time.sleep(0.01)
    assert io_pipeline.held_bytes() == 0


@pytest.mark.parametrize("direction", ["load", "save"])
def test_failed_drain_holds_ring_buffers_a_queued_copy_still_uses(tmp_path, backend, monkeypatch, direction):
    """A transfer fails with a copy still queued (the stream is held by a gate) and the
    error path cannot drain the stream (its synchronize fails): the ring buffers the
    queued copy reads or writes must not be handed out again until the copy has run."""
    x = rand(D.float32, (655_360,), 1)  # 2.5 MiB: three 1 MiB chunks, three ring buffers, no slot reuse
    path = tmp_path / "g.safetensors"
    ig.io.save_safetensors({"x": ig.from_numpy(x)}, path)
    s = ig.Device(0).create_stream()
    src = ig.from_numpy(x, stream=s) if direction == "save" else None
    s.synchronize()
    before = outstanding()
    ring = _record_pinned(monkeypatch)
    gate = _Gate(s)
    try:
        if direction == "load":
            backend.inject_fault("memcpy_htod_async", nth=2)  # chunk 0's copy is queued behind the gate
        else:
            backend.inject_fault("event_record", nth=1)       # chunk 0's copy is queued, its record fails
        backend.inject_fault("stream_synchronize", nth=1)     # and the error path cannot drain the stream
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(ig.DriverError, match="injected"):
                if direction == "load":
                    ig.io.load_safetensors(path, stream=s, options=ONE_STREAM)
                else:
                    ig.io.save_safetensors({"x": src}, tmp_path / "out.safetensors", stream=s,
                                           options=ONE_STREAM)
        monkeypatch.undo()
        assert len(ring) == 3
        # The copy is still queued: none of its buffers may come out of the pool.
        pool = hostcopy.pinned_pool()
        fresh = [pool.allocate(1 << 20) for _ in range(6)]
        assert not {b.ptr for b in fresh} & set(ring), "a ring buffer was handed out under a queued copy"
        for b in fresh:
            b.release()
        held = [w for w in caught if "held out of the staging pool" in str(w.message)]
        assert len(held) == 1 and held[0].category is RuntimeWarning
        assert "3145728 bytes" in str(held[0].message)
        assert io_pipeline.held_bytes() == 3 << 20
        assert io_pipeline.reclaim_held() == 0  # never waits; the stream is still busy
    finally:
        backend.clear_faults()
        gate.open()
    later = _Gate(s)  # the caller's stream goes on with other work: the held ring need not wait for it
    try:
        _reclaim_until_free()
    finally:
        later.open()
    s.synchronize()
    del src
    assert outstanding() == before
    assert not (tmp_path / "out.safetensors").exists()
    s.close()


@pytest.mark.parametrize("op", ["stream_destroy", "event_destroy"])
@pytest.mark.parametrize("direction", ["load", "save"])
def test_failed_destroy_leaks_nothing(tmp_path, backend, direction, op):
    """A stream or event destroy that fails (at the end of a transfer, or anywhere in it)
    raises, and every pinned and device byte goes back all the same."""
    path, tensors = _big_file(tmp_path)
    src = {k: ig.from_numpy(v) for k, v in tensors.items()} if direction == "save" else None
    before = outstanding()
    failed = 0
    for nth in range(1, 9):
        streams = set(getattr(getattr(backend, "inner", backend), "_streams", ()))  # the emulator's live stream handles
        backend.inject_fault(op, nth=nth)
        try:
            if direction == "load":
                out = ig.io.load_safetensors(path, options=SMALL)
                assert_same(out, tensors)
                del out
            else:
                ig.io.save_safetensors(src, tmp_path / "out.safetensors", options=SMALL)
        except ig.DriverError as e:
            assert "injected" in str(e)
            failed += 1
        finally:
            backend.clear_faults()
            for handle in set(getattr(getattr(backend, "inner", backend), "_streams", ())) - streams:
                backend.stream_destroy(handle)  # the stream whose destroy was made to fail: retire its worker
        assert outstanding() == before, f"{op} failing at call {nth} leaked"
    assert failed >= 1
    assert io_pipeline.held_bytes() == 0



PIPELINE_OPS = ["mem_alloc_async", "mem_free_async", "host_alloc", "memcpy_htod_async", "memcpy_dtoh_async",
                "stream_create", "stream_destroy", "stream_wait_event", "stream_synchronize", "event_create",
                "event_destroy", "event_record", "event_query", "event_synchronize"]


@pytest.mark.parametrize("direction", ["load", "save"])
def test_a_driver_failure_anywhere_leaks_nothing(tmp_path, backend, direction):
    """Every driver call a transfer makes, failing at its 1st, 2nd, 4th or 7th use:
    the transfer raises that error or completes with the right bytes, and the device and
    pinned bytes go back (rings held after a failed drain once their streams are idle)."""
    tensors = {"x": rand(D.float32, (1_000_000,), 1), "y": rand(D.int8, (300_000,), 2)}  # 4.3 MB: 5 chunks
    path = tmp_path / "f.safetensors"
    ig.io.save_safetensors({k: ig.from_numpy(v) for k, v in tensors.items()}, path)
    src = {k: ig.from_numpy(v) for k, v in tensors.items()} if direction == "save" else None
    before = outstanding()
    outcomes = Counter()
    for op in PIPELINE_OPS:
        for nth in (1, 2, 4, 7):
            streams = set(getattr(getattr(backend, "inner", backend), "_streams", ()))
            backend.inject_fault(op, nth=nth)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    if direction == "load":
                        out = ig.io.load_safetensors(path, options=SMALL)
                    else:
                        ig.io.save_safetensors(src, tmp_path / "out.safetensors", options=SMALL)
                outcomes["completed"] += 1
            except ig.DriverError as e:
                assert "injected" in str(e), (op, nth, e)
                outcomes["raised"] += 1
                out = None
            finally:
                backend.clear_faults()
                for handle in set(getattr(getattr(backend, "inner", backend), "_streams", ())) - streams:
                    backend.stream_destroy(handle)
            if direction == "load" and out is not None:
                assert_same(out, tensors)
                del out
            elif direction == "save" and outcomes["completed"] and (tmp_path / "out.safetensors").exists():
                assert_same(ig.io.load_safetensors(tmp_path / "out.safetensors"), tensors)
                os.unlink(tmp_path / "out.safetensors")
            _reclaim_until_free()
            assert outstanding() == before, f"{direction}: {op} failing at call {nth} leaked"
    assert outcomes["raised"] >= 15 and outcomes["completed"] >= 15, outcomes


# -- ownership ----------------------------------------------------------------------------------
def test_load_owns_arrays_for_io_then_releases_to_compute(tmp_path):
    path, _ = _big_file(tmp_path)
    snapshots = []

    def progress(done, total):
        snapshots.append({r["array_id"]: r["owner"] for r in ig.contract.audit(older_than=-1)
                          if r["tag"] == "ignis.io.load"})

    out = ig.io.load_safetensors(path, options=SMALL, progress=progress)
    assert len(snapshots) > 3
    for a in out.values():
        assert all(snap[a.id] == "io" for snap in snapshots)
        assert a.owner == "compute"
        assert a.base.owner == "compute"
    assert all(snap[out["x"].base.id] == "io" for snap in snapshots)


def test_save_owns_arrays_for_io_then_releases_to_compute(tmp_path):
    arrays = {"x": ig.from_numpy(rand(D.float32, (1_000_000,), 1)), "y": ig.zeros((10,), D.int8)}
    arrays["alias"] = arrays["y"]
    owners = []
    ig.io.save_safetensors(arrays, tmp_path / "o.safetensors", options=SMALL,
                           progress=lambda d, t: owners.append({k: a.owner for k, a in arrays.items()}))
    assert len(owners) > 3 and all(set(o.values()) == {"io"} for o in owners)
    assert all(a.owner == "compute" for a in arrays.values())


def test_save_refuses_arrays_held_by_another_layer(tmp_path):
    arrays = {"a": ig.zeros((4,)), "b": ig.zeros((4,)), "c": ig.zeros((4,))}
    ig.contract.acquire(arrays["b"], by="collective")
    try:
        with pytest.raises(ig.MemoryContractViolation, match="'collective'"):
            ig.io.save_safetensors(arrays, tmp_path / "x.safetensors")
        assert [a.owner for a in arrays.values()] == ["compute", "collective", "compute"]
        assert list(tmp_path.iterdir()) == []
    finally:
        ig.contract.release(arrays["b"], by="collective")


def test_save_argument_errors(tmp_path):
    a = ig.zeros((2,))
    with pytest.raises(ValueError, match="reserved"):
        ig.io.save_safetensors({"__metadata__": a}, tmp_path / "x")
    with pytest.raises(TypeError, match="metadata must map str to str"):
        ig.io.save_safetensors({"a": a}, tmp_path / "x", metadata={"k": 1})
    with pytest.raises(TypeError, match="not an NvArray"):
        ig.io.save_safetensors({"a": np.zeros(2)}, tmp_path / "x")
    b = ig.zeros((2,))
    b.free()
    with pytest.raises(ig.UseAfterFreeError):
        ig.io.save_safetensors({"b": b}, tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


# -- the command line ----------------------------------------------------------------------------
def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ignis")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(list(argv))


def test_cli_load_reports_what_it_loaded(tmp_path):
    tensors = {"w": rand(D.bfloat16, (300, 1000), 1), "b": rand(D.float32, (1000,), 2),
               "c": rand(D.bfloat16, (10,), 3)}
    path = tmp_path / "m.safetensors"
    ig.io.save_safetensors({k: ig.from_numpy(v) for k, v in tensors.items()}, path)
    out, err = _stdio.StringIO(), _stdio.StringIO()
    assert cli_run(_parse("load", str(path), "--progress"), out, err) == 0
    text = out.getvalue()
    assert "loaded 3 tensors" in text and "(604020 bytes)" in text and "GB/s" in text
    assert "bfloat16" in text and "float32" in text
    assert "100.0%" in err.getvalue()
    out, err = _stdio.StringIO(), _stdio.StringIO()
    assert cli_run(_parse("load", str(path), "--no-progress"), out, err) == 0
    assert err.getvalue() == ""


def test_cli_load_bad_file_exits_1(tmp_path):
    bad = write_file(tmp_path / "bad.safetensors", {"a": entry("F32", [3], 0, 8)}, bytes(8))
    out, err = _stdio.StringIO(), _stdio.StringIO()
    assert cli_run(_parse("load", bad), out, err) == 1
    assert "ignis load: error: invalid safetensors file" in err.getvalue() and "'a'" in err.getvalue()
    assert cli_run(_parse("load", str(tmp_path / "missing")), out, err) == 2  # missing: 2, as ignis run
    assert err.getvalue().endswith(f"ignis load: no such file: {tmp_path / 'missing'}\n")
