"""The CUDA driver entry points of the compiled hot paths, taken from the driver at run time.

The compiled tracking (``ignis/memory/resource.pyx``: event record, stream wait), the
compiled kernel launch (``ignis/runtime/kernel.pyx``), PyTorch's free under the guard
(``ignis/torch/_guard_fast.pyx``: the poison memsets and the current context's device) and
the guard's check batches (``ignis/memory/guard_base.pyx``: their copies, launches, event
record and query) call the driver through C function pointers, with the GIL released (or, the guard's
free, without a Python call). The pointers are the addresses of the C functions here
(``entry_points()``); each calls the driver's function of that name and returns its
``CUresult`` as a C int, with exactly the C signature its caller casts the address to
(handles as ``void *``, device pointers as ``unsigned long long``).

Design: no CUDA header and no cuda-bindings at build time. The driver API's C
signatures are a stable ABI: the nine used here are declared below in plain C types
(CUresult as int, handles as ``void *``, CUdeviceptr as ``unsigned long long``,
CUdevice as int), as CUDA 12.0 defines them. The driver hands out its functions at run
time: ``libcuda.so.1`` is opened with ``dlopen`` and each function is asked of its
``cuGetProcAddress`` (``_v2``, else the CUDA 11.3 one) for the CUDA 12.0 version of its
signature, with cuda-bindings' choice of default stream (per-thread where
``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM`` is a nonzero integer, as cuda-bindings
reads it, so these calls and the backend's binding calls mean the same stream 0); a
driver without ``cuGetProcAddress`` gives them by symbol name (``dlsym``; the ``_ptsz``
names for the per-thread stream). So one build works with any CUDA 12 or newer driver,
whatever headers or cuda-bindings the build machine had.

Loading: on first use, not at import (importing this module maps no driver library).
``load()`` does it from Python and raises ``OSError`` saying what is missing; the cuda
backend calls it when it starts and refuses to start without it. A wrapper called
before that loads on its first call (once per process, under a lock; then one atomic
read a call); when loading failed it returns CUDA_ERROR_NOT_FOUND (500) and calls
nothing, so its C callers see a refused call and take the backend's own method, which
raises the driver's error. No wrapper touches Python: no GIL, no exception set.
"""

from libc.stdint cimport uintptr_t

__all__ = ["entry_points", "load", "load_error", "resolved_via", "CUDA_ABI_VERSION"]

