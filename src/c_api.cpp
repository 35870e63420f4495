// The C ABI: DLTensor -> TensorView, then the C++ API inside a try/catch that
// turns every exception into a status and a thread-local message.
#include "flashgrad/flashgrad.h"

#include <cmath>
#include <limits>
#include <new>
#include <optional>
#include <string>

#include "c_bridge.hpp"
#include "flashgrad/flashgrad.hpp"

namespace {

thread_local std::string g_last_error;

using flashgrad::DType;
using flashgrad::Error;
using flashgrad::TensorView;
using namespace flashgrad::c_bridge;

DType to_dtype(const char* fn, const char* arg, DLDataType t) {
  auto fail = [&] {
    throw Error(std::string("flashgrad::") + fn + ": argument '" + arg +
                "': expected a DLPack dtype float16/32/64, bfloat16, uint8/bool or int32 with 1 lane, got code " +
                std::to_string(t.code) + " bits " + std::to_string(t.bits) + " lanes " + std::to_string(t.lanes));
  };
  if (t.lanes != 1) fail();
  if (t.code == kDLFloat && t.bits == 32) return DType::f32;
  if (t.code == kDLFloat && t.bits == 64) return DType::f64;
  if (t.code == kDLFloat && t.bits == 16) return DType::f16;
  if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
  if ((t.code == kDLUInt || t.code == 6 /* kDLBool in DLPack >= 0.8 */) && t.bits == 8) return DType::u8;
  if (t.code == kDLInt && t.bits == 32) return DType::i32;
  fail();
  return DType::f32;
}

}  // namespace

namespace flashgrad::c_bridge {

TensorView view(const char* fn, const char* arg, const DLTensor* t) {
  if (!t) throw Error(std::string("flashgrad::") + fn + ": argument '" + arg + "': expected a DLTensor, got NULL");
  if (t->device.device_type != kDLCPU)
    throw Error(std::string("flashgrad::") + fn + ": argument '" + arg +
                "': expected a CPU tensor (device_type 1), got device_type " + std::to_string(t->device.device_type));
  if (t->ndim < 1 || t->ndim > 4 || !t->shape)
    throw Error(std::string("flashgrad::") + fn + ": argument '" + arg + "': expected 1 to 4 dimensions, got " +
                std::to_string(t->ndim));
  TensorView v;
  v.dtype = to_dtype(fn, arg, t->dtype);
  v.ndim = t->ndim;
  const int64_t es = flashgrad::dtype_size(v.dtype);
  if (t->byte_offset % static_cast<uint64_t>(es) != 0)
    throw Error(std::string("flashgrad::") + fn + ": argument '" + arg + "': expected a byte_offset that is a multiple of " +
                std::to_string(es) + ", got " + std::to_string(t->byte_offset));
  v.data = t->data ? static_cast<char*>(t->data) + t->byte_offset : nullptr;
  int64_t st = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    v.shape[i] = t->shape[i];
    v.strides[i] = t->strides ? t->strides[i] : st;
    // An overflowing compact stride saturates; validation then rejects the shape.
    if (__builtin_mul_overflow(st, t->shape[i] > 1 ? t->shape[i] : 1, &st))
      st = std::numeric_limits<int64_t>::max();
  }
  return v;
}

std::optional<TensorView> opt_view(const char* fn, const char* arg, const DLTensor* t) {
  if (!t) return std::nullopt;
  return view(fn, arg, t);
}

flashgrad::Options options(const char* fn, const fg_params* p) {
  if (!p) throw Error(std::string("flashgrad::") + fn + ": argument 'p': expected fg_params, got NULL");
  flashgrad::Options o;
  o.softmax_scale = p->softmax_scale;
  o.causal = p->causal != 0;
  o.window_left = p->window_left;
  o.window_right = p->window_right;
  o.softcap = p->softcap;
  o.alibi_slopes = opt_view(fn, "alibi_slopes", p->alibi_slopes);
  o.bias = opt_view(fn, "bias", p->bias);
  o.mask = opt_view(fn, "mask", p->mask);
  o.sinks = opt_view(fn, "sinks", p->sinks);
  o.cu_seqlens_q = opt_view(fn, "cu_seqlens_q", p->cu_seqlens_q);
  o.cu_seqlens_k = opt_view(fn, "cu_seqlens_k", p->cu_seqlens_k);
  o.dropout_p = p->dropout_p;
  o.seed = p->seed;
  o.offset = p->offset;
  o.num_threads = p->num_threads;
  if (p->block)
    o.block = flashgrad::Options::Block{p->block_q_offset, p->block_k_offset, p->block_seqlen_q_total,
                                        p->block_seqlen_k_total};
  return o;
}

fg_status guarded(const std::function<void()>& f) {
  try {
    f();
    g_last_error.clear();
    return FG_OK;
  } catch (const Error& e) {
    g_last_error = e.what();
    switch (e.code()) {
      case Error::Code::out_of_memory: return FG_ERR_OUT_OF_MEMORY;
      case Error::Code::unsupported: return FG_ERR_UNSUPPORTED;
      default: return FG_ERR_INVALID_ARGUMENT;
    }
  } catch (const std::bad_alloc&) {
    g_last_error = "flashgrad: out of memory";
    return FG_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    g_last_error = std::string("flashgrad: internal error: ") + e.what();
    return FG_ERR_INTERNAL;
  } catch (...) {
    g_last_error = "flashgrad: internal error: unknown exception";
    return FG_ERR_INTERNAL;
  }
}

}  // namespace flashgrad::c_bridge

