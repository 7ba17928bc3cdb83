"""The PyTorch front end on PyTorch's CPU build: the op classification table, views' byte
ranges, the per-op accesses, the report format and the entry points.

CPU tensors stand in for a device's (``TorchFrontEnd(device_type="cpu")``) with
made-up stream handles; ``Traced`` announces each fresh output and each dying
storage as the caching allocator's trace callbacks do on a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import weakref

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the ignis[torch] extra)")

import ignis as ig  # noqa: E402
from ignis.safety.records import _Rec  # noqa: E402
from ignis.safety.sanitizer import NO_INIT_CHECK, OUTPUT, READ, WRITE, Sanitizer, _disjoint, unpack_items  # noqa: E402
from ignis.torch._frontend import TorchFrontEnd, _bind_native, _item  # noqa: E402
from ignis.torch._ops import classify  # noqa: E402

A = torch.ops.aten
from helpers import IMPORT_ROOT  # noqa: E402


def spec(op):
    s = classify(op)
    return {"reads": s.reads(), "writes": s.writes(), "outputs": [(i, m) for i, m, _ in s.outputs],
            "special": s.special, "active": s.active}


# -- the classification table -------------------------------------------------------------------

@pytest.mark.parametrize("op,reads,writes,outputs", [
    (A.add.Tensor, ["self", "other"], [], [(0, WRITE | OUTPUT)]),
    (A.add_.Tensor, ["self", "other"], ["self"], []),                      # in-place: reads and writes self
    (A.add.out, ["self", "other"], ["out"], []),                           # out=: written, not read
    (A.fill_.Scalar, [], ["self"], []),                                    # overwrite: not read
    (A.normal_.default, [], ["self"], []),
    (A.zero_.default, [], ["self"], []),
    (A.index_put_.default, ["indices", "values"], ["self"], []),
    (A.sort.values, ["self"], ["values", "indices"], []),
    (A.max.dim, ["self"], [], [(0, WRITE | OUTPUT), (1, WRITE | OUTPUT)]),
    (A.cat.default, ["tensors"], [], [(0, WRITE | OUTPUT)]),
    (A._foreach_add_.Scalar, ["self"], ["self"], []),
    (A.empty.memory_format, [], [], [(0, OUTPUT)]),                        # allocation: nothing written
    (A.empty_like.default, [], [], [(0, OUTPUT)]),
    (A.new_empty.default, [], [], [(0, OUTPUT)]),
    (A.zeros_like.default, [], [], [(0, WRITE | OUTPUT)]),                 # *_like: input's metadata only
    (A.new_zeros.default, [], [], [(0, WRITE | OUTPUT)]),
    (A.mm.default, ["self", "mat2"], [], [(0, WRITE | OUTPUT)]),
])
def test_op_classification(op, reads, writes, outputs):
    s = spec(op)
    assert (s["reads"], s["writes"], s["outputs"]) == (reads, writes, outputs), classify(op)
    assert s["active"]


@pytest.mark.parametrize("op", [A.view.default, A.slice.Tensor, A.transpose.int, A.t.default, A.detach.default,
                                A.split.Tensor, A.expand.default, A.as_strided.default, A.transpose_.default,
                                A.unsqueeze_.default, A.sym_size.int, A.sym_stride.int, A.is_same_size.default,
                                A.set_.source_Storage])
def test_views_and_metadata_touch_no_bytes(op):
    assert not classify(op).active


def test_special_ops_and_gathers():
    assert classify(A.record_stream.default).special == "record_stream"
    assert classify(A.copy_.default).special == "copy" and spec(A.copy_.default)["writes"] == ["self"]
    assert classify(A._to_copy.default).special == "to_copy"
    assert classify(A.resize_.default).special == "resize"
    idx = classify(A.index.Tensor)
    assert dict((n, m) for _, n, m, _ in idx.inputs)["self"] == READ | NO_INIT_CHECK
    emb = classify(A.embedding.default)
    assert dict((n, m) for _, n, m, _ in emb.inputs)["weight"] == READ | NO_INIT_CHECK


def test_collectives_read_and_write_their_buffers():
    op = getattr(getattr(torch.ops, "c10d", None), "allreduce_", None)
    if op is None:
        pytest.skip("this PyTorch build has no c10d ops")
    s = classify(op.default)
    assert "tensors" in s.writes() and "tensors" in s.reads()


def test_the_table_is_cached_per_overload():
    assert classify(A.add.Tensor) is classify(A.add.Tensor)


# -- byte ranges of views (the observer library's measure, which both engines use) ----------------

@pytest.fixture(autouse=True)
def _measure():
    try:
        _bind_native()
    except RuntimeError as e:
        pytest.skip(str(e))


def test_contiguous_views_are_exact_byte_ranges():
    x = torch.zeros(8, 16)  # float32: 64-byte rows
    base = x.untyped_storage().data_ptr()
    b, size, lo, hi, per, ch, mode = _item(x[2:5], READ)
    assert (b, size, lo - base, hi - base, per, ch) == (base, 512, 128, 320, 0, 0)
    assert _item(x[3], READ)[2:4] == (base + 192, base + 256)
    assert _item(x[:0], READ) is None and _item(3, READ) is None   # no bytes, or not a tensor
    assert _item(x[3], READ)[1] == 512   # the whole storage's size, whatever the view


def test_columns_are_strided_patterns_and_halves_do_not_overlap():
    x = torch.zeros(8, 16)
    base = x.data_ptr()
    left = _item(x[:, :8], WRITE)
    right = _item(x[:, 8:], WRITE)
    assert left[2:] == (base, base + 7 * 64 + 32, 64, 32, WRITE)
    assert right[2:] == (base + 32, base + 7 * 64 + 64, 64, 32, WRITE)
    r = _Rec(1, "s", 1, "write", left[2], left[3], "op", None, 1, base, left[4], left[5])
    assert _disjoint(r, right[2], right[3], right[4], right[5])
    col = _item(x[:, 3], READ)
    assert (col[4], col[5]) == (64, 4)
    assert not _disjoint(r, col[2], col[3], col[4], col[5])


def test_transposed_and_expanded_views_span_their_bytes():
    x = torch.zeros(8, 16)
    base = x.data_ptr()
    assert _item(x.t(), READ)[2:6] == (base, base + 512, 0, 0)
    e = torch.zeros(16).expand(4, 16)
    assert _item(e, READ)[3] - _item(e, READ)[2] == 64
    y = torch.zeros(256)
    lo, hi, per, ch = _item(y.as_strided((2, 3, 4), (15, 5, 1)), READ)[2:6]
    assert (hi - lo, per, ch) == ((15 + 10 + 3 + 1) * 4, 20, 16)
    assert _item(y.as_strided((2, 3, 4), (60, 5, 1)), READ)[4] == 0     # two irregular levels: span only


# -- the front end on CPU tensors ------------------------------------------------------------------

class Traced(TorchFrontEnd):
    """CPU tensors as a device's, with the caching allocator's trace simulated: each new
    storage an op returns is announced before the op's accesses, each dying one is freed."""

    def __init__(self, san: Sanitizer, engine: str = "mode") -> None:
        self.current = 0x10
        super().__init__(san, device_type="cpu", stream_of=lambda t: self.current, engine=engine)
        self._refs: dict[int, weakref.ref] = {}

    def _announce(self, out) -> None:
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.nbytes:
                st = t.untyped_storage()
                base = st.data_ptr()
                ref = self._refs.get(base)
                if ref is None or ref() is not st:
                    self.san.extent_allocated(base, self.current)
                    self._refs[base] = weakref.ref(st, lambda r, b=base: self._died(b, r))

    def _died(self, base, ref) -> None:
        if self._refs.get(base) is ref:
            del self._refs[base]
            self.san.extent_freed(base)

    def on_op(self, spec, args, kwargs, out, hv=-1) -> None:
        if spec.outputs:
            self._announce(out)
        super().on_op(spec, args, kwargs, out, hv)

    def _observed(self, index, items, host, device, sid, synced) -> None:
        # The observer hands over byte ranges, not tensors: a fresh output's storage is
        # announced from its item (its free is not simulated on this engine).
        for base, size, lo, hi, per, ch, mode in unpack_items(items):
            if mode & OUTPUT:
                ext = self.san._live.get(base)
                if ext is None or ext.end is not None:
                    self.san.extent_allocated(base, self.current)
        super()._observed(index, items, host, device, sid, synced)


