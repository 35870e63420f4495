// Backward in three named phases, as in FlashAttention-2:
//   compute_delta   delta_i = rowsum(dout_i * out_i)          task: (b, h, query block)
//   backward_dkdv   dK, dV for a key block, summed over the     task: (b, kv head, key block)
//                   query heads of its group; each task owns its rows, no atomics
//   backward_dq     dQ for a query block (and dbias rows)       task: (b, h, query block)
// Scores are recomputed per tile from lse: P = exp(S - lse).
// When there are enough (batch, K/V head) pairs to occupy the threads, the
// last two phases fuse (TilePlan::fused, backward_fused): the dK/dV walk also
// adds dS K into a dQ accumulator, 5 tile products per tile pair instead of 7.
// Both forms add the same dS K tiles to dQ in the same key order, so their
// results are bitwise identical and the choice may depend on the thread count.
// A call with a single (batch, K/V head) pair (MQA at batch 1), which
// would leave all threads but one to the two-pass form, cuts its keys into
// TilePlan::key_chunks runs instead, one single-pass task per run with a
// dQ partial of its own, summed in run order at the end: a choice made from
// the shapes alone, since those sums round differently from the two forms'.

// Everything the tile step needs about one query block.
template <typename Acc>
struct QueryBlock {
  int64_t i0, mq;
  Acc *q, *dout, *lse, *delta;
  int64_t *lo, *hi;
};

// lse and delta, and q and dO as Acc rows where the products take them (f32_rows).
template <typename T, typename Acc>
void load_query_block(const AttnParams& p, const TilePlan& plan, const HeadCtx<Acc>& ctx,
                      const Acc* delta_all, QueryBlock<Acc>& qb, bool f32_rows) {
  const int64_t q0 = p.q_start(ctx.b) + qb.i0;
  if (f32_rows) {
    load_tile<T>(p.q, ctx.b, q0, ctx.h, qb.mq, p.head_dim, plan.dqk_pad, qb.q);
    load_tile<T>(p.dout, ctx.b, q0, ctx.h, qb.mq, p.head_dim_v, plan.dv_pad, qb.dout);
  }
  const Acc* delta = delta_all + (ctx.b * p.heads_q + ctx.h) * p.seqlen_q + qb.i0;
  for (int64_t r = 0; r < qb.mq; ++r) {
    const Acc v = static_cast<Acc>(lse_load(p, row_offset(p.lse, ctx.b, q0 + r, ctx.h)));
    // A fully masked row has lse = -inf; +inf makes its P exactly 0.
    qb.lse[r] = v == neg_inf<Acc>() ? -v : v;
    qb.delta[r] = delta[r];
  }
}

template <typename Acc, typename D>
inline void add_row(const Acc* src, int64_t n, D* dst, int64_t stride) {
  for (int64_t i = 0; i < n; ++i) dst[i * stride] += static_cast<D>(src[i]);
}

// The keys [j0 + a, j0 + a + w) of a key block that a query block's rows
// can see, a a multiple of kPad: a causal or window band leaves the rest of
// a partial tile masked for every row, and its products need not run.
struct KeySpan {
  int64_t a, w;
};
template <typename Acc>
KeySpan seen_keys(const QueryBlock<Acc>& qb, int64_t j0, int64_t nj, TileKind kind) {
  if (kind != TileKind::partial) return {0, nj};
  int64_t first = j0 + nj, last = j0 - 1;
  for (int64_t r = 0; r < qb.mq; ++r)
    if (qb.lo[r] <= qb.hi[r]) {
      first = std::min(first, qb.lo[r]);
      last = std::max(last, qb.hi[r]);
    }
  const int64_t a = std::max<int64_t>(0, std::min(first, j0 + nj) - j0) / kPad * kPad;
  const int64_t end = std::min(nj, std::max(last, j0 - 1) - j0 + 1);
  return {a, std::max<int64_t>(0, end - a)};
}

// The backward's tile products. F32Backward: f32 tiles, S scaled as the
// forward's AccTiles scale it (every path but bf16 on amx and avx512bf16). PairBackward (below): bf16
// pair products, on AMX tiles or AVX512_BF16 dot products.
template <typename T, typename Acc>
struct F32Backward {
  static constexpr bool kPairs = false;
  F32Backward(const TilePlan&, Slice<Acc>) {}
  // s [mq, lds] = scale (q k^T) and dp [mq, lds] = dO v^T for the keys at
  // columns a.. of kt and vt (all row stride bk_ld).
  void qk(const AttnParams& p, const TilePlan& plan, const QueryBlock<Acc>& qb, const Acc* kt, int64_t a,
          int64_t lds, Acc* s) const {
    gemm_nn(qb.mq, lds, p.head_dim, qb.q, plan.dqk_pad, 1, kt + a, plan.bk_ld, s, plan.bk_ld,
            ScoreScale<Acc>(p.scale));
  }
  void dov(const AttnParams& p, const TilePlan& plan, const QueryBlock<Acc>& qb, const Acc* vt, int64_t a,
           int64_t lds, Acc* dp) const {
    gemm_nn(qb.mq, lds, p.head_dim_v, qb.dout, plan.dv_pad, 1, vt + a, plan.bk_ld, dp, plan.bk_ld);
  }
};

