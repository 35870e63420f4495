#include "harness.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iomanip>
#include <limits>
#include <random>
#include <sstream>

#include "cpu/exp_poly.hpp"
#include "dispatch.hpp"
#include "reference.hpp"

namespace flashgrad::testing {
namespace conv {
#define FG_PORTABLE_HALF 1
#define FG_DASSERT(x) assert(x)
#include "cpu/vec.inl"
}  // namespace conv

std::vector<float> uniform_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = u(rng);
  return x;
}

namespace {

double round_to(DType t, double x) {
  switch (t) {
    case DType::f32: return static_cast<float>(x);
    case DType::bf16: return conv::to_float(conv::bf16_from(static_cast<float>(x)));
    case DType::f16: return conv::to_float(conv::f16_from(static_cast<float>(x)));
    default: return x;
  }
}

// The rounding noise: the larger of flash-attn's 2 * max |((x + 0.3) - 0.3) - x|
// (x the reference in the storage dtype) and one ulp of the largest |x|, the
// least error of any result stored in that dtype.
double rounding_noise(DType t, const std::vector<double>& ref) {
  double noise = 0, top = 0;
  for (double r : ref) {
    if (!std::isfinite(r)) continue;
    const double x = round_to(t, r);
    noise = std::max(noise, std::fabs(round_to(t, round_to(t, x + 0.3) - 0.3) - x));
    top = std::max(top, std::fabs(x));
  }
  const int mant = t == DType::f64 ? 52 : t == DType::f32 ? 23 : t == DType::bf16 ? 7 : 10;
  const double ulp = top > 0 ? std::ldexp(1.0, std::ilogb(top) - mant) : 0.0;
  return std::max(2 * noise, ulp);
}

// Calls f(offset) for each logical index of v in row-major logical order.
void for_each(const TensorView& v, const std::function<void(int64_t)>& f) {
  int64_t shape[4] = {1, 1, 1, 1}, st[4] = {0, 0, 0, 0};
  const int off = 4 - v.ndim;
  for (int i = 0; i < v.ndim; ++i) {
    shape[off + i] = v.shape[i];
    st[off + i] = v.strides[i];
  }
  for (int64_t a = 0; a < shape[0]; ++a)
    for (int64_t b = 0; b < shape[1]; ++b)
      for (int64_t c = 0; c < shape[2]; ++c)
        for (int64_t d = 0; d < shape[3]; ++d) f(a * st[0] + b * st[1] + c * st[2] + d * st[3]);
}

void put(const TensorView& v, int64_t off, double x) {
  switch (v.dtype) {
    case DType::f32: static_cast<float*>(v.data)[off] = static_cast<float>(x); break;
    case DType::f64: static_cast<double*>(v.data)[off] = x; break;
    case DType::bf16: static_cast<conv::bf16_t*>(v.data)[off] = conv::bf16_from(static_cast<float>(x)); break;
    case DType::f16: static_cast<conv::f16_t*>(v.data)[off] = conv::f16_from(static_cast<float>(x)); break;
    case DType::u8: static_cast<uint8_t*>(v.data)[off] = static_cast<uint8_t>(x); break;
    case DType::i32: static_cast<int32_t*>(v.data)[off] = static_cast<int32_t>(x); break;
  }
}

double get(const TensorView& v, int64_t off) {
  switch (v.dtype) {
    case DType::f32: return static_cast<const float*>(v.data)[off];
    case DType::f64: return static_cast<const double*>(v.data)[off];
    case DType::bf16: return conv::to_float(static_cast<const conv::bf16_t*>(v.data)[off]);
    case DType::f16: return conv::to_float(static_cast<const conv::f16_t*>(v.data)[off]);
    case DType::u8: return static_cast<const uint8_t*>(v.data)[off];
    case DType::i32: return static_cast<const int32_t*>(v.data)[off];
  }
  return 0;
}


// [batch, seq, heads, dim] (or [total, heads, dim]) in the case's memory layout.
Buffer attention_tensor(DType t, const std::vector<int64_t>& dims, Layout layout) {
  const bool varlen = dims.size() == 3;
  const int64_t B = varlen ? 1 : dims[0], L = dims[varlen ? 0 : 1], H = dims[varlen ? 1 : 2],
                D = dims[varlen ? 2 : 3];
  int64_t sb, ss, sh, sd, total;
  switch (layout) {
    case Layout::bhsd:
      sd = 1; ss = D; sh = L * D; sb = H * L * D; total = B * sb;
      break;
    case Layout::padded:
      sd = 2; sh = 2 * D + 3; ss = H * sh + 5; sb = L * ss + 7; total = B * sb;
      break;
    default:
      sd = 1; sh = D; ss = H * D; sb = L * ss; total = B * sb;
  }
  Buffer b;
  b.bytes.assign(static_cast<size_t>(std::max<int64_t>(total, 1) * dtype_size(t)), 0);
  b.view.data = b.bytes.data();
  b.view.dtype = t;
  b.view.ndim = static_cast<int>(dims.size());
  const int64_t st4[4] = {sb, ss, sh, sd};
  for (int i = 0; i < b.view.ndim; ++i) {
    b.view.shape[i] = dims[static_cast<size_t>(i)];
    b.view.strides[i] = st4[i + (varlen ? 1 : 0)];
  }
  return b;
}

void fill_normal(Buffer& b, std::mt19937_64& rng, double scale) {
  std::normal_distribution<double> n(0.0, 1.0);
  for_each(b.view, [&](int64_t off) { put(b.view, off, scale * n(rng)); });
}

const char* layout_name(Layout l) {
  return l == Layout::bhsd ? "bhsd" : (l == Layout::padded ? "padded" : "bshd");
}

}  // namespace

