// flashgrad._jax_ffi: XLA FFI handlers for flashgrad.jax (CPU platform).
//
// Two handlers, registered by python/flashgrad/jax.py with
// jax.ffi.register_ffi_target(..., platform="cpu"):
//
//   flashgrad_attention_fwd(q, k, v, [bias], [mask]) -> (out, lse)
//   flashgrad_attention_bwd(q, k, v, out, lse, dout, [bias], [mask]) -> (dq, dk, dv, [dbias])
//
// q [..., batch, seqlen_q, heads_q, head_dim], k/v [..., batch, seqlen_k, heads_kv, head_dim],
// out/dout like q, lse [..., batch, heads_q, seqlen_q] (f32, f64 for f64 inputs),
// bias [..., batch|1, heads_q|1, seqlen_q, seqlen_k], mask likewise (pred or u8, nonzero = attend).
// Every operand is a dense row-major XLA buffer. The leading "..." dims are the
// ones jax.vmap adds (vmap_method="broadcast_all" gives every operand the same
// ones); each index of them is one call of the library on 4-D views.
//
// Errors (flashgrad::Error's message, or a rank / dtype this layer refuses)
// return as ffi::Error; XLA raises them in Python. Nothing is thrown across
// the FFI boundary.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <tuple>
#include <utility>
#include <string>
#include <vector>

#include "flashgrad/flashgrad.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using flashgrad::DType;
using flashgrad::TensorView;

namespace {

// The flags each call carries as FFI attributes (python/flashgrad/jax.py sets them).
struct Flags {
  double scale;
  int64_t causal, window_left, window_right, top_left, has_bias, has_mask, num_threads;
};

std::optional<DType> to_dtype(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return DType::f32;
    case ffi::DataType::F64: return DType::f64;
    case ffi::DataType::BF16: return DType::bf16;
    case ffi::DataType::F16: return DType::f16;
    case ffi::DataType::PRED:
    case ffi::DataType::U8: return DType::u8;
    default: return std::nullopt;
  }
}

// One operand: its buffer seen as outer dims (vmap's) times a core of `core` dims.
struct Operand {
  const char* name;
  void* data;
  DType dtype;
  std::vector<int64_t> outer, core;

  // The 4-D (or 3-D) view of outer index o.
  TensorView view(int64_t o) const {
    int64_t n = 1;
    for (int64_t d : core) n *= d;
    char* p = static_cast<char*>(data) + o * n * flashgrad::dtype_size(dtype);
    if (core.size() == 3) return TensorView::contiguous(p, dtype, {core[0], core[1], core[2]});
    return TensorView::contiguous(p, dtype, {core[0], core[1], core[2], core[3]});
  }
};

std::string dims_str(ffi::AnyBuffer::Dimensions d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// Splits a buffer into (outer, core); a refusal reads like the library's errors.
ffi::ErrorOr<Operand> operand(const char* fn, const char* name, const ffi::AnyBuffer& b, size_t core) {
  const auto dims = b.dimensions();
  const auto dt = to_dtype(b.element_type());
  const std::string where = std::string("flashgrad.jax.") + fn + ": argument '" + name + "': expected ";
  if (!dt)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        where + "dtype float32, float64, bfloat16, float16 or bool, got XLA element type " +
        std::to_string(static_cast<int>(b.element_type()))));
  if (dims.size() < core)
    return ffi::Unexpected(ffi::Error::InvalidArgument(where + "at least " + std::to_string(core) +
                                                       " dims, got shape " + dims_str(dims)));
  Operand o{name, b.untyped_data(), *dt, {}, {}};
  o.outer.assign(dims.begin(), dims.end() - core);
  o.core.assign(dims.end() - core, dims.end());
  return o;
}

// The number of library calls: every operand must have q's outer dims.
ffi::ErrorOr<int64_t> outer_count(const char* fn, const std::vector<Operand>& ops) {
  int64_t n = 1;
  for (int64_t d : ops[0].outer) n *= d;
  for (const auto& o : ops) {
    if (o.outer != ops[0].outer)
      return ffi::Unexpected(ffi::Error::InvalidArgument(
          std::string("flashgrad.jax.") + fn + ": argument '" + o.name +
          "': expected the leading (vmapped) dims of 'q', got " + std::to_string(o.outer.size()) +
          " leading dims that differ"));
  }
  return n;
}