#if FG_BF16_DOT
// The pair products' two engines: c [m, n] = mul * a b, or c += a b when
// Add, over kp pairs (Bf16DotTiles' layouts). Each computes S as its
// forward does, so S is bit for bit the forward's and S - lse <= 0 holds,
// where an f32 recompute differs by rounding (docs/design.md).
//   DotProducts  vdpbf16ps (gemm_bf16), the scale on S in f32, as Bf16DotTiles
//   AmxProducts  AMX tiles (gemm_amx), the scale on q's pairs when it is a
//                power of two, else on S after, as AmxTiles
struct DotProducts {
  static constexpr int64_t kRowPairs = 1;  // the dK/dV products' pairs of query rows come in steps of this
  static float s_mul(const AttnParams& p) { return static_cast<float>(p.scale); }
  static void scale_q(const AttnParams&, uint32_t*, int64_t) {}
  template <bool Add>
  static void gemm(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                   float* c, int64_t ldc, float mul = 1.0f) {
    gemm_bf16<Add>(m, n, kp, a, lda, b, ldb, c, ldc, mul);
  }
};

#if FG_AMX
struct AmxProducts {
  static constexpr int64_t kRowPairs = 16;
  AmxProducts() { amx_configure(); }
  ~AmxProducts() { _tile_release(); }
  AmxProducts(const AmxProducts&) = delete;
  AmxProducts& operator=(const AmxProducts&) = delete;
  static float s_mul(const AttnParams& p) { return AmxTiles::scale_on_q(p) ? 1.0f : static_cast<float>(p.scale); }
  static void scale_q(const AttnParams& p, uint32_t* qp, int64_t n) {
    if (AmxTiles::scale_on_q(p)) AmxTiles::scale_pairs(qp, n, static_cast<float>(p.scale));
  }
  template <bool Add>
  static void gemm(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                   float* c, int64_t ldc, float mul = 1.0f) {
    gemm_amx<Add>(m, n, kp, a, lda, b, ldb, c, ldc);
    if (mul == 1.0f) return;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t x = 0; x < n; ++x) c[r * ldc + x] *= mul;
  }
};
#endif

// bf16 on the amx and avx512bf16 paths: all five products on bf16 pairs
// (Bf16DotTiles' layouts):
//   S  = q K^T      q as row pairs [mq, dqk_pad / 2], K^T pairs [dqk_pad / 2, bk_ld]
//   dP = dO V^T     dO as row pairs, V^T pairs [dv_pad / 2, bk_ld]
//   dV^T += dO^T P  dO^T as pairs of query rows [dv_pad, mh], P as pairs of
//                   query rows [mh, bk_ld] (mh: (mq + 1) / 2 pairs, rounded
//                   up to 16, or under 16 to the engine's step, kRowPairs)
//   dK^T += Q^T dS  likewise (q unscaled: dK takes the scale when stored)
//   dQ += dS K      dS rows rounded to pairs in place, K as pairs of key rows
//                   [bk_pad / 2, dqk_pad]
// P and dS meet the products rounded to bf16, as the naive bf16
// computation rounds them.
template <typename Products>
struct PairBackward {
  static constexpr bool kPairs = true;
  Products products;
  uint32_t *qp, *dop, *qtp, *dotp, *pp, *dsp;
  uint32_t *const qp_ws, *const dop_ws, *const qtp_ws, *const dotp_ws;
  int64_t mh = 0;
  PairBackward(const TilePlan& plan, Slice<float> ws)
      : qp(words(ws.at(plan.bwd.q_pairs))),
        dop(words(ws.at(plan.bwd.dout_pairs))),
        qtp(words(ws.at(plan.bwd.q))),
        dotp(words(ws.at(plan.bwd.dout))),
        pp(words(ws.at(plan.bwd.pairs))),
        dsp(words(ws.at(plan.bwd.pairs) + round_up(plan.block_q, kPad) / 2 * plan.bk_ld)),
        qp_ws(qp),
        dop_ws(dop),
        qtp_ws(qtp),
        dotp_ws(dotp) {
    FG_DASSERT(plan.bwd.pairs > 0);  // plan_backward(p, true)
  }
  static uint32_t* words(float* x) { return reinterpret_cast<uint32_t*>(x); }
  static const uint32_t* words(const float* x) { return reinterpret_cast<const uint32_t*>(x); }