namespace {

// Pairs the rows see through causal and the window (masks aside).
double visible_pairs(const Case& c, int64_t lq, int64_t lk) {
  if (c.window_left < 0 && c.window_right < 0)
    return static_cast<double>(lq) * static_cast<double>(lk) * (c.causal ? 0.5 : 1.0);
  double visible = 0;
  for (int64_t i = 0; i < lq; ++i) {
    const int64_t pos = i + lk - lq;
    int64_t lo = c.window_left < 0 ? 0 : pos - c.window_left;
    int64_t hi = c.window_right < 0 ? lk - 1 : pos + c.window_right;
    if (c.causal) hi = std::min(hi, pos);
    lo = std::max<int64_t>(lo, 0);
    hi = std::min<int64_t>(hi, lk - 1);
    visible += static_cast<double>(std::max<int64_t>(0, hi - lo + 1));
  }
  return visible;
}

}  // namespace

double Case::forward_flops() const {
  double pairs = 0;
  if (varlen()) {
    for (size_t b = 0; b < seqlens_q.size(); ++b) pairs += visible_pairs(*this, seqlens_q[b], seqlens_k[b]);
  } else {
    pairs = static_cast<double>(batch) * visible_pairs(*this, seqlen_q, seqlen_k);
  }
  return 2.0 * pairs * static_cast<double>(heads_q) * static_cast<double>(head_dim + head_dim_v);
}

std::string Case::describe() const {
  std::ostringstream s;
  s << dtype_name(dtype) << " B" << batch << " Lq" << seqlen_q << " Lk" << seqlen_k << " H" << heads_q
    << "/" << heads_kv << " d" << head_dim << "/" << head_dim_v << " " << layout_name(layout);
  if (causal) s << " causal";
  if (window_left >= 0 || window_right >= 0) s << " win(" << window_left << "," << window_right << ")";
  if (softcap > 0) s << " softcap" << softcap;
  if (softmax_scale != 0.0) s << " scale" << softmax_scale;
  if (input_scale != 1.0) s << " inputs x" << input_scale;
  if (alibi) s << " alibi";
  if (alibi && alibi_scale != 1.0) s << "x" << alibi_scale;
  if (bias != BiasKind::none) s << " bias" << static_cast<int>(bias) << (dbias ? "+dbias" : "");
  if (bias != BiasKind::none && bias_scale != 1.0) s << "x" << bias_scale;
  if (mask != MaskKind::none) s << " mask" << static_cast<int>(mask);
  if (sinks) s << " sinks";
  if (varlen()) {  // B, Lq and Lk above are then the draw's, not the sequences'
    s << " varlen q";
    for (size_t b = 0; b < seqlens_q.size(); ++b) s << (b ? "," : "[") << seqlens_q[b];
    s << "] k";
    for (size_t b = 0; b < seqlens_k.size(); ++b) s << (b ? "," : "[") << seqlens_k[b];
    s << "]";
  }
  if (dropout_p > 0) s << " dropout" << dropout_p;
  if (num_threads) s << " t" << num_threads;
  return s.str();
}

