// The backward's step: one query block (QueryBlock) against one key block
// (StepTiles, KeySpan), its tile products (F32Backward, PairBackward) and
// dS (tile_grad). Included by backward.inl, in order.


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

// The keys [j0 + a, j0 + a + w) of the key block from j0 that a query
// block's rows can see, a a multiple of kPad: a causal or window band
// leaves the rest of a partial tile masked for every row, and its products
// need not run.
struct KeySpan {
  int64_t j0, a, w;
  bool partial;  ///< the ranges cut the block: its rows mask what they do not see
};
template <typename Acc>
KeySpan seen_keys(const QueryBlock<Acc>& qb, int64_t j0, int64_t nj, TileKind kind) {
  if (kind != TileKind::partial) return {j0, 0, nj, false};
  int64_t first = j0 + nj, last = j0 - 1;
  for (int64_t r = 0; r < qb.mq; ++r)
    if (qb.lo[r] <= qb.hi[r]) {
      first = std::min(first, qb.lo[r]);
      last = std::max(last, qb.hi[r]);
    }
  const int64_t a = std::max<int64_t>(0, std::min(first, j0 + nj) - j0) / kPad * kPad;
  const int64_t end = std::min(nj, std::max(last, j0 - 1) - j0 + 1);
  return {j0, a, std::max<int64_t>(0, end - a), true};
}

// A step's tiles: K^T [d, bk_pad] and V^T [dv, bk_pad] in, s = dropout(P),
// dp = dS and t (scratch) [mq, bk_pad] out, all with row stride bk_ld. On
// pair products the step also lays out the pairs that the dK/dV and the dQ
// products read, for those that follow it.
template <typename Acc>
struct StepTiles {
  const Acc *kt, *vt;
  Acc *s, *dp, *t;
  bool dk_dv = true, dq = true;
};

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
  // Query rows 2x and 2x + 1 of P (s) and dS (ds), both complete, while
  // they are in L1: as pairs of query rows for the dK/dV products, and dS's
  // rows rounded to bf16 pairs in place for the dQ product (tiles' flags).
  void pair_rows(const TilePlan& plan, const QueryBlock<float>& qb, int64_t x, int64_t lds,
                 const StepTiles<float>& tiles) const {
    const int64_t ld = plan.bk_ld;
    const bool two = 2 * x + 1 < qb.mq;
    const float* s0 = tiles.s + 2 * x * ld;
    float* d0 = tiles.dp + 2 * x * ld;
    if (tiles.dk_dv) {
      interleave_f32_rows(s0, two ? s0 + ld : nullptr, lds, pp + x * ld);
      interleave_f32_rows(d0, two ? d0 + ld : nullptr, lds, dsp + x * ld);
    }
    if (!tiles.dq) return;
    round_bf16_pairs(d0, lds);
    if (two) round_bf16_pairs(d0 + ld, lds);
  }
  // dv^T += dO^T P and dk^T += Q^T dS over the keys at columns a..a + lds
  // of the accumulators ([dv_pad or dqk_pad, bk_pad]); P and dS as pair_rows
  // laid them out, the pair rows past the block's zeroed here.
  void dk_dv(const TilePlan& plan, const QueryBlock<float>& qb, int64_t a, int64_t lds, float* dkt,
             float* dvt) const {
    const int64_t ld = plan.bk_ld;
    for (int64_t x = (qb.mq + 1) / 2; x < mh; ++x) {
      std::memset(pp + x * ld, 0, static_cast<size_t>(lds) * 4);
      std::memset(dsp + x * ld, 0, static_cast<size_t>(lds) * 4);
    }
    Products::template gemm<true>(plan.dv_pad, lds, mh, dotp, mh, pp, ld, dvt + a, plan.bk_pad);
    Products::template gemm<true>(plan.dqk_pad, lds, mh, qtp, mh, dsp, ld, dkt + a, plan.bk_pad);
  }
  // dq [mq, dqk_pad] (row stride ldq) += dS K over the keys at a..a + lds;
  // ds's rows as bf16 pairs (pair_rows).
  void dq(const TilePlan& plan, const QueryBlock<float>& qb, int64_t a, int64_t lds, const float* ds,
          const float* k_rows, float* dq, int64_t ldq) const {
    Products::template gemm<true>(qb.mq, plan.dqk_pad, lds / 2, words(ds), plan.bk_ld,
                                  words(k_rows) + a / 2 * plan.dqk_pad, plan.dqk_pad, dq, ldq);
  }
};
#endif

// One (query block, key block) step over the keys ks sees, [j0, j0 + nj)
// with j0 = ks.j0 + ks.a and nj = ks.w, lds = round_up(nj, kPad) columns
// from column ks.a of kt and vt. Out: s = dropout(P) and dp = dS (w.r.t.
// the pre-softcap score), both [mq, lds]. dS before the softcap factor is
// added into dbias_rows if given.
template <typename Acc, typename Bwd>
void tile_grad(const AttnParams& p, const TilePlan& plan, const HeadCtx<Acc>& ctx, const QueryBlock<Acc>& qb,
               const Bwd& bwd, const StepTiles<Acc>& tiles, const KeySpan& ks, void* dbias_rows) {
  const int64_t j0 = ks.j0 + ks.a, nj = ks.w, a = ks.a;
  const bool partial = ks.partial;
  Acc *s = tiles.s, *dp = tiles.dp, *t = tiles.t;
  const Acc *kt = tiles.kt, *vt = tiles.vt;
  const int64_t lds = round_up(nj, kPad), ld = plan.bk_ld;
  // The step's bias and mask strips arrive during its two products. Asked
  // for a query block ahead, over a whole key group, they overfilled the
  // L2 sets that rows a power of two apart fall in (tuning table: bias and
  // mask prefetch).
  if (p.bias.data || p.mask.data) ctx.prefetch_inputs(qb.i0, qb.mq, j0, nj);
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
    if constexpr (Bwd::kPairs)
      if (r % 2 == 1 || r + 1 == qb.mq) bwd.pair_rows(plan, qb, r / 2, lds, tiles);
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