flashgrad::Options options(const Flags& f, const Operand& q, const Operand& k) {
  flashgrad::Options o;
  o.softmax_scale = f.scale;
  o.causal = f.causal != 0;
  o.window_left = f.window_left;
  o.window_right = f.window_right;
  o.num_threads = static_cast<int>(f.num_threads);
  // jax.nn.dot_product_attention aligns causal and window top-left (query i at
  // key position i); the library aligns bottom-right, so a call with
  // seqlen_q != seqlen_k becomes the top-left corner of a square attention.
  const int64_t lq = q.core[1], lk = k.core[1];
  if (f.top_left && lq != lk) {
    const int64_t total = lq > lk ? lq : lk;
    o.block = flashgrad::Options::Block{0, 0, total, total};
  }
  return o;
}

// Runs body(o) for every outer index; a flashgrad::Error becomes ffi::Error.
template <typename Body>
ffi::Error each_outer(int64_t n, Body&& body) {
  try {
    for (int64_t o = 0; o < n; ++o) body(o);
  } catch (const flashgrad::Error& e) {
    return ffi::Error::InvalidArgument(e.what());
  } catch (const std::exception& e) {
    return ffi::Error::Internal(std::string("flashgrad.jax: ") + e.what());
  }
  return ffi::Error::Success();
}

// Reads bias and mask from `rest` (in that order, each only when its flag is set).
ffi::Error optional_inputs(const char* fn, const Flags& f, ffi::RemainingArgs rest, std::vector<Operand>& ops,
                           int& bias_at, int& mask_at) {
  size_t next = 0;
  for (auto [flag, name, at] : {std::tuple{f.has_bias, "bias", &bias_at}, std::tuple{f.has_mask, "mask", &mask_at}}) {
    *at = -1;
    if (!flag) continue;
    auto buf = rest.get<ffi::AnyBuffer>(next++);
    if (!buf) return buf.error();
    auto op = operand(fn, name, *buf, 4);
    if (!op) return op.error();
    *at = static_cast<int>(ops.size());
    ops.push_back(*op);
  }
  if (next != rest.size())
    return ffi::Error::InvalidArgument(std::string("flashgrad.jax.") + fn + ": expected " + std::to_string(next) +
                                       " optional inputs, got " + std::to_string(rest.size()));
  return ffi::Error::Success();
}

void set_optional(flashgrad::Options& opts, const std::vector<Operand>& ops, int bias_at, int mask_at, int64_t o) {
  if (bias_at >= 0) opts.bias = ops[bias_at].view(o);
  if (mask_at >= 0) opts.mask = ops[mask_at].view(o);
}

ffi::Error forward_impl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs rest,
                        ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, Flags f) {
  std::vector<Operand> ops;
  for (auto [name, buf, core] : {std::tuple{"q", &q, 4}, std::tuple{"k", &k, 4}, std::tuple{"v", &v, 4},
                                 std::tuple{"out", &*out, 4}, std::tuple{"lse", &*lse, 3}}) {
    auto op = operand("forward", name, *buf, core);
    if (!op) return op.error();
    ops.push_back(*op);
  }
  int bias_at, mask_at;
  if (auto err = optional_inputs("forward", f, rest, ops, bias_at, mask_at); err.failure()) return err;
  auto n = outer_count("forward", ops);
  if (!n) return n.error();
  return each_outer(*n, [&](int64_t o) {
    flashgrad::Options opts = options(f, ops[0], ops[1]);
    set_optional(opts, ops, bias_at, mask_at, o);
    flashgrad::forward(opts, ops[0].view(o), ops[1].view(o), ops[2].view(o), ops[3].view(o), ops[4].view(o));
  });
}

