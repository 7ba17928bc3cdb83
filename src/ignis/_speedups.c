/* ignis._speedups: the common cases of PoolResource.allocate / deallocate, of its
 * cross-stream tracking, and of ig.empty / NvArray.free / NvArray.__del__, in C.
 *
 * The pure-Python implementations in ignis/memory/pool.py and ignis/array/nvarray.py
 * are the reference and handle everything; these functions handle only the hot
 * case -- a block of exactly the requested size cached on the requesting stream,
 * no recorder, no sanitizer; a plain owning array with the default device, stream
 * and resource -- and call the Python implementation for anything else. They
 * check every precondition before changing anything, so a fallback always
 * starts from untouched state.
 *
 * Objects are the Python ones: the C side reads and writes their __slots__ at
 * offsets taken from the classes' member descriptors at setup(), and checks
 * exact types first, so a subclass or a foreign object takes the Python path.
 *
 * Locking: the pool's threading.Lock is taken without blocking; if another
 * thread holds it (it is in the Python path), the call falls back to the
 * Python path, which waits for it. Allocate and deallocate run no Python code
 * (the lock's and the generation counter's C functions are called directly).
 * The tracking paths queue driver calls, which may release the GIL, but only
 * while holding the pool's lock, as the Python path does; what they use across
 * those calls is held by strong references.
 *
 * Built as an optional extension: without a compiler the package still works
 * (IGNIS_PURE_PYTHON=1 forces the Python path, for tests and comparison).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <time.h>

/* Slot indices per class. */
enum { S_DEVICE, S_GENERATION, S_CLOSED, S_HANDLE, S_ORDERING, S_STREAM_N };        /* Stream */
enum { B_PTR, B_ALLOC_STREAM, B_BYTES, B_REQUESTED, B_TAG, B_GENERATION, B_STATE, B_WS, B_WE, B_RD,
       B_IMPL, B_N };                                                                /* DeviceBlock */
enum { K_PTR, K_SIZE, K_SEG, K_PREV, K_NEXT, K_FREE, K_STREAM, K_N };               /* pool _Block */
enum { F_SMALL, F_LARGE, F_COUNT, F_DIRTY, F_N };                                   /* _FreeList */
enum { C_BINS, C_N };                                                                /* _SizeClass */
enum { G_SMALL, G_N };                                                               /* _Segment */
enum { P_DEVICE, P_GENERATION, P_CLOSED, P_LOCK, P_LIVE, P_FREE, P_LIVE_BYTES, P_STATE, P_BACKEND, P_EVENTS,
       P_WAITS, P_N };                                                              /* PoolResource */
enum { E_FREE, E_N };                                                                /* EventPool */
enum { D_GENERATION, D_N };                                                          /* DeviceState */

static const char *STREAM_SLOTS[] = {"device", "_generation", "_closed", "handle", "ordering"};
static const char *BLOCK_SLOTS[] = {"ptr", "alloc_stream", "bytes", "requested", "tag", "generation", "state",
                                    "_ws", "_we", "_rd", "_impl"};
static const char *KBLOCK_SLOTS[] = {"ptr", "size", "seg", "prev", "next", "free", "stream"};
static const char *FREELIST_SLOTS[] = {"small", "large", "count", "dirty"};
static const char *SIZECLASS_SLOTS[] = {"bins"};
static const char *SEGMENT_SLOTS[] = {"small"};
static const char *POOL_SLOTS[] = {"device", "_generation", "_closed", "_lock", "_live", "_free", "_live_bytes",
                                   "_state", "_backend", "_events", "cross_stream_waits"};
static const char *EVPOOL_SLOTS[] = {"_free"};
static const char *STATE_SLOTS[] = {"generation"};

typedef struct {
    PyTypeObject *type;
    Py_ssize_t off[24];
} Layout;

static Layout L_stream, L_block, L_kblock, L_freelist, L_sizeclass, L_segment, L_pool, L_state, L_evpool;
static PyObject *LIVE, *RETIRED, *COUNTER, *HISTORY_DICT, *ORDERING_DICT, *PY_ALLOCATE, *PY_DEALLOCATE;
static PyObject *PY_PREPARE, *PY_FINISH, *ACC_READ, *ACC_WRITE, *ACC_RW;
/* the bound backend's tracking calls (Backend.tracking_calls(), bound by ignis.memory.pool) */
/* BK_OFF: a tuple of containers (the backend's trace listeners, its fork marker, a fault
 * wrapper's armed faults); while any of them is non-empty the tracking path stays in Python */
