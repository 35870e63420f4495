#include "check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

namespace flashgrad {
namespace {

std::string shape_str(const TensorView& t) {
  std::ostringstream s;
  s << "[";
  for (int i = 0; i < t.ndim; ++i) s << (i ? ", " : "") << t.shape[i];
  s << "]";
  return s.str();
}

std::string dims_str(const std::vector<int64_t>& d) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < d.size(); ++i) s << (i ? ", " : "") << d[i];
  s << "]";
  return s.str();
}

// Byte range [lo, hi) a view can touch; empty views touch nothing.
struct Span {
  uintptr_t lo = 0, hi = 0;
  bool empty() const { return lo == hi; }
};

class Checker {
 public:
  explicit Checker(const char* fn) : fn_(fn) {}

  [[noreturn]] void fail(const std::string& arg, const std::string& expected,
                         const std::string& got) const {
    throw Error(std::string("flashgrad::") + fn_ + ": argument '" + arg + "': expected " +
                expected + ", got " + got);
  }

  // Shape, strides, data pointer and element-count sanity of one view.
  void view(const std::string& arg, const TensorView& t) const {
    if (t.ndim < 1 || t.ndim > 4) fail(arg, "1 to 4 dimensions", std::to_string(t.ndim));
    int64_t n = 1;
    for (int i = 0; i < t.ndim; ++i) {
      if (t.shape[i] < 0) fail(arg, "non-negative sizes", "shape " + shape_str(t));
      if (__builtin_mul_overflow(n, t.shape[i], &n))
        fail(arg, "an element count that fits in int64", "shape " + shape_str(t));
    }
    if (n == 0) return;
    int64_t extent = 0, bytes = 0;
    for (int i = 0; i < t.ndim; ++i) {
      int64_t term;
      const int64_t st = t.strides[i] < 0 ? -t.strides[i] : t.strides[i];
      if (__builtin_mul_overflow(t.shape[i] - 1, st, &term) ||
          __builtin_add_overflow(extent, term, &extent))
        fail(arg, "strides whose extent fits in int64", "shape " + shape_str(t));
    }
    if (__builtin_mul_overflow(extent + 1, dtype_size(t.dtype), &bytes))
      fail(arg, "a byte extent that fits in int64", "shape " + shape_str(t));
    if (!t.data) fail(arg, "non-null data for " + std::to_string(n) + " elements", "null");
  }

  void dtype(const std::string& arg, const TensorView& t, DType want) const {
    if (t.dtype != want)
      fail(arg, std::string("dtype ") + dtype_name(want), std::string("dtype ") + dtype_name(t.dtype));
  }

  void shape(const std::string& arg, const TensorView& t, const std::vector<int64_t>& want,
             const char* names) const {
    bool ok = t.ndim == static_cast<int>(want.size());
    for (int i = 0; ok && i < t.ndim; ++i) ok = t.shape[i] == want[i];
    if (!ok) fail(arg, "shape " + dims_str(want) + " " + names, shape_str(t));
  }

  // A view whose distinct indices can alias the same element cannot be written.
  void no_self_overlap(const std::string& arg, const TensorView& t) const {
    if (t.numel() == 0) return;
    std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size)
    for (int i = 0; i < t.ndim; ++i)
      if (t.shape[i] > 1) dims.push_back({t.strides[i] < 0 ? -t.strides[i] : t.strides[i], t.shape[i]});
    std::sort(dims.begin(), dims.end());
    int64_t reach = 0;  // largest offset reachable with the smaller strides
    for (const auto& [st, n] : dims) {
      if (st <= reach)
        fail(arg, "an output whose elements do not alias each other",
             "strides that overlap, shape " + shape_str(t));
      reach += (n - 1) * st;
    }
  }

  static Span span(const TensorView& t) {
    if (t.numel() == 0) return {};
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < t.ndim; ++i) {
      const int64_t e = (t.shape[i] - 1) * t.strides[i];
      (e < 0 ? lo : hi) += e;
    }
    const auto base = reinterpret_cast<uintptr_t>(t.data);
    const int64_t es = dtype_size(t.dtype);
    return {base + static_cast<uintptr_t>(lo * es), base + static_cast<uintptr_t>((hi + 1) * es)};
  }

  void disjoint(const std::string& a, const TensorView& ta, const std::string& b,
                const TensorView& tb) const {
    const Span x = span(ta), y = span(tb);
    if (x.empty() || y.empty()) return;
    if (x.lo < y.hi && y.lo < x.hi)
      fail(a, "memory that does not overlap '" + b + "'", "overlapping address ranges");
  }

 private:
  const char* fn_;
};

