// The reference's noise mode (Precision::noise), for one oracle type Real:
// included at the end of reference.inl. Per output element, a first-order
// estimate of the rounding error that any computation of attention in the
// storage precision carries where the naive error cannot measure it
// (docs/design.md, "The tolerance rule"):
//  - the cancellation in dS = P (dP - delta), summed over its terms
//    (head_backward's noise mode);
//  - the exponents: log P_ij carries the logit's roundings, that of S - lse,
//    exp's error and lse's own, together e_ij; with 16-bit storage P is also
//    rounded to it before P V (p_roundoff). Their effects on an output,
//    root-sum-square over its terms, as independent roundings add.

namespace {

// exp's relative error in units of the unit roundoff u: the f32 kernels' exp
// is within 1.15 ulp (tests/test_vec.cpp), f64's std::exp within 1, and an
// ulp is at most 2 u.
constexpr Real kExpError = 2.3;

// The unit roundoff of P rounded to 16-bit storage before P V, as the
// naive path and the bf16 pair products round it; 0 where P stays in the
// accumulation type.
Real p_roundoff(const AttnParams& p) {
  if (p.dtype == DType::bf16) return std::ldexp(Real(1), -8);
  if (p.dtype == DType::f16) return std::ldexp(Real(1), -11);
  return 0;
}

// How far that rounding may move P_ij (storage_rounding), or 0.
Real p_rounding(const AttnParams& p, Real up, Real pij) { return up > 0 ? storage_rounding(p, up, pij) : 0; }

// sqrt(sum of squares), built term by term.
struct Rss {
  Real sq = 0;
  void add(Real x) { sq += x * x; }
  Real value() const { return std::sqrt(sq); }
};

// A sum's own roundings relative to u: each addition after the first rounds
// its partial sum s_k by at most u |s_k|, RSS over the additions; the
// partial sums are the forward order's.
template <typename Term>
Real sum_roundings(int64_t count, Term term) {
  Real s = 0;
  Rss r;
  for (int64_t n = 0; n < count; ++n) {
    s += term(n);
    if (n > 0) r.add(s);
  }
  return r.value();
}

struct ExponentNoise {
  Matrix logit;              // [lq, lk]: the logit's noise, which lse shares (P renormalizes it)
  Matrix own;                // [lq, lk]: exp's and S - lse's, P_ij's alone
  Matrix e;                  // [lq, lk]: log P_ij's whole first-order noise, 0 where masked
  std::vector<Real> sink;    // [lq]: the same for the sink's share
  std::vector<Real> sink_p;  // [lq]: the sink's share exp(sink - lse_i)
  std::vector<Real> eps;     // [lq]: lse's own noise, common to every P_ij of the row
  std::vector<Real> lse;     // [lq]: lse's noise
  Matrix out;                // [lq, dv]: out's noise
};

// lse = m + log(l), l = sum_j exp(S_ij - m), moves by sum_j P_ij dS_ij (the
// logits' errors, which P then renormalizes) and by its own error eps: the
// exps of l's terms (sum_j P_ij exp's error), l's additions, log l
// (u |lse - m|) and m + log l (u |lse|). P_ij = exp(S_ij - lse_i) carries
// the logit's dS_ij, exp's error and S - lse's rounding (own_ij), and -eps.
void lse_noise(const AttnParams& p, const HeadForward& f, int64_t i, Real sink, ExponentNoise& n) {
  const int64_t lk = f.lk;
  const auto r = static_cast<size_t>(i);
  const Real u = unit_roundoff(p), inf = std::numeric_limits<Real>::infinity(), lse = f.lse[r];
  const Real sink_p = p.sinks ? std::exp(sink - lse) : 0;
  Real m = sink;
  Rss logits, own;
  own.add(sink_p * kExpError);
  for (int64_t j = 0; j < lk; ++j) {
    const int64_t x = i * lk + j;
    m = std::max(m, f.s[x]);
    if (f.s[x] == -inf) continue;
    logits.add(f.p[x] * std::sqrt(f.mag2[x]));
    own.add(f.p[x] * kExpError);
  }
  const int64_t first = p.sinks ? -1 : 0;
  own.add(sum_roundings(lk - first, [&](int64_t n_) { return n_ + first < 0 ? sink_p : f.p[i * lk + n_ + first]; }));
  own.add(lse - m);
  own.add(lse);
  n.eps[r] = u * own.value();
  n.lse[r] = std::hypot(u * logits.value(), n.eps[r]);
  n.sink_p[r] = sink_p;
  n.sink[r] = p.sinks ? std::hypot(u * std::sqrt((sink - lse) * (sink - lse) + kExpError * kExpError), n.lse[r]) : 0;
  for (int64_t j = 0; j < lk; ++j) {
    const int64_t x = i * lk + j;
    if (f.s[x] == -inf) continue;
    const Real diff = f.s[x] - lse;
    n.logit[x] = u * std::sqrt(f.mag2[x]);
    n.own[x] = u * std::sqrt(diff * diff + kExpError * kExpError);
    n.e[x] = std::sqrt(n.logit[x] * n.logit[x] + n.own[x] * n.own[x] + n.lse[r] * n.lse[r]);
  }
}

// out_ic = sum_j P_ij z_ij v_jc moves by sum_j P_ij dS_ij (z_ij v_jc - out_ic)
// (the logits' errors, renormalized), sum_j P_ij own_ij z_ij v_jc, -eps out_ic,
// P's rounding to 16-bit storage (u_p P_ij z_ij v_jc), and the sum's own roundings.
ExponentNoise exponent_noise(const AttnParams& p, const HeadForward& f, const Matrix& v, int64_t h) {
  const int64_t lq = f.lq, lk = f.lk, dv = p.head_dim_v;
  const Real u = unit_roundoff(p), up = p_roundoff(p), inf = std::numeric_limits<Real>::infinity();
  const Real sink = p.sinks ? p.sinks[h * p.sinks_stride] : -inf;
  const std::vector<Real> rows(static_cast<size_t>(lq), 0);
  const Matrix pairs(static_cast<size_t>(lq * lk), 0);
  ExponentNoise n{pairs, pairs, pairs, rows, rows, rows, rows, Matrix(static_cast<size_t>(lq * dv), 0)};
  for (int64_t i = 0; i < lq; ++i) {
    if (f.lse[static_cast<size_t>(i)] == -inf) continue;
    lse_noise(p, f, i, sink, n);
    for (int64_t c = 0; c < dv; ++c) {
      const Real out = f.out[i * dv + c];
      Rss o;
      o.add(n.eps[static_cast<size_t>(i)] * out);
      for (int64_t j = 0; j < lk; ++j) {
        const int64_t x = i * lk + j;
        const Real zv = f.z[x] * v[j * dv + c];
        o.add(f.p[x] * n.logit[x] * (zv - out));
        o.add(std::hypot(f.p[x] * n.own[x], p_rounding(p, up, f.p[x])) * zv);
      }
      o.add(u * sum_roundings(lk, [&](int64_t j) { return f.p[i * lk + j] * f.z[i * lk + j] * v[j * dv + c]; }));
      n.out[i * dv + c] = o.value();
    }
  }
  return n;
}

void forward_noise(const AttnParams& p, const uint8_t* keep) {
  const Arith ar = arith(p, Precision::f64);
  auto* lse_out = static_cast<double*>(p.lse.data);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const HeadForward f = head_forward(p, ar, b, h, keep, true);
      const int64_t hk = h / (p.heads_q / p.heads_kv);
      const Matrix v = gather(p, p.v, p.dtype, b, p.k_start(b), f.lk, hk, p.head_dim_v);
      const ExponentNoise n = exponent_noise(p, f, v, h);
      scatter(p.out, b, p.q_start(b), f.lq, h, p.head_dim_v, n.out);
      for (int64_t i = 0; i < f.lq; ++i) lse_out[row_offset(p.lse, b, p.q_start(b) + i, h)] = n.lse[i];
    }
}

