/* ignis._speedups: the common cases of ig.empty / NvArray.free / NvArray.__del__ and the
 * DLPack deleters, in C. What is left of the hand-written C path: the memory layer's hot
 * path (streams, blocks, tracking, the pool) and the guard's (its PyTorch allocator entry
 * points among it) are compiled Cython (the .pyx modules of ignis/memory, and ignis/torch/_guard_fast.pyx),
 * and these move there in turn.
 *
 * The Python implementations in ignis/array/nvarray.py are the reference and handle
 * everything; these functions handle only the hot case -- a plain owning array with
 * the default device, stream and resource, no recorder, no sanitizer -- and call the
 * Python implementation for anything else. They check every precondition before
 * changing anything, so a fallback always starts from untouched state.
 *
 * Objects are the Python ones: the C side reads and writes their __slots__ at
 * offsets taken from the classes' member descriptors at setup(), and checks
 * exact types first, so a subclass or a foreign object takes the Python path.
 *
 * IGNIS_PURE_PYTHON=1 leaves it unused (the array layer's Python path, for tests and
 * comparison).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <time.h>

/* Slot indices of DeviceState (the device generation the array layer checks). */
enum { D_GENERATION, D_N };
static const char *STATE_SLOTS[] = {"generation"};

typedef struct {
    PyTypeObject *type;
    Py_ssize_t off[24];
} Layout;

static Layout L_state;
static PyObject *STR_RECORDER, *STR_CHECKER, *STR_STREAM, *STR_TAG, *STR_ANY_MANUAL, *STR_CTX, *STR_AUTO,
    *STR_CONTEXT, *STR_PROCESS;
/* threading.Lock's own C methods, called directly */
static PyTypeObject *LOCK_TYPE;
static PyCFunctionWithKeywords LOCK_ACQUIRE;
typedef PyObject *(*fastcall_kw_fn)(PyObject *, PyObject *const *, Py_ssize_t, PyObject *);
static fastcall_kw_fn LOCK_ACQUIRE_FAST;  /* where acquire uses the fast calling convention */
static PyCFunction LOCK_RELEASE;
static PyObject *NONBLOCKING_ARGS;  /* (False,) */
static PyObject *ZERO;
static int ready = 0;

#define SLOT(obj, layout, i) (*(PyObject **)((char *)(obj) + (layout).off[(i)]))

/* Replace a slot's value (new reference taken to v). */
static inline void set_slot(PyObject *obj, Py_ssize_t off, PyObject *v) {
    PyObject **p = (PyObject **)((char *)obj + off);
    PyObject *old = *p;
    Py_INCREF(v);
    *p = v;
    Py_XDECREF(old);
}

static int layout_from(Layout *l, PyObject *cls, const char **names, int n) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "setup: expected a class");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        PyObject *d = PyObject_GetAttrString(cls, names[i]);
        if (d == NULL)
            return -1;
        if (!PyObject_TypeCheck(d, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "setup: %s.%s is not a __slots__ member", ((PyTypeObject *)cls)->tp_name,
                         names[i]);
            Py_DECREF(d);
            return -1;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "setup: %s.%s is not an object slot", ((PyTypeObject *)cls)->tp_name,
                         names[i]);
            Py_DECREF(d);
            return -1;
        }
        l->off[i] = m->offset;
        Py_DECREF(d);
    }
    PyTypeObject *old = l->type;
    l->type = (PyTypeObject *)Py_NewRef(cls);
    Py_XDECREF(old);
    return 0;
}