ENGINES = ["mode", "observer"]


def need_engine(engine: str) -> None:
    if engine == "observer":
        from ignis.torch._native import observer, observer_error
        if observer() is None:
            pytest.skip(f"the op observer cannot be built here: {observer_error()}")


@pytest.fixture(params=ENGINES)
def traced(request):
    need_engine(request.param)
    san = Sanitizer()
    san.mode = "collect"
    fe = Traced(san, request.param)
    fe.enable()
    try:
        yield fe
    finally:
        fe.disable()


def calls(fe: TorchFrontEnd, fn):
    """The accesses an op reports: [(op, [(mode, lo - base, hi - base)])], each op's sorted
    (the observer measures written arguments after the op, the others before it)."""
    got = []
    real = fe.san.foreign_access
    fe.san.foreign_access = lambda stream, op, frames, items, synced=False, library=-1, thread=0: got.append(
        (op, sorted((m, lo - b, hi - b) for b, _, lo, hi, _, _, m in
                    (unpack_items(items) if isinstance(items, bytes) else items))))
    try:
        fn()
        fe.san.drain()  # (the observer hands its calls over in batches)
    finally:
        fe.san.foreign_access = real
    return got


def test_ops_report_their_reads_and_writes(traced):
    a, b, c = torch.ones(4), torch.ones(4), torch.zeros(4)
    assert calls(traced, lambda: torch.add(a, b, out=c)) == [("aten::add.out", [(READ, 0, 16), (READ, 0, 16),
                                                                                 (WRITE, 0, 16)])]
    assert calls(traced, lambda: a.add_(b)) == [("aten::add_.Tensor", [(READ, 0, 16), (READ | WRITE, 0, 16)])]
    assert calls(traced, lambda: a.view(2, 2)) == []
    assert calls(traced, lambda: torch.zeros_like(a)) == [("aten::zeros_like", [(WRITE | OUTPUT, 0, 16)])]
    assert calls(traced, lambda: a.new_empty(3)) == [("aten::new_empty", [(OUTPUT, 0, 12)])]
    assert calls(traced, lambda: c[1:3].copy_(a[:2])) == [("aten::copy_", [(READ, 0, 8), (WRITE, 4, 12)])]


