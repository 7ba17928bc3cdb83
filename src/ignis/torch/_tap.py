"""A method of a PyTorch class, wrapped while something listens to it.

``MethodTap(owner, name, call)`` replaces the method ``name`` of the class ``owner()``
(once, for every listener) by a wrapper whose call ``obj.name(*args)`` returns
``call(original, listeners, obj, *args)``. ``add(fn)`` installs it with the first
listener; ``remove(fn)`` gives the class its own method back when the last one leaves
(an inherited method shows through again). Where the class is missing or the method
cannot be replaced, nothing is installed and ``add`` returns False.

PyTorch's device-generic ``torch.Event`` and ``torch.Stream`` are immutable types of its C
extension: ``setattr`` refuses to replace their methods. For such a type the wrapper goes
into the type's own attribute dictionary (the one ``cls.__dict__`` is a read-only view of),
where ``setattr`` would have put it, and the interpreter's caches of the type's attributes
are invalidated (``PyType_Modified``); ``remove`` puts the type's own method back the same
way.

``_works`` (``Work.is_completed``), ``_queries`` (``Event.query``, ``Stream.query``) and
``_storage`` (``UntypedStorage.resize_``) are its users; ``when_true`` is the call of the
first two (a question whose True answer the listeners hear of).
"""

from __future__ import annotations

import ctypes
import gc
from typing import Any, Callable

__all__ = ["MethodTap", "when_true"]

_IMMUTABLE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE


def _type_attrs(cls: type) -> dict:
    """The dictionary the attributes of ``cls`` are looked up in (``cls.__dict__`` is a
    read-only view of it)."""
    for d in gc.get_referents(cls.__dict__):
        if type(d) is dict:
            return d
    raise TypeError(f"the attributes of {cls.__qualname__} are not kept in a dictionary")


def _set_attr(cls: type, name: str, value: Any) -> None:
    """``setattr(cls, name, value)`` (``value`` None: ``delattr``), also for an immutable type
    of an extension (see the module)."""
    if not cls.__flags__ & _IMMUTABLE:
        if value is None:
            delattr(cls, name)
        else:
            setattr(cls, name, value)
        return
    attrs = _type_attrs(cls)
    if value is None:
        attrs.pop(name, None)
    else:
        attrs[name] = value
    modified = ctypes.pythonapi.PyType_Modified
    modified.argtypes, modified.restype = [ctypes.py_object], None
    modified(cls)


def when_true(original: Any, listeners: list, obj: Any, *args: Any) -> Any:
    """A ``MethodTap`` call for a method that answers a question: ``obj.method(*args)`` as it
    is, and each listener told ``fn(obj)`` when the answer is True. A False answer tells
    nobody anything."""
    answer = original(obj, *args)  # (arguments: PyTorch's to refuse, with its own message)
    if answer:
        for fn in list(listeners):
            fn(obj)
    return answer


class MethodTap:
    """One method of one class, wrapped for a list of listeners (see the module docstring)."""

    def __init__(self, owner: Callable[[], Any], name: str, call: Callable[..., Any]) -> None:
        self._owner = owner
        self._name = name
        self._call = call
        self._own: Any = None        # the class's own attribute before the wrapper (None: inherited)
        self.listeners: list[Callable[..., Any]] = []
        self.original: Any = None    # the method the wrapper calls, while installed
        tap = self

        def wrapper(obj: Any, *args: Any) -> Any:
            return tap._call(tap.original, tap.listeners, obj, *args)

        wrapper.__name__ = wrapper.__qualname__ = name
        self.wrapper = wrapper

    def add(self, fn: Callable[..., Any]) -> bool:
        """Add a listener, installing the wrapper with the first; returns whether it is installed."""
        if self.original is None:
            cls = self._owner()
            if cls is None:
                return False
            original = getattr(cls, self._name, None)
            if original is None:
                return False
            own = cls.__dict__.get(self._name)
            try:
                _set_attr(cls, self._name, self.wrapper)
            except (TypeError, AttributeError):
                return False
            self._own, self.original = own, original
        if fn not in self.listeners:
            self.listeners.append(fn)
        return True

    def remove(self, fn: Callable[..., Any]) -> None:
        """Forget a listener; the last one gone, the class has its own method again."""
        if fn in self.listeners:
            self.listeners.remove(fn)
        if not self.listeners and self.original is not None:
            cls = self._owner()
            if cls is not None and cls.__dict__.get(self._name) is self.wrapper:
                _set_attr(cls, self._name, self._own)
            self.original = self._own = None

    def installed(self) -> bool:
        """Whether the wrapper is installed now."""
        return self.original is not None