static PyObject *setup(PyObject *self, PyObject *args) {
    PyObject *state, *lock;
    if (!PyArg_ParseTuple(args, "OO", &state, &lock))
        return NULL;
    ready = 0;
    if (layout_from(&L_state, state, STATE_SLOTS, D_N))
        return NULL;
    /* the lock's acquire / release, as C functions */
    PyTypeObject *lt = Py_TYPE(lock);
    PyObject *acq = PyObject_GetAttrString((PyObject *)lt, "acquire");
    PyObject *rel = acq ? PyObject_GetAttrString((PyObject *)lt, "release") : NULL;
    if (rel == NULL || !PyObject_TypeCheck(acq, &PyMethodDescr_Type) || !PyObject_TypeCheck(rel, &PyMethodDescr_Type)) {
        Py_XDECREF(acq);
        Py_XDECREF(rel);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "setup: the lock type's acquire / release are not C methods");
        return NULL;
    }
    PyMethodDef *ad = ((PyMethodDescrObject *)acq)->d_method, *rd = ((PyMethodDescrObject *)rel)->d_method;
    int fast = (ad->ml_flags & (METH_FASTCALL | METH_KEYWORDS)) == (METH_FASTCALL | METH_KEYWORDS);
    int ok = (fast || (ad->ml_flags & (METH_VARARGS | METH_KEYWORDS)) == (METH_VARARGS | METH_KEYWORDS)) &&
             (rd->ml_flags & METH_NOARGS);
    Py_DECREF(acq);
    Py_DECREF(rel);
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "setup: unexpected calling convention of the lock's methods");
        return NULL;
    }
    Py_XSETREF(LOCK_TYPE, (PyTypeObject *)Py_NewRef(lt));
    LOCK_ACQUIRE = fast ? NULL : (PyCFunctionWithKeywords)(void (*)(void))ad->ml_meth;
    LOCK_ACQUIRE_FAST = fast ? (fastcall_kw_fn)(void (*)(void))ad->ml_meth : NULL;
    LOCK_RELEASE = rd->ml_meth;
    ready = 1;
    Py_RETURN_NONE;
}


