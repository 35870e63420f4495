// Forward: one task per (batch, query head, query block). Keys are visited in
// blocks with an online softmax, so no seqlen_q x seqlen_k buffer exists.

template <typename Acc>
struct Slice {
  Acc* base;
  Acc* at(int64_t off) const { return base + off; }
  int64_t* idx(int64_t off) const { return reinterpret_cast<int64_t*>(base + off); }
};

// Loads rows [r0, r0 + n) of head h of operand o as a row-major [n, pad] tile.
template <typename T, typename Acc>
void load_tile(const Operand& o, int64_t b, int64_t seq0, int64_t h, int64_t n, int64_t dim,
               int64_t pad, Acc* dst) {
  const T* base = static_cast<const T*>(o.data);
  for (int64_t r = 0; r < n; ++r)
    load_row(base + row_offset(o, b, seq0 + r, h), o.dim_stride, dim, pad, dst + r * pad);
}

// Loads the same rows transposed: dst[c * ld + r] for c < round_up(dim, kPad),
// r < ld, zero where r >= n or c >= dim. Rows are staged contiguously in
// stage ([ld, round_up(dim, kPad)]) and transposed in register blocks:
// scattering strided stores instead cost ~20% of the forward at d = 128.
template <typename T, typename Acc>
void load_tile_t(const Operand& o, int64_t b, int64_t seq0, int64_t h, int64_t n, int64_t dim,
                 int64_t ld, Acc* dst, Acc* stage) {
  const int64_t pad = round_up(dim, kPad);
  load_tile<T>(o, b, seq0, h, n, dim, pad, stage);
  for (int64_t x = n * pad; x < ld * pad; ++x) stage[x] = Acc(0);
  transpose(ld, pad, stage, pad, dst, ld);
}

// lse is f32, or f64 alongside f64 storage.
inline double lse_load(const AttnParams& p, int64_t off) {
  return p.lse_dtype == DType::f64 ? static_cast<const double*>(p.lse.data)[off]
                                   : static_cast<const float*>(p.lse.data)[off];
}
inline void lse_store(const AttnParams& p, int64_t off, double x) {
  if (p.lse_dtype == DType::f64)
    static_cast<double*>(p.lse.data)[off] = x;
  else
    static_cast<float*>(p.lse.data)[off] = static_cast<float>(x);
}

// Results (out, dq, dk, dv) hold the storage type T, or f32 when T is a 16-bit type.
template <typename T, typename Acc>
inline void store_result(DType dt, const Acc* src, int64_t n, void* base, int64_t off, int64_t stride,
                         Acc mul) {
  if (!std::is_same<T, float>::value && dt == DType::f32)
    store_row(src, n, static_cast<float*>(base) + off, stride, mul);
  else
    store_row(src, n, static_cast<T*>(base) + off, stride, mul);
}

