# CPython helpers the compiled modules share (declarations and inline functions only: each
# cimporter compiles them in).

from cpython.object cimport PyObject

cdef extern from "Python.h":
    PyObject **_PyObject_GetDictPtr(object)

cdef extern from *:
    """
    #if PY_VERSION_HEX >= 0x030D0000
    #define ignis_finalizing() Py_IsFinalizing()
    #else
    #define ignis_finalizing() _Py_IsFinalizing()
    #endif
    """
    int ignis_finalizing() nogil  # sys.is_finalizing(), callable without the GIL


cdef inline bint not_on_instance(object obj, str name) except -1:
    """``obj``'s instance dict does not hold ``name`` (nothing replaced that method on the
    object itself, as a test, a wrapper or an adaptor may), so its class's method runs."""
    cdef PyObject **dp = _PyObject_GetDictPtr(obj)
    return dp == NULL or dp[0] == NULL or name not in <dict>dp[0]