static PyObject *BK_BACKEND, *BK_STREAMS, *BK_EVENTS, *BK_CUR, *BK_RECORD, *BK_WAIT, *BK_OFF;
/* the driver's own entry points, when the backend could hand them over (else the binding functions) */
typedef int (*event_record_fn)(void *event, void *stream);
typedef int (*stream_wait_fn)(void *stream, void *event, unsigned int flags);
static event_record_fn RAW_RECORD;
static stream_wait_fn RAW_WAIT;
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
static unsigned long long N_RECORD, N_WAIT;  /* driver calls made from here, for counting tools */
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
    PyObject *stream, *block, *kblock, *freelist, *sizeclass, *segment, *pool, *state, *evpool, *live, *retired,
        *counter, *history, *ordering, *py_alloc, *py_dealloc, *py_prepare, *py_finish, *lock, *acc_r, *acc_w, *acc_rw;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOOOOOOOO", &stream, &block, &kblock, &freelist, &sizeclass, &segment,
                          &pool, &state, &evpool, &live, &retired, &counter, &history, &ordering, &py_alloc,
                          &py_dealloc, &py_prepare, &py_finish, &lock, &acc_r, &acc_w, &acc_rw))
        return NULL;
    ready = 0;
    if (layout_from(&L_stream, stream, STREAM_SLOTS, S_STREAM_N) || layout_from(&L_block, block, BLOCK_SLOTS, B_N) ||
        layout_from(&L_kblock, kblock, KBLOCK_SLOTS, K_N) ||
        layout_from(&L_freelist, freelist, FREELIST_SLOTS, F_N) ||
        layout_from(&L_sizeclass, sizeclass, SIZECLASS_SLOTS, C_N) ||
        layout_from(&L_segment, segment, SEGMENT_SLOTS, G_N) || layout_from(&L_pool, pool, POOL_SLOTS, P_N) ||
        layout_from(&L_state, state, STATE_SLOTS, D_N) || layout_from(&L_evpool, evpool, EVPOOL_SLOTS, E_N))
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
    Py_XSETREF(PY_PREPARE, Py_NewRef(py_prepare));
    Py_XSETREF(PY_FINISH, Py_NewRef(py_finish));
    Py_XSETREF(ACC_READ, Py_NewRef(acc_r));
    Py_XSETREF(ACC_WRITE, Py_NewRef(acc_w));
    Py_XSETREF(ACC_RW, Py_NewRef(acc_rw));
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
    if (fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ignis._speedups is not set up (ignis.memory.pool binds it)");
        return NULL;
    }
    return PyObject_Vectorcall(fn, args, nargsf, kwnames);
}

/* Release the pool's lock after an error, keeping the error; returns NULL. */
static PyObject *unlock_keeping_error(PyObject *lock) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    unlock(lock);
    PyErr_Restore(et, ev, tb);
    return NULL;
}

/* Release the pool's lock, then run the Python implementation from untouched state. */
static PyObject *unlock_then_python(PyObject *lock, PyObject *fn, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames) {
    PyErr_Clear();
    if (unlock(lock) < 0)
        return NULL;
    return fallback(fn, args, nargs, kwnames);
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
    return unlock_keeping_error(lock);
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
    return unlock_keeping_error(lock);
}


/* -- cross-stream tracking (TrackedResource.prepare_block_use / finish_block_use) --------
 * The same hazard rules as ignis/memory/resource.py, for PoolResource blocks passed as
 * DeviceBlock objects, on the bound backend (the cuda backend's handle tables and driver
 * entry points; any other backend's own methods), with the sanitizer
 * off; prepare only under "auto" ordering (finish records the same either way). A
 * write's prepare with outstanding reads, a BlockId, a closed or stale stream, an empty
 * event pool, a non-empty container of the binding's "off" tuple (trace listeners, armed
 * fault injection, a forked child) or a failing driver call take the Python path
 * (before any change, or after undoing it). */

/* Any other backend: its own event_record(event, stream_handle) and
 * stream_wait_event(stream_handle, event) methods are called (slower, same logic). */
static PyObject *bind_backend(PyObject *self, PyObject *args) {
    PyObject *backend, *record, *wait, *off;
    if (!PyArg_ParseTuple(args, "OOOO!", &backend, &record, &wait, &PyTuple_Type, &off))
        return NULL;
    Py_XSETREF(BK_BACKEND, Py_NewRef(backend));
    RAW_RECORD = NULL;
    RAW_WAIT = NULL;
    Py_CLEAR(BK_STREAMS);
    Py_CLEAR(BK_EVENTS);
    Py_CLEAR(BK_CUR);
    Py_XSETREF(BK_RECORD, Py_NewRef(record));
    Py_XSETREF(BK_WAIT, Py_NewRef(wait));
    Py_XSETREF(BK_OFF, Py_NewRef(off));
    Py_RETURN_NONE;
}

