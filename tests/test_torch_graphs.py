"""CUDA graphs and Triton kernels under the sanitizer, without a GPU.

- The capture and replay bookkeeping, driven as the front end drives it on a GPU (what
  PyTorch's trace and the graph class's methods hand the sanitizer, with made-up addresses
  and stream handles): work queued on a capturing stream is recorded, not checked; each
  replay applies it on the replay stream; the graph's own memory is freed and reused inside
  the capture without a word; a replay after a block it uses was freed or reallocated is
  reported with the capture's, the replay's and the free's sites; a fork of the capture by an
  event captures too.
- Which arguments a Triton kernel writes: Inductor's by their names, a user's from its
  Triton IR (saved text of the IR Triton 3.6 gives for such kernels).
"""

from __future__ import annotations

import pytest

import ignis as ig
from ignis.safety.frames import capture_frames
from ignis.safety.sanitizer import MAYBE_WRITE, NO_INIT_CHECK, OUTPUT, READ, WRITE, Sanitizer
from ignis.torch._triton import UNKNOWN, ir_roles, kernel_roles

S0, S1, CAP, SIDE = 0, 0x5A00, 0x7700, 0x7800
X, W, Y, TMP, Z = 0x7F00_0000_0000, 0x7F00_0001_0000, 0x7E00_0000_0000, 0x7E00_0000_4000, 0x7F00_0002_0000
N = 4096


def acc(base: int, mode: int, n: int = N, size: int = N) -> tuple:
    return (base, size, base, base + n, 0, 0, mode)


class Graphs:
    def __init__(self) -> None:
        self.san = Sanitizer()
        self.san.mode = "collect"
        self.san.outputs_fresh = True   # as with the op observer on a GPU

    def op(self, stream: int, name: str, *items: tuple) -> None:
        self.san.foreign_access(stream, name, capture_frames(2), list(items))

    def wait_stream(self, waiter: int, other: int, event: int = 0xE0) -> None:
        self.san.on_event_record(event, other)
        self.san.on_event_wait(event, waiter)

    def capture(self):
        """x and w written on S0 before; the capture of ``y = x * w + 1`` on CAP."""
        self.op(S0, "aten::fill_.Scalar", acc(X, WRITE | OUTPUT))
        self.op(S0, "aten::fill_.Scalar", acc(W, WRITE | OUTPUT))
        self.wait_stream(CAP, S0)
        cap = self.san.capture_begin(CAP, capture_frames(1))   # the capture's site: this line
        self.op(CAP, "aten::mul.Tensor", acc(X, READ), acc(W, READ), acc(TMP, WRITE | OUTPUT))
        self.op(CAP, "aten::add.Tensor", acc(TMP, READ), acc(Y, WRITE | OUTPUT))
        self.san.extent_freed(TMP)                               # the temporary, back to the graph's pool
        assert self.san.capture_end(CAP) is cap
        return cap

    @property
    def reports(self):
        return self.san.reports


def test_captured_work_is_not_checked_then_and_a_replay_is_checked_on_its_stream():
    g = Graphs()
    cap = g.capture()
    assert g.reports == [] and g.san.checked_foreign == 2          # only the two fills ran
    g.op(S0, "aten::copy_", acc(X, WRITE))                          # new input, on the replay stream
    g.san.replay(cap, S0, capture_frames(1))
    g.op(S0, "aten::sum", acc(Y, READ))                              # the output, after the replay
    assert g.reports == []


def test_the_documented_pattern_copy_then_replay_is_silent_where_capture_time_checking_was_not():
    # The false report this replaces: copy_ on the default stream "racing" the capture's reads
    # of x on the capture stream, which never ran then.
    g = Graphs()
    cap = g.capture()
    for step in range(3):
        g.op(S0, "aten::copy_", acc(X, WRITE))
        g.san.replay(cap, S0, capture_frames(1))
        g.op(S0, "aten::item", acc(Y, READ))
    assert g.reports == []