// The exponents' noise of dS (w.r.t. the bias; ds_score adds softcap's
// factor 1 - t^2) and of delta. dS_ij = P_ij (z_ij dP_ij - delta_i) moves
// with log P_ij and with delta_i = dout_i . out_i = sum_j P_ij z_ij dP_ij,
// which moves as out does (exponent_noise), dP in place of v.
struct ExponentGrads {
  Matrix ds_bias, ds_score;  // [lq, lk]
  std::vector<Real> delta;   // [lq]
};

ExponentGrads exponent_grads(const AttnParams& p, const HeadForward& f, const Matrix& go, const Matrix& v,
                             const ExponentNoise& n) {
  const int64_t lq = f.lq, lk = f.lk, dv = p.head_dim_v;
  const Arith ar = arith(p, Precision::f64);
  const Real up = p_roundoff(p);
  const Matrix dp = abt(ar, go, v, lq, lk, dv, 1);
  ExponentGrads g{Matrix(static_cast<size_t>(lq * lk), 0), Matrix(static_cast<size_t>(lq * lk), 0),
                  std::vector<Real>(static_cast<size_t>(lq), 0)};
  for (int64_t i = 0; i < lq; ++i) {
    const auto r = static_cast<size_t>(i);
    Real delta = 0;
    for (int64_t c = 0; c < dv; ++c) delta += go[i * dv + c] * f.out[i * dv + c];
    Rss dd;
    dd.add(n.eps[r] * delta);
    for (int64_t j = 0; j < lk; ++j) {
      const int64_t x = i * lk + j;
      dd.add(f.p[x] * n.logit[x] * (dp[x] * f.z[x] - delta));
      dd.add(std::hypot(f.p[x] * n.own[x], p_rounding(p, up, f.p[x])) * f.z[x] * dp[x]);
    }
    g.delta[r] = dd.value();
    for (int64_t j = 0; j < lk; ++j) {
      const int64_t x = i * lk + j;
      g.ds_bias[x] = n.e[x] * std::fabs(f.p[x] * (dp[x] * f.z[x] - delta)) + f.p[x] * g.delta[r];
      g.ds_score[x] = g.ds_bias[x] * (p.softcap > 0 ? 1 - f.t[x] * f.t[x] : 1);
    }
    g.delta[r] = n.sink_p[r] * (n.sink[r] * std::fabs(delta) + g.delta[r]);  // the sink's gradient's
  }
  return g;
}

