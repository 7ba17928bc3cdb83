# The memory layer's hook slots (hooks.pyx), typed, for the compiled readers: a resource, the
# pool, NvArray and the guard read ``slots.checker`` / ``slots.recorder`` as C fields of the one
# ``HOOKS`` object, taken once at import (``cdef Hooks slots = HOOKS``).

cdef class Hooks:
    cdef readonly object checker    # the sanitizer: access(block, stream, access, span), free(block)
    cdef readonly object recorder   # telemetry: recorder(action, resource, ptr, size, stream, block)
    cdef readonly bint any_manual   # the ordering policy: "manual" was asked for once (never reset)