ffi::Error backward_impl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out,
                         ffi::AnyBuffer lse, ffi::AnyBuffer dout, ffi::RemainingArgs rest,
                         ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                         ffi::Result<ffi::AnyBuffer> dv, ffi::RemainingRets dbias_ret, Flags f) {
  std::vector<Operand> ops;
  for (auto [name, buf, core] :
       {std::tuple{"q", &q, 4}, std::tuple{"k", &k, 4}, std::tuple{"v", &v, 4}, std::tuple{"out", &out, 4},
        std::tuple{"lse", &lse, 3}, std::tuple{"dout", &dout, 4}, std::tuple{"dq", &*dq, 4},
        std::tuple{"dk", &*dk, 4}, std::tuple{"dv", &*dv, 4}}) {
    auto op = operand("backward", name, *buf, core);
    if (!op) return op.error();
    ops.push_back(*op);
  }
  int bias_at, mask_at;
  if (auto err = optional_inputs("backward", f, rest, ops, bias_at, mask_at); err.failure()) return err;
  int dbias_at = -1;
  if (bias_at >= 0) {
    auto db = dbias_ret.get<ffi::AnyBuffer>(0);
    if (!db) return db.error();
    auto op = operand("backward", "dbias", **db, 4);
    if (!op) return op.error();
    dbias_at = static_cast<int>(ops.size());
    ops.push_back(*op);
  }
  auto n = outer_count("backward", ops);
  if (!n) return n.error();
  return each_outer(*n, [&](int64_t o) {
    flashgrad::Options opts = options(f, ops[0], ops[1]);
    set_optional(opts, ops, bias_at, mask_at, o);
    flashgrad::Grads g{ops[6].view(o), ops[7].view(o), ops[8].view(o), std::nullopt, std::nullopt};
    if (dbias_at >= 0) g.dbias = ops[dbias_at].view(o);
    flashgrad::backward(opts, ops[0].view(o), ops[1].view(o), ops[2].view(o), ops[3].view(o), ops[4].view(o),
                        ops[5].view(o), g);
  });
}

ffi::Error forward_entry(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs rest,
                         ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, double scale,
                         int64_t causal, int64_t window_left, int64_t window_right, int64_t top_left,
                         int64_t has_bias, int64_t has_mask, int64_t num_threads) {
  return forward_impl(q, k, v, rest, out, lse,
                      Flags{scale, causal, window_left, window_right, top_left, has_bias, has_mask, num_threads});
}

ffi::Error backward_entry(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out,
                          ffi::AnyBuffer lse, ffi::AnyBuffer dout, ffi::RemainingArgs rest,
                          ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                          ffi::Result<ffi::AnyBuffer> dv, ffi::RemainingRets dbias, double scale, int64_t causal,
                          int64_t window_left, int64_t window_right, int64_t top_left, int64_t has_bias,
                          int64_t has_mask, int64_t num_threads) {
  return backward_impl(q, k, v, out, lse, dout, rest, dq, dk, dv, dbias,
                       Flags{scale, causal, window_left, window_right, top_left, has_bias, has_mask, num_threads});
}

template <typename B>
auto with_flags(B binding) {
  return std::move(binding).template Attr<double>("scale")
      .template Attr<int64_t>("causal")
      .template Attr<int64_t>("window_left")
      .template Attr<int64_t>("window_right")
      .template Attr<int64_t>("top_left")
      .template Attr<int64_t>("has_bias")
      .template Attr<int64_t>("has_mask")
      .template Attr<int64_t>("num_threads");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashgradAttentionFwd, forward_entry,
                              with_flags(ffi::Ffi::Bind()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .RemainingArgs()
                                             .Ret<ffi::AnyBuffer>()
                                             .Ret<ffi::AnyBuffer>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlashgradAttentionBwd, backward_entry,
                              with_flags(ffi::Ffi::Bind()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .RemainingArgs()
                                             .Ret<ffi::AnyBuffer>()
                                             .Ret<ffi::AnyBuffer>()
                                             .Ret<ffi::AnyBuffer>()
                                             .RemainingRets()));

PYBIND11_MODULE(_jax_ffi, m) {
  m.doc() = "XLA FFI handlers of flashgrad.jax (capsules for jax.ffi.register_ffi_target)";
  m.def("registrations", [] {
    pybind11::dict d;
    d["flashgrad_attention_fwd"] = pybind11::capsule(reinterpret_cast<void*>(FlashgradAttentionFwd));
    d["flashgrad_attention_bwd"] = pybind11::capsule(reinterpret_cast<void*>(FlashgradAttentionBwd));
    return d;
  });
  m.def("isa", [] { return std::string(flashgrad::isa_name()); });
}