def test_reading_the_output_on_another_stream_before_the_replay_is_ordered_is_a_race():
    g = Graphs()
    cap = g.capture()
    g.san.replay(cap, S0, capture_frames(1))
    g.op(S1, "aten::sum", acc(Y, READ))                              # no wait for the replay
    [e] = g.reports
    assert e.kind == "read-after-write race"
    assert "a replay of the CUDA graph captured at test_torch_graphs.py" in e.first["op"]


def test_a_replay_racing_a_write_of_its_input_on_another_stream():
    g = Graphs()
    cap = g.capture()
    g.wait_stream(S1, S0, 0xE5)
    g.op(S1, "aten::fill_.Scalar", acc(X, WRITE))                    # another stream rewrites x
    g.san.replay(cap, S0, capture_frames(1))                         # nothing orders the replay after it
    [e] = g.reports
    assert e.kind == "read-after-write race" and e.first["op"] == "aten::fill_.Scalar"


def test_reading_the_output_before_any_replay_reads_nothing_written():
    g = Graphs()
    g.capture()
    g.op(S0, "aten::sum", acc(Y, READ))                              # captured, never replayed: garbage
    [e] = g.reports
    assert isinstance(e, ig.UninitializedReadError) and "the capture of the CUDA graph at" in e.first["op"]


def test_a_replay_after_an_input_was_freed_is_reported_with_three_sites():
    g = Graphs()
    cap = g.capture()
    g.san.extent_freed(X)                                            # the captured input is freed
    g.op(S0, "aten::empty", acc(X, OUTPUT))                          # and its memory handed to a new tensor
    g.san.replay(cap, S0, capture_frames(1))                         # the replay line
    [e] = g.reports
    assert e.kind == "use after free by a CUDA graph replay"
    assert "reallocated to another tensor" in str(e) and "aten::empty" in str(e)
    assert 'self.op(CAP, "aten::mul.Tensor"' in e.second["capture_stack"]      # the captured op that used x
    assert e.second["captured_op"] == "aten::mul.Tensor"
    assert "g.san.replay(cap, S0" in e.second["stack"]


def test_a_replay_after_an_input_was_freed_names_the_free():
    g = Graphs()
    cap = g.capture()
    g.san.extent_freed(X)
    g.san.replay(cap, S0, capture_frames(1))
    [e] = g.reports
    assert e.kind == "use after free by a CUDA graph replay" and "which was freed since" in str(e)
    assert "g.san.extent_freed(X)" in e.first["stack"]


def test_the_graphs_own_memory_is_freed_and_reused_inside_the_capture_without_reports():
    g = Graphs()
    g.op(S0, "aten::fill_.Scalar", acc(X, WRITE | OUTPUT))
    g.wait_stream(CAP, S0)
    cap = g.san.capture_begin(CAP, capture_frames(1))
    for i in range(3):                                               # one address, three temporaries
        g.op(CAP, "aten::mul.Tensor", acc(X, READ), acc(TMP, WRITE | OUTPUT))
        g.op(CAP, "aten::add.Tensor", acc(TMP, READ), acc(Y if i == 2 else Z, WRITE | OUTPUT))
        g.san.extent_freed(TMP)
    g.san.extent_freed(Z)
    g.san.capture_end(CAP)
    g.san.replay(cap, S0, capture_frames(1))
    g.san.replay(cap, S0, capture_frames(1))
    assert g.reports == []
    assert len(cap.plan) == 5                                        # each range once


def test_a_stream_forked_into_the_capture_captures_too():
    g = Graphs()
    g.op(S0, "aten::fill_.Scalar", acc(X, WRITE | OUTPUT))
    g.wait_stream(CAP, S0)
    cap = g.san.capture_begin(CAP, capture_frames(1))
    g.san.on_event_record(0xF0, CAP)                                 # fork: SIDE waits for the capture stream
    g.san.on_event_wait(0xF0, SIDE)
    g.op(SIDE, "aten::neg", acc(X, READ), acc(Y, WRITE | OUTPUT))   # queued into the graph, not run
    g.san.on_event_record(0xF1, SIDE)                                # join
    g.san.on_event_wait(0xF1, CAP)
    g.san.capture_end(CAP)
    assert g.san.checked_foreign == 1
    g.op(SIDE, "aten::fill_.Scalar", acc(Z, WRITE | OUTPUT))         # SIDE runs eagerly again
    assert g.san.checked_foreign == 2
    g.san.replay(cap, S0, capture_frames(1))
    g.op(S0, "aten::sum", acc(Y, READ))
    assert g.reports == [] and any(it[0] == Y for it in cap.plan)


