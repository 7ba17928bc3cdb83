/* ignis._speedups: the common case of PoolResource.allocate / deallocate in C.
 *
 * The pure-Python implementation in ignis/memory/pool.py is the reference and
 * handles everything; these functions handle only the hot case -- a block of
 * exactly the requested size cached on the requesting stream, no recorder, no
 * sanitizer -- and call the Python implementation for anything else. They
 * check every precondition before changing anything, so a fallback always
 * starts from untouched state.
 *
 * Objects are the Python ones: the C side reads and writes their __slots__ at
 * offsets taken from the classes' member descriptors at setup(), and checks
 * exact types first, so a subclass or a foreign object takes the Python path.
 *
 * Locking: the pool's threading.Lock is taken without blocking; if another
 * thread holds it (it is in the Python path), the call falls back to the
 * Python path, which waits for it. While these functions run they hold the
 * GIL and call no Python code (the lock's and the generation counter's C
 * functions are called directly), so no other thread can observe a half-done update.
 *
 * Built as an optional extension: without a compiler the package still works
 * (IGNIS_PURE_PYTHON=1 forces the Python path, for tests and comparison).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* Slot indices per class. */
enum { S_DEVICE, S_GENERATION, S_CLOSED, S_STREAM_N };                              /* Stream */
enum { B_PTR, B_ALLOC_STREAM, B_BYTES, B_REQUESTED, B_TAG, B_GENERATION, B_STATE, B_WS, B_WE, B_RD,
       B_IMPL, B_N };                                                                /* DeviceBlock */
enum { K_PTR, K_SIZE, K_SEG, K_PREV, K_NEXT, K_FREE, K_STREAM, K_N };               /* pool _Block */
enum { F_SMALL, F_LARGE, F_COUNT, F_DIRTY, F_N };                                   /* _FreeList */
enum { C_BINS, C_N };                                                                /* _SizeClass */
enum { G_SMALL, G_N };                                                               /* _Segment */
enum { P_DEVICE, P_GENERATION, P_CLOSED, P_LOCK, P_LIVE, P_FREE, P_LIVE_BYTES, P_STATE, P_N }; /* PoolResource */
enum { D_GENERATION, D_N };                                                          /* DeviceState */

static const char *STREAM_SLOTS[] = {"device", "_generation", "_closed"};
static const char *BLOCK_SLOTS[] = {"ptr", "alloc_stream", "bytes", "requested", "tag", "generation", "state",
                                    "_ws", "_we", "_rd", "_impl"};
static const char *KBLOCK_SLOTS[] = {"ptr", "size", "seg", "prev", "next", "free", "stream"};
static const char *FREELIST_SLOTS[] = {"small", "large", "count", "dirty"};
static const char *SIZECLASS_SLOTS[] = {"bins"};
static const char *SEGMENT_SLOTS[] = {"small"};
static const char *POOL_SLOTS[] = {"device", "_generation", "_closed", "_lock", "_live", "_free", "_live_bytes",
                                   "_state"};
static const char *STATE_SLOTS[] = {"generation"};

typedef struct {
    PyTypeObject *type;
    Py_ssize_t off[16];
} Layout;

static Layout L_stream, L_block, L_kblock, L_freelist, L_sizeclass, L_segment, L_pool, L_state;
static PyObject *LIVE, *RETIRED, *COUNTER, *HISTORY_DICT, *ORDERING_DICT, *PY_ALLOCATE, *PY_DEALLOCATE;
static PyObject *STR_RECORDER, *STR_CHECKER, *STR_STREAM, *STR_TAG;
/* threading.Lock's own C methods, called directly */
static PyTypeObject *LOCK_TYPE;
static PyCFunctionWithKeywords LOCK_ACQUIRE;
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
    l->type = (PyTypeObject *)cls;
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
    Py_INCREF(cls);
    return 0;
}