def test_both_engines_measure_an_op_alike():
    # One rule (the observer library's measure): the dispatch mode and the observer hand the
    # sanitizer the same items, byte for byte, for views, lists of tensors, out= and tuples.
    need_engine("observer")
    x = torch.zeros(8, 16)
    ps = [torch.ones(5) for _ in range(4)]
    gs = [torch.ones(5) for _ in range(4)]
    out = torch.empty(8)

    def program():
        x[:, 3].add_(1)                       # a strided column, read and written
        x.t().mul(2)                          # a transposed read, a fresh output
        torch._foreach_add_(ps, gs)           # lists of tensors: every element, one call
        torch.sum(x[2:4], dim=1, out=out[:2])  # out= of a view
        torch.max(x, dim=0)                   # two fresh outputs

    seen = {}
    for engine in ENGINES:
        san = Sanitizer()
        san.mode = "collect"
        fe = Traced(san, engine)
        got = []
        real = san.foreign_access
        san.foreign_access = lambda stream, op, frames, items, synced=False, library=-1, thread=0: got.append(
            (op, sorted(unpack_items(items) if isinstance(items, bytes) else items)))
        fe.enable()
        try:
            program()
        finally:
            fe.disable()
            san.foreign_access = real
        seen[engine] = [(op, [it for it in items if not it[6] & OUTPUT]) for op, items in got]  # fresh outputs differ per run
    assert seen["mode"] == seen["observer"], seen
    ops = [op for op, _ in seen["mode"]]
    assert "aten::_foreach_add_.List" in ops
    foreach = dict(seen["mode"])["aten::_foreach_add_.List"]
    assert len(foreach) == 8  # 4 parameters read and written, 4 gradients read


def test_a_race_between_streams_with_both_stacks(traced):
    x = torch.zeros(1024)
    traced.current = 0x20
    y = x * 2                                                    # a side stream reads x, no wait
    [e] = traced.san.reports
    assert e.kind == "read-after-write race"
    assert e.first["op"] == "aten::zeros" and e.second["op"] == "aten::mul.Tensor"
    assert "x = torch.zeros(1024)" in e.first["stack"] and "y = x * 2" in e.second["stack"]
    torch_dir = os.path.dirname(torch.__file__) + os.sep
    ignis_dir = os.path.dirname(ig.__file__) + os.sep
    assert torch_dir not in e.first["stack"] + e.second["stack"] and ignis_dir not in e.second["stack"]
    assert e.second["stream_name"] == "stream 0x20" and e.second["range"] == (0, 4096)
    del y


def test_the_observer_raises_what_it_found_when_checking_stops():
    need_engine("observer")
    san = Sanitizer()
    san.mode = "raise"
    fe = Traced(san, "observer")
    fe.enable()
    try:
        x = torch.zeros(1024)
        fe.current = 0x20
        y = x * 2                                                # no raise inside the op: the observer cannot
        assert float(y.sum()) == 0.0
    except BaseException:
        fe.disable()
        raise
    with pytest.raises(ig.errors.IgnisError, match="read-after-write race"):
        fe.disable()
    assert fe.engine == "observer" and fe._obs is None


def test_the_observer_hands_ops_to_the_sanitizer_itself_with_the_users_stack():
    # A front end whose _observed is its own: the observer calls foreign_access directly (no
    # Python frame of the front end's between), with the op's name and the user's frames.
    need_engine("observer")
    for mode in ("collect", "raise"):
        san = Sanitizer()
        san.mode = mode
        stream = [0x10]
        fe = TorchFrontEnd(san, device_type="cpu", stream_of=lambda t: stream[0], engine="observer")
        assert fe._direct() is not None and Traced(Sanitizer(), "observer")._direct() is None
        fe.enable()
        try:
            x = torch.zeros(1024)                                # DIRECT-WRITE
            stream[0] = 0x20
            y = x * 2                                            # DIRECT-READ
            assert float(y.sum()) == 0.0
            assert fe.ops >= 3
            fe.ops = 0                                           # a reset drops what the observer counted
            assert fe.ops == 0
        except BaseException:
            fe.disable()
            raise
        if mode == "raise":  # found inside an op: raised when checking stops
            with pytest.raises(ig.errors.RaceError, match="read-after-write race") as info:
                fe.disable()
            e = info.value
        else:
            fe.disable()
            [e] = san.reports
        assert e.first["op"] == "aten::zeros" and e.second["op"] == "aten::mul.Tensor"
        assert "# DIRECT-WRITE" in e.first["stack"] and "# DIRECT-READ" in e.second["stack"]
        assert e.second["stream_name"] == "stream 0x20"


