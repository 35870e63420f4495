// The reference's arithmetic, for one oracle type Real: reference.cpp
// includes this once per Real. Entry points forward and backward take
// validated params and the dropout keep mask (null without dropout).

namespace {

using Matrix = std::vector<Real>;  // row-major

Real read(const void* base, DType t, int64_t off) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[off];
    case DType::f64: return static_cast<const double*>(base)[off];
    case DType::bf16: return detail::to_float(static_cast<const detail::bf16_t*>(base)[off]);
    case DType::f16: return detail::to_float(static_cast<const detail::f16_t*>(base)[off]);
    case DType::u8: return static_cast<const uint8_t*>(base)[off];
    case DType::i32: return static_cast<const int32_t*>(base)[off];
  }
  return 0;
}

// Rounds to the storage dtype (naive mode) or not at all (f64 mode), and
// computes in f32 for the 16- and 32-bit storage dtypes in naive mode. Naive
// mode rounds every operation, products included (no fused multiply-add), as
// the plainest same-precision computation does.
struct Arith {
  DType storage;
  bool naive;
  bool reversed;  // sums run last-to-first: a second, equally valid naive order
  bool fused;     // products' sums as FMA chains: a third
  bool softmax;   // P = exp(S - m) / sum instead of exp(S - lse): a fourth
  int64_t at(int64_t n, int64_t count) const { return reversed ? count - 1 - n : n; }
  Real round(Real x) const {
    if (!naive) return x;
    switch (storage) {
      case DType::f64: return static_cast<double>(x);
      case DType::f32: return static_cast<float>(x);
      case DType::bf16: return detail::to_float(detail::bf16_from(static_cast<float>(x)));
      case DType::f16: return detail::to_float(detail::f16_from(static_cast<float>(x)));
      default: return x;
    }
  }
  Real acc(Real x) const {
    if (!naive) return x;
    return storage == DType::f64 ? static_cast<Real>(static_cast<double>(x)) : static_cast<float>(x);
  }
  // s + a b of a matrix product's sum: the product rounded, then the sum,
  // or both at once when fused (a, b and s hold values of the accumulation type).
  Real mac(Real s, Real a, Real b) const {
    if (!naive || !fused) return acc(s + acc(a * b));
    if (storage == DType::f64)
      return static_cast<Real>(std::fma(static_cast<double>(a), static_cast<double>(b), static_cast<double>(s)));
    return static_cast<Real>(std::fma(static_cast<float>(a), static_cast<float>(b), static_cast<float>(s)));
  }
  // sum of a(n) b(n) over n < count by mac, in this Arith's order.
  template <typename A, typename B>
  Real dot(int64_t count, A a, B b) const {
    if (naive && storage != DType::f64) return dot_f32(count, a, b);
    Real s = 0;
    for (int64_t n_ = 0; n_ < count; ++n_) {
      const int64_t n = at(n_, count);
      s = mac(s, a(n), b(n));
    }
    return s;
  }
  // The same sum where the accumulation type is f32, in f32 arithmetic: its
  // operands are f32 values, so mac's products are exact in Real and its sums
  // round as f32's (Real has 53 >= 2 * 24 + 2 bits or more), and this is mac
  // to the bit without two conversions per term (tuning table: reference
  // dot_f32).
  template <typename A, typename B>
  Real dot_f32(int64_t count, A a, B b) const {
    float s = 0;
    for (int64_t n_ = 0; n_ < count; ++n_) {
      const int64_t n = at(n_, count);
      const float x = static_cast<float>(a(n)), y = static_cast<float>(b(n));
      assert(x == a(n) && y == b(n));
      if (fused) {
        s = std::fma(x, y, s);
      } else {
        const float xy = x * y;
        s = s + xy;
      }
    }
    return s;
  }
};