static PyObject *setup(PyObject *self, PyObject *args) {
    PyObject *stream, *block, *kblock, *freelist, *sizeclass, *segment, *pool, *state, *live, *retired, *counter,
        *history, *ordering, *py_alloc, *py_dealloc, *lock;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOO", &stream, &block, &kblock, &freelist, &sizeclass, &segment, &pool,
                          &state, &live, &retired, &counter, &history, &ordering, &py_alloc, &py_dealloc, &lock))
        return NULL;
    ready = 0;
    if (layout_from(&L_stream, stream, STREAM_SLOTS, S_STREAM_N) || layout_from(&L_block, block, BLOCK_SLOTS, B_N) ||
        layout_from(&L_kblock, kblock, KBLOCK_SLOTS, K_N) ||
        layout_from(&L_freelist, freelist, FREELIST_SLOTS, F_N) ||
        layout_from(&L_sizeclass, sizeclass, SIZECLASS_SLOTS, C_N) ||
        layout_from(&L_segment, segment, SEGMENT_SLOTS, G_N) || layout_from(&L_pool, pool, POOL_SLOTS, P_N) ||
        layout_from(&L_state, state, STATE_SLOTS, D_N))
        return NULL;
    if (Py_TYPE(counter)->tp_iternext == NULL) {
        PyErr_SetString(PyExc_TypeError, "setup: the generation counter must be an iterator");
        return NULL;
    }
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
    int ok = (ad->ml_flags & (METH_VARARGS | METH_KEYWORDS)) == (METH_VARARGS | METH_KEYWORDS) &&
             (rd->ml_flags & METH_NOARGS);
    Py_DECREF(acq);
    Py_DECREF(rel);
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "setup: unexpected calling convention of the lock's methods");
        return NULL;
    }
    LOCK_TYPE = lt;
    Py_INCREF(lt);
    LOCK_ACQUIRE = (PyCFunctionWithKeywords)(void (*)(void))ad->ml_meth;
    LOCK_RELEASE = rd->ml_meth;
    PyObject *hd = PyModule_GetDict(history), *od = PyModule_GetDict(ordering);
    if (hd == NULL || od == NULL)
        return NULL;
    Py_XSETREF(LIVE, Py_NewRef(live));
    Py_XSETREF(RETIRED, Py_NewRef(retired));
    Py_XSETREF(COUNTER, Py_NewRef(counter));
    Py_XSETREF(HISTORY_DICT, Py_NewRef(hd));
    Py_XSETREF(ORDERING_DICT, Py_NewRef(od));
    Py_XSETREF(PY_ALLOCATE, Py_NewRef(py_alloc));
    Py_XSETREF(PY_DEALLOCATE, Py_NewRef(py_dealloc));
    ready = 1;
    Py_RETURN_NONE;
}

