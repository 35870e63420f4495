// What turns a raw score tile into logits: softcap, ALiBi, bias and the masks.
// Written once for forward and both backward passes.

template <typename Acc>
constexpr Acc neg_inf() { return -std::numeric_limits<Acc>::infinity(); }

enum class TileKind { skip, full, partial };

// x where keep, else -inf: the bits selected, not a branch, which
// mispredicted on a random mask (tuning table: keep_or_neg_inf).
template <typename Acc>
inline Acc keep_or_neg_inf(Acc x, bool keep) {
  using Bits = typename std::conditional<sizeof(Acc) == 4, uint32_t, uint64_t>::type;
  const Acc inf = neg_inf<Acc>();
  Bits xb, ib;
  std::memcpy(&xb, &x, sizeof xb);
  std::memcpy(&ib, &inf, sizeof ib);
  const Bits k = Bits{0} - static_cast<Bits>(keep);
  xb = (xb & k) | (ib & ~k);
  std::memcpy(&x, &xb, sizeof x);
  return x;
}

// One (batch, query head) pair: sequence bounds and the per-head inputs.
template <typename Acc>
struct HeadCtx {
  const AttnParams* p;
  int64_t b, h, hk;
  int64_t lq, lk;   // this sequence's lengths
  int64_t shift;    // query i sits at key index i + shift
  Acc slope;        // ALiBi slope, 0 when off
  Acc softcap;      // 0 when off
  const char* bias; // row i, col j at bias + (i * bias_rs + j * bias_cs) * bias_es bytes
  int64_t bias_rs, bias_cs, bias_es;
  const uint8_t* mask;
  int64_t mask_rs, mask_cs;
  Philox rng;

  HeadCtx(const AttnParams& prm, int64_t b_, int64_t h_)
      : p(&prm), b(b_), h(h_), hk(h_ / (prm.heads_q / prm.heads_kv)), lq(prm.len_q(b_)),
        lk(prm.len_k(b_)), shift(prm.shift(b_)), slope(0), softcap(static_cast<Acc>(prm.softcap)),
        bias(nullptr), bias_rs(0), bias_cs(0), bias_es(0), mask(nullptr), mask_rs(0), mask_cs(0),
        rng(Philox::make(prm, b_, h_)) {
    if (prm.alibi)
      slope = static_cast<Acc>(prm.alibi[b * prm.alibi_batch_stride + h * prm.alibi_head_stride]);
    if (prm.bias.data) {
      const auto& o = prm.bias;
      bias_es = dtype_size(o.dtype);
      bias = static_cast<const char*>(o.data) + (b * o.stride[0] + h * o.stride[1]) * bias_es;
      bias_rs = o.stride[2];
      bias_cs = o.stride[3];
    }
    if (prm.mask.data) {
      const auto& o = prm.mask;
      mask = static_cast<const uint8_t*>(o.data) + b * o.stride[0] + h * o.stride[1];
      mask_rs = o.stride[2];
      mask_cs = o.stride[3];
    }
  }

  // Keys visible to query row i by causal/window: [lo, hi] (empty when lo > hi).
  void row_range(int64_t i, int64_t& lo, int64_t& hi) const {
    const int64_t ip = i + shift;
    lo = 0;
    hi = lk - 1;
    // Compared as distances so that windows up to INT64_MAX cannot overflow.
    if (p->window_left >= 0 && p->window_left < ip) lo = ip - p->window_left;
    if (p->causal && ip < hi) hi = ip;
    if (p->window_right >= 0 && p->window_right < hi - ip) hi = ip + p->window_right;
  }

  // Query rows [first, last] whose causal and window ranges can reach keys
  // [j0, j0 + nj) (row_range turned around; no row when first > last).
  // Windows wider than far bound no row.
  void rows_seeing(int64_t j0, int64_t nj, int64_t& first, int64_t& last) const {
    const int64_t far = lq + lk + (shift < 0 ? -shift : shift), wl = p->window_left, wr = p->window_right;
    first = 0, last = lq - 1;
    if (p->causal) first = std::max(first, j0 - shift);
    if (wr >= 0 && wr < far) first = std::max(first, j0 - wr - shift);
    if (wl >= 0 && wl < far) last = std::min(last, j0 + nj - 1 + wl - shift);
  }

  // Rows [i0, i0 + ni) against keys [j0, j0 + nj), given the rows' ranges.
  TileKind classify(int64_t ni, const int64_t* lo, const int64_t* hi, int64_t j0,
                    int64_t nj) const {
    bool any = false, all = true;
    for (int64_t r = 0; r < ni; ++r) {
      const bool touches = lo[r] <= hi[r] && hi[r] >= j0 && lo[r] < j0 + nj;
      any = any || touches;
      all = all && lo[r] <= j0 && hi[r] >= j0 + nj - 1;
    }
    if (!any) return TileKind::skip;
    return all && !mask ? TileKind::full : TileKind::partial;
  }

