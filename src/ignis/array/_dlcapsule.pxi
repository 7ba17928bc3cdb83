# Part of nvarray.pyx (included there, compiled into the one module): DLPack, the deleter and
# capsule destructor of exported tensors.
#
# A consumer (NumPy, PyTorch, CuPy) calls the deleter whenever it drops a tensor it
# imported, and Python calls the capsule destructor when an unconsumed capsule dies;
# either can happen on any thread and in the interpreter's final garbage collection,
# after ignis's modules were cleared. They are C functions of this (always loaded)
# extension: they drop the export's entry from dlpack_export's ``_exports`` and do
# nothing once the interpreter is finalizing.

cdef dict _DL_EXPORTS = None  # struct address -> what keeps the exported tensor alive


cdef void _dl_forget(void *addr) noexcept:
    cdef PyObject *et = NULL
    cdef PyObject *ev = NULL
    cdef PyObject *tb = NULL
    PyErr_Fetch(&et, &ev, &tb)
    try:
        _DL_EXPORTS.pop(<size_t>addr, None)  # what it releases may run Python code: the entry goes first
    except BaseException:
        pass
    PyErr_Restore(et, ev, tb)


cdef void _dl_deleter(void *managed) noexcept nogil:
    if managed == NULL or not Py_IsInitialized():
        return
    with gil:  # the consumer may call it from any thread, holding the GIL or not
        if not ignis_finalizing() and _DL_EXPORTS is not None:
            _dl_forget(managed)


cdef void _dl_capsule_destructor(object capsule) noexcept:
    if ignis_finalizing() or _DL_EXPORTS is None:
        return
    cdef void *p
    for name in (b"dltensor", b"dltensor_versioned"):
        if PyCapsule_IsValid(capsule, <char *>name):  # unconsumed: a consumer renames it
            p = PyCapsule_GetPointer(capsule, <char *>name)
            if p != NULL:
                _dl_forget(p)
            return


cdef tuple _DL_EXPORTER = None  # (export, device_of, cuda_array_interface) of dlpack_export


cdef tuple _exporter():
    if _DL_EXPORTER is None:
        raise RuntimeError("the DLPack export module (ignis.array.dlpack_export) is not loaded; import ignis")
    return _DL_EXPORTER


def _dlpack_callbacks(exports: dict, export: Any, device_of: Any, cuda_array_interface: Any) -> tuple:
    """Bind dlpack_export's exports dict and its three functions (``__dlpack__``,
    ``__dlpack_device__``, ``__cuda_array_interface__``); returns (the deleter's address, the
    capsule destructor's address)."""
    global _DL_EXPORTS, _DL_EXPORTER
    if type(exports) is not dict or not (callable(export) and callable(device_of)
                                         and callable(cuda_array_interface)):
        raise TypeError("_dlpack_callbacks: expected the exports dict and three functions")
    _DL_EXPORTS = exports
    _DL_EXPORTER = (export, device_of, cuda_array_interface)
    return <size_t>&_dl_deleter, <size_t>&_dl_capsule_destructor