/* True when no recorder and no sanitizer hook is installed (else the Python path runs). */
static inline int hooks_off(void) {
    PyObject *r = PyDict_GetItemWithError(HISTORY_DICT, STR_RECORDER);
    if (r != NULL && r != Py_None)
        return 0;
    PyObject *c = PyDict_GetItemWithError(ORDERING_DICT, STR_CHECKER);
    if (c != NULL && c != Py_None)
        return 0;
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* Non-blocking acquire: 1 taken, 0 busy (or error, cleared: the Python path will see it again). */
static inline int try_lock(PyObject *lock) {
    if (Py_TYPE(lock) != LOCK_TYPE)
        return 0;
    PyObject *r = LOCK_ACQUIRE(lock, NONBLOCKING_ARGS, NULL);
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

/* slot(obj) += delta for an int slot; -1 on error. */
static inline int add_to_slot(PyObject *obj, Py_ssize_t off, PyObject *delta, int subtract) {
    PyObject *old = *(PyObject **)((char *)obj + off);
    if (old == NULL) {
        PyErr_SetString(PyExc_AttributeError, "ignis._speedups: counter slot unset");
        return -1;
    }
    PyObject *v = subtract ? PyNumber_Subtract(old, delta) : PyNumber_Add(old, delta);
    if (v == NULL)
        return -1;
    set_slot(obj, off, v);
    Py_DECREF(v);
    return 0;
}

static inline PyObject *fallback(PyObject *fn, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return PyObject_Vectorcall(fn, args, nargsf, kwnames);
}

/* pool_allocate(pool, nbytes, stream=None, tag=...): bound to a PoolResource as its `allocate`. */
static PyObject *pool_allocate(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (!ready || nargs < 2 || nargs > 4)
        return fallback(PY_ALLOCATE, args, nargs, kwnames);
    PyObject *pool = args[0], *nb = args[1], *stream = nargs > 2 ? args[2] : NULL, *tag = nargs > 3 ? args[3] : NULL;
    if (kwnames != NULL) {  /* stream= and tag= by keyword */
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t i = 0; i < nk; i++) {
            PyObject *key = PyTuple_GET_ITEM(kwnames, i);
            if (stream == NULL && PyUnicode_Compare(key, STR_STREAM) == 0)
                stream = args[nargs + i];
            else if (tag == NULL && PyUnicode_Compare(key, STR_TAG) == 0)
                tag = args[nargs + i];
            else {
                PyErr_Clear();
                return fallback(PY_ALLOCATE, args, nargs, kwnames);
            }
        }
    }
    if (stream == NULL || Py_TYPE(pool) != L_pool.type || !PyLong_CheckExact(nb) || Py_TYPE(stream) != L_stream.type ||
        !hooks_off())
        return fallback(PY_ALLOCATE, args, nargs, kwnames);
    Py_ssize_t n = PyLong_AsSsize_t(nb);
    if (n <= 0) {
        PyErr_Clear();
        return fallback(PY_ALLOCATE, args, nargs, kwnames);  /* its error message */
    }
    PyObject *p_device = SLOT(pool, L_pool, P_DEVICE), *p_gen = SLOT(pool, L_pool, P_GENERATION);
    PyObject *s_gen = SLOT(stream, L_stream, S_GENERATION);
    if (p_device == NULL || p_gen == NULL || s_gen == NULL || SLOT(stream, L_stream, S_CLOSED) != Py_False ||
        SLOT(pool, L_pool, P_CLOSED) != Py_False || SLOT(stream, L_stream, S_DEVICE) != p_device)
        return fallback(PY_ALLOCATE, args, nargs, kwnames);
    if (s_gen != p_gen) {
        int eq = PyObject_RichCompareBool(s_gen, p_gen, Py_EQ);
        if (eq != 1) {
            PyErr_Clear();
            return fallback(PY_ALLOCATE, args, nargs, kwnames);
        }
    }
    if (n > PY_SSIZE_T_MAX - 511)
        return fallback(PY_ALLOCATE, args, nargs, kwnames);
    Py_ssize_t size = (n + 511) & ~(Py_ssize_t)511;
    int small = size <= (1 << 20);
    PyObject *lock = SLOT(pool, L_pool, P_LOCK), *free = SLOT(pool, L_pool, P_FREE), *live = SLOT(pool, L_pool, P_LIVE);
    if (lock == NULL || free == NULL || live == NULL || !PyDict_CheckExact(free) || !PyDict_CheckExact(live))
        return fallback(PY_ALLOCATE, args, nargs, kwnames);
    PyObject *sizeobj = PyLong_FromSsize_t(size);
    if (sizeobj == NULL)
        return NULL;
    if (!try_lock(lock)) {
        Py_DECREF(sizeobj);
        return fallback(PY_ALLOCATE, args, nargs, kwnames);
    }
    /* -- lock held: look, then change -- */
    PyObject *fl = PyDict_GetItemWithError(free, stream);
    PyObject *lst = NULL, *b = NULL;
    if (fl != NULL && Py_TYPE(fl) == L_freelist.type) {
        PyObject *cls = SLOT(fl, L_freelist, small ? F_SMALL : F_LARGE);
        if (cls != NULL && Py_TYPE(cls) == L_sizeclass.type) {
            PyObject *bins = SLOT(cls, L_sizeclass, C_BINS);
            if (bins != NULL && PyDict_CheckExact(bins))
                lst = PyDict_GetItemWithError(bins, sizeobj);
        }
    }
    if (lst != NULL && PyList_CheckExact(lst) && PyList_GET_SIZE(lst) > 0) {
        b = PyList_GET_ITEM(lst, PyList_GET_SIZE(lst) - 1);
        if (Py_TYPE(b) != L_kblock.type || SLOT(b, L_kblock, K_PTR) == NULL || SLOT(b, L_kblock, K_SIZE) == NULL ||
            SLOT(fl, L_freelist, F_COUNT) == NULL)
            b = NULL;
    }
    if (b == NULL) {  /* a miss: the Python path splits, coalesces, steals or grows */
        PyErr_Clear();
        Py_DECREF(sizeobj);
        if (unlock(lock) < 0)
            return NULL;
        return fallback(PY_ALLOCATE, args, nargs, kwnames);
    }
    PyObject *gen = NULL, *block = NULL;
    if (tag == NULL) {  /* the default tag: the Python function's own default */
        PyObject *defaults = PyFunction_Check(PY_ALLOCATE) ? PyFunction_GetDefaults(PY_ALLOCATE) : NULL;
        if (defaults == NULL || !PyTuple_Check(defaults) || PyTuple_GET_SIZE(defaults) < 1)
            goto bail;
        tag = PyTuple_GET_ITEM(defaults, PyTuple_GET_SIZE(defaults) - 1);
    }
    gen = Py_TYPE(COUNTER)->tp_iternext(COUNTER);
    if (gen == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "generation counter exhausted");
        goto fail;
    }
    block = L_block.type->tp_alloc(L_block.type, 0);
    if (block == NULL)
        goto fail;
    Py_INCREF(b);  /* keep it across the pop */
    if (PyList_SetSlice(lst, PyList_GET_SIZE(lst) - 1, PyList_GET_SIZE(lst), NULL) < 0) {
        Py_DECREF(b);
        goto fail;
    }
    PyObject *ptr = SLOT(b, L_kblock, K_PTR), *bsize = SLOT(b, L_kblock, K_SIZE);
    set_slot(block, L_block.off[B_PTR], ptr);
    set_slot(block, L_block.off[B_ALLOC_STREAM], stream);
    set_slot(block, L_block.off[B_BYTES], bsize);
    set_slot(block, L_block.off[B_REQUESTED], nb);
    set_slot(block, L_block.off[B_TAG], tag);
    set_slot(block, L_block.off[B_GENERATION], gen);
    set_slot(block, L_block.off[B_STATE], LIVE);
    set_slot(block, L_block.off[B_WS], stream);
    set_slot(block, L_block.off[B_WE], ZERO);
    set_slot(block, L_block.off[B_RD], Py_None);
    set_slot(block, L_block.off[B_IMPL], b);
    Py_CLEAR(gen);
    if (PyDict_SetItem(live, ptr, block) < 0) {
        PyList_Append(lst, b);  /* put it back; the block was never handed out */
        Py_DECREF(b);
        goto fail;
    }
    set_slot(b, L_kblock.off[K_FREE], Py_False);
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL || add_to_slot(fl, L_freelist.off[F_COUNT], one, 1) < 0 ||
        add_to_slot(pool, L_pool.off[P_LIVE_BYTES], bsize, 0) < 0) {
        Py_XDECREF(one);
        Py_DECREF(b);
        goto fail;  /* counters only: the block itself is consistent */
    }
    Py_DECREF(one);
    Py_DECREF(b);
    Py_DECREF(sizeobj);
    if (unlock(lock) < 0) {
        Py_DECREF(block);
        return NULL;
    }
    return block;