  // The query block's q and dO as row pairs and, for the dK/dV products
  // (transposed), as pairs of query rows transposed; stage holds
  // [mh, max(dqk_pad, dv_pad)] words. With held (a slot of
  // BackwardScratch::held_q) all four go there, laid out only where they
  // are not there yet (!ready).
  void load_q(const AttnParams& p, const TilePlan& plan, const HeadCtx<float>& ctx, const QueryBlock<float>& qb,
              bool transposed, float* stage, float* held = nullptr, bool ready = false) {
    const int64_t dp = plan.dqk_pad / 2, dvp = plan.dv_pad / 2, q0 = p.q_start(ctx.b) + qb.i0;
    const int64_t pairs = (qb.mq + 1) / 2;
    mh = round_up(pairs, pairs < 16 ? Products::kRowPairs : 16);
    if (held) {
      const int64_t bq_pairs = round_up(plan.block_q, kPad), mh_max = round_up(ceil_div(plan.block_q, 2), 16);
      qp = words(held);
      dop = qp + bq_pairs * dp;
      qtp = dop + bq_pairs * dvp;
      dotp = qtp + mh_max * plan.dqk_pad;
      if (ready) return;
    } else {
      qp = qp_ws, dop = dop_ws, qtp = qtp_ws, dotp = dotp_ws;
    }
    for (int64_t r = 0; r < qb.mq; ++r) {
      Bf16DotTiles::load_pairs(p.q, ctx.b, q0 + r, ctx.h, p.head_dim, dp, qp + r * dp);
      Bf16DotTiles::load_pairs(p.dout, ctx.b, q0 + r, ctx.h, p.head_dim_v, dvp, dop + r * dvp);
    }
    Products::scale_q(p, qp, qb.mq * dp);
    if (!transposed) return;
    Bf16DotTiles::load_pair_rows(p.q, ctx.b, q0, ctx.h, qb.mq, p.head_dim, mh, plan.dqk_pad, words(stage));
    transpose_pairs(mh, plan.dqk_pad, stage, qtp);
    Bf16DotTiles::load_pair_rows(p.dout, ctx.b, q0, ctx.h, qb.mq, p.head_dim_v, mh, plan.dv_pad, words(stage));
    transpose_pairs(mh, plan.dv_pad, stage, dotp);
  }
  // dst [cols, mh] = src [mh, cols] (words); cols is a multiple of 16. The
  // register blocks take mh in steps of 16; fewer pair rows (a query block
  // of under 32 rows on the dot products) go element by element, so that
  // the dK/dV products run over the block's own pairs, not 16.
  static void transpose_pairs(int64_t mh, int64_t cols, const float* src, uint32_t* dst) {
    if (mh % 16 == 0) return transpose(mh, cols, src, cols, reinterpret_cast<float*>(dst), mh);
    const auto* w = reinterpret_cast<const uint32_t*>(src);
    for (int64_t r = 0; r < mh; ++r)
      for (int64_t c = 0; c < cols; ++c) dst[c * mh + r] = w[r * cols + c];
  }
  // Keys [seq0, seq0 + nj) of head hk: K^T and V^T pairs into kt and vt
  // and, for dQ, K as pairs of key rows into k_rows (if not null).
  void load_kv(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t seq0, int64_t hk, int64_t nj,
               float* kt, float* vt, float* k_rows, float* stage) const {
    Bf16DotTiles::load_pairs_t(p.k, b, seq0, hk, nj, p.head_dim, plan.bk_pad, plan.bk_ld, kt, stage);
    Bf16DotTiles::load_pairs_t(p.v, b, seq0, hk, nj, p.head_dim_v, plan.bk_pad, plan.bk_ld, vt, stage);
    if (k_rows)
      Bf16DotTiles::load_pair_rows(p.k, b, seq0, hk, nj, p.head_dim, plan.bk_pad / 2, plan.dqk_pad, words(k_rows));
  }
  void qk(const AttnParams& p, const TilePlan& plan, const QueryBlock<float>& qb, const float* kt, int64_t a,
          int64_t lds, float* s) const {
    const int64_t dp = plan.dqk_pad / 2, ld = plan.bk_ld;
    Products::template gemm<false>(qb.mq, lds, dp, qp, dp, words(kt) + a, ld, s, ld, Products::s_mul(p));
  }
  void dov(const AttnParams&, const TilePlan& plan, const QueryBlock<float>& qb, const float* vt, int64_t a,
           int64_t lds, float* dp) const {
    const int64_t dvp = plan.dv_pad / 2;
    Products::template gemm<false>(qb.mq, lds, dvp, dop, dvp, words(vt) + a, plan.bk_ld, dp, plan.bk_ld);
  }
  // dv^T += dO^T P and dk^T += Q^T dS over the keys at columns a..a + lds
  // of the accumulators ([dv_pad or dqk_pad, bk_pad]); P in s and dS in ds.
  void dk_dv(const TilePlan& plan, const QueryBlock<float>& qb, int64_t a, int64_t lds, const float* s,
             const float* ds, float* dkt, float* dvt) const {
    const int64_t ld = plan.bk_ld;
    for (int64_t x = 0; x < mh; ++x) {
      if (2 * x >= qb.mq) {
        std::memset(pp + x * ld, 0, static_cast<size_t>(lds) * 4);
        std::memset(dsp + x * ld, 0, static_cast<size_t>(lds) * 4);
        continue;
      }
      const bool two = 2 * x + 1 < qb.mq;
      interleave_f32_rows(s + 2 * x * ld, two ? s + (2 * x + 1) * ld : nullptr, lds, pp + x * ld);
      interleave_f32_rows(ds + 2 * x * ld, two ? ds + (2 * x + 1) * ld : nullptr, lds, dsp + x * ld);
    }
    Products::template gemm<true>(plan.dv_pad, lds, mh, dotp, mh, pp, ld, dvt + a, plan.bk_pad);
    Products::template gemm<true>(plan.dqk_pad, lds, mh, qtp, mh, dsp, ld, dkt + a, plan.bk_pad);
  }
  // dq [mq, dqk_pad] (row stride ldq) += dS K over the keys at a..a + lds;
  // ds's rows become bf16 pairs in place.
  void dq(const TilePlan& plan, const QueryBlock<float>& qb, int64_t a, int64_t lds, float* ds,
          const float* k_rows, float* dq, int64_t ldq) const {
    const int64_t ld = plan.bk_ld;
    for (int64_t r = 0; r < qb.mq; ++r) round_bf16_pairs(ds + r * ld, lds);
    Products::template gemm<true>(qb.mq, plan.dqk_pad, lds / 2, words(ds), ld, words(k_rows) + a / 2 * plan.dqk_pad,
                                  plan.dqk_pad, dq, ldq);
  }
};
#endif