// [n, dim] matrix of head h of sequence b.
Matrix gather(const AttnParams& p, const Operand& o, DType t, int64_t b, int64_t start, int64_t n,
              int64_t h, int64_t dim) {
  Matrix m(static_cast<size_t>(n * dim));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < dim; ++c)
      m[r * dim + c] = read(o.data, t, row_offset(o, b, start + r, h) + c * o.dim_stride);
  (void)p;
  return m;
}

void scatter(const Operand& o, int64_t b, int64_t start, int64_t n, int64_t h, int64_t dim,
             const Matrix& m) {
  auto* base = static_cast<double*>(o.data);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < dim; ++c)
      base[row_offset(o, b, start + r, h) + c * o.dim_stride] = static_cast<double>(m[r * dim + c]);
}

// C[n, m] = A[n, k] B[m, k]^T, each dot accumulated then rounded.
Matrix abt(const Arith& ar, const Matrix& a, const Matrix& b, int64_t n, int64_t m, int64_t k,
           Real scale) {
  Matrix c(static_cast<size_t>(n * m));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      const Real s = ar.dot(k, [&](int64_t x) { return a[i * k + x]; }, [&](int64_t x) { return b[j * k + x]; });
      c[i * m + j] = ar.round(ar.acc(s * scale));
    }
  return c;
}

// Everything forward produces for one (b, h), kept for backward.
struct HeadForward {
  int64_t lq, lk;
  Matrix s;      // logits after softcap/alibi/bias/masks [lq, lk]
  Matrix t;      // tanh(raw / softcap) [lq, lk] when softcap
  Matrix p;      // softmax probabilities [lq, lk]
  Matrix z;      // dropout multiplier keep / (1 - p) [lq, lk]
  Matrix out;    // [lq, dv]
  std::vector<Real> lse;
  Matrix mag2;   // with_mag: sum of the squared magnitudes the logit's roundings scale with [lq, lk]
};

bool visible(const AttnParams& p, int64_t b, int64_t h, int64_t i, int64_t j, int64_t ip) {
  if (p.causal && j > ip) return false;
  if (p.window_left >= 0 && ip - j > p.window_left) return false;
  if (p.window_right >= 0 && j - ip > p.window_right) return false;
  if (!p.mask.data) return true;
  const auto& o = p.mask;
  return static_cast<const uint8_t*>(o.data)[b * o.stride[0] + h * o.stride[1] + i * o.stride[2] + j * o.stride[3]] != 0;
}

// softcap, ALiBi and bias applied to s = scale q.k, each operation rounded as
// a framework would; *t receives tanh(s / softcap). mag2, when given, adds
// the square of the magnitude each rounding scales with, as it reaches the
// logit: s / cap through the factor cap (1 - t^2), tanh and cap t (|cap t|
// each), the ALiBi term and the difference, the sum with the bias.
Real logit(const AttnParams& p, const Arith& ar, int64_t b, int64_t h, int64_t i, int64_t j, int64_t ip, Real s,
           Real* t, Real* mag2 = nullptr) {
  Real m2 = 0;
  if (p.softcap > 0) {
    *t = ar.acc(std::tanh(ar.acc(s / p.softcap)));
    const Real through = s * (1 - *t * *t);
    s = ar.acc(p.softcap * *t);
    m2 += through * through + 2 * s * s;
  }
  if (p.alibi) {
    const Real slope = p.alibi[b * p.alibi_batch_stride + h * p.alibi_head_stride];
    const Real a = ar.acc(slope * std::fabs(Real(ip - j)));
    s = ar.acc(s - a);
    m2 += a * a + s * s;
  }
  if (p.bias.data) {
    const auto& o = p.bias;
    s = ar.acc(s + read(o.data, o.dtype, b * o.stride[0] + h * o.stride[1] + i * o.stride[2] + j * o.stride[3]));
    m2 += s * s;
  }
  if (mag2) *mag2 += m2;
  return s;
}

Matrix absolute(Matrix m) {
  for (auto& x : m) x = std::fabs(x);
  return m;
}

