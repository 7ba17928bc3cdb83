"""torch.distributed under the PyTorch front end, on PyTorch's CPU build.

- The roles table: which buffers each collective reads and writes, where.
- Real collectives (gloo, two processes) seen by both engines: each one's accesses, a
  correct program silent (an all_gather's outputs are written, not read), a rooted
  collective's roles by rank.
- The ordering of a collective that runs on its own stream, driven as PyTorch's NCCL
  process group drives the trace (an event recorded on the issuing stream, the
  communication stream waiting for it, the end event recorded there), through a
  collective op of this file's own whose kernel emits that trace: the buffers are used
  on the communication stream, ordered after the issuing stream's earlier work, and
  ``Work.wait()`` (a wait for the end event) orders what follows it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the ignis[torch] extra)")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("this PyTorch build has no torch.distributed", allow_module_level=True)

import ignis as ig  # noqa: E402
from ignis.collective.launch import free_port  # noqa: E402
from ignis.safety.sanitizer import MAYBE_WRITE, NO_INIT_CHECK, OUTPUT, READ, WRITE, Sanitizer  # noqa: E402
from ignis.torch import _ops  # noqa: E402
from ignis.torch._frontend import TorchFrontEnd  # noqa: E402
from ignis.torch._ops import BROADCAST, P2P, REDUCE, classify  # noqa: E402

from helpers import IMPORT_ROOT  # noqa: E402

C10D = torch.ops.c10d
FN = torch.ops._c10d_functional


def roles(op) -> tuple[dict, dict]:
    s = classify(op)
    assert s.special == "collective", s
    return {r.name: r.mode for r in s.comm}, {r.name: r.mode for r in s.issue}


# -- the roles table ----------------------------------------------------------------------------

@pytest.mark.parametrize("name,comm,issue", [
    ("c10d.allreduce_", {"tensors": READ | WRITE}, {}),
    ("c10d.broadcast_", {"tensors": BROADCAST}, {}),
    ("c10d.reduce_", {"tensors": REDUCE}, {}),
    ("c10d.allgather_", {"input_tensors": READ, "output_tensors": WRITE}, {}),
    ("c10d._allgather_base_", {"input_tensor": READ, "output_tensor": WRITE}, {}),
    ("c10d.reduce_scatter_", {"input_tensors": READ, "output_tensors": WRITE}, {}),
    ("c10d._reduce_scatter_base_", {"input_tensor": READ, "output_tensor": WRITE}, {}),
    ("c10d.alltoall_base_", {"input": READ, "output": WRITE}, {}),
    ("c10d.send", {"tensors": READ}, {}),
    ("c10d.recv_", {"tensors": WRITE}, {}),
    ("_c10d_functional.all_reduce", {"#0": READ | WRITE}, {"input": READ, "#0": OUTPUT | WRITE}),
    ("_c10d_functional.all_gather_into_tensor", {"input": READ, "#0": WRITE}, {"#0": OUTPUT}),
    ("_c10d_functional.reduce_scatter_tensor", {"input": READ, "#0": WRITE}, {"#0": OUTPUT}),
    ("_c10d_functional.all_to_all_single", {"input": READ, "#0": WRITE}, {"#0": OUTPUT}),
    ("_c10d_functional.batch_p2p_ops", {"tensors": P2P}, {}),
])
def test_each_collective_reads_and_writes_what_it_does(name, comm, issue):
    ns, base = name.split(".")
    packet = getattr(getattr(torch.ops, ns), base, None) if hasattr(torch.ops, ns) else None
    if packet is None:  # (this PyTorch has no such op: older ones lack some functional collectives)
        pytest.skip(f"this PyTorch has no {ns}::{base}")
    assert roles(packet.default) == (comm, issue)


def test_waits_touch_no_bytes_and_an_unknown_collective_is_read_and_written():
    assert not classify(FN.wait_tensor.default).active
    assert classify(C10D.allreduce_.default).writes() == ["tensors"]
    assert classify(C10D.send.default).writes() == []
    lib = torch.library.Library("c10d", "FRAGMENT")  # a collective the table does not know yet
    lib.define("ignis_test_unknown_(Tensor[] tensors) -> ()")
    comm, issue = roles(C10D.ignis_test_unknown_.default)
    assert comm == {"tensors": READ | WRITE | NO_INIT_CHECK} and issue == {}


def test_another_librarys_unannotated_arguments_may_have_been_written():
    lib = torch.library.Library("ignis_test_ext", "DEF")
    lib.define("fill_into(Tensor src, Tensor dst) -> ()")      # a schema that leaves out its write
    lib.define("scale_(Tensor(a!) x, float s) -> ()")
    s = classify(torch.ops.ignis_test_ext.fill_into.default)
    assert {n: m for _, n, m, _ in s.inputs} == {"src": READ | NO_INIT_CHECK | MAYBE_WRITE,
                                                 "dst": READ | NO_INIT_CHECK | MAYBE_WRITE}
    s = classify(torch.ops.ignis_test_ext.scale_.default)
    assert {n: m for _, n, m, _ in s.inputs} == {"x": READ | WRITE}


def test_a_maybe_written_range_counts_as_written_without_a_write_record():
    san = Sanitizer()
    san.mode = "collect"
    san.outputs_fresh = True
    base = 0x7000_0000
    full = (base, 64, base, base + 64, 0, 0)
    san.foreign_access(0x10, "aten::empty", None, [full + (OUTPUT,)])
    san.foreign_access(0x10, "ext::fill_into", None, [full + (READ | NO_INIT_CHECK | MAYBE_WRITE,)])
    san.foreign_access(0x10, "aten::sum", None, [full + (READ,)])       # written, as far as anyone can tell
    san.foreign_access(0x20, "aten::sum", None, [full + (READ,)])       # a read after a read: no race
    assert san.reports == []


# -- real collectives: gloo, two processes -----------------------------------------------------

_RANK_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    import torch.distributed._functional_collectives as fc
    from ignis.safety.sanitizer import Sanitizer, unpack_items
    from ignis.torch._frontend import TorchFrontEnd

    rank, engine, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", rank=rank, world_size=2)
    san = Sanitizer()
    san.mode = "collect"
    san.outputs_fresh = True      # as on a GPU with the observer: a fresh output starts a lifetime
    fe = TorchFrontEnd(san, device_type="cpu", stream_of=lambda t: 0x10, engine=engine)
    seen = []
    real = san.foreign_access

    def watch(stream, op, frames, items, synced=False, library=-1, thread=0):
        its = unpack_items(items) if isinstance(items, bytes) else items
        if "c10d" in op:
            seen.append([op, sorted([m, hi - lo] for b, _, lo, hi, _, _, m in its)])
        return real(stream, op, frames, items, synced, library, thread)

    san.foreign_access = watch
    fe.enable()
    try:
        t = torch.full((4,), float(rank + 1))
        dist.all_reduce(t)
        outs = [torch.empty_like(t) for _ in range(2)]
        dist.all_gather(outs, t)
        same = torch.equal(outs[0], outs[1])          # DDP's check: outputs the collective wrote
        whole = torch.empty(8)
        dist.all_gather_into_tensor(whole, t)
        whole.sum()
        dist.broadcast(t, src=0)
        dist.reduce(t, dst=1)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        r = fc.wait_tensor(fc.all_reduce(t, "sum", dist.group.WORLD))
        g = fc.wait_tensor(fc.all_gather_tensor(t, 0, dist.group.WORLD))
        (r + g.sum()).sum()
        part = torch.empty(2)
        dist.reduce_scatter_tensor(part, torch.ones(4))
        part.sum()
        if rank == 0:
            dist.send(t, 1)
        else:
            dist.recv(t, 0)
        t.sum()
        dist.barrier()
    finally:
        fe.disable()
    json.dump({"seen": seen, "reports": [str(e) for e in san.reports]}, open(out, "w"))
    dist.destroy_process_group()
""")