/* Non-blocking acquire: 1 taken, 0 busy (or error, cleared: the Python path will see it again). */
static inline int try_lock(PyObject *lock) {
    if (Py_TYPE(lock) != LOCK_TYPE)
        return 0;
    PyObject *nonblocking = Py_False;
    PyObject *r = LOCK_ACQUIRE != NULL ? LOCK_ACQUIRE(lock, NONBLOCKING_ARGS, NULL)
                                       : LOCK_ACQUIRE_FAST(lock, &nonblocking, 1, NULL);
    if (r == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = (r == Py_True);
    Py_DECREF(r);
    return ok;
}

static inline int unlock(PyObject *lock) {
    PyObject *r = LOCK_RELEASE(lock, NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}





/* pool_allocate(pool, nbytes, stream=None, tag=...): bound to a PoolResource as its `allocate`. */
static inline int is_zero(PyObject *v) { return v == ZERO || (PyLong_CheckExact(v) && PyObject_IsTrue(v) == 0); }

/* -- NvArray: ig.empty, NvArray.free and NvArray.__del__ -------------------------------
 * The same rules as ignis/array/nvarray.py, for the common case only: ig.empty(shape,
 * dtype) with the cached defaults of device 0 (default stream, current resource), and
 * free() / collection of a plain owning array. A keyword argument, a shape or dtype that
 * needs converting, a stale defaults cache, contract.track_all, memory waiting in the
 * deferred queue, a busy per-array lock, ref counts, views, pinned buffers and foreign
 * memory all take the Python methods, from untouched state. Memory is allocated and
 * returned through the resource's own allocate / deallocate (PoolResource's are the C
 * functions above). */
enum { A_ID, A_SHAPE, A_DTYPE, A_DEVICE, A_STREAM, A_OWNER, A_REF_COUNT, A_CREATED_AT, A_NUMEL, A_NBYTES, A_PTR,
       A_BLOCK, A_MR, A_TRACKS, A_FREED, A_BASE, A_VIEWS, A_PINNED, A_KEEPALIVE, A_GATE, A_EXPORTS, A_N };
static const char *ARRAY_SLOTS[] = {"id", "shape", "dtype", "device", "stream", "owner", "ref_count", "created_at",
                                    "numel", "nbytes", "_ptr", "_block", "_mr", "_tracks", "_freed", "_base",
                                    "_views", "_pinned", "_keepalive", "_gate", "_exports"};
static Layout L_array;
static PyObject *AR_FAST, *AR_BACKENDS, *AR_CURRENT, *AR_LOCKS, *AR_DEFERRED, *AR_IN_GC, *AR_CONTRACT, *AR_NAMES,
    *AR_IDS, *AR_F32, *AR_OWNER, *AR_TAG, *AR_PY_FREE, *AR_PY_DEL, *AR_EMPTY_TUPLE;
static PyTypeObject *AR_DTYPE_TYPE;
static PyObject *STR_CLOSED;
static PyObject *STR_BACKEND, *STR_EPOCH, *STR_STATE, *STR_TRACK_ALL, *STR_ITEMSIZE, *STR_ALLOCATE, *STR_DEALLOCATE,
    *STR_GIVE_BACK, *STR_BY, *STR_PTR;
static int array_ready = 0, array_on = 0;
static PyObject *array_free(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
static PyObject *array_del(PyObject *self, PyObject *unused);

static inline int finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

static double wall_clock(void) {  /* time.time() */
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return 0.0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* a == b as Python compares them (identity first); -1 on error */
static inline int same_value(PyObject *a, PyObject *b) {
    return a == b ? 1 : PyObject_RichCompareBool(a, b, Py_EQ);
}

/* fn(self, *args, **kw) */
static PyObject *call_with_self(PyObject *fn, PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *small[8], **stack = small;
    if (nargs + nkw + 1 > 8 && (stack = PyMem_Malloc((nargs + nkw + 1) * sizeof(PyObject *))) == NULL)
        return PyErr_NoMemory();
    stack[0] = self;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++)
        stack[i + 1] = args[i];
    PyObject *r = PyObject_Vectorcall(fn, stack, nargs + 1, kwnames);
    if (stack != small)
        PyMem_Free(stack);
    return r;
}

/* the (device, stream, resource, tracks) tuple of nvarray._fast when it is still valid (a new
 * reference), else NULL (no error) */
static PyObject *cached_defaults(void) {
    if (!PyList_CheckExact(AR_FAST) || PyList_GET_SIZE(AR_FAST) < 1)
        return NULL;
    PyObject *f = PyList_GET_ITEM(AR_FAST, 0);
    if (!PyTuple_CheckExact(f) || PyTuple_GET_SIZE(f) != 7)
        return NULL;
    Py_INCREF(f);  /* the attribute lookups below could, in principle, replace the cache */
    PyObject *out = PyTuple_GET_ITEM(f, 6), *stream = PyTuple_GET_ITEM(f, 2);
    if (!PyTuple_CheckExact(out) || PyTuple_GET_SIZE(out) != 4 ||
        PyDict_GetItemWithError(AR_BACKENDS, STR_BACKEND) != PyTuple_GET_ITEM(f, 0))
        goto no;
    {
        PyObject *closed = PyObject_GetAttr(stream, STR_CLOSED);
        Py_XDECREF(closed);
        if (closed != Py_False)
            goto no;
    }
    PyObject *epoch = PyDict_GetItemWithError(AR_CURRENT, STR_EPOCH);
    if (epoch == NULL || same_value(epoch, PyTuple_GET_ITEM(f, 5)) != 1)
        goto no;
    PyObject *state = PyObject_GetAttr(PyTuple_GET_ITEM(f, 1), STR_STATE);
    if (state == NULL)
        goto no;
    PyObject *gen = Py_TYPE(state) == L_state.type ? SLOT(state, L_state, D_GENERATION) : NULL;
    int ok = gen != NULL && same_value(gen, PyTuple_GET_ITEM(f, 4)) == 1;
    Py_DECREF(state);
    if (ok) {
        Py_INCREF(out);
        Py_DECREF(f);
        return out;  /* a new reference */
    }
no:
    PyErr_Clear();
    Py_DECREF(f);
    return NULL;
}

static PyObject *array_setup(PyObject *self, PyObject *args) {
    PyObject *cls, *fast, *backends, *current, *locks, *deferred, *in_gc, *contract, *names, *ids, *f32, *owner,
        *tag, *py_free, *py_del;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOO", &cls, &fast, &backends, &current, &locks, &deferred, &in_gc,
                          &contract, &names, &ids, &f32, &owner, &tag, &py_free, &py_del))
        return NULL;
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "array_setup: setup() (ignis.memory.pool) must run first");
        return NULL;
    }
    if (!PyType_Check(cls) || ((PyTypeObject *)cls)->tp_new != PyBaseObject_Type.tp_new || !PyList_CheckExact(fast) || !PyList_CheckExact(in_gc) || PyList_GET_SIZE(in_gc) != 1 ||
        !PyModule_Check(backends) || !PyModule_Check(current) || !PyTuple_CheckExact(locks) ||
        PyTuple_GET_SIZE(locks) != 64 || !PyDict_CheckExact(names) || Py_TYPE(ids)->tp_iternext == NULL ||
        !PyUnicode_CheckExact(owner) || Py_TYPE(deferred)->tp_as_sequence == NULL ||
        Py_TYPE(deferred)->tp_as_sequence->sq_length == NULL) {
        PyErr_SetString(PyExc_TypeError, "array_setup: unexpected argument types");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < 64; i++)
        if (Py_TYPE(PyTuple_GET_ITEM(locks, i)) != LOCK_TYPE) {
            PyErr_SetString(PyExc_TypeError, "array_setup: the per-array locks must be threading.Lock objects");
            return NULL;
        }
    Layout layout = {NULL, {0}};
    if (layout_from(&layout, cls, ARRAY_SLOTS, A_N) < 0)
        return NULL;
    static PyMethodDef free_def = {"free", NULL, METH_FASTCALL | METH_KEYWORDS,
                                   "free(self, by='compute')\n--\n\n"
                                   "Give the memory back (stream-ordered). Views only mark themselves freed.\n"
                                   "\n"
                                   "The block goes back to its resource (``deallocate``, stream-ordered), and\n"
                                   "the pinned staging buffer of ``pin()`` goes back too. An array that adopted\n"
                                   "foreign memory (``from_dlpack``) drops its reference to the producer. An\n"
                                   "array exported through ``__cuda_array_interface__`` (which has no release\n"
                                   "signal) is retired at once, but its memory goes back only when the array\n"
                                   "object is collected.\n"
                                   "\n"
                                   "Refused (``MemoryContractViolation``) while ``ref_count > 0``, while a layer other\n"
                                   "than ``by`` owns the array, while views of it are alive, and while a DLPack consumer\n"
                                   "still holds an export of it. If the resource refuses to take the memory back (a\n"
                                   "driver error), the error is raised and the array stays live: ``free()`` can be\n"
                                   "called again.\n"
                                   "\n"
                                   "Args:\n"
                                   "    by: the owner freeing the array (default ``\"compute\"``); it must be the owner.\n"
                                   "\n"
                                   "Raises:\n"
                                   "    DoubleFreeError: the array was already freed.\n"
                                   "    MemoryContractViolation: one of the refusals above; the array is untouched.\n"
                                   "    DriverError: the resource refused the memory (the array stays live)."};
    static PyMethodDef del_def = {"__del__", NULL, METH_NOARGS,
                                  "Return an owning array's memory in stream order when it is collected."};
    free_def.ml_meth = (PyCFunction)(void (*)(void))array_free;
    del_def.ml_meth = array_del;
    PyObject *free_d = PyDescr_NewMethod((PyTypeObject *)cls, &free_def);
    PyObject *del_d = free_d ? PyDescr_NewMethod((PyTypeObject *)cls, &del_def) : NULL;
    if (del_d == NULL) {
        Py_XDECREF(free_d);
        Py_DECREF(layout.type);
        return NULL;
    }
    /* all checked: bind (a bad call above left the earlier binding in place) */
    array_ready = array_on = 0;
    Py_XDECREF(L_array.type);
    L_array = layout;
    Py_XSETREF(AR_FAST, Py_NewRef(fast));
    Py_XSETREF(AR_BACKENDS, Py_NewRef(PyModule_GetDict(backends)));
    Py_XSETREF(AR_CURRENT, Py_NewRef(PyModule_GetDict(current)));
    Py_XSETREF(AR_LOCKS, Py_NewRef(locks));
    Py_XSETREF(AR_DEFERRED, Py_NewRef(deferred));
    Py_XSETREF(AR_IN_GC, Py_NewRef(in_gc));
    Py_XSETREF(AR_CONTRACT, Py_NewRef(contract));
    Py_XSETREF(AR_NAMES, Py_NewRef(names));
    Py_XSETREF(AR_IDS, Py_NewRef(ids));
    Py_XSETREF(AR_F32, Py_NewRef(f32));
    Py_XSETREF(AR_DTYPE_TYPE, (PyTypeObject *)Py_NewRef(Py_TYPE(f32)));
    Py_XSETREF(AR_OWNER, Py_NewRef(owner));
    Py_XSETREF(AR_PY_FREE, Py_NewRef(py_free));
    Py_XSETREF(AR_TAG, Py_NewRef(tag));
    Py_XSETREF(AR_PY_DEL, Py_NewRef(py_del));
    array_ready = array_on = 1;
    return Py_BuildValue("(NN)", free_d, del_d);
}