// with_mag (f64 only): also f.mag2, the squares of each score's
// scale sum |q| |k| (the product's first-order noise), |scale q.k| (the
// scale's rounding) and logit's magnitudes.
HeadForward head_forward(const AttnParams& p, const Arith& ar, int64_t b, int64_t h,
                         const uint8_t* keep, bool with_mag = false) {
  HeadForward f;
  f.lq = p.len_q(b);
  f.lk = p.len_k(b);
  const int64_t lq = f.lq, lk = f.lk, hk = h / (p.heads_q / p.heads_kv);
  const int64_t d = p.head_dim, dv = p.head_dim_v, shift = p.shift(b);
  const Matrix q = gather(p, p.q, p.dtype, b, p.q_start(b), lq, h, d);
  const Matrix k = gather(p, p.k, p.dtype, b, p.k_start(b), lk, hk, d);
  const Matrix v = gather(p, p.v, p.dtype, b, p.k_start(b), lk, hk, dv);
  f.s = abt(ar, q, k, lq, lk, d, p.scale);
  if (with_mag) {
    f.mag2 = abt(ar, absolute(q), absolute(k), lq, lk, d, p.scale);
    for (size_t x = 0; x < f.mag2.size(); ++x) f.mag2[x] = f.mag2[x] * f.mag2[x] + f.s[x] * f.s[x];
  }
  f.t.assign(f.s.size(), 0.0);
  f.p.assign(f.s.size(), 0.0);
  f.z.assign(f.s.size(), 1.0);
  f.lse.assign(static_cast<size_t>(lq), 0.0);
  const Real inf = std::numeric_limits<Real>::infinity();
  for (int64_t i = 0; i < lq; ++i) {
    const int64_t ip = i + shift;
    for (int64_t j = 0; j < lk; ++j) {
      const int64_t x = i * lk + j;
      Real* mag2 = with_mag ? &f.mag2[x] : nullptr;
      f.s[x] = visible(p, b, h, i, j, ip) ? logit(p, ar, b, h, i, j, ip, f.s[x], &f.t[x], mag2) : -inf;
      if (p.dropout_p > 0) {
        const uint8_t kept = keep[((b * p.heads_q + h) * p.seqlen_q + i) * p.seqlen_k + j];
        f.z[x] = kept ? 1.0 / (1.0 - p.dropout_p) : 0.0;
      }
    }
    Real m = -inf;
    for (int64_t j = 0; j < lk; ++j) m = std::max(m, f.s[i * lk + j]);
    const Real sink = p.sinks ? p.sinks[h * p.sinks_stride] : -inf;
    m = std::max(m, sink);
    if (m == -inf) {
      f.lse[i] = -inf;  // no visible key and no sink: P = 0
      continue;
    }
    Real sum = p.sinks ? ar.acc(std::exp(ar.acc(sink - m))) : 0.0;
    for (int64_t n_ = 0; n_ < lk; ++n_)
      sum = ar.acc(sum + ar.acc(std::exp(ar.acc(f.s[i * lk + ar.at(n_, lk)] - m))));
    f.lse[i] = ar.acc(m + ar.acc(std::log(sum)));
    for (int64_t j = 0; j < lk; ++j) {
      Real& pij = f.p[i * lk + j];
      pij = ar.softmax ? ar.acc(ar.acc(std::exp(ar.acc(f.s[i * lk + j] - m))) / sum)
                       : ar.acc(std::exp(ar.acc(f.s[i * lk + j] - f.lse[i])));
    }
  }
  f.out.assign(static_cast<size_t>(lq * dv), 0.0);
  for (int64_t i = 0; i < lq; ++i)
    for (int64_t c = 0; c < dv; ++c)
      f.out[i * dv + c] = ar.round(ar.dot(
          lk, [&](int64_t j) { return ar.round(f.p[i * lk + j] * f.z[i * lk + j]); },
          [&](int64_t j) { return v[j * dv + c]; }));
  return f;
}

