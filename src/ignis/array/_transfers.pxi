# Part of nvarray.pyx (included there, compiled into the one module): NvArray's bytes in and
# out. Memset and fill, copies between arrays (same device, or peer to peer / staged through
# pinned host memory across devices) and copies from and to the host. Each is a tracked use
# (``begin_use`` / ``end_use``, _tracked.pxi) of every array it touches, on the stream it
# runs on; the NvArray methods (zero_, fill_, copy_, clone, write_rows, from_host, to_numpy,
# a[...] = v) check their arguments and call these.


cdef object _stream_for(NvArray a, object stream):
    """The stream work on ``a`` runs on: ``stream`` when given, else the stream a ``with
    stream:`` block of this thread made current on its device, else the array's own."""
    if stream is not None:
        return stream
    if _rt_current.overrides[0]:
        s = _rt_current.stream_override(a.device)
        if s is not None:
            return s
    return a.stream


cdef object _zero(NvArray a, object stream):
    s = _stream_for(a, stream)
    begin_use(a, s, _WRITE, "zero_", 0, -1)
    if a.nbytes:
        a.device.backend.memset_d8_async(a._ptr, 0, a.nbytes, s.handle)
    end_use(a, s, _WRITE)
    return a


cdef object _fill(NvArray a, object value, object stream, object op):
    """Every element of ``a`` set to the scalar ``value``: a memset when the element's bytes are
    all equal, else one element uploaded and doubled by device-to-device copies."""
    elem = np.array(value, dtype=a.dtype.numpy).tobytes()
    s = _stream_for(a, stream)
    backend = a.device.backend
    begin_use(a, s, _WRITE, op, 0, -1)
    try:
        if not a.nbytes:
            return a
        if elem.count(elem[0]) == len(elem):
            backend.memset_d8_async(a._ptr, elem[0], a.nbytes, s.handle)
            return a
        seed = min(a.nbytes, 4096)
        hostcopy.htod(np.frombuffer(elem * (seed // len(elem)), np.uint8), a._ptr, s)
        done = seed
        while done < a.nbytes:
            n = min(done, a.nbytes - done)
            backend.memcpy_dtod_async(a._ptr + done, a._ptr, n, s.handle)
            done += n
        return a
    finally:
        end_use(a, s, _WRITE)


cdef object _copy_into(NvArray a, object src, object stream):
    """``a.copy_(src)``: the same shape and dtype, device to device or across devices."""
    if not isinstance(src, NvArray):
        raise TypeError(f"copy_ needs an NvArray, got {type(src).__name__}")
    if src.shape != a.shape or src.dtype is not a.dtype:
        raise ValueError(f"copy_ needs the same shape and dtype: destination {a.shape} {a.dtype.name}, "
                         f"source {src.shape} {src.dtype.name}")
    s = _stream_for(a, stream)
    if src.device is a.device:
        _dtod(a, <NvArray>src, 0, s, "copy_")
    else:
        _copy_from_device(a, <NvArray>src, s)
    return a


cdef int _copy_from_device(NvArray a, NvArray src, object s) except -1:
    """``copy_`` across devices. The source's read is a tracked use on a stream of its own
    device (``ss``), the destination's write one on ``s``, and they are ordered both ways:
    the copy waits for the source's pending writes, and ``ss`` for the copy, so nothing
    queued later on the source's side writes it before it was read. Peer to peer
    (``memcpy_peer_async`` on ``s``, with this device given access to the source's) where
    the devices allow it; else staged through a pinned host buffer: device to host on
    ``ss``, host to device on ``s``."""
    ss = _stream_for(src, None)
    dev, sdev = a.device, src.device
    backend = dev.backend
    n = a.nbytes
    direct = dev.can_access_peer(sdev)
    if direct:
        dev.enable_peer_access(sdev)
    begin_use(src, ss, _READ, "copy_ to another device", 0, -1)
    try:
        begin_use(a, s, _WRITE, "copy_ from another device", 0, -1)
        try:
            if not n:
                return 0
            if direct:
                with ss.record() as ready:
                    s.wait(ready)
                backend.memcpy_peer_async(a._ptr, dev.ordinal, src._ptr, sdev.ordinal, n, s.handle)
                ss.wait(s)  # the source's use ends when the copy has run
            else:
                buf = hostcopy.pinned_pool().allocate(n)
                try:
                    backend.memcpy_dtoh_async(buf.ptr, src._ptr, n, ss.handle)
                    with ss.record() as ready:
                        s.wait(ready)
                    backend.memcpy_htod_async(a._ptr, buf.ptr, n, s.handle)
                finally:
                    buf.release(ss, s)  # reused once both copies (whichever were queued) have run
        finally:
            end_use(a, s, _WRITE)
    finally:
        end_use(src, ss, _READ)
    return 0


cdef int _dtod(NvArray a, NvArray src, object dst_offset, object s, object op) except -1:
    """``src``'s bytes into ``a`` from byte ``dst_offset`` on, on ``s`` (same device)."""
    begin_use(src, s, _READ, op, 0, -1)
    try:
        begin_use(a, s, _WRITE, op, dst_offset, src.nbytes)
        try:
            if src.nbytes:
                a.device.backend.memcpy_dtod_async(a._ptr + dst_offset, src._ptr, src.nbytes, s.handle)
        finally:
            end_use(a, s, _WRITE)
    finally:
        end_use(src, s, _READ)
    return 0


cdef object _clone(NvArray a, object stream):
    a._check_live("clone")
    s = _stream_for(a, stream)
    out = NvArray(a.shape, a.dtype, stream=s, owner=a.owner, mr=a._mr)
    _dtod(<NvArray>out, a, 0, s, "clone")
    return out


cdef object _write_rows(NvArray a, object src, object start_row, object stream):
    """``a.write_rows(src, start_row)``: rows of ``a``'s width from row ``start_row`` on."""
    if not isinstance(src, NvArray):
        raise TypeError(f"write_rows needs an NvArray, got {type(src).__name__}")
    if src.device is not a.device:
        raise ValueError(f"write_rows: source is on device {src.device.ordinal}, destination on device "
                         f"{a.device.ordinal}; copy through the host or a peer copy")
    if not a.shape or a.shape[0] == 0:
        raise ValueError(f"write_rows needs an array with rows, got shape {a.shape}")
    if src.dtype is not a.dtype:
        raise ValueError(f"write_rows: dtype {src.dtype.name} does not match {a.dtype.name}")
    row = a.shape[1:]
    if src.shape[1:] != row and src.shape != row:
        raise ValueError(f"write_rows: source of shape {src.shape} is not rows of shape {row}: it must be "
                         f"(n, {', '.join(map(str, row))}) or one row of shape {row}")
    row_bytes = a.nbytes // a.shape[0]
    if not isinstance(start_row, int) or start_row < 0:
        raise ValueError(f"start_row must be a non-negative int, got {start_row!r}")
    offset = start_row * row_bytes
    if offset + src.nbytes > a.nbytes:
        raise ValueError(f"write_rows overflow: writing {src.nbytes} bytes at row {start_row} (offset "
                         f"{offset}) exceeds the {a.nbytes}-byte buffer")
    _dtod(a, <NvArray>src, offset, _stream_for(a, stream), "write_rows")
    return a


cdef int _upload(NvArray a, object raw, object stream, object op) except -1:
    """The host bytes ``raw`` (uint8, ``a.nbytes`` of them) into ``a``."""
    s = _stream_for(a, stream)
    begin_use(a, s, _WRITE, op, 0, -1)
    try:
        hostcopy.htod(raw, a._ptr, s)
    finally:
        end_use(a, s, _WRITE)
    return 0


cdef object _to_numpy(NvArray a, object stream):
    """``a``'s values in a new NumPy array, after the copy finished (see ``NvArray.to_numpy``)."""
    s = _stream_for(a, stream)
    begin_use(a, s, _READ, "device-to-host copy", 0, -1)
    try:
        npd = a.dtype.numpy
        if a.nbytes >= hostcopy.PINNED_RESULT_MIN:
            try:
                out = hostcopy.dtoh_pinned(a._ptr, a.nbytes, npd, a.shape, s)
            finally:
                _recheck_gates(a)
            return out
        out = np.empty(a.shape, npd)
        if a.nbytes:
            a.device.backend.memcpy_dtoh_async(out.ctypes.data, a._ptr, a.nbytes, s.handle)
            try:
                s.synchronize()
            except BaseException:
                hostcopy.keep_until_done(s, out)  # the copy may still be writing into it
                _recheck_gates(a)
                raise
            _recheck_gates(a)
        return out
    finally:
        end_use(a, s, _READ)


cdef int _recheck_gates(NvArray a) except -1:
    """After a wait: a failed operation may have poisoned the bytes just read."""
    if a._gate is not None or a._base is not None:
        a._check_live("copy to the host", _READ, "device-to-host copy")
    return 0
