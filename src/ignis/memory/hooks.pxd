# The memory layer's hook slots (hooks.pyx), typed, for the compiled readers: a resource, the
# pool, NvArray and the guard read ``slots.checker`` / ``slots.recorder`` as C fields of the one
# ``HOOKS`` object, taken once at import (``cdef Hooks slots = HOOKS``).

# The stack walker (``ignis.safety.frames``'s ``capture_c``): the user's frames at the caller,
# ``skip`` frames passed over first, at most ``limit``, as a tuple (empty: none).
ctypedef tuple (*capture_fn)(Py_ssize_t skip, Py_ssize_t limit)


cdef class Hooks:
    cdef readonly object checker    # the sanitizer: access(block, stream, access, span), free(block),
                                    # mode, add_report(err, key)
    cdef readonly object recorder   # telemetry: recorder(action, resource, ptr, size, stream, block)
    cdef readonly bint any_manual   # the ordering policy: "manual" was asked for once (never reset)
    cdef capture_fn capture         # the stack walker, or NULL (set_stack_capture)
    cdef readonly object format_frames  # formats what ``capture`` returns as traceback text


# Install the stack walker and its formatter (``ignis.safety.frames`` does, at import).
cdef int set_stack_capture(capture_fn fn, object format_frames) except -1