cdef extern from *:
    """
    #include <dlfcn.h>
    #include <pthread.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>

    /* The driver API as C 12.0 defines it, in plain C types (a stable ABI). */
    #define IGNIS_CU_ABI_VERSION 12000
    #define IGNIS_CU_NOT_FOUND 500            /* CUDA_ERROR_NOT_FOUND */
    #define IGNIS_CU_GET_PROC_DEFAULT 0ULL    /* CU_GET_PROC_ADDRESS_DEFAULT */
    #define IGNIS_CU_GET_PROC_PER_THREAD 2ULL /* CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM */
    typedef int (*ignis_getproc_v2_t)(const char *, void **, int, unsigned long long, int *);
    typedef int (*ignis_getproc_v1_t)(const char *, void **, int, unsigned long long);
    typedef int (*ignis_record_t)(void *, void *);
    typedef int (*ignis_wait_t)(void *, void *, unsigned int);
    typedef int (*ignis_launch_t)(void *, unsigned int, unsigned int, unsigned int, unsigned int,
                                  unsigned int, unsigned int, unsigned int, void *, void **, void **);
    typedef int (*ignis_memset8_t)(unsigned long long, unsigned char, size_t, void *);
    typedef int (*ignis_memset32_t)(unsigned long long, unsigned int, size_t, void *);
    typedef int (*ignis_ctx_device_t)(int *);

    typedef int (*ignis_htod_t)(unsigned long long, const void *, size_t, void *);
    typedef int (*ignis_dtoh_t)(void *, unsigned long long, size_t, void *);
    typedef int (*ignis_query_t)(void *);

    enum { IGNIS_CU_RECORD, IGNIS_CU_WAIT, IGNIS_CU_LAUNCH, IGNIS_CU_MEMSET8, IGNIS_CU_MEMSET32,
           IGNIS_CU_CTX_DEVICE, IGNIS_CU_HTOD, IGNIS_CU_DTOH, IGNIS_CU_QUERY, IGNIS_CU_N };
    /* The names cuGetProcAddress is asked for (it picks the version of the CUDA release asked). */
    static const char *const ignis_cu_names[IGNIS_CU_N] = {
        "cuEventRecord", "cuStreamWaitEvent", "cuLaunchKernel", "cuMemsetD8Async", "cuMemsetD32Async",
        "cuCtxGetDevice", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuEventQuery"};
    /* Symbol names where the driver has no cuGetProcAddress: the legacy default stream's (a copy's
       plain symbol is the 32-bit one of CUDA 3.x: its 64-bit function is _v2), and the per-thread
       default stream's. */
    static const char *const ignis_cu_sym_names[IGNIS_CU_N] = {
        "cuEventRecord", "cuStreamWaitEvent", "cuLaunchKernel", "cuMemsetD8Async", "cuMemsetD32Async",
        "cuCtxGetDevice", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuEventQuery"};
    static const char *const ignis_cu_ptsz_names[IGNIS_CU_N] = {
        "cuEventRecord_ptsz", "cuStreamWaitEvent_ptsz", "cuLaunchKernel_ptsz", "cuMemsetD8Async_ptsz",
        "cuMemsetD32Async_ptsz", "cuCtxGetDevice", "cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyDtoHAsync_v2_ptsz",
        "cuEventQuery"};

    static void *ignis_cu_fn[IGNIS_CU_N];
    static int ignis_cu_state;                 /* 0 not tried, 1 loaded, -1 failed; atomic */
    static char ignis_cu_error[768];           /* why it failed */
    static const char *ignis_cu_via = "";      /* how the functions were found */
    static pthread_mutex_t ignis_cu_lock = PTHREAD_MUTEX_INITIALIZER;

    static int ignis_cu_per_thread(void) {
        const char *v = getenv("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM");
        return v != NULL && atoi(v) != 0;
    }

    static int ignis_cu_resolve(void) {
        void *lib, *getproc;
        const char *e;
        int i, ptds = ignis_cu_per_thread();
        unsigned long long flags = ptds ? IGNIS_CU_GET_PROC_PER_THREAD : IGNIS_CU_GET_PROC_DEFAULT;
        dlerror();
        lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) {
            e = dlerror();
            snprintf(ignis_cu_error, sizeof ignis_cu_error, "the CUDA driver library could not be loaded (%s)",
                     e ? e : "libcuda.so.1: dlopen failed");
            return -1;
        }
        if ((getproc = dlsym(lib, "cuGetProcAddress_v2")) != NULL) {
            ignis_cu_via = "cuGetProcAddress_v2";
            for (i = 0; i < IGNIS_CU_N; i++) {
                int found = -1, r;
                ignis_cu_fn[i] = NULL;
                r = ((ignis_getproc_v2_t)getproc)(ignis_cu_names[i], &ignis_cu_fn[i], IGNIS_CU_ABI_VERSION, flags,
                                                  &found);
                if (r != 0 || found != 0 || ignis_cu_fn[i] == NULL) {
                    snprintf(ignis_cu_error, sizeof ignis_cu_error, "the CUDA driver (libcuda.so.1) gave no %s "
                             "for CUDA %d.%d (cuGetProcAddress_v2: CUresult %d, symbol status %d)",
                             ignis_cu_names[i], IGNIS_CU_ABI_VERSION / 1000, IGNIS_CU_ABI_VERSION % 1000 / 10, r, found);
                    return -1;
                }
            }
        } else if ((getproc = dlsym(lib, "cuGetProcAddress")) != NULL) {
            ignis_cu_via = "cuGetProcAddress";
            for (i = 0; i < IGNIS_CU_N; i++) {
                int r;
                ignis_cu_fn[i] = NULL;
                r = ((ignis_getproc_v1_t)getproc)(ignis_cu_names[i], &ignis_cu_fn[i], IGNIS_CU_ABI_VERSION, flags);
                if (r != 0 || ignis_cu_fn[i] == NULL) {
                    snprintf(ignis_cu_error, sizeof ignis_cu_error, "the CUDA driver (libcuda.so.1) gave no %s "
                             "for CUDA %d.%d (cuGetProcAddress: CUresult %d)", ignis_cu_names[i],
                             IGNIS_CU_ABI_VERSION / 1000, IGNIS_CU_ABI_VERSION % 1000 / 10, r);
                    return -1;
                }
            }
        } else {
            ignis_cu_via = "dlsym";
            for (i = 0; i < IGNIS_CU_N; i++) {
                const char *name = ptds ? ignis_cu_ptsz_names[i] : ignis_cu_sym_names[i];
                if ((ignis_cu_fn[i] = dlsym(lib, name)) == NULL) {
                    snprintf(ignis_cu_error, sizeof ignis_cu_error, "the CUDA driver (libcuda.so.1) has no %s "
                             "(nor cuGetProcAddress): it is older than Ignis supports", name);
                    return -1;
                }
            }
        }
        return 1;  /* the library stays open: the functions live in it */
    }

    /* 1 when the functions are there (loading them on the first call), -1 when they cannot be. */
    static int ignis_cu_load(void) {
        int state = __atomic_load_n(&ignis_cu_state, __ATOMIC_ACQUIRE);
        if (state != 0)
            return state;
        pthread_mutex_lock(&ignis_cu_lock);
        state = __atomic_load_n(&ignis_cu_state, __ATOMIC_RELAXED);
        if (state == 0) {
            state = ignis_cu_resolve();
            __atomic_store_n(&ignis_cu_state, state, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&ignis_cu_lock);
        return state;
    }

    #define IGNIS_CU_READY() (__builtin_expect(__atomic_load_n(&ignis_cu_state, __ATOMIC_ACQUIRE) == 1, 1) \\
                              || ignis_cu_load() == 1)

    static int ignis_cuEventRecord(void *event, void *stream) {
        if (!IGNIS_CU_READY()) return IGNIS_CU_NOT_FOUND;
        return ((ignis_record_t)ignis_cu_fn[IGNIS_CU_RECORD])(event, stream);
    }
    static int ignis_cuStreamWaitEvent(void *stream, void *event, unsigned int flags) {
        if (!IGNIS_CU_READY()) return IGNIS_CU_NOT_FOUND;
        return ((ignis_wait_t)ignis_cu_fn[IGNIS_CU_WAIT])(stream, event, flags);
    }
    static int ignis_cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                    unsigned int by, unsigned int bz, unsigned int shared_mem, void *stream,
                                    void **params, void **extra) {
        if (!IGNIS_CU_READY()) return IGNIS_CU_NOT_FOUND;
        return ((ignis_launch_t)ignis_cu_fn[IGNIS_CU_LAUNCH])(f, gx, gy, gz, bx, by, bz, shared_mem, stream,
                                                               params, extra);
    }
    static int ignis_cuMemsetD8Async(unsigned long long dst, unsigned char value, size_t n, void *stream) {
        if (!IGNIS_CU_READY()) return IGNIS_CU_NOT_FOUND;
        return ((ignis_memset8_t)ignis_cu_fn[IGNIS_CU_MEMSET8])(dst, value, n, stream);
    }
    static int ignis_cuMemsetD32Async(unsigned long long dst, unsigned int value, size_t n, void *stream) {
        if (!IGNIS_CU_READY()) return IGNIS_CU_NOT_FOUND;
        return ((ignis_memset32_t)ignis_cu_fn[IGNIS_CU_MEMSET32])(dst, value, n, stream);
    }
    static int ignis_cuCtxGetDevice(int *device) {
        if (!IGNIS_CU_READY()) return IGNIS_CU_NOT_FOUND;
        return ((ignis_ctx_device_t)ignis_cu_fn[IGNIS_CU_CTX_DEVICE])(device);
    }
    static int ignis_cuMemcpyHtoDAsync(unsigned long long dst, const void *src, size_t n, void *stream) {
        if (!IGNIS_CU_READY()) return IGNIS_CU_NOT_FOUND;
        return ((ignis_htod_t)ignis_cu_fn[IGNIS_CU_HTOD])(dst, src, n, stream);
    }
    static int ignis_cuMemcpyDtoHAsync(void *dst, unsigned long long src, size_t n, void *stream) {
        if (!IGNIS_CU_READY()) return IGNIS_CU_NOT_FOUND;
        return ((ignis_dtoh_t)ignis_cu_fn[IGNIS_CU_DTOH])(dst, src, n, stream);
    }
    static int ignis_cuEventQuery(void *event) {
        if (!IGNIS_CU_READY()) return IGNIS_CU_NOT_FOUND;
        return ((ignis_query_t)ignis_cu_fn[IGNIS_CU_QUERY])(event);
    }
    """
    const int IGNIS_CU_ABI_VERSION
    const int IGNIS_CU_N
    const char *const ignis_cu_names[]
    void *ignis_cu_fn[]
    const char *ignis_cu_error
    const char *ignis_cu_via
    int ignis_cu_load() nogil
    int ignis_cuEventRecord(void *event, void *stream) noexcept nogil
    int ignis_cuStreamWaitEvent(void *stream, void *event, unsigned int flags) noexcept nogil
    int ignis_cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                             unsigned int by, unsigned int bz, unsigned int shared_mem, void *stream,
                             void **params, void **extra) noexcept nogil
    int ignis_cuMemsetD8Async(unsigned long long dst, unsigned char value, size_t n, void *stream) noexcept nogil
    int ignis_cuMemsetD32Async(unsigned long long dst, unsigned int value, size_t n, void *stream) noexcept nogil
    int ignis_cuCtxGetDevice(int *device) noexcept nogil
    int ignis_cuMemcpyHtoDAsync(unsigned long long dst, const void *src, size_t n, void *stream) noexcept nogil
    int ignis_cuMemcpyDtoHAsync(void *dst, unsigned long long src, size_t n, void *stream) noexcept nogil
    int ignis_cuEventQuery(void *event) noexcept nogil

