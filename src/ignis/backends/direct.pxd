# A backend's direct driver calls, typed (direct.pyx): what the compiled hot paths (the memory
# layer's event records and stream waits, the kernel launch) may call without the backend's
# Python methods, and the backend's own rule for when they may.

from cpython.pythread cimport PyThread_get_thread_ident

ctypedef int (*event_record_fn)(void *event, void *stream) noexcept nogil
ctypedef int (*stream_wait_fn)(void *stream, void *event, unsigned int flags) noexcept nogil
ctypedef int (*launch_fn)(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                          unsigned int by, unsigned int bz, unsigned int shared_mem, void *stream,
                          void **params, void **extra) noexcept nogil
ctypedef int (*event_query_fn)(void *event) noexcept nogil
ctypedef int (*ctx_device_fn)(int *device) noexcept nogil
ctypedef int (*copy_htod_fn)(unsigned long long dst, const void *src, size_t n, void *stream) noexcept nogil
ctypedef int (*copy_dtoh_fn)(void *dst, unsigned long long src, size_t n, void *stream) noexcept nogil
ctypedef int (*memset32_fn)(unsigned long long dst, unsigned int value, size_t n, void *stream) noexcept nogil


# Whether a device's context is current on the calling thread. The backend records, per thread,
# the context it last made current (``current.ctx``, a threading.local: two attribute reads,
# about 50-80 ns) and bumps ``epoch[0]`` whenever it makes any context current or rebuilds one.
# A cache of the last (thread, epoch, device) that passed the check answers again without the
# reads until the epoch moves or another thread or device asks. The device is compared by
# identity only (never dereferenced).
cdef struct CtxCache:
    unsigned long tid
    Py_ssize_t epoch
    void *dev


cdef inline bint ctx_is_current(CtxCache *c, object current, object epoch, object dev) except -1:
    cdef unsigned long tid = PyThread_get_thread_ident()
    cdef Py_ssize_t ep = -1
    if type(epoch) is list and len(<list>epoch) == 1:
        ep = (<list>epoch)[0]
        if c.dev == <void *>dev and c.tid == tid and c.epoch == ep:
            return True
    ctx = getattr(current, "ctx", None)
    if ctx is None or ctx is not getattr(dev, "ctx", None):
        return False
    if ep >= 0:
        c.tid = tid
        c.epoch = ep
        c.dev = <void *>dev
    return True


cdef class DirectCalls:
    cdef readonly object backend       # whose methods are the way around (the outermost wrapper)
    cdef readonly dict streams         # handle -> (device record, driver object): the handles they take
    cdef readonly dict events
    cdef readonly object current       # the thread's current-context record (``.ctx``)
    cdef readonly object epoch         # [n], bumped whenever a context is made current or rebuilt (or None)
    cdef readonly tuple gates          # containers: while any is non-empty, no direct record / wait
    cdef readonly tuple launch_gates   # the same for the launch
    cdef readonly dict entry_points    # the C entry points by driver name (addresses)
    cdef object own                    # the backend's instance dict: a ``kernel_launch`` there gates the launch
    cdef event_record_fn record_fn
    cdef stream_wait_fn wait_fn
    cdef launch_fn launch_fn
    cdef CtxCache seen_queue
    cdef CtxCache seen_launch
    cdef event_query_fn query_fn
    cdef ctx_device_fn ctx_device_fn

    cdef int queue(self, bint wait, object h, object ev) except -2
    cdef int query(self, object ev) except -2
    cdef int record_on(self, object h, object ev, int ordinal) except -2
    cdef bint _launch_open(self) except -1
    cdef object launch_target(self, object h)
    cdef object launch_target_on(self, object h, int ordinal)


# No gate of ``dc`` is closed now: no trace listener, armed fault or fork marker, each of which
# needs the backend's methods to run (a launch has its own, ``launch_gates``). Inline: it is on
# the tracked use's path (``queue``).
cdef inline bint gates_open(DirectCalls dc) except -1:
    for c in dc.gates:
        if c:
            return False
    return True
