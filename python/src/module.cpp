// flashgrad._flashgrad: the Python binding of the C++ API (pybind11).
//
// Arrays come in as any object that exports DLPack (__dlpack__ or a
// "dltensor" capsule) or the buffer protocol (numpy); they become
// flashgrad::TensorView with their own strides, never copied. Options come in
// as one dict, so that the Python layer (flashgrad/__init__.py) owns the
// documented keyword signatures. The GIL is released while the kernels run.
//
// Errors: flashgrad::Error becomes TypeError when the argument's dtype is
// wrong and ValueError otherwise (MemoryError for out_of_memory), carrying the
// library's message unchanged.
#include <Python.h>
#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flashgrad/flashgrad.hpp"
#include "flashgrad/shard.hpp"
#if FLASHGRAD_PY_MPI
#include <mpi.h>
#include <mpi4py/mpi4py.h>

#include "flashgrad/ring.hpp"
#endif

namespace py = pybind11;
using flashgrad::DType;
using flashgrad::TensorView;

namespace {

// A conversion error of this layer, raised as TypeError or ValueError.
struct ArgError {
  enum Kind { value, type, memory } kind;
  std::string what;
};

[[noreturn]] void fail(bool type_error, const std::string& fn, const std::string& arg,
                       const std::string& expected, const std::string& got) {
  throw ArgError{type_error ? ArgError::type : ArgError::value, "flashgrad." + fn + ": argument '" + arg + "': expected " + expected +
                                 ", got " + got};
}

// Keeps every exporter (capsule, Py_buffer) alive until the call returns.
class Holder {
 public:
  Holder() = default;
  Holder(const Holder&) = delete;
  Holder& operator=(const Holder&) = delete;
  ~Holder() {
    for (auto& b : buffers_) PyBuffer_Release(b.get());
  }
  void keep(py::object o) { objects_.push_back(std::move(o)); }
  Py_buffer* new_buffer() {
    buffers_.push_back(std::make_unique<Py_buffer>());
    return buffers_.back().get();
  }
  void release_last_buffer_slot() { buffers_.pop_back(); }  // GetBuffer failed: nothing to release

 private:
  std::vector<py::object> objects_;
  std::vector<std::unique_ptr<Py_buffer>> buffers_;
};

DType dlpack_dtype(const std::string& fn, const std::string& arg, DLDataType t) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return DType::f32;
    if (t.code == kDLFloat && t.bits == 64) return DType::f64;
    if (t.code == kDLFloat && t.bits == 16) return DType::f16;
    if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
    if ((t.code == kDLUInt || t.code == 6 /* kDLBool, DLPack >= 0.8 */) && t.bits == 8) return DType::u8;
    if (t.code == kDLInt && t.bits == 32) return DType::i32;
  }
  fail(true, fn, arg, "dtype float32, float64, bfloat16, float16, uint8/bool or int32",
       "DLPack dtype code " + std::to_string(t.code) + " bits " + std::to_string(t.bits) + " lanes " +
           std::to_string(t.lanes));
}

TensorView from_dltensor(const std::string& fn, const std::string& arg, const DLTensor& t) {
  if (t.device.device_type != kDLCPU)
    fail(false, fn, arg, "a CPU array (DLPack device_type 1)",
         "device_type " + std::to_string(t.device.device_type));
  if (t.ndim < 1 || t.ndim > 4) fail(false, fn, arg, "1 to 4 dimensions", std::to_string(t.ndim));
  TensorView v;
  v.dtype = dlpack_dtype(fn, arg, t.dtype);
  v.ndim = t.ndim;
  const uint64_t es = static_cast<uint64_t>(flashgrad::dtype_size(v.dtype));
  if (t.byte_offset % es != 0)
    fail(false, fn, arg, "a byte_offset that is a multiple of " + std::to_string(es),
         std::to_string(t.byte_offset));
  v.data = t.data ? static_cast<char*>(t.data) + t.byte_offset : nullptr;
  int64_t compact = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    v.shape[i] = t.shape[i];
    v.strides[i] = t.strides ? t.strides[i] : compact;
    compact *= t.shape[i] > 1 ? t.shape[i] : 1;
  }
  return v;
}