/* array_enable(on) -> the previous setting (tests run both paths in one process) */
static PyObject *array_enable(PyObject *self, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    int was = array_on;
    array_on = on && array_ready;
    return PyBool_FromLong(was);
}

static PyObject *array_empty(PyObject *mod, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (!array_ready) {
        PyErr_SetString(PyExc_RuntimeError, "ignis._speedups.array_empty is not set up (ignis.array binds it)");
        return NULL;
    }
    PyTypeObject *cls = L_array.type;
    if (!array_on || kwnames != NULL || nargs < 1 || nargs > 2 || cls->tp_new != PyBaseObject_Type.tp_new)
        goto python;  /* (a replaced __new__ may make anything: the constructor handles it) */
    PyObject *shape = args[0], *dt = nargs > 1 ? args[1] : AR_F32;
    if (Py_TYPE(dt) != AR_DTYPE_TYPE) {
        dt = PyUnicode_CheckExact(dt) ? PyDict_GetItemWithError(AR_NAMES, dt) : NULL;
        if (dt == NULL || Py_TYPE(dt) != AR_DTYPE_TYPE)
            goto python;
    }
    Py_ssize_t numel = 1, itemsize, nbytes;
    if (PyLong_CheckExact(shape)) {
        numel = PyLong_AsSsize_t(shape);
        if (numel < 0)
            goto python;
    } else if (PyTuple_CheckExact(shape)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++) {
            PyObject *d = PyTuple_GET_ITEM(shape, i);
            Py_ssize_t v = PyLong_CheckExact(d) ? PyLong_AsSsize_t(d) : -1;
            if (v < 0 || __builtin_mul_overflow(numel, v, &numel))
                goto python;
        }
    } else
        goto python;
    PyObject *isz = PyObject_GetAttr(dt, STR_ITEMSIZE);
    itemsize = isz != NULL && PyLong_CheckExact(isz) ? PyLong_AsSsize_t(isz) : -1;
    Py_XDECREF(isz);
    if (itemsize <= 0 || __builtin_mul_overflow(numel, itemsize, &nbytes))
        goto python;
    Py_ssize_t waiting = PyObject_Length(AR_DEFERRED);
    if (waiting != 0)
        goto python;  /* the Python path returns that memory first */
    PyObject *track_all = PyObject_GetAttr(AR_CONTRACT, STR_TRACK_ALL);
    int tracking = track_all != Py_False;
    Py_XDECREF(track_all);
    if (tracking)
        goto python;
    PyObject *defaults = cached_defaults();
    if (defaults == NULL)
        goto python;
    PyObject *device = PyTuple_GET_ITEM(defaults, 0), *stream = PyTuple_GET_ITEM(defaults, 1),
             *mr = PyTuple_GET_ITEM(defaults, 2), *tracks = PyTuple_GET_ITEM(defaults, 3);
    Py_INCREF(dt);  /* held from here: object creation below may run a collection */
    PyObject *a = NULL, *shape_t = NULL, *idv = NULL, *now = NULL, *n_o = NULL, *nb_o = NULL, *block = NULL;
    a = cls->tp_new(cls, AR_EMPTY_TUPLE, NULL);
    if (a == NULL)
        goto error;
    if (Py_TYPE(a) != cls) {
        PyErr_SetString(PyExc_TypeError, "NvArray.__new__ made another type");
        goto error;
    }
    set_slot(a, L_array.off[A_FREED], Py_True);  /* until memory is in hand, so __del__ does nothing */
    shape_t = PyTuple_CheckExact(shape) ? Py_NewRef(shape) : PyTuple_Pack(1, shape);
    idv = shape_t ? Py_TYPE(AR_IDS)->tp_iternext(AR_IDS) : NULL;
    now = idv ? PyFloat_FromDouble(wall_clock()) : NULL;
    n_o = now ? (PyLong_CheckExact(shape) ? Py_NewRef(shape) : PyLong_FromSsize_t(numel)) : NULL;
    nb_o = n_o ? PyLong_FromSsize_t(nbytes) : NULL;
    if (nb_o == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "array id counter exhausted");
        goto error;
    }
    set_slot(a, L_array.off[A_ID], idv);
    set_slot(a, L_array.off[A_SHAPE], shape_t);
    set_slot(a, L_array.off[A_DTYPE], dt);
    set_slot(a, L_array.off[A_DEVICE], device);
    set_slot(a, L_array.off[A_STREAM], stream);
    set_slot(a, L_array.off[A_OWNER], AR_OWNER);
    set_slot(a, L_array.off[A_REF_COUNT], ZERO);
    set_slot(a, L_array.off[A_CREATED_AT], now);
    set_slot(a, L_array.off[A_NUMEL], n_o);
    set_slot(a, L_array.off[A_NBYTES], nb_o);
    set_slot(a, L_array.off[A_MR], mr);
    set_slot(a, L_array.off[A_BASE], Py_None);
    set_slot(a, L_array.off[A_VIEWS], Py_None);
    set_slot(a, L_array.off[A_PINNED], Py_None);
    set_slot(a, L_array.off[A_KEEPALIVE], Py_None);
    set_slot(a, L_array.off[A_GATE], Py_None);
    set_slot(a, L_array.off[A_EXPORTS], Py_None);
    if (nbytes) {
        PyObject *call[4] = {mr, nb_o, stream, AR_TAG};  /* as the constructor: (nbytes, stream, UNTAGGED) */
        block = PyObject_VectorcallMethod(STR_ALLOCATE, call, 4, NULL);
        if (block == NULL)
            goto error;
        PyObject *ptr = PyObject_GetAttr(block, STR_PTR);
        if (ptr == NULL) {  /* not a block: give it back, keep the error */
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            PyObject *call2[2] = {mr, block};
            PyObject *r = PyObject_VectorcallMethod(STR_DEALLOCATE, call2, 2, NULL);
            Py_XDECREF(r);
            PyErr_Clear();
            PyErr_Restore(et, ev, tb);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "the resource returned a block without a pointer");
            Py_CLEAR(block);
            goto error;
        }
        set_slot(a, L_array.off[A_PTR], ptr);
        Py_DECREF(ptr);
        set_slot(a, L_array.off[A_BLOCK], block);
        set_slot(a, L_array.off[A_TRACKS], tracks);
    } else {
        set_slot(a, L_array.off[A_PTR], ZERO);
        set_slot(a, L_array.off[A_BLOCK], Py_None);
        set_slot(a, L_array.off[A_TRACKS], Py_False);
    }
    set_slot(a, L_array.off[A_FREED], Py_False);
    Py_XDECREF(block);
    Py_DECREF(shape_t);
    Py_DECREF(idv);
    Py_DECREF(now);
    Py_DECREF(n_o);
    Py_DECREF(nb_o);
    Py_DECREF(defaults);
    Py_DECREF(dt);
    return a;