Problem make_problem(const Case& c0) {
  Problem p;
  p.c = c0;
  Case& c = p.c;
  std::mt19937_64 rng(c.seed);
  std::vector<int64_t> qd, kd, vd, od;
  if (c.varlen()) {
    c.batch = static_cast<int64_t>(c.seqlens_q.size());
    int64_t tq = 0, tk = 0, mq = 0, mk = 0;
    p.cu_q = contiguous(DType::i32, {c.batch + 1});
    p.cu_k = contiguous(DType::i32, {c.batch + 1});
    for (int64_t b = 0; b <= c.batch; ++b) {
      put(p.cu_q.view, b, static_cast<double>(tq));
      put(p.cu_k.view, b, static_cast<double>(tk));
      if (b == c.batch) break;
      tq += c.seqlens_q[b];
      tk += c.seqlens_k[b];
      mq = std::max<int64_t>(mq, c.seqlens_q[b]);
      mk = std::max<int64_t>(mk, c.seqlens_k[b]);
    }
    c.seqlen_q = mq;
    c.seqlen_k = mk;
    qd = {tq, c.heads_q, c.head_dim};
    kd = {tk, c.heads_kv, c.head_dim};
    vd = {tk, c.heads_kv, c.head_dim_v};
    od = {tq, c.heads_q, c.head_dim_v};
    p.opts.cu_seqlens_q = p.cu_q.view;
    p.opts.cu_seqlens_k = p.cu_k.view;
  } else {
    qd = {c.batch, c.seqlen_q, c.heads_q, c.head_dim};
    kd = {c.batch, c.seqlen_k, c.heads_kv, c.head_dim};
    vd = {c.batch, c.seqlen_k, c.heads_kv, c.head_dim_v};
    od = {c.batch, c.seqlen_q, c.heads_q, c.head_dim_v};
  }
  p.q = attention_tensor(c.dtype, qd, c.layout);
  p.k = attention_tensor(c.dtype, kd, c.layout);
  p.v = attention_tensor(c.dtype, vd, c.layout);
  p.dout = attention_tensor(c.dtype, od, c.layout);
  fill_normal(p.q, rng, c.input_scale);
  fill_normal(p.k, rng, c.input_scale);
  fill_normal(p.v, rng, 1.0);
  fill_normal(p.dout, rng, 1.0);

  const int64_t B = c.batch, H = c.heads_q, Lq = c.seqlen_q, Lk = c.seqlen_k;
  if (c.bias != BiasKind::none) {
    std::vector<int64_t> dims = {B, H, Lq, Lk};
    if (c.bias == BiasKind::bcast_batch) dims[0] = 1;
    if (c.bias == BiasKind::bcast_heads) dims[1] = 1;
    if (c.bias == BiasKind::key_row) dims = {B, 1, 1, Lk};
    p.bias = contiguous(c.bias_dtype, dims);
    fill_normal(p.bias, rng, c.bias_scale);
    p.opts.bias = p.bias.view;
  }
  if (c.mask != MaskKind::none) {
    std::vector<int64_t> dims = {B, H, Lq, Lk};
    if (c.mask == MaskKind::bcast_batch) dims = {1, H, Lq, Lk};
    if (c.mask == MaskKind::key_padding) dims = {B, 1, 1, Lk};
    p.mask = contiguous(DType::u8, dims);
    std::bernoulli_distribution keep(0.7);
    for_each(p.mask.view, [&](int64_t off) { put(p.mask.view, off, keep(rng) ? 1 : 0); });
    p.opts.mask = p.mask.view;
  }
  if (c.alibi) {
    p.alibi = contiguous(DType::f32, {H});
    for (int64_t h = 0; h < H; ++h) put(p.alibi.view, h, c.alibi_scale * std::ldexp(1.0, -static_cast<int>(h % 8) - 1));
    p.opts.alibi_slopes = p.alibi.view;
  }
  if (c.sinks) {
    p.sinks = contiguous(DType::f32, {H});
    fill_normal(p.sinks, rng, 1.0);
    p.opts.sinks = p.sinks.view;
  }
  p.opts.causal = c.causal;
  p.opts.window_left = c.window_left;
  p.opts.window_right = c.window_right;
  p.opts.softcap = c.softcap;
  p.opts.softmax_scale = c.softmax_scale;
  p.opts.dropout_p = c.dropout_p;
  p.opts.seed = c.seed;
  p.opts.offset = 7;
  p.opts.num_threads = c.num_threads;
  return p;
}

