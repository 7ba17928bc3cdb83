"""The CUDA driver entry points of the compiled hot paths, through ``cuda.bindings.cydriver``.

The compiled tracking (``ignis/memory/resource.pyx``: event record, stream wait), the
compiled kernel launch (``ignis/runtime/kernel.pyx``) and PyTorch's free under the guard
(``ignis/torch/_guard_fast.pyx``: the poison memsets and the current context's device)
call the driver through C function pointers, with the GIL released (or, the guard's
free, without a Python call). The pointers are the addresses of the ``noexcept nogil``
functions here (``entry_points()``), each of which calls the matching function of
``cuda.bindings.cydriver`` (cuda-bindings' own C-level driver API, which loads the
driver library, and looks each function up, on first use) and returns its ``CUresult``
as a C int. Each has exactly the C signature its caller casts the address to (handles
as ``void *``, device pointers as ``unsigned long long``), so the callers need nothing
of cuda-bindings at compile time.

Errors: cydriver's functions are declared ``except ?CUDA_ERROR_NOT_FOUND``: they return
CUDA_ERROR_NOT_FOUND with a Python exception set when the driver library or the
function cannot be loaded. The wrappers here are ``noexcept`` (their callers are C and
read only the status), so they call cydriver's function through a pointer without the
exception check and, when the status is CUDA_ERROR_NOT_FOUND, take the GIL and clear a
pending exception (kept in ``last_load_error()`` and counted there); the caller then sees
a nonzero status and takes the backend's own method, which raises the driver's error.
They must therefore be called with no Python exception pending (the compiled callers
call them with the GIL released, or, the guard's free, after setting the caller's
exception aside).

Built only where cuda-bindings (with its ``cydriver.pxd``) and the CUDA headers
(``cuda.h``) are found at build time (see setup.py); the cuda backend refuses to start
without this module (``ignis.backends.cuda``).
"""

from libc.stdint cimport uintptr_t
from cpython.exc cimport PyErr_Occurred, PyErr_Fetch, PyErr_NormalizeException
from cpython.ref cimport PyObject, Py_XDECREF

from cuda.bindings cimport cydriver

__all__ = ["entry_points", "last_load_error"]

# The cydriver functions as plain C function pointers: no exception check after the call
# (``_settle`` does it, without turning a driver status into 0).
ctypedef cydriver.CUresult (*_record_t)(cydriver.CUevent, cydriver.CUstream) noexcept nogil
ctypedef cydriver.CUresult (*_wait_t)(cydriver.CUstream, cydriver.CUevent, unsigned int) noexcept nogil
ctypedef cydriver.CUresult (*_launch_t)(cydriver.CUfunction, unsigned int, unsigned int, unsigned int,
                                        unsigned int, unsigned int, unsigned int, unsigned int,
                                        cydriver.CUstream, void **, void **) noexcept nogil
ctypedef cydriver.CUresult (*_memset8_t)(cydriver.CUdeviceptr, unsigned char, size_t, cydriver.CUstream) noexcept nogil
ctypedef cydriver.CUresult (*_memset32_t)(cydriver.CUdeviceptr, unsigned int, size_t, cydriver.CUstream) noexcept nogil
ctypedef cydriver.CUresult (*_ctx_device_t)(cydriver.CUdevice *) noexcept nogil

cdef object _last_error = None  # the last exception cleared by _settle
cdef unsigned long long _n_errors = 0


cdef void _keep_pending() noexcept with gil:
    """Clear a pending Python exception (a load failure of cydriver), keeping it for ``last_load_error``."""
    global _last_error, _n_errors
    cdef PyObject *t = NULL
    cdef PyObject *v = NULL
    cdef PyObject *tb = NULL
    if PyErr_Occurred() == NULL:
        return
    PyErr_Fetch(&t, &v, &tb)
    PyErr_NormalizeException(&t, &v, &tb)
    _n_errors += 1
    if v != NULL:
        _last_error = <object>v
    Py_XDECREF(t)
    Py_XDECREF(v)
    Py_XDECREF(tb)


cdef inline int _settle(cydriver.CUresult r) noexcept nogil:
    """``r`` as an int; for CUDA_ERROR_NOT_FOUND, cydriver's load error (if one is pending) is cleared."""
    if r == cydriver.CUDA_ERROR_NOT_FOUND:
        _keep_pending()
    return <int>r


cdef int ignis_cuEventRecord(void *event, void *stream) noexcept nogil:
    return _settle((<_record_t>cydriver.cuEventRecord)(<cydriver.CUevent>event, <cydriver.CUstream>stream))


cdef int ignis_cuStreamWaitEvent(void *stream, void *event, unsigned int flags) noexcept nogil:
    return _settle((<_wait_t>cydriver.cuStreamWaitEvent)(<cydriver.CUstream>stream, <cydriver.CUevent>event, flags))


cdef int ignis_cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                              unsigned int by, unsigned int bz, unsigned int shared_mem, void *stream,
                              void **params, void **extra) noexcept nogil:
    return _settle((<_launch_t>cydriver.cuLaunchKernel)(<cydriver.CUfunction>f, gx, gy, gz, bx, by, bz, shared_mem,
                                                        <cydriver.CUstream>stream, params, extra))


cdef int ignis_cuMemsetD8Async(unsigned long long dst, unsigned char value, size_t n, void *stream) noexcept nogil:
    return _settle((<_memset8_t>cydriver.cuMemsetD8Async)(<cydriver.CUdeviceptr>dst, value, n,
                                                          <cydriver.CUstream>stream))


cdef int ignis_cuMemsetD32Async(unsigned long long dst, unsigned int value, size_t n, void *stream) noexcept nogil:
    return _settle((<_memset32_t>cydriver.cuMemsetD32Async)(<cydriver.CUdeviceptr>dst, value, n,
                                                            <cydriver.CUstream>stream))


cdef int ignis_cuCtxGetDevice(int *device) noexcept nogil:
    return _settle((<_ctx_device_t>cydriver.cuCtxGetDevice)(<cydriver.CUdevice *>device))


def entry_points() -> dict[str, int]:
    """The address of each wrapper, by the driver function it calls: ``cuEventRecord``,
    ``cuStreamWaitEvent``, ``cuLaunchKernel`` (``raw`` of the cuda backend's
    ``tracking_calls()``), ``cuMemsetD8Async``, ``cuMemsetD32Async``, ``cuCtxGetDevice``
    (the guard's poison under PyTorch). Taking them needs no driver: cydriver loads it
    at the first call."""
    return {
        "cuEventRecord": <uintptr_t>&ignis_cuEventRecord,
        "cuStreamWaitEvent": <uintptr_t>&ignis_cuStreamWaitEvent,
        "cuLaunchKernel": <uintptr_t>&ignis_cuLaunchKernel,
        "cuMemsetD8Async": <uintptr_t>&ignis_cuMemsetD8Async,
        "cuMemsetD32Async": <uintptr_t>&ignis_cuMemsetD32Async,
        "cuCtxGetDevice": <uintptr_t>&ignis_cuCtxGetDevice,
    }


def last_load_error() -> tuple[int, BaseException | None]:
    """How many times a wrapper found cydriver's load error pending (the driver library or a
    function of it could not be loaded) and cleared it, and the last such exception."""
    return (_n_errors, _last_error)