error:
    Py_XDECREF(block);
    Py_XDECREF(a);  /* _freed is True: its __del__ does nothing */
    Py_XDECREF(shape_t);
    Py_XDECREF(idv);
    Py_XDECREF(now);
    Py_XDECREF(n_o);
    Py_XDECREF(nb_o);
    Py_DECREF(defaults);
    Py_DECREF(dt);
    return NULL;
python:
    PyErr_Clear();
    return PyObject_Vectorcall((PyObject *)cls, args, nargs, kwnames);
}

/* mr.deallocate(block), both held across the call */
static PyObject *give_block(PyObject *mr, PyObject *block) {
    PyObject *call[2] = {Py_NewRef(mr), Py_NewRef(block)};
    PyObject *r = PyObject_VectorcallMethod(STR_DEALLOCATE, call, 2, NULL);
    Py_DECREF(call[0]);
    Py_DECREF(call[1]);
    return r;
}

/* None for a result (free() returns None whatever deallocate returns), NULL for an error */
static inline PyObject *none_from(PyObject *r) {
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

/* NvArray.free(self, by="compute") */
static PyObject *array_free(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *by = AR_OWNER;
    if (!array_on || Py_TYPE(self) != L_array.type)
        goto python;
    if (kwnames != NULL) {
        if (nargs != 0 || PyTuple_GET_SIZE(kwnames) != 1 || PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), STR_BY))
            goto python;
        by = args[0];
    } else if (nargs == 1)
        by = args[0];
    else if (nargs > 1)
        goto python;
    if (!PyUnicode_CheckExact(by) || PyObject_Length(AR_DEFERRED) != 0)
        goto python;
    PyObject *id = SLOT(self, L_array, A_ID);
    if (id == NULL || !PyLong_CheckExact(id))
        goto python;
    Py_ssize_t stripe = PyLong_AsSsize_t(id);
    if (stripe < 0)
        goto python;
    PyObject *lock = PyTuple_GET_ITEM(AR_LOCKS, stripe & 63);
    if (!try_lock(lock))
        goto python;  /* another thread is changing an array of this stripe: wait in Python */
    PyObject *rc = SLOT(self, L_array, A_REF_COUNT), *owner = SLOT(self, L_array, A_OWNER);
    if (SLOT(self, L_array, A_FREED) != Py_False || rc == NULL || !PyLong_CheckExact(rc) || !is_zero(rc) ||
        owner == NULL || SLOT(self, L_array, A_VIEWS) != Py_None || SLOT(self, L_array, A_EXPORTS) != Py_None ||
        (owner != by && (!PyUnicode_CheckExact(owner) || PyUnicode_Compare(owner, by) != 0))) {
        PyErr_Clear();
        if (unlock(lock) < 0)
            return NULL;
        goto python;  /* the checks and their errors, from untouched state */
    }
    set_slot(self, L_array.off[A_FREED], Py_True);
    if (unlock(lock) < 0)
        return NULL;
    PyObject *block = SLOT(self, L_array, A_BLOCK), *mr = SLOT(self, L_array, A_MR);
    if (SLOT(self, L_array, A_PINNED) != Py_None || SLOT(self, L_array, A_KEEPALIVE) != Py_None)
        return none_from(PyObject_CallMethodNoArgs(self, STR_GIVE_BACK));
    if (SLOT(self, L_array, A_BASE) != Py_None || block == NULL || block == Py_None || mr == NULL)
        Py_RETURN_NONE;
    PyObject *r = give_block(mr, block);
    if (r == NULL)  /* the resource kept the block: the array stays live, free() can be called again */
        set_slot(self, L_array.off[A_FREED], Py_False);
    return none_from(r);