def test_a_read_of_bytes_the_graph_wrote_before_skips_the_uninitialized_check_only_for_them():
    g = Graphs()
    g.op(S0, "aten::empty", acc(X, OUTPUT))                          # x: allocated, never written
    g.wait_stream(CAP, S0)
    cap = g.san.capture_begin(CAP, capture_frames(1))
    g.op(CAP, "aten::mul.Tensor", acc(X, READ), acc(TMP, WRITE | OUTPUT))
    g.op(CAP, "aten::sum", acc(TMP, READ), acc(Y, WRITE | OUTPUT))
    g.san.capture_end(CAP)
    g.san.replay(cap, S0, capture_frames(1))
    [e] = g.reports                                                  # x is read unwritten; tmp is not
    assert isinstance(e, ig.UninitializedReadError) and e.first["op"] == "aten::empty"


# -- Triton --------------------------------------------------------------------------------------

# What Triton 3.6 gives as asm["ttir"] for a kernel that gathers X through an index I and
# stores into Y (the shape of a real kernel's IR: named parameters, loc annotations).
GATHER_TTIR = '''#loc = loc("/tmp/k.py":10:0)
module {
  tt.func public @gather_add(%X: !tt.ptr<f32> {tt.divisibility = 16 : i32} loc("X"(#loc)), %Y: !tt.ptr<f32> {tt.divisibility = 16 : i32} loc("Y"(#loc)), %I: !tt.ptr<i32> loc("I"(#loc)), %N: i32 loc("N"(#loc))) attributes {noinline = false} {
    %c256_i32 = arith.constant 256 : i32 loc(#loc1)
    %0 = tt.get_program_id x : i32 loc(#loc2)
    %1 = arith.muli %0, %c256_i32 : i32 loc(#loc3)
    %2 = tt.make_range {end = 256 : i32, start = 0 : i32} : tensor<256xi32> loc(#loc4)
    %3 = tt.splat %1 : i32 -> tensor<256xi32> loc(#loc5)
    %4 = arith.addi %3, %2 : tensor<256xi32> loc(#loc5)
    %5 = tt.splat %N : i32 -> tensor<256xi32> loc(#loc6)
    %m_4 = arith.cmpi slt, %4, %5 : tensor<256xi32> loc(#loc6)
    %i0 = tt.splat %I : !tt.ptr<i32> -> tensor<256x!tt.ptr<i32>> loc(#loc7)
    %i1 = tt.addptr %i0, %4 : tensor<256x!tt.ptr<i32>>, tensor<256xi32> loc(#loc7)
    %idx = tt.load %i1, %m_4 : tensor<256x!tt.ptr<i32>> loc(#loc8)
    %6 = tt.splat %X : !tt.ptr<f32> -> tensor<256x!tt.ptr<f32>> loc(#loc7)
    %7 = tt.addptr %6, %idx : tensor<256x!tt.ptr<f32>>, tensor<256xi32> loc(#loc7)
    %8 = tt.load %7, %m_4 : tensor<256x!tt.ptr<f32>> loc(#loc8)
    %cst = arith.constant dense<1.000000e+00> : tensor<256xf32> loc(#loc1)
    %9 = arith.addf %8, %cst : tensor<256xf32> loc(#loc9)
    %10 = tt.splat %Y : !tt.ptr<f32> -> tensor<256x!tt.ptr<f32>> loc(#loc10)
    %11 = tt.addptr %10, %idx : tensor<256x!tt.ptr<f32>>, tensor<256xi32> loc(#loc10)
    tt.store %11, %9, %m_4 : tensor<256x!tt.ptr<f32>> loc(#loc11)
    tt.return loc(#loc12)
  } loc(#loc)
} loc(#loc)
'''