Arith arith(const AttnParams& p, Precision prec) {
  const bool naive = prec != Precision::f64 && prec != Precision::noise;
  return Arith{p.dtype, naive, prec == Precision::storage_reversed, prec == Precision::storage_fused,
               prec == Precision::storage_softmax};
}

// The accumulation's unit roundoff: f64 for f64 storage, else f32.
Real unit_roundoff(const AttnParams& p) { return std::ldexp(Real(1), p.dtype == DType::f64 ? -53 : -24); }

// How far rounding x to the storage dtype with unit roundoff u may move it:
// u |x|, or below the normal range half the smallest subnormal (2^-25 in
// f16), whatever u |x| says.
Real storage_rounding(const AttnParams& p, Real u, Real x) {
  const int least = p.dtype == DType::f16 ? -24 : p.dtype == DType::bf16 ? -133 : p.dtype == DType::f32 ? -149 : -1074;
  return std::max(u * std::fabs(x), std::ldexp(Real(1), least - 1));
}

// Noise mode's passes (reference_noise.inl).
void forward_noise(const AttnParams& p, const uint8_t* keep);
void backward_noise(const AttnParams& p, const Grads& grads, const uint8_t* keep);

// Stores head (b, h)'s out and lse in p's f64 out and lse.
void store_forward(const AttnParams& p, int64_t b, int64_t h, const HeadForward& f) {
  scatter(p.out, b, p.q_start(b), f.lq, h, p.head_dim_v, f.out);
  auto* lse_out = static_cast<double*>(p.lse.data);
  for (int64_t i = 0; i < f.lq; ++i)
    lse_out[row_offset(p.lse, b, p.q_start(b) + i, h)] = static_cast<double>(f.lse[static_cast<size_t>(i)]);
}

}  // namespace

void forward(const AttnParams& p, Precision prec, const uint8_t* keep) {
  if (prec == Precision::noise) return forward_noise(p, keep);
  const Arith ar = arith(p, prec);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) store_forward(p, b, h, head_forward(p, ar, b, h, keep));
}