python:
    PyErr_Clear();
    if (AR_PY_FREE == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ignis._speedups: NvArray is not bound");
        return NULL;
    }
    return call_with_self(AR_PY_FREE, self, args, nargs, kwnames);
}

/* NvArray.__del__: a freed array costs one check; a dropped owning array returns its block */
static PyObject *array_del(PyObject *self, PyObject *unused) {
    if (!PyObject_TypeCheck(self, L_array.type))  /* bound to a class set up before this one */
        return PyObject_CallOneArg(AR_PY_DEL, self);
    PyObject *freed = SLOT(self, L_array, A_FREED);
    if (freed == NULL || freed == Py_True || finalizing())
        Py_RETURN_NONE;
    PyObject *block = SLOT(self, L_array, A_BLOCK), *mr = SLOT(self, L_array, A_MR);
    if (!array_on || Py_TYPE(self) != L_array.type || freed != Py_False || block == NULL || mr == NULL ||
        SLOT(self, L_array, A_PINNED) != Py_None || PyList_GET_SIZE(AR_IN_GC) != 1 ||
        PyList_GET_ITEM(AR_IN_GC, 0) != Py_False)
        return PyObject_CallOneArg(AR_PY_DEL, self);
    set_slot(self, L_array.off[A_FREED], Py_True);
    if (block == Py_None || SLOT(self, L_array, A_BASE) != Py_None || SLOT(self, L_array, A_KEEPALIVE) != Py_None)
        Py_RETURN_NONE;
    PyObject *r = give_block(mr, block);
    if (r == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        PyErr_Clear();  /* as the Python path: a failed return at collection is not raised */
    }
    Py_XDECREF(r);
    Py_RETURN_NONE;
}