// One (query block, key block) step over the block's keys [j0, j0 + nj),
// lds = round_up(nj, kPad) columns. In: qb, kt [d, lds], vt [dv, lds].
// Out: s = dropout(P) and dp = dS (w.r.t. the pre-softcap score), both
// [mq, lds]. All four have row stride bk_ld. dS before the softcap factor
// is added into dbias_rows if given. The keys start at column a of kt and vt.
template <typename Acc, typename Bwd>
void tile_grad(const AttnParams& p, const TilePlan& plan, const HeadCtx<Acc>& ctx,
               const QueryBlock<Acc>& qb, int64_t j0, int64_t nj, bool partial, const Bwd& bwd,
               const Acc* kt, const Acc* vt, int64_t a, Acc* s, Acc* dp, Acc* t, void* dbias_rows) {
  const int64_t lds = round_up(nj, kPad), ld = plan.bk_ld;
  bwd.qk(p, plan, qb, kt, a, lds, s);
  bwd.dov(p, plan, qb, vt, a, lds, dp);
  const bool capped = ctx.softcap > 0;
  const Acc inv_keep = static_cast<Acc>(1.0 / (1.0 - p.dropout_p));
  uint8_t keep[kMaxBlockK];
  for (int64_t r = 0; r < qb.mq; ++r) {
    Acc *srow = s + r * ld, *dprow = dp + r * ld, *trow = t + r * ld;
    ctx.logits_row(qb.i0 + r, j0, nj, qb.lo[r], qb.hi[r], partial, srow, capped ? trow : nullptr);
    for (int64_t jj = nj; jj < lds; ++jj) srow[jj] = neg_inf<Acc>();
    if (ctx.rng.active) {
      // dP of the dropped-out P is dP * z, z = keep / (1 - p); P stays undropped in dS.
      // dV's P has the dropped zeroed, and dV takes 1 / (1 - p) when stored.
      ctx.rng.keep_row(qb.i0 + r, j0, nj, keep);
      keep_row(keep, nj, inv_keep, dprow);
      grad_row(srow, dprow, lds, qb.lse[r], qb.delta[r]);
      drop_row(keep, nj, srow);
    } else {
      grad_row(srow, dprow, lds, qb.lse[r], qb.delta[r]);
    }
    if (dbias_rows) {
      if (p.dbias.dtype == DType::f64)
        add_row(dprow, nj, static_cast<double*>(dbias_rows) + r * p.dbias.stride[2] + j0 * p.dbias.stride[3],
                p.dbias.stride[3]);
      else
        add_row(dprow, nj, static_cast<float*>(dbias_rows) + r * p.dbias.stride[2] + j0 * p.dbias.stride[3],
                p.dbias.stride[3]);
    }
    if (capped)  // d(c tanh(x / c)) / dx = 1 - tanh^2
      for (int64_t jj = 0; jj < nj; ++jj) dprow[jj] *= Acc(1) - trow[jj] * trow[jj];
  }
}

template <typename Acc>
void row_ranges(const HeadCtx<Acc>& ctx, QueryBlock<Acc>& qb) {
  for (int64_t r = 0; r < qb.mq; ++r) ctx.row_range(qb.i0 + r, qb.lo[r], qb.hi[r]);
}

template <typename Acc>
QueryBlock<Acc> query_block_buffers(const TilePlan& plan, Slice<Acc> ws, int64_t i0, int64_t mq) {
  const auto& L = plan.bwd;
  return QueryBlock<Acc>{i0, mq, ws.at(L.q), ws.at(L.dout), ws.at(L.row_a), ws.at(L.row_b),
                         ws.idx(L.row_lo), ws.idx(L.row_hi)};
}

// sum_c o[c] g[c] over n elements (strides os, gs), in Acc. Contiguous f32
// rows sum in kLanes lanes with FMAs, then across the lanes: the scalar
// chain, one add waiting on the last, took 4.4% of a bf16 backward's
// samples at L = 512 (d = 64, causal, 1 thread).
template <typename Acc, typename O, typename T>
Acc row_dot(const O* o, int64_t os, const T* g, int64_t gs, int64_t n) {
  Acc acc = 0;
  int64_t c = 0;
#if FG_VEC_GEMM
  if constexpr (std::is_same<Acc, float>::value && !std::is_same<T, double>::value) {
    if (os == 1 && gs == 1 && n >= kLanes) {
      VecF v = vzero();
      for (; c + kLanes <= n; c += kLanes) v = vfma(vload_as(o + c), vload_as(g + c), v);
      acc = vreduce_add(v);
    }
  }
#endif
  for (; c < n; ++c) acc += static_cast<Acc>(to_float(o[c * os])) * static_cast<Acc>(to_float(g[c * gs]));
  return acc;
}

// O is read as the storage type T or, when it was kept in f32, as O.
template <typename T, typename O, typename Acc>
void compute_delta(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t h, int64_t qblk,
                   Acc* delta_all, double* dsinks_part) {
  const int64_t lq = p.len_q(b), i0 = qblk * plan.block_q;
  const int64_t nqb = ceil_div(p.seqlen_q, plan.block_q);
  double part = 0;
  const O* out = static_cast<const O*>(p.out.data);
  const T* dout = static_cast<const T*>(p.dout.data);
  Acc* delta = delta_all + (b * p.heads_q + h) * p.seqlen_q;
  const int64_t q0 = p.q_start(b);
  for (int64_t i = i0; i < std::min(lq, i0 + plan.block_q); ++i) {
    const O* orow = out + row_offset(p.out, b, q0 + i, h);
    const T* grow = dout + row_offset(p.dout, b, q0 + i, h);
    const Acc acc = row_dot<Acc>(orow, p.out.dim_stride, grow, p.dout.dim_stride, p.head_dim_v);
    delta[i] = acc;
    if (p.sinks) {  // d lse / d sink = P_sink; d sink = -sum_i P_sink,i * delta_i
      const double l = lse_load(p, row_offset(p.lse, b, q0 + i, h));
      part += std::exp(static_cast<double>(p.sinks[h * p.sinks_stride]) - l) * acc;
    }
  }
  dsinks_part[(b * p.heads_q + h) * nqb + qblk] = part;
}

