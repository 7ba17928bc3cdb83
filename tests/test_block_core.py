"""The block's rules in one place (memory/block.pyx): its state moves only along the transition
table, checked in compiled code; its hazard record is not Python's to write; "clean on a stream"
is one test that every fast path shares; and no other module writes a block's state."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import ignis as ig
from ignis.memory import Access, BlockState
from ignis.memory.block import DeviceBlock
from ignis.memory.types import TRANSITIONS

SRC = Path(__file__).resolve().parents[1] / "src" / "ignis"


def _block(stream, state=BlockState.LIVE):
    b = DeviceBlock(0x1000, stream, 512, 500, "t", ig.Generation.next())
    if state is not BlockState.LIVE:
        b.transition(state)
    return b


@pytest.mark.parametrize("old", list(BlockState), ids=lambda s: s.name)
@pytest.mark.parametrize("new", list(BlockState), ids=lambda s: s.name)
def test_the_compiled_table_is_the_documented_one(dev, old, new):
    b = _block(dev.default_stream, old)
    if new in TRANSITIONS[old]:
        b.transition(new)
        assert b.state is new
    else:
        with pytest.raises(ig.InvalidTransitionError) as ei:
            b.transition(new)
        assert (ei.value.state, ei.value.attempted) == (old.name, new.name)
        assert b.state is old  # a refused move changes nothing


def test_a_state_that_is_not_a_block_state_is_refused(dev):
    b = _block(dev.default_stream)
    with pytest.raises(TypeError, match="BlockState"):
        b.transition("freed")
    assert b.state is BlockState.LIVE


@pytest.mark.parametrize("field", ["ptr", "alloc_stream", "bytes", "requested", "tag", "generation", "state"])
def test_a_blocks_fields_are_read_only_from_python(dev, field):
    b = _block(dev.default_stream)
    before = getattr(b, field)
    with pytest.raises(AttributeError):
        setattr(b, field, BlockState.FREED if field == "state" else 0)
    assert getattr(b, field) == before and type(getattr(b, field)) is type(before)


def test_a_blocks_sizes_generation_and_state_are_c_fields(dev):
    # C-typed (block.pxd): each read makes the value; a value a C field cannot hold is refused
    # when the block is made, not later.
    b = _block(dev.default_stream)
    assert (b.bytes, b.requested) == (512, 500) and type(b.generation) is int and b.generation > 0
    assert b.state is BlockState.LIVE
    b.transition(BlockState.RETIRED)
    assert b.state is BlockState.RETIRED
    with pytest.raises(OverflowError):
        DeviceBlock(0x2000, dev.default_stream, 512, 512, "t", -1)
    with pytest.raises(TypeError):
        DeviceBlock(0x2000, dev.default_stream, "512", 512, "t", ig.Generation.next())
    for not_a_stream in (dev.default_stream.handle, None):  # the streams are typed Stream fields
        with pytest.raises(TypeError, match="Stream|alloc_stream"):
            DeviceBlock(0x2000, not_a_stream, 512, 512, "t", ig.Generation.next())


def test_the_hazard_record_is_not_an_attribute(dev):
    b = _block(dev.default_stream)
    for name in ("_write_stream", "_write_event", "_readers"):
        assert not hasattr(b, name)
        with pytest.raises(AttributeError):
            setattr(b, name, None)


def test_a_new_block_is_clean_on_its_stream_only(dev):
    s0, s1 = dev.default_stream, dev.create_stream()
    b = _block(s0)
    assert b.clean_on(s0) and not b.clean_on(s1)
    assert b.hazard_record() == (s0, 0, None)


def test_the_record_shown_is_a_copy(dev, streams):
    mr = ig.PoolResource(ig.DirectResource(dev))
    b = mr.allocate(1024, streams[0])
    mr.prepare_block_use(b, streams[1], Access.READ)
    mr.finish_block_use(b, streams[1], Access.READ)
    writer, _, readers = b.hazard_record()
    assert writer is streams[0] and set(readers) == {streams[1]}
    readers.clear()
    assert set(b.hazard_record()[2]) == {streams[1]}  # the block's own record is untouched
    assert not b.clean_on(streams[0])
    mr.deallocate(b)
    assert b.state is BlockState.RETIRED and b.hazard_record() == (None, 0, None)


def test_a_lent_record_is_never_clean(dev, streams):
    b = _block(streams[0])
    b.lend_record()
    assert not any(b.clean_on(s) for s in streams)
    assert b.hazard_record()[0] is None


def test_a_guarded_block_lends_its_record_to_the_upstream_block(dev, streams):
    g = ig.DebugGuardResource(ig.PoolResource(ig.DirectResource(dev)))
    b = g.allocate(256, streams[0])
    try:
        assert not b.clean_on(streams[0])  # every tracked use goes through the guard to the pool's block
    finally:
        g.deallocate(b)


# -- no other writer ------------------------------------------------------------------------------

# Assignments to an attribute named ``state`` that are not a block's (the device's state, the
# event pool's): each named by its file and its text.
_NOT_A_BLOCK = {
    ("runtime/device.py", "dev.state = DeviceState(ordinal)"),
    ("memory/resource.pyx", "self.state = device.state"),
    # the device state a pool or a guard keeps, and the reference checker's weak reference
    ("memory/pool.pyx", "self._state = self.device.state"),
    ("memory/guard_base.pyx", "self._state = self.device.state"),
    ("safety/gpuref.py", "self._state = weakref.ref(state)"),
}
_HAZARD = re.compile(r"\b_(write_stream|write_event|readers)\b")


def _sources():
    for p in sorted(SRC.rglob("*")):
        if p.suffix in (".py", ".pyx", ".pxd", ".pxi") and "__pycache__" not in p.parts:
            yield p.relative_to(SRC).as_posix(), p.read_text()


def test_only_the_block_writes_a_blocks_state():
    found = []
    for rel, text in _sources():
        if rel in ("memory/block.pyx", "memory/block.pxd"):
            continue
        for line in text.splitlines():
            code = line.split("#", 1)[0].strip()
            if re.search(r"\._?state\s*=(?!=)", code) and (rel, code) not in _NOT_A_BLOCK:
                found.append(f"{rel}: {code}")
    assert not found, "a block's state moves only through block_move / DeviceBlock.transition:\n" + "\n".join(found)


def test_the_hazard_record_is_touched_by_the_block_and_the_tracking_resource_only():
    owners = {"memory/block.pyx", "memory/block.pxd", "memory/resource.pyx"}
    found = [rel for rel, text in _sources() if rel not in owners and _HAZARD.search(text)]
    assert not found, f"the hazard record's fields are read or written outside the block's core: {found}"


def _record_writes(text):
    """The lines of ``text`` that change a hazard record: an assignment to one of its fields, or
    a change of the readers' dict, through the field or a local bound to it."""
    names = {"_readers"} | set(re.findall(r"\b(\w+)\s*=\s*(?:<dict>)?\(?\w+\._readers\b", text))
    alias = "|".join(sorted(re.escape(n) for n in names))
    change = re.compile(r"\._(write_stream|write_event|readers)\s*=(?!=)"
                        rf"|\b(?:{alias})\s*\[[^\]]*\]\s*=(?!=)"
                        rf"|\b(?:{alias})\.(?:pop|popitem|clear|update|setdefault)\("
                        rf"|\bdel\s+\w*\.?(?:{alias})\b")
    return [line.strip() for line in text.splitlines() if change.search(line.split("#", 1)[0])]