  // Asks L2 for the bias and mask of rows [i0, i0 + n) at keys [j0, j0 +
  // nj), where each row's keys lie side by side. The tile walks read them
  // in strips a row apart, which the hardware prefetchers did not follow:
  // the bias's loads took nearly all of logits_row's samples (tuning
  // table: bias and mask prefetch).
  void prefetch_inputs(int64_t i0, int64_t n, int64_t j0, int64_t nj) const {
    const auto strips = [&](const char* base, int64_t rs, int64_t es) {
      for (int64_t i = i0; i < i0 + n; ++i) prefetch_l2_bytes(base + (i * rs + j0) * es, nj * es);
    };
    if (bias && bias_cs == 1 && bias_rs != 0) strips(bias, bias_rs, bias_es);
    if (mask && mask_cs == 1 && mask_rs != 0) strips(reinterpret_cast<const char*>(mask), mask_rs, 1);
  }

  // Row i's bias strip into L2 and its mask strip into L1, a few rows
  // before the softmax reads them. An f32 bias's rows lie a power of two
  // apart and fill the few L1 sets they fall in; a mask's strips are a
  // quarter the size (tuning table: bias and mask prefetch).
  void prefetch_row_inputs(int64_t i, int64_t j0, int64_t nj) const {
    if (bias && bias_cs == 1 && bias_rs != 0) prefetch_l2_bytes(bias + (i * bias_rs + j0) * bias_es, nj * bias_es);
    if (mask && mask_cs == 1 && mask_rs != 0)
      prefetch_l1_bytes(reinterpret_cast<const char*>(mask + i * mask_rs + j0), nj);
  }

  template <typename B>
  void add_bias(const B* row, int64_t j0, int64_t nj, Acc* s) const {
    for (int64_t jj = 0; jj < nj; ++jj) s[jj] += static_cast<Acc>(to_float(row[(j0 + jj) * bias_cs]));
  }

  // s[0..nj) holds scale * q_i . k_j for keys j0..j0+nj; turn it into logits.
  // tanh_out (if non-null) receives tanh(s / softcap) for the backward.
  void logits_row(int64_t i, int64_t j0, int64_t nj, int64_t lo, int64_t hi, bool partial,
                  Acc* s, Acc* tanh_out) const {
    if (softcap > 0) softcap_row(s, nj, softcap, tanh_out);
    if (slope != 0) {
      const int64_t ip = i + shift;
      for (int64_t jj = 0; jj < nj; ++jj) {
        const int64_t dist = ip - (j0 + jj);
        s[jj] -= slope * static_cast<Acc>(dist < 0 ? -dist : dist);
      }
    }
    if (bias) {
      const char* row = bias + i * bias_rs * bias_es;
      switch (p->bias.dtype) {
        case DType::bf16: add_bias(reinterpret_cast<const bf16_t*>(row), j0, nj, s); break;
        case DType::f16: add_bias(reinterpret_cast<const f16_t*>(row), j0, nj, s); break;
        case DType::f64: add_bias(reinterpret_cast<const double*>(row), j0, nj, s); break;
        default: add_bias(reinterpret_cast<const float*>(row), j0, nj, s); break;
      }
    }
    if (partial) {
      // Keys outside [lo, hi] as two fills: an index test per key, on 64-bit
      // lanes, took about 1% of a causal bf16 backward at L = 512.
      const int64_t a = std::clamp<int64_t>(lo - j0, 0, nj), e = std::clamp<int64_t>(hi - j0 + 1, a, nj);
      std::fill(s, s + a, neg_inf<Acc>());
      std::fill(s + e, s + nj, neg_inf<Acc>());
      if (mask) {
        const uint8_t* mrow = mask + i * mask_rs;
        for (int64_t jj = 0; jj < nj; ++jj) s[jj] = keep_or_neg_inf(s[jj], mrow[(j0 + jj) * mask_cs] != 0);
      }
    }
  }

  // Zeroes row i's dropped keys j0..j0+nj, or leaves the row if no dropout;
  // the 1 / (1 - p) of the kept is the output's (dropout_scale).
  void dropout_row(int64_t i, int64_t j0, int64_t nj, uint8_t* keep, Acc* x) const {
    if (!rng.active) return;
    rng.keep_row(i, j0, nj, keep);
    drop_row(keep, nj, x);
  }
};
