"""Call matching for the NCCL engine: every rank must make the same calls, and NCCL checks none.

NCCL pairs the n-th collective of every rank (and the n-th send from one rank to
another with the n-th receive there) and compares nothing: ranks that call
different operations, sizes, dtypes, reductions or roots hang, or get wrong
bytes without an error. Ignis checks it without a host round trip per call.

Design:
- Each call appends its operations to a log (``OpMatcher.log``, one deque
  append on the calling thread: all it costs there). A thread per communicator
  (``ignis-nccl-match-R``) turns them into descriptors (operation, dtype, count,
  root, reduction), ships them in batches to every other rank over the checker
  mesh (the loopback transport's TCP connections, set up with the
  communicator), every few milliseconds while calls come (``_BUSY``: a message
  from a peer wakes the thread to take and compare, but it ships its own new
  calls only on that clock, or at once when asked: a gate, a peer's confirm; so
  two ranks' batches do not wake each other into a message per call, which took
  the GIL from the calling threads), run-length encoded
  (a loop of equal calls is one descriptor and a count), and compares what
  the others ship with its own, position by position, as NCCL pairs them: the
  n-th collective of each rank; the n-th send to rank q with q's n-th receive
  from this rank, and the other way.
- A difference fails the communicator on every rank (each side compares) with a
  ``CollectiveError`` of kind "mismatch" naming the other rank and both calls.
  What the mismatched call and every call after it (not yet agreed on) were to
  write is poisoned, finished or not (NCCL may complete a mismatched call with
  wrong bytes), as is what any call not known to have finished was to write;
  then NCCL is aborted (``ncclCommAbort``), which ends the kernels the mismatch
  left waiting. The device and its other arrays are untouched. It comes after
  the call was queued: a mismatched call that NCCL completes without a hang can
  be read before the failure is known (milliseconds later).
- ``synchronize()`` (so ``barrier()``) also confirms: once the stream has
  finished, it asks the ranks whose descriptors it lacks to ship what they
  logged, waits for their answers (one round trip; never for a rank to make a
  call) and compares, so a mismatched collective that NCCL completed without a
  hang raises there (it finished only once every rank had launched its half,
  which each logged before). A send that finished into the peer's buffers
  before the peer made its receive is compared when the receive comes.
- A call NCCL refuses at once (a send and a receive of other sizes: NCCL says
  "internal error") waits for the peers' halves (``settle``, two seconds at
  most) and compares, so the error names the mismatch behind the refusal.
- Rooted operations (broadcast, reduce) are gated: the engine's calling
  thread waits (``Gate``, ``wait_agreed``) until every rank's descriptors up
  to them have arrived and agree, before NCCL is called (and wakes the
  thread, so they are shipped at once). A rooted call the ranks disagree on
  never reaches NCCL: a broadcast's kernel meeting the peer's all_reduce
  kernel faults the context before an abort can stop it.
- Departures: a rank closing its communicator (or giving up after a failure)
  ships its last descriptors, then says goodbye on the mesh. Its peers then know
  which of their calls it matched: one it never made can never complete, so
  they fail at once (kind "peer_closed", or "peer_failed" for a rank that gave
  up, which also fails calls of theirs still running) instead of at the
  time-out. A connection that ends without a goodbye is a death ("peer_died").
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from .communicator import poison
from .errors import CollectiveError, CollectiveTimeoutError
from .ops import ReduceOp

if TYPE_CHECKING:
    from .communicator import Health, _Op
    from .loopback import LoopbackEngine

__all__ = ["OpMatcher", "Gate", "describe", "mismatch_error"]

_BUSY = 0.005   # seconds between looks while descriptors wait to be shipped or matched
_IDLE = 0.05    # ... and while nothing does
_KEYS = ("op", "dtype", "count", "root", "red")
_P2P = frozenset({"send", "recv"})
# By NCCL code (``_Op.red``; -1: none), as headers name them (an int key: an Enum member hashes in Python).
_RED: dict[int, str | None] = {-1: None, **{m.code: m.name.lower() for m in ReduceOp}}
_NAMES = {"op": "operation", "red": "reduction", "count": "size"}


def describe(h: dict[str, Any]) -> str:
    """A call's header as people read it: ``all_reduce(37 x float32, op=sum)``."""
    parts = [f"{h.get('count')} x {h.get('dtype')}"]
    root = h.get("root")
    if isinstance(root, int) and root >= 0:
        parts.append(f"root={root}")
    if h.get("red"):
        parts.append(f"op={h['red']}")
    return f"{h.get('op')}({', '.join(parts)})"


