cimport cython


# NvArray's fields, typed for the compiled callers (launch.pyx, the tracked use). The
# descriptive ones are readable and writable from Python; the private state (pointer,
# block, resource, lifecycle, views, gate, exports) is readable only: NvArray's own code,
# compiled, is its one writer (the layers above use the public tracked-access API).

cdef class NvArray:
    cdef readonly object id, shape, dtype, device, stream, owner, ref_count, created_at, numel, nbytes
    cdef readonly object _ptr          # the device address of byte 0
    cdef readonly object _block        # the DeviceBlock the bytes live in (a view: its root's), or None
    cdef readonly object _mr           # the resource the block came from (None for foreign memory)
    cdef readonly object _tracks       # the resource tracks cross-stream uses of the block
    cdef readonly object _freed        # True once freed (or while the constructor has no memory yet)
    cdef readonly object _base         # the parent of a view
    cdef readonly object _views        # weak references to this array's views, once it has any
    cdef readonly object _pinned       # the host staging buffer of pin()
    cdef readonly object _keepalive    # the producer of adopted foreign memory
    cdef readonly object _gate         # what every access must pass first: read-only memory, or a failed write
    cdef readonly object _exports      # live exports: weak references to DLPack export tokens, and _CAI
    cdef dict __dict__
    cdef object __weakref__

    cdef int _allocate(self, shape, dtype, device, stream, owner, mr, tag) except -1


# The tracked use of an array, for the compiled callers (array/launch.pyx): begin_use
# checks the array and queues the waits (the sanitizer checks bytes [off, off + n), n < 0:
# all); end_use records the use. A use clean on its stream costs neither.
cdef int begin_use(NvArray arr, object stream, object access, object op, Py_ssize_t off,
                   Py_ssize_t n) except -1
cdef int end_use(NvArray arr, object stream, object access) except -1


# A tracked-access block (the ``with`` of ``NvArray.access`` / ``access_all``), for compiled
# callers that hold one without the ``with`` protocol (the collective enqueue path): made by
# ``access_block`` (``access_all``'s arguments by position), then ``enter()`` and ``exit(ok)``.
@cython.final
cdef class _TrackedAccess:
    cdef list uses       # [(array, Access or None (held only), offset, nbytes)]
    cdef object stream
    cdef object by
    cdef object op
    cdef bint finish_on_error, single, entered
    cdef list held, begun

    cdef int _init(self, list uses, object stream, object by, object op, bint finish_on_error,
                   bint single) except -1
    cpdef enter(self)
    cpdef exit(self, bint ok)
    cdef int _finish(self, bint record) except -1


cpdef _TrackedAccess access_block(object uses, object stream, object by, object op, bint finish_on_error)
