"""Fault injection (layer 0): a backend that wraps another and fails the calls a test arms.

``FaultInjectingBackend(inner)`` is a ``Backend`` that forwards every protocol
operation to ``inner``. ``inject_fault(op, nth)`` makes the ``nth`` next call
of ``op`` (a key of ``OPS``) fail with the ``DriverError`` the real driver
gives, so every error path of the layers above is testable on any backend:

.. code-block:: python

    from ignis.backends import get_backend, set_backend
    from ignis.backends.faults import FaultInjectingBackend

    backend = set_backend(FaultInjectingBackend(get_backend()))  # before any device is used
    backend.inject_fault("mem_alloc", nth=2, error="CUDA_ERROR_OUT_OF_MEMORY")

Rules:

- An injected failure is raised before ``inner`` is called, so a failed call
  changes nothing: no memory, stream, event or mapping is made, nothing is queued.
- Only the wrapper pays: the backends themselves have no fault checks. A wrapped
  operation costs one dict test and one forwarding call while nothing is armed.
- The direct driver calls (``direct_calls()``: the memory layer's event records and
  stream waits, the kernel launch, made without calling the backend's methods) are the
  inner backend's, gated by this wrapper's fault table and fork marker too
  (``DirectCalls.with_gates``), so they stay off while a fault is armed: an armed
  ``event_record``, ``stream_wait_event`` or ``kernel_launch`` fails for real, through Python.
- Capabilities, name and trace listeners are the inner backend's (a listener
  subscribed through the wrapper hears the inner backend's operations).
- Set the wrapper as the process's backend before devices are used: objects made
  on the inner backend (``Device`` is per backend) keep calling it directly.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Callable

from .base import CU_STATUS, OPS, Backend, DeviceProperties, driver_error
from .direct import DirectCalls

__all__ = ["FaultInjectingBackend"]


class FaultInjectingBackend(Backend):
    """A backend that forwards every operation to ``inner`` and fails the calls armed with
    ``inject_fault`` (see the module docstring).

    Args:
        inner: the backend that does the work (any ``Backend``; another wrapper too).

    Raises:
        TypeError: ``inner`` is not a ``Backend``.
    """

    def __init__(self, inner: Backend) -> None:
        if not isinstance(inner, Backend):
            raise TypeError(f"FaultInjectingBackend wraps an ignis Backend, got {type(inner).__name__}")
        super().__init__()
        self.inner = inner
        self.name = inner.name
        self.host_memory = inner.host_memory
        self.host_kernels = inner.host_kernels
        self.cuda_driver = inner.cuda_driver
        self.gpu_timings = inner.gpu_timings
        self._trace = inner._trace  # one listener list: the inner backend emits
        # op -> [calls until the failure, status name, failures left]
        self._faults: dict[str, list] = {}
        self._fault_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<FaultInjectingBackend over {self.inner!r}>"

    # -- fault injection -------------------------------------------------------
    def inject_fault(self, op: str, nth: int = 1, error: str = "CUDA_ERROR_OUT_OF_MEMORY",
                     times: int = 1) -> None:
        """Make the ``nth`` next call of ``op`` (and the ``times - 1`` calls after it) fail with
        ``DriverError(error)`` (detail ``"injected fault"``), without calling the inner backend.
        Arming ``op`` again replaces its earlier fault.

        Args:
            op: a key of ``OPS`` (``"mem_alloc"``, ``"memcpy_htod_async"``, ...).
            nth: which call fails, counting from 1 (the next one).
            error: a CUDA status name of ``CU_STATUS``.
            times: how many calls in a row fail.

        Raises:
            ValueError: an unknown ``op`` or ``error``, or ``nth`` / ``times`` below 1.
        """
        if op not in OPS:
            raise ValueError(f"unknown backend operation {op!r}; valid: {', '.join(sorted(OPS))}")
        if error not in CU_STATUS:
            raise ValueError(f"unknown driver status {error!r}; valid: {', '.join(CU_STATUS)}")
        if type(nth) is not int or type(times) is not int or nth < 1 or times < 1:
            raise ValueError(f"nth and times must be ints >= 1, got nth={nth!r}, times={times!r}")
        with self._fault_lock:
            self._faults[op] = [nth, error, times]

    def clear_faults(self) -> None:
        """Disarm every injected fault."""
        with self._fault_lock:
            self._faults.clear()

    def armed_faults(self) -> dict[str, tuple[int, str, int]]:
        """The faults still armed: ``op -> (calls until the next failure, status name, failures left)``."""
        with self._fault_lock:
            return {op: (e[0], e[1], e[2]) for op, e in self._faults.items()}

    def _fault(self, op: str) -> None:
        """Raise the injected error if ``op`` is armed and its turn has come (callers test
        ``if self._faults:`` first)."""
        with self._fault_lock:
            entry = self._faults.get(op)
            if entry is None:
                return
            entry[0] -= 1
            if entry[0] > 0:
                return
            status = entry[1]
            entry[2] -= 1
            if entry[2] <= 0:
                del self._faults[op]
            else:
                entry[0] = 1
        raise driver_error(status, OPS[op], "injected fault")

    # -- what is not an operation of OPS: forwarded as it is ---------------------
    def fork_unsafe(self) -> bool:
        """The inner backend's answer."""
        return self.inner.fork_unsafe()

    def mark_forked(self, parent_pid: int) -> None:
        """As ``Backend.mark_forked``; the fault lock a parent thread may have held is replaced."""
        self._fault_lock = threading.Lock()
        super().mark_forked(parent_pid)

    def direct_calls(self) -> DirectCalls | None:
        """The inner backend's direct calls, for this wrapper (its methods are the way around
        them), gated by its fault table and fork marker too: they stay off while a fault is armed."""
        dc = self.inner.direct_calls()
        if dc is None:
            return None
        return dc.with_gates(self, (self._faults, self._fast_off), (self._faults, self._fast_off))

    def device_count(self) -> int:
        """The inner backend's."""
        return self.inner.device_count()

    def device_properties(self, ordinal: int) -> DeviceProperties:
        """The inner backend's."""
        return self.inner.device_properties(ordinal)

    def versions(self) -> dict[str, str]:
        """The inner backend's."""
        return self.inner.versions()

    def set_current(self, ordinal: int) -> None:
        """The inner backend's."""
        return self.inner.set_current(ordinal)

    def host_view(self, ptr: int, nbytes: int) -> Any:
        """The inner backend's."""
        return self.inner.host_view(ptr, nbytes)

    def host_address(self, ptr: int) -> int:
        """The inner backend's."""
        return self.inner.host_address(ptr)

    def allocation_view(self, ptr: int) -> tuple[Any, int]:
        """The inner backend's."""
        return self.inner.allocation_view(ptr)

    def adopt_host_memory(self, ordinal: int, host: int, nbytes: int) -> tuple[int, bool]:
        """The inner backend's."""
        return self.inner.adopt_host_memory(ordinal, host, nbytes)

    def release_host_memory(self, ordinal: int, ptr: int) -> None:
        """The inner backend's."""
        return self.inner.release_host_memory(ordinal, ptr)


def _faulting(op: str) -> Callable[..., Any]:
    """The wrapper's ``op``: fail if an injected fault is due, else the inner backend's ``op``."""
    proto = getattr(Backend, op)

    def forward(self: FaultInjectingBackend, *args: Any, **kwargs: Any) -> Any:
        if self._faults:
            self._fault(op)
        return getattr(self.inner, op)(*args, **kwargs)

    forward.__name__ = op
    forward.__qualname__ = f"FaultInjectingBackend.{op}"
    forward.__doc__ = (f"{inspect.getdoc(proto)}\n\nThe inner backend's, unless an injected fault of "
                       f"``{op}`` is due (then nothing is forwarded).")
    forward.__signature__ = inspect.signature(proto)  # type: ignore[attr-defined]
    return forward


# Every operation of OPS, forwarded through the fault check.
for _op in OPS:
    setattr(FaultInjectingBackend, _op, _faulting(_op))
del _op