// dq_acc, when given (the single pass), receives dS K for every query row of
// the group: [group, seqlen_q, dqk_pad], rows of head hk * group + g at g.
template <typename T, typename Acc, typename Bwd>
void backward_dkdv(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t hk, int64_t kblk,
                   const Acc* delta_all, Slice<Acc> ws, Bwd& bwd, Acc* dq_acc = nullptr) {
  const int64_t lk = p.len_k(b), j0 = kblk * plan.block_k;
  if (j0 >= lk) return;
  const int64_t nj = std::min(plan.block_k, lk - j0), k0 = p.k_start(b) + j0;
  const int64_t ldq = plan.dqk_pad, ldv = plan.dv_pad;
  const auto& L = plan.bwd;
  Acc *kt = ws.at(L.kt), *vt = ws.at(L.vt), *s = ws.at(L.s), *dp = ws.at(L.dp), *t = ws.at(L.t);
  Acc *dk = ws.at(L.acc_a), *dv = ws.at(L.acc_b), *tmp = ws.at(L.tmp), *k = ws.at(L.k);
  // The accumulators: dK [nj, ldq] and dV [nj, ldv], or with pair products dK^T and dV^T [pad, bk_pad].
  int64_t dk_n = nj * ldq, dv_n = nj * ldv;
  if constexpr (Bwd::kPairs) {
    bwd.load_kv(p, plan, b, k0, hk, nj, kt, vt, dq_acc ? k : nullptr, tmp);
    dk_n = ldq * plan.bk_pad;
    dv_n = ldv * plan.bk_pad;
  } else {
    if (dq_acc) {  // K row-major for dQ += dS K, and its transpose for S = Q K^T
      load_tile<T>(p.k, b, k0, hk, nj, p.head_dim, ldq, k);
      for (int64_t x = nj * ldq; x < plan.bk_pad * ldq; ++x) k[x] = Acc(0);
      transpose(plan.bk_pad, ldq, k, ldq, kt, plan.bk_ld);
    } else {
      load_tile_t<T>(p.k, b, k0, hk, nj, p.head_dim, plan.bk_pad, plan.bk_ld, kt, tmp);
    }
    load_tile_t<T>(p.v, b, k0, hk, nj, p.head_dim_v, plan.bk_pad, plan.bk_ld, vt, tmp);
  }
  for (int64_t x = 0; x < dk_n; ++x) dk[x] = Acc(0);
  for (int64_t x = 0; x < dv_n; ++x) dv[x] = Acc(0);

  const int64_t group = p.heads_q / p.heads_kv;
  // The single pass keeps the group's query blocks as pairs (held_q) up to its slots.
  const auto slot_of = [&](int64_t hq, int64_t iq) {
    const int64_t x = (hq - hk * group) * ceil_div(p.seqlen_q, plan.block_q) + iq / plan.block_q;
    return dq_acc && x < L.held_slots ? x : int64_t{-1};
  };
  uint8_t* ready = reinterpret_cast<uint8_t*>(ws.at(L.held_ready));
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const HeadCtx<Acc> ctx(p, b, h);
    for (int64_t i0 = 0; i0 < ctx.lq; i0 += plan.block_q) {
      QueryBlock<Acc> qb = query_block_buffers(plan, ws, i0, std::min(plan.block_q, ctx.lq - i0));
      row_ranges(ctx, qb);
      const TileKind kind = ctx.classify(qb.mq, qb.lo, qb.hi, j0, nj);
      if (kind == TileKind::skip) continue;
      load_query_block<T>(p, plan, ctx, delta_all, qb, !Bwd::kPairs);
      if constexpr (Bwd::kPairs) {
        const int64_t x = slot_of(h, i0);
        bwd.load_q(p, plan, ctx, qb, true, tmp, x >= 0 ? ws.at(L.held_q) + x * L.held_slot : nullptr,
                   x >= 0 && ready[x]);
        if (x >= 0) ready[x] = 1;
      }
      // The next query block's rows (or the next head's first) into L2 while
      // this one computes, unless they are held as pairs.
      const int64_t hn = i0 + plan.block_q < ctx.lq ? h : h + 1, in = hn == h ? i0 + plan.block_q : 0;
      const int64_t xn = hn < (hk + 1) * group ? slot_of(hn, in) : -1;
      if (xn >= 0 && ready[xn]) {
        const char* next = reinterpret_cast<const char*>(ws.at(L.held_q) + xn * L.held_slot);
        for (int64_t at = 0; at < L.held_slot * static_cast<int64_t>(sizeof(Acc)); at += 64) prefetch_l2(next + at);
      } else if (hn < (hk + 1) * group) {
        const int64_t mn = std::min(plan.block_q, p.len_q(b) - in), qn = p.q_start(b) + in;
        prefetch_rows<T>(p.q, b, qn, hn, mn, p.head_dim);
        prefetch_rows<T>(p.dout, b, qn, hn, mn, p.head_dim_v);
      }
      const KeySpan ks = seen_keys(qb, j0, nj, kind);
      tile_grad(p, plan, ctx, qb, j0 + ks.a, ks.w, kind == TileKind::partial, bwd, kt, vt, ks.a, s, dp, t,
                nullptr);
      Acc* dq_rows = dq_acc ? dq_acc + ((h - hk * group) * p.seqlen_q + i0) * ldq : nullptr;
      if constexpr (Bwd::kPairs) {
        const int64_t lds = round_up(ks.w, kPad);
        bwd.dk_dv(plan, qb, ks.a, lds, s, dp, dk, dv);
        if (dq_rows) bwd.dq(plan, qb, ks.a, lds, dp, k, dq_rows, ldq);
        continue;
      }
      // dV += P^T dO, dK += dS^T Q over the seen keys' rows
      gemm_nn_acc(ks.w, ldv, qb.mq, s, 1, plan.bk_ld, qb.dout, ldv, dv + ks.a * ldv, ldv, nullptr, tmp);
      gemm_nn_acc(ks.w, ldq, qb.mq, dp, 1, plan.bk_ld, qb.q, ldq, dk + ks.a * ldq, ldq, nullptr, tmp);
      if (dq_rows)  // dQ += dS K
        gemm_nn_acc(qb.mq, ldq, ks.w, dp, plan.bk_ld, 1, k + ks.a * ldq, ldq, dq_rows, ldq, nullptr, tmp);
    }
  }
  if constexpr (Bwd::kPairs) {  // back to rows
    transpose(ldq, plan.bk_pad, dk, plan.bk_pad, tmp, ldq);
    std::memcpy(dk, tmp, static_cast<size_t>(nj * ldq) * sizeof(Acc));
    transpose(ldv, plan.bk_pad, dv, plan.bk_pad, tmp, ldv);
    std::memcpy(dv, tmp, static_cast<size_t>(nj * ldv) * sizeof(Acc));
  }
  const Acc dk_mul = static_cast<Acc>(p.scale);  // dK = scale dS^T Q
  for (int64_t r = 0; r < nj; ++r) {
    store_result<T>(p.grad_dtype, dk + r * ldq, p.head_dim, p.dk.data, row_offset(p.dk, b, k0 + r, hk),
                    p.dk.dim_stride, dk_mul);
    store_result<T>(p.grad_dtype, dv + r * ldv, p.head_dim_v, p.dv.data, row_offset(p.dv, b, k0 + r, hk),
                    p.dv.dim_stride, dropout_scale<Acc>(p));
  }
}