# An in-place kernel whose pointer is advanced in a loop (scf.for iter_args).
LOOP_TTIR = '''module {
  tt.func public @scale_(%P: !tt.ptr<f32> loc("P"(#loc)), %N: i32 loc("N"(#loc))) attributes {noinline = false} {
    %c0 = arith.constant 0 : i32 loc(#loc1)
    %c1 = arith.constant 1 : i32 loc(#loc1)
    %0 = scf.for %i = %c0 to %N step %c1 iter_args(%p = %P) -> (!tt.ptr<f32>)  : i32 {
      %v = tt.load %p : !tt.ptr<f32> loc(#loc2)
      %w = arith.addf %v, %v : f32 loc(#loc3)
      tt.store %p, %w : !tt.ptr<f32> loc(#loc4)
      %q = tt.addptr %p, %c1 : !tt.ptr<f32>, i32 loc(#loc5)
      scf.yield %q : !tt.ptr<f32> loc(#loc6)
    } loc(#loc7)
    tt.return loc(#loc8)
  } loc(#loc)
} loc(#loc)
'''


def test_a_user_kernels_stores_and_loads_from_its_ir():
    assert ir_roles(GATHER_TTIR) == {"X": READ, "Y": WRITE, "I": READ}   # the index is read, not written
    assert kernel_roles(["X", "Y", "I", "N", "BLOCK"], GATHER_TTIR) == [READ, WRITE, READ, None, None]
    assert ir_roles(LOOP_TTIR) == {"P": READ | WRITE}


def test_inductors_kernels_by_their_argument_names():
    roles = kernel_roles(["in_ptr0", "in_out_ptr0", "out_ptr1", "xnumel", "XBLOCK"], None)
    assert roles[:3] == [READ, READ | WRITE, WRITE]


def test_a_kernel_without_readable_ir_counts_as_reading_and_maybe_writing_every_argument():
    assert kernel_roles(["a", "b"], None) == [UNKNOWN, UNKNOWN]
    assert kernel_roles(["a", "b"], "not an IR") == [UNKNOWN, UNKNOWN]
    assert UNKNOWN == READ | NO_INIT_CHECK | MAYBE_WRITE


def test_graphs_sharing_a_pool_use_each_others_memory_without_reports():
    # make_graphed_callables: the backward graph reads what the forward graph left in their
    # common pool; that memory's frees and the forward's replays that write it again are the pool's.
    g = Graphs()
    g.op(S0, "aten::fill_.Scalar", acc(X, WRITE | OUTPUT))
    g.wait_stream(CAP, S0)
    fwd = g.san.capture_begin(CAP, capture_frames(1))
    g.op(CAP, "aten::mm", acc(X, READ), acc(Y, WRITE | OUTPUT))      # an activation in the pool
    g.san.capture_end(CAP)
    bwd = g.san.capture_begin(CAP, capture_frames(1))
    g.op(CAP, "aten::mm", acc(Y, READ), acc(Z, WRITE | OUTPUT))
    g.san.capture_end(CAP)
    g.san.extent_freed(Y)                                            # dropped by Python: back to the pool
    for _ in range(2):
        g.san.replay(fwd, S0, capture_frames(1))
        g.san.replay(bwd, S0, capture_frames(1))
    g.op(S0, "aten::sum", acc(Z, READ))
    assert g.reports == []