Outputs make_outputs(const Problem& p, bool f64) {
  const Case& c = p.c;
  const DType t = f64 ? DType::f64 : c.dtype;
  const DType small = f64 ? DType::f64 : DType::f32;
  Outputs o;
  const TensorView &q = p.q.view, &k = p.k.view, &v = p.v.view;
  auto dims = [](const TensorView& x) { return std::vector<int64_t>(x.shape, x.shape + x.ndim); };
  std::vector<int64_t> od = dims(p.dout.view);
  o.out = attention_tensor(t, od, c.layout);
  o.dq = attention_tensor(t, dims(q), c.layout);
  o.dk = attention_tensor(t, dims(k), c.layout);
  o.dv = attention_tensor(t, dims(v), c.layout);
  // f64 storage keeps lse, dsinks and dbias in f64 too (the API allows it).
  const DType lse_t = c.dtype == DType::f64 ? DType::f64 : small;
  o.lse = c.varlen() ? contiguous(lse_t, {c.heads_q, q.shape[0]})
                     : contiguous(lse_t, {c.batch, c.heads_q, c.seqlen_q});
  if (c.sinks) o.dsinks = contiguous(lse_t, {c.heads_q});
  if (c.dbias && p.bias.present()) o.dbias = contiguous(lse_t, dims(p.bias.view));
  // Poison outputs so that an element a kernel forgets to write cannot pass.
  for (Buffer* b : {&o.out, &o.dq, &o.dk, &o.dv, &o.lse, &o.dsinks, &o.dbias})
    if (b->present()) for_each(b->view, [&](int64_t off) { put(b->view, off, std::nan("")); });
  return o;
}

Grads grads_of(Outputs& o) {
  Grads g{o.dq.view, o.dk.view, o.dv.view, std::nullopt, std::nullopt};
  if (o.dsinks.present()) g.dsinks = o.dsinks.view;
  if (o.dbias.present()) g.dbias = o.dbias.view;
  return g;
}

void run_kernels(const Problem& p, Outputs& o, bool backward) {
  forward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view);
  if (backward)
    flashgrad::backward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view, p.dout.view,
                        grads_of(o));
}

void run_reference(const Problem& p, Outputs& o, reference::Precision prec, bool backward) {
  if (!backward) return reference::forward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view, prec);
  const reference::ForwardOutputs also{o.out.view, o.lse.view};
  reference::backward(p.opts, p.q.view, p.k.view, p.v.view, p.dout.view, grads_of(o), prec, nullptr, &also);
}

std::vector<double> dense(const Buffer& b) {
  std::vector<double> out;
  if (!b.present()) return out;
  out.reserve(static_cast<size_t>(b.view.numel()));
  for_each(b.view, [&](int64_t off) { out.push_back(get(b.view, off)); });
  return out;
}

DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::f32: return {kDLFloat, 32, 1};
    case DType::f64: return {kDLFloat, 64, 1};
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::f16: return {kDLFloat, 16, 1};
    case DType::u8: return {kDLUInt, 8, 1};
    case DType::i32: return {kDLInt, 32, 1};
  }
  return {kDLFloat, 32, 1};
}

DLTensor dl_view(const TensorView& v) {
  DLTensor t{};
  t.data = v.data;
  t.device = {kDLCPU, 0};
  t.ndim = v.ndim;
  t.dtype = dl_dtype(v.dtype);
  t.shape = const_cast<int64_t*>(v.shape);
  t.strides = const_cast<int64_t*>(v.strides);
  return t;
}

Buffer contiguous(DType t, const std::vector<int64_t>& dims) {
  Buffer b;
  int64_t n = 1;
  for (auto d : dims) n *= d;
  b.bytes.assign(static_cast<size_t>(std::max<int64_t>(n, 1) * dtype_size(t)), 0);
  b.view.data = b.bytes.data();
  b.view.dtype = t;
  b.view.ndim = static_cast<int>(dims.size());
  int64_t st = 1;
  for (int i = b.view.ndim - 1; i >= 0; --i) {
    b.view.shape[i] = dims[static_cast<size_t>(i)];
    b.view.strides[i] = st;
    st *= dims[static_cast<size_t>(i)];
  }
  return b;
}