/* -- DLPack: the deleter and capsule destructor of exported tensors ----------------------
 * A consumer (NumPy, PyTorch, CuPy) calls the deleter whenever it drops a tensor it
 * imported, and Python calls the capsule destructor when an unconsumed capsule dies;
 * either can happen in the interpreter's final garbage collection, after ignis's modules
 * were cleared and a ctypes callback object could have been freed. These are plain C
 * functions (an extension module stays loaded): they drop the export's entry from
 * ignis.array.dlpack_export._exports, and do nothing once the interpreter is finalizing. */
static PyObject *DL_EXPORTS;  /* struct address -> what keeps the exported tensor alive */

static void dl_forget(void *addr) {
    PyObject *key = PyLong_FromVoidPtr(addr);
    PyObject *cur = key ? PyDict_GetItemWithError(DL_EXPORTS, key) : NULL;
    if (cur != NULL) {
        Py_INCREF(cur);  /* released after the entry is gone: its finalizers may run Python code */
        if (PyDict_DelItem(DL_EXPORTS, key) < 0)
            PyErr_Clear();
        Py_DECREF(cur);
    }
    PyErr_Clear();
    Py_XDECREF(key);
}

static void dl_deleter(void *managed) {
    if (managed == NULL || DL_EXPORTS == NULL || !Py_IsInitialized())
        return;
    PyGILState_STATE g = PyGILState_Ensure();
    if (!finalizing()) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        dl_forget(managed);
        PyErr_Restore(et, ev, tb);
    }
    PyGILState_Release(g);
}