template <typename T, typename Acc>
void forward_task(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t h, int64_t qb,
                  Slice<Acc> ws) {
  const HeadCtx<Acc> ctx(p, b, h);
  const int64_t i0 = qb * plan.block_q;
  if (i0 >= ctx.lq) return;
  const int64_t mq = std::min(plan.block_q, ctx.lq - i0);
  const int64_t d = p.head_dim, dv = p.head_dim_v;
  const int64_t ldq = plan.dqk_pad, ldv = plan.dv_pad, lds = plan.bk_pad;
  const auto& L = plan.fwd;
  Acc *q = ws.at(L.q), *kt = ws.at(L.kt), *v = ws.at(L.v), *s = ws.at(L.s), *o = ws.at(L.o);
  Acc *stage = ws.at(L.stage), *pv = ws.at(L.pv), *m = ws.at(L.row_m), *l = ws.at(L.row_l), *alpha = ws.at(L.row_alpha);
  int64_t *lo = ws.idx(L.row_lo), *hi = ws.idx(L.row_hi);
  uint8_t keep[kMaxBlockK];

  load_tile<T>(p.q, b, p.q_start(b) + i0, h, mq, d, ldq, q);
  const Acc scale = static_cast<Acc>(p.scale);
  for (int64_t x = 0; x < mq * ldq; ++x) q[x] *= scale;
  for (int64_t r = 0; r < mq; ++r) {
    ctx.row_range(i0 + r, lo[r], hi[r]);
    m[r] = neg_inf<Acc>();
    l[r] = Acc(0);
  }
  for (int64_t x = 0; x < mq * ldv; ++x) o[x] = Acc(0);

  const int64_t k0 = p.k_start(b);
  for (int64_t j0 = 0; j0 < ctx.lk; j0 += plan.block_k) {
    const int64_t nj = std::min(plan.block_k, ctx.lk - j0);
    const TileKind kind = ctx.classify(mq, lo, hi, j0, nj);
    if (kind == TileKind::skip) continue;
    load_tile_t<T>(p.k, b, k0 + j0, ctx.hk, nj, d, lds, kt, stage);
    load_tile<T>(p.v, b, k0 + j0, ctx.hk, nj, dv, ldv, v);
    gemm_nn(mq, lds, d, q, ldq, 1, kt, lds, s, lds);
    for (int64_t r = 0; r < mq; ++r) {
      Acc* srow = s + r * lds;
      ctx.logits_row(i0 + r, j0, nj, lo[r], hi[r], kind == TileKind::partial, srow, nullptr);
      for (int64_t jj = nj; jj < lds; ++jj) srow[jj] = neg_inf<Acc>();
      const Acc mx = row_max(srow, lds, m[r]);
      // A row with no visible key so far keeps max -inf; subtracting 0 then
      // leaves exp(-inf) = 0 instead of exp(-inf + inf) = NaN.
      const Acc mref = mx == neg_inf<Acc>() ? Acc(0) : mx;
      alpha[r] = exp_acc(m[r] - mref);
      l[r] = l[r] * alpha[r] + exp_row(srow, lds, mref);
      m[r] = mx;
      ctx.dropout_row(i0 + r, j0, nj, keep, srow);
    }
    // o = o * alpha + P V, with P V summed on its own first (blocked summation).
    gemm_nn(mq, ldv, nj, s, lds, 1, v, ldv, pv, ldv);
    scale_add(mq, ldv, alpha, pv, o, ldv);
  }

  const int64_t q0 = p.q_start(b);
  for (int64_t r = 0; r < mq; ++r) {
    Acc mx = m[r], sum = l[r];
    Acc ores = Acc(1);
    if (p.sinks) {
      // sink logit joins the denominator: rescale to the larger of the two maxima
      const Acc sk = static_cast<Acc>(p.sinks[h * p.sinks_stride]);
      const Acc mnew = sk > mx ? sk : mx;
      const Acc a = exp_acc(mx - mnew);
      sum = sum * a + exp_acc(sk - mnew);
      ores = a;
      mx = mnew;
    }
    // sum == 0 only when no key is visible: out = 0, lse = -inf (or the sink).
    const Acc mul = sum == Acc(0) ? Acc(0) : ores / sum;
    const Acc row_lse = sum == Acc(0) ? neg_inf<Acc>() : mx + std::log(sum);
    store_result<T>(p.out_dtype, o + r * ldv, dv, p.out.data, row_offset(p.out, b, q0 + i0 + r, h),
                    p.out.dim_stride, mul);
    lse_store(p, row_offset(p.lse, b, q0 + i0 + r, h), static_cast<double>(row_lse));
  }
}

template <typename T, typename Acc>
void forward_impl(const AttnParams& p, const TilePlan& plan, void* workspace) {
  const int64_t nqb = ceil_div(p.seqlen_q, plan.block_q);
  const int64_t per_thread = plan.per_thread_bytes / static_cast<int64_t>(sizeof(Acc));
  Acc* base = static_cast<Acc*>(workspace);
  parallel_for(p.batch * p.heads_q * nqb, plan.threads, [&](int64_t task, int thread) {
    const int64_t qb = task % nqb, bh = task / nqb;
    forward_task<T, Acc>(p, plan, bh / p.heads_q, bh % p.heads_q, qb,
                         Slice<Acc>{base + thread * per_thread});
  });
}
