// The PyTorch front end's op observer: each aten op's tensors, read below Python.
//
// A global RecordFunction callback (ATen's observer API, what PyTorch's profiler uses)
// sees every dispatcher call on every thread, its boxed inputs at the start and its
// outputs at the end. For each op the front end checks, it turns the tensors its spec
// names into byte ranges here, in C++, and hands the front end one list per op
// (``TorchFrontEnd._observed``). That replaces the TorchDispatchMode's Python handler,
// which boxes every argument into Python objects and runs the op again below itself.
//
// What is seen matches the dispatch mode's view: the outermost op the front end does
// not pass through. Ops that are CompositeImplicitAutograd without a kernel of the
// backend (linear, matmul, to, reshape) are passed through: their own ops are seen.
// Any op below a reported one (the kernels' own calls, autocast's casts of that op's
// arguments) belongs to it and is not seen again.
//
// Built by ``ignis.torch._native`` against the installed torch (its headers, its C++
// ABI) at first use and cached; loaded with ctypes.PyDLL. The C functions at the end
// are its whole interface.

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Stream.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

// Mode bits: the same values as ignis.safety.sanitizer's READ, WRITE, OUTPUT, NO_INIT_CHECK.
enum Kind : int { INACTIVE = 0, PASS = 1, REGULAR = 2, SPECIAL = 3 };

struct Arg {
  int pos;
  int mode;
  bool many;
};

struct Spec {
  int kind = INACTIVE;
  long index = -1;  // the front end's number for its OpSpec
  std::vector<Arg> in, out;
};

struct Item {
  uint64_t base, size, lo, hi, per, chunk;
  int mode;
};

struct Ctx : at::ObserverContext {
  Spec *spec = nullptr;
  c10::SmallVector<Item, 6> items;  // device tensors
  c10::SmallVector<Item, 2> host;   // host tensors (only while host checks are on)
  std::vector<c10::IValue> args; // a special op's inputs, for the front end's Python
  int device = -1;
  uint64_t epoch = 0;
  uint64_t pre_base = 0, pre_size = 0;  // a special op's first tensor before it ran (resize_)
};

struct KeyHash {
  size_t operator()(const std::pair<const char *, const char *> &k) const {
    return std::hash<const void *>()(k.first) * 31u + std::hash<const void *>()(k.second);
  }
};

std::mutex g_lock;  // the spec table
std::unordered_map<std::pair<const char *, const char *>, Spec *, KeyHash> g_specs;
PyObject *g_classify = nullptr;  // (name, overload) -> (kind, index, inputs, outputs)
PyObject *g_on_op = nullptr;     // (index, items, host, device, stream id, synced)
PyObject *g_on_special = nullptr;  // (index, args, outputs, device, stream id, synced)
std::atomic<bool> g_on{false};
std::atomic<bool> g_host_check{false};
std::atomic<uint64_t> g_epoch{0};  // bumped by the front end at each host synchronization
std::atomic<uint64_t> g_cpu_ops{0};
std::atomic<uint64_t> g_errors{0};
c10::DeviceType g_dev = c10::DeviceType::CUDA;
at::CallbackHandle g_handle = 0;

thread_local int t_depth = 0;     // inside an op being reported

inline bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}
thread_local bool t_busy = false; // inside the front end's Python (its own ops are not the program's)

// (span, period, chunk) in bytes of a non-contiguous view; period 0 when its bytes are
// not one regular set of chunks (then the span stands for them). As _frontend._pattern.
void pattern(const at::Tensor &t, uint64_t isz, uint64_t &span, uint64_t &per, uint64_t &chunk) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  auto sizes = t.sizes();
  auto strides = t.strides();
  for (size_t i = 0; i < sizes.size(); i++)
    if (sizes[i] > 1 && strides[i] > 0) dims.emplace_back(strides[i], sizes[i]);
  std::sort(dims.begin(), dims.end());
  int64_t s = 1;
  for (auto &d : dims) s += (d.second - 1) * d.first;
  int64_t ch = 1;
  size_t i = 0;
  while (i < dims.size() && dims[i].first == ch) {
    ch *= dims[i].second;
    i++;
  }
  bool regular = i < dims.size();
  for (size_t j = i; regular && j + 1 < dims.size(); j++)
    regular = dims[j + 1].first == dims[j].first * dims[j].second;
  int64_t p = regular && dims[i].first > ch ? dims[i].first : 0;
  span = (uint64_t)s * isz;
  per = (uint64_t)p * isz;
  chunk = p ? (uint64_t)ch * isz : 0;
}