def test_memory_a_library_allocates_and_reads_itself_is_not_an_uninitialized_read(tmp_path):
    from ignis.safety.frames import add_library_dir
    lib = tmp_path / "somelib"
    lib.mkdir()
    (lib / "warmup.py").write_text(
        "from ignis.safety.frames import capture_frames\n"
        "def op(san, stream, name, *items):\n"
        "    san.foreign_access(stream, name, capture_frames(1), list(items))\n")
    add_library_dir(str(lib))
    import importlib.util
    spec = importlib.util.spec_from_file_location("somelib_warmup", lib / "warmup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    g = Graphs()
    mod.op(g.san, S0, "aten::empty_like", acc(X, OUTPUT))            # the library's placeholder
    mod.op(g.san, S0, "aten::mm", acc(X, READ), acc(Y, WRITE | OUTPUT))  # its warm-up reads it on purpose
    assert g.reports == []
    g.san.extent_freed(X)
    g.san.foreign_access(S0, "aten::empty_like", capture_frames(1), [acc(X, OUTPUT)])  # a user's placeholder...
    mod.op(g.san, S0, "aten::mm", acc(X, READ), acc(Z, WRITE | OUTPUT))  # ...read by the library: reported
    g.op(S0, "aten::sum", acc(W, OUTPUT))
    g.op(S0, "aten::sum", acc(W, READ))                              # the user's own read of the user's: reported
    kinds = [type(e).__name__ for e in g.reports]
    assert kinds == ["UninitializedReadError", "UninitializedReadError"], g.reports


def test_memory_a_graph_trees_warm_up_allocates_into_the_pool_is_the_pools():
    # CUDA graph trees warm up outside a capture with allocations routed into the graphs' pool
    # (_cuda_beginAllocate*ToPool); a graph captured later uses that memory, which the trees free
    # and hand out again in the pool: not a replay after free.
    g = Graphs()
    g.san.pool_begin()
    g.op(S0, "aten::mm", acc(X, OUTPUT | WRITE))                     # warm-up output, in the pool
    g.san.pool_end()
    g.wait_stream(CAP, S0)
    cap = g.san.capture_begin(CAP, capture_frames(1))
    g.op(CAP, "aten::mm", acc(X, READ), acc(Y, WRITE | OUTPUT))
    g.san.capture_end(CAP)
    g.san.extent_freed(X)                                            # the trees drop it; the pool keeps it
    g.op(S0, "aten::empty", acc(X, OUTPUT))
    g.san.replay(cap, S0, capture_frames(1))
    assert g.reports == []


def test_a_triton_launch_is_the_accesses_its_ir_says_on_the_launch_stream():
    # What Triton's CompiledKernel.launch_metadata hands the front end at each launch (the kernel,
    # the raw stream handle, the arguments in the order of its arg_names), in the CPU test mode.
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from ignis.safety.sanitizer import unpack_items
    from ignis.torch._frontend import TorchFrontEnd, _bind_native

    try:
        _bind_native()  # (the launch handler alone, without enable(): its measure of tensors)
    except RuntimeError as e:
        pytest.skip(str(e))
    san = Sanitizer()
    san.mode = "collect"
    fe = TorchFrontEnd(san, device_type="cpu", stream_of=lambda t: 0x10, engine="mode")
    kernel = SimpleNamespace(name="gather_add", asm={"ttir": GATHER_TTIR},
                             src=SimpleNamespace(fn=SimpleNamespace(arg_names=["X", "Y", "I", "N", "BLOCK"])))
    x, y, idx = torch.ones(256), torch.zeros(256), torch.zeros(256, dtype=torch.int32)
    got = []
    san.foreign_access = lambda stream, op, frames, items, synced=False, library=-1: got.append(
        (stream, op, sorted((m, lo - b) for b, _, lo, _, _, _, m in
                            (unpack_items(items) if isinstance(items, bytes) else items))))
    fe._triton_launch(kernel, 0x77, (x, y, idx, 256, 256))
    fe._triton_launch(kernel, 0x77, (x, y, idx, 256, 256))           # the roles are found once
    assert got[0] == (0x77, "triton kernel gather_add", [(READ, 0), (READ, 0), (WRITE, 0)])
    assert got[1] == got[0] and len(kernel.__dict__["_ignis_roles"]) == 3


def test_a_graph_whose_capturer_keeps_its_inputs_in_place_checks_no_generation():
    g = Graphs()
    g.op(S0, "aten::fill_.Scalar", acc(X, WRITE | OUTPUT))
    g.wait_stream(CAP, S0)
    cap = g.san.capture_begin(CAP, capture_frames(1), managed=True)   # CUDA graph trees
    g.op(CAP, "aten::mm", acc(X, READ), acc(Y, WRITE | OUTPUT))
    g.san.capture_end(CAP)
    g.san.extent_freed(X)
    g.op(S0, "aten::copy_", acc(X, WRITE | OUTPUT))                    # the trees' own new input there
    g.san.replay(cap, S0, capture_frames(1))
    assert g.reports == []