// Matrix of x * x.
Matrix squares(Matrix m) {
  for (auto& x : m) x *= x;
  return m;
}

// Adds to sq[r, c] the square of the roundings (sum_roundings, times u and
// scale) of the matrix product sum over n < count of a(n, r) b[n, c].
template <typename At>
void add_product_roundings(Real u_scale, int64_t rows, int64_t cols, int64_t count, At a_at, const Matrix& b,
                           Matrix& sq) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const Real x = u_scale * sum_roundings(count, [&](int64_t n) { return a_at(n, r) * b[n * cols + c]; });
      sq[r * cols + c] += x * x;
    }
}

// One (batch, K/V head)'s gradients' noise: sums of the cancellation terms
// plus RSS of the exponents' terms, over the group's query heads.
void head_group_noise(const AttnParams& p, int64_t b, int64_t hk, const uint8_t* keep, std::vector<Real>& dsinks) {
  const Arith ar = arith(p, Precision::f64);
  const Real up = p_roundoff(p);
  const int64_t d = p.head_dim, dv = p.head_dim_v, group = p.heads_q / p.heads_kv;
  const int64_t lk = p.len_k(b), lq = p.len_q(b);
  const Real u = unit_roundoff(p);
  const Matrix k = gather(p, p.k, p.dtype, b, p.k_start(b), lk, hk, d), k_abs = absolute(k);
  const Matrix v = gather(p, p.v, p.dtype, b, p.k_start(b), lk, hk, dv);
  Matrix dk(static_cast<size_t>(lk * d), 0), dk_sq(dk.size(), 0), dv_sq(static_cast<size_t>(lk * dv), 0);
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const HeadForward f = head_forward(p, ar, b, h, keep, true);
    const Matrix q = gather(p, p.q, p.dtype, b, p.q_start(b), lq, h, d), q_abs = absolute(q);
    const Matrix go = gather(p, p.dout, p.dtype, b, p.q_start(b), lq, h, dv);
    const Matrix qk_abs = abt(ar, q_abs, k_abs, lq, lk, d, p.scale);
    const HeadBackward c = head_backward(p, ar, f, go, v, true, &qk_abs);
    const ExponentNoise n = exponent_noise(p, f, v, h);
    const ExponentGrads e = exponent_grads(p, f, go, v, n);
    Rss sink;
    for (int64_t i = 0; i < lq; ++i) {
      dsinks[static_cast<size_t>(h)] += n.sink_p[static_cast<size_t>(i)] * c.delta[static_cast<size_t>(i)];
      sink.add(e.delta[static_cast<size_t>(i)]);
    }
    dsinks[static_cast<size_t>(h)] += sink.value();
    if (p.dbias.data) {
      Matrix ds_bias = c.ds_bias;
      for (size_t x = 0; x < ds_bias.size(); ++x) ds_bias[x] += e.ds_bias[x];
      add_dbias(p, ar, b, h, ds_bias, lq, lk);
    }
    auto by_key = [&](const Matrix& m) { return [&m, lk](int64_t j, int64_t i) { return m[i * lk + j]; }; };
    auto by_row = [&](const Matrix& m) { return [&m, lk](int64_t i, int64_t j) { return m[i * lk + j]; }; };
    const Matrix ds2 = squares(e.ds_score);
    const Matrix ds = head_backward(p, ar, f, go, v, false).ds;
    Matrix dq = reduce(ar, lq, d, lk, by_key(c.ds), k_abs, p.scale);
    Matrix dq_sq = reduce(ar, lq, d, lk, by_key(ds2), squares(k_abs), p.scale * p.scale);
    add_product_roundings(u * p.scale, lq, d, lk, by_key(ds), k, dq_sq);
    for (size_t x = 0; x < dq.size(); ++x) dq[x] += std::sqrt(dq_sq[x]);
    scatter(p.dq, b, p.q_start(b), lq, h, d, dq);
    const Matrix dkh = reduce(ar, lk, d, lq, by_row(c.ds), q_abs, p.scale);
    Matrix dkh_sq = reduce(ar, lk, d, lq, by_row(ds2), squares(q_abs), p.scale * p.scale);
    add_product_roundings(u * p.scale, lk, d, lq, by_row(ds), q, dkh_sq);
    Matrix pez(f.p.size()), pz(f.p.size());
    for (size_t x = 0; x < pez.size(); ++x) {
      pez[x] = std::hypot(f.p[x] * n.e[x], p_rounding(p, up, f.p[x])) * f.z[x];
      pz[x] = f.p[x] * f.z[x];
    }
    Matrix dvh_sq = reduce(ar, lk, dv, lq, by_row(squares(pez)), squares(go), 1);
    add_product_roundings(u, lk, dv, lq, by_row(pz), go, dvh_sq);
    for (size_t x = 0; x < dk.size(); ++x) dk[x] += dkh[x], dk_sq[x] += dkh_sq[x];
    for (size_t x = 0; x < dv_sq.size(); ++x) dv_sq[x] += dvh_sq[x];
  }
  for (size_t x = 0; x < dk.size(); ++x) dk[x] += std::sqrt(dk_sq[x]);
  for (auto& x : dv_sq) x = std::sqrt(x);
  scatter(p.dk, b, p.k_start(b), lk, hk, d, dk);
  scatter(p.dv, b, p.k_start(b), lk, hk, dv, dv_sq);
}

void backward_noise(const AttnParams& p, const Grads& grads, const uint8_t* keep) {
  std::vector<Real> dsinks(static_cast<size_t>(p.heads_q), 0.0);
  if (p.dbias.data) zero_dbias(grads);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hk = 0; hk < p.heads_kv; ++hk) head_group_noise(p, b, hk, keep, dsinks);
  if (p.dsinks)
    for (int64_t h = 0; h < p.heads_q; ++h)
      static_cast<double*>(p.dsinks)[h * p.dsinks_stride] = static_cast<double>(dsinks[static_cast<size_t>(h)]);
}

}  // namespace