static PyObject *bind_cuda(PyObject *self, PyObject *args) {
    PyObject *backend, *streams, *events, *cur, *record, *wait, *off;
    unsigned long long raw_record = 0, raw_wait = 0;
    if (!PyArg_ParseTuple(args, "OO!O!OOOO!|KK", &backend, &PyDict_Type, &streams, &PyDict_Type, &events, &cur, &record,
                          &wait, &PyTuple_Type, &off, &raw_record, &raw_wait))
        return NULL;
    RAW_RECORD = raw_record && raw_wait ? (event_record_fn)(uintptr_t)raw_record : NULL;
    RAW_WAIT = raw_record && raw_wait ? (stream_wait_fn)(uintptr_t)raw_wait : NULL;
    Py_XSETREF(BK_BACKEND, Py_NewRef(backend));
    Py_XSETREF(BK_STREAMS, Py_NewRef(streams));
    Py_XSETREF(BK_EVENTS, Py_NewRef(events));
    Py_XSETREF(BK_CUR, Py_NewRef(cur));
    Py_XSETREF(BK_RECORD, Py_NewRef(record));
    Py_XSETREF(BK_WAIT, Py_NewRef(wait));
    Py_XSETREF(BK_OFF, Py_NewRef(off));
    Py_RETURN_NONE;
}

/* One driver call through the binding function `fn` with arguments (a, b[, 0]); 0 on CUDA_SUCCESS. */
static int drive(PyObject *fn, PyObject *a, PyObject *b, int with_flags) {
    PyObject *argv[3] = {a, b, ZERO};
    PyObject *res = PyObject_Vectorcall(fn, argv, with_flags ? 3 : 2, NULL);
    if (res == NULL)
        return -1;
    int bad = !PyTuple_Check(res) || PyTuple_GET_SIZE(res) < 1 || PyObject_IsTrue(PyTuple_GET_ITEM(res, 0)) != 0;
    Py_DECREF(res);
    return bad ? -1 : 0;
}

