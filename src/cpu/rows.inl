// Row loops of the softmax and its gradient, on the f32 vector layer (the
// scalar layer has one lane), with plain loops for f64. n is a padded tile
// width, a multiple of kPad; padding columns hold -inf logits.

template <typename Acc>
inline Acc row_max(const Acc* s, int64_t n, Acc init) {
  for (int64_t j = 0; j < n; ++j) init = s[j] > init ? s[j] : init;
  return init;
}
inline float row_max(const float* s, int64_t n, float init) {
  VecF m = vbroadcast(init);
  for (int64_t j = 0; j < n; j += kLanes) m = vmax(m, vload(s + j));
  return vreduce_max(m);
}

// s[j] = exp(s[j] - m); returns the sum.
template <typename Acc>
inline Acc exp_row(Acc* s, int64_t n, Acc m) {
  Acc sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += (s[j] = exp_acc(s[j] - m));
  return sum;
}
inline float exp_row(float* s, int64_t n, float m) {
  const VecF mv = vbroadcast(m);
  VecF sum = vzero();
  for (int64_t j = 0; j < n; j += kLanes) {
    const VecF e = vexp(vsub(vload(s + j), mv));
    vstore(s + j, e);
    sum = vadd(sum, e);
  }
  return vreduce_add(sum);
}

// The online softmax's running max of n rows: mx[r] is row r's max over its
// old max m[r] and the tile; m[r] becomes it and alpha[r] exp(old m[r] -
// mref), mref that max or, for a row that has seen no finite logit yet, 0
// (exp(-inf - 0) = 0 where -inf + inf would give NaN). mx may be alpha. In
// f32 a vector of rows at a time: the per-row scalar exp took 17% of the bf16
// forward's softmax samples (vexp's last bit may differ from exp_f32's).
template <typename Acc>
inline void step_maxima(Acc* m, const Acc* mx, Acc* alpha, int64_t n) {
  for (int64_t r = 0; r < n; ++r) {
    const Acc x = mx[r], mref = x == -std::numeric_limits<Acc>::infinity() ? Acc(0) : x;
    alpha[r] = exp_acc(m[r] - mref);
    m[r] = x;
  }
}
inline void step_maxima(float* m, const float* mx, float* alpha, int64_t n) {
  int64_t r = 0;
  if constexpr (kVecGemm) {
    for (; r + kLanes <= n; r += kLanes) {
      const VecF x = vload(mx + r);
      vstore(alpha + r, vexp(vsub(vload(m + r), vzero_if_neg_inf(x))));
      vstore(m + r, x);
    }
  }
  for (; r < n; ++r) {
    const float x = mx[r], mref = x == -std::numeric_limits<float>::infinity() ? 0.0f : x;
    alpha[r] = exp_acc(m[r] - mref);
    m[r] = x;
  }
}

// s[j] = softcap * tanh(s[j] / softcap) for j < n, and t[j] = the tanh if t
// is not null. In f32 the tanh is tanh_f32's, vectorized (vtanh); n need
// not be a multiple of kLanes, since the scalar tail gives the same bits.
// glibc's tanhf cost more per element than a d = 128 score's products
// (tuning table: vtanh). In f64 it is tanh_f64's (glibc's tanh errs by up
// to 2.1 ulp).
inline void softcap_row(double* s, int64_t n, double softcap, double* t) {
  for (int64_t j = 0; j < n; ++j) {
    const double th = tanh_f64(s[j] / softcap);
    if (t) t[j] = th;
    s[j] = softcap * th;
  }
}
inline void softcap_row(float* s, int64_t n, float softcap, float* t) {
  const double inv = 1.0 / static_cast<double>(softcap);
  const VecF c = vbroadcast(softcap);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const VecF th = vtanh(vload(s + j), inv);
    if (t) vstore(t + j, th);
    vstore(s + j, vmul(c, th));
  }
  for (; j < n; ++j) {
    const float th = tanh_f32(s[j], inv);
    if (t) t[j] = th;
    s[j] = softcap * th;
  }
}