def test_only_the_block_writes_its_hazard_record():
    # The tracking resource reads the record (to decide the waits) and records the events; the
    # record itself changes only through block.pxd's functions (note, keep, drop, lend, restore).
    found = [f"{rel}: {line}" for rel, text in _sources() if rel not in ("memory/block.pyx", "memory/block.pxd")
             for line in _record_writes(text)]
    assert not found, "the hazard record is written outside block.pxd:\n" + "\n".join(found)


def test_the_record_write_finder_sees_each_kind_of_change():
    # what the check above looks for, as the old tracking resource wrote it
    assert _record_writes("    rd = b._readers\n    for o, ev in rd.items():\n        rd[o] = wait(o, ev)\n")
    assert _record_writes("    b._readers[s] = ev\n") and _record_writes("    b._write_event = ev\n")
    assert _record_writes("    rd = <dict>b._readers\n    rd.pop(s)\n") and _record_writes("    del b._readers[s]\n")
    assert not _record_writes("    rd = b._readers\n    for o, ev in rd.items():\n        keep(b, o, ev)\n")
    assert not _record_writes("    if b._readers is None and x == 1:\n        pass\n")


def test_clean_is_written_once():
    rule = re.compile(r"_write_stream is \w+ and not \w+\._write_event and \w+\._readers is None")
    where = [rel for rel, text in _sources() if rule.search(text)]
    assert where == ["memory/block.pxd"], where


# -- the hook slots (memory/hooks.pyx) -------------------------------------------------------------

class _Seen:
    def __init__(self):
        self.calls = []

    def access(self, block, stream, access, span):
        self.calls.append(("access", block.ptr, access))

    def free(self, block):
        self.calls.append(("free", block.ptr))


def test_a_checker_installed_by_its_function_is_called_by_the_compiled_paths(dev):
    from ignis.memory import hooks, ordering
    seen = _Seen()
    prev = hooks.set_checker(seen)
    try:
        assert ordering.checker is seen and hooks.HOOKS.checker is seen
        a = ig.empty(256, dtype="uint8", mr=ig.PoolResource(ig.DirectResource(dev)))
        ptr = a._block.ptr
        a.fill_(1)  # NvArray's tracked use (compiled)
        a.free()    # the pool's deallocate (compiled)
        assert ("free", ptr) in seen.calls
        assert any(c[0] == "access" and c[1] == ptr and c[2].writes for c in seen.calls)
    finally:
        assert hooks.set_checker(prev) is seen
    assert ordering.checker is prev


