"""A backend's direct driver calls, as one typed capability of the backend protocol.

A backend that can reach the driver without its Python methods offers them through
``Backend.direct_calls()``: a ``DirectCalls``, or None (the emulated backend: every call
goes through its methods). The compiled hot paths take it once per backend: the memory
layer's cross-stream tracking queues its event records and stream waits through
``queue``, ``Kernel``'s launch asks ``launch_target`` and calls ``launch_fn``, and the
guard's check batches ask ``launch_target_on``, record through ``record_on`` and read
their events through ``query``.

What it holds, and the one rule of when a direct call may be made, are the backend's:

- the C entry points (functions of ``ignis.backends._cudriver`` that call the driver's
  cuEventRecord, cuStreamWaitEvent, cuLaunchKernel and cuEventQuery and return the
  CUresult; the handles are the driver's pointers) and every entry point by name
  (``entry_points``: the guard's poison under PyTorch takes cuMemsetD8Async,
  cuMemsetD32Async and cuCtxGetDevice from there, its check batches the copies and
  cuMemsetD32Async);
- the handle tables (handle -> (device record, driver object)): a handle the backend
  did not make, or destroyed, is never handed to the driver here, with one exception:
  ``launch_target_on`` and ``record_on`` take a handle outside the table on the caller's
  word that it is a framework's stream the caller holds open (adopted by its handle,
  ``Stream.from_handle``: PyTorch's and CuPy's streams under the guard), and hand it over
  as the backend's methods pass such a handle, only where the thread's current context is
  of the stream's device (the driver's answer);
- the thread's current-context record and its epoch: a call goes direct only where the
  handle's context is current on the calling thread (else the backend's method makes it
  current);
- the gates: containers that keep the direct path off while any of them is non-empty.
  ``Backend._direct_calls`` makes them from the backend's own state: its trace listeners
  (a direct call emits no trace event) and its fork marker; the fault-injecting wrapper
  adds its fault table (``with_gates``), so an armed fault fails in its method. A
  launch is not traced: its gates are the fork marker and the faults, and a
  ``kernel_launch`` set on the backend's instance (a listener, a test's stand-in) turns
  it off too. Nothing outside the backends decides from a backend's private tables.

A direct call the driver refuses is not an error here: the caller makes it again through
the backend's method, which raises the backend's error.
"""

from __future__ import annotations

from cpython.long cimport PyLong_AsVoidPtr
from libc.stdint cimport uintptr_t

__all__ = ["DirectCalls"]