namespace {

// dS for one head, w.r.t. the pre-softcap score (ds) and w.r.t. the bias
// (ds_bias, before the softcap factor), and delta = rowsum(dout * out).
// In noise mode each is instead the first-order rounding noise of computing
// dP and delta as separate sums, P * (u_acc sum |dout v| z + sum |dout| r(out))
// with u_acc the accumulation's unit roundoff and r(out) the rounding of the
// stored out that delta is built from (storage_rounding, with the unit
// roundoff of out's dtype): dS = P (dP - delta) cancels, so its error scales
// with the terms, not with dS. With a softcap, ds's noise adds that of the
// factor 1 - t^2, t = tanh(s / softcap), which any computation from a rounded
// score and a rounded t carries: g = P (dP - delta) times
// 2 |t| (1 - t^2) ds_score / softcap (the score's own noise, ds_score =
// u_acc scale sum |q| |k|, qk_abs) plus 3 u_acc t^2 (t and t * t rounded).
// Where tanh saturates the factor is a difference of nearly equal numbers,
// so its relative error grows without bound; measured in the fuzzer (f64,
// softcap 0.5, inputs of scale 4, d = 8), dq's error over the naive path's
// had a median of 0.92 and a 90th percentile of 2.25.
struct HeadBackward {
  Matrix ds, ds_bias;
  std::vector<Real> delta;
};

HeadBackward head_backward(const AttnParams& p, const Arith& ar, const HeadForward& f, const Matrix& go,
                           const Matrix& v, bool noise, const Matrix* qk_abs = nullptr) {
  const int64_t lq = f.lq, lk = f.lk, dv = p.head_dim_v;
  const int mant = p.dtype == DType::f64 ? 52 : p.dtype == DType::f32 ? 23 : p.dtype == DType::bf16 ? 7 : 10;
  const Real u_acc = std::ldexp(Real(1), p.dtype == DType::f64 ? -53 : -24);
  const Real u_out = std::ldexp(Real(1), -mant - 1);
  HeadBackward g;
  g.ds.assign(static_cast<size_t>(lq * lk), 0);
  g.ds_bias.assign(g.ds.size(), 0);
  g.delta.assign(static_cast<size_t>(lq), 0);
  const Matrix dpd = noise ? abt(ar, absolute(go), absolute(v), lq, lk, dv, 1) : abt(ar, go, v, lq, lk, dv, 1);
  const bool cap_noise = noise && p.softcap > 0;
  const Matrix dp_signed = cap_noise ? abt(ar, go, v, lq, lk, dv, 1) : Matrix();
  for (int64_t i = 0; i < lq; ++i) {
    Real delta = 0, delta_signed = 0;
    // Always in forward order: the reversed variant then sums delta and
    // dP = dO V^T in different orders, as a kernel does, instead of
    // cancelling exactly in rows with a single visible key.
    for (int64_t c = 0; c < dv; ++c) {
      const Real term = ar.acc(go[i * dv + c] * f.out[i * dv + c]);
      const Real out_noise = storage_rounding(p, u_out, f.out[i * dv + c]);
      delta = ar.acc(delta + (noise ? std::fabs(go[i * dv + c]) * out_noise : term));
      delta_signed += term;
    }
    g.delta[static_cast<size_t>(i)] = delta;
    for (int64_t j = 0; j < lk; ++j) {
      const int64_t x = i * lk + j;
      const Real gb = noise ? f.p[x] * (u_acc * dpd[x] * f.z[x] + delta) : f.p[x] * (dpd[x] * f.z[x] - delta);
      const Real cap = p.softcap > 0 ? 1 - f.t[x] * f.t[x] : 1;
      g.ds_bias[x] = ar.acc(gb);
      g.ds[x] = ar.round(ar.acc(gb * cap));
      if (cap_noise) {
        const Real t = std::fabs(f.t[x]), score_noise = u_acc * (*qk_abs)[x];
        const Real g_abs = std::fabs(f.p[x] * (dp_signed[x] * f.z[x] - delta_signed));
        g.ds[x] += g_abs * (2 * t * cap * score_noise / p.softcap + 3 * u_acc * t * t);
      }
    }
  }
  return g;
}

// out[r, c] = scale * sum_n a[n, r] b[n, c] over n < count, where a is [count, rows]
// read with (row, n) -> a_at(n, r); sums in the Arith's order and precision.
template <typename At>
Matrix reduce(const Arith& ar, int64_t rows, int64_t cols, int64_t count, At a_at, const Matrix& b, Real scale) {
  Matrix out(static_cast<size_t>(rows * cols), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const Real acc = ar.dot(count, [&](int64_t n) { return a_at(n, r); }, [&](int64_t n) { return b[n * cols + c]; });
      out[r * cols + c] = ar.acc(acc * scale);
    }
  return out;
}

void zero_dbias(const Grads& grads) {
  const TensorView& g = *grads.dbias;
  auto* db = static_cast<double*>(g.data);
  for (int64_t a = 0; a < g.shape[0]; ++a)
    for (int64_t b = 0; b < g.shape[1]; ++b)
      for (int64_t i = 0; i < g.shape[2]; ++i)
        for (int64_t j = 0; j < g.shape[3]; ++j)
          db[a * g.strides[0] + b * g.strides[1] + i * g.strides[2] + j * g.strides[3]] = 0;
}

// dbias[b, h, i, j] += ds_bias[i, j], over dbias's broadcast dimensions.
void add_dbias(const AttnParams& p, const Arith& ar, int64_t b, int64_t h, const Matrix& ds_bias, int64_t lq,
               int64_t lk) {
  const auto& o = p.dbias;
  for (int64_t i = 0; i < lq; ++i)
    for (int64_t j = 0; j < lk; ++j) {
      double& slot = static_cast<double*>(o.data)[(o.batch == 1 ? 0 : b) * o.stride[0] +
                                                  (o.heads == 1 ? 0 : h) * o.stride[1] + i * o.stride[2] +
                                                  j * o.stride[3]];
      slot = static_cast<double>(ar.acc(slot + ds_bias[i * lk + j]));
    }
}

}  // namespace