// struct-module format of one element -> DType ('<', '=', '@' prefixes are native here).
std::optional<DType> buffer_dtype(const char* format, Py_ssize_t itemsize) {
  std::string f = format ? format : "B";
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f = f.substr(1);
  if (f.size() != 1) return std::nullopt;
  const char c = f[0];
  if (c == 'f' && itemsize == 4) return DType::f32;
  if (c == 'd' && itemsize == 8) return DType::f64;
  if (c == 'e' && itemsize == 2) return DType::f16;
  if ((c == 'B' || c == '?') && itemsize == 1) return DType::u8;
  if ((c == 'i' || c == 'l' || c == 'q') && itemsize == 4) return DType::i32;
  return std::nullopt;
}

TensorView from_buffer(const std::string& fn, const std::string& arg, py::handle obj, bool writable,
                       Holder& h) {
  Py_buffer* b = h.new_buffer();
  const int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), b, flags) != 0) {
    h.release_last_buffer_slot();
    std::string why = "an exporter that refused the request";
    if (PyErr_Occurred()) {
      py::error_already_set e;
      why = e.what();
    }
    fail(false, fn, arg, writable ? "a writable array" : "a strided array", why);
  }
  const auto dt = buffer_dtype(b->format, b->itemsize);
  if (!dt)
    fail(true, fn, arg, "dtype float32, float64, float16, uint8/bool or int32 (bfloat16 needs DLPack)",
         std::string("buffer format '") + (b->format ? b->format : "B") + "'");
  if (b->ndim < 1 || b->ndim > 4) fail(false, fn, arg, "1 to 4 dimensions", std::to_string(b->ndim));
  TensorView v;
  v.dtype = *dt;
  v.ndim = b->ndim;
  v.data = b->buf;
  for (int i = 0; i < b->ndim; ++i) {
    v.shape[i] = b->shape[i];
    if (b->strides[i] % b->itemsize != 0)
      fail(false, fn, arg, "byte strides that are multiples of the element size " + std::to_string(b->itemsize),
           "stride " + std::to_string(b->strides[i]) + " in dim " + std::to_string(i));
    v.strides[i] = b->strides[i] / b->itemsize;
  }
  return v;
}

// Any array-like -> TensorView over its memory. `writable`: an output.
TensorView to_view(const std::string& fn, const std::string& arg, py::handle obj, bool writable,
                   Holder& h) {
  if (PyCapsule_CheckExact(obj.ptr())) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(obj.ptr(), "dltensor"));
    if (!m) {
      PyErr_Clear();
      fail(true, fn, arg, "an unconsumed DLPack capsule named 'dltensor'", "another capsule");
    }
    return from_dltensor(fn, arg, m->dl_tensor);
  }
  if (PyObject_CheckBuffer(obj.ptr())) return from_buffer(fn, arg, obj, writable, h);
  if (py::hasattr(obj, "__dlpack__")) {
    py::object capsule;
    try {
      capsule = obj.attr("__dlpack__")();
    } catch (py::error_already_set& e) {
      fail(false, fn, arg, "an array whose __dlpack__() succeeds", e.what());
    }
    h.keep(capsule);
    return to_view(fn, arg, capsule, writable, h);
  }
  fail(true, fn, arg, "an array exporting DLPack (__dlpack__) or the buffer protocol",
       std::string("an object of type ") + Py_TYPE(obj.ptr())->tp_name);
}

std::optional<TensorView> opt_view(const std::string& fn, const std::string& arg, py::handle obj,
                                   bool writable, Holder& h) {
  if (obj.is_none()) return std::nullopt;
  return to_view(fn, arg, obj, writable, h);
}

// (q_offset, k_offset, seqlen_q_total, seqlen_k_total) or None -> Options::block; the
// library checks the values against the call's lengths.
std::optional<flashgrad::Options::Block> block_of(const std::string& fn, py::handle val) {
  if (val.is_none()) return std::nullopt;
  const auto t = val.cast<std::vector<int64_t>>();
  if (t.size() != 4)
    fail(false, fn, "block", "4 ints (q_offset, k_offset, seqlen_q_total, seqlen_k_total)",
         std::to_string(t.size()) + " values");
  return flashgrad::Options::Block{t[0], t[1], t[2], t[3]};
}