def mismatch_error(q: int, theirs: dict[str, Any], mine: dict[str, Any], label: str | None,
                   this_rank: int) -> CollectiveError | None:
    """The ``CollectiveError`` (kind "mismatch") for rank ``q``'s call ``theirs`` where this rank made
    ``mine`` (headers: operation, dtype, count, root, reduction), or None when they agree."""
    differ = [k for k, v in mine.items() if theirs.get(k) != v]
    if not differ:
        return None
    if "op" in differ:
        differ = ["op"]  # root and reduction follow from the operation
    return CollectiveError(
        f"rank {q} called {describe(theirs)} where this rank called {describe(mine)} (a different "
        f"{', '.join(_NAMES.get(k, k) for k in differ)}); every rank must call the same operations, in the "
        "same order, with the same dtype, size and root", op=label, rank=q, this_rank=this_rank,
        kind="mismatch", differ=differ)


class Gate:
    """A rooted call (broadcast, reduce) waiting, before NCCL is called, until every rank's
    descriptors up to it have arrived and agree (``OpMatcher.wait_agreed``): a rooted call the
    ranks disagree on never reaches NCCL."""

    __slots__ = ("matcher", "ticket", "position", "label")

    def __init__(self, matcher: "OpMatcher", ticket: int) -> None:
        self.matcher = matcher
        self.ticket = ticket              # the engine's ticket of the call
        self.position: int | None = None  # of its last collective, set when the matcher takes the call
        self.label: str | None = None

    def __repr__(self) -> str:
        return f"ignis.collective.nccl[rank {self.matcher.rank}] call check"