#if FG_VEC_GEMM
// One online-softmax step on a keys-major tile st [nj, cols] (key j in row j
// at st + j * ld, query row r in column r; cols and ld multiples of kLanes),
// kLanes query rows at a time: m, l and alpha [cols] are the rows' running
// max, running sum and this step's rescale, as row_max and exp_row give them
// for one row. With lo and hi ([cols], null for a full tile), key j0 + j
// counts for row r only in [lo[r], hi[r]] (the causal and window ranges as
// floats, exact below 2^24). mx_pre ([cols], or null), if given, holds the
// rows' new running max (the old one and the tile's) for the rows the
// ranges do not cut, which then skip the pass that finds it.
inline void softmax_cols(float* st, int64_t nj, int64_t cols, int64_t ld, float* m, float* l, float* alpha,
                         const float* lo = nullptr, const float* hi = nullptr, float j0 = 0,
                         const float* mx_pre = nullptr) {
  for (int64_t c = 0; c < cols; c += kLanes) {
    const VecF m_old = vload(m + c);
    const VecF lv = lo ? vload(lo + c) : vzero(), hv = lo ? vload(hi + c) : vzero();
    // Rows that see every key of the tile skip the masking: the rows below a
    // causal diagonal in a tile it cuts.
    const bool cut = lo && !(vall_le(lv, vbroadcast(j0)) && vall_le(vbroadcast(j0 + static_cast<float>(nj - 1)), hv));
    // Four max chains: one chain waited on vmaxps's latency (4% of the
    // forward at d = 64 in perf).
    VecF mx4[4] = {m_old, m_old, m_old, m_old};
    auto step = [&](int64_t j, int u) {
      VecF sj = vload(st + j * ld + c);
      if (cut) {
        sj = vneg_inf_outside(sj, vbroadcast(j0 + static_cast<float>(j)), lv, hv);
        vstore(st + j * ld + c, sj);
      }
      mx4[u] = vmax(mx4[u], sj);
    };
    VecF mx;
    if (mx_pre && !cut) {
      mx = vload(mx_pre + c);
    } else {
      int64_t j = 0;
      for (; j + 4 <= nj; j += 4)
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) step(j + u, u);
      for (; j < nj; ++j) step(j, 0);
      mx = vmax(vmax(mx4[0], mx4[1]), vmax(mx4[2], mx4[3]));
    }
    // A row with no finite logit yet keeps max -inf; 0 stands in, as in softmax_rows.
    const VecF mref = vzero_if_neg_inf(mx);
    const VecF a = vexp(vsub(m_old, mref));
    VecF sum = vzero();
    for (int64_t j = 0; j < nj; ++j) {
      const VecF e = vexp(vsub(vload(st + j * ld + c), mref));
      vstore(st + j * ld + c, e);
      sum = vadd(sum, e);
    }
    vstore(alpha + c, a);
    vstore(l + c, vadd(vmul(vload(l + c), a), sum));
    vstore(m + c, mx);
  }
}
#endif

// P = exp(s - lse) into s, and dS = P * (dP - delta) into dp.
template <typename Acc>
inline void grad_row(Acc* s, Acc* dp, int64_t n, Acc lse, Acc delta) {
  for (int64_t j = 0; j < n; ++j) {
    const Acc pr = exp_acc(s[j] - lse);
    dp[j] = pr * (dp[j] - delta);
    s[j] = pr;
  }
}
inline void grad_row(float* s, float* dp, int64_t n, float lse, float delta) {
  const VecF l = vbroadcast(lse), dl = vbroadcast(delta);
  for (int64_t j = 0; j < n; j += kLanes) {
    const VecF pr = vexp(vsub(vload(s + j), l));
    vstore(dp + j, vmul(pr, vsub(vload(dp + j), dl)));
    vstore(s + j, pr);
  }
}

// x[j] = 0 where key j is dropped: dropout without its 1 / (1 - p), which the
// caller applies once to the sums the row feeds (dropout_scale).
template <typename Acc>
inline void drop_row(const uint8_t* keep, int64_t n, Acc* x) {
  for (int64_t j = 0; j < n; ++j) x[j] = keep[j] ? x[j] : Acc(0);
}

// x[j] *= keep[j] / (1 - p): dropout applied to a row already computed. Two
// passes: GCC (which keeps FP traps) leaves a product under a select scalar.
template <typename Acc>
inline void keep_row(const uint8_t* keep, int64_t n, Acc inv_keep, Acc* x) {
  for (int64_t j = 0; j < n; ++j) x[j] *= inv_keep;
  drop_row(keep, n, x);
}