bool is_float_storage(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}

Operand operand(const TensorView& t, bool varlen) {
  Operand o;
  o.data = t.data;
  if (varlen) {
    o.batch_stride = 0;
    o.seq_stride = t.strides[0];
    o.head_stride = t.strides[1];
    o.dim_stride = t.strides[2];
  } else {
    o.batch_stride = t.strides[0];
    o.seq_stride = t.strides[1];
    o.head_stride = t.strides[2];
    o.dim_stride = t.strides[3];
  }
  return o;
}

// lse [batch, heads, seqlen] (or [heads, total]) as an Operand indexed (b, i, h).
Operand lse_operand(const TensorView& t, bool varlen) {
  Operand o;
  o.data = t.data;
  if (varlen) {
    o.batch_stride = 0;
    o.head_stride = t.strides[0];
    o.seq_stride = t.strides[1];
  } else {
    o.batch_stride = t.strides[0];
    o.head_stride = t.strides[1];
    o.seq_stride = t.strides[2];
  }
  return o;
}

// Reads the offsets once; returns the batch size and the longest sequence.
void check_cu_seqlens(const Checker& c, const char* arg, const TensorView& t, int64_t total,
                      int64_t& batch, int64_t& max_len) {
  c.view(arg, t);
  c.dtype(arg, t, DType::i32);
  if (t.ndim != 1 || t.shape[0] < 1 || (batch >= 0 && t.shape[0] != batch + 1))
    c.fail(arg, batch >= 0 ? "shape [" + std::to_string(batch + 1) + "] (batch + 1, as the other cu_seqlens)"
                           : std::string("shape [batch + 1]"),
           shape_str(t));
  if (t.shape[0] > 1 && t.strides[0] != 1) c.fail(arg, "stride 1", std::to_string(t.strides[0]));
  batch = t.shape[0] - 1;
  const auto* d = static_cast<const int32_t*>(t.data);
  max_len = 0;
  if (d[0] < 0) c.fail(arg, "offsets >= 0", "first offset " + std::to_string(d[0]));
  for (int64_t i = 0; i < batch; ++i) {
    if (d[i + 1] < d[i])
      c.fail(arg, "non-decreasing offsets",
             std::to_string(d[i]) + " then " + std::to_string(d[i + 1]) + " at index " + std::to_string(i));
    max_len = std::max<int64_t>(max_len, d[i + 1] - d[i]);
  }
  if (d[batch] > total)
    c.fail(arg, "offsets within the packed length " + std::to_string(total),
           "last offset " + std::to_string(d[batch]));
}

// lse, dsinks and dbias are f32; with f64 storage they may also be f64, so
// that f64 gradients keep f64 accuracy (P = exp(S - lse) inherits lse's
// rounding, and dbias sums over broadcast heads).
void acc_dtype(const Checker& c, const char* arg, const TensorView& t, DType storage) {
  if (t.dtype == DType::f32 || (storage == DType::f64 && t.dtype == DType::f64)) return;
  c.fail(arg, storage == DType::f64 ? "dtype f32 or f64" : "dtype f32",
         std::string("dtype ") + dtype_name(t.dtype));
}

// out, dq, dk, dv: the storage dtype, or f32 when storage is bf16/f16 (partial
// results to merge, mixed-precision gradients); f64 for the reference.
DType result_dtype(const Checker& c, const char* arg, const TensorView& t, DType storage, bool ref) {
  if (ref) {
    c.dtype(arg, t, DType::f64);
    return DType::f64;
  }
  const bool half = storage == DType::bf16 || storage == DType::f16;
  if (t.dtype != storage && !(half && t.dtype == DType::f32))
    c.fail(arg, std::string("dtype ") + dtype_name(storage) + (half ? " or f32" : ""),
           std::string("dtype ") + dtype_name(t.dtype));
  return t.dtype;
}