// One tensor's access, into the device list or (a host tensor, host checks on) the host list.
void add(Ctx *c, const at::Tensor &t, int mode) {
  if (!t.defined() || !t.has_storage()) return;
  auto dt = t.device().type();
  bool dev = dt == g_dev;
  if (!dev && !(dt == c10::DeviceType::CPU && g_host_check.load(std::memory_order_relaxed))) return;
  uint64_t n = t.nbytes();
  if (!n) return;
  uint64_t p = (uint64_t)(uintptr_t)t.data_ptr();
  uint64_t isz = t.itemsize();
  Item it;
  it.base = p - (uint64_t)t.storage_offset() * isz;
  it.size = t.storage().nbytes();
  it.lo = p;
  it.mode = mode;
  if (t.is_contiguous()) {
    it.hi = p + n;
    it.per = it.chunk = 0;
  } else {
    uint64_t span;
    pattern(t, isz, span, it.per, it.chunk);
    it.hi = p + span;
  }
  if (dev) {
    c->items.push_back(it);
    if (c->device < 0) c->device = t.device().index();
  } else {
    c->host.push_back(it);
  }
}

void add_value(Ctx *c, const c10::IValue &v, int mode) {
  if (v.isTensor()) {
    add(c, v.toTensor(), mode);
  } else if (v.isTensorList()) {
    for (const at::Tensor &t : v.toTensorList().vec()) add(c, t, mode);
  } else if (v.isList()) {
    for (const c10::IValue &e : v.toListRef())
      if (e.isTensor()) add(c, e.toTensor(), mode);
  }
}

// Ask the front end how an op touches its tensors (once per op, with the GIL).
Spec *classify_slow(const char *name, const char *overload);

// A thread's own small cache in front of the locked table (the same op, over and over).
struct Recent {
  const char *name = nullptr, *overload = nullptr;
  Spec *spec = nullptr;
};
constexpr size_t RECENT = 256;
thread_local Recent t_recent[RECENT];
std::atomic<uint64_t> g_generation{0};  // bumped by each start: the caches' entries are dropped
thread_local uint64_t t_generation = ~0ull;

inline Spec *classify(const at::RecordFunction &fn) {
  const char *name = fn.name();
  const char *overload = fn.overload_name();
  uint64_t gen = g_generation.load(std::memory_order_relaxed);
  if (t_generation != gen) {
    for (auto &r : t_recent) r = Recent();
    t_generation = gen;
  }
  Recent &r = t_recent[(((uintptr_t)name >> 4) ^ ((uintptr_t)overload >> 4)) & (RECENT - 1)];
  if (r.name == name && r.overload == overload) return r.spec;
  Spec *spec = classify_slow(name, overload);
  r.name = name;
  r.overload = overload;
  r.spec = spec;
  return spec;
}

Spec *classify_slow(const char *name, const char *overload) {
  auto key = std::make_pair(name, overload);
  {
    std::lock_guard<std::mutex> g(g_lock);
    auto f = g_specs.find(key);
    if (f != g_specs.end()) return f->second;
  }
  auto *spec = new Spec();
  PyGILState_STATE st = PyGILState_Ensure();
  if (g_classify == nullptr) {  // stopped meanwhile (the stop holds the GIL)
    PyGILState_Release(st);
    delete spec;
    static Spec inactive;
    return &inactive;
  }
  t_busy = true;
  PyObject *r = PyObject_CallFunction(g_classify, "ss", name, overload ? overload : "");
  t_busy = false;
  if (r == nullptr || !PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 4) {
    g_errors++;
    if (r == nullptr) PyErr_WriteUnraisable(g_classify);
    spec->kind = INACTIVE;
  } else {
    spec->kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(r, 0));
    spec->index = PyLong_AsLong(PyTuple_GET_ITEM(r, 1));
    for (int side = 0; side < 2; side++) {
      PyObject *lst = PyTuple_GET_ITEM(r, 2 + side);
      Py_ssize_t n = PySequence_Size(lst);
      for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PySequence_GetItem(lst, i);
        Arg arg{(int)PyLong_AsLong(PyTuple_GetItem(a, 0)), (int)PyLong_AsLong(PyTuple_GetItem(a, 1)),
                PyObject_IsTrue(PyTuple_GetItem(a, 2)) == 1};
        Py_XDECREF(a);
        (side ? spec->out : spec->in).push_back(arg);
      }
    }
    if (PyErr_Occurred()) {
      g_errors++;
      PyErr_WriteUnraisable(g_classify);
      spec->kind = INACTIVE;
    }
  }
  Py_XDECREF(r);
  PyGILState_Release(st);
  std::lock_guard<std::mutex> g(g_lock);
  auto ins = g_specs.emplace(key, spec);
  if (!ins.second) delete spec;  // another thread classified it meanwhile
  return ins.first->second;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction &fn) {
  if (t_busy || t_depth > 0 || !g_on.load(std::memory_order_relaxed) || finalizing()) return nullptr;
  Spec *spec = classify(fn);
  if (spec->kind == PASS) return nullptr;
  auto c = std::make_unique<Ctx>();
  c->spec = spec;
  t_depth++;
  if (spec->kind == INACTIVE) return c;
  c->epoch = g_epoch.load(std::memory_order_relaxed);
  auto inputs = fn.inputs();
  if (spec->kind == SPECIAL) {
    c->args.assign(inputs.begin(), inputs.end());
    if (!inputs.empty() && inputs[0].isTensor()) {
      const at::Tensor &t = inputs[0].toTensor();
      if (t.defined() && t.has_storage() && t.device().type() == g_dev) {
        c->pre_base = (uint64_t)(uintptr_t)t.data_ptr() - (uint64_t)t.storage_offset() * t.itemsize();
        c->pre_size = t.storage().nbytes();
      }
    }
    return c;
  }
  for (const Arg &a : spec->in)
    if (a.pos < (int)inputs.size()) add_value(c.get(), inputs[a.pos], a.mode);
  return c;
}

