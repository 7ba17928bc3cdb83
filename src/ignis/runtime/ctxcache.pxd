# Whether a device's context is current on the calling thread, for the compiled direct driver
# calls (runtime/kernel.pyx's launch, memory/resource.pyx's event record and stream wait).
# The cuda backend records, per thread, the context it last made current (``current.ctx``, a
# threading.local: two attribute reads, about 50-80 ns) and bumps ``epoch[0]`` whenever it
# makes any context current or rebuilds one. A cache of the last (thread, epoch, device) that
# passed the check answers again without the reads until the epoch moves or another thread
# or device asks. The device is compared by identity only (never dereferenced).

from cpython.pythread cimport PyThread_get_thread_ident


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