extern "C" {

fg_params fg_params_default(void) {
  fg_params p{};
  p.softmax_scale = std::numeric_limits<double>::quiet_NaN();
  p.window_left = -1;
  p.window_right = -1;
  return p;
}

fg_status fg_forward(const fg_params* p, const DLTensor* q, const DLTensor* k, const DLTensor* v,
                     DLTensor* out, DLTensor* lse) {
  return guarded([&] {
    const char* fn = "forward";
    flashgrad::forward(options(fn, p), view(fn, "q", q), view(fn, "k", k), view(fn, "v", v),
                       view(fn, "out", out), view(fn, "lse", lse));
  });
}

fg_status fg_backward_with_bias_grad(const fg_params* p, const DLTensor* q, const DLTensor* k,
                                     const DLTensor* v, const DLTensor* out, const DLTensor* lse,
                                     const DLTensor* dout, DLTensor* dq, DLTensor* dk, DLTensor* dv,
                                     DLTensor* dsinks, DLTensor* dbias) {
  return guarded([&] {
    const char* fn = "backward";
    flashgrad::Grads g{view(fn, "dq", dq), view(fn, "dk", dk), view(fn, "dv", dv),
                       opt_view(fn, "dsinks", dsinks), opt_view(fn, "dbias", dbias)};
    flashgrad::backward(options(fn, p), view(fn, "q", q), view(fn, "k", k), view(fn, "v", v),
                        view(fn, "out", out), view(fn, "lse", lse), view(fn, "dout", dout), g);
  });
}

fg_status fg_backward(const fg_params* p, const DLTensor* q, const DLTensor* k, const DLTensor* v,
                      const DLTensor* out, const DLTensor* lse, const DLTensor* dout, DLTensor* dq,
                      DLTensor* dk, DLTensor* dv, DLTensor* dsinks) {
  return fg_backward_with_bias_grad(p, q, k, v, out, lse, dout, dq, dk, dv, dsinks, nullptr);
}

int64_t fg_forward_workspace_bytes(const fg_params* p, const DLTensor* q, const DLTensor* k,
                                   const DLTensor* v) {
  int64_t bytes = -1;
  guarded([&] {
    const char* fn = "forward_workspace_bytes";
    bytes = flashgrad::forward_workspace_bytes(options(fn, p), view(fn, "q", q), view(fn, "k", k), view(fn, "v", v));
  });
  return bytes;
}

int64_t fg_backward_workspace_bytes(const fg_params* p, const DLTensor* q, const DLTensor* k,
                                    const DLTensor* v) {
  int64_t bytes = -1;
  guarded([&] {
    const char* fn = "backward_workspace_bytes";
    bytes = flashgrad::backward_workspace_bytes(options(fn, p), view(fn, "q", q), view(fn, "k", k), view(fn, "v", v));
  });
  return bytes;
}

const char* fg_explain(const fg_params* p, const DLTensor* q, const DLTensor* k, const DLTensor* v,
                       int backward) {
  thread_local std::string line;
  const char* text = nullptr;
  guarded([&] {
    const char* fn = backward ? "explain_backward" : "explain_forward";
    const flashgrad::Options o = options(fn, p);
    const flashgrad::TensorView qv = view(fn, "q", q), kv = view(fn, "k", k), vv = view(fn, "v", v);
    line = (backward ? flashgrad::explain_backward(o, qv, kv, vv) : flashgrad::explain_forward(o, qv, kv, vv)).describe();
    text = line.c_str();
  });
  return text;
}

fg_status fg_merge(DLTensor* o_acc, DLTensor* lse_acc, const DLTensor* o_part, const DLTensor* lse_part,
                   int num_threads) {
  return guarded([&] {
    const char* fn = "merge";
    flashgrad::merge(view(fn, "o_acc", o_acc), view(fn, "lse_acc", lse_acc), view(fn, "o_part", o_part),
                     view(fn, "lse_part", lse_part), num_threads);
  });
}

fg_status fg_set_thread_runner(fg_thread_runner_fn run, void* ctx, const char* name) {
  return guarded([&] {
    flashgrad::ThreadRunner r;
    r.run = run, r.ctx = ctx, r.name = name && *name ? name : "host";
    flashgrad::set_thread_runner(r);
  });
}

fg_status fg_use_openmp_runtime(const char* library) {
  return guarded([&] { flashgrad::use_openmp_runtime(library ? library : ""); });
}

const char* fg_last_error(void) { return g_last_error.c_str(); }

const char* fg_version(void) { return flashgrad::version(); }

const char* fg_isa(void) {
  const char* name = nullptr;
  guarded([&] { name = flashgrad::isa_name(); });
  return name;
}

}  // extern "C"