inline PyObject *u64(uint64_t v) { return PyLong_FromUnsignedLongLong((unsigned long long)v); }

// The items as the sanitizer's foreign_access takes them: (base, size, lo, hi, period, chunk, mode).
PyObject *items_list(c10::ArrayRef<Item> v) {
  PyObject *lst = PyList_New((Py_ssize_t)v.size());
  for (size_t i = 0; i < v.size(); i++) {
    const Item &it = v[i];
    PyObject *t = PyTuple_New(7);
    PyTuple_SET_ITEM(t, 0, u64(it.base));
    PyTuple_SET_ITEM(t, 1, u64(it.size));
    PyTuple_SET_ITEM(t, 2, u64(it.lo));
    PyTuple_SET_ITEM(t, 3, u64(it.hi));
    PyTuple_SET_ITEM(t, 4, u64(it.per));
    PyTuple_SET_ITEM(t, 5, u64(it.chunk));
    PyTuple_SET_ITEM(t, 6, PyLong_FromLong(it.mode));
    PyList_SET_ITEM(lst, i, t);
  }
  return lst;
}

PyObject *wrap(const c10::IValue &v) {
  if (v.isTensor()) return THPVariable_Wrap(v.toTensor());
  if (v.isBool()) return PyBool_FromLong(v.toBool());
  if (v.isInt()) return PyLong_FromLongLong(v.toInt());
  if (v.isStream()) return THPStream_Wrap(v.toStream());
  if (v.isTensorList()) {
    auto ts = v.toTensorList().vec();
    PyObject *lst = PyList_New((Py_ssize_t)ts.size());
    for (size_t i = 0; i < ts.size(); i++) PyList_SET_ITEM(lst, i, THPVariable_Wrap(ts[i]));
    return lst;
  }
  Py_RETURN_NONE;  // what a special op's handling does not read
}

long long stream_id(int device) {
  if (g_dev == c10::DeviceType::CPU || device < 0) return 0;
  const auto *impl = c10::impl::getDeviceGuardImpl(g_dev);
  return (long long)impl->getStream(c10::Device(g_dev, (c10::DeviceIndex)device)).id();
}