void backward(const AttnParams& p, const Grads& grads, Precision prec, const uint8_t* keep,
              const AttnParams* fwd) {
  if (prec == Precision::noise) return backward_noise(p, grads, keep);
  const Arith ar = arith(p, prec);
  const int64_t d = p.head_dim, dv = p.head_dim_v, group = p.heads_q / p.heads_kv;
  std::vector<Real> dsinks(static_cast<size_t>(p.heads_q), 0.0);
  if (p.dbias.data) zero_dbias(grads);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
      const int64_t lk = p.len_k(b), lq = p.len_q(b);
      Matrix dk(static_cast<size_t>(lk * d), 0.0), dvm(static_cast<size_t>(lk * dv), 0.0);
      const Matrix k_ = gather(p, p.k, p.dtype, b, p.k_start(b), lk, hk, d);
      const Matrix v_ = gather(p, p.v, p.dtype, b, p.k_start(b), lk, hk, dv);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const HeadForward f = head_forward(p, ar, b, h, keep);
        if (fwd) store_forward(*fwd, b, h, f);
        const Matrix q_ = gather(p, p.q, p.dtype, b, p.q_start(b), lq, h, d);
        const Matrix go = gather(p, p.dout, p.dtype, b, p.q_start(b), lq, h, dv);
        const HeadBackward g = head_backward(p, ar, f, go, v_, false);
        if (p.sinks)
          for (int64_t i = 0; i < lq; ++i) {
            if (f.lse[i] == -std::numeric_limits<Real>::infinity()) continue;
            const Real term = std::exp(p.sinks[h * p.sinks_stride] - f.lse[i]) * g.delta[static_cast<size_t>(i)];
            Real& acc = dsinks[static_cast<size_t>(h)];
            acc = ar.acc(acc - ar.acc(term));
          }
        if (p.dbias.data) add_dbias(p, ar, b, h, g.ds_bias, lq, lk);
        Matrix dq = reduce(ar, lq, d, lk, [&](int64_t j, int64_t i) { return g.ds[i * lk + j]; }, k_, p.scale);
        for (auto& x : dq) x = ar.round(x);
        scatter(p.dq, b, p.q_start(b), lq, h, d, dq);
        const Matrix dkh = reduce(ar, lk, d, lq, [&](int64_t i, int64_t j) { return g.ds[i * lk + j]; }, q_, p.scale);
        for (size_t x = 0; x < dk.size(); ++x) dk[x] = ar.acc(dk[x] + dkh[x]);
        const Matrix dvh = reduce(
            ar, lk, dv, lq, [&](int64_t i, int64_t j) { return ar.round(f.p[i * lk + j] * f.z[i * lk + j]); }, go, 1);
        for (size_t x = 0; x < dvm.size(); ++x) dvm[x] = ar.acc(dvm[x] + dvh[x]);
      }
      for (auto& x : dk) x = ar.round(x);
      for (auto& x : dvm) x = ar.round(x);
      scatter(p.dk, b, p.k_start(b), lk, hk, d, dk);
      scatter(p.dv, b, p.k_start(b), lk, hk, dv, dvm);
    }
  if (p.dsinks)
    for (int64_t h = 0; h < p.heads_q; ++h)
      static_cast<double*>(p.dsinks)[h * p.dsinks_stride] = static_cast<double>(dsinks[static_cast<size_t>(h)]);
}

#include "reference_noise.inl"