def test_the_memory_layer_is_the_one_that_feeds_the_checker(dev, streams):
    """A use of an array of a resource that does not track reaches the checker through the
    resource (``note_use``), as a tracked use does through ``prepare_block_use``: no module
    above the memory layer calls the checker's ``access``."""
    from ignis.memory import hooks
    seen = _Seen()
    mr = ig.DirectResource(dev)
    a = ig.empty(256, dtype="uint8", mr=mr, stream=streams[0])
    prev = hooks.set_checker(seen)
    try:
        a.fill_(1)
    finally:
        hooks.set_checker(prev)
    assert any(c[0] == "access" and c[1] == a.block.ptr and c[2].writes for c in seen.calls)
    n = len(seen.calls)
    mr.note_use(a.block, streams[0], Access.WRITE)  # no checker installed now: nothing heard
    assert len(seen.calls) == n
    a.free()
    calls = re.compile(r"\b(chk|checker|_HK\.checker|HOOKS\.checker)\.access\(")
    above = [rel for rel, text in _sources() if calls.search(text) and not rel.startswith("memory/")]
    assert not above, above


def test_hooks_refuse_what_they_cannot_call():
    from ignis.memory import hooks
    with pytest.raises(TypeError, match="access"):
        hooks.set_checker(object())
    with pytest.raises(TypeError, match="callable"):
        hooks.set_recorder(42)
    assert hooks.HOOKS.checker is None or hasattr(hooks.HOOKS.checker, "access")
    for name in ("checker", "recorder", "any_manual"):
        with pytest.raises(AttributeError):
            setattr(hooks.HOOKS, name, None)


def test_manual_ordering_turns_the_switch_on_for_the_compiled_readers(dev):
    from ignis.memory import hooks, ordering
    s = dev.create_stream()
    ordering.set_ordering("manual", s)
    try:
        assert hooks.HOOKS.any_manual and ordering.any_manual
        assert ordering.policy(s) == "manual" and ordering.policy(dev.default_stream) == "auto"
    finally:
        ordering.set_ordering(None, s)


def test_no_module_reaches_a_hook_through_a_module_dict_or_assigns_it():
    bound = re.compile(r"\b_?(ord|ordering|history|hist|backends|current)\w*\.__dict__|"
                       r"\b(ordering|_ord|history|_history)\.(checker|recorder|any_manual)\s*=(?!=)")
    found = [f"{rel}: {m.group(0)}" for rel, text in _sources() for m in bound.finditer(text)]
    assert not found, found


def test_a_new_current_resource_reaches_the_next_array_at_once(dev):
    from ignis.memory import set_current_resource
    ig.empty(16).free()  # the defaults are cached now
    mine = ig.PoolResource(ig.DirectResource(dev))
    set_current_resource(mine, dev)
    try:
        a = ig.empty(16)
        assert a.resource is mine
        a.free()
    finally:
        set_current_resource(None, dev)  # the default again (made afresh on first use)
    b = ig.empty(16)
    assert b.resource is not mine
    b.free()


def test_change_listeners_take_functions_only():
    from ignis import backends
    from ignis.memory import current
    with pytest.raises(TypeError, match="function"):
        backends.on_backend_change(42)
    with pytest.raises(TypeError, match="function"):
        current.on_resource_change("x")


def test_the_names_that_read_the_hooks_refuse_assignment():
    from ignis.memory import history, ordering
    with pytest.raises(AttributeError, match="set_checker"):
        ordering.checker = object()
    with pytest.raises(AttributeError, match="set_ordering"):
        ordering.any_manual = False
    with pytest.raises(AttributeError, match="set_recorder"):
        history.recorder = print
    assert history.recorder is None or callable(history.recorder)


def test_a_record_is_lent_only_before_any_use(dev, streams):
    mr = ig.PoolResource(ig.DirectResource(dev))
    b = mr.allocate(256, streams[0])
    mr.prepare_block_use(b, streams[1], Access.WRITE)
    mr.finish_block_use(b, streams[1], Access.WRITE)
    before = b.hazard_record()
    with pytest.raises(ValueError, match="uses in its own record"):
        b.lend_record()
    assert b.hazard_record() == before  # the write on streams[1] is not forgotten
    mr.deallocate(b)


def test_the_stack_capture_slot_is_the_safety_layers_walker():
    """The memory layer takes allocation sites through its hook slot, which ``ignis.safety.frames``
    fills at import: the same frames as the walker's own capture, formatted by it."""
    from ignis.memory import hooks
    from ignis.safety import frames
    here, walked = hooks.capture_stack(1, 8), frames.capture_frames(1, 8)
    assert here and [code for code, _ in here] == [code for code, _ in walked]  # the same frames
    assert here[0][1] == walked[0][1] and here[1:] == walked[1:]  # this line (one for both), the same callers
    text = hooks.format_stack(here)
    assert "test_the_stack_capture_slot_is_the_safety_layers_walker" in text and "test_block_core.py" in text
    assert hooks.format_stack(()) is None and hooks.format_stack(None) is None