// The option dict -> flashgrad::Options. Unknown keys are a programming error
// of the Python layer, reported as TypeError.
flashgrad::Options options(const std::string& fn, const py::dict& d, Holder& h) {
  flashgrad::Options o;
  o.softmax_scale = std::numeric_limits<double>::quiet_NaN();
  for (auto item : d) {
    const std::string key = py::str(item.first);
    py::handle val = item.second;
    try {
    if (key == "softmax_scale") o.softmax_scale = val.is_none() ? o.softmax_scale : val.cast<double>();
    else if (key == "causal") o.causal = val.cast<bool>();
    else if (key == "window_left") o.window_left = val.cast<int64_t>();
    else if (key == "window_right") o.window_right = val.cast<int64_t>();
    else if (key == "softcap") o.softcap = val.cast<double>();
    else if (key == "alibi_slopes") o.alibi_slopes = opt_view(fn, key, val, false, h);
    else if (key == "bias") o.bias = opt_view(fn, key, val, false, h);
    else if (key == "mask") o.mask = opt_view(fn, key, val, false, h);
    else if (key == "sinks") o.sinks = opt_view(fn, key, val, false, h);
    else if (key == "cu_seqlens_q") o.cu_seqlens_q = opt_view(fn, key, val, false, h);
    else if (key == "cu_seqlens_k") o.cu_seqlens_k = opt_view(fn, key, val, false, h);
    else if (key == "dropout_p") o.dropout_p = val.cast<double>();
    else if (key == "seed") o.seed = val.cast<uint64_t>();
    else if (key == "offset") o.offset = val.cast<uint64_t>();
    else if (key == "num_threads") o.num_threads = val.cast<int>();
    else if (key == "block") o.block = block_of(fn, val);
    else fail(true, fn, key, "a known option", "an unknown keyword");
    } catch (const py::cast_error&) {
      fail(true, fn, key, key == "block" ? "a sequence of 4 ints" : "a number or bool",
           std::string("an object of type ") + Py_TYPE(val.ptr())->tp_name);
    }
  }
  return o;
}

// Runs f with the GIL released, translating the library's exceptions.
template <typename F>
void run(F&& f) {
  ArgError err{ArgError::value, ""};
  {
    py::gil_scoped_release nogil;
    try {
      f();
      return;
    } catch (const flashgrad::Error& e) {
      err.what = e.what();
      // "argument 'x': expected dtype ..." is a type error in Python's terms.
      if (e.code() == flashgrad::Error::Code::out_of_memory) err.kind = ArgError::memory;
      else if (err.what.find("': expected dtype") != std::string::npos) err.kind = ArgError::type;
    } catch (const std::bad_alloc&) {
      err = {ArgError::memory, "flashgrad: out of memory"};
    }
  }
  throw err;
}

py::tuple describe(py::handle obj) {
  Holder h;
  const TensorView v = to_view("describe", "x", obj, false, h);
  py::tuple shape(v.ndim), strides(v.ndim);
  for (int i = 0; i < v.ndim; ++i) {
    shape[i] = v.shape[i];
    strides[i] = v.strides[i];
  }
  return py::make_tuple(shape, strides, flashgrad::dtype_name(v.dtype));
}

// Converts a forward call's arguments, then runs call(options, q, k, v, out, lse) without the GIL.
template <typename Call>
void forward_call(const std::string& fn, const py::dict& opts, py::handle q, py::handle k, py::handle v,
                  py::handle out, py::handle lse, Call&& call) {
  Holder h;
  const flashgrad::Options o = options(fn, opts, h);
  const TensorView tq = to_view(fn, "q", q, false, h), tk = to_view(fn, "k", k, false, h),
                   tv = to_view(fn, "v", v, false, h), tout = to_view(fn, "out", out, true, h),
                   tlse = to_view(fn, "lse", lse, true, h);
  run([&] { call(o, tq, tk, tv, tout, tlse); });
}

// Likewise for a backward call: call(options, q, k, v, out, lse, dout, grads).
template <typename Call>
void backward_call(const std::string& fn, const py::dict& opts, py::handle q, py::handle k, py::handle v,
                   py::handle out, py::handle lse, py::handle dout, py::handle dq, py::handle dk, py::handle dv,
                   py::handle dsinks, py::handle dbias, Call&& call) {
  Holder h;
  const flashgrad::Options o = options(fn, opts, h);
  const TensorView tq = to_view(fn, "q", q, false, h), tk = to_view(fn, "k", k, false, h),
                   tv = to_view(fn, "v", v, false, h), tout = to_view(fn, "out", out, false, h),
                   tlse = to_view(fn, "lse", lse, false, h), tdout = to_view(fn, "dout", dout, false, h);
  flashgrad::Grads g{to_view(fn, "dq", dq, true, h), to_view(fn, "dk", dk, true, h),
                     to_view(fn, "dv", dv, true, h), opt_view(fn, "dsinks", dsinks, true, h),
                     opt_view(fn, "dbias", dbias, true, h)};
  run([&] { call(o, tq, tk, tv, tout, tlse, tdout, g); });
}