/* A backend method call (bind_backend); 0 when it returned without raising. */
static int call_method(PyObject *fn, PyObject *a, PyObject *b) {
    PyObject *argv[2] = {a, b};
    PyObject *res = PyObject_Vectorcall(fn, argv, 2, NULL);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

/* Queue on `stream` (a Stream) a record of event `ev` (a handle), or (wait=1) a wait
 * for it; 0 on success, -1 for the Python path. Driver calls can release the GIL, so
 * everything used across them is held by strong references taken here: the bound
 * backend's tables and functions (another thread may rebind), the handle table
 * entries (another thread may destroy the handles: the driver then reports an error). */
static int queue_call(int wait, PyObject *stream, PyObject *ev) {
    PyObject *h = SLOT(stream, L_stream, S_HANDLE);
    PyObject *fn = wait ? BK_WAIT : BK_RECORD;
    if (h == NULL || fn == NULL)
        return -1;
    PyObject *streams = BK_STREAMS, *events = BK_EVENTS, *cur = BK_CUR;
    event_record_fn raw_record = RAW_RECORD;
    stream_wait_fn raw_wait = RAW_WAIT;
    Py_INCREF(h);
    Py_INCREF(fn);
    Py_XINCREF(streams);
    Py_XINCREF(events);
    Py_XINCREF(cur);
    PyObject *sr = NULL, *er = NULL;
    int r = -1;
    if (streams == NULL) {  /* bind_backend: the backend's own methods */
        r = wait ? call_method(fn, h, ev) : call_method(fn, ev, h);
        goto out;
    }
    if (events == NULL || cur == NULL)
        goto out;
    sr = PyDict_GetItemWithError(streams, h);
    er = PyDict_GetItemWithError(events, ev);
    if (sr == NULL || er == NULL || !PyTuple_CheckExact(sr) || !PyTuple_CheckExact(er) || PyTuple_GET_SIZE(sr) != 2 ||
        PyTuple_GET_SIZE(er) != 2 || PyTuple_GET_ITEM(sr, 0) != PyTuple_GET_ITEM(er, 0)) {
        sr = er = NULL;
        goto out;
    }
    Py_INCREF(sr);
    Py_INCREF(er);
    {  /* the handles' context must be current on this thread */
        PyObject *cctx = PyObject_GetAttr(cur, STR_CTX);
        PyObject *dctx = cctx ? PyObject_GetAttr(PyTuple_GET_ITEM(sr, 0), STR_CTX) : NULL;
        int same = dctx != NULL && dctx == cctx;
        Py_XDECREF(dctx);
        Py_XDECREF(cctx);
        if (!same)
            goto out;
    }
    if (raw_record != NULL && raw_wait != NULL) {  /* the handles are the driver's pointers */
        void *e = PyLong_AsVoidPtr(ev), *st = PyLong_AsVoidPtr(h);
        if (PyErr_Occurred())
            goto out;
        int res;
        Py_BEGIN_ALLOW_THREADS
        res = wait ? raw_wait(st, e, 0) : raw_record(e, st);
        Py_END_ALLOW_THREADS
        r = res == 0 ? 0 : -1;
    } else {
        PyObject *so = PyTuple_GET_ITEM(sr, 1), *eo = PyTuple_GET_ITEM(er, 1);
        r = wait ? drive(fn, so, eo, 1) : drive(fn, eo, so, 0);
    }
out:
    Py_XDECREF(sr);
    Py_XDECREF(er);
    Py_XDECREF(cur);
    Py_XDECREF(events);
    Py_XDECREF(streams);
    Py_DECREF(fn);
    Py_DECREF(h);
    if (r == 0) {
        if (wait)
            N_WAIT++;
        else
            N_RECORD++;
    }
    return r;
}

static inline int record_on(PyObject *ev, PyObject *stream) { return queue_call(0, stream, ev); }

static inline int wait_on(PyObject *stream, PyObject *ev) { return queue_call(1, stream, ev); }

static PyObject *driver_calls(PyObject *self, PyObject *unused) {
    return Py_BuildValue("{s:K,s:K}", "event_record", N_RECORD, "stream_wait_event", N_WAIT);
}

/* A usable stream of this pool: open, of this device, of the current context. */
static inline int stream_ok(PyObject *pool, PyObject *s) {
    if (Py_TYPE(s) != L_stream.type || SLOT(s, L_stream, S_CLOSED) != Py_False ||
        SLOT(s, L_stream, S_DEVICE) != SLOT(pool, L_pool, P_DEVICE))
        return 0;
    PyObject *state = SLOT(pool, L_pool, P_STATE);
    if (state == NULL || Py_TYPE(state) != L_state.type)
        return 0;
    PyObject *g = SLOT(state, L_state, D_GENERATION), *sg = SLOT(s, L_stream, S_GENERATION);
    if (g == NULL || sg == NULL)
        return 0;
    if (g == sg)
        return 1;
    int eq = PyObject_RichCompareBool(g, sg, Py_EQ);
    if (eq < 0)
        PyErr_Clear();
    return eq == 1;
}

/* 1 when a use on `stream` now is under "auto" ordering (ignis.memory.ordering.policy). */
static int auto_ordering(PyObject *stream) {
    PyObject *manual = PyDict_GetItemWithError(ORDERING_DICT, STR_ANY_MANUAL);
    if (manual == Py_False)
        return 1;
    if (manual == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *p = SLOT(stream, L_stream, S_ORDERING);  /* the stream's own override */
    PyObject *owned = NULL;
    if (p == NULL || p == Py_None) {
        PyObject *var = PyDict_GetItemWithError(ORDERING_DICT, STR_CONTEXT);  /* a `with ordering(...)` scope */
        if (var == NULL || !PyContextVar_CheckExact(var) || PyContextVar_Get(var, NULL, &owned) < 0) {
            PyErr_Clear();
            return 0;
        }
        p = owned;
        if (p == NULL || p == Py_None)
            p = PyDict_GetItemWithError(ORDERING_DICT, STR_PROCESS);  /* the process's */
    }
    int is_auto = p != NULL && PyUnicode_Check(p) && PyUnicode_Compare(p, STR_AUTO) == 0;
    Py_XDECREF(owned);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return is_auto;
}

/* Preconditions shared by prepare and finish; 1 when the C path may run. */
static inline int tracking_ok(PyObject *pool, PyObject *block, PyObject *stream, PyObject *access) {
    if (!ready || BK_BACKEND == NULL || Py_TYPE(pool) != L_pool.type || Py_TYPE(block) != L_block.type ||
        (access != ACC_READ && access != ACC_WRITE && access != ACC_RW) || !hooks_off())
        return 0;
    PyObject *off = BK_OFF;
    if (off == NULL || !PyTuple_CheckExact(off))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(off); i++) {
        int busy = PyObject_IsTrue(PyTuple_GET_ITEM(off, i));  /* a dict or a list: no Python code runs */
        if (busy != 0) {
            PyErr_Clear();
            return 0;
        }
    }
    PyObject *backend = SLOT(pool, L_pool, P_BACKEND), *live = SLOT(pool, L_pool, P_LIVE),
             *events = SLOT(pool, L_pool, P_EVENTS), *waits = SLOT(pool, L_pool, P_WAITS);
    if (backend != BK_BACKEND || live == NULL || !PyDict_CheckExact(live) || events == NULL ||
        Py_TYPE(events) != L_evpool.type || waits == NULL || SLOT(pool, L_pool, P_LOCK) == NULL)
        return 0;
    PyObject *efree = SLOT(events, L_evpool, E_FREE);
    if (efree == NULL || !PyList_CheckExact(efree))
        return 0;
    return stream_ok(pool, stream);
}

static inline int is_zero(PyObject *v) { return v == ZERO || (PyLong_CheckExact(v) && PyObject_IsTrue(v) == 0); }

/* The block is live in this pool (caller holds the lock). */
static inline int live_here(PyObject *pool, PyObject *block) {
    PyObject *ptr = SLOT(block, L_block, B_PTR);
    if (ptr == NULL)
        return 0;
    PyObject *cur = PyDict_GetItemWithError(SLOT(pool, L_pool, P_LIVE), ptr);
    if (cur == NULL)
        PyErr_Clear();
    return cur == block;
}

/* Take an event from the pool's free list and record it on `stream`: 0 with *ev a new
 * reference; 1 for the Python path (no free event, or the record failed: the event is
 * back on the list); -1 on an error. */
static int record_pooled_event(PyObject *efree, PyObject *stream, PyObject **ev) {
    Py_ssize_t n = PyList_GET_SIZE(efree);
    if (n == 0)
        return 1;
    PyObject *e = Py_NewRef(PyList_GET_ITEM(efree, n - 1));
    if (PyList_SetSlice(efree, n - 1, n, NULL) < 0) {
        Py_DECREF(e);
        return -1;
    }
    if (record_on(e, stream) < 0) {
        PyList_Append(efree, e);
        Py_DECREF(e);
        return 1;
    }
    *ev = e;
    return 0;
}

static PyObject *tracked_prepare(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (kwnames != NULL || nargs < 4 || nargs > 5 || (nargs == 5 && args[4] != Py_None) ||
        !tracking_ok(args[0], args[1], args[2], args[3]) || !auto_ordering(args[2]))
        return fallback(PY_PREPARE, args, nargs, kwnames);
    PyObject *pool = args[0], *block = args[1], *stream = args[2], *access = args[3];
    PyObject *lock = SLOT(pool, L_pool, P_LOCK);
    if (!try_lock(lock))
        return fallback(PY_PREPARE, args, nargs, kwnames);
    if (!live_here(pool, block))
        goto python;
    PyObject *ws = SLOT(block, L_block, B_WS), *rd = SLOT(block, L_block, B_RD), *we = SLOT(block, L_block, B_WE);
    if (ws == NULL || rd == NULL || we == NULL)
        goto python;
    int writes = access != ACC_READ;
    int need_ws = ws != Py_None && ws != stream;
    int has_rd = rd != Py_None && PyObject_IsTrue(rd) == 1;
    if (writes && has_rd)
        goto python;  /* a write after reads: the Python path waits for each reader */
    if (!need_ws) {
        if (unlock(lock) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *events = SLOT(pool, L_pool, P_EVENTS);
    PyObject *efree = SLOT(events, L_evpool, E_FREE);
    PyObject *ev = NULL;
    int recorded = 0;
    if (is_zero(we)) {  /* the writer's end is not recorded yet: record it now */
        if (!stream_ok(pool, ws))
            goto python;
        int got = record_pooled_event(efree, ws, &ev);
        if (got != 0) {
            if (got < 0)
                goto error;
            goto python;
        }
        recorded = 1;
    } else {
        ev = Py_NewRef(we);
    }
    if (wait_on(stream, ev) < 0) {
        if (recorded)
            PyList_Append(efree, ev);
        Py_DECREF(ev);
        goto python;
    }
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL || add_to_slot(pool, L_pool.off[P_WAITS], one, 0) < 0) {
        Py_XDECREF(one);
        Py_DECREF(ev);
        goto error;
    }
    Py_DECREF(one);
    set_slot(block, L_block.off[B_WE], ev);
    Py_DECREF(ev);
    if (unlock(lock) < 0)
        return NULL;
    Py_RETURN_NONE;
python:
    return unlock_then_python(lock, PY_PREPARE, args, nargs, kwnames);
error:
    return unlock_keeping_error(lock);
}

/* Return each nonzero event of `rd`'s values to the pool list. */
static int put_reader_events(PyObject *efree, PyObject *rd) {
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(rd, &pos, &k, &v))
        if (!is_zero(v) && PyList_Append(efree, v) < 0)
            return -1;
    return 0;
}

static PyObject *tracked_finish(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (kwnames != NULL || nargs != 4 || !tracking_ok(args[0], args[1], args[2], args[3]))
        return fallback(PY_FINISH, args, nargs, kwnames);
    PyObject *pool = args[0], *block = args[1], *stream = args[2], *access = args[3];
    PyObject *lock = SLOT(pool, L_pool, P_LOCK);
    if (!try_lock(lock))
        return fallback(PY_FINISH, args, nargs, kwnames);
    if (!live_here(pool, block))
        goto python;
    PyObject *ws = SLOT(block, L_block, B_WS), *rd = SLOT(block, L_block, B_RD), *we = SLOT(block, L_block, B_WE);
    PyObject *alloc = SLOT(block, L_block, B_ALLOC_STREAM);
    if (ws == NULL || rd == NULL || we == NULL || alloc == NULL || (rd != Py_None && !PyDict_CheckExact(rd)))
        goto python;
    int writes = access != ACC_READ;
    PyObject *events = SLOT(pool, L_pool, P_EVENTS);
    PyObject *efree = SLOT(events, L_evpool, E_FREE);
    PyObject *ev;
    if (stream == alloc) {
        if (ws == stream && is_zero(we) && rd == Py_None)
            goto done;  /* clean on this stream: nothing to record */
        ev = Py_NewRef(ZERO);  /* the alloc stream's uses stay lazy */
    } else {  /* record the use's end on its stream */
        int got = record_pooled_event(efree, stream, &ev);
        if (got != 0) {
            if (got < 0)
                goto error;
            goto python;
        }
    }
    if (writes) {  /* the block's last write is now this one; older events go back */
        if ((!is_zero(we) && PyList_Append(efree, we) < 0) || (rd != Py_None && put_reader_events(efree, rd) < 0)) {
            Py_DECREF(ev);
            goto error;
        }
        set_slot(block, L_block.off[B_RD], Py_None);
        set_slot(block, L_block.off[B_WS], stream);
        set_slot(block, L_block.off[B_WE], ev);
    } else if (rd == Py_None) {
        PyObject *d = PyDict_New();
        if (d == NULL || PyDict_SetItem(d, stream, ev) < 0) {
            Py_XDECREF(d);
            Py_DECREF(ev);
            goto error;
        }
        set_slot(block, L_block.off[B_RD], d);
        Py_DECREF(d);
    } else {
        PyObject *old = PyDict_GetItemWithError(rd, stream);
        if ((old != NULL && !is_zero(old) && PyList_Append(efree, old) < 0) || PyDict_SetItem(rd, stream, ev) < 0) {
            Py_DECREF(ev);
            goto error;
        }
    }
    Py_DECREF(ev);
done:
    if (unlock(lock) < 0)
        return NULL;
    Py_RETURN_NONE;
python:
    return unlock_then_python(lock, PY_FINISH, args, nargs, kwnames);
error:
    return unlock_keeping_error(lock);
}

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
    if (!PyTuple_CheckExact(out) || PyTuple_GET_SIZE(out) != 4 || Py_TYPE(stream) != L_stream.type ||
        SLOT(stream, L_stream, S_CLOSED) != Py_False || PyDict_GetItemWithError(AR_BACKENDS, STR_BACKEND) !=
        PyTuple_GET_ITEM(f, 0))
        goto no;
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
        PyObject *ptr = Py_TYPE(block) == L_block.type ? Py_XNewRef(SLOT(block, L_block, B_PTR))
                                                       : PyObject_GetAttr(block, STR_PTR);
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
 * ignis.interop.dlpack._exports, and do nothing once the interpreter is finalizing. */
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

/* ---- The debug guard as PyTorch's CUDA allocator (ignis.torch._guard) ----------------------
 * torch.cuda.memory.CUDAPluggableAllocator loads ignis_torch_alloc / ignis_torch_free from this
 * library by name and calls them from C++ (any thread, GIL held or not):
 *     void *alloc(ssize_t size, int device, cudaStream_t stream)
 *     void free(void *ptr, ssize_t size, int device, cudaStream_t stream)
 * Each takes the GIL and calls the Python callable bound by torch_guard_bind(alloc, free) with
 * plain ints (size, device, stream handle) / (ptr, size, device, stream handle, poisoned); the
 * Python side (a DebugGuardResource over the pool) does the work; a free may first queue the
 * block's poison here (torch_guard_poison). An exception pending in the caller's thread
 * is kept aside and restored. A failed allocation returns NULL with its exception left pending, so
 * the PyTorch call that asked for the memory raises it (as SystemError, with the cause chained);
 * an exception in free is printed (PyErr_WriteUnraisable): a free has nobody to raise to. After
 * unbinding, and while the interpreter finalizes, allocations fail and frees are dropped (the
 * process is ending; the driver reclaims the memory). */
#define IGNIS_EXPORT __attribute__((visibility("default")))
static PyObject *TG_ALLOC, *TG_FREE;
static unsigned long long TG_CALLS[2];

IGNIS_EXPORT void *ignis_torch_alloc(ssize_t size, int device, void *stream);
IGNIS_EXPORT void ignis_torch_free(void *ptr, ssize_t size, int device, void *stream);

IGNIS_EXPORT void *ignis_torch_alloc(ssize_t size, int device, void *stream) {
    if (size <= 0 || !Py_IsInitialized())
        return NULL;
    void *ptr = NULL;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *fn = TG_ALLOC;
    if (fn == NULL || finalizing()) {
        PyGILState_Release(g);
        return NULL;
    }
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    Py_INCREF(fn);
    TG_CALLS[0]++;
    PyObject *a[3] = {PyLong_FromSsize_t(size), PyLong_FromLong(device), PyLong_FromVoidPtr(stream)};
    PyObject *r = (a[0] && a[1] && a[2]) ? PyObject_Vectorcall(fn, a, 3, NULL) : NULL;
    for (int i = 0; i < 3; i++)
        Py_XDECREF(a[i]);
    if (r != NULL) {
        ptr = r == Py_None ? NULL : PyLong_AsVoidPtr(r);
        Py_DECREF(r);
    }
    Py_DECREF(fn);
    if (PyErr_Occurred()) {
        ptr = NULL;
        Py_XDECREF(et);  /* the allocation's error is the one to raise */
        Py_XDECREF(ev);
        Py_XDECREF(tb);
    } else {
        PyErr_Restore(et, ev, tb);
    }
    PyGILState_Release(g);
    return ptr;
}

/* The poison a free writes, queued here before Python runs (the common case costs one driver
 * call and no Python wrapper): only for a block the guard handed out (a key of TG_BLOCKS), with
 * no record_stream streams to wait for first (not in TG_RS), on the device of the thread's
 * current context. Python is told whether it was queued. */
typedef int (*memset8_fn)(unsigned long long dst, unsigned char value, size_t n, void *stream);
typedef int (*ctx_device_fn)(int *device);
static memset8_fn TG_MEMSET;
static ctx_device_fn TG_CTX_DEVICE;
static int TG_POISON = -1;
static PyObject *TG_BLOCKS, *TG_RS;

static int poison_here(void *ptr, ssize_t size, int device, void *stream, PyObject *key) {
    if (TG_MEMSET == NULL || TG_POISON < 0 || TG_BLOCKS == NULL || key == NULL || size <= 0)
        return 0;
    if (PyDict_Contains(TG_BLOCKS, key) != 1 || (TG_RS != NULL && PySet_Contains(TG_RS, key) != 0)) {
        PyErr_Clear();
        return 0;
    }
    int cur = -1;
    if (TG_CTX_DEVICE == NULL || TG_CTX_DEVICE(&cur) != 0 || cur != device)
        return 0;
    return TG_MEMSET((unsigned long long)(uintptr_t)ptr, (unsigned char)TG_POISON, (size_t)size, stream) == 0;
}

IGNIS_EXPORT void ignis_torch_free(void *ptr, ssize_t size, int device, void *stream) {
    if (ptr == NULL || !Py_IsInitialized())
        return;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *fn = TG_FREE;
    if (fn != NULL && !finalizing()) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        Py_INCREF(fn);
        TG_CALLS[1]++;
        PyObject *key = PyLong_FromVoidPtr(ptr);
        int poisoned = poison_here(ptr, size, device, stream, key);
        PyObject *a[5] = {key, PyLong_FromSsize_t(size), PyLong_FromLong(device), PyLong_FromVoidPtr(stream),
                          PyBool_FromLong(poisoned)};
        PyObject *r = (a[0] && a[1] && a[2] && a[3]) ? PyObject_Vectorcall(fn, a, 5, NULL) : NULL;
        for (int i = 0; i < 5; i++)
            Py_XDECREF(a[i]);
        if (r == NULL)
            PyErr_WriteUnraisable(fn);
        Py_XDECREF(r);
        Py_DECREF(fn);
        PyErr_Restore(et, ev, tb);
    }
    PyGILState_Release(g);
}