template <typename T, typename Acc, typename Bwd>
void backward_dq(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t h, int64_t qblk,
                 const Acc* delta_all, Slice<Acc> ws, Bwd& bwd) {
  const HeadCtx<Acc> ctx(p, b, h);
  const int64_t i0 = qblk * plan.block_q;
  if (i0 >= ctx.lq) return;
  QueryBlock<Acc> qb = query_block_buffers(plan, ws, i0, std::min(plan.block_q, ctx.lq - i0));
  const int64_t ldq = plan.dqk_pad, lds = plan.bk_pad, ld = plan.bk_ld;
  const auto& L = plan.bwd;
  Acc *k = ws.at(L.k), *kt = ws.at(L.kt), *vt = ws.at(L.vt), *s = ws.at(L.s), *dp = ws.at(L.dp);
  Acc *t = ws.at(L.t), *dq = ws.at(L.acc_a), *tmp = ws.at(L.tmp);
  row_ranges(ctx, qb);
  load_query_block<T>(p, plan, ctx, delta_all, qb, !Bwd::kPairs);
  if constexpr (Bwd::kPairs) bwd.load_q(p, plan, ctx, qb, false, tmp);
  for (int64_t x = 0; x < qb.mq * ldq; ++x) dq[x] = Acc(0);
  void* dbias_rows = nullptr;
  if (p.dbias.data) {
    const auto& o = p.dbias;
    const int64_t off = (o.batch == 1 ? 0 : b) * o.stride[0] + (o.heads == 1 ? 0 : h) * o.stride[1] +
                        i0 * o.stride[2];
    dbias_rows = o.dtype == DType::f64 ? static_cast<void*>(static_cast<double*>(o.data) + off)
                                       : static_cast<void*>(static_cast<float*>(o.data) + off);
  }
  const int64_t k0 = p.k_start(b);
  for (int64_t j0 = 0; j0 < ctx.lk; j0 += plan.block_k) {
    const int64_t nj = std::min(plan.block_k, ctx.lk - j0);
    const TileKind kind = ctx.classify(qb.mq, qb.lo, qb.hi, j0, nj);
    if (kind == TileKind::skip) continue;
    if constexpr (Bwd::kPairs) {
      bwd.load_kv(p, plan, b, k0 + j0, ctx.hk, nj, kt, vt, k, tmp);
    } else {  // K once, row-major for dQ += dS K; its transpose for S = Q K^T.
      load_tile<T>(p.k, b, k0 + j0, ctx.hk, nj, p.head_dim, ldq, k);
      for (int64_t x = nj * ldq; x < lds * ldq; ++x) k[x] = Acc(0);
      transpose(lds, ldq, k, ldq, kt, ld);
      load_tile_t<T>(p.v, b, k0 + j0, ctx.hk, nj, p.head_dim_v, lds, ld, vt, tmp);
    }
    const KeySpan ks = seen_keys(qb, j0, nj, kind);
    tile_grad(p, plan, ctx, qb, j0 + ks.a, ks.w, kind == TileKind::partial, bwd, kt, vt, ks.a, s, dp, t,
              dbias_rows);
    if constexpr (Bwd::kPairs)
      bwd.dq(plan, qb, ks.a, round_up(ks.w, kPad), dp, k, dq, ldq);
    else
      gemm_nn_acc(qb.mq, ldq, ks.w, dp, ld, 1, k + ks.a * ldq, ldq, dq, ldq, nullptr, tmp);  // dQ += dS K
  }
  const int64_t q0 = p.q_start(b);
  for (int64_t r = 0; r < qb.mq; ++r)
    store_result<T>(p.grad_dtype, dq + r * ldq, p.head_dim, p.dq.data, row_offset(p.dq, b, q0 + i0 + r, h),
                    p.dq.dim_stride, static_cast<Acc>(p.scale));
}