// bias / mask / dbias: [batch|1, heads|1, seqlen_q|1, seqlen_k|1], size-1 dims broadcast.
Operand4 broadcast_operand(const Checker& c, const char* arg, const TensorView& t,
                           const std::vector<int64_t>& full) {
  c.view(arg, t);
  bool ok = t.ndim == 4;
  for (int i = 0; ok && i < 4; ++i) ok = t.shape[i] == full[i] || t.shape[i] == 1;
  if (!ok)
    c.fail(arg, "shape broadcastable to " + dims_str(full) + " [batch, heads_q, seqlen_q, seqlen_k]",
           shape_str(t));
  Operand4 o;
  o.data = t.data;
  o.dtype = t.dtype;
  for (int i = 0; i < 4; ++i) o.stride[i] = t.shape[i] == 1 ? 0 : t.strides[i];
  o.batch = o.stride[0] == 0 ? 1 : full[0];
  o.heads = o.stride[1] == 0 ? 1 : full[1];
  return o;
}

}  // namespace

AttnParams make_params(const char* fn, CallKind kind, const Options& opts, const CallTensors& t) {
  const Checker c(fn);
  const bool fwd = kind == CallKind::forward || kind == CallKind::reference_forward;
  const bool bwd = kind == CallKind::backward || kind == CallKind::reference_backward;
  const bool ref = kind == CallKind::reference_forward || kind == CallKind::reference_backward;
  const bool varlen = opts.cu_seqlens_q.has_value() || opts.cu_seqlens_k.has_value();
  if (opts.cu_seqlens_q.has_value() != opts.cu_seqlens_k.has_value())
    c.fail(opts.cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q",
           "cu_seqlens_q and cu_seqlens_k given together", "only one of them");

  const TensorView &q = *t.q, &k = *t.k, &v = *t.v;
  c.view("q", q);
  c.view("k", k);
  c.view("v", v);
  if (!is_float_storage(q.dtype))
    c.fail("q", "dtype f32, f64, bf16 or f16", std::string("dtype ") + dtype_name(q.dtype));
  c.dtype("k", k, q.dtype);
  c.dtype("v", v, q.dtype);
  const int rank = varlen ? 3 : 4;
  const char* qkv_names = varlen ? "[total, heads, head_dim]" : "[batch, seqlen, heads, head_dim]";
  for (auto [name, tv] : {std::pair{"q", &q}, std::pair{"k", &k}, std::pair{"v", &v}})
    if (tv->ndim != rank)
      c.fail(name, std::to_string(rank) + " dimensions " + qkv_names, shape_str(*tv));

  AttnParams p;
  p.dtype = q.dtype;
  p.out_dtype = p.grad_dtype = ref ? DType::f64 : q.dtype;
  const int o = varlen ? 0 : 1;  // index of the seqlen dim
  p.heads_q = q.shape[o + 1];
  p.head_dim = q.shape[o + 2];
  p.heads_kv = k.shape[o + 1];
  p.head_dim_v = v.shape[o + 2];
  if (p.head_dim < 1 || p.head_dim > 512)
    c.fail("q", "head_dim in [1, 512]", std::to_string(p.head_dim) + " in shape " + shape_str(q));
  if (p.head_dim_v < 1 || p.head_dim_v > 512)
    c.fail("v", "head_dim_v in [1, 512]", std::to_string(p.head_dim_v) + " in shape " + shape_str(v));
  if (p.heads_q < 1) c.fail("q", "heads_q >= 1", shape_str(q));
  if (p.heads_kv < 1 || p.heads_q % p.heads_kv != 0)
    c.fail("k", "heads_kv >= 1 dividing heads_q = " + std::to_string(p.heads_q),
           "heads_kv = " + std::to_string(p.heads_kv));

  std::vector<int64_t> qs, ks, vs, os;
  if (varlen) {
    int64_t batch = -1;
    check_cu_seqlens(c, "cu_seqlens_q", *opts.cu_seqlens_q, q.shape[0], batch, p.seqlen_q);
    check_cu_seqlens(c, "cu_seqlens_k", *opts.cu_seqlens_k, k.shape[0], batch, p.seqlen_k);
    p.batch = batch;
    p.cu_seqlens_q = static_cast<const int32_t*>(opts.cu_seqlens_q->data);
    p.cu_seqlens_k = static_cast<const int32_t*>(opts.cu_seqlens_k->data);
    ks = {k.shape[0], p.heads_kv, p.head_dim};
    vs = {k.shape[0], p.heads_kv, p.head_dim_v};
    qs = {q.shape[0], p.heads_q, p.head_dim};
    os = {q.shape[0], p.heads_q, p.head_dim_v};
  } else {
    p.batch = q.shape[0];
    p.seqlen_q = q.shape[1];
    p.seqlen_k = k.shape[1];
    qs = {p.batch, p.seqlen_q, p.heads_q, p.head_dim};
    ks = {p.batch, p.seqlen_k, p.heads_kv, p.head_dim};
    vs = {p.batch, p.seqlen_k, p.heads_kv, p.head_dim_v};
    os = {p.batch, p.seqlen_q, p.heads_q, p.head_dim_v};
  }
  // The backward's O(seqlen) workspace (delta, 8 bytes a row at most) must be addressable.
  int64_t rows = 0;
  if (__builtin_mul_overflow(p.batch, p.heads_q, &rows) || __builtin_mul_overflow(rows, p.seqlen_q, &rows) ||
      __builtin_mul_overflow(rows, int64_t{64}, &rows))
    c.fail("q", "batch * heads_q * seqlen_q small enough for a workspace addressable in int64",
           "shape " + shape_str(q));
  c.shape("k", k, ks, qkv_names);
  c.shape("v", v, vs, qkv_names);
  p.q = operand(q, varlen);
  p.k = operand(k, varlen);
  p.v = operand(v, varlen);

  // Scalar options.
  if (std::isinf(opts.softmax_scale)) c.fail("softmax_scale", "a finite value (NaN or <= 0 for the default)", std::to_string(opts.softmax_scale));
  p.scale = std::isnan(opts.softmax_scale) || opts.softmax_scale <= 0
                ? 1.0 / std::sqrt(static_cast<double>(p.head_dim))
                : opts.softmax_scale;
  if (!(opts.softcap >= 0) || std::isinf(opts.softcap))
    c.fail("softcap", "a finite value >= 0", std::to_string(opts.softcap));
  p.softcap = opts.softcap;
  if (opts.window_left < -1) c.fail("window_left", "a value >= -1", std::to_string(opts.window_left));
  if (opts.window_right < -1) c.fail("window_right", "a value >= -1", std::to_string(opts.window_right));
  p.causal = opts.causal;
  p.window_left = opts.window_left;
  p.window_right = opts.window_right;
  if (!(opts.dropout_p >= 0 && opts.dropout_p < 1))
    c.fail("dropout_p", "a value in [0, 1)", std::to_string(opts.dropout_p));
  p.dropout_p = opts.dropout_p;
  p.seed = opts.seed;
  p.offset = opts.offset;
  if (opts.block) {
    const auto& bl = *opts.block;
    if (varlen) c.fail("block", "no block together with cu_seqlens", "both");
    auto range = [&](int64_t off, int64_t len, int64_t total, const char* what) {
      if (off < 0 || total < 0 || off > total || len > total - off)
        c.fail("block", std::string("0 <= ") + what + "_offset and " + what + "_offset + seqlen_" + what +
                            " <= seqlen_" + what + "_total",
               what + std::string("_offset = ") + std::to_string(off) + ", seqlen_" + what + " = " +
                   std::to_string(len) + ", seqlen_" + what + "_total = " + std::to_string(total));
    };
    range(bl.q_offset, p.seqlen_q, bl.seqlen_q_total, "q");
    range(bl.k_offset, p.seqlen_k, bl.seqlen_k_total, "k");
    p.in_block = true;
    p.block_q_offset = bl.q_offset;
    p.block_k_offset = bl.k_offset;
    p.block_total_q = bl.seqlen_q_total;
    p.block_total_k = bl.seqlen_k_total;
  }
  if (opts.num_threads < 0) c.fail("num_threads", "a value >= 0 (0 = all cores)", std::to_string(opts.num_threads));
  p.num_threads = opts.num_threads;

  const std::vector<int64_t> full = {p.batch, p.heads_q, p.seqlen_q, p.seqlen_k};
  if (opts.alibi_slopes) {
    const auto& a = *opts.alibi_slopes;
    c.view("alibi_slopes", a);
    c.dtype("alibi_slopes", a, DType::f32);
    if (a.ndim == 1 && a.shape[0] == p.heads_q) {
      p.alibi_head_stride = a.strides[0];
    } else if (a.ndim == 2 && a.shape[0] == p.batch && a.shape[1] == p.heads_q) {
      p.alibi_batch_stride = a.strides[0];
      p.alibi_head_stride = a.strides[1];
    } else {
      c.fail("alibi_slopes", "shape [" + std::to_string(p.heads_q) + "] or [" +
             std::to_string(p.batch) + ", " + std::to_string(p.heads_q) + "]", shape_str(a));
    }
    p.alibi = static_cast<const float*>(a.data);
  }
  if (opts.bias) {
    const auto& bt = *opts.bias;
    if (!is_float_storage(bt.dtype))
      c.fail("bias", "dtype f32, f64, bf16 or f16", std::string("dtype ") + dtype_name(bt.dtype));
    p.bias = broadcast_operand(c, "bias", bt, full);
  }
  if (opts.mask) {
    c.dtype("mask", *opts.mask, DType::u8);
    p.mask = broadcast_operand(c, "mask", *opts.mask, full);
  }
  if (opts.sinks) {
    const auto& s = *opts.sinks;
    c.view("sinks", s);
    c.dtype("sinks", s, DType::f32);
    c.shape("sinks", s, {p.heads_q}, "[heads_q]");
    p.sinks = static_cast<const float*>(s.data);
    p.sinks_stride = s.strides[0];
  }
  if (kind == CallKind::workspace) return p;

  // Outputs and backward inputs.
  std::vector<std::pair<const char*, const TensorView*>> inputs = {{"q", &q}, {"k", &k}, {"v", &v}};
  std::vector<std::pair<const char*, const TensorView*>> outputs;
  const std::vector<int64_t> lse_shape =
      varlen ? std::vector<int64_t>{p.heads_q, q.shape[0]} : std::vector<int64_t>{p.batch, p.heads_q, p.seqlen_q};
  const char* lse_names = varlen ? "[heads_q, total_q]" : "[batch, heads_q, seqlen_q]";
  if (fwd) {
    c.view("out", *t.out);
    p.out_dtype = result_dtype(c, "out", *t.out, q.dtype, ref);
    c.shape("out", *t.out, os, qkv_names);
    c.view("lse", *t.lse);
    if (!ref) acc_dtype(c, "lse", *t.lse, q.dtype);
    else c.dtype("lse", *t.lse, DType::f64);
    c.shape("lse", *t.lse, lse_shape, lse_names);
    p.out = operand(*t.out, varlen);
    p.lse = lse_operand(*t.lse, varlen);
    p.lse_dtype = t.lse->dtype;
    outputs = {{"out", t.out}, {"lse", t.lse}};
  }
  if (bwd) {
    if (kind == CallKind::backward) {
      c.view("out", *t.out);
      p.out_dtype = result_dtype(c, "out", *t.out, q.dtype, false);
      c.shape("out", *t.out, os, qkv_names);
      c.view("lse", *t.lse);
      acc_dtype(c, "lse", *t.lse, q.dtype);
      c.shape("lse", *t.lse, lse_shape, lse_names);
      p.out = operand(*t.out, varlen);
      p.lse = lse_operand(*t.lse, varlen);
      p.lse_dtype = t.lse->dtype;
      inputs.push_back({"out", t.out});
      inputs.push_back({"lse", t.lse});
    }
    c.view("dout", *t.dout);
    c.dtype("dout", *t.dout, q.dtype);
    c.shape("dout", *t.dout, os, qkv_names);
    p.dout = operand(*t.dout, varlen);
    inputs.push_back({"dout", t.dout});
    const Grads& g = *t.grads;
    const std::pair<const char*, const TensorView*> gr[] = {{"dq", &g.dq}, {"dk", &g.dk}, {"dv", &g.dv}};
    const std::vector<int64_t>* gs[] = {&qs, &ks, &vs};
    for (int i = 0; i < 3; ++i) {
      c.view(gr[i].first, *gr[i].second);
      if (i == 0) p.grad_dtype = result_dtype(c, "dq", g.dq, q.dtype, ref);
      else c.dtype(gr[i].first, *gr[i].second, p.grad_dtype);
      c.shape(gr[i].first, *gr[i].second, *gs[i], qkv_names);
      outputs.push_back(gr[i]);
    }
    p.dq = operand(g.dq, varlen);
    p.dk = operand(g.dk, varlen);
    p.dv = operand(g.dv, varlen);
    if (g.dsinks) {
      if (!opts.sinks) c.fail("dsinks", "sinks in the options when dsinks is given", "no sinks");
      c.view("dsinks", *g.dsinks);
      if (ref) c.dtype("dsinks", *g.dsinks, DType::f64);
      else acc_dtype(c, "dsinks", *g.dsinks, q.dtype);
      c.shape("dsinks", *g.dsinks, {p.heads_q}, "[heads_q]");
      p.dsinks = g.dsinks->data;
      p.dsinks_dtype = g.dsinks->dtype;
      p.dsinks_stride = g.dsinks->strides[0];
      outputs.push_back({"dsinks", &*g.dsinks});
    }
    if (g.dbias) {
      if (!opts.bias) c.fail("dbias", "bias in the options when dbias is given", "no bias");
      const TensorView& db = *g.dbias;
      c.view("dbias", db);
      if (ref) c.dtype("dbias", db, DType::f64);
      else acc_dtype(c, "dbias", db, q.dtype);
      c.shape("dbias", db, std::vector<int64_t>(opts.bias->shape, opts.bias->shape + 4),
              "(the shape of bias)");
      if (db.shape[2] != p.seqlen_q || db.shape[3] != p.seqlen_k)
        c.fail("dbias", "a bias not broadcast over seqlen_q or seqlen_k when dbias is requested",
               shape_str(db));
      p.dbias = broadcast_operand(c, "dbias", db, full);
      outputs.push_back({"dbias", &db});
    }
  }
  for (auto& [name, tv] : outputs) c.no_self_overlap(name, *tv);
  for (size_t i = 0; i < outputs.size(); ++i) {
    for (auto& [in_name, in] : inputs) c.disjoint(outputs[i].first, *outputs[i].second, in_name, *in);
    for (auto [an, at] : {std::pair{"bias", &opts.bias}, std::pair{"mask", &opts.mask},
                          std::pair{"sinks", &opts.sinks}, std::pair{"alibi_slopes", &opts.alibi_slopes},
                          std::pair{"cu_seqlens_q", &opts.cu_seqlens_q},
                          std::pair{"cu_seqlens_k", &opts.cu_seqlens_k}})
      if (*at) c.disjoint(outputs[i].first, *outputs[i].second, an, **at);
    for (size_t j = 0; j < i; ++j)
      c.disjoint(outputs[i].first, *outputs[i].second, outputs[j].first, *outputs[j].second);
  }
  return p;
}