/* torch_guard_poison(memset address, cuCtxGetDevice address, poison byte or -1, blocks dict, rs set):
 * let ignis_torch_free queue the poison itself (0 / -1 / None turn it off) */
static PyObject *torch_guard_poison(PyObject *self, PyObject *args) {
    unsigned long long ms, cd;
    int poison;
    PyObject *blocks, *rs;
    if (!PyArg_ParseTuple(args, "KKiOO", &ms, &cd, &poison, &blocks, &rs))
        return NULL;
    if ((blocks != Py_None && !PyDict_Check(blocks)) || (rs != Py_None && !PyAnySet_Check(rs))) {
        PyErr_SetString(PyExc_TypeError, "torch_guard_poison: expected a dict (or None) and a set (or None)");
        return NULL;
    }
    TG_POISON = -1;  /* off while the rest changes */
    TG_MEMSET = (memset8_fn)(uintptr_t)ms;
    TG_CTX_DEVICE = (ctx_device_fn)(uintptr_t)cd;
    Py_XSETREF(TG_BLOCKS, blocks == Py_None ? NULL : Py_NewRef(blocks));
    Py_XSETREF(TG_RS, rs == Py_None ? NULL : Py_NewRef(rs));
    TG_POISON = (ms && cd && TG_BLOCKS != NULL && poison >= 0 && poison <= 255) ? poison : -1;
    Py_RETURN_NONE;
}