static void dl_capsule_destructor(PyObject *capsule) {
    static const char *names[] = {"dltensor", "dltensor_versioned"};
    if (DL_EXPORTS == NULL || finalizing())
        return;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    for (int i = 0; i < 2; i++)
        if (PyCapsule_IsValid(capsule, names[i])) {  /* unconsumed: the consumer renames it */
            void *p = PyCapsule_GetPointer(capsule, names[i]);
            if (p != NULL)
                dl_forget(p);
            break;
        }
    PyErr_Clear();
    PyErr_Restore(et, ev, tb);
}

/* dlpack_setup(exports) -> (deleter address, capsule destructor address) */
static PyObject *dlpack_setup(PyObject *self, PyObject *exports) {
    if (!PyDict_CheckExact(exports)) {
        PyErr_SetString(PyExc_TypeError, "dlpack_setup: expected the exports dict");
        return NULL;
    }
    Py_XSETREF(DL_EXPORTS, Py_NewRef(exports));
    return Py_BuildValue("(NN)", PyLong_FromVoidPtr((void *)dl_deleter),
                         PyLong_FromVoidPtr((void *)dl_capsule_destructor));
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, "Bind the Python classes and objects the fast paths use."},
    {"array_setup", array_setup, METH_VARARGS, "Bind NvArray and the objects its fast paths use."},
    {"array_enable", array_enable, METH_O, "Turn NvArray's fast paths on or off; returns the previous setting."},
    {"array_empty", (PyCFunction)(void (*)(void))array_empty, METH_FASTCALL | METH_KEYWORDS,
     "empty(shape, dtype=float32, *, device=None, stream=None, owner='compute', mr=None, tag=...)\n--\n\n"
     "Allocate an uninitialized array (the NvArray constructor; its common case runs in C).\n\n"
     "The arguments, what they default to and the errors are the NvArray constructor's: see NvArray."},
    {"dlpack_setup", dlpack_setup, METH_O,
     "Bind the DLPack exports dict; returns the C deleter's and capsule destructor's addresses."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "ignis._speedups", NULL, -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    STR_RECORDER = PyUnicode_InternFromString("recorder");
    STR_CHECKER = PyUnicode_InternFromString("checker");
    STR_ANY_MANUAL = PyUnicode_InternFromString("any_manual");
    STR_AUTO = PyUnicode_InternFromString("auto");
    STR_CONTEXT = PyUnicode_InternFromString("_context");
    STR_PROCESS = PyUnicode_InternFromString("_process");
    STR_CTX = PyUnicode_InternFromString("ctx");
    STR_STREAM = PyUnicode_InternFromString("stream");
    STR_TAG = PyUnicode_InternFromString("tag");
    STR_BACKEND = PyUnicode_InternFromString("_backend");
    STR_EPOCH = PyUnicode_InternFromString("epoch");
    STR_STATE = PyUnicode_InternFromString("state");
    STR_TRACK_ALL = PyUnicode_InternFromString("track_all");
    STR_ITEMSIZE = PyUnicode_InternFromString("itemsize");
    STR_ALLOCATE = PyUnicode_InternFromString("allocate");
    STR_DEALLOCATE = PyUnicode_InternFromString("deallocate");
    STR_GIVE_BACK = PyUnicode_InternFromString("_give_back");
    STR_BY = PyUnicode_InternFromString("by");
    STR_PTR = PyUnicode_InternFromString("ptr");
    STR_CLOSED = PyUnicode_InternFromString("_closed");
    AR_EMPTY_TUPLE = PyTuple_New(0);
    ZERO = PyLong_FromLong(0);
    NONBLOCKING_ARGS = PyTuple_Pack(1, Py_False);
    if (!STR_RECORDER || !STR_CHECKER || !STR_ANY_MANUAL || !STR_CTX || !STR_AUTO || !STR_CONTEXT || !STR_PROCESS ||
        !STR_STREAM || !STR_TAG || !ZERO || !NONBLOCKING_ARGS || !STR_BACKEND || !STR_EPOCH || !STR_STATE ||
        !STR_TRACK_ALL || !STR_ITEMSIZE || !STR_ALLOCATE || !STR_DEALLOCATE || !STR_GIVE_BACK || !STR_BY || !STR_PTR || !STR_CLOSED ||
        !AR_EMPTY_TUPLE) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