def test_the_observers_timers_count_its_spans_only_while_on():
    # The diagnostic timers (where the observer's time goes in a step): nothing counted while
    # off, every RecordFunction call's start and end and each checked op's capture and
    # sanitizer call while on, and a take restarts them.
    need_engine("observer")
    from ignis.torch._native import TIMER_SLOTS, observer_timing
    san = Sanitizer()
    san.mode = "collect"
    fe = TorchFrontEnd(san, device_type="cpu", stream_of=lambda t: 0x10, engine="observer")
    fe.enable()
    try:
        observer_timing(False)
        x = torch.ones(256)
        (x * 2).sum()
        off = observer_timing(True)
        assert set(off) == set(TIMER_SLOTS) and all(v == (0, 0) for v in off.values())
        before = fe.ops
        for _ in range(5):
            x = (x * 2).add_(1)
        checked = fe.ops - before
        on = observer_timing(False)
    finally:
        fe.disable()
    assert checked >= 10
    assert on["start"][1] >= checked and on["end"][1] >= checked  # (the nested calls too, where there are)
    assert on["start"][1] == on["end"][1]
    assert on["capture"][1] == on["sanitizer"][1] == checked
    assert on["gil"][1] >= checked
    assert all(ns > 0 for ns, n in on.values() if n)
    assert on["start"][0] + on["end"][0] > on["sanitizer"][0] > 0  # (the sanitizer's call is inside an end)
    assert observer_timing(False) == {k: (0, 0) for k in TIMER_SLOTS}


def test_wait_stream_orders_it(traced):
    x = torch.zeros(1024)
    traced.san.on_event_record(0xE, 0x10)
    traced.san.on_stream_wait_event(0x20, 0xE)
    traced.current = 0x20
    y = x * 2
    assert traced.san.reports == [] and y.sum() == 0


def test_uninitialized_read_names_the_allocation_site(traced):
    x = torch.empty(256)
    x[:128].fill_(1.0)
    x[:128].sum()                                               # written part: fine
    x.sum()                                                     # reads the unwritten half
    [e] = traced.san.reports
    assert isinstance(e, ig.errors.IgnisError) and e.kind == "uninitialized read"
    assert "x = torch.empty(256)" in e.first["stack"] and "x.sum()" in e.second["stack"]
    assert e.first["op"] == "aten::empty.memory_format" and e.second["range"] == (0, 1024)


def test_factories_and_in_place_ops_of_empty_memory(traced):
    a = torch.ones(64)
    torch.empty_like(a).add_(1)                                 # reads garbage
    torch.empty_like(a).fill_(1).sum()                          # fine: filled first
    a.new_empty(64).copy_(a).sum()                              # fine
    torch.empty(64).normal_().sum()                             # fine
    assert [r.kind for r in traced.san.reports] == ["uninitialized read"]
    assert traced.san.reports[0].second["op"] == "aten::add_.Tensor"


def test_reports_are_grouped_by_site_pair(traced):
    x = torch.zeros(1024)
    for _ in range(10):
        traced.current = 0x10
        x.fill_(1.0)
        traced.current = 0x20
        x.sum()
    counts = sorted(r.count for r in traced.san.reports)
    assert counts == [9, 10]
    assert "(seen 10 times)" in traced.san.summary()


def test_declared_uses_for_kernels_the_dispatcher_cannot_see(traced, monkeypatch):
    import ignis.torch as igt
    monkeypatch.setattr(igt, "_fe", traced)
    x = torch.zeros(64)
    with igt.use(x, "write", stream=0x30):                     # a Triton kernel writing x on stream 0x30
        pass
    [e] = traced.san.reports
    assert e.kind == "write-after-write race" and e.second["op"] == "declared use"
    assert "igt.use(x" in e.second["stack"]


def test_a_declared_use_with_an_unknown_access_is_refused_with_the_sanitizer_off(monkeypatch):
    import ignis.torch as igt
    monkeypatch.setattr(igt, "_fe", None)  # the front end is off: nothing is checked or recorded
    x = torch.zeros(4)
    with pytest.raises(ValueError, match="unknown access 'explode'"):
        igt.use(x, "explode")
    with igt.use(x, "read") as t:  # a valid one passes the tensor through
        assert t is x


# -- entry points --------------------------------------------------------------------------------