std::vector<int64_t> offsets(const TensorView& v) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(v.numel()));
  for_each(v, [&](int64_t off) { out.push_back(off); });
  return out;
}

double read(const TensorView& v, int64_t offset) { return get(v, offset); }
void write(const TensorView& v, int64_t offset, double x) { put(v, offset, x); }

TensorView slice(const TensorView& v, int dim, int64_t start, int64_t len) {
  TensorView s = v;
  s.data = static_cast<char*>(v.data) + start * v.strides[dim] * dtype_size(v.dtype);
  s.shape[dim] = len;
  return s;
}

void copy_values(const TensorView& src, const TensorView& dst) {
  const auto so = offsets(src), d = offsets(dst);
  for (size_t i = 0; i < so.size(); ++i) put(dst, d[i], get(src, so[i]));
}

void add_values(const TensorView& src, const TensorView& dst) {
  const auto so = offsets(src), d = offsets(dst);
  for (size_t i = 0; i < so.size(); ++i) put(dst, d[i], get(dst, d[i]) + get(src, so[i]));
}

namespace {

double max_err(const std::vector<double>& x, const std::vector<double>& ref) {
  double e = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i]) || std::isinf(x[i])) {
      if (x[i] != ref[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    const double d = std::fabs(x[i] - ref[i]);
    if (!(d <= e)) e = d;  // NaN propagates as the error
  }
  return e;
}

}  // namespace

bool Report::pass() const {
  for (const auto& t : tensors)
    if (!t.pass) return false;
  return true;
}

std::string Report::table() const {
  std::ostringstream s;
  s << std::scientific << std::setprecision(2);
  for (const auto& t : tensors)
    s << "  " << std::setw(6) << t.name << "  kernel " << t.err_kernel << "  naive " << t.err_naive
      << "  noise " << t.noise << "  max|ref| " << t.max_ref << "  bound " << t.bound()
      << (t.pass ? "  ok" : "  FAIL") << "\n";
  if (!complete) s << "  (bounds from the references' first stages: Bound::verdict)\n";
  return s.str();
}

Report check_case(const Case& c, bool backward, Bound bound) {
  return check_case_on(c, {kernels().isa}, backward, bound).front();
}