/* torch_guard_bind(alloc, free) -> (calls to alloc so far, calls to free so far); None, None unbinds */
static PyObject *torch_guard_bind(PyObject *self, PyObject *args) {
    PyObject *a, *f;
    if (!PyArg_ParseTuple(args, "OO", &a, &f))
        return NULL;
    if ((a != Py_None && !PyCallable_Check(a)) || (f != Py_None && !PyCallable_Check(f))) {
        PyErr_SetString(PyExc_TypeError, "torch_guard_bind: expected two callables (or None, None)");
        return NULL;
    }
    Py_XSETREF(TG_ALLOC, a == Py_None ? NULL : Py_NewRef(a));
    Py_XSETREF(TG_FREE, f == Py_None ? NULL : Py_NewRef(f));
    return Py_BuildValue("(KK)", TG_CALLS[0], TG_CALLS[1]);
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, "Bind the Python classes and objects the fast paths use."},
    {"pool_allocate", (PyCFunction)(void (*)(void))pool_allocate, METH_FASTCALL | METH_KEYWORDS,
     "PoolResource.allocate's common case (falls back to the Python implementation)."},
    {"pool_deallocate", (PyCFunction)(void (*)(void))pool_deallocate, METH_FASTCALL | METH_KEYWORDS,
     "PoolResource.deallocate's common case (falls back to the Python implementation)."},
    {"bind_cuda", bind_cuda, METH_VARARGS, "Bind the cuda backend's tracking calls (handle tables, driver entry points)."},
    {"bind_backend", bind_backend, METH_VARARGS, "Bind another backend's event record / stream wait methods."},
    {"driver_calls", driver_calls, METH_NOARGS, "Event records and stream waits queued from the C path so far."},
    {"tracked_prepare", (PyCFunction)(void (*)(void))tracked_prepare, METH_FASTCALL | METH_KEYWORDS,
     "prepare_block_use's common case for PoolResource on the cuda backend (else the Python path)."},
    {"tracked_finish", (PyCFunction)(void (*)(void))tracked_finish, METH_FASTCALL | METH_KEYWORDS,
     "finish_block_use's common case for PoolResource on the cuda backend (else the Python path)."},
    {"array_setup", array_setup, METH_VARARGS, "Bind NvArray and the objects its fast paths use."},
    {"array_enable", array_enable, METH_O, "Turn NvArray's fast paths on or off; returns the previous setting."},
    {"array_empty", (PyCFunction)(void (*)(void))array_empty, METH_FASTCALL | METH_KEYWORDS,
     "empty(shape, dtype=float32, *, device=None, stream=None, owner='compute', mr=None, tag=...)\n--\n\n"
     "Allocate an uninitialized array (the NvArray constructor; its common case runs in C).\n\n"
     "The arguments, what they default to and the errors are the NvArray constructor's: see NvArray."},
    {"torch_guard_poison", torch_guard_poison, METH_VARARGS,
     "Let ignis_torch_free queue a freed block's poison itself (cuMemsetD8Async), for the guard's blocks."},
    {"torch_guard_bind", torch_guard_bind, METH_VARARGS,
     "Bind the Python allocate / free that ignis_torch_alloc / ignis_torch_free (PyTorch's pluggable "
     "allocator entry points) call; returns the call counts so far."},
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
    AR_EMPTY_TUPLE = PyTuple_New(0);
    ZERO = PyLong_FromLong(0);
    NONBLOCKING_ARGS = PyTuple_Pack(1, Py_False);
    if (!STR_RECORDER || !STR_CHECKER || !STR_ANY_MANUAL || !STR_CTX || !STR_AUTO || !STR_CONTEXT || !STR_PROCESS ||
        !STR_STREAM || !STR_TAG || !ZERO || !NONBLOCKING_ARGS || !STR_BACKEND || !STR_EPOCH || !STR_STATE ||
        !STR_TRACK_ALL || !STR_ITEMSIZE || !STR_ALLOCATE || !STR_DEALLOCATE || !STR_GIVE_BACK || !STR_BY || !STR_PTR ||
        !AR_EMPTY_TUPLE) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