def test_importing_ignis_torch_imports_nothing_and_costs_nothing():
    code = ("import sys, ignis.torch as t; print('torch' in sys.modules, t.is_enabled());"
            "import torch; from torch.utils._python_dispatch import _get_current_dispatch_mode;"
            "print(_get_current_dispatch_mode())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=IMPORT_ROOT, IGNIS_BACKEND="emulated"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["False", "False", "None"]


@pytest.mark.parametrize("engine", ENGINES)
def test_sanitize_on_cpu_tensors_checks_nothing_and_says_so(engine, monkeypatch):
    import ignis.torch as igt
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    need_engine(engine)
    monkeypatch.setenv("IGNIS_TORCH_ENGINE", engine)
    ig.sanitizer.disable()
    with igt.sanitize("collect") as san:
        assert igt.is_enabled() and igt.front_end().engine == engine
        assert (_get_current_dispatch_mode() is not None) == (engine == "mode")
        x = torch.arange(10.0)
        assert float((x * 2).sum()) == 90.0
        assert "nothing on the CPU is checked" in san.summary()
        assert igt.front_end().cpu_ops >= 2 and igt.front_end().ops == 0
    assert not igt.is_enabled() and _get_current_dispatch_mode() is None and not ig.sanitizer.is_enabled()


def test_without_a_compiler_enabling_says_why_and_leaves_nothing_on(tmp_path):
    # Both engines measure tensors with the observer's library (one rule): without it, neither
    # starts, and each says what to do.
    code = ("import sys, torch, ignis.torch as igt\n"
            "from ignis.torch._native import observer, observer_error\n"
            "assert observer() is None\n"
            "print('ERROR', observer_error())\n"
            "for mode, engine in (('collect', None), ('raise', None), ('raise', 'mode'), ('collect', 'observer')):\n"
            "    try:\n"
            "        igt.enable(mode, engine=engine)\n"
            "    except RuntimeError as e:\n"
            "        print(f'REFUSED-{mode}-{engine}', e)\n"
            "print('LEFT', igt.is_enabled(), __import__('ignis').sanitizer.is_enabled())\n")
    env = dict(os.environ, PYTHONPATH=IMPORT_ROOT, IGNIS_BACKEND="emulated", IGNIS_CACHE_DIR=str(tmp_path),
               CXX=str(tmp_path / "no-such-compiler"))
    env.pop("IGNIS_TORCH_ENGINE", None)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    lines = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    assert "no-such-compiler" in lines["ERROR"]
    for key in ("REFUSED-collect-None", "REFUSED-raise-None", "REFUSED-raise-mode", "REFUSED-collect-observer"):
        assert "cannot be built here" in lines[key] and "install a C++ compiler" in lines[key], key
    assert lines["LEFT"] == "False False"  # each failed enable left nothing on
    assert "building the op observer" in p.stderr
    # Under ``ignis run --sanitize`` (enable on import), the program's own ``import torch``
    # goes on: the reason is printed and PyTorch's ops run unchecked.
    code = ("from ignis.torch import _hook\n"
            "_hook.enable_on_import('collect')\n"
            "import torch\n"
            "import ignis.torch as igt\n"
            "print('IMPORTED', float(torch.ones(3).sum()), igt.is_enabled())\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    assert "IMPORTED 3.0 False" in p.stdout
    assert "PyTorch's ops are not checked" in p.stderr and "install a C++ compiler" in p.stderr
    assert not list(tmp_path.rglob("*.so"))  # nothing half-built left behind


def test_the_observer_leaves_nothing_registered_when_it_stops():
    need_engine("observer")
    from ignis.torch._native import observer
    lib = observer()
    assert not lib.ignis_obs_any_global()
    san = Sanitizer()
    san.mode = "collect"
    fe = Traced(san, "observer")
    fe.enable()
    try:
        assert lib.ignis_obs_any_global()
        x = torch.ones(8) * 2
    finally:
        fe.disable()
    assert not lib.ignis_obs_any_global()  # ops cost what they did before
    ops = fe.ops
    x * 3
    assert fe.ops == ops == 2 and float(x.sum()) == 16.0  # ones, mul: none after


def test_the_gpu_trace_goes_to_the_front_ends_handlers_below_python(monkeypatch):
    # With the observer, PyTorch's GPU trace goes through the observer's interpreter: each event
    # of the checked device type goes straight to its handler (a free's with the handle of the
    # stream current there), an event with no handler costs no Python, a listener in PyTorch's
    # own registries still hears its events, and at stop PyTorch's interpreter is back. The
    # events are fired through PyTorch's trace pointer as its allocator fires them.
    need_engine("observer")
    import torch.cuda._gpu_trace as gt
    from ignis.torch._native import observer
    lib = observer()
    torch._C._activate_gpu_trace()
    # PyTorch passes an event of device type T on to torch.<T>._gpu_trace: the front end checks
    # the CPU here, so its events go to the CUDA registries for this test.
    monkeypatch.setattr(torch.cpu, "_gpu_trace", gt, raising=False)
    kinds = TorchFrontEnd._TRACE_KINDS
    got: list = []
    handlers = tuple(None if k == "MemoryAllocationCallbacks" else (lambda *a, _k=k: got.append((_k, a)))
                     for k in kinds)
    san = Sanitizer()
    san.mode = "raise"
    fe = TorchFrontEnd(san, device_type="cpu", stream_of=lambda t: 0x10, engine="observer")
    heard: list = []
    other = lambda *a: heard.append(a[0])  # noqa: E731 - (the event, or the pointer)
    fe.enable()
    try:
        assert not lib.ignis_obs_trace_active()
        assert lib.ignis_obs_trace_start(handlers, tuple(getattr(gt, k).callback_list for k in kinds)) == 0
        assert lib.ignis_obs_trace_active()
        lib.ignis_obs_trace_take_events()
        for i in range(len(kinds)):
            assert lib.ignis_obs_trace_fire(i, 0, 0x100 + i, 0x200 + i, 0) == 0
        assert got == [("EventCreationCallbacks", (0x100,)), ("EventDeletionCallbacks", (0x101,)),
                       ("EventRecordCallbacks", (0x102, 0x202)), ("EventWaitCallbacks", (0x103, 0x203)),
                       ("MemoryDeallocationCallbacks", (0x105, 0x10)),  # (the current stream's handle)
                       ("StreamCreationCallbacks", (0x106,)), ("DeviceSynchronizationCallbacks", ()),
                       ("StreamSynchronizationCallbacks", (0x108,)), ("EventSynchronizationCallbacks", (0x109,))]
        assert lib.ignis_obs_trace_take_events() == 9  # the allocation had no handler
        got.clear()
        # Another listener in PyTorch's registry hears its kind as before; Ignis's handler too.
        gt.EventRecordCallbacks.add_callback(other)
        gt.MemoryAllocationCallbacks.add_callback(other)
        lib.ignis_obs_trace_fire(2, 0, 0xE1, 0x51, 0)
        lib.ignis_obs_trace_fire(4, 0, 0xA110C, 0, 0)
        assert got == [("EventRecordCallbacks", (0xE1, 0x51))] and heard == [0xE1, 0xA110C]
        got.clear()
        # An event fired while the thread has an exception set (a release in an error path): the
        # handler runs, and the exception is the caller's still.
        with pytest.raises(KeyError, match="set before the event"):
            lib.ignis_obs_trace_fire(5, 0, 0xF4EE, 0, 1)  # (ctypes raises what is set when the call returns)
        assert got == [("MemoryDeallocationCallbacks", (0xF4EE, 0x10))]
        got.clear()
        # An error a handler raises in raise mode waits for the front end to raise it.
        err = ig.errors.IgnisError("found in a trace event")

        def failing(*a):
            raise err
        assert lib.ignis_obs_trace_start(tuple(failing if h else None for h in handlers),
                                         tuple(getattr(gt, k).callback_list for k in kinds)) == 0
        lib.ignis_obs_trace_fire(3, 0, 0xE2, 0x52, 0)
        assert fe.pending == [err]
        fe.pending.clear()
    finally:
        fe.disable()  # stopping the observer gives the trace back
        gt.EventRecordCallbacks.callback_list.remove(other)
        gt.MemoryAllocationCallbacks.callback_list.remove(other)
    assert not lib.ignis_obs_trace_active()
    heard.clear()
    gt.EventRecordCallbacks.add_callback(other)
    try:
        lib.ignis_obs_trace_fire(2, 0, 0xE3, 0x53, 0)  # PyTorch's own interpreter: the registries only
    finally:
        gt.EventRecordCallbacks.callback_list.remove(other)
    assert heard == [0xE3] and got == []


@pytest.mark.parametrize("fresh", [True, False])
def test_without_allocation_events_an_output_starts_a_lifetime(fresh):
    # On a GPU the observer takes no allocation callback: an op's fresh output starts the
    # block's lifetime, and its unwritten bytes are checked as an announced block's are.
    need_engine("observer")
    san = Sanitizer()
    san.mode = "collect"
    san.outputs_fresh = fresh
    fe = TorchFrontEnd(san, device_type="cpu", stream_of=lambda t: 0x10, engine="observer")
    fe.enable()
    try:
        x = torch.empty(256)
        x[:128].fill_(1.0)
        x[:128].sum()
        x.sum()
    finally:
        fe.disable()
    if not fresh:  # memory of unknown origin: nothing says which bytes were ever written
        assert san.reports == []
        return
    [e] = san.reports
    assert e.kind == "uninitialized read" and e.first["op"] == "aten::empty.memory_format"
    assert "x = torch.empty(256)" in e.first["stack"] and "x.sum()" in e.second["stack"]
    assert e.second["range"] == (0, 1024)


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


def _backward():
    x = torch.ones(4, requires_grad=True)
    x.abs().sum().backward()


def _custom_function():
    _Square.apply(torch.ones(4, requires_grad=True)).sum().backward()


def _failing_ops():
    a = torch.ones(4)
    for fn in (lambda: a.add_(torch.ones(5)), lambda: a.copy_(torch.ones(3))):
        try:
            fn()
        except RuntimeError:
            pass


PROGRAMS = {
    "backward ops": _backward,                                             # inside the engine's node ranges
    "a custom autograd.Function": _custom_function,                         # inside its apply range
    "out= that resizes": lambda: torch.add(torch.ones(4), 1, out=torch.empty(0)),  # the write measured after
    "cat into a grown out=": lambda: torch.cat([torch.ones(4), torch.ones(4)], out=torch.empty(2)),
    "resize_ of an empty tensor": lambda: torch.empty(0).resize_(10),
    "ops that fail": _failing_ops,                                           # nothing reported
    "linear and matmul (decompositions)": lambda: torch.nn.functional.linear(torch.ones(3, 4), torch.ones(5, 4)) @ torch.ones(5, 2),
    "tuple returns": lambda: torch.ones(6).split(2) + torch.ones(3, 3).max(dim=0),
    "copies and casts (the observer's direct way)": lambda: (torch.empty(4).copy_(torch.ones(4)),
                                                             torch.ones(4).to(torch.float64)),
}


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_both_engines_report_the_same_accesses(program):
    need_engine("observer")
    got = {}
    for engine in ENGINES:
        san = Sanitizer()
        san.mode = "collect"
        fe = TorchFrontEnd(san, device_type="cpu", stream_of=lambda t: 0x10, engine=engine)
        fe.enable()
        try:
            got[engine] = calls(fe, PROGRAMS[program])
        finally:
            fe.disable()
    assert got["observer"] == got["mode"] and got["mode"]


def test_the_observer_survives_threads_and_restarts():
    need_engine("observer")
    from ignis.torch._native import observer
    lib = observer()
    stop = threading.Event()
    problems = []

    def work():
        a = torch.ones(64)
        while not stop.is_set():
            (a * 2).add_(1).sum()

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    old_hook = sys.unraisablehook
    sys.unraisablehook = lambda u: problems.append(u.exc_value)
    try:
        for _ in range(60):
            san = Sanitizer()
            san.mode = "collect"
            fe = TorchFrontEnd(san, device_type="cpu", stream_of=lambda t: 0x10, engine="observer")
            fe.enable()
            (torch.ones(8) * 3).sum()
            assert lib.ignis_obs_errors() == 0
            fe.disable()
            assert fe.ops >= 3  # this thread's ops at least; the workers' too, each to its own session
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        sys.unraisablehook = old_hook
    assert problems == []


def test_the_engine_name_is_checked(monkeypatch):
    with pytest.raises(ValueError, match="engine must be"):
        TorchFrontEnd(Sanitizer(), device_type="cpu", engine="fast")
    monkeypatch.setenv("IGNIS_TORCH_ENGINE", "fast")  # a typo must not leave the ops unchecked
    with pytest.raises(ValueError, match="IGNIS_TORCH_ENGINE must be 'observer' or 'mode'"):
        TorchFrontEnd(Sanitizer(), device_type="cpu")
    assert TorchFrontEnd(Sanitizer(), device_type="cpu", engine="mode").engine_asked == "mode"  # the argument wins


def test_ops_on_threads_started_after_checking_began_are_seen(traced):
    # The dispatch mode is entered per thread: the front end enters it on threads started after
    # it began (the observer sees every thread anyway), so a thread's race is reported.
    import threading
    x = torch.zeros(1024)
    traced.current = 0x20
    out = []
    t = threading.Thread(target=lambda: out.append(x * 2))    # reads x on another stream, no wait
    t.start()
    t.join()
    [e] = traced.san.reports
    assert e.kind == "read-after-write race" and e.second["op"] == "aten::mul.Tensor"
    assert "out.append(x * 2)" in e.second["stack"] and "x = torch.zeros(1024)" in e.first["stack"]


def test_a_thread_still_running_when_checking_stops_goes_on_unchecked():
    import threading
    san = Sanitizer()
    san.mode = "collect"
    fe = Traced(san, "mode")
    real_start = threading.Thread.start
    fe.enable()
    go, ran = threading.Event(), threading.Event()
    x = torch.zeros(64)

    def work():
        go.wait(10)
        fe.current = 0x20
        x.add_(1)                    # after checking stopped: not seen, no report
        ran.set()
    t = threading.Thread(target=work)
    try:
        t.start()
    finally:
        fe.disable()
    assert threading.Thread.start is real_start  # the wrapper is gone with the front end
    go.set()
    t.join(10)
    assert ran.is_set() and not san.reports and x[0].item() == 1.0


def test_the_query_wrappers_are_installed_while_a_front_end_is_on(traced):
    from ignis.torch import _queries
    own_event, own_stream = _queries._generic_event_tap.original, _queries._generic_stream_tap.original
    assert type(own_event).__name__ == type(own_stream).__name__ == "method_descriptor"
    assert _queries.installed()
    assert torch.cuda.Event.__dict__["query"] is _queries._event_tap.wrapper
    assert torch.cuda.Stream.__dict__["query"] is _queries._stream_tap.wrapper
    # The device-generic types are immutable (setattr refuses): wrapped in their own dictionary.
    assert torch.Event.__dict__["query"] is _queries._generic_event_tap.wrapper
    assert torch.Stream.__dict__["query"] is _queries._generic_stream_tap.wrapper
    with pytest.raises(TypeError):
        torch.Event.query = own_event
    traced.disable()
    try:
        assert not _queries.installed() and torch.cuda.Event.__dict__["query"] is not _queries._event_tap.wrapper
        assert torch.Event.__dict__["query"] is own_event  # PyTorch's own again
        assert torch.Stream.__dict__["query"] is own_stream
        assert torch.Event().query() is True  # and it still answers
    finally:
        traced.enable()


def test_a_generic_query_answering_true_tells_the_listeners(traced):
    # torch.Event / torch.Stream (torch.accelerator's) poll through PyTorch's device guard, which
    # the GPU trace does not report either. Here (no CUDA) the CPU's generic objects answer True.
    from ignis.torch import _queries
    events, streams = [], []
    assert _queries.add_listeners(events.append, streams.append)
    try:
        e, s = torch.Event(), torch.Stream()
        assert e.query() is True and s.query() is True
        assert events == [e] and streams == [s]
    finally:
        _queries.remove_listeners(events.append, streams.append)
    assert _queries.installed()  # the front end's listeners keep the wrappers


def test_a_generic_event_or_stream_orders_by_its_handle_on_its_own_device(traced):
    import types
    x = torch.zeros(1024)                          # written on stream 0x10
    traced.san.on_event_record(0xE1, 0x10)
    traced.current = 0x20
    other = types.SimpleNamespace(device=torch.device("meta"), event_id=0xE1)
    traced._on_event_done(other)                   # another device's event: orders nothing here
    kept = [x.sum()]                               # 0x20 reads x, unordered: a race (results kept:
    #                                                no address is freed and reused in this test)
    assert [e.kind for e in traced.san.reports] == ["read-after-write race"]
    traced.san.reports.clear()
    y = torch.zeros(1024)                          # written on 0x20
    traced.san.on_event_record(0xE2, 0x20)
    traced._on_event_done(types.SimpleNamespace(device=torch.device("cpu"), event_id=0xE2))  # torch.Event
    traced._on_event_done(types.SimpleNamespace(device=torch.device("cpu"), event_id=0))     # never recorded
    traced.current = 0x30
    y.add_(1)                                      # after the host saw y written: ordered
    traced._on_stream_done(types.SimpleNamespace(device=torch.device("meta"), native_handle=0x30))  # not ours
    traced._on_stream_done(torch.Stream())         # the CPU's: no raw handle, nothing to order
    traced.current = 0x40
    kept.append(y.sum())                           # 0x40 after 0x30's write, no wait: a race
    assert [e.kind for e in traced.san.reports] == ["read-after-write race"]
    traced.san.reports.clear()
    for h in (0x30, 0x40):                         # torch.Stream's raw handle (native_handle)
        traced._on_stream_done(types.SimpleNamespace(device=torch.device("cpu"), native_handle=h))
    traced.current = 0x50
    y.mul_(2)                                      # after the host saw 0x30's write and 0x40's read
    assert not traced.san.reports


def test_a_query_answering_true_orders_what_follows_it(traced):
    # A program may poll event.query() / stream.query() instead of synchronizing: once one answers
    # True, the host has seen the work finish (the GPU trace reports only synchronize() calls).
    # (Without CUDA here, a stand-in carries the handles PyTorch's event and stream report.)
    import types
    x = torch.zeros(1024)                          # written on stream 0x10
    traced.san.on_event_record(0xE1, 0x10)
    traced.current = 0x20
    traced._on_event_done(types.SimpleNamespace(cuda_event=0xE1))   # event.query() is True
    y = x * 2                                      # another stream, after the host saw x written
    traced._on_event_done(types.SimpleNamespace(cuda_event=0))      # never recorded: nothing
    traced._on_stream_done(types.SimpleNamespace(cuda_stream=0x20))  # stream.query() is True
    traced.current = 0x30
    y.add_(1)                                      # a third stream, after the host saw y written
    x.fill_(2.0)                                   # ... and x read
    assert not traced.san.reports
    traced.current = 0x20
    y.sum()                                        # 0x20 after 0x30's write, no wait: a race
    assert [e.kind for e in traced.san.reports] == ["read-after-write race"]


def test_an_op_that_synchronizes_inside_is_covered_even_when_the_host_knew_its_stream(traced):
    # A blocking copy to the host (or .item()) queues its read, then the host waits for the stream
    # (PyTorch's trace reports the synchronization inside the op). The host may have seen all of
    # the stream's earlier work already, so the wait orders nothing new: the op itself must still
    # count as waited for.
    lib = torch.library.Library("ignis_sync_test", "FRAGMENT")
    lib.define("blocking_read(Tensor x) -> Tensor")

    def blocking_read(x):
        if traced._obs is not None:
            traced._obs.ignis_obs_synced()         # (the trace hook's part, on the observer's engine)
        traced.san.on_stream_synchronize(traced.current)  # the stream synchronize inside the op
        return x.sum()
    lib.impl("blocking_read", blocking_read, "CPU")
    x = torch.zeros(1024)                          # written on stream 0x10
    traced.san.on_stream_synchronize(0x10)         # the host has seen all of 0x10's work
    y = torch.ops.ignis_sync_test.blocking_read(x)  # reads x on 0x10, then waits for 0x10
    traced.current = 0x20
    x.fill_(1.0)                                   # after the host saw the read finish: ordered
    assert not traced.san.reports
    del y, lib


def test_ctc_loss_with_host_lengths_takes_the_list_overload_under_the_dispatch_mode():
    # Under any dispatch mode PyTorch's ctc_loss keeps host lengths as tensors (_ctc_loss.Tensor),
    # which refuses them next to device inputs; the mode engine sends them as lists, the overload
    # PyTorch runs without a mode. (On the CPU both paths run: what is checked here is which one.)
    from torch.utils._python_dispatch import TorchDispatchMode

    from ignis.torch import _ctc

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    def loss_and_grad(lengths_as=torch.tensor):
        logp = torch.randn(20, 3, 6, generator=torch.Generator().manual_seed(1)).log_softmax(-1).requires_grad_()
        targets = torch.tensor([[1, 2, 3], [2, 2, 4], [5, 1, 1]])
        with Seen() as seen:
            loss = torch.nn.functional.ctc_loss(logp, targets, lengths_as([20, 17, 12]), lengths_as([3, 2, 3]))
            loss.backward()
        return loss.item(), logp.grad, [op for op in seen.ops if "ctc" in op]

    plain = loss_and_grad()
    assert "aten._ctc_loss.Tensor" in plain[2]           # PyTorch's own path under a mode
    original = torch.ctc_loss
    san = Sanitizer()
    san.mode = "collect"
    fe = Traced(san, "mode")
    fe.enable()
    try:
        assert _ctc.installed() and torch.ctc_loss is not original
        checked = loss_and_grad()
        as_lists = loss_and_grad(list)                   # lists go through as they came
        with pytest.raises(RuntimeError, match="integral"):  # bad input: PyTorch's own refusal
            torch.nn.functional.ctc_loss(torch.zeros(4, 1, 3), torch.ones(1, 2, dtype=torch.long),
                                         torch.tensor([4.0]), torch.tensor([2.0]))
    finally:
        fe.disable()
    assert not _ctc.installed() and torch.ctc_loss is original
    assert "aten._ctc_loss.Tensor" not in checked[2] and "aten._ctc_loss.default" in checked[2]
    assert checked[0] == pytest.approx(plain[0]) and torch.allclose(checked[1], plain[1])
    assert as_lists[0] == pytest.approx(plain[0]) and "aten._ctc_loss.default" in as_lists[2]