namespace {

// What a kernel's outputs are judged by: the oracle, the naive computations
// (three summation orders and the softmax's form) and the first-order noise
// (reference::Precision), filled in stages (Bound). Until a stage has run,
// judge reads the naive order in place of the others and zero noise.
struct References {
  Outputs ref, nai, rev, fused, soft, noise;
  bool fused_differs = false;
  int stages = 0;
};

constexpr int kStages = 3;

// Stage 1: the oracle and the naive order. Stage 2: the first-order noise.
// Stage 3: the reversed and fused orders and the softmax's form. Each widens
// the bound or leaves it.
void run_stage(const Problem& p, References& r, bool backward) {
  using reference::Precision;
  switch (++r.stages) {
    case 1:
      r.ref = make_outputs(p, true);
      r.nai = make_outputs(p, true);
      run_reference(p, r.ref, Precision::f64, backward);
      run_reference(p, r.nai, Precision::storage, backward);
      break;
    case 2:
      r.noise = make_outputs(p, true);
      reference::forward(p.opts, p.q.view, p.k.view, p.v.view, r.noise.out.view, r.noise.lse.view,
                         Precision::noise);
      if (backward)
        reference::backward(p.opts, p.q.view, p.k.view, p.v.view, p.dout.view, grads_of(r.noise),
                            Precision::noise);
      break;
    case 3:
      r.rev = make_outputs(p, true);
      run_reference(p, r.rev, Precision::storage_reversed, backward);
      // bf16 and f16 products are exact in f32, so FMA chains sum them as
      // the naive chain does: the third order only differs in f32 and f64.
      r.fused_differs = p.c.dtype == DType::f32 || p.c.dtype == DType::f64;
      if (r.fused_differs) {
        r.fused = make_outputs(p, true);
        run_reference(p, r.fused, Precision::storage_fused, backward);
      }
      r.soft = make_outputs(p, true);
      run_reference(p, r.soft, Precision::storage_softmax, backward);
      break;
  }
}

Report judge(const Problem& p, const Outputs& ker, const References& refs, bool backward) {
  const Case& c = p.c;
  const Outputs &ref = refs.ref, &nai = refs.nai;
  const Outputs& rev = refs.stages >= 3 ? refs.rev : nai;
  const Outputs& fus = refs.fused_differs ? refs.fused : nai;
  const Outputs& soft = refs.stages >= 3 ? refs.soft : nai;
  const Outputs none;
  const Outputs& noise = refs.stages >= 2 ? refs.noise : none;
  Report r;
  r.complete = refs.stages == kStages;
  auto add = [&](const char* name, const Buffer& k, const Buffer& e, const Buffer& n, const Buffer& nr,
                 const Buffer& nf, const Buffer& ns, DType storage, const Buffer& first_order) {
    if (!k.present()) return;
    TensorError t;
    t.name = name;
    const auto kd = dense(k), ed = dense(e);
    for (double x : ed)
      if (std::isfinite(x)) t.max_ref = std::max(t.max_ref, std::fabs(x));
    t.err_kernel = max_err(kd, ed);
    t.err_naive = std::max(
        {max_err(dense(n), ed), max_err(dense(nr), ed), max_err(dense(nf), ed), max_err(dense(ns), ed)});
    double bound = 0;
    for (double x : dense(first_order)) bound = std::max(bound, x);
    t.noise = rounding_noise(storage, ed) + bound;
    t.pass = t.err_kernel <= t.bound();
    r.tensors.push_back(t);
  };
  const DType acc_t = c.dtype == DType::f64 ? DType::f64 : DType::f32;
  add("out", ker.out, ref.out, nai.out, rev.out, fus.out, soft.out, c.dtype, noise.out);
  add("lse", ker.lse, ref.lse, nai.lse, rev.lse, fus.lse, soft.lse, acc_t, noise.lse);
  if (backward) {
    add("dq", ker.dq, ref.dq, nai.dq, rev.dq, fus.dq, soft.dq, c.dtype, noise.dq);
    add("dk", ker.dk, ref.dk, nai.dk, rev.dk, fus.dk, soft.dk, c.dtype, noise.dk);
    add("dv", ker.dv, ref.dv, nai.dv, rev.dv, fus.dv, soft.dv, c.dtype, noise.dv);
    add("dsinks", ker.dsinks, ref.dsinks, nai.dsinks, rev.dsinks, fus.dsinks, soft.dsinks, acc_t, noise.dsinks);
    add("dbias", ker.dbias, ref.dbias, nai.dbias, rev.dbias, fus.dbias, soft.dbias, acc_t, noise.dbias);
  }
  return r;
}

// Judges each kernel's outputs, running stages until every report passes
// (verdict) or all have run (full).
std::vector<Report> judge_all(const Problem& p, const std::vector<const Outputs*>& kers, bool backward,
                              Bound bound) {
  References refs;
  std::vector<Report> reports;
  for (;;) {
    run_stage(p, refs, backward);
    if (bound == Bound::full && refs.stages < kStages) continue;
    reports.clear();
    bool all_pass = true;
    for (const Outputs* k : kers) {
      reports.push_back(judge(p, *k, refs, backward));
      all_pass = all_pass && reports.back().pass();
    }
    if (all_pass || refs.stages == kStages) return reports;
  }
}

}  // namespace

Report compare_with_reference(const Problem& p, const Outputs& ker, bool backward, Bound bound) {
  return judge_all(p, {&ker}, backward, bound).front();
}

std::vector<Report> check_case_on(const Case& c, const std::vector<Isa>& isas, bool backward, Bound bound) {
  const Problem p = make_problem(c);
  std::vector<Outputs> kers;
  for (Isa isa : isas) {
    const ScopedIsa on(isa);
    kers.push_back(make_outputs(p, false));
    run_kernels(p, kers.back(), backward);
  }
  std::vector<const Outputs*> ptrs;
  for (const Outputs& k : kers) ptrs.push_back(&k);
  return judge_all(p, ptrs, backward, bound);
}

const char* forced_isa_missing() {
  const char* env = std::getenv("FLASHGRAD_ISA");
  if (!env) return nullptr;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx})
    if (std::strcmp(env, isa_to_string(isa)) == 0 && !cpu_supports(isa)) return env;
  return nullptr;
}

std::vector<Isa> isas_under_test() {
  const char* env = std::getenv("FLASHGRAD_ISA");
  if (env && *env) return {kernels().isa};
  return supported_isas();
}

}  // namespace flashgrad::testing
