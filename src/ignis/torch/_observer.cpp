// The PyTorch front end's op observer: each aten op's tensors, read below Python.
//
// A global RecordFunction callback (ATen's observer API, what PyTorch's profiler uses)
// sees every dispatcher call on every thread, its boxed inputs at the start and its
// outputs at the end. For each op the front end checks, it turns the tensors its spec
// names into byte ranges here, in C++, takes the user's stack (the front end's capture)
// and hands the op's accesses to the sanitizer itself (``Sanitizer.foreign_access``),
// packed: one call into Python per op, with no Python frame of the front end's between.
// (An op with host tensors while pinned memory is tracked, and ops with more to them
// than their schema, copies with a host side among them, go through the front end: ``TorchFrontEnd._observed`` and
// ``_observed_special``; a collective goes to ``_observed_collective`` at its start and end,
// with its arguments and outputs as Python objects.) That replaces the TorchDispatchMode's Python handler, which
// boxes every argument into Python objects and runs the op again below itself.
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

#include <cstdlib>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/GPUTrace.h>
#include <c10/core/impl/PyInterpreter.h>
#include <c10/util/SmallVector.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Export.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/Stream.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/version.h>

namespace torch::jit {
// libtorch_python's conversion of any IValue (lists of lists, a ProcessGroup, a Work) to Python.
TORCH_PYTHON_API pybind11::object toPyObject(c10::IValue ivalue);
}  // namespace torch::jit

#include <cxxabi.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <tuple>
#include <utility>
#include <vector>

