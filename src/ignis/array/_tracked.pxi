# Part of nvarray.pyx (included there, compiled into the one module): the tracked use of an
# array, the one path every touch of its bytes takes.
#
# - ``begin_use`` / ``end_use`` (declared in nvarray.pxd for launch.pyx): check the array, queue
#   the waits a use needs and have the sanitizer check the bytes; record the use after. On a
#   resource that tracks, the block's rules are the memory layer's (``block_clean_on``, the
#   resource's ``prepare_block_use`` / ``finish_block_use``, called as C when no subclass
#   overrides them); on one that cannot, work is allowed on the block's own stream only.
# - ``TrackedUse``: the ``with`` block of ``NvArray.use``.
# - ``_TrackedAccess``: the ``with`` block of ``NvArray.access`` / ``access_all``: check every
#   array, acquire each root for the owner (all or nothing), begin each use; on exit record them
#   and give the arrays back.

cdef Hooks _HK = _HOOKS  # the hook slots (memory/hooks.pyx), read as C fields
cdef dict _PLAIN = {}  # resource type -> it keeps TrackedResource's prepare / finish_block_use


cdef inline bint _direct(object mr) except -1:
    """``mr``'s prepare / finish_block_use are TrackedResource's own (no subclass or instance
    overrides them): the compiled callers may call their compiled bodies directly."""
    cls = type(mr)
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = _PLAIN[cls] = issubclass(cls, TrackedResource) \
            and cls.prepare_block_use is TrackedResource.prepare_block_use \
            and cls.finish_block_use is TrackedResource.finish_block_use
    # an adaptor sets its upstream's methods on itself
    return plain and not_on_instance(mr, "prepare_block_use") and not_on_instance(mr, "finish_block_use")


cdef inline bint _clean_on(object block, object stream) noexcept:
    """``block`` is clean on ``stream`` (the block's rule, ``block_clean_on``): a use needs no
    wait or record. Anything but a DeviceBlock takes the resource's path."""
    return type(block) is _Block and block_clean_on(<_Block>block, stream)


cdef inline bint _stream_ok(object stream) except -1:
    """``stream`` is open and of the device's current generation (its handle may reach the driver)."""
    cdef _Stream s
    if type(stream) is _Stream:
        s = <_Stream>stream
        return not s._closed and s._generation == s.device.state.generation
    return not stream._closed and stream._generation == stream.device.state.generation


cdef int begin_use(NvArray arr, object stream, object access, object op, Py_ssize_t off,
                   Py_ssize_t n) except -1:
    if not _plain_on(arr, stream):
        arr._check_live("use", access, op)
    chk = _HK.checker
    block = arr._block
    if arr._tracks:  # prepare_block_use refuses a closed or stale stream itself
        if chk is None:
            if _clean_on(block, stream) and _stream_ok(stream):
                return 0
            mr = arr._mr
            if type(stream) is _Stream and _direct(mr):
                (<TrackedResource>mr)._prepare_c(block, <_Stream>stream, access, None)
            else:
                mr.prepare_block_use(block, stream, access)
        else:
            arr._mr.prepare_block_use(block, stream, access,
                                      (arr._ptr - block.ptr + off, arr.nbytes if n < 0 else n, op))
        return 0
    if not _stream_ok(stream):
        stream._check()  # a closed or stale stream's handle must not reach the driver
    if block is not None and stream is not block.alloc_stream:
        raise StreamMisuseError(
            f"NvArray#{arr.id} lives in a {type(arr._mr).__name__}, which cannot track cross-stream "
            f"uses, so it can only be used on its own stream #{block.alloc_stream.id} "
            f"(asked: stream #{stream.id}); allocate it from a PoolResource or AsyncResource")
    if chk is not None and block is not None:  # the memory layer tells the sanitizer (one place)
        arr._mr.note_use(block, stream, access, (arr._ptr - block.ptr + off, arr.nbytes if n < 0 else n, op))
    return 0


cdef int end_use(NvArray arr, object stream, object access) except -1:
    if arr._tracks:
        b = arr._block
        if _clean_on(b, stream):
            return 0  # clean on this stream: nothing to record
        mr = arr._mr
        if _direct(mr):
            (<TrackedResource>mr)._finish_c(b, stream, access)
        else:
            mr.finish_block_use(b, stream, access)
    return 0


cdef class TrackedUse:
    """The ``with`` block of ``NvArray.use``: the use begun on entry (its waits queued,
    the sanitizer's check), recorded on exit, also when the block raised."""

    cdef readonly NvArray array
    cdef readonly object stream
    cdef readonly object access

    def __enter__(self) -> int:
        a = self.array
        begin_use(a, self.stream, self.access, "use()", 0, -1)
        return a._ptr

    def __exit__(self, *exc: object) -> None:
        end_use(self.array, self.stream, self.access)

    def __repr__(self) -> str:
        return f"<use of NvArray#{self.array.id} ({self.access.name.lower()}) on stream #{self.stream.id}>"


cdef _TrackedAccess _tracked_access(list uses, object stream, object by, object op, bint finish_on_error,
                                    bint single):
    """A ``_TrackedAccess`` made without a Python call (``access`` / ``access_all``)."""
    cdef _TrackedAccess t = _TrackedAccess.__new__(_TrackedAccess)
    t._init(uses, stream, by, op, finish_on_error, single)
    return t


def _check_stream(stream: Any) -> Stream:
    if not isinstance(stream, Stream):
        raise TypeError(f"stream must be an ignis.Stream, got {type(stream).__name__}")
    return stream