bail:
    Py_DECREF(sizeobj);
    if (unlock(lock) < 0)
        return NULL;
    return fallback(PY_ALLOCATE, args, nargs, kwnames);
fail:
    Py_XDECREF(gen);
    Py_XDECREF(block);
    Py_DECREF(sizeobj);
    {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        unlock(lock);
        PyErr_Restore(et, ev, tb);
    }
    return NULL;
}

/* pool_deallocate(pool, block): bound to a PoolResource as its `deallocate`. */
static PyObject *pool_deallocate(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (!ready || kwnames != NULL || nargs != 2)
        return fallback(PY_DEALLOCATE, args, nargs, kwnames);
    PyObject *pool = args[0], *block = args[1];
    if (Py_TYPE(pool) != L_pool.type || Py_TYPE(block) != L_block.type || !hooks_off())
        return fallback(PY_DEALLOCATE, args, nargs, kwnames);
    PyObject *lock = SLOT(pool, L_pool, P_LOCK), *free = SLOT(pool, L_pool, P_FREE), *live = SLOT(pool, L_pool, P_LIVE);
    PyObject *p_gen = SLOT(pool, L_pool, P_GENERATION), *p_device = SLOT(pool, L_pool, P_DEVICE);
    PyObject *ptr = SLOT(block, L_block, B_PTR), *stream = SLOT(block, L_block, B_ALLOC_STREAM);
    PyObject *b = SLOT(block, L_block, B_IMPL);
    if (lock == NULL || free == NULL || live == NULL || p_gen == NULL || p_device == NULL || ptr == NULL ||
        stream == NULL || b == NULL || !PyDict_CheckExact(free) || !PyDict_CheckExact(live) ||
        Py_TYPE(b) != L_kblock.type)
        return fallback(PY_DEALLOCATE, args, nargs, kwnames);
    /* the hazard record must be "clean on the alloc stream": nothing to order, no event to return */
    PyObject *we = SLOT(block, L_block, B_WE);
    if (SLOT(block, L_block, B_RD) != Py_None || SLOT(block, L_block, B_WS) != stream || we == NULL ||
        !PyLong_CheckExact(we) || PyObject_IsTrue(we) != 0)
        return fallback(PY_DEALLOCATE, args, nargs, kwnames);
    /* the context must not have been rebuilt since the pool was made */
    PyObject *state = SLOT(pool, L_pool, P_STATE);
    if (state == NULL || Py_TYPE(state) != L_state.type)
        return fallback(PY_DEALLOCATE, args, nargs, kwnames);
    PyObject *dgen = SLOT(state, L_state, D_GENERATION);
    if (dgen == NULL)
        return fallback(PY_DEALLOCATE, args, nargs, kwnames);
    if (dgen != p_gen) {
        int same = PyObject_RichCompareBool(dgen, p_gen, Py_EQ);
        if (same != 1) {
            PyErr_Clear();
            return fallback(PY_DEALLOCATE, args, nargs, kwnames);
        }
    }
    if (!try_lock(lock))
        return fallback(PY_DEALLOCATE, args, nargs, kwnames);
    /* -- lock held: check everything, then change -- */
    PyObject *cur = PyDict_GetItemWithError(live, ptr);
    PyObject *fl = cur == block ? PyDict_GetItemWithError(free, stream) : NULL;
    PyObject *lst = NULL, *seg = NULL, *bsize = NULL;
    if (fl != NULL && Py_TYPE(fl) == L_freelist.type && SLOT(fl, L_freelist, F_COUNT) != NULL) {
        seg = SLOT(b, L_kblock, K_SEG);
        bsize = SLOT(b, L_kblock, K_SIZE);
        if (seg != NULL && bsize != NULL && Py_TYPE(seg) == L_segment.type) {
            PyObject *cls = SLOT(fl, L_freelist, SLOT(seg, L_segment, G_SMALL) == Py_True ? F_SMALL : F_LARGE);
            if (cls != NULL && Py_TYPE(cls) == L_sizeclass.type) {
                PyObject *bins = SLOT(cls, L_sizeclass, C_BINS);
                if (bins != NULL && PyDict_CheckExact(bins))
                    lst = PyDict_GetItemWithError(bins, bsize);
            }
        }
    }
    if (lst == NULL || !PyList_CheckExact(lst)) {  /* not live here, or a new bin: the Python path */
        PyErr_Clear();
        if (unlock(lock) < 0)
            return NULL;
        return fallback(PY_DEALLOCATE, args, nargs, kwnames);
    }
    Py_INCREF(block);  /* the live map's reference goes away below */
    if (PyList_Append(lst, b) < 0)
        goto fail;
    if (PyDict_DelItem(live, ptr) < 0) {
        PyList_SetSlice(lst, PyList_GET_SIZE(lst) - 1, PyList_GET_SIZE(lst), NULL);
        goto fail;
    }
    set_slot(b, L_kblock.off[K_STREAM], stream);
    set_slot(b, L_kblock.off[K_FREE], Py_True);
    set_slot(block, L_block.off[B_WS], Py_None);
    set_slot(block, L_block.off[B_STATE], RETIRED);
    PyObject *prev = SLOT(b, L_kblock, K_PREV), *next = SLOT(b, L_kblock, K_NEXT);
    if ((prev != NULL && prev != Py_None && Py_TYPE(prev) == L_kblock.type && SLOT(prev, L_kblock, K_FREE) == Py_True) ||
        (next != NULL && next != Py_None && Py_TYPE(next) == L_kblock.type && SLOT(next, L_kblock, K_FREE) == Py_True))
        set_slot(fl, L_freelist.off[F_DIRTY], Py_True);
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL || add_to_slot(fl, L_freelist.off[F_COUNT], one, 0) < 0 ||
        add_to_slot(pool, L_pool.off[P_LIVE_BYTES], bsize, 1) < 0) {
        Py_XDECREF(one);
        goto fail;
    }
    Py_DECREF(one);
    Py_DECREF(block);
    if (unlock(lock) < 0)
        return NULL;
    Py_RETURN_NONE;
fail:
    Py_DECREF(block);
    {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        unlock(lock);
        PyErr_Restore(et, ev, tb);
    }
    return NULL;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, "Bind the Python classes and objects the fast paths use."},
    {"pool_allocate", (PyCFunction)(void (*)(void))pool_allocate, METH_FASTCALL | METH_KEYWORDS,
     "PoolResource.allocate's common case (falls back to the Python implementation)."},
    {"pool_deallocate", (PyCFunction)(void (*)(void))pool_deallocate, METH_FASTCALL | METH_KEYWORDS,
     "PoolResource.deallocate's common case (falls back to the Python implementation)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "ignis._speedups", NULL, -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    STR_RECORDER = PyUnicode_InternFromString("recorder");
    STR_CHECKER = PyUnicode_InternFromString("checker");
    STR_STREAM = PyUnicode_InternFromString("stream");
    STR_TAG = PyUnicode_InternFromString("tag");
    ZERO = PyLong_FromLong(0);
    NONBLOCKING_ARGS = PyTuple_Pack(1, Py_False);
    if (!STR_RECORDER || !STR_CHECKER || !STR_STREAM || !STR_TAG || !ZERO || !NONBLOCKING_ARGS) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