def _row(op: "_Op") -> tuple:
    """A call's descriptor, as ``_Op.header()`` says it (operation, dtype, count in the caller's
    elements, root, reduction), as a tuple: the matcher's unit of comparison."""
    name = op.name
    if name in _P2P:
        return ("send/recv", op.dtype, op.count // op.plan.per_element, -1, None)
    return (name, op.dtype, op.count // op.plan.per_element, op.root, _RED[op.red])


class _Channel:
    """One sequence of calls that NCCL pairs position by position with the same sequence of other
    ranks: this rank's collectives with each other rank's, or its sends to rank q with q's receives
    from it (and its receives from q with q's sends to it). Descriptors are kept and shipped
    run-length encoded (``[row, n]``: n equal calls in a row), so a loop of equal calls costs the
    matcher a few comparisons per batch, not one per call."""

    __slots__ = ("runs", "calls", "base", "theirs", "compared")

    def __init__(self, peers: list[int]) -> None:
        # This rank's calls from position ``base`` on (not yet agreed by every peer): their runs,
        # and each call's (first operation, targets) for the error's label and the poison.
        self.runs: deque[list] = deque()
        self.calls: deque[tuple[Any, tuple]] = deque()
        self.base = 0
        self.theirs: dict[int, deque[list]] = {q: deque() for q in peers}  # runs received, not compared yet
        self.compared = dict.fromkeys(peers, 0)                                # positions compared with q

    @property
    def made(self) -> int:
        """How many calls this rank made in the channel."""
        return self.base + len(self.calls)

    def add(self, row: tuple, op: Any, targets: tuple, out: list) -> None:
        """This rank made the call ``op`` (descriptor ``row``); ``out`` collects the runs to ship."""
        runs = self.runs
        if runs and runs[-1][0] == row:
            runs[-1][1] += 1
        else:
            runs.append([row, 1])
        self.calls.append((op, targets))
        if out and out[-1][0] == row:
            out[-1][1] += 1
        else:
            out.append([row, 1])

    def received(self, q: int, runs: list) -> int:
        """Rank ``q`` shipped ``runs``; returns how many calls they hold."""
        n = 0
        theirs = self.theirs[q]
        for row, k in runs:
            theirs.append([tuple(row), k])
            n += k
        return n

    def total(self, q: int) -> int:
        """How many calls of rank ``q`` arrived."""
        return self.compared[q] + sum(k for _, k in self.theirs[q])

    def agreed(self) -> int:
        """Positions below this agree with every peer."""
        return min(self.compared.values())

    def label_at(self, pos: int) -> str:
        """The label of this rank's call at ``pos`` (not yet agreed by all)."""
        return self.calls[pos - self.base][0].label

    def compare(self, rank: int) -> tuple[CollectiveError, int] | None:
        """Compare what arrived with what this rank made; the first difference and its position, if any."""
        for q, theirs in self.theirs.items():
            pos = self.compared[q]
            start = self.base
            for row, n in self.runs:
                end = start + n
                while theirs and pos < end:  # pos >= start: runs before it were passed by
                    trow, tn = theirs[0]
                    if trow != row:
                        self.compared[q] = pos
                        return mismatch_error(q, dict(zip(_KEYS, trow)), dict(zip(_KEYS, row)),
                                              self.label_at(pos), rank), pos
                    k = min(tn, end - pos)
                    pos += k
                    if k == tn:
                        theirs.popleft()
                    else:
                        theirs[0][1] = tn - k
                if not theirs:
                    break
                start = end
            self.compared[q] = pos
        low = self.agreed()
        runs, calls = self.runs, self.calls
        while self.base < low:  # agreed with everybody: forget
            drop = min(runs[0][1], low - self.base)
            if drop == runs[0][1]:
                runs.popleft()
            else:
                runs[0][1] -= drop
            for _ in range(drop):
                calls.popleft()
            self.base += drop
        return None


class OpMatcher:
    """Checks that every rank of an NCCL communicator makes the same calls (see the module docstring).

    Args:
        mesh: the checker mesh (a connected ``LoopbackEngine`` made with ``checker=True``).
        rank, world_size: this rank, and how many there are.
        health: the communicator's ``Health`` (failures go there).
        timeout: how long a gate waits for the other ranks' descriptors.
        unfinished: the label of the oldest call of this rank not known to have finished (asked
            when a peer gives up), or None.
    """

    def __init__(self, mesh: "LoopbackEngine", rank: int, world_size: int, health: "Health", timeout: float,
                 unfinished: Callable[[], str | None]) -> None:
        self.mesh = mesh
        self.rank = rank
        self.health = health
        self.timeout = timeout
        self._unfinished = unfinished
        self.peers = [q for q in range(world_size) if q != rank]
        # (operations of a call, its gate, what it writes): appended by the calling thread (the hot path)
        self.log: deque[tuple[tuple, Gate | None, tuple]] = deque()
        self._coll = _Channel(self.peers)
        self._sends = {q: _Channel([q]) for q in self.peers}   # this rank's sends to q, q's receives from it
        self._recvs = {q: _Channel([q]) for q in self.peers}   # this rank's receives from q, q's sends to it
        self._out = dict.fromkeys(self.peers, 0)   # batches shipped to q
        self._in = dict.fromkeys(self.peers, 0)    # batches taken from q
        self._final: dict[int, tuple[int, int, int]] = {}  # q -> (collectives, sends to me, receives from me) at its goodbye
        self._handled: set[int] = set()           # peers whose departure was dealt with
        self._cond = threading.Condition()        # gates wait on it
        self._work = threading.RLock()            # one cycle at a time (a failure found in one flushes)
        self._stop = False
        self._released = False                    # gates no longer wait (the communicator failed or closed)
        self._asked = 0                           # requests to ship sent by confirm()
        self._urgent = False                      # ship at the next cycle, not on the clock (wake())
        self._shipped_at = 0.0                    # time.monotonic() of the last shipment
        self._thread: threading.Thread | None = None

    # -- the calling thread ---------------------------------------------------------------
    def start(self) -> None:
        """Start the matching thread (once the communicator is up)."""
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"ignis-nccl-match-{self.rank}")
        self._thread.start()

    def wake(self) -> None:
        """Ship and match now (a gate waits), not at the next look."""
        self._urgent = True
        self.mesh.notify()

    def close(self) -> None:
        """Stop the thread, then ship what is left, so the peers know every call this rank made
        (a goodbye on the mesh should follow)."""
        self._stop = True
        self.mesh.notify()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(2.0)
        self.flush()
        self.release_gates(None)

    def flush(self) -> None:
        """Ship what was logged and not shipped yet (best effort: a peer gone hears nothing)."""
        with self._work:
            try:
                self._ship()
            except Exception:
                pass

    def confirm(self, timeout: float) -> None:
        """Compare every call the other ranks have made so far with this rank's (``synchronize()``
        asks, once the stream finished): each rank still behind is asked to ship what it logged
        and answers at once, after its descriptors; so this waits one round trip, never for a
        rank to make a call (a send, or a broadcast's root, may finish before the peer made its
        half). Returns early if the communicator fails, a rank leaves, or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self._work:
            self._cycle()
            behind = [q for q in self.peers if self._behind(q)]
        if not behind:
            return
        self._asked += 1
        ask = self._asked
        waiting = set()
        for q in behind:
            try:
                self.mesh.post(q, {"tag": "ship", "ask": ask})
                waiting.add(q)
            except CollectiveError:  # q is gone: its departure is dealt with in the cycle
                pass
        seen = 0
        while waiting and self.health.claimed is None:
            for q in list(waiting):
                hdr = self.mesh.peek(q, "shipped")
                if (hdr is not None and hdr.get("ask", 0) >= ask) or any(self.mesh.departed(q)):
                    waiting.discard(q)
            left = deadline - time.monotonic()
            if not waiting or left <= 0:
                break
            seen = self.mesh.wait_news(seen, min(left, _BUSY))
        with self._work:
            self._cycle()

    def settle(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, until every rank has made (and shipped) the calls
        matching this rank's so far, and compare them (``confirm`` until no rank is behind): a
        call NCCL refused asks this, so a mismatch behind the refusal is named even where the
        peer makes its half later. Returns early if the communicator fails or a rank behind
        leaves."""
        deadline = time.monotonic() + timeout
        while self.health.claimed is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.confirm(left)
            with self._work:
                behind = [q for q in self.peers if self._behind(q)]
            if not behind or any(any(self.mesh.departed(q)) for q in behind):
                return
            time.sleep(min(_BUSY, max(0.0, deadline - time.monotonic())))

    def _behind(self, q: int) -> bool:
        """Whether calls of this rank wait for rank ``q``'s descriptors."""
        return (self._coll.compared[q] < self._coll.made or self._sends[q].compared[q] < self._sends[q].made
                or self._recvs[q].compared[q] < self._recvs[q].made)

    # -- gates (the calling thread, before a rooted call reaches NCCL) -----------------------
    def wait_agreed(self, gate: Gate) -> None:
        """Return once every rank agrees on the calls up to ``gate``'s, or the communicator failed
        (``release_gates``; or fails now: a rank that stays silent past the time-out)."""
        deadline = time.monotonic() + self.timeout
        health = self.health
        with self._cond:
            while not self._released:
                pos = gate.position
                if pos is not None and self._coll.agreed() > pos:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    slow = min(self.peers, key=lambda q: self._coll.compared[q])
                    err: CollectiveError = CollectiveTimeoutError(
                        f"rank {slow} sent nothing for {self.timeout:g} s (the time-out); it is stuck, or it called "
                        "other operations than this rank", op=gate.label, rank=slow, this_rank=self.rank,
                        kind="timeout")
                    break
                self._cond.wait(min(left, _IDLE))
            else:
                return
        health.fail(err)

    def release_gates(self, _err: Any) -> None:
        """Let every gate go (a ``Health`` first hook, after the poison and before the abort): the
        waiting call then raises the failure without calling NCCL."""
        with self._cond:
            self._released = True
            self._cond.notify_all()

    def _wake_gates(self, _err: Any) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- the matching thread ------------------------------------------------------------------
    def _run(self) -> None:
        seen = 0
        try:
            while not self._stop:
                with self._work:
                    busy = self._cycle(self._urgent or time.monotonic() - self._shipped_at >= _BUSY)
                if self._stop:
                    return
                seen = self.mesh.wait_news(seen, _BUSY if busy else _IDLE)
        except Exception as e:  # never silently: a matcher that stopped would let mismatches through
            if not self._stop:
                err = CollectiveError(f"the call matcher stopped: {type(e).__name__}: {e}", op=self.health.oldest(),
                                      this_rank=self.rank, kind="error")
                err.__cause__ = e
                self.health.fail(err)

    def _cycle(self, ship: bool = True) -> bool:
        """Take new calls, ship them (``ship``, or when a peer asks: its answer follows them),
        take what the peers shipped, compare, see who left. Returns whether anything waits (to
        look again soon)."""
        asks = [(q, req) for q in self.peers if (req := self.mesh.take(q, "ship")) is not None]
        if ship or asks:
            self._urgent = False
            self._shipped_at = time.monotonic()
            self._ship()
        for q, req in asks:  # behind the descriptors just shipped, on the same connection
            try:
                self.mesh.post(q, {"tag": "shipped", "ask": req.get("ask", 0)})
            except CollectiveError:
                pass
        if self.health.claimed is not None:
            return False
        for q in self.peers:
            self._take(q)
        for chan in self._channels():
            found = chan.compare(self.rank)
            if found is not None:
                self._mismatch(chan, *found)
                return False
        self._wake_gates(None)
        for q in self.peers:
            if q not in self._handled:
                self._departed(q)
        err = self._beyond_final()
        if err is not None:
            self.health.fail(err)
            return False
        return bool(self.log) or any(c.calls for c in self._channels())

    def _channels(self) -> list[_Channel]:
        return [self._coll, *self._sends.values(), *self._recvs.values()]

    def _mismatch(self, chan: _Channel, err: CollectiveError, pos: int) -> None:
        """Fail the communicator for ``err``, found at ``pos`` of ``chan``. NCCL may have completed the
        mismatched call, and the calls after it, with wrong bytes (no hang, so the engine would spare
        them as finished): what each of them, and each call of the other sequences not yet agreed
        on, was to write is poisoned first."""
        for c in self._channels():
            for i, (_, targets) in enumerate(c.calls):
                if targets and (c is not chan or c.base + i >= pos):
                    poison(targets, err, self.rank)
        self.health.fail(err)

    def _ship(self) -> None:
        """Turn the calls logged since the last look into descriptors and send them."""
        coll: list[list] = []
        sends: dict[int, list[list]] = {}
        recvs: dict[int, list[list]] = {}
        log = self.log
        chan = self._coll
        while log:
            ops, gate, targets = log.popleft()
            for op in ops:
                name = op.name
                if name == "send":
                    self._sends[op.root].add(_row(op), op, targets, sends.setdefault(op.root, []))
                elif name == "recv":
                    self._recvs[op.root].add(_row(op), op, targets, recvs.setdefault(op.root, []))
                else:
                    chan.add(_row(op), op, targets, coll)
                    if gate is not None:
                        gate.label = op.label
            if gate is not None:
                with self._cond:
                    gate.position = chan.made - 1
        for q in self.peers:
            if coll or q in sends or q in recvs:
                b = self._out[q]
                self._out[q] = b + 1
                try:
                    self.mesh.post(q, {"tag": f"m{b}", "c": coll, "s": sends.get(q, []), "r": recvs.get(q, [])})
                except CollectiveError:  # q is gone: its departure is dealt with below
                    pass

    def _take(self, q: int) -> None:
        while True:
            hdr = self.mesh.take(q, f"m{self._in[q]}")
            if hdr is None:
                return
            self._in[q] += 1
            self._coll.received(q, hdr.get("c", ()))
            self._recvs[q].received(q, hdr.get("s", ()))  # q's sends to this rank
            self._sends[q].received(q, hdr.get("r", ()))  # q's receives from this rank

    def _departed(self, q: int) -> None:
        """Deal with rank ``q``'s goodbye (its descriptors all arrived before it) or death."""
        bye, eof = self.mesh.departed(q)
        if not bye and not eof:
            return
        self._handled.add(q)
        if not bye:
            self.health.peer_died(q, f"rank {q} died: its connection to this rank closed without a goodbye")
            return
        self._take(q)
        self._final[q] = (self._coll.total(q), self._recvs[q].total(q), self._sends[q].total(q))
        err = self._beyond_final()
        if err is None and isinstance(bye, str):
            # It gave up after a failure: its calls still running were aborted, and ours that
            # match them may never finish.
            label = self._unfinished()
            if label is not None:
                err = self._left(q, bye, label)
        if err is not None:
            self.health.fail(err)

    def _beyond_final(self) -> CollectiveError | None:
        """A call of this rank that a departed rank never made: it can never complete."""
        for q, (coll, sent, recvd) in self._final.items():
            bye, _ = self.mesh.departed(q)
            for chan, total in ((self._coll, coll), (self._recvs[q], sent), (self._sends[q], recvd)):
                if chan.made > total:
                    return self._left(q, bye, chan.label_at(total), total if chan is self._coll else None)
        return None

    def _left(self, q: int, bye: Any, label: str, made: int | None = None) -> CollectiveError:
        if isinstance(bye, str):
            return CollectiveError(f"rank {q} failed and left ({bye})", op=label, rank=q, this_rank=self.rank,
                                   kind="peer_failed")
        after = f" after {made} collective(s)" if made is not None else ""
        return CollectiveError(f"rank {q} has closed its communicator{after}, so this call can never complete; "
                               "every rank must call the same operations before closing", op=label, rank=q,
                               this_rank=self.rank, kind="peer_closed")