namespace {

// Kinds of op (mode bits: the same values as ignis.safety.sanitizer's READ, WRITE, OUTPUT, ...).
// RECORD_STREAM: Tensor.record_stream, handed over as integers (its storage and the stream)
// instead of as Python objects. COLLECTIVE: the front end hears of its start too (the stream it
// runs on is told by the event waits inside it), and of its end even when it fails.
enum Kind : int { INACTIVE = 0, PASS = 1, REGULAR = 2, SPECIAL = 3, RECORD_STREAM = 4, COLLECTIVE = 5 };
constexpr int WRITE_BIT = 2;  // sanitizer.WRITE: such an argument is measured after the op (out= may resize it)

struct Arg {
  int pos;
  int mode;
  bool many;
};

struct Spec {
  int kind = INACTIVE;
  long index = -1;  // the front end's number for its OpSpec
  PyObject *name = nullptr;  // the op's name as reports show it (a reference, kept as long as the spec)
  int returns = 0;  // how many values the schema returns (none came back: the op failed)
  std::vector<Arg> in, out;
};

// One access, laid out as the sanitizer's packed items (pack_items: seven native int64s), so
// an op's items are handed over as they are.
struct Item {
  uint64_t base, size, lo, hi, per, chunk;
  int64_t mode;
};
static_assert(sizeof(Item) == 7 * sizeof(int64_t), "Item must match the sanitizer's packed item");

struct Ctx : at::ObserverContext {
  Spec *spec = nullptr;
  uint64_t generation = 0;          // the observing session it began in
  int unwinding = 0;                // std::uncaught_exceptions() at its start
  c10::SmallVector<Item, 6> items;  // device tensors
  c10::SmallVector<Item, 2> host;   // host tensors (only while host checks are on)
  c10::SmallVector<std::pair<c10::IValue, int>, 2> late;  // written arguments, measured after the op
  std::vector<c10::IValue> args;    // a special op's inputs, for the front end's Python
  int device = -1;
  uint64_t epoch = 0;
  bool has_pre = false;             // a special op's first tensor before it ran (resize_)
  uint64_t pre_base = 0, pre_size = 0;
  bool has_rs = false;              // record_stream of a tensor with bytes on this backend:
  uint64_t rs_base = 0;             // its storage, and the stream as (id, device index, device type)
  long long rs_id = 0;
  int rs_device = 0, rs_type = 0;
};

struct StreamKeyHash {
  size_t operator()(const std::tuple<int, long long, int> &k) const {
    return std::hash<long long>()(std::get<1>(k)) * 31u + (size_t)std::get<0>(k) * 7u + (size_t)std::get<2>(k);
  }
};

struct KeyHash {
  size_t operator()(const std::pair<const char *, const char *> &k) const {
    return std::hash<const void *>()(k.first) * 31u + std::hash<const void *>()(k.second);
  }
};

std::mutex g_lock;  // the spec table
std::unordered_map<std::pair<const char *, const char *>, Spec *, KeyHash> g_specs;
// The front end's callables, from ignis_obs_start (references held until ignis_obs_stop).
PyObject *g_classify = nullptr;    // (name, overload) -> (kind, index, inputs, outputs, returns, name)
PyObject *g_on_op = nullptr;       // (index, items, host, device, stream id, synced); items packed (bytes)
PyObject *g_on_special = nullptr;  // (index, args, output, device, stream id, synced, pre)
PyObject *g_on_collective = nullptr;  // (index, phase, args, outputs, device, stream id): phase 0 at the
                                      // start (args and outputs None), 1 at a good end, 2 at a failed one
// The direct path (all None when the front end's _observed is to see every op, as a test's does):
PyObject *g_san = nullptr;         // the Sanitizer: its foreign_access(stream handle, op name, frames, items,
                                   // synced) and extent_record_stream(storage base, stream handle), called
                                   // by name (an instance may have one replaced: a test's, a recorder's)
PyObject *g_foreign_name = nullptr, *g_record_stream_name = nullptr;
PyObject *g_capture = nullptr;     // () -> the user's frames
PyObject *g_stream = nullptr;      // (device, stream id) -> the handle of that device's current stream
PyObject *g_raw_stream = nullptr;  // (stream id, device index, device type) -> that stream's handle
PyObject *g_pending = nullptr;     // a list: the IgnisErrors found (raise mode raises them later)
PyObject *g_error_type = nullptr;  // IgnisError
PyObject *g_last_lib = nullptr;    // () -> whether the last capture was made from a library's code
// Stream handles by (device index, stream id, device type), filled from g_raw_stream / g_stream
// (a stream's id names one stream for the process's life). Read and written with the GIL.
std::unordered_map<std::tuple<int, long long, int>, PyObject *, StreamKeyHash> *g_handles = nullptr;
std::atomic<bool> g_on{false};
std::atomic<bool> g_host_check{false};
std::atomic<uint64_t> g_epoch{0};  // bumped by the front end at each host synchronization
std::atomic<uint64_t> g_cpu_ops{0};
std::atomic<uint64_t> g_ops{0};  // ops on device tensors handed to the sanitizer directly
std::atomic<uint64_t> g_errors{0};
std::atomic<uint64_t> g_generation{0};  // bumped by each start: older specs and contexts are dropped
c10::DeviceType g_dev = c10::DeviceType::CUDA;
at::CallbackHandle g_handle = 0;

thread_local int t_depth = 0;      // inside an op being reported
thread_local bool t_busy = false;  // inside the front end's Python (its own ops are not the program's)

inline bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// The GIL and the busy flag for one call into the front end, released on every path.
struct InPython {
  PyGILState_STATE st;
  InPython() : st(PyGILState_Ensure()) { t_busy = true; }
  ~InPython() {
    t_busy = false;
    PyGILState_Release(st);
  }
};

// A diagnostic (``ignis_obs_timing``): where the observer's own time goes inside a real step,
// off by default (then one relaxed load a span). Each slot sums the ns of its spans and counts
// them: the RecordFunction start and end callbacks (every call, the nested ones that return at
// once included), the GIL's taking in them, the user's stack capture and the sanitizer's call
// per checked op, and the trace events handled (the GIL's taking included).
enum TimerSlot : int { TM_START, TM_END, TM_GIL, TM_CAPTURE, TM_SANITIZER, TM_TRACE, TM_SLOTS };
std::atomic<bool> g_timing{false};
std::atomic<uint64_t> g_tm_ns[TM_SLOTS];
std::atomic<uint64_t> g_tm_n[TM_SLOTS];

// Now in ns where the timers run, else 0 (no clock read).
inline uint64_t tm_now() {
  if (!g_timing.load(std::memory_order_relaxed)) return 0;
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// A span of slot ``k`` that began at ``t0`` (tm_now(); 0: not timed) ends now.
inline void tm_add(int k, uint64_t t0) {
  if (t0 == 0) return;
  uint64_t t1 = tm_now();
  if (t1 == 0) return;  // (turned off meanwhile)
  g_tm_ns[k].fetch_add(t1 - t0, std::memory_order_relaxed);
  g_tm_n[k].fetch_add(1, std::memory_order_relaxed);
}

// A span of slot ``k`` for the scope it lives in.
struct TmSpan {
  int k;
  uint64_t t0;
  explicit TmSpan(int slot) : k(slot), t0(tm_now()) {}
  ~TmSpan() { tm_add(k, t0); }
};

// The GIL taken for the scope, its taking timed.
struct InPythonTimed {
  uint64_t t0;
  InPython py;
  InPythonTimed() : t0(tm_now()), py() { tm_add(TM_GIL, t0); }
};

// (span, period, chunk) in bytes of a non-contiguous view; period 0 when its bytes are
// not one regular set of chunks (then the span stands for them).
void pattern(const at::Tensor &t, uint64_t isz, uint64_t &span, uint64_t &per, uint64_t &chunk) {
  c10::SmallVector<std::pair<int64_t, int64_t>, 6> dims;  // (stride, size)
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

// One tensor's access as a packed item: false for a tensor without real memory (wrapped Python
// numbers, fake and functional tensors, sparse ones), which touches no bytes here. The one rule
// for every path: the observer's (dispatcher values) and the front end's Python (py_item,
// py_op_items below).
bool measure(const at::Tensor &t, int mode, Item &it) {
  if (!t.defined() || !t.has_storage() || t.unsafeGetTensorImpl()->is_wrapped_number()) return false;
  if (t.layout() != c10::kStrided) return false;
  uint64_t n = t.nbytes();
  if (!n) return false;
  const c10::Storage &st = t.storage();
  if (st.data() == nullptr) return false;
  uint64_t isz = t.itemsize();
  uint64_t p = (uint64_t)(uintptr_t)st.data() + (uint64_t)t.storage_offset() * isz;
  it.base = (uint64_t)(uintptr_t)st.data();
  it.size = st.nbytes();
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
  return true;
}

// One tensor's access, into the device list or (a host tensor, host checks on) the host list.
void add(Ctx *c, const at::Tensor &t, int mode) {
  if (!t.defined()) return;
  auto dt = t.device().type();
  bool dev = dt == g_dev;
  if (!dev && !(dt == c10::DeviceType::CPU && g_host_check.load(std::memory_order_relaxed))) return;
  Item it;
  if (!measure(t, mode, it)) return;
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

// The device index of the first tensor of this backend in ``v`` (lists and lists of lists
// searched; 0 for the host's tensors in the front end's test mode), or -1.
int device_of(const c10::IValue &v) {
  if (v.isTensor()) {
    const at::Tensor &t = v.toTensor();
    return t.defined() && t.device().type() == g_dev ? std::max<int>(0, t.device().index()) : -1;
  }
  if (v.isTensorList()) {
    for (const at::Tensor &t : v.toTensorList().vec())
      if (t.defined() && t.device().type() == g_dev) return std::max<int>(0, t.device().index());
    return -1;
  }
  if (v.isList()) {
    for (const c10::IValue &e : v.toListRef()) {
      int d = device_of(e);
      if (d >= 0) return d;
    }
  }
  return -1;
}

Spec g_pass{PASS};          // a record that is not an op (the autograd engine's node ranges, a
                            // custom Function's apply): what runs inside it is seen on its own
Spec g_inactive{INACTIVE};  // an op met while the observer stops

Spec *classify_slow(const at::RecordFunction &fn, const char *name, const char *overload);
long long stream_id(int device);
void call_collective(Ctx *c, int phase, const std::vector<c10::IValue> *outs, long long sid);

// A thread's own small cache in front of the locked table (the same ops, over and over).
// Only ops are cached: their names live as long as their schemas, so a pointer names one op.
struct Recent {
  const char *name = nullptr, *overload = nullptr;
  Spec *spec = nullptr;
};
constexpr size_t RECENT = 256;
thread_local Recent t_recent[RECENT];
thread_local uint64_t t_generation = ~0ull;

inline Spec *classify(const at::RecordFunction &fn, uint64_t gen) {
  const char *name = fn.name();
  const char *overload = fn.overload_name();
  if (t_generation != gen) {
    for (auto &r : t_recent) r = Recent();
    t_generation = gen;
  }
  Recent &r = t_recent[(((uintptr_t)name >> 4) ^ ((uintptr_t)overload >> 4)) & (RECENT - 1)];
  if (r.name == name && r.overload == overload) return r.spec;
  if (!fn.operator_name().has_value()) return &g_pass;  // not an op: never cached by its (heap) name
  Spec *spec = classify_slow(fn, name, overload);
  if (spec != &g_inactive) {
    r.name = name;
    r.overload = overload;
    r.spec = spec;
  }
  return spec;
}

Spec *classify_slow(const at::RecordFunction &fn, const char *name, const char *overload) {
  auto key = std::make_pair(name, overload);
  uint64_t gen = g_generation.load();
  {
    std::lock_guard<std::mutex> g(g_lock);
    auto f = g_specs.find(key);
    if (f != g_specs.end()) return f->second;
  }
  auto *spec = new Spec();
  {
    InPython py;
    if (g_classify == nullptr || g_generation.load() != gen) {  // stopped (or restarted) meanwhile
      delete spec;
      return &g_inactive;
    }
    PyObject *r = PyObject_CallFunction(g_classify, "ss", name, overload ? overload : "");
    if (r == nullptr || !PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 6 || !PyUnicode_Check(PyTuple_GET_ITEM(r, 5))) {
      g_errors++;
      if (r == nullptr) PyErr_WriteUnraisable(g_classify);
      spec->kind = INACTIVE;
    } else {
      spec->kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(r, 0));
      spec->index = PyLong_AsLong(PyTuple_GET_ITEM(r, 1));
      spec->returns = (int)PyLong_AsLong(PyTuple_GET_ITEM(r, 4));
      spec->name = PyTuple_GET_ITEM(r, 5);
      Py_INCREF(spec->name);  // never released: specs live for the process (see below)
      for (int side = 0; side < 2 && !PyErr_Occurred(); side++) {
        PyObject *lst = PyTuple_GET_ITEM(r, 2 + side);
        Py_ssize_t n = PySequence_Size(lst);
        for (Py_ssize_t i = 0; i < n && !PyErr_Occurred(); i++) {
          PyObject *a = PySequence_GetItem(lst, i);
          if (a == nullptr || !PyTuple_Check(a) || PyTuple_GET_SIZE(a) != 3) {
            Py_XDECREF(a);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "an argument spec is not a 3-tuple");
            break;
          }
          Arg arg{(int)PyLong_AsLong(PyTuple_GET_ITEM(a, 0)), (int)PyLong_AsLong(PyTuple_GET_ITEM(a, 1)),
                  PyObject_IsTrue(PyTuple_GET_ITEM(a, 2)) == 1};
          Py_DECREF(a);
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
  }
  Spec *kept = &g_inactive;
  bool used = false;
  {
    std::lock_guard<std::mutex> g(g_lock);
    if (g_generation.load() == gen) {  // (else restarted meanwhile: this spec's index is the old front end's)
      auto ins = g_specs.emplace(key, spec);
      used = ins.second;               // (else another thread classified it meanwhile)
      kept = ins.first->second;        // specs are never freed: a thread's cache may still point at one
    }
  }
  if (!used) {
    if (spec->name != nullptr) {
      PyGILState_STATE st = PyGILState_Ensure();
      Py_DECREF(spec->name);
      PyGILState_Release(st);
    }
    delete spec;
  }
  return kept;
}

std::unique_ptr<at::ObserverContext> start_op(const at::RecordFunction &fn) {
  uint64_t gen = g_generation.load(std::memory_order_relaxed);
  Spec *spec = classify(fn, gen);
  if (spec->kind == PASS) return nullptr;
  auto c = std::make_unique<Ctx>();
  c->spec = spec;
  c->generation = gen;
  c->unwinding = std::uncaught_exceptions();
  if (spec->kind != INACTIVE) {
    c->epoch = g_epoch.load(std::memory_order_relaxed);
    auto inputs = fn.inputs();
    if (spec->kind == RECORD_STREAM) {
      if (inputs.size() >= 2 && inputs[0].isTensor() && inputs[1].isStream()) {
        const at::Tensor &t = inputs[0].toTensor();
        if (t.defined() && t.has_storage() && t.device().type() == g_dev && t.nbytes() > 0 &&
            t.storage().data() != nullptr) {
          c10::Stream st = inputs[1].toStream();
          c->has_rs = true;
          c->rs_base = (uint64_t)(uintptr_t)t.storage().data();
          c->rs_id = (long long)st.id();
          c->rs_device = (int)st.device_index();
          c->rs_type = (int)st.device_type();
          c->device = t.device().index();
        }
      }
    } else if (spec->kind == COLLECTIVE) {
      c->args.assign(inputs.begin(), inputs.end());
      for (const auto &v : c->args)
        if ((c->device = device_of(v)) >= 0) break;
      if (c->device >= 0) {  // (a collective of host tensors only: not this backend's to check)
        InPython py;
        call_collective(c.get(), 0, nullptr, stream_id(c->device));
      }
    } else if (spec->kind == SPECIAL) {
      c->args.assign(inputs.begin(), inputs.end());
      if (!inputs.empty() && inputs[0].isTensor()) {
        const at::Tensor &t = inputs[0].toTensor();
        if (t.defined() && t.has_storage() && t.device().type() == g_dev) {
          c->has_pre = true;
          c->pre_base = (uint64_t)(uintptr_t)t.storage().data();
          c->pre_size = t.storage().nbytes();
        }
      }
    } else {
      for (const Arg &a : spec->in) {
        if (a.pos >= (int)inputs.size()) continue;
        if (a.mode & WRITE_BIT)
          c->late.emplace_back(inputs[a.pos], a.mode);
        else
          add_value(c.get(), inputs[a.pos], a.mode);
      }
    }
  }
  t_depth++;  // last: a throw above leaves the depth as it was
  return c;
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction &fn) {
  TmSpan span(TM_START);
  if (t_busy || t_depth > 0 || !g_on.load(std::memory_order_relaxed) || finalizing()) return nullptr;
  try {
    return start_op(fn);
  } catch (abi::__forced_unwind &) {  // the thread is being ended (a daemon thread at exit): let it
    throw;
  } catch (...) {  // a tensor this cannot measure: the op goes unseen, its own ops are seen
    g_errors++;
    return nullptr;
  }
}

// The items as the sanitizer's foreign_access takes them, packed: one bytes object, which the
// compiled sanitizer reads in place (no tuple or integer object per item).
PyObject *items_bytes(c10::ArrayRef<Item> v) {
  return PyBytes_FromStringAndSize(reinterpret_cast<const char *>(v.data()), (Py_ssize_t)(v.size() * sizeof(Item)));
}

// A special op's argument as the front end's Python reads it (None for what it does not read).
PyObject *wrap(const c10::IValue &v) {
  if (v.isTensor()) return THPVariable_Wrap(v.toTensor());
  if (v.isBool()) return PyBool_FromLong(v.toBool());
  if (v.isInt()) return PyLong_FromLongLong(v.toInt());
  if (v.isStream()) return THPStream_Wrap(v.toStream());
  if (v.isTensorList()) {
    auto ts = v.toTensorList().vec();
    PyObject *lst = PyList_New((Py_ssize_t)ts.size());
    if (lst == nullptr) return nullptr;
    for (size_t i = 0; i < ts.size(); i++) PyList_SET_ITEM(lst, i, THPVariable_Wrap(ts[i]));
    return lst;
  }
  Py_RETURN_NONE;
}

long long stream_id(int device) {
  if (g_dev == c10::DeviceType::CPU || device < 0) return 0;
  const auto *impl = c10::impl::getDeviceGuardImpl(g_dev);
  return (long long)impl->getStream(c10::Device(g_dev, (c10::DeviceIndex)device)).id();
}

void flush_backlog(bool force = false);  // (the backlog: below)

// Call the front end (the GIL held); nothing if this context's session is over.
void call_front_end(Ctx *c, const std::vector<c10::IValue> &outs, long long sid, bool synced) {
  Spec *spec = c->spec;
  PyObject *fn = spec->kind == REGULAR ? g_on_op : g_on_special;
  if (fn == nullptr || c->generation != g_generation.load()) return;  // stopped or restarted meanwhile
  flush_backlog();
  Py_INCREF(fn);  // a stop on another thread may drop the front end's reference during the call
  PyObject *argv[7] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  Py_ssize_t argc = 6;
  argv[0] = PyLong_FromLong(spec->index);
  if (spec->kind == REGULAR) {
    argv[1] = items_bytes(c->items);
    argv[2] = c->host.empty() ? (Py_INCREF(Py_None), Py_None) : items_bytes(c->host);
  } else if (spec->kind == RECORD_STREAM) {
    argv[1] = Py_BuildValue("(KLii)", (unsigned long long)c->rs_base, c->rs_id, c->rs_device, c->rs_type);
    argv[2] = (Py_INCREF(Py_None), Py_None);
    argv[6] = (Py_INCREF(Py_None), Py_None);
    argc = 7;
  } else {
    argv[1] = PyTuple_New((Py_ssize_t)c->args.size());
    for (size_t i = 0; argv[1] != nullptr && i < c->args.size(); i++) {
      PyObject *w = wrap(c->args[i]);
      if (w == nullptr) {
        Py_CLEAR(argv[1]);
        break;
      }
      PyTuple_SET_ITEM(argv[1], i, w);
    }
    argv[2] = outs.empty() ? (Py_INCREF(Py_None), Py_None) : wrap(outs[0]);
    argv[6] = c->has_pre ? Py_BuildValue("(KK)", (unsigned long long)c->pre_base, (unsigned long long)c->pre_size)
                         : (Py_INCREF(Py_None), Py_None);
    argc = 7;
  }
  argv[3] = PyLong_FromLong(c->device);
  argv[4] = PyLong_FromLongLong(sid);
  argv[5] = synced ? Py_True : Py_False;
  Py_INCREF(argv[5]);
  bool ok = true;
  for (Py_ssize_t i = 0; i < argc; i++) ok = ok && argv[i] != nullptr;
  PyObject *r = ok ? PyObject_Vectorcall(fn, argv, argc, nullptr) : nullptr;
  if (r == nullptr) {
    g_errors++;
    if (PyErr_Occurred()) PyErr_WriteUnraisable(fn);
  }
  Py_XDECREF(r);
  for (Py_ssize_t i = 0; i < argc; i++) Py_XDECREF(argv[i]);
  Py_DECREF(fn);
}

// The handle of stream ``sid`` of ``device`` (a new reference, or nullptr with the error set).
// ``current``: the device's current stream, as the front end names it (in its test mode, without
// CUDA, that changes at will: not cached then); else the stream (id, device, type) names.
PyObject *stream_handle(int device, long long sid, int type, bool current, PyObject *stream_fn, PyObject *raw_fn) {
  bool cache = !current || g_dev != c10::DeviceType::CPU;
  auto key = std::make_tuple(device, sid, type);
  if (cache && g_handles != nullptr) {
    auto f = g_handles->find(key);
    if (f != g_handles->end()) {
      Py_INCREF(f->second);
      return f->second;
    }
  }
  PyObject *h = current ? PyObject_CallFunction(stream_fn, "iL", device, sid)
                        : PyObject_CallFunction(raw_fn, "Lii", sid, device, type);
  if (h == nullptr || !cache || g_stream != stream_fn) return h;  // (stopped meanwhile: nothing cached past it)
  if (g_handles == nullptr) g_handles = new std::unordered_map<std::tuple<int, long long, int>, PyObject *, StreamKeyHash>();
  if (g_handles->emplace(key, h).second) Py_INCREF(h);  // the cache's reference (another call may have put one)
  return h;
}

// What the sanitizer found inside an op: an IgnisError waits in the front end's ``pending``
// (raise mode raises it when checking stops); anything else is unraisable, and counted.
void sanitizer_failed(PyObject *fn, PyObject *pending, PyObject *error_type) {
  if (error_type != nullptr && pending != nullptr && PyErr_ExceptionMatches(error_type)) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (v != nullptr && tb != nullptr) PyException_SetTraceback(v, tb);
    if (v == nullptr || PyList_Append(pending, v) != 0) {
      g_errors++;
      PyErr_Clear();
    }
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
    return;
  }
  g_errors++;
  if (PyErr_Occurred()) PyErr_WriteUnraisable(fn);
}

// A collective's start (phase 0) or end (1: it returned, 2: it failed) to the front end (the GIL
// held): its arguments and outputs go over as Python objects (a ProcessGroup, lists of lists).
void call_collective(Ctx *c, int phase, const std::vector<c10::IValue> *outs, long long sid) {
  PyObject *fn = g_on_collective;
  if (fn == nullptr || c->generation != g_generation.load()) return;
  flush_backlog();
  Py_INCREF(fn);
  auto convert = [](const std::vector<c10::IValue> &vs) -> PyObject * {
    PyObject *t = PyTuple_New((Py_ssize_t)vs.size());
    for (size_t i = 0; t != nullptr && i < vs.size(); i++) {
      PyObject *o = nullptr;
      try {
        o = torch::jit::toPyObject(vs[i]).release().ptr();
      } catch (pybind11::error_already_set &e) {
        e.restore();
        PyErr_Clear();
      } catch (...) {
      }
      if (o == nullptr) o = (Py_INCREF(Py_None), Py_None);  // a value Python cannot hold: not a tensor
      PyTuple_SET_ITEM(t, i, o);
    }
    return t;
  };
  PyObject *argv[6] = {PyLong_FromLong(c->spec->index), PyLong_FromLong(phase), nullptr, nullptr,
                       PyLong_FromLong(c->device), PyLong_FromLongLong(sid)};
  if (phase == 1) {
    argv[2] = convert(c->args);
    argv[3] = outs != nullptr ? convert(*outs) : (Py_INCREF(Py_None), Py_None);
  } else {
    argv[2] = (Py_INCREF(Py_None), Py_None);
    argv[3] = (Py_INCREF(Py_None), Py_None);
  }
  bool ok = true;
  for (auto *a : argv) ok = ok && a != nullptr;
  PyObject *r = ok ? PyObject_Vectorcall(fn, argv, 6, nullptr) : nullptr;
  if (r == nullptr) {
    g_errors++;
    if (PyErr_Occurred()) PyErr_WriteUnraisable(fn);
  }
  Py_XDECREF(r);
  for (auto *a : argv) Py_XDECREF(a);
  Py_DECREF(fn);
}

// A strong reference for the span of a call (a stop on another thread, while the call runs
// Python code, may drop the global one).
struct Held {
  PyObject *p;
  explicit Held(PyObject *o) : p(o) { Py_XINCREF(p); }
  ~Held() { Py_XDECREF(p); }
};

PyObject *g_trace_fn_free();  // the trace's free handler (below)

// ---- The backlog: the direct path's calls, handed to the sanitizer in batches ----------------
//
// A call per op into the sanitizer finds its code and data evicted from the CPU's caches by
// PyTorch's own work since the last op: the same calls take 1.5 µs an op back to back and 4.7
// with 1 MiB of other work between them (RESULTS, AB8). So the calls the direct path makes most
// (an op's accesses, the caching allocator's frees) are held here, each with everything it would
// have been made with then (the stream's handle, the stack, whether a library's code made it,
// whether the host synchronized inside the op), and made in a batch (g_backlog_max). The
// sanitizer runs the batch at each of its entry points before anything else, its lock held
// throughout (Sanitizer.set_drainer: this library's ``ignis_obs_drainer``), and the observer's
// own other calls (special ops, collectives, record_stream, the trace's other events) drain it
// first: a held call is only ever late, never reordered, and nothing reads the sanitizer's state
// before the calls held for it are made.
//
// Two forms of a held call. The Python form holds the call's arguments as objects, made with the
// GIL. The C form is held by a thread that runs no Python code inside ``backward()`` (PyTorch's
// autograd engine runs a device's backward ops on a thread of its own): its user's stack is the
// one ``backward()`` was called from (the open window, below), so it needs no capture, and it is
// held as C values, without the GIL: its Python arguments are made when it is made. The checker
// thread makes the held calls while the autograd thread goes on (the program's own thread that
// called ``backward()`` waits for it meanwhile, the GIL let go), so that the backward pass's
// checks cost its thread little more than measuring the tensors (RESULTS, AB2: a step is the
// host's work, one thread at a time); without it (the default), the thread that holds the batch's
// last call makes the batch, as the Python form does. The backlog (both forms, in the order they
// were held) is guarded by its own mutex, never held across a call into Python.
enum HeldForm : int { F_PY, F_OP, F_FREE };
struct Deferred {
  PyObject *target;   // the Python form: the Sanitizer (``name`` its method) or a handler (``name`` nullptr)
  PyObject *name;     // an interned method name (kept for the process's life), or nullptr
  PyObject *args[7];  // the call's arguments (references)
  int nargs;
  uint64_t generation;  // the session it belongs to: a later one drops it
  int form;
  // The C form: an op's (F_OP) or a free's (F_FREE), on stream ``sid`` of ``device``, under window ``window``.
  Spec *spec;
  int device, window;
  long long sid;
  bool synced;
  unsigned long thread;
  uint64_t ptr;                 // the free's pointer
  uint32_t first, count;        // the op's items, in the backlog's arena
};
// The batch: 256 calls, or IGNIS_OBSERVER_BATCH (1 to 4096) read at start (a diagnostic: 1 makes
// each call at once, as before the backlog, for comparisons in one run).
size_t g_backlog_max = 256;
std::mutex g_backlog_mu;
std::vector<Deferred> *g_backlog = nullptr;  // (both under g_backlog_mu)
std::vector<Item> *g_arena = nullptr;        // the C form's items
std::atomic<size_t> g_held{0};               // the backlog's length (read without the mutex)
PyObject *g_drain_name = nullptr;  // "drain"
PyObject *g_free_stacks_name = nullptr;  // "free_stacks"
std::atomic<bool> g_free_deferred{false};  // the trace's free handler is the sanitizer's own: frees are held
// Whether a held free takes its stack where it happens: it races only with uses on other streams
// (and a CUDA graph notes the frees of memory it replays on). Set, for the rest of the session,
// once the held calls show a second stream (note_stream) or the sanitizer's ``free_stacks`` says so.
bool g_free_stacks = false;
bool g_stream_seen = false;  // the held calls' first stream, while they show only one
uint64_t g_first_stream = 0;

// ---- Windows: ``backward()`` calls, for the C form ----
// The front end opens one around each ``backward()`` (PyTorch's _engine_run_backward) with the
// user's stack there: what a capture on the autograd engine's threads gives (the calling
// thread's frames, waiting in ``backward()``). The windows' (stack, library flag, stream) are
// kept in a small table for the session (the same call site opens the same one: same_stack);
// ``g_window`` names the open one, or -1: none open, more than one (nested, or from two threads
// at once), or the table full. Then every call is the Python form, as before.
struct Window {
  PyObject *frames;
  int lib;
  PyObject *stream;  // the front end's test mode (no CUDA): the stream current at the window's opening
};
constexpr size_t WINDOWS = 64;
std::vector<Window> g_windows;  // (the GIL held)
// The windows open now, with the thread that opened each (the GIL held): the open one counts
// only while it is the only one (a nested backward() closing gives the outer one back).
std::vector<std::pair<unsigned long, int>> g_open;
std::atomic<int> g_window{-1};

// Whether this thread runs no Python code now: it never ran any, or no Python frame is on its
// stack (CPython 3.11 and 3.12, whose thread state says so in its public struct; elsewhere
// false, and every call is the Python form). Read without the GIL: only this thread changes it.
inline bool frameless() {
#if !defined(PYPY_VERSION) && PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
  PyThreadState *ts = PyGILState_GetThisThreadState();
  return ts == nullptr || ts->cframe == nullptr || ts->cframe->current_frame == nullptr;
#else
  return false;
#endif
}

// ---- The checker thread: makes the C form's calls while the autograd thread goes on ----
// (on the heap and never destroyed: a condition variable's destructor at exit would wait for a
// checker thread still waiting on it, in a program that never stopped checking)
std::mutex &g_ck_mu = *new std::mutex();
std::condition_variable &g_ck_cv = *new std::condition_variable();
bool g_ck_due = false;  // (under g_ck_mu)
std::thread *g_checker = nullptr;          // (the GIL held)
// IGNIS_OBSERVER_CHECKER=1, and the thread runs (else the producer makes its batch; read without the GIL)
std::atomic<bool> g_checker_on{false};
// A checker thread's own flag to end (under g_ck_mu): a new thread started while an old one is
// being stopped has one of its own.
struct CheckerState {
  bool quit = false;
};
CheckerState *g_checker_state = nullptr;  // (the GIL held)
constexpr size_t CHECKER_WAKE = 64;        // C-form calls that wake it
constexpr size_t BACKLOG_LIMIT = 8192;     // a producer past this makes the batch itself
std::atomic<size_t> g_c_since{0};          // C-form calls held since the checker last woke
std::atomic<uint64_t> g_c_held{0};         // C-form calls held since the library loaded (tests, diagnostics)
// The C form's first stream (under g_backlog_mu), so that a free of the Python form takes its stack
// once the two forms' calls show two streams (note_stream sees the C form's only when it is made).
bool g_c_seen = false, g_c_streams = false, g_c_noted = false;  // any; more than one; the first noted
int g_c_device = 0, g_c_win = -1;
long long g_c_sid = 0;

void note_stream(PyObject *h) {
  uint64_t v = PyLong_Check(h) ? (uint64_t)PyLong_AsUnsignedLongLongMask(h) : (uint64_t)(uintptr_t)h;
  if (PyErr_Occurred()) {  // (an int that is not an address: count it as another stream)
    PyErr_Clear();
    g_free_stacks = true;
  } else if (!g_stream_seen) {
    g_first_stream = v;
    g_stream_seen = true;
  } else if (v != g_first_stream) {
    g_free_stacks = true;
  }
}

void release(Deferred &d) {
  if (d.form != F_PY) return;
  Py_DECREF(d.target);
  for (int i = 0; i < d.nargs; i++) Py_XDECREF(d.args[i]);
}

// Make one held call of the Python form (the GIL held, no exception set). An IgnisError it raises
// waits in the pending list, as a direct call's does.
void make_call(Deferred &d, PyObject *pending, PyObject *error_type) {
  PyObject *argv[8];
  PyObject *r;
  if (d.name != nullptr) {
    argv[0] = d.target;
    for (int i = 0; i < d.nargs; i++) argv[i + 1] = d.args[i];
    r = PyObject_VectorcallMethod(d.name, argv, (size_t)(d.nargs + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  } else {
    r = PyObject_Vectorcall(d.target, d.args, (size_t)d.nargs, nullptr);
  }
  if (r == nullptr) sanitizer_failed(d.target, pending, error_type);
  Py_XDECREF(r);
}

// The handle of a C-form call's stream (the GIL held; a new reference, or nullptr with the error
// set): the stream current at its window's opening where the window names one (the front end's
// test mode), else the stream ``sid`` of ``device``.
PyObject *c_stream_handle(int device, long long sid, int window) {
  if (window >= 0 && (size_t)window < g_windows.size() && g_windows[(size_t)window].stream != nullptr) {
    PyObject *h = g_windows[(size_t)window].stream;
    Py_INCREF(h);
    return h;
  }
  Held stream(g_stream), raw_stream(g_raw_stream);
  if (stream.p == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "ignis.torch: the op observer is off");
    return nullptr;
  }
  return stream_handle(device, sid, (int)g_dev, true, stream.p, raw_stream.p);
}

// Make one held call of the C form (the GIL held, no exception set), its arguments made now as
// the Python form's were made then: the stream's handle from its id, the window's stack.
void make_c_call(Deferred &d, const std::vector<Item> &arena, PyObject *pending, PyObject *error_type) {
  if (d.window < 0 || (size_t)d.window >= g_windows.size()) {  // (a stop cleared it: not made)
    g_errors++;
    return;
  }
  const Window &win = g_windows[(size_t)d.window];
  Held frames(win.frames);  // (a stop while a call below runs Python clears the table)
  int lib = win.lib;
  Held san(g_san), stream(g_stream);
  Held fn(d.form == F_FREE ? g_trace_fn_free() : nullptr);
  PyObject *target = d.form == F_FREE ? fn.p : san.p;
  if (target == nullptr || stream.p == nullptr) {  // (stopped meanwhile: not made)
    g_errors++;
    return;
  }
  PyObject *h = c_stream_handle(d.device, d.sid, d.window);
  if (h == nullptr) {
    sanitizer_failed(stream.p, pending, error_type);
    return;
  }
  note_stream(h);
  PyObject *r = nullptr;
  if (d.form == F_OP) {
    PyObject *items = PyBytes_FromStringAndSize(reinterpret_cast<const char *>(arena.data() + d.first),
                                                (Py_ssize_t)(d.count * sizeof(Item)));
    PyObject *from_lib = PyLong_FromLong(lib), *thread = PyLong_FromUnsignedLong(d.thread);
    if (items != nullptr && from_lib != nullptr && thread != nullptr) {
      PyObject *argv[8] = {san.p, h, d.spec->name, frames.p, items, d.synced ? Py_True : Py_False, from_lib, thread};
      r = PyObject_VectorcallMethod(g_foreign_name, argv, 8 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    }
    Py_XDECREF(items);
    Py_XDECREF(from_lib);
    Py_XDECREF(thread);
  } else {
    PyObject *ptr = PyLong_FromUnsignedLongLong(d.ptr);
    if (ptr != nullptr) {
      PyObject *argv[3] = {ptr, h, frames.p};
      r = PyObject_Vectorcall(fn.p, argv, 3, nullptr);
    }
    Py_XDECREF(ptr);
  }
  if (r == nullptr) sanitizer_failed(target, pending, error_type);
  Py_XDECREF(r);
  Py_DECREF(h);
}

// The held calls, made in order (the drainer: the sanitizer calls it under its lock).
PyObject *py_drain(PyObject *, PyObject *) {
  if (g_held.load() == 0) Py_RETURN_NONE;
  Held pending(g_pending), error_type(g_error_type);
  std::vector<Deferred> batch;
  std::vector<Item> arena;
  for (;;) {  // (a call that lets the GIL go may let another thread add more)
    batch.clear();
    arena.clear();
    {
      std::lock_guard<std::mutex> g(g_backlog_mu);
      if (g_backlog == nullptr || g_backlog->empty()) break;
      batch.swap(*g_backlog);
      if (g_arena != nullptr) arena.swap(*g_arena);
      g_held.store(0);
    }
    for (Deferred &d : batch) {
      if (d.generation == g_generation.load() && !finalizing()) {
        if (d.form == F_PY)
          make_call(d, pending.p, error_type.p);
        else
          make_c_call(d, arena, pending.p, error_type.p);
      }
      if (!finalizing()) release(d);  // (at exit the objects may be gone: left as they are)
    }
  }
  Py_RETURN_NONE;
}

PyMethodDef g_drain_def = {"ignis_observer_drain", py_drain, METH_NOARGS,
                           "Make the op observer's held calls into the sanitizer, in order."};

// Make the held calls now, through the sanitizer (its lock held), before a call that is not held.
// ``force``: even when none is held now (a stop or a start: another thread's drain may be making a
// batch it took, letting the GIL go in it; the sanitizer's lock waits for it to end).
void flush_backlog(bool force) {
  if (!force && g_held.load() == 0) return;
  Held san(g_san);
  PyObject *r = nullptr;
  if (san.p != nullptr) {
    PyObject *argv[1] = {san.p};
    r = PyObject_VectorcallMethod(g_drain_name, argv, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
  } else {
    r = py_drain(nullptr, nullptr);
  }
  if (r == nullptr) {
    g_errors++;
    if (PyErr_Occurred()) PyErr_WriteUnraisable(san.p);
  }
  Py_XDECREF(r);
}

// Append to the backlog (its mutex taken here); returns its length after.
size_t push_held(const Deferred &d, const Item *items, size_t n) {
  std::lock_guard<std::mutex> g(g_backlog_mu);
  if (g_backlog == nullptr) g_backlog = new std::vector<Deferred>();
  if (g_arena == nullptr) g_arena = new std::vector<Item>();
  Deferred &x = g_backlog->emplace_back(d);
  if (d.form != F_PY) {  // (the C form's streams: see hold_free)
    if (!g_c_seen) {
      g_c_seen = true;
      g_c_device = d.device;
      g_c_sid = d.sid;
      g_c_win = d.window;
    } else if (d.device != g_c_device || d.sid != g_c_sid ||
               (g_dev == c10::DeviceType::CPU && d.window != g_c_win)) {
      g_c_streams = true;
    }
  }
  if (n > 0) {
    x.first = (uint32_t)g_arena->size();
    x.count = (uint32_t)n;
    g_arena->insert(g_arena->end(), items, items + n);
  }
  size_t len = g_backlog->size();
  g_held.store(len);
  return len;
}

// Hold a call (``args``' references are taken over); the batch is made once it is full. A call
// that comes after the session's last drain (checking stopped while it was being measured: the
// stack's capture may let the GIL go) is made at once, as it would have been before.
void defer(PyObject *target, PyObject *name, PyObject **args, int nargs) {
  Deferred d{};
  d.target = target;
  d.name = name;
  d.nargs = nargs;
  d.generation = g_generation.load();
  d.form = F_PY;
  Py_INCREF(target);
  for (int i = 0; i < nargs; i++) d.args[i] = args[i];
  if (!g_on.load() || g_san == nullptr) {
    Held pending(g_pending), error_type(g_error_type);
    make_call(d, pending.p, error_type.p);
    release(d);
    return;
  }
  if (push_held(d, nullptr, 0) >= g_backlog_max) flush_backlog();
}

// Hold a call of the C form, without the GIL, where this thread may (the window open, no Python
// frame on it): false where it may not (the caller makes the Python form). The checker thread is
// woken every CHECKER_WAKE such calls; with no checker thread, or the backlog past its limit, the
// producer makes the batch itself, as the Python form does.
bool hold_c(Deferred &d, const Item *items, size_t n) {
  int w = g_window.load(std::memory_order_acquire);
  if (w < 0 || !frameless()) return false;
  d.window = w;
  d.thread = PyThread_get_thread_ident();
  size_t len = push_held(d, items, n);
  g_c_held.fetch_add(1, std::memory_order_relaxed);
  bool self = len >= BACKLOG_LIMIT || (!g_checker_on && len >= g_backlog_max);
  if (!self && g_checker_on && g_c_since.fetch_add(1, std::memory_order_relaxed) + 1 >= CHECKER_WAKE) {
    g_c_since.store(0, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> g(g_ck_mu);
      g_ck_due = true;
    }
    g_ck_cv.notify_one();
  }
  if (self && !finalizing()) {
    InPython py;
    PyObject *et, *ev, *etb;  // (an error already set on this thread is its caller's: kept)
    PyErr_Fetch(&et, &ev, &etb);
    flush_backlog();
    PyErr_Restore(et, ev, etb);
  }
  return true;
}

void checker_main(CheckerState *me) {
  PyGILState_STATE st = PyGILState_Ensure();  // (waits for the starting thread to let the GIL go)
  PyThreadState *ts = PyEval_SaveThread();
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(g_ck_mu);
      g_ck_cv.wait(lk, [me] { return g_ck_due || me->quit; });
      if (me->quit) break;
      g_ck_due = false;
    }
    if (finalizing()) break;  // (the interpreter would end this thread at the GIL's taking)
    PyEval_RestoreThread(ts);
    t_busy = true;
    flush_backlog();
    t_busy = false;
    ts = PyEval_SaveThread();
  }
  if (!finalizing()) {
    PyEval_RestoreThread(ts);
    PyGILState_Release(st);
  }
}

// In a child process forked meanwhile (a DataLoader's worker, say) the checker thread is not
// there, and a thread holding the backlog's mutex at the fork never gives it back: every call is
// the Python form there, the thread is forgotten and the locks are new.
void checker_forked() {
  g_window.store(-1);
  g_open.clear();  // (the windows of threads that are not in this process; no Python objects)
  g_checker = nullptr;  // (not joined, not freed: it is not this process's)
  g_checker_state = nullptr;
  g_checker_on = false;
  g_backlog_mu.unlock();  // (taken by checker_forking: no vector half written)
  new (&g_ck_mu) std::mutex();
  new (&g_ck_cv) std::condition_variable();
}

// Around a fork: the backlog whole in both processes (no thread is inside a change of it).
void checker_forking() { g_backlog_mu.lock(); }
void checker_forked_parent() { g_backlog_mu.unlock(); }

// Start the checker thread (the GIL held) where IGNIS_OBSERVER_CHECKER=1 asks for it. Not by
// default: it takes 0.6-0.95 ms a step of checks off a real model's autograd thread, but the
// steps did not read faster for it in lockstep runs on an H200 (RESULTS, AD2-AD5).
void checker_start() {
  static bool at_fork = pthread_atfork(checker_forking, checker_forked_parent, checker_forked) == 0;
  (void)at_fork;
  const char *v = std::getenv("IGNIS_OBSERVER_CHECKER");
  bool on = v != nullptr && v[0] == '1' && v[1] == '\0';
  if (!on || g_checker != nullptr) {
    g_checker_on = g_checker != nullptr;
    return;
  }
  g_c_since = 0;
  auto *state = new CheckerState();
  try {
    g_checker = new std::thread(checker_main, state);
    g_checker_state = state;
    g_checker_on = true;
  } catch (...) {  // (no thread: the producers make their batches, as without IGNIS_OBSERVER_CHECKER=1)
    delete state;
    g_checker_on = false;
    g_errors++;
  }
}

// Stop it (the GIL held; let go while it finishes a batch it is making).
void checker_stop() {
  std::thread *t = g_checker;
  CheckerState *state = g_checker_state;
  if (t == nullptr) return;
  g_checker = nullptr;  // (first, the GIL held: a second stop meanwhile finds none)
  g_checker_state = nullptr;
  g_checker_on = false;  // (from now on the producers make their batches themselves)
  {
    std::lock_guard<std::mutex> g(g_ck_mu);
    state->quit = true;
  }
  g_ck_cv.notify_all();
  bool joined = true;
  Py_BEGIN_ALLOW_THREADS
  try {
    t->join();
  } catch (...) {
    joined = false;
  }
  Py_END_ALLOW_THREADS
  if (joined) {
    delete t;
    delete state;
  } else {  // (left as they are: a joinable thread's destructor ends the process)
    g_errors++;
  }
}

// Close every window and let the table go (the GIL held; nothing can use it: the calls that
// name it were made, or belong to a finished session and are dropped unmade).
void windows_clear() {
  g_window.store(-1);
  g_open.clear();
  for (Window &w : g_windows) {
    Py_XDECREF(w.frames);
    Py_XDECREF(w.stream);
  }
  g_windows.clear();
}

// The C form's stream, noted (the GIL held) as the Python form's are, once it has calls held:
// else a free of the Python form between their holding and their making would not know of it.
void note_c_stream() {
  bool seen, multi, noted;
  int dev, win;
  long long sid;
  {
    std::lock_guard<std::mutex> g(g_backlog_mu);
    seen = g_c_seen;
    multi = g_c_streams;
    noted = g_c_noted;
    dev = g_c_device;
    win = g_c_win;
    sid = g_c_sid;
  }
  if (multi) {
    g_free_stacks = true;
    return;
  }
  if (!seen || noted) return;
  PyObject *h = c_stream_handle(dev, sid, win);
  if (h == nullptr) {  // (unsure: the stacks are taken)
    PyErr_Clear();
    g_free_stacks = true;
    return;
  }
  note_stream(h);
  Py_DECREF(h);
  std::lock_guard<std::mutex> g(g_backlog_mu);  // (after: the handle's lookup may let the GIL go)
  g_c_noted = true;
}

// A free of the caching allocator, held (``argv``: the pointer and the current stream's handle,
// references taken over). Its stack is taken now where the free can need it (``g_free_stacks``).
void hold_free(PyObject *fn, PyObject **argv) {
  note_stream(argv[1]);
  if (!g_free_stacks) note_c_stream();
  Held san(g_san);
  if (!g_free_stacks && san.p != nullptr) {
    PyObject *v = PyObject_GetAttr(san.p, g_free_stacks_name);
    int t = v != nullptr ? PyObject_IsTrue(v) : -1;
    Py_XDECREF(v);
    if (t < 0) {  // (when unsure, the stack is taken)
      PyErr_Clear();
      g_errors++;
    }
    g_free_stacks = t != 0;
  }
  PyObject *frames = nullptr;
  Held capture(g_capture);
  if (g_free_stacks && capture.p != nullptr) {
    frames = PyObject_CallNoArgs(capture.p);
    if (frames == nullptr) {  // (the free is still checked; a report of it would show no stack)
      PyErr_Clear();
      g_errors++;
    }
  }
  if (frames == nullptr) frames = (Py_INCREF(Py_None), Py_None);
  argv[2] = frames;
  defer(fn, nullptr, argv, 3);
}

// A regular op's accesses, or a record_stream, to the sanitizer (the GIL held): the accesses
// held in the backlog, record_stream made at once.
void call_sanitizer(Ctx *c, long long sid, bool synced) {
  Spec *spec = c->spec;
  Held san(g_san), capture(g_capture), stream(g_stream), raw_stream(g_raw_stream), pending(g_pending),
      error_type(g_error_type), last_lib(g_last_lib);
  if (spec->kind == RECORD_STREAM) {
    flush_backlog();
    PyObject *h = stream_handle(c->rs_device, c->rs_id, c->rs_type, false, stream.p, raw_stream.p);
    PyObject *base = h != nullptr ? PyLong_FromUnsignedLongLong(c->rs_base) : nullptr;
    PyObject *r = nullptr;
    if (base != nullptr) {
      PyObject *argv[3] = {san.p, base, h};
      r = PyObject_VectorcallMethod(g_record_stream_name, argv, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    }
    if (r == nullptr) sanitizer_failed(h == nullptr ? raw_stream.p : san.p, pending.p, error_type.p);
    Py_XDECREF(r);
    Py_XDECREF(base);
    Py_XDECREF(h);
    return;
  }
  g_ops.fetch_add(1, std::memory_order_relaxed);  // before any Python code runs: a stop and a start could intervene
  PyObject *h = stream_handle(c->device, sid, (int)g_dev, true, stream.p, raw_stream.p);
  if (h == nullptr) {
    sanitizer_failed(stream.p, pending.p, error_type.p);
    return;
  }
  uint64_t t0 = tm_now();
  PyObject *frames = PyObject_CallNoArgs(capture.p);
  // (read right after the capture, on its thread: the held call cannot ask later)
  int lib = 0;
  if (frames != nullptr && last_lib.p != nullptr) {
    PyObject *from_lib = PyObject_CallNoArgs(last_lib.p);
    lib = from_lib != nullptr ? PyObject_IsTrue(from_lib) : -1;
    Py_XDECREF(from_lib);
    if (lib < 0) Py_CLEAR(frames);  // (its error is set: reported below)
  }
  tm_add(TM_CAPTURE, t0);
  PyObject *items = frames != nullptr ? items_bytes(c->items) : nullptr;
  if (items == nullptr) {
    sanitizer_failed(frames == nullptr ? capture.p : san.p, pending.p, error_type.p);
    Py_XDECREF(frames);
    Py_DECREF(h);
    return;
  }
  note_stream(h);
  Py_INCREF(spec->name);
  PyObject *s = synced ? Py_True : Py_False;
  Py_INCREF(s);
  // (the thread, for the sanitizer's checks that depend on it: the call may be made on another)
  PyObject *args[7] = {h, spec->name, frames, items, s, PyLong_FromLong(lib),
                       PyLong_FromUnsignedLong(PyThread_get_thread_ident())};
  if (args[5] == nullptr || args[6] == nullptr) {
    sanitizer_failed(san.p, pending.p, error_type.p);
    for (PyObject *a : args) Py_XDECREF(a);
    return;
  }
  t0 = tm_now();
  defer(san.p, g_foreign_name, args, 7);  // (the references are the backlog's now)
  tm_add(TM_SANITIZER, t0);
}

// A regular op's accesses held in the C form (see the backlog), without the GIL, where this
// thread may: false where it may not, or where the direct path is not this session's.
bool hold_op(Ctx *c, long long sid, bool synced) {
  if (g_window.load(std::memory_order_relaxed) < 0 || c->generation != g_generation.load()) return false;
  Deferred d{};
  d.generation = c->generation;
  d.form = F_OP;
  d.spec = c->spec;
  d.device = c->device;
  d.sid = sid;
  d.synced = synced;
  if (!hold_c(d, c->items.data(), c->items.size())) return false;
  g_ops.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// The op's fresh outputs (its spec's), after its inputs' items: an output that aliases an input
// the schema does not annotate is that input's access, not a second one.
void add_outputs(Ctx *c, Spec *spec, const std::vector<c10::IValue> &outs) {
  size_t nin = c->items.size();
  for (const Arg &a : spec->out) {
    if (a.pos >= (int)outs.size()) continue;
    size_t before = c->items.size();
    add_value(c, outs[a.pos], a.mode);
    for (size_t k = before; k < c->items.size();) {
      bool alias = false;
      for (size_t j = 0; j < nin && !alias; j++) alias = c->items[j].base == c->items[k].base;
      if (alias)
        c->items.erase(c->items.begin() + (long)k);
      else
        k++;
    }
  }
}

// Whether every tensor among ``c``'s arguments and ``outs`` is this backend's (no host side).
bool on_device_only(Ctx *c, const std::vector<c10::IValue> &outs) {
  auto dev_only = [](const c10::IValue &v) {
    if (v.isTensor()) {
      const at::Tensor &t = v.toTensor();
      return !t.defined() || t.device().type() == g_dev;
    }
    if (v.isTensorList()) {
      for (const at::Tensor &t : v.toTensorList().vec())
        if (t.defined() && t.device().type() != g_dev) return false;
    }
    return true;
  };
  for (const auto &v : c->args)
    if (!dev_only(v)) return false;
  for (const auto &v : outs)
    if (!dev_only(v)) return false;
  return true;
}

void end_op(const at::RecordFunction &fn, Ctx *c) {
  Spec *spec = c->spec;
  const auto &outs = fn.outputs();
  if (spec->kind == COLLECTIVE) {
    if (c->device < 0) return;
    InPython py;
    call_collective(c, spec->returns > 0 && outs.empty() ? 2 : 1, &outs, stream_id(c->device));
    return;
  }
  if (spec->returns > 0 && outs.empty()) return;  // nothing came back: the op failed
  bool synced = g_epoch.load(std::memory_order_relaxed) != c->epoch;
  if (spec->kind == REGULAR) {
    for (auto &w : c->late) add_value(c, w.first, w.second);  // after the op: out= may have resized them
    add_outputs(c, spec, outs);
    if (c->items.empty() && c->host.empty()) {
      g_cpu_ops.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  } else if (spec->kind == RECORD_STREAM) {
    if (!c->has_rs) return;  // a tensor of no bytes, or not on this backend: nothing to order
  } else if (spec->kind == SPECIAL && (!spec->in.empty() || !spec->out.empty()) && on_device_only(c, outs)) {
    // A copy between tensors of this backend (copy_, _to_copy: AMP's casts, DDP's buckets):
    // nothing host-side to it, so its roles are a regular op's and it goes the direct way.
    for (const Arg &a : spec->in)
      if (a.pos < (int)c->args.size()) add_value(c, c->args[a.pos], a.mode);
    add_outputs(c, spec, outs);
    if (c->items.empty()) return;
    if (c->device < 0) c->device = std::max<int>(0, device_of(c->args.empty() ? c10::IValue() : c->args[0]));
    long long sid = stream_id(c->device);
    if (hold_op(c, sid, synced)) return;
    InPythonTimed py;
    if (g_san != nullptr && c->generation == g_generation.load()) {
      call_sanitizer(c, sid, synced);
      return;
    }
    c->items.clear();  // (the front end's own path, when a test watches every op: as before)
    call_front_end(c, outs, sid, synced);
    return;
  } else {
    if (c->device < 0) {  // a special op's device: its first tensor's on this backend
      for (const auto &v : c->args)
        if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == g_dev) {
          c->device = v.toTensor().device().index();
          break;
        }
    }
  }
  long long sid = spec->kind == RECORD_STREAM ? 0 : stream_id(c->device);  // record_stream names its stream
  if (spec->kind == REGULAR && c->host.empty() && hold_op(c, sid, synced)) return;
  InPythonTimed py;
  if (g_san != nullptr && c->generation == g_generation.load() &&
      ((spec->kind == REGULAR && c->host.empty()) || spec->kind == RECORD_STREAM)) {
    call_sanitizer(c, sid, synced);
    return;
  }
  call_front_end(c, outs, sid, synced);
}

void on_end(const at::RecordFunction &fn, at::ObserverContext *oc) {
  TmSpan span(TM_END);
  if (oc == nullptr) return;
  t_depth--;
  auto *c = static_cast<Ctx *>(oc);
  if (c->spec->kind == INACTIVE || !g_on.load(std::memory_order_relaxed) || finalizing()) return;
  if (std::uncaught_exceptions() > c->unwinding) {  // the op is throwing: it did nothing to report
    if (c->spec->kind == COLLECTIVE && c->device >= 0) {  // (the front end closes what it opened)
      try {
        InPython py;
        call_collective(c, 2, nullptr, 0);
      } catch (...) {
        g_errors++;
      }
    }
    return;
  }
  try {
    end_op(fn, c);
  } catch (abi::__forced_unwind &) {
    throw;
  } catch (...) {
    g_errors++;
  }
}

// Drop the direct path's callables and the stream handles (the GIL held).
void clear_direct() {
  flush_backlog();
  PyObject **slots[7] = {&g_san, &g_capture, &g_stream, &g_raw_stream, &g_pending, &g_error_type, &g_last_lib};
  for (auto *slot : slots) Py_CLEAR(*slot);
  auto *handles = g_handles;
  g_handles = nullptr;  // detached first: a release may run Python code
  if (handles != nullptr) {
    for (auto &e : *handles) Py_DECREF(e.second);
    delete handles;
  }
}


// ---- PyTorch's GPU trace, taken below Python ------------------------------------------------
//
// PyTorch reports each caching-allocator allocation and free, event record and wait, and
// synchronization through one process-wide interpreter object (c10::impl::GPUTrace): its
// Python implementation imports torch.utils._cuda_trace and calls a registry's Python
// ``fire_callbacks`` for every event, whether anything listens or not. A training step has
// hundreds of allocations and frees: that machinery alone cost a ResNet-18 step 1.2x.
// While the front end runs with this observer, the trace's interpreter is this one instead:
// an event Ignis needs goes straight to the front end's handler for its kind (a free to the
// sanitizer with the handle of the stream current there), an event Ignis does not need
// (allocations: the observer reports fresh outputs) costs no Python at all, and an event that
// another listener subscribed to in PyTorch's registries (PyTorch's own CSAN, say) is passed on
// to PyTorch's implementation as before. Every other method forwards to PyTorch's.
//
// The interface is PyTorch's internal one: the shim is compiled for 2.11 to 2.13 (the 2.11 and
// 2.13 headers were compared, and are the same here; 2.12 is taken to match, unchecked);
// elsewhere ``ignis_obs_trace_start`` says so and the front end
// subscribes in Python, as before.
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11 && TORCH_VERSION_MINOR <= 13
#define IGNIS_TRACE_SHIM 1
#endif

// The kinds, in the order of ignis_obs_trace_start's tuples.
enum TraceKind : int {
  T_EVENT_CREATION, T_EVENT_DELETION, T_EVENT_RECORD, T_EVENT_WAIT, T_ALLOCATION, T_DEALLOCATION,
  T_STREAM_CREATION, T_DEVICE_SYNC, T_STREAM_SYNC, T_EVENT_SYNC, T_KINDS
};

// Ignis's handler per kind (nullptr: none), and PyTorch's registries' callback lists (other
// listeners). Written with the GIL held; never freed (a trace call on another thread may
// read them): a restart replaces the entries.
PyObject *g_trace_fn[T_KINDS] = {};
PyObject *g_trace_fn_free() { return g_trace_fn[T_DEALLOCATION]; }
PyObject *g_trace_others[T_KINDS] = {};
std::atomic<bool> g_trace_on{false};
std::atomic<uint64_t> g_trace_events{0};  // events handled by Ignis's handlers (tests, diagnostics)

#ifdef IGNIS_TRACE_SHIM
using c10::impl::PyInterpreterVTable;
using c10::TensorImpl;

// Whether another listener is subscribed in PyTorch's registry of ``kind``: the size of a
// Python list read without the GIL (a word; at worst an event at the moment of a change is
// passed on or not).
inline bool others(int kind) {
  PyObject *l = g_trace_others[kind];
  return l != nullptr && Py_SIZE(l) > 0;
}

const c10::impl::PyInterpreter *g_trace_orig = nullptr;  // PyTorch's own, forwarded to and put back at stop

// PyTorch's interpreter's methods, read at each call (its disarm() at exit swaps them for no-ops).
inline const PyInterpreterVTable *torch_impl() { return g_trace_orig->vtable_; }

// The trace's device types that are the checked backend's (ROCm builds report kHIP, which PyTorch
// hands to the CUDA registries too).
inline bool checked_type(c10::DeviceType t) {
  return t == g_dev || (g_dev == c10::DeviceType::CUDA && t == c10::DeviceType::HIP);
}

struct TraceShim final : PyInterpreterVTable {

  // Ignis's handler of ``kind`` with these arguments (as Python ints; ``nargs`` of them), the
  // GIL taken. An error: an IgnisError waits in the front end's pending list; anything else is
  // unraisable (PyTorch's own implementation would log and drop it).
  static void call(int kind, int nargs, uintptr_t a, uintptr_t b) {
    if (!g_trace_on.load(std::memory_order_acquire) || finalizing()) return;
    TmSpan span(TM_TRACE);
    if (kind == T_DEALLOCATION && g_free_deferred.load(std::memory_order_relaxed) && hold_free_c(a)) return;
    PyGILState_STATE st = PyGILState_Ensure();
    // An exception already set on this thread (an event fired by a release inside an error
    // path) is kept aside and put back: the handler runs clean, and the caller's error survives.
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);
    try {
      handle(kind, nargs, a, b);
    } catch (...) {  // c10's errors (the current device or stream); a trace call must not throw
      g_errors++;
    }
    PyErr_Restore(et, ev, etb);
    PyGILState_Release(st);
  }

  // A free held in the C form (see the backlog), without the GIL, where this thread may.
  static bool hold_free_c(uintptr_t a) {
    Deferred d{};
    d.generation = g_generation.load();  // (first: a window read after it is of its session or later)
    if (g_window.load(std::memory_order_acquire) < 0) return false;
    d.form = F_FREE;
    d.ptr = a;
    try {  // (c10 may throw: then the Python form, which reports it)
      d.device = g_dev == c10::DeviceType::CPU ? -1 : (int)c10::impl::getDeviceGuardImpl(g_dev)->getDevice().index();
      d.sid = stream_id(d.device);
    } catch (...) {
      return false;
    }
    return hold_c(d, nullptr, 0);
  }

  // ``call``'s work, the GIL held and no exception set.
  static void handle(int kind, int nargs, uintptr_t a, uintptr_t b) {
    PyObject *fn = g_trace_fn[kind];
    if (fn != nullptr && g_trace_on.load(std::memory_order_relaxed)) {
      // (references of our own: a stop on another thread may drop the tables' during a call)
      Held h(fn), stream(g_stream), raw_stream(g_raw_stream), pending(g_pending), error_type(g_error_type);
      g_trace_events.fetch_add(1, std::memory_order_relaxed);
      if (kind == T_DEVICE_SYNC || kind == T_STREAM_SYNC || kind == T_EVENT_SYNC)
        g_epoch.fetch_add(1, std::memory_order_relaxed);  // an op in flight across it is synced
      PyObject *argv[3] = {nullptr, nullptr, nullptr};
      bool ok = true;
      if (kind == T_DEALLOCATION) {
        // The sanitizer checks a free with the stream current where it happens.
        // (c10 may throw here: nothing is made before)
        int device = g_dev == c10::DeviceType::CPU ? -1 : (int)c10::impl::getDeviceGuardImpl(g_dev)->getDevice().index();
        long long sid = stream_id(device);
        argv[0] = PyLong_FromUnsignedLongLong(a);
        argv[1] = stream.p != nullptr ? stream_handle(device, sid, (int)g_dev, true, stream.p, raw_stream.p) : nullptr;
        if (argv[1] == nullptr && !PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "ignis.torch: the op observer is off");
        if (g_free_deferred && argv[0] != nullptr && argv[1] != nullptr) {
          hold_free(h.p, argv);
          return;
        }
        if (!PyErr_Occurred()) flush_backlog();
      } else {
        flush_backlog();
        if (nargs > 0) argv[0] = PyLong_FromUnsignedLongLong(a);
        if (nargs > 1) argv[1] = PyLong_FromUnsignedLongLong(b);
      }
      for (int i = 0; i < nargs; i++) ok = ok && argv[i] != nullptr;
      PyObject *r = ok ? PyObject_Vectorcall(fn, argv, (size_t)nargs, nullptr) : nullptr;
      if (r == nullptr) sanitizer_failed(fn, pending.p, error_type.p);
      Py_XDECREF(r);
      Py_XDECREF(argv[0]);
      Py_XDECREF(argv[1]);
    }
  }
  static bool mine(c10::DeviceType t, int kind) { return checked_type(t) && g_trace_fn[kind] != nullptr; }

  void trace_gpu_event_creation(c10::DeviceType t, uintptr_t e) const override {
    if (mine(t, T_EVENT_CREATION)) call(T_EVENT_CREATION, 1, e, 0);
    if (!checked_type(t) || others(T_EVENT_CREATION)) torch_impl()->trace_gpu_event_creation(t, e);
  }
  void trace_gpu_event_deletion(c10::DeviceType t, uintptr_t e) const override {
    if (mine(t, T_EVENT_DELETION)) call(T_EVENT_DELETION, 1, e, 0);
    if (!checked_type(t) || others(T_EVENT_DELETION)) torch_impl()->trace_gpu_event_deletion(t, e);
  }
  void trace_gpu_event_record(c10::DeviceType t, uintptr_t e, uintptr_t s) const override {
    if (mine(t, T_EVENT_RECORD)) call(T_EVENT_RECORD, 2, e, s);
    if (!checked_type(t) || others(T_EVENT_RECORD)) torch_impl()->trace_gpu_event_record(t, e, s);
  }
  void trace_gpu_event_wait(c10::DeviceType t, uintptr_t e, uintptr_t s) const override {
    if (mine(t, T_EVENT_WAIT)) call(T_EVENT_WAIT, 2, e, s);
    if (!checked_type(t) || others(T_EVENT_WAIT)) torch_impl()->trace_gpu_event_wait(t, e, s);
  }
  void trace_gpu_memory_allocation(c10::DeviceType t, uintptr_t p) const override {
    if (mine(t, T_ALLOCATION)) call(T_ALLOCATION, 1, p, 0);
    if (!checked_type(t) || others(T_ALLOCATION)) torch_impl()->trace_gpu_memory_allocation(t, p);
  }
  void trace_gpu_memory_deallocation(c10::DeviceType t, uintptr_t p) const override {
    if (mine(t, T_DEALLOCATION)) call(T_DEALLOCATION, 2, p, 0);
    if (!checked_type(t) || others(T_DEALLOCATION)) torch_impl()->trace_gpu_memory_deallocation(t, p);
  }
  void trace_gpu_stream_creation(c10::DeviceType t, uintptr_t s) const override {
    if (mine(t, T_STREAM_CREATION)) call(T_STREAM_CREATION, 1, s, 0);
    if (!checked_type(t) || others(T_STREAM_CREATION)) torch_impl()->trace_gpu_stream_creation(t, s);
  }
  void trace_gpu_device_synchronization(c10::DeviceType t) const override {
    if (mine(t, T_DEVICE_SYNC)) call(T_DEVICE_SYNC, 0, 0, 0);
    if (!checked_type(t) || others(T_DEVICE_SYNC)) torch_impl()->trace_gpu_device_synchronization(t);
  }
  void trace_gpu_stream_synchronization(c10::DeviceType t, uintptr_t s) const override {
    if (mine(t, T_STREAM_SYNC)) call(T_STREAM_SYNC, 1, s, 0);
    if (!checked_type(t) || others(T_STREAM_SYNC)) torch_impl()->trace_gpu_stream_synchronization(t, s);
  }
  void trace_gpu_event_synchronization(c10::DeviceType t, uintptr_t e) const override {
    if (mine(t, T_EVENT_SYNC)) call(T_EVENT_SYNC, 1, e, 0);
    if (!checked_type(t) || others(T_EVENT_SYNC)) torch_impl()->trace_gpu_event_synchronization(t, e);
  }

  // Everything else is PyTorch's (only the trace methods are called through GPUTrace).
  std::string name() const override { return torch_impl()->name(); }
  void incref(PyObject *o) const override { torch_impl()->incref(o); }
  void decref(PyObject *o) const override { torch_impl()->decref(o); }
  bool try_incref(const c10::impl::PyObjectSlot &s) const override { return torch_impl()->try_incref(s); }
  size_t refcnt(PyObject *o) const override { return torch_impl()->refcnt(o); }
  c10::intrusive_ptr<TensorImpl> detach(const TensorImpl *self) const override { return torch_impl()->detach(self); }
  void dispatch(const c10::OperatorHandle &op, torch::jit::Stack *stack) const override { torch_impl()->dispatch(op, stack); }
  void reportErrorCallback(PyObject *cb, c10::DispatchKey key) const override { torch_impl()->reportErrorCallback(cb, key); }
  void python_op_registration_trampoline(const c10::OperatorHandle &op, c10::DispatchKey k, c10::DispatchKeySet ks,
                                         torch::jit::Stack *stack, bool with_keyset, bool with_op) const override {
    torch_impl()->python_op_registration_trampoline(op, k, ks, stack, with_keyset, with_op);
  }
  void throw_abstract_impl_not_imported_error(std::string opname, const char *pymodule,
                                              const char *context) const override {
    torch_impl()->throw_abstract_impl_not_imported_error(std::move(opname), pymodule, context);
  }
  void python_dispatcher(const c10::OperatorHandle &op, c10::DispatchKeySet ks, torch::jit::Stack *stack) const override {
    torch_impl()->python_dispatcher(op, ks, stack);
  }
  bool is_contiguous(const TensorImpl *self, at::MemoryFormat f) const override { return torch_impl()->is_contiguous(self, f); }
  c10::SymBool sym_is_contiguous(const TensorImpl *self, at::MemoryFormat f) const override {
    return torch_impl()->sym_is_contiguous(self, f);
  }
  bool is_strides_like(const TensorImpl *self, at::MemoryFormat f) const override { return torch_impl()->is_strides_like(self, f); }
  bool is_non_overlapping_and_dense(const TensorImpl *self) const override { return torch_impl()->is_non_overlapping_and_dense(self); }
  c10::Device device(const TensorImpl *self) const override { return torch_impl()->device(self); }
  int64_t dim(const TensorImpl *self) const override { return torch_impl()->dim(self); }
  c10::IntArrayRef strides(const TensorImpl *self) const override { return torch_impl()->strides(self); }
  c10::IntArrayRef sizes(const TensorImpl *self) const override { return torch_impl()->sizes(self); }
  c10::SymIntArrayRef sym_sizes(const TensorImpl *self) const override { return torch_impl()->sym_sizes(self); }
  c10::Layout layout(const TensorImpl *self) const override { return torch_impl()->layout(self); }
  int64_t numel(const TensorImpl *self) const override { return torch_impl()->numel(self); }
  c10::SymInt sym_numel(const TensorImpl *self) const override { return torch_impl()->sym_numel(self); }
  c10::SymIntArrayRef sym_strides(const TensorImpl *self) const override { return torch_impl()->sym_strides(self); }
  c10::SymInt sym_storage_offset(const TensorImpl *self) const override { return torch_impl()->sym_storage_offset(self); }
  void reset_backward_hooks(const TensorImpl *self) const override { torch_impl()->reset_backward_hooks(self); }
};

// Never destroyed: a trace call may be in flight on another thread when the shim is withdrawn.
TraceShim *g_shim = nullptr;
c10::impl::PyInterpreter *g_shim_interp = nullptr;
#endif

void clear_trace_tables();

// Give the trace back to PyTorch's interpreter (the GIL held).
void trace_stop() {
#ifdef IGNIS_TRACE_SHIM
  if (!g_trace_on.load()) return;
  flush_backlog();
  g_trace_on.store(false, std::memory_order_release);
  const c10::impl::PyInterpreter *expected = g_shim_interp;  // (another tool's replacement stays)
  if (g_trace_orig != nullptr) c10::impl::GPUTrace::gpuTraceState.compare_exchange_strong(expected, g_trace_orig);
  clear_trace_tables();
#endif
}

void clear_trace_tables() {
  g_free_deferred = false;
  for (int k = 0; k < T_KINDS; k++) {
    Py_CLEAR(g_trace_fn[k]);
    // The lists stay referenced: a trace call without the GIL may still read one's size.
  }
}

// ---- The same measure for Python's tensors ------------------------------------------------
//
// The dispatch mode (raise mode's engine) and the front end's Python paths (copies with a host
// side, collectives, Triton launches, declared uses) hand tensors as Python objects. They are
// measured here, by ``measure`` above, as the observer measures the dispatcher's: one rule.
// ``item(tensor, mode)``: one tensor's packed item as a tuple (or None for no bytes), and
// ``op_items(spec, args, kwargs, out, host)``: a whole op's, in one call (``spec`` from
// ``op_spec(inputs, outputs, multi, cuda)``). They need no observing session.

// One argument of a dispatch-mode op: its position, its name (a keyword argument), its mode and
// whether it is a list of tensors.
struct PyArg {
  Py_ssize_t pos;
  PyObject *name;
  int mode;
  bool many;
};

struct PySpec {
  std::vector<PyArg> in;
  std::vector<Arg> out;
  bool multi = false;
  c10::DeviceType dev = c10::DeviceType::CUDA;  // the checked backend's tensors (CPU: the front end's test mode)
  ~PySpec() {
    for (auto &a : in) Py_XDECREF(a.name);
  }
};

const char *PYSPEC = "ignis.torch op items";

// A Python object as a tensor with bytes of the checked backend (``dev``) or, with ``host``,
// of the host; true and ``it`` filled then.
bool py_measure(PyObject *v, c10::DeviceType dev, int mode, bool host, Item &it, bool &on_dev, int &device) {
  if (!THPVariable_Check(v)) return false;
  const at::Tensor &t = THPVariable_Unpack(v);
  if (!t.defined()) return false;
  auto dt = t.device().type();
  on_dev = dt == dev;
  if (!on_dev && !(host && dt == c10::DeviceType::CPU)) return false;  // (not measured: skipped)
  if (!measure(t, mode, it)) return false;
  if (on_dev) device = t.device().index();
  return true;
}

struct PyItems {
  c10::SmallVector<Item, 6> dev;
  c10::SmallVector<Item, 2> host;
  PyObject *last = nullptr;  // the last device tensor (borrowed)
  int device = -1;
};

void py_add(PyItems &r, c10::DeviceType dev, PyObject *v, int mode, bool many, bool host, size_t nin) {
  auto one = [&](PyObject *x) {
    Item it;
    bool on_dev = false;
    if (!py_measure(x, dev, mode, host, it, on_dev, r.device)) return;
    if (!on_dev) {
      r.host.push_back(it);
      return;
    }
    for (size_t j = 0; j < nin; j++)
      if (r.dev[j].base == it.base) return;  // an output aliasing an input: that input's access
    r.dev.push_back(it);
    r.last = x;
  };
  if (!many) {
    one(v);
  } else if (PyList_Check(v) || PyTuple_Check(v)) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
    PyObject **xs = PySequence_Fast_ITEMS(v);
    for (Py_ssize_t i = 0; i < n; i++) one(xs[i]);
  }
}

void drop_spec(PyObject *capsule) { delete static_cast<PySpec *>(PyCapsule_GetPointer(capsule, PYSPEC)); }

// op_spec(inputs, outputs, multi, cuda): inputs ((pos, name, mode, many), ...), outputs
// ((index, mode, many), ...) as _ops.OpSpec has them; ``cuda``: CUDA tensors are the device's
// (else the host's: the front end's test mode).
PyObject *py_op_spec(PyObject *, PyObject *const *argv, Py_ssize_t argc) {
  if (argc != 4 || !PyTuple_Check(argv[0]) || !PyTuple_Check(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "op_spec(inputs: tuple, outputs: tuple, multi: bool, cuda: bool)");
    return nullptr;
  }
  auto spec = std::make_unique<PySpec>();
  spec->multi = PyObject_IsTrue(argv[2]) == 1;
  spec->dev = PyObject_IsTrue(argv[3]) == 1 ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(argv[0]); i++) {
    PyObject *a = PyTuple_GET_ITEM(argv[0], i);
    if (!PyTuple_Check(a) || PyTuple_GET_SIZE(a) != 4) {
      PyErr_SetString(PyExc_TypeError, "an input spec is not (pos, name, mode, many)");
      return nullptr;
    }
    PyObject *name = PyTuple_GET_ITEM(a, 1);
    Py_INCREF(name);
    spec->in.push_back(PyArg{PyLong_AsSsize_t(PyTuple_GET_ITEM(a, 0)), name, (int)PyLong_AsLong(PyTuple_GET_ITEM(a, 2)),
                             PyObject_IsTrue(PyTuple_GET_ITEM(a, 3)) == 1});
  }
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(argv[1]); i++) {
    PyObject *a = PyTuple_GET_ITEM(argv[1], i);
    if (!PyTuple_Check(a) || PyTuple_GET_SIZE(a) != 3) {
      PyErr_SetString(PyExc_TypeError, "an output spec is not (index, mode, many)");
      return nullptr;
    }
    spec->out.push_back(Arg{(int)PyLong_AsLong(PyTuple_GET_ITEM(a, 0)), (int)PyLong_AsLong(PyTuple_GET_ITEM(a, 1)),
                            PyObject_IsTrue(PyTuple_GET_ITEM(a, 2)) == 1});
  }
  if (PyErr_Occurred()) return nullptr;
  PyObject *cap = PyCapsule_New(spec.get(), PYSPEC, drop_spec);
  if (cap != nullptr) spec.release();
  return cap;
}

// op_items(spec, args, kwargs, out, host) -> (device items, host items or None, a device tensor)
// with the items packed, or None when the op touched no device tensor and no host one.
PyObject *py_op_items(PyObject *, PyObject *const *argv, Py_ssize_t argc) {
  if (argc != 5 || !PyTuple_Check(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "op_items(spec, args: tuple, kwargs, out, host: bool)");
    return nullptr;
  }
  auto *spec = static_cast<PySpec *>(PyCapsule_GetPointer(argv[0], PYSPEC));
  if (spec == nullptr) return nullptr;
  PyObject *args = argv[1], *kwargs = argv[2], *out = argv[3];
  bool host = PyObject_IsTrue(argv[4]) == 1;
  bool kw = kwargs != Py_None && PyDict_Check(kwargs);
  Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  PyItems r;
  try {
    for (const PyArg &a : spec->in) {
      PyObject *v = a.pos < nargs ? PyTuple_GET_ITEM(args, a.pos) : (kw ? PyDict_GetItem(kwargs, a.name) : nullptr);
      if (v != nullptr && v != Py_None) py_add(r, spec->dev, v, a.mode, a.many, host, 0);
    }
    if (!spec->out.empty()) {
      size_t nin = r.dev.size();
      bool seq = spec->multi && (PyTuple_Check(out) || PyList_Check(out));
      for (const Arg &a : spec->out) {
        PyObject *v = out;
        if (spec->multi) {
          if (!seq || a.pos >= PySequence_Fast_GET_SIZE(out)) continue;
          v = PySequence_Fast_ITEMS(out)[a.pos];
        }
        py_add(r, spec->dev, v, a.mode, a.many, false, nin);
      }
    }
  } catch (const std::exception &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  if (r.dev.empty() && r.host.empty()) Py_RETURN_NONE;
  PyObject *d = r.dev.empty() ? (Py_INCREF(Py_None), Py_None) : items_bytes(r.dev);
  PyObject *h = r.host.empty() ? (Py_INCREF(Py_None), Py_None) : items_bytes(r.host);
  PyObject *t = r.last != nullptr ? r.last : Py_None;
  Py_INCREF(t);
  if (d == nullptr || h == nullptr) {
    Py_XDECREF(d);
    Py_XDECREF(h);
    Py_DECREF(t);
    return nullptr;
  }
  PyObject *res = PyTuple_New(3);
  if (res == nullptr) return nullptr;
  PyTuple_SET_ITEM(res, 0, d);
  PyTuple_SET_ITEM(res, 1, h);
  PyTuple_SET_ITEM(res, 2, t);
  return res;
}

// item(tensor, mode) -> (base, size, lo, hi, period, chunk, mode), or None for a tensor of no
// bytes (or not a tensor): any device's, the host's too.
PyObject *py_item(PyObject *, PyObject *const *argv, Py_ssize_t argc) {
  if (argc != 2) {
    PyErr_SetString(PyExc_TypeError, "item(tensor, mode)");
    return nullptr;
  }
  if (!THPVariable_Check(argv[0])) Py_RETURN_NONE;
  int mode = (int)PyLong_AsLong(argv[1]);
  if (mode == -1 && PyErr_Occurred()) return nullptr;
  Item it;
  try {
    if (!measure(THPVariable_Unpack(argv[0]), mode, it)) Py_RETURN_NONE;
  } catch (const std::exception &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  return Py_BuildValue("(KKKKKKL)", (unsigned long long)it.base, (unsigned long long)it.size,
                       (unsigned long long)it.lo, (unsigned long long)it.hi, (unsigned long long)it.per,
                       (unsigned long long)it.chunk, (long long)it.mode);
}

PyMethodDef g_py_methods[] = {
    {"op_spec", (PyCFunction)(void (*)(void))py_op_spec, METH_FASTCALL, "op_spec(inputs, outputs, multi, cuda)"},
    {"op_items", (PyCFunction)(void (*)(void))py_op_items, METH_FASTCALL,
     "op_items(spec, args, kwargs, out, host)"},
    {"item", (PyCFunction)(void (*)(void))py_item, METH_FASTCALL, "item(tensor, mode)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

#define IGNIS_API __attribute__((visibility("default")))

extern "C" {

// The measure of Python's tensors (see py_item / py_op_items), as Python functions:
// {"item": ..., "op_items": ..., "op_spec": ...} (a new reference; NULL with an error set).
IGNIS_API PyObject *ignis_obs_py_functions(void) {
  PyObject *d = PyDict_New();
  if (d == nullptr) return nullptr;
  for (PyMethodDef *m = g_py_methods; m->ml_name != nullptr; m++) {
    PyObject *f = PyCFunction_New(m, nullptr);
    if (f == nullptr || PyDict_SetItemString(d, m->ml_name, f) != 0) {
      Py_XDECREF(f);
      Py_DECREF(d);
      return nullptr;
    }
    Py_DECREF(f);
  }
  return d;
}

// Start observing: ``classify``, ``on_op`` and ``on_special`` are the front end's callables
// (kept referenced until ``ignis_obs_stop``); ``device_type`` the backend checked (c10's
// DeviceType: 1 CUDA, 0 CPU for tests). ``direct``: None, or what the direct path calls, a
// tuple (the Sanitizer, the stack capture, (device, stream id) -> the handle of the device's
// current stream, (stream id, device index, device type) -> a stream's handle, the list that
// keeps IgnisErrors found, IgnisError); with None every op goes through ``on_op`` and
// ``on_special``. Returns 0; -1 if already observing; -2 if ``direct`` is malformed.
IGNIS_API int ignis_obs_start(PyObject *classify_fn, PyObject *on_op, PyObject *on_special, PyObject *direct,
                              int device_type) {
  if (g_on.load()) return -1;
  if (direct != Py_None && (!PyTuple_Check(direct) || PyTuple_GET_SIZE(direct) != 7)) return -2;
  if (g_foreign_name == nullptr) {
    g_foreign_name = PyUnicode_InternFromString("foreign_access");
    g_record_stream_name = PyUnicode_InternFromString("extent_record_stream");
    g_drain_name = PyUnicode_InternFromString("drain");
    g_free_stacks_name = PyUnicode_InternFromString("free_stacks");
    if (g_foreign_name == nullptr || g_record_stream_name == nullptr || g_drain_name == nullptr ||
        g_free_stacks_name == nullptr)
      return -2;
  }
  {  // specs are never freed: a thread may still hold one in its cache
    std::lock_guard<std::mutex> g(g_lock);
    g_specs.clear();
  }
  flush_backlog();  // (anything still held came after the last session's stop: dropped unmade, or
                    // made into its own sanitizer, whichever form holds it)
  windows_clear();
  g_generation++;
  Py_INCREF(classify_fn);
  Py_INCREF(on_op);
  Py_INCREF(on_special);
  g_classify = classify_fn;
  g_on_op = on_op;
  g_on_special = on_special;
  clear_direct();
  if (direct != Py_None) {
    PyObject **slots[7] = {&g_san, &g_capture, &g_stream, &g_raw_stream, &g_pending, &g_error_type, &g_last_lib};
    for (int i = 0; i < 7; i++) {
      *slots[i] = PyTuple_GET_ITEM(direct, i);
      Py_INCREF(*slots[i]);
    }
  }
  g_dev = (c10::DeviceType)device_type;
  g_stream_seen = g_free_stacks = false;
  {
    std::lock_guard<std::mutex> g(g_backlog_mu);
    g_c_seen = g_c_streams = g_c_noted = false;
    g_c_win = -1;
  }
  g_backlog_max = 256;
  if (const char *b = std::getenv("IGNIS_OBSERVER_BATCH")) {
    long v = std::strtol(b, nullptr, 10);
    if (v >= 1 && v <= 4096) g_backlog_max = (size_t)v;
  }
  g_ops = 0;
  g_cpu_ops = 0;
  g_errors = 0;
  g_host_check = false;
  if (g_san != nullptr) checker_start();
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
  static bool stopping = false;  // (the GIL held: a second stop while the first waits is nothing)
  if (!g_on.load() || stopping) return;
  stopping = true;
  g_window.store(-1);  // (no more calls of the C form; those held are made below)
  checker_stop();
  flush_backlog(true);  // (the held calls are this session's: made before anything is let go)
  trace_stop();  // (its free handler needs the direct path's callables)
  g_on = false;
  at::removeCallback(g_handle);
  g_handle = 0;
  Py_CLEAR(g_classify);
  Py_CLEAR(g_on_op);
  Py_CLEAR(g_on_special);
  Py_CLEAR(g_on_collective);
  clear_direct();
  windows_clear();
  stopping = false;
}

// The front end's callable for collectives (see g_on_collective); set after ignis_obs_start, cleared
// by ignis_obs_stop. Returns 0, or -1 when not observing.
IGNIS_API int ignis_obs_set_collective(PyObject *fn) {
  if (!g_on.load()) return -1;
  Py_INCREF(fn);
  PyObject *old = g_on_collective;
  g_on_collective = fn;
  Py_XDECREF(old);
  return 0;
}

// Host tensors' accesses are collected too (pinned memory is tracked).
IGNIS_API void ignis_obs_host_check(int on) { g_host_check = on != 0; }

// The diagnostic timers (see TimerSlot): turn them on (``on``) or off, and take what they
// measured since the last call into ``out`` (ns then count for each slot, in TimerSlot's
// order: 2 * ``n`` words at most), restarting them. Returns the number of slots.
IGNIS_API int ignis_obs_timing(int on, unsigned long long *out, int n) {
  for (int k = 0; k < TM_SLOTS; k++) {
    uint64_t ns = g_tm_ns[k].exchange(0), cnt = g_tm_n[k].exchange(0);
    if (out != nullptr && k < n) {
      out[2 * k] = ns;
      out[2 * k + 1] = cnt;
    }
  }
  g_timing.store(on != 0, std::memory_order_relaxed);
  return TM_SLOTS;
}

// The host waited for device work: an op in flight across this is marked synced.
IGNIS_API void ignis_obs_synced(void) { g_epoch.fetch_add(1, std::memory_order_relaxed); }

// Ops that touched host tensors only since the last call (taken and reset).
IGNIS_API unsigned long long ignis_obs_take_cpu_ops(void) { return g_cpu_ops.exchange(0); }

// Ops on device tensors handed to the sanitizer directly since the last call (taken and reset).
IGNIS_API unsigned long long ignis_obs_take_ops(void) { return g_ops.exchange(0); }

IGNIS_API unsigned long long ignis_obs_errors(void) { return g_errors.load(); }

// Whether any global RecordFunction callback (this one or another's) is registered.
IGNIS_API int ignis_obs_any_global(void) { return at::hasGlobalCallbacks() ? 1 : 0; }

// Take PyTorch's GPU trace below Python (see TraceShim). ``handlers``: a tuple of T_KINDS
// callables or None, Ignis's handler per kind (a deallocation's gets (pointer, the handle of
// the stream current there); the others PyTorch's trace arguments); ``registries``: a tuple of
// T_KINDS lists, PyTorch's registries' callback lists, for the other listeners. The trace must
// be active (torch._C._activate_gpu_trace()) and the observer started with its direct path.
// Returns 0; -1: this torch's version is not one the shim was checked against; -2: the trace is
// not active; -3: malformed arguments or the observer is off; -4: the trace's interpreter is
// not PyTorch's (another tool replaced it).
IGNIS_API int ignis_obs_trace_start(PyObject *handlers, PyObject *registries) {
#ifndef IGNIS_TRACE_SHIM
  (void)handlers;
  (void)registries;
  return -1;
#else
  if (!g_on.load() || g_stream == nullptr) return -3;
  if (!PyTuple_Check(handlers) || PyTuple_GET_SIZE(handlers) != T_KINDS || !PyTuple_Check(registries) ||
      PyTuple_GET_SIZE(registries) != T_KINDS)
    return -3;
  for (int k = 0; k < T_KINDS; k++)
    if (!PyList_Check(PyTuple_GET_ITEM(registries, k))) return -3;
  const c10::impl::PyInterpreter *cur = c10::impl::GPUTrace::get_trace();
  if (cur == nullptr) return -2;
  if (g_shim_interp == nullptr || cur != g_shim_interp) {
    if (cur != getPyInterpreter()) return -4;  // another tool's: left alone
    if (g_shim == nullptr) {
      g_shim = new TraceShim();
      g_shim_interp = new c10::impl::PyInterpreter(g_shim);
    }
    g_trace_orig = cur;
  }
  flush_backlog();  // (a held free is made with the handler of its moment: these are new)
  clear_trace_tables();
  for (int k = 0; k < T_KINDS; k++) {
    PyObject *fn = PyTuple_GET_ITEM(handlers, k);
    if (fn != Py_None) {
      Py_INCREF(fn);
      g_trace_fn[k] = fn;
    }
    PyObject *l = PyTuple_GET_ITEM(registries, k);
    if (g_trace_others[k] != l) {
      Py_INCREF(l);
      g_trace_others[k] = l;  // (a list replaced is kept: see clear_trace_tables)
    }
  }
  // Frees are held in the backlog when their handler is the sanitizer's own method (bound to the
  // direct path's sanitizer): nothing else is done at a free that could not wait.
  g_free_deferred = false;
  if (g_trace_fn[T_DEALLOCATION] != nullptr && g_san != nullptr) {
    PyObject *self = PyObject_GetAttrString(g_trace_fn[T_DEALLOCATION], "__self__");
    g_free_deferred = self == g_san;
    Py_XDECREF(self);
    PyErr_Clear();
  }
  g_trace_on.store(true, std::memory_order_release);
  const c10::impl::PyInterpreter *expected = cur;
  if (!c10::impl::GPUTrace::gpuTraceState.compare_exchange_strong(expected, g_shim_interp)) {
    trace_stop();  // replaced meanwhile by another tool: left alone
    return -4;
  }
  return 0;
#endif
}

// The drainer the sanitizer runs first at each of its entry points (Sanitizer.set_drainer): makes
// the calls the direct path holds (a new reference).
IGNIS_API PyObject *ignis_obs_drainer(void) { return PyCFunction_New(&g_drain_def, nullptr); }

// Calls held in the backlog now (tests, diagnostics; the GIL held).
IGNIS_API int ignis_obs_held(void) { return (int)g_held.load(); }

// Calls held in the C form since the library loaded, and whether the checker thread runs (tests,
// diagnostics).
IGNIS_API unsigned long long ignis_obs_c_held(void) { return g_c_held.load(); }
IGNIS_API int ignis_obs_checker(void) { return g_checker != nullptr ? 1 : 0; }

// Stop the checker thread, if it runs (the GIL held): at the interpreter's exit, before it ends,
// in a program that never stopped checking (the calls it would make are made by the next drain).
IGNIS_API void ignis_obs_checker_stop(void) { checker_stop(); }

// Whether two captured stacks ((code, line) pairs) name the same frames: the same code objects at
// equal lines (a capture is interned only while the interner keeps it; equal code objects of two
// files would show different stacks, so codes are compared by identity).
static bool same_stack(PyObject *a, PyObject *b) {
  if (a == b) return true;
  if (!PyTuple_Check(a) || !PyTuple_Check(b) || PyTuple_GET_SIZE(a) != PyTuple_GET_SIZE(b)) return false;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(a); i++) {
    PyObject *x = PyTuple_GET_ITEM(a, i), *y = PyTuple_GET_ITEM(b, i);
    if (x == y) continue;
    if (!PyTuple_Check(x) || !PyTuple_Check(y) || PyTuple_GET_SIZE(x) != 2 || PyTuple_GET_SIZE(y) != 2 ||
        PyTuple_GET_ITEM(x, 0) != PyTuple_GET_ITEM(y, 0))
      return false;
    int eq = PyObject_RichCompareBool(PyTuple_GET_ITEM(x, 1), PyTuple_GET_ITEM(y, 1), Py_EQ);
    if (eq != 1) {
      if (eq < 0) PyErr_Clear();
      return false;
    }
  }
  return true;
}

// Open a window (the GIL held): ``backward()`` is called from ``frames`` (``lib``: its innermost
// frame is a library's; ``stream``: in the front end's test mode the current stream, else None).
// Returns 1 if it counts (close it then), 0 if not (checking is off, or its calls are not the
// observer's to make).
IGNIS_API int ignis_obs_window_open(PyObject *frames, int lib, PyObject *stream) {
  if (!g_on.load() || g_san == nullptr) return 0;
  PyObject *st = stream == Py_None ? nullptr : stream;
  int found = -1;
  for (size_t i = 0; i < g_windows.size() && found < 0; i++) {
    const Window &w = g_windows[i];
    if (w.lib != lib || !same_stack(w.frames, frames) || (w.stream == nullptr) != (st == nullptr)) continue;
    int eq = st == nullptr || w.stream == st ? 1 : PyObject_RichCompareBool(w.stream, st, Py_EQ);
    if (eq < 0) {
      PyErr_Clear();
      continue;
    }
    if (eq) found = (int)i;
  }
  if (found < 0 && g_windows.size() < WINDOWS) {
    Py_INCREF(frames);
    Py_XINCREF(st);
    g_windows.push_back(Window{frames, lib, st});
    found = (int)g_windows.size() - 1;
  }
  g_open.emplace_back(PyThread_get_thread_ident(), found);  // (-1: the table is full: the Python form)
  // Only one open counts: nested, or from two threads at once, whose stack a thread with no frame
  // has is not known here.
  g_window.store(g_open.size() == 1 ? found : -1, std::memory_order_release);
  return 1;
}

// Close the window this thread opened last (the GIL held); the one left open, if it is the only
// one, counts again. Nothing if this thread has none open (a session ended meanwhile).
IGNIS_API void ignis_obs_window_close(void) {
  unsigned long me = PyThread_get_thread_ident();
  for (size_t i = g_open.size(); i-- > 0;) {
    if (g_open[i].first != me) continue;
    g_open.erase(g_open.begin() + (long)i);
    g_window.store(g_open.size() == 1 ? g_open[0].second : -1, std::memory_order_release);
    return;
  }
}

// A test's thread with no Python frame, as PyTorch's autograd engine runs a device's backward
// ops on (the GIL held; let go while it runs): ``reps`` times ``tensors[0].add_(tensors[1])``
// (aten::add_: a write and a read), then, where ``free_ptr`` is not 0, a caching allocator's
// free of ``free_ptr`` through the trace (device type ``device_type``). Returns 0, or -1 for bad
// arguments.
IGNIS_API int ignis_obs_frameless_ops(PyObject *tensors, int reps, unsigned long long free_ptr, int device_type) {
  if (!PyTuple_Check(tensors) || PyTuple_GET_SIZE(tensors) != 2 || !THPVariable_Check(PyTuple_GET_ITEM(tensors, 0)) ||
      !THPVariable_Check(PyTuple_GET_ITEM(tensors, 1)))
    return -1;
  at::Tensor a = THPVariable_Unpack(PyTuple_GET_ITEM(tensors, 0));
  at::Tensor b = THPVariable_Unpack(PyTuple_GET_ITEM(tensors, 1));
  int rc = 0;
  Py_BEGIN_ALLOW_THREADS
  std::thread t([&] {
    try {
      for (int i = 0; i < reps; i++) a.add_(b);
#ifdef IGNIS_TRACE_SHIM
      if (free_ptr != 0) {
        const c10::impl::PyInterpreter *tr = c10::impl::GPUTrace::get_trace();
        if (tr != nullptr) (*tr)->trace_gpu_memory_deallocation((c10::DeviceType)device_type, (uintptr_t)free_ptr);
      }
#endif
    } catch (...) {
      rc = -2;
    }
  });
  t.join();
  Py_END_ALLOW_THREADS
  (void)device_type;
  return rc;
}

// Give the trace back to PyTorch's interpreter (events fire into its Python registries again).
IGNIS_API void ignis_obs_trace_stop(void) { trace_stop(); }

// Whether the trace goes through the shim now.
IGNIS_API int ignis_obs_trace_active(void) {
#ifdef IGNIS_TRACE_SHIM
  return g_trace_on.load() && c10::impl::GPUTrace::get_trace() == g_shim_interp ? 1 : 0;
#else
  return 0;
#endif
}

// Events Ignis's handlers took through the shim (taken and reset).
IGNIS_API unsigned long long ignis_obs_trace_take_events(void) { return g_trace_events.exchange(0); }

// Fire one trace event of ``kind`` through whatever interpreter PyTorch's trace has now, as
// PyTorch's allocator and event code do (for tests on a machine without CUDA: the event is
// reported for device type ``device_type``). ``with_error``: a KeyError is set first, as when a
// release in an error path fires the event; it is still set when this returns (the GIL held).
// Returns 0, or -1 when the trace is not active.
IGNIS_API int ignis_obs_trace_fire(int kind, int device_type, unsigned long long a, unsigned long long b,
                                   int with_error) {
  const c10::impl::PyInterpreter *t = c10::impl::GPUTrace::get_trace();
  if (t == nullptr) return -1;
  if (with_error) PyErr_SetString(PyExc_KeyError, "set before the event");
  auto dt = (c10::DeviceType)device_type;
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  switch (kind) {
    case T_EVENT_CREATION: (*t)->trace_gpu_event_creation(dt, x); break;
    case T_EVENT_DELETION: (*t)->trace_gpu_event_deletion(dt, x); break;
    case T_EVENT_RECORD: (*t)->trace_gpu_event_record(dt, x, y); break;
    case T_EVENT_WAIT: (*t)->trace_gpu_event_wait(dt, x, y); break;
    case T_ALLOCATION: (*t)->trace_gpu_memory_allocation(dt, x); break;
    case T_DEALLOCATION: (*t)->trace_gpu_memory_deallocation(dt, x); break;
    case T_STREAM_CREATION: (*t)->trace_gpu_stream_creation(dt, x); break;
    case T_DEVICE_SYNC: (*t)->trace_gpu_device_synchronization(dt); break;
    case T_STREAM_SYNC: (*t)->trace_gpu_stream_synchronization(dt, x); break;
    case T_EVENT_SYNC: (*t)->trace_gpu_event_synchronization(dt, x); break;
    default: return -1;
  }
  return 0;
}

// A diagnostic probe (scripts/diag_model_cost.py): a second global callback that only counts the
// calls it sees and returns at once, asking for the ops' inputs and outputs or not, so that the
// cost of PyTorch's RecordFunction machinery itself (boxing every op's arguments at every level)
// can be told from the observer's own. Not used by the front end. Returns 0, or -1 when a probe
// is already on.
std::atomic<unsigned long long> g_probe_calls{0};
at::CallbackHandle g_probe_handle = 0;

std::unique_ptr<at::ObserverContext> probe_start(const at::RecordFunction &) {
  g_probe_calls.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

IGNIS_API int ignis_obs_probe_start(int io) {
  if (g_probe_handle != 0) return -1;
  g_probe_calls = 0;
  g_probe_handle = at::addGlobalCallback(at::RecordFunctionCallback(probe_start)
                                             .needsInputs(io != 0)
                                             .needsOutputs(io != 0)
                                             .scopes({at::RecordScope::FUNCTION}));
  return 0;
}

// Remove the probe; returns the calls it saw.
IGNIS_API unsigned long long ignis_obs_probe_stop(void) {
  if (g_probe_handle != 0) at::removeCallback(g_probe_handle);
  g_probe_handle = 0;
  return g_probe_calls.exchange(0);
}

}  // extern "C"