void forward(const py::dict& opts, py::handle q, py::handle k, py::handle v, py::handle out,
             py::handle lse) {
  forward_call("forward", opts, q, k, v, out, lse, [](auto&&... a) { flashgrad::forward(a...); });
}

void backward(const py::dict& opts, py::handle q, py::handle k, py::handle v, py::handle out,
              py::handle lse, py::handle dout, py::handle dq, py::handle dk, py::handle dv,
              py::handle dsinks, py::handle dbias) {
  backward_call("backward", opts, q, k, v, out, lse, dout, dq, dk, dv, dsinks, dbias,
                [](auto&&... a) { flashgrad::backward(a...); });
}

int64_t workspace_bytes(bool is_forward, const py::dict& opts, py::handle q, py::handle k, py::handle v) {
  Holder h;
  const std::string fn = is_forward ? "forward_workspace_bytes" : "backward_workspace_bytes";
  const flashgrad::Options o = options(fn, opts, h);
  const TensorView tq = to_view(fn, "q", q, false, h), tk = to_view(fn, "k", k, false, h),
                   tv = to_view(fn, "v", v, false, h);
  int64_t bytes = 0;
  run([&] {
    bytes = is_forward ? flashgrad::forward_workspace_bytes(o, tq, tk, tv)
                       : flashgrad::backward_workspace_bytes(o, tq, tk, tv);
  });
  return bytes;
}

void dropout_keep_mask(const py::dict& opts, int64_t batch, int64_t heads_q, int64_t seqlen_q,
                       int64_t seqlen_k, py::handle keep) {
  Holder h;
  const std::string fn = "dropout_keep_mask";
  const flashgrad::Options o = options(fn, opts, h);
  const TensorView tkeep = to_view(fn, "keep", keep, true, h);
  run([&] { flashgrad::dropout_keep_mask(o, batch, heads_q, seqlen_q, seqlen_k, tkeep); });
}

void merge(py::handle o_acc, py::handle lse_acc, py::handle o_part, py::handle lse_part, int num_threads) {
  Holder h;
  const std::string fn = "merge";
  const TensorView oa = to_view(fn, "o_acc", o_acc, true, h), la = to_view(fn, "lse_acc", lse_acc, true, h),
                   op = to_view(fn, "o_part", o_part, false, h), lp = to_view(fn, "lse_part", lse_part, false, h);
  run([&] { flashgrad::merge(oa, la, op, lp, num_threads); });
}

std::vector<std::pair<int64_t, int64_t>> shard_rows(const std::string& sharding, int64_t seqlen, int rank,
                                                    int world) {
  if (sharding != "zigzag" && sharding != "contiguous")
    fail(false, "shard_rows", "sharding", "'zigzag' or 'contiguous'", "'" + sharding + "'");
  std::vector<std::pair<int64_t, int64_t>> out;
  run([&] {
    for (const auto& r : flashgrad::shard_rows(
             sharding == "zigzag" ? flashgrad::Sharding::zigzag : flashgrad::Sharding::contiguous, seqlen, rank, world))
      out.emplace_back(r.start, r.length);
  });
  return out;
}

#if FLASHGRAD_PY_MPI
// The MPI communicator inside an mpi4py.MPI.Comm (mpi4py's C API, imported on first use).
MPI_Comm comm_of(const std::string& fn, py::handle comm) {
  static bool imported = false;
  if (!imported) {
    if (import_mpi4py() < 0) throw py::error_already_set();
    imported = true;
  }
  if (!PyObject_TypeCheck(comm.ptr(), &PyMPIComm_Type))
    fail(true, fn, "comm", "an mpi4py.MPI.Comm", std::string(Py_TYPE(comm.ptr())->tp_name));
  return *PyMPIComm_Get(comm.ptr());
}