def _two_ranks(tmp_path, engine: str) -> list[dict]:
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               PYTHONPATH=os.pathsep.join([IMPORT_ROOT, os.environ.get("PYTHONPATH", "")]))
    outs = [tmp_path / f"rank{r}-{engine}.json" for r in range(2)]
    procs = [subprocess.Popen([sys.executable, str(script), str(r), engine, str(outs[r])], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    for p in procs:
        text, _ = p.communicate(timeout=240)
        assert p.returncode == 0, text
        assert "Exception ignored" not in text, text  # an error dropped inside a callback PyTorch calls
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.parametrize("engine", ["mode", "observer"])
def test_real_collectives_are_accesses_and_a_correct_program_is_silent(tmp_path, engine):
    if engine == "observer":
        from ignis.torch._native import observer, observer_error
        if observer() is None:
            pytest.skip(f"the op observer cannot be built here: {observer_error()}")
    ranks = _two_ranks(tmp_path, engine)
    RW = READ | WRITE
    for rank, got in enumerate(ranks):
        if engine == "mode":
            # (Only the dispatch mode: the observer sees every thread's ops, and in this test mode,
            # where host tensors stand in for a device's, gloo's own host copies on its worker
            # threads, out of buffers it fills behind the dispatcher, look like the program's.)
            assert got["reports"] == [], f"rank {rank}: {got['reports']}"
        seen = [tuple((op, tuple(tuple(x) for x in items))) for op, items in got["seen"]]
        expected = [
            ("c10d::allreduce_", ((RW, 16),)),
            ("c10d::allgather_", ((READ, 16), (WRITE, 16), (WRITE, 16))),
            ("c10d::_allgather_base_", ((READ, 16), (WRITE, 32))),
            ("c10d::broadcast_", (((READ if rank == 0 else WRITE), 16),)),          # the root sends
            ("c10d::reduce_", (((RW if rank == 1 else READ), 16),)),               # the root reduces
            ("c10d::allreduce_", ((RW, 16),)),
            ("_c10d_functional::all_reduce", ((READ, 16), (OUTPUT | WRITE, 16))),  # the clone, issuing stream
            ("_c10d_functional::all_reduce", ((RW, 16),)),                          # then the reduction
            ("_c10d_functional::all_gather_into_tensor", ((OUTPUT, 32),)),
            ("_c10d_functional::all_gather_into_tensor", ((READ, 16), (WRITE, 32))),
            ("c10d::_reduce_scatter_base_", ((READ, 16), (WRITE, 8))),
            ("c10d::send", ((READ, 16),)) if rank == 0 else ("c10d::recv_", ((WRITE, 16),)),
        ]
        assert seen == expected, f"rank {rank}"


# -- the ordering of a collective on its own stream ----------------------------------------------

S, N, OTHER = 0x10, 0x4C00, 0x20     # the issuing stream, the communication stream, another stream
E_SYNC, E_END = 0xE1, 0xE2            # the process group's events


class Fixture:
    """A front end (either engine) and a collective of this file's own, ``ignis_test_c10d::
    allreduce_``, whose kernel emits the trace ProcessGroupNCCL emits: with ``async_op`` an
    event recorded on the issuing stream, the communication stream waiting for it, and the end
    event recorded on the communication stream; without, nothing (it runs on the issuing stream)."""

    def __init__(self, engine: str, monkeypatch) -> None:
        self.current = S
        self.fail = False
        self.done: "torch.futures.Future | None" = None  # the Work of allreduce_work_: done when set
        self.san = Sanitizer()
        self.san.mode = "collect"
        self.san.outputs_fresh = True
        monkeypatch.setitem(_ops._COLLECTIVES, "ignis_test_c10d", {
            "allreduce_": ({"tensors": READ | WRITE}, {}),
            "send": ({"tensors": READ}, {}),
            "allgather_": ({"input_tensors": READ, "output_tensors": WRITE}, {}),
        })
        self.fe = TorchFrontEnd(self.san, device_type="cpu", stream_of=lambda t: self.current, engine=engine)

    def trace(self, async_op: bool) -> None:
        if async_op:
            self.fe._on_event_record(E_SYNC, self.current)
            self.fe._on_event_wait(E_SYNC, N)
            self.fe._on_event_record(E_END, N)

    def wait(self) -> None:  # Work.wait(): the caller's current stream waits for the end event
        self.fe._on_event_wait(E_END, self.current)


_fixture: Fixture | None = None
_lib = torch.library.Library("ignis_test_c10d", "DEF")
_lib.define("allreduce_(Tensor(a!)[] tensors, bool async_op) -> ()")
_lib.define("send(Tensor[] tensors, bool async_op) -> ()")
_lib.define("allgather_(Tensor(a!)[][] output_tensors, Tensor[] input_tensors, bool async_op) -> ()")
# As c10d's own ops do, this one returns its Work: a real one, done when ``Fixture.done`` is set.
_lib.define("allreduce_work_(Tensor(a!)[] tensors, bool async_op) -> __torch__.torch.classes.c10d.Work")


def _kernel(*args):
    if _fixture.fail:
        raise RuntimeError("the communicator was aborted")
    _fixture.trace(args[-1])


def _work_kernel(tensors, async_op):
    from torch._C._distributed_c10d import _create_work_from_future
    _kernel(tensors, async_op)
    _fixture.done = torch.futures.Future()
    return _create_work_from_future(_fixture.done).boxed()


_lib.impl("allreduce_work_", _work_kernel, "CPU")


for _name in ("allreduce_", "send", "allgather_"):
    _lib.impl(_name, _kernel, "CPU")
OPS = torch.ops.ignis_test_c10d


@pytest.fixture(params=["mode", "observer"])
def coll(request, monkeypatch):
    global _fixture
    if request.param == "observer":
        from ignis.torch._native import observer, observer_error
        if observer() is None:
            pytest.skip(f"the op observer cannot be built here: {observer_error()}")
    _fixture = f = Fixture(request.param, monkeypatch)
    f.fe.enable()
    try:
        yield f
    finally:
        f.fe.disable()
        _fixture = None


def test_reading_the_buffer_before_wait_is_a_race_with_both_stacks(coll):
    t = torch.ones(256)
    OPS.allreduce_([t], True)                     # the collective's call site
    t.sum()                                       # read on the issuing stream before work.wait()
    [e] = coll.san.reports
    assert isinstance(e, ig.RaceError) and e.kind == "read-after-write race"
    assert e.first["op"] == "ignis_test_c10d::allreduce_" and e.second["op"] == "aten::sum"
    assert e.first["stream_name"] == f"the communication stream {N:#x}"
    assert "OPS.allreduce_([t], True)" in e.first["stack"] and "t.sum()" in e.second["stack"]


def test_wait_orders_what_follows_it(coll):
    t = torch.ones(256)
    OPS.allreduce_([t], True)
    coll.wait()
    t.sum()
    t.fill_(2.0)
    assert coll.san.reports == []


def test_the_communication_stream_is_after_the_issuing_streams_earlier_work(coll):
    t = torch.empty(256)
    t.fill_(1.0)                                  # queued on the issuing stream before the call
    OPS.allreduce_([t], True)
    coll.wait()
    assert coll.san.reports == []


def test_writing_the_buffer_before_wait_is_a_race(coll):
    t = torch.ones(256)
    OPS.allreduce_([t], True)
    t.fill_(3.0)
    [e] = coll.san.reports
    assert e.kind == "write-after-write race" and e.second["op"] == "aten::fill_.Scalar"


def test_sending_a_tensor_another_stream_still_writes_is_a_race(coll):
    coll.current = OTHER
    t = torch.zeros(256)
    t.fill_(5.0)                                  # another stream writes it, nothing orders the two
    coll.current = S
    OPS.send([t], True)
    [e] = coll.san.reports
    assert e.kind == "read-after-write race" and e.first["op"] == "aten::fill_.Scalar"
    assert e.second["op"] == "ignis_test_c10d::send" and "OPS.send([t], True)" in e.second["stack"]


def test_a_synchronous_collective_runs_on_the_issuing_stream(coll):
    t = torch.ones(256)
    OPS.allreduce_([t], False)                    # no event wait inside: it ran on the issuing stream
    t.sum()
    assert coll.san.reports == []


def test_outputs_the_collective_wrote_are_not_uninitialized(coll):
    x = torch.ones(64)
    outs = [torch.empty(64), torch.empty(64)]
    OPS.allgather_([outs], [x], True)
    coll.wait()
    torch.equal(outs[0], outs[1])
    assert coll.san.reports == []


def test_an_output_read_before_the_collective_wrote_it_is_uninitialized(coll):
    x = torch.ones(64)
    out = torch.empty(64)
    out.sum()                                     # nothing wrote it yet
    OPS.allgather_([[out]], [x], True)
    [e] = coll.san.reports
    assert e.kind == "uninitialized read" and e.first["op"] == "aten::empty.memory_format"


def test_a_buffer_freed_after_the_call_waits_for_the_collective(coll):
    # PyTorch keeps a collective's buffers alive (stashed or record_stream'd) until it is done:
    # dropping them on the issuing stream is not a use after free.
    t = torch.ones(256)
    OPS.allreduce_([t], True)
    base = t.untyped_storage().data_ptr()
    coll.san.extent_freed(base)
    assert coll.san.reports == []


@pytest.mark.parametrize("role", ["read and written", "written"])
def test_memory_a_collective_touches_first_lives_on_the_issuing_stream(coll, role):
    # Memory no op reported (a library allocated it below the dispatcher) first touched by a
    # collective: the caching allocator put it on the stream current at the allocation, the
    # issuing stream, not the communication stream. Freed there once the collective is done and
    # handed out there again, its next owner's use is in stream order: no reuse race.
    coll.fe.disable()
    t = torch.ones(256)
    out = [torch.empty(256), torch.empty(256)]
    coll.fe.enable()
    if role == "written":
        OPS.allgather_([out], [torch.ones(256)], True)
        t = out[0]
    else:
        OPS.allreduce_([t], True)
    coll.wait()
    base = t.untyped_storage().data_ptr()
    coll.san.extent_freed(base, S)
    coll.san.foreign_access(S, "aten::cat", None, [(base, 1024, base, base + 160, 0, 0, WRITE | OUTPUT)])
    assert coll.san.reports == []


def test_memory_a_collective_touches_first_still_races_a_read_before_wait(coll):
    # The lifetime begun on the issuing stream is still the collective's to write on its own
    # stream: reading it on the issuing stream before wait() is the race it always was.
    coll.fe.disable()
    t = torch.ones(256)
    coll.fe.enable()
    OPS.allreduce_([t], True)
    t.sum()
    [e] = coll.san.reports
    assert e.kind == "read-after-write race" and e.first["op"] == "ignis_test_c10d::allreduce_"
    assert e.first["stream_name"] == f"the communication stream {N:#x}" and e.second["op"] == "aten::sum"


def test_a_storage_resized_away_while_the_collective_uses_it_races_the_free(coll):
    # The Work keeps the tensor; resize_(0) (FSDP's way to free) takes its memory anyway.
    t = torch.ones(256)
    OPS.allreduce_([t], True)                     # the collective's call site
    st = t.untyped_storage()
    base = st.data_ptr()
    st.resize_(0)
    coll.san.extent_freed(base, S)                # the allocator's free, as the GPU trace reports it
    [e] = coll.san.reports
    assert isinstance(e, ig.RaceError) and e.kind == "use-after-free race"
    assert e.first["op"] == "ignis_test_c10d::allreduce_" and e.second["op"] == "free"
    assert "OPS.allreduce_([t], True)" in e.first["stack"]
    assert "work.wait()" in str(e)


@pytest.mark.parametrize("size", [0, 4096])
def test_a_storage_resized_after_wait_or_without_a_collective_is_silent(coll, size):
    t = torch.ones(256)
    OPS.allreduce_([t], True)
    coll.wait()
    u = torch.ones(256)
    u.sum()
    for x in (t, u):
        st = x.untyped_storage()
        base = st.data_ptr()
        st.resize_(size)
        coll.san.extent_freed(base, S)
    assert coll.san.reports == []


def test_a_record_stream_of_the_programs_own_still_delays_the_free_after_a_resize(coll):
    # The allocator keeps a record_stream'd block until that stream's work is done, resized or not.
    t = torch.ones(256)
    OPS.allreduce_([t], True)
    st = t.untyped_storage()
    base = st.data_ptr()
    coll.san.extent_record_stream(base, N)        # as Tensor.record_stream(comm_stream) tells it
    st.resize_(0)
    coll.san.extent_freed(base, S)
    assert coll.san.reports == []


def test_a_failed_collective_applies_nothing_and_closes_its_bracket(coll):
    t = torch.ones(8)
    coll.fail = True
    with pytest.raises(RuntimeError, match="aborted"):
        OPS.allreduce_([t], True)
    coll.fail = False
    assert coll.fe._brackets == {}
    t.sum()
    assert coll.san.reports == []


def test_is_completed_answering_true_orders_what_follows_it(coll):
    """A program may poll ``work.is_completed()`` instead of calling ``wait()``: once it answers
    True the collective has finished on the device, and what is queued after it, on any stream,
    cannot race with it. An answer of False orders nothing."""
    t, u = torch.ones(256), torch.ones(256)
    work = torch.distributed.distributed_c10d.Work.unbox(OPS.allreduce_work_([t, u], True))
    assert not work.is_completed()
    coll.done.set_result([t, u])
    assert work.is_completed()
    t.sum()                                       # the issuing stream, without wait()
    coll.current = OTHER
    u.fill_(2.0)                                  # another stream
    assert coll.san.reports == []


def test_is_completed_answering_false_orders_nothing(coll):
    t = torch.ones(256)
    work = torch.distributed.distributed_c10d.Work.unbox(OPS.allreduce_work_([t], True))
    assert not work.is_completed()
    t.sum()
    [e] = coll.san.reports
    assert e.kind == "read-after-write race" and e.first["op"] == "ignis_test_c10d::allreduce_work_"
    coll.done.set_result([t])


def test_only_the_completed_works_collective_is_joined(coll):
    """The second collective's Work is done, the first's is not known to be: the host joins the
    second's end only (its stream is the same here, so the first is covered too), and a third,
    later collective is not."""
    a, b = torch.ones(64), torch.ones(64)
    w1 = torch.distributed.distributed_c10d.Work.unbox(OPS.allreduce_work_([a], True))
    f1 = coll.done
    w2 = torch.distributed.distributed_c10d.Work.unbox(OPS.allreduce_work_([b], True))
    coll.done.set_result([b])
    assert w2.is_completed() and not w1.is_completed()
    c = torch.ones(64)
    OPS.allreduce_work_([c], True)                # after the answer: still in flight
    b.sum()
    a.sum()                                       # before w2 on the same communication stream: done
    assert coll.san.reports == []
    c.sum()
    [e] = coll.san.reports
    assert e.first["op"] == "ignis_test_c10d::allreduce_work_" and "c.sum()" in e.second["stack"]
    f1.set_result([a])


def test_the_storage_wrapper_is_installed_while_a_front_end_is_on(coll):
    from ignis.torch import _storage
    original = torch._C.StorageBase.resize_
    assert _storage.installed() and torch.UntypedStorage.__dict__["resize_"] is _storage._resize_
    coll.fe.disable()
    try:
        assert not _storage.installed() and "resize_" not in torch.UntypedStorage.__dict__
        assert torch.UntypedStorage.resize_ is original
        st = torch.ones(8).untyped_storage()
        st.resize_(0)
        assert st.nbytes() == 0
    finally:
        coll.fe.enable()
    # Wrapped, a bad call is still PyTorch's to refuse, with PyTorch's own message.
    st = torch.ones(8).untyped_storage()
    with pytest.raises(TypeError) as wrapped:
        st.resize_()
    coll.fe.disable()
    try:
        with pytest.raises(TypeError) as plain:
            st.resize_()
    finally:
        coll.fe.enable()
    assert str(wrapped.value) == str(plain.value) and st.nbytes() == 32


def test_the_work_wrapper_is_installed_while_a_front_end_is_on(coll):
    from ignis.torch import _works
    cls = _works.work_class()
    assert _works.installed() and cls.__dict__["is_completed"] is _works._is_completed
    coll.fe.disable()
    try:
        assert not _works.installed() and cls.__dict__["is_completed"] is not _works._is_completed
    finally:
        coll.fe.enable()