MergeParams make_merge_params(const char* fn, const TensorView& o_acc, const TensorView& lse_acc,
                              const TensorView& o_part, const TensorView& lse_part, int num_threads) {
  const Checker c(fn);
  const std::pair<const char*, const TensorView*> all[] = {
      {"o_acc", &o_acc}, {"lse_acc", &lse_acc}, {"o_part", &o_part}, {"lse_part", &lse_part}};
  c.view("o_acc", o_acc);
  if (o_acc.dtype != DType::f32 && o_acc.dtype != DType::f64)
    c.fail("o_acc", "dtype f32 or f64", std::string("dtype ") + dtype_name(o_acc.dtype));
  for (auto& [name, t] : all) {
    c.view(name, *t);
    c.dtype(name, *t, o_acc.dtype);
  }
  if (o_acc.ndim != 4) c.fail("o_acc", "4 dimensions [batch, seqlen, heads, dv]", shape_str(o_acc));
  MergeParams m;
  m.dtype = o_acc.dtype;
  m.batch = o_acc.shape[0];
  m.seqlen = o_acc.shape[1];
  m.heads = o_acc.shape[2];
  m.dv = o_acc.shape[3];
  c.shape("o_part", o_part, {m.batch, m.seqlen, m.heads, m.dv}, "[batch, seqlen, heads, dv] (as o_acc)");
  c.shape("lse_acc", lse_acc, {m.batch, m.heads, m.seqlen}, "[batch, heads, seqlen]");
  c.shape("lse_part", lse_part, {m.batch, m.heads, m.seqlen}, "[batch, heads, seqlen]");
  if (num_threads < 0) c.fail("num_threads", "a value >= 0 (0 = all cores)", std::to_string(num_threads));
  c.no_self_overlap("o_acc", o_acc);
  c.no_self_overlap("lse_acc", lse_acc);
  c.disjoint("o_acc", o_acc, "lse_acc", lse_acc);
  for (auto& [an, at] : {std::pair{"o_acc", &o_acc}, std::pair{"lse_acc", &lse_acc}})
    for (auto& [bn, bt] : {std::pair{"o_part", &o_part}, std::pair{"lse_part", &lse_part}})
      c.disjoint(an, *at, bn, *bt);
  m.o_acc = operand(o_acc, false);
  m.o_part = operand(o_part, false);
  m.lse_acc = lse_operand(lse_acc, false);
  m.lse_part = lse_operand(lse_part, false);
  m.num_threads = num_threads;
  return m;
}

}  // namespace flashgrad