CUDA_ABI_VERSION: int = IGNIS_CU_ABI_VERSION  # the CUDA release whose signatures the functions are asked for


def entry_points() -> dict[str, int]:
    """The address of each wrapper, by the driver function it calls: ``cuEventRecord``,
    ``cuStreamWaitEvent``, ``cuLaunchKernel`` (``raw`` of the cuda backend's
    ``direct_calls()``), ``cuMemsetD8Async``, ``cuMemsetD32Async``, ``cuCtxGetDevice``
    (the guard's poison under PyTorch), ``cuMemcpyHtoDAsync``, ``cuMemcpyDtoHAsync`` and
    ``cuEventQuery`` (the guard's check batches). Taking them loads no driver: a wrapper loads it
    at its first call, if ``load()`` has not."""
    return {
        "cuEventRecord": <uintptr_t>&ignis_cuEventRecord,
        "cuStreamWaitEvent": <uintptr_t>&ignis_cuStreamWaitEvent,
        "cuLaunchKernel": <uintptr_t>&ignis_cuLaunchKernel,
        "cuMemsetD8Async": <uintptr_t>&ignis_cuMemsetD8Async,
        "cuMemsetD32Async": <uintptr_t>&ignis_cuMemsetD32Async,
        "cuCtxGetDevice": <uintptr_t>&ignis_cuCtxGetDevice,
        "cuMemcpyHtoDAsync": <uintptr_t>&ignis_cuMemcpyHtoDAsync,
        "cuMemcpyDtoHAsync": <uintptr_t>&ignis_cuMemcpyDtoHAsync,
        "cuEventQuery": <uintptr_t>&ignis_cuEventQuery,
    }