// Key blocks [bounds[r], bounds[r + 1]) of key run r (TilePlan::key_chunks
// of them): about equal shares of the (query row, key) pairs the causal or
// window ranges leave in batch 0, so that under a causal mask the first
// runs, whose keys meet the most rows, take fewer blocks. From the shapes
// alone, like the runs' count.
template <typename Acc>
std::vector<int64_t> run_bounds(const AttnParams& p, const TilePlan& plan) {
  const int64_t bk = plan.block_k, nkb = ceil_div(p.seqlen_k, bk), runs = plan.key_chunks;
  std::vector<double> cum(static_cast<size_t>(nkb) + 1, 0.0);
  const HeadCtx<Acc> ctx(p, 0, 0);
  for (int64_t i = 0; i < ctx.lq; ++i) {
    int64_t lo = 0, hi = 0;
    ctx.row_range(i, lo, hi);
    lo = std::max<int64_t>(lo, 0), hi = std::min(hi, ctx.lk - 1);
    for (int64_t kb = lo / bk; lo <= hi && kb <= hi / bk; ++kb)
      cum[kb + 1] += static_cast<double>(std::min(hi, (kb + 1) * bk - 1) - std::max(lo, kb * bk) + 1);
  }
  for (int64_t kb = 0; kb < nkb; ++kb) cum[kb + 1] += cum[kb];
  std::vector<int64_t> bounds(static_cast<size_t>(runs) + 1, nkb);
  bounds[0] = 0;
  for (int64_t r = 1; r < runs; ++r) {
    const double share = cum[nkb] > 0 ? cum[nkb] * static_cast<double>(r) / static_cast<double>(runs) : 0;
    int64_t kb = bounds[r - 1] + 1;
    if (cum[nkb] > 0)  // the block edge nearest the share
      while (kb < nkb - (runs - r) && cum[kb + 1] - share < share - cum[kb]) ++kb;
    else
      kb = std::max(kb, r * nkb / runs);
    bounds[r] = kb;
  }
  return bounds;
}

// The single pass: one task per (batch, K/V head) walks its key blocks in
// order and keeps the group's dQ in its own f32 accumulator, so every output
// has one owner and one summation order, whatever the thread count. With
// key runs (part: the run's dQ partial [group, seqlen_q, dqk_pad]) it walks
// key blocks [kb0, kb1) into part, which dq_from_runs then sums and stores.
template <typename T, typename Acc, typename Bwd>
void backward_fused(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t hk, const Acc* delta_all,
                    Slice<Acc> ws, Bwd& bwd, int64_t kb0 = 0, int64_t kb1 = -1, Acc* part = nullptr) {
  const int64_t group = p.heads_q / p.heads_kv, ldq = plan.dqk_pad;
  Acc* dq_acc = part ? part : ws.at(plan.bwd.dq_acc);
  for (int64_t x = 0; x < group * p.seqlen_q * ldq; ++x) dq_acc[x] = Acc(0);
  std::memset(ws.at(plan.bwd.held_ready), 0, static_cast<size_t>(plan.bwd.held_slots));
  const int64_t k_end = kb1 < 0 ? ceil_div(p.len_k(b), plan.block_k) : kb1;
  for (int64_t kblk = kb0; kblk < k_end; ++kblk)
    backward_dkdv<T, Acc>(p, plan, b, hk, kblk, delta_all, ws, bwd, dq_acc);
  if (part) return;
  const int64_t q0 = p.q_start(b);
  for (int64_t g = 0; g < group; ++g)
    for (int64_t i = 0; i < p.len_q(b); ++i)
      store_result<T>(p.grad_dtype, dq_acc + (g * p.seqlen_q + i) * ldq, p.head_dim, p.dq.data,
                      row_offset(p.dq, b, q0 + i, hk * group + g), p.dq.dim_stride, static_cast<Acc>(p.scale));
}

// dQ rows [i0, i1) of (b, h): the key runs' partials ([runs, batch, heads_q,
// seqlen_q, dqk_pad]) summed in run order, then stored.
template <typename T, typename Acc>
void dq_from_runs(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t h, int64_t i0, int64_t i1,
                  const Acc* parts, Acc* row) {
  const int64_t ldq = plan.dqk_pad, run_stride = p.batch * p.heads_q * p.seqlen_q * ldq, q0 = p.q_start(b);
  for (int64_t i = i0; i < i1; ++i) {
    const Acc* src = parts + ((b * p.heads_q + h) * p.seqlen_q + i) * ldq;
    std::copy_n(src, p.head_dim, row);
    for (int64_t r = 1; r < plan.key_chunks; ++r)
      for (int64_t c = 0; c < p.head_dim; ++c) row[c] += src[r * run_stride + c];
    store_result<T>(p.grad_dtype, row, p.head_dim, p.dq.data, row_offset(p.dq, b, q0 + i, h), p.dq.dim_stride,
                    static_cast<Acc>(p.scale));
  }
}