cdef bint _hold(NvArray root, str by) except -1:
    """Take ``root`` (and its views) for ``by`` for one tracked-access block, as
    ``contract.acquire`` does (under the array's lock, which every change of owner takes),
    when it is free to take: live, the default owner's and not shared. False when it is
    not: then ``contract.acquire`` decides, and raises what is wrong. Tracked for
    ``contract.audit()`` as an acquire is."""
    cdef ResourceLock lk = _stripe(root)
    changed = None
    lock_take(lk)
    try:
        if root._freed is not False or root.owner != DEFAULT_OWNER or root.ref_count > 1:
            return False
        if root._views:
            changed = root._set_owner(by)
        else:
            root.owner = by
    finally:
        lock_give(lk)
    if changed is None:
        contract.track(root)
    else:
        for a in changed:
            contract.track(a)
    return True


cdef int _release_held(list roots, object by) except -1:
    """Give back what a block holds (``contract.release``, for the roots ``by`` still holds:
    nothing in the block handed them on)."""
    cdef ResourceLock lk
    cdef NvArray r
    cdef Py_ssize_t i
    for i in range(len(roots) - 1, -1, -1):
        r = <NvArray>roots[i]
        lk = _stripe(r)
        lock_take(lk)
        try:
            if r.owner == by:
                if r._views:
                    r._set_owner(DEFAULT_OWNER)
                else:
                    r.owner = DEFAULT_OWNER
        finally:
            lock_give(lk)
    return 0


cdef inline bint _is_in(list held, object r):
    """``r`` is one of ``held`` (by identity: NvArray refuses ``==``)."""
    for x in held:
        if x is r:
            return True
    return False


cdef class _TrackedAccess:
    """The ``with`` block of ``NvArray.access`` / ``NvArray.access_all``: check, acquire,
    prepare on entry; record, release on exit (see ``NvArray.access``). Entered once."""

    def __init__(self, uses: list, stream: Stream, by: str | None, op: str, finish_on_error: bool,
                 single: bool) -> None:
        self._init(uses, stream, by, op, finish_on_error, single)

    cdef int _init(self, list uses, object stream, object by, object op, bint finish_on_error,
                   bint single) except -1:
        self.uses = uses
        self.stream = stream
        self.by = by
        self.op = op
        self.finish_on_error = finish_on_error
        self.single = single
        self.held = []
        self.begun = []
        self.entered = False
        return 0

    def __repr__(self) -> str:
        arrays = ", ".join(f"NvArray#{a.id} {acc.name.lower() if acc else 'held'}" for a, acc, _, _ in self.uses)
        return f"<tracked access ({self.op}) by {self.by!r} on stream #{self.stream.id}: {arrays}>"

    def __enter__(self) -> Any:
        return self.enter()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self.exit(exc_type is None)
        return False

    cpdef enter(self):
        """What ``__enter__`` does, for a caller that holds the block without ``with`` (the
        collective enqueue path, where the protocol's two method lookups cost more than the
        block): check, acquire, prepare; the device address (``access``) or the list of them
        (``access_all``). Pair it with ``exit``."""
        cdef NvArray a, r
        cdef tuple use
        cdef set roots
        if self.entered:
            raise RuntimeError(f"{self!r} was already entered; call access() again for another block")
        self.entered = True
        uses, by, op, s = self.uses, self.by, self.op, self.stream
        for use in uses:  # (1) every array may be touched, by this owner
            a = <NvArray>use[0]
            if not _plainly_usable(a):
                a._check_live("use", use[1], op)
            if by == DEFAULT_OWNER:
                owner = _root_of(a).owner
                if owner != DEFAULT_OWNER:
                    raise MemoryContractViolation(
                        f"NvArray#{a.id} is held by {owner!r}; {DEFAULT_OWNER!r} cannot access it ({op}) until "
                        f"{owner!r} releases it", array_id=a.id, owner=owner, caller=by)
        held = self.held
        if by is not None and by != DEFAULT_OWNER:  # (2) acquire each root once, all or nothing
            many = len(uses) > 8  # a few: compared one by one; many: a set of ids
            roots = set() if many else None
            try:
                for use in uses:
                    a = <NvArray>use[0]
                    r = _root_of(a)
                    if (id(r) not in roots) if many else not _is_in(held, r):
                        if not _hold(r, by):
                            contract.acquire(a, by)
                        if many:
                            roots.add(id(r))
                        held.append(r)
            except BaseException:
                _release_held(held, by)
                held.clear()
                raise
        begun = self.begun
        try:  # (3) prepare each use, in order
            for use in uses:
                acc = use[1]
                if acc is not None:
                    a = <NvArray>use[0]
                    begin_use(a, s, acc, op, use[2], use[3])
                    begun.append((a, acc))
        except BaseException:
            self._finish(self.finish_on_error)
            raise
        if self.single:
            use = uses[0]
            return (<NvArray>use[0])._ptr + use[2]
        return [(<NvArray>use[0])._ptr + use[2] for use in uses]

    cpdef exit(self, bint ok):
        """What ``__exit__`` does, after ``enter``: ``ok`` (the block ran to its end) records the
        uses, as does a block that raised when ``finish_on_error``; then the arrays are released.
        A second ``exit`` does nothing; one before ``enter`` is refused."""
        if not self.entered:
            raise RuntimeError(f"{self!r}: exit() before enter()")
        self._finish(ok or self.finish_on_error)

    cdef int _finish(self, bint record) except -1:
        """(4) record the uses begun (when ``record``), (5) release what was acquired."""
        cdef NvArray a
        begun, held = self.begun, self.held
        if begun is None:
            return 0  # finished already
        self.begun = self.held = None
        try:
            if record:
                s = self.stream
                for a, acc in begun:
                    end_use(a, s, acc)
        finally:
            if held:
                _release_held(held, self.by)
        return 0