cdef class DirectCalls:
    """A backend's direct driver calls (see the module).

    Args:
        backend: the backend whose methods are the way around these calls.
        streams: the backend's stream table, handle -> (device record, driver object),
            changed in place by the backend.
        events: its event table, the same way.
        current: the thread's current-context record (its ``ctx`` attribute).
        epoch: a one-item list, bumped whenever a context is made current or rebuilt (None:
            the backend keeps no epoch, and the context is asked at every call).
        gates: containers; while any is non-empty no record or wait goes direct.
        launch_gates: containers; while any is non-empty no launch goes direct.
        raw: the addresses of the C entry points for cuEventRecord, cuStreamWaitEvent and
            cuLaunchKernel (0: that call is never direct).
        entry_points: every C entry point by driver name (addresses).
    """

    def __init__(self, backend: object, streams: dict, events: dict, current: object, epoch: list | None,
                 gates: tuple, launch_gates: tuple, raw: tuple, entry_points: dict | None = None) -> None:
        if not isinstance(streams, dict) or not isinstance(events, dict):
            raise TypeError("DirectCalls: streams and events are the backend's handle tables (dicts)")
        if not (epoch is None or (isinstance(epoch, list) and len(epoch) == 1)):
            raise TypeError("DirectCalls: epoch is a one-item list, or None")
        if not (isinstance(raw, tuple) and len(raw) == 3 and all(type(a) is int and a >= 0 for a in raw)):
            raise TypeError("DirectCalls: raw is three entry point addresses (ints, 0 for none)")
        self.backend = backend
        self.own = getattr(backend, "__dict__", None)  # (an instance's dict object stays the same)
        self.streams = streams
        self.events = events
        self.current = current
        self.epoch = epoch
        self.gates = tuple(gates)
        self.launch_gates = tuple(launch_gates)
        self.entry_points = dict(entry_points or {})
        self.record_fn = <event_record_fn><uintptr_t>raw[0]
        self.wait_fn = <stream_wait_fn><uintptr_t>raw[1]
        self.launch_fn = <launch_fn><uintptr_t>raw[2]
        q = self.entry_points.get("cuEventQuery", 0)
        self.query_fn = NULL
        if type(q) is int and q > 0:
            self.query_fn = <event_query_fn><uintptr_t>q
        q = self.entry_points.get("cuCtxGetDevice", 0)
        self.ctx_device_fn = NULL
        if type(q) is int and q > 0:
            self.ctx_device_fn = <ctx_device_fn><uintptr_t>q

    @property
    def raw(self) -> tuple:
        """The addresses of the entry points for cuEventRecord, cuStreamWaitEvent, cuLaunchKernel."""
        return (<uintptr_t>self.record_fn, <uintptr_t>self.wait_fn, <uintptr_t>self.launch_fn)

    def with_gates(self, backend: object, gates: tuple, launch_gates: tuple) -> "DirectCalls":
        """The same calls, for a wrapper ``backend`` (its methods are the way around them), with
        more gates: a wrapper that must see every call while something of its own is set."""
        return DirectCalls(backend, self.streams, self.events, self.current, self.epoch,
                           (*self.gates, *gates), (*self.launch_gates, *launch_gates), self.raw, self.entry_points)

    def is_open(self) -> bool:
        """Whether no gate holds the record / wait path off now (the tables and the context
        are asked per call)."""
        return gates_open(self) and self.record_fn != NULL and self.wait_fn != NULL

    cdef int queue(self, bint wait, object h, object ev) except -2:
        """Queue on stream handle ``h`` a record of event ``ev`` (``wait``: a wait for it)
        straight to the driver: 0 done, -1 not done here (closed gate, unknown handle, another
        device's context current, a refusal: the backend's method makes the call)."""
        cdef void *e
        cdef void *st
        cdef int r
        cdef event_record_fn rec = self.record_fn
        cdef stream_wait_fn wt = self.wait_fn
        if rec == NULL or wt == NULL:
            return -1
        if not gates_open(self):  # trace listeners, armed faults, a fork marker: each one's methods must run
            return -1
        sr = self.streams.get(h)
        er = self.events.get(ev)
        if type(sr) is not tuple or type(er) is not tuple or len(<tuple>sr) != 2 or len(<tuple>er) != 2:
            return -1
        dev = (<tuple>sr)[0]
        if dev is not (<tuple>er)[0]:
            return -1
        try:
            if not ctx_is_current(&self.seen_queue, self.current, self.epoch, dev):
                return -1  # not current on this thread: the backend's method makes it current
            if type(ev) is not int or type(h) is not int:
                return -1
            e = PyLong_AsVoidPtr(ev)
            st = PyLong_AsVoidPtr(h)
        except Exception:
            return -1
        # sr / er (locals) keep the driver objects alive while the GIL is released.
        if wait:
            with nogil:
                r = wt(st, e, 0)
        else:
            with nogil:
                r = rec(e, st)
        return 0 if r == 0 else -1

    cdef int query(self, object ev) except -2:
        """Ask the driver whether the work before event ``ev``'s record is done: 1 done, 0 not
        yet, -1 not asked here (closed gate, an event not of the table, its context not
        current on this thread, any other answer: the backend's ``event_query`` asks, emits
        what its listeners hear, and raises the driver's error)."""
        cdef void *e
        cdef int r
        cdef event_query_fn fn = self.query_fn
        if fn == NULL or type(ev) is not int:
            return -1
        if not gates_open(self):  # a listener hears a True answer as a synchronization: its method must run
            return -1
        er = self.events.get(ev)
        if type(er) is not tuple or len(<tuple>er) != 2:
            return -1
        try:
            if not ctx_is_current(&self.seen_queue, self.current, self.epoch, (<tuple>er)[0]):
                return -1
            e = PyLong_AsVoidPtr(ev)
        except Exception:
            return -1
        with nogil:
            r = fn(e)
        if r == 0:
            return 1
        return 0 if r == 600 else -1  # CUDA_ERROR_NOT_READY: not yet

    cdef int record_on(self, object h, object ev, int ordinal) except -2:
        """``queue``'s record of event ``ev`` on stream handle ``h``, for a stream of device
        ``ordinal`` that may be one the backend did not make (a framework's stream it adopted,
        see ``launch_target_on``): such a handle goes to the driver only where the thread's
        current context is of that device. 0 done, -1 not done here (the backend's method
        records, and raises the driver's error)."""
        cdef void *e
        cdef void *st
        cdef int r, cur = -1
        cdef event_record_fn rec = self.record_fn
        cdef ctx_device_fn cd = self.ctx_device_fn
        if type(h) is not int or type(ev) is not int:
            return -1
        if self.streams.get(h) is not None:
            return self.queue(False, h, ev)
        if rec == NULL or cd == NULL:
            return -1
        if not gates_open(self):  # trace listeners, armed faults, a fork marker: each one's methods must run
            return -1
        er = self.events.get(ev)  # (a local: keeps the driver's event object alive while the GIL is released)
        if type(er) is not tuple or len(<tuple>er) != 2:
            return -1
        try:
            e = PyLong_AsVoidPtr(ev)
            st = PyLong_AsVoidPtr(h)
        except Exception:
            return -1
        with nogil:
            r = cd(&cur)
            if r == 0 and cur == ordinal:
                r = rec(e, st)
            else:
                r = -1
        return 0 if r == 0 else -1

    cdef bint _launch_open(self) except -1:
        """A launch may go direct as far as the backend's own state goes: an entry point, no
        launch gate closed, no ``kernel_launch`` set on the backend's instance."""
        if self.launch_fn == NULL:
            return False
        for c in self.launch_gates:
            if c:
                return False
        own = self.own
        return type(own) is dict and "kernel_launch" not in <dict>own

    cdef object launch_target(self, object h):
        """The backend's record of stream handle ``h`` (keep it while the launch runs) when a
        launch on it may go straight to the driver through ``launch_fn``: an entry point, no
        gate closed, no ``kernel_launch`` set on the backend's instance, a handle of the
        table whose context is current on this thread. None otherwise."""
        if type(h) is not int or not self._launch_open():
            return None
        sr = self.streams.get(h)
        if type(sr) is not tuple or len(<tuple>sr) != 2:
            return None
        if not ctx_is_current(&self.seen_launch, self.current, self.epoch, (<tuple>sr)[0]):
            return None
        return sr

    cdef object launch_target_on(self, object h, int ordinal):
        """``launch_target`` for a stream of device ``ordinal`` that may be one the backend did
        not make: a framework's stream it adopted (``Stream.from_handle``; PyTorch's streams
        under the guard), whose handle is not in its table; the caller holds that stream open
        (a handle of a stream closed or destroyed must not come here). Such a handle goes to the driver
        as the backend's methods pass it, and only where the thread's current context is of
        that device (the driver's answer, as the guard's poison under PyTorch asks it): a
        context of another device, or none, leaves the launch to the backend's method, which
        makes one current. Returns what to keep alive while the launch runs (the handle's
        record, or True), or None."""
        cdef int cur = -1, r
        cdef ctx_device_fn fn = self.ctx_device_fn
        if type(h) is not int:
            return None
        if self.streams.get(h) is not None:
            return self.launch_target(h)
        if fn == NULL or not self._launch_open():
            return None
        with nogil:
            r = fn(&cur)
        return True if r == 0 and cur == ordinal else None

    def __repr__(self) -> str:
        return (f"<DirectCalls of {type(self.backend).__name__}: {len(self.streams)} streams, "
                f"{len(self.events)} events, {'open' if self.is_open() else 'gated'}>")