template <typename T, typename Acc, typename Bwd = F32Backward<T, Acc>>
void backward_impl(const AttnParams& p, const TilePlan& plan, void* workspace) {
  const int64_t nqb = ceil_div(p.seqlen_q, plan.block_q);
  const int64_t nkb = ceil_div(p.seqlen_k, plan.block_k);
  const int64_t per_thread = plan.per_thread_bytes / static_cast<int64_t>(sizeof(Acc));
  Acc* base = static_cast<Acc*>(workspace);
  Acc* delta = base + per_thread * plan.threads;
  double* dsinks_part = reinterpret_cast<double*>(
      reinterpret_cast<char*>(delta) + round_up(p.batch * p.heads_q * p.seqlen_q * sizeof(Acc), kAlign));
  const int64_t bh = p.batch * p.heads_q;

  parallel_for(bh * nqb, plan.threads, [&](int64_t task, int) {
    const int64_t b = task / nqb / p.heads_q, h = task / nqb % p.heads_q;
    if (!std::is_same<T, float>::value && p.out_dtype == DType::f32)
      compute_delta<T, float, Acc>(p, plan, b, h, task % nqb, delta, dsinks_part);
    else
      compute_delta<T, T, Acc>(p, plan, b, h, task % nqb, delta, dsinks_part);
  });
  if (plan.fused && plan.key_chunks > 1) {
    const int64_t runs = plan.key_chunks, group = p.heads_q / p.heads_kv;
    Acc* parts = reinterpret_cast<Acc*>(reinterpret_cast<char*>(dsinks_part) + round_up(bh * nqb * 8, kAlign));
    const std::vector<int64_t> bounds = run_bounds<Acc>(p, plan);
    parallel_for(p.batch * p.heads_kv * runs, plan.threads, [&](int64_t task, int thread) {
      const int64_t run = task % runs, b = task / runs / p.heads_kv, hk = task / runs % p.heads_kv;
      const Slice<Acc> ws{base + thread * per_thread};
      Bwd bwd(plan, ws);
      Acc* part = parts + (((run * p.batch + b) * p.heads_q + hk * group) * p.seqlen_q) * plan.dqk_pad;
      backward_fused<T, Acc>(p, plan, b, hk, delta, ws, bwd, bounds[run], bounds[run + 1], part);
    });
    parallel_for(bh * nqb, plan.threads, [&](int64_t task, int thread) {
      const int64_t b = task / nqb / p.heads_q, h = task / nqb % p.heads_q, i0 = task % nqb * plan.block_q;
      dq_from_runs<T, Acc>(p, plan, b, h, i0, std::min(i0 + plan.block_q, p.len_q(b)), parts,
                           base + thread * per_thread + plan.bwd.acc_a);
    });
  } else if (plan.fused) {
    parallel_for(p.batch * p.heads_kv, plan.threads, [&](int64_t task, int thread) {
      const Slice<Acc> ws{base + thread * per_thread};
      Bwd bwd(plan, ws);
      backward_fused<T, Acc>(p, plan, task / p.heads_kv, task % p.heads_kv, delta, ws, bwd);
    });
  } else {
    parallel_for(p.batch * p.heads_kv * nkb, plan.threads, [&](int64_t task, int thread) {
      const int64_t b = task / nkb / p.heads_kv, hk = task / nkb % p.heads_kv;
      const Slice<Acc> ws{base + thread * per_thread};
      Bwd bwd(plan, ws);
      backward_dkdv<T, Acc>(p, plan, b, hk, task % nkb, delta, ws, bwd);
    });
  }
  // A dbias broadcast over batch or heads sums over them: one task then owns
  // the dbias rows and visits the (b, h) pairs that share them in a fixed order.
  const int64_t nb = p.dbias.data ? p.dbias.batch : p.batch;
  const int64_t nh = p.dbias.data ? p.dbias.heads : p.heads_q;
  if (!plan.fused)
    parallel_for(nb * nh * nqb, plan.threads, [&](int64_t task, int thread) {
      const int64_t qblk = task % nqb, gh = task / nqb % nh, gb = task / nqb / nh;
      const int64_t b_end = nb == p.batch ? gb + 1 : p.batch, h_end = nh == p.heads_q ? gh + 1 : p.heads_q;
      const Slice<Acc> ws{base + thread * per_thread};
      Bwd bwd(plan, ws);
      for (int64_t b = nb == p.batch ? gb : 0; b < b_end; ++b)
        for (int64_t h = nh == p.heads_q ? gh : 0; h < h_end; ++h)
          backward_dq<T, Acc>(p, plan, b, h, qblk, delta, ws, bwd);
    });
  if (p.dsinks) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      double sum = 0;
      for (int64_t b = 0; b < p.batch; ++b)
        for (int64_t q = 0; q < nqb; ++q) sum += dsinks_part[(b * p.heads_q + h) * nqb + q];
      if (p.dsinks_dtype == DType::f64)
        static_cast<double*>(p.dsinks)[h * p.dsinks_stride] = -sum;
      else
        static_cast<float*>(p.dsinks)[h * p.dsinks_stride] = static_cast<float>(-sum);
    }
  }
}