flashgrad::RingOptions ring_options(const std::string& fn, py::handle comm, const std::string& sharding) {
  flashgrad::RingOptions r;
  r.comm = comm_of(fn, comm);
  if (sharding != "zigzag" && sharding != "contiguous")
    fail(false, fn, "sharding", "'zigzag' or 'contiguous'", "'" + sharding + "'");
  r.sharding = sharding == "zigzag" ? flashgrad::Sharding::zigzag : flashgrad::Sharding::contiguous;
  return r;
}

void ring_forward(const py::dict& opts, py::handle comm, const std::string& sharding, py::handle q,
                  py::handle k, py::handle v, py::handle out, py::handle lse) {
  const flashgrad::RingOptions r = ring_options("ring_forward", comm, sharding);
  forward_call("ring_forward", opts, q, k, v, out, lse,
               [&](const flashgrad::Options& o, auto&&... a) { flashgrad::ring_forward(o, r, a...); });
}

void ring_backward(const py::dict& opts, py::handle comm, const std::string& sharding, py::handle q,
                   py::handle k, py::handle v, py::handle out, py::handle lse, py::handle dout, py::handle dq,
                   py::handle dk, py::handle dv, py::handle dsinks, py::handle dbias) {
  const flashgrad::RingOptions r = ring_options("ring_backward", comm, sharding);
  backward_call("ring_backward", opts, q, k, v, out, lse, dout, dq, dk, dv, dsinks, dbias,
                [&](const flashgrad::Options& o, auto&&... a) { flashgrad::ring_backward(o, r, a...); });
}

#endif

}  // namespace

PYBIND11_MODULE(_flashgrad, m) {
  m.doc() = "flashgrad's C++ API, bound with pybind11 (use the flashgrad package, not this module).";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ArgError& e) {
      PyObject* type = e.kind == ArgError::type     ? PyExc_TypeError
                       : e.kind == ArgError::memory ? PyExc_MemoryError
                                                    : PyExc_ValueError;
      PyErr_SetString(type, e.what.c_str());
    }
  });
  m.def("describe", &describe, py::arg("x"), "(shape, strides in elements, dtype name) of an array-like.");
  m.def("forward", &forward, py::arg("opts"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
        py::arg("lse"));
  m.def("backward", &backward, py::arg("opts"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"),
        py::arg("lse"), py::arg("dout"), py::arg("dq"), py::arg("dk"), py::arg("dv"),
        py::arg("dsinks").none(true), py::arg("dbias").none(true));
  m.def("forward_workspace_bytes",
        [](const py::dict& o, py::handle q, py::handle k, py::handle v) { return workspace_bytes(true, o, q, k, v); });
  m.def("backward_workspace_bytes",
        [](const py::dict& o, py::handle q, py::handle k, py::handle v) { return workspace_bytes(false, o, q, k, v); });
  m.def("dropout_keep_mask", &dropout_keep_mask, py::arg("opts"), py::arg("batch"), py::arg("heads_q"),
        py::arg("seqlen_q"), py::arg("seqlen_k"), py::arg("keep"));
  m.def("isa", [] {
    const char* name = nullptr;
    run([&] { name = flashgrad::isa_name(); });
    return std::string(name);
  });
  m.def("max_threads", &flashgrad::max_threads);
  m.def(
      "use_openmp_runtime", [](const std::string& library) { run([&] { flashgrad::use_openmp_runtime(library); }); },
      py::arg("library"));
  m.def("thread_runner", &flashgrad::thread_runner_name);
  m.def("merge", &merge, py::arg("o_acc"), py::arg("lse_acc"), py::arg("o_part"), py::arg("lse_part"),
        py::arg("num_threads"));
  m.def("shard_rows", &shard_rows, py::arg("sharding"), py::arg("seqlen"), py::arg("rank"), py::arg("world"));
#if FLASHGRAD_PY_MPI
  m.attr("has_ring") = true;
  m.def("ring_forward", &ring_forward, py::arg("opts"), py::arg("comm"), py::arg("sharding"), py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"));
  m.def("ring_backward", &ring_backward, py::arg("opts"), py::arg("comm"), py::arg("sharding"), py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("dout"), py::arg("dq"), py::arg("dk"),
        py::arg("dv"), py::arg("dsinks").none(true), py::arg("dbias").none(true));
#else
  m.attr("has_ring") = false;
#endif
}