def load() -> dict[str, int]:
    """Open the driver library and take the nine functions from it (once per process; later
    calls return the same). Returns the driver's address of each, by name.

    Raises:
        OSError: the driver library cannot be loaded, or lacks one of the functions; the
            message says which (the wrappers then return CUDA_ERROR_NOT_FOUND).
    """
    cdef int state
    with nogil:
        state = ignis_cu_load()
    if state != 1:
        raise OSError(f"{load_error()}; the cuda backend needs the NVIDIA driver (CUDA 12 or newer): install it, "
                      "or set IGNIS_BACKEND=emulated to run without a GPU")
    return {(<bytes>ignis_cu_names[i]).decode(): <uintptr_t>ignis_cu_fn[i] for i in range(IGNIS_CU_N)}


def load_error() -> str | None:
    """Why the driver's functions could not be loaded; None where they were, or were not tried yet."""
    if ignis_cu_error[0] == 0:
        return None
    return (<bytes>ignis_cu_error).decode(errors="replace")


def resolved_via() -> str:
    """How the loaded functions were found: ``"cuGetProcAddress_v2"``, ``"cuGetProcAddress"``
    (a driver older than CUDA 12) or ``"dlsym"`` (one without it); ``""`` before loading."""
    return (<bytes>ignis_cu_via).decode()