void on_end(const at::RecordFunction &fn, at::ObserverContext *oc) {
  if (oc == nullptr) return;
  t_depth--;
  auto *c = static_cast<Ctx *>(oc);
  Spec *spec = c->spec;
  if (spec->kind == INACTIVE || !g_on.load(std::memory_order_relaxed) || finalizing()) return;
  const auto &outs = fn.outputs();
  bool synced = g_epoch.load(std::memory_order_relaxed) != c->epoch;
  if (spec->kind == REGULAR) {
    size_t nin = c->items.size();
    for (const Arg &a : spec->out) {
      if (a.pos >= (int)outs.size()) continue;
      size_t before = c->items.size();
      add_value(c, outs[a.pos], a.mode);
      for (size_t k = before; k < c->items.size();) {  // an alias of an input the schema does not annotate
        bool alias = false;
        for (size_t j = 0; j < nin && !alias; j++) alias = c->items[j].base == c->items[k].base;
        if (alias)
          c->items.erase(c->items.begin() + (long)k);
        else
          k++;
      }
    }
    if (c->items.empty() && c->host.empty()) {
      g_cpu_ops.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  } else if (c->device < 0) {  // a special op: its device is its first tensor's on this backend
    for (const auto &v : c->args)
      if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == g_dev) {
        c->device = v.toTensor().device().index();
        break;
      }
  }
  long long sid = stream_id(c->device);
  PyGILState_STATE st = PyGILState_Ensure();
  if (g_on_op == nullptr) {  // stopped meanwhile (the stop holds the GIL)
    PyGILState_Release(st);
    return;
  }
  t_busy = true;
  PyObject *r;
  if (spec->kind == REGULAR) {
    PyObject *argv[6] = {PyLong_FromLong(spec->index), items_list(c->items),
                         c->host.empty() ? (Py_INCREF(Py_None), Py_None) : items_list(c->host),
                         PyLong_FromLong(c->device), PyLong_FromLongLong(sid), synced ? Py_True : Py_False};
    Py_INCREF(argv[5]);
    r = PyObject_Vectorcall(g_on_op, argv, 6, nullptr);
    for (PyObject *a : argv) Py_DECREF(a);
  } else {
    PyObject *args = PyTuple_New((Py_ssize_t)c->args.size());
    for (size_t i = 0; i < c->args.size(); i++) PyTuple_SET_ITEM(args, i, wrap(c->args[i]));
    PyObject *out = outs.empty() ? (Py_INCREF(Py_None), Py_None) : wrap(outs[0]);
    r = PyObject_CallFunction(g_on_special, "lOOiLOKK", spec->index, args, out, c->device, sid,
                              synced ? Py_True : Py_False, (unsigned long long)c->pre_base,
                              (unsigned long long)c->pre_size);
    Py_DECREF(args);
    Py_DECREF(out);
  }
  if (r == nullptr) {
    g_errors++;
    PyErr_WriteUnraisable(spec->kind == REGULAR ? g_on_op : g_on_special);
  }
  Py_XDECREF(r);
  t_busy = false;
  PyGILState_Release(st);
}

}  // namespace

#define IGNIS_API __attribute__((visibility("default")))

extern "C" {

// Start observing: ``classify``, ``on_op`` and ``on_special`` are the front end's callables
// (kept referenced until ``ignis_obs_stop``); ``device_type`` the backend checked (c10's
// DeviceType: 1 CUDA, 0 CPU for tests). Returns 0, or -1 if already observing.
IGNIS_API int ignis_obs_start(PyObject *classify_fn, PyObject *on_op, PyObject *on_special, int device_type) {
  if (g_on.load()) return -1;
  {  // specs are never freed: a thread may still hold one in its cache
    std::lock_guard<std::mutex> g(g_lock);
    g_specs.clear();
  }
  g_generation++;
  Py_INCREF(classify_fn);
  Py_INCREF(on_op);
  Py_INCREF(on_special);
  g_classify = classify_fn;
  g_on_op = on_op;
  g_on_special = on_special;
  g_dev = (c10::DeviceType)device_type;
  g_cpu_ops = 0;
  g_errors = 0;
  g_host_check = false;
  g_handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                       .needsInputs(true)
                                       .needsOutputs(true)
                                       .scopes({at::RecordScope::FUNCTION}));
  g_on = true;
  return 0;
}

// Stop observing: the callback is removed (ops cost what they did before), and the
// callables are released. A call in flight on another thread still ends in on_end,
// which finds the observer off (this code is never unloaded).
IGNIS_API void ignis_obs_stop(void) {
  if (!g_on.load()) return;
  g_on = false;
  at::removeCallback(g_handle);
  g_handle = 0;
  Py_CLEAR(g_classify);
  Py_CLEAR(g_on_op);
  Py_CLEAR(g_on_special);
}

// Host tensors' accesses are collected too (pinned memory is tracked).
IGNIS_API void ignis_obs_host_check(int on) { g_host_check = on != 0; }

// The host waited for device work: an op in flight across this is marked synced.
IGNIS_API void ignis_obs_synced(void) { g_epoch.fetch_add(1, std::memory_order_relaxed); }

// Ops that touched host tensors only since the last call (taken and reset).
IGNIS_API unsigned long long ignis_obs_take_cpu_ops(void) { return g_cpu_ops.exchange(0); }

IGNIS_API unsigned long long ignis_obs_errors(void) { return g_errors.load(); }

// Whether any global RecordFunction callback (this one or another's) is registered.
IGNIS_API int ignis_obs_any_global(void) { return at::hasGlobalCallbacks() ? 1 : 0; }

}  // extern "C"
