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

// Everything the tile step needs about one query block.
template <typename Acc>
struct QueryBlock {
  int64_t i0, mq;
  Acc *q, *dout, *lse, *delta;  // q pre-scaled by softmax_scale
  int64_t *lo, *hi;
};

template <typename T, typename Acc>
void load_query_block(const AttnParams& p, const TilePlan& plan, const HeadCtx<Acc>& ctx,
                      const Acc* delta_all, QueryBlock<Acc>& qb) {
  const int64_t q0 = p.q_start(ctx.b) + qb.i0;
  load_tile<T>(p.q, ctx.b, q0, ctx.h, qb.mq, p.head_dim, plan.dqk_pad, qb.q, static_cast<Acc>(p.scale));
  load_tile<T>(p.dout, ctx.b, q0, ctx.h, qb.mq, p.head_dim_v, plan.dv_pad, qb.dout);
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

// How a task recomputes S = scale q k^T: as the forward that made lse
// computed it, so that S - lse <= 0 holds bit for bit. F32Scores: f32
// tiles of the pre-scaled q (every path's forward but amx's bf16 one); the
// K^T tile kt [d, bk_pad] is the caller's.
template <typename T, typename Acc>
struct F32Scores {
  F32Scores(const TilePlan&, Slice<Acc>) {}
  static constexpr bool kOwnKt = false;  // kt is loaded by the caller
  void load_q(const AttnParams&, const TilePlan&, const HeadCtx<Acc>&, const QueryBlock<Acc>&) {}
  void load_kt(const AttnParams&, const TilePlan&, int64_t, int64_t, int64_t, int64_t, Acc*, Acc*) {}
  // s [mq, lds] (row stride bk_ld) from the keys at columns a.. of kt.
  void qk(const AttnParams& p, const TilePlan& plan, const QueryBlock<Acc>& qb, const Acc* kt, int64_t a,
          int64_t lds, Acc* s) const {
    gemm_nn(qb.mq, lds, p.head_dim, qb.q, plan.dqk_pad, 1, kt + a, plan.bk_ld, s, plan.bk_ld);
  }
};

#if FG_AMX
// bf16 on the amx path: S on AMX tiles from q and K as bf16 pairs, the
// scale applied after, exactly as AmxTiles' forward computes it (a score
// depends only on its q row, its key and the fixed 16-pair steps). kt then
// holds K^T as pairs [dqk_pad / 2, bk_ld].
struct AmxScores {
  uint32_t* qp;
  explicit AmxScores(const TilePlan& plan, Slice<float> ws)
      : qp(reinterpret_cast<uint32_t*>(ws.at(plan.bwd.q_pairs))) {
    amx_configure();
  }
  ~AmxScores() { _tile_release(); }
  AmxScores(const AmxScores&) = delete;
  AmxScores& operator=(const AmxScores&) = delete;
  static constexpr bool kOwnKt = true;
  void load_q(const AttnParams& p, const TilePlan& plan, const HeadCtx<float>& ctx, const QueryBlock<float>& qb) {
    const int64_t dp = plan.dqk_pad / 2, q0 = p.q_start(ctx.b) + qb.i0;
    for (int64_t r = 0; r < qb.mq; ++r) Bf16DotTiles::load_pairs(p.q, ctx.b, q0 + r, ctx.h, p.head_dim, dp, qp + r * dp);
  }
  // Keys [seq0, seq0 + nj) of head hk as K^T pairs into kt, staged in stage ([bk_pad, dqk_pad / 2]).
  void load_kt(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t seq0, int64_t hk, int64_t nj,
               float* kt, float* stage) {
    const int64_t dp = plan.dqk_pad / 2;
    auto* st = reinterpret_cast<uint32_t*>(stage);
    for (int64_t r = 0; r < nj; ++r) Bf16DotTiles::load_pairs(p.k, b, seq0 + r, hk, p.head_dim, dp, st + r * dp);
    std::memset(st + nj * dp, 0, static_cast<size_t>((plan.bk_pad - nj) * dp) * 4);
    transpose(plan.bk_pad, dp, stage, dp, kt, plan.bk_ld);
  }
  void qk(const AttnParams& p, const TilePlan& plan, const QueryBlock<float>& qb, const float* kt, int64_t a,
          int64_t lds, float* s) const {
    const int64_t dp = plan.dqk_pad / 2, ld = plan.bk_ld;
    gemm_amx(qb.mq, lds, dp, qp, dp, reinterpret_cast<const uint32_t*>(kt) + a, ld, s, ld);
    const float scale = static_cast<float>(p.scale);
    for (int64_t r = 0; r < qb.mq; ++r)
      for (int64_t c = 0; c < lds; ++c) s[r * ld + c] *= scale;
  }
};
#endif

// One (query block, key block) step over the block's keys [j0, j0 + nj),
// lds = round_up(nj, kPad) columns. In: qb, kt [d, lds], vt [dv, lds].
// Out: s = dropout(P) and dp = dS (w.r.t. the pre-softcap score), both
// [mq, lds]. All four have row stride bk_ld. dS before the softcap factor
// is added into dbias_rows if given. The keys start at column a of kt and vt.
template <typename Acc, typename Scores>
void tile_grad(const AttnParams& p, const TilePlan& plan, const HeadCtx<Acc>& ctx,
               const QueryBlock<Acc>& qb, int64_t j0, int64_t nj, bool partial, const Scores& scores,
               const Acc* kt, const Acc* vt, int64_t a, Acc* s, Acc* dp, Acc* t, void* dbias_rows) {
  const int64_t lds = round_up(nj, kPad), ld = plan.bk_ld;
  scores.qk(p, plan, qb, kt, a, lds, s);
  vt += a;
  gemm_nn(qb.mq, lds, p.head_dim_v, qb.dout, plan.dv_pad, 1, vt, ld, dp, ld);
  const bool capped = ctx.softcap > 0;
  const Acc inv_keep = static_cast<Acc>(1.0 / (1.0 - p.dropout_p));
  uint8_t keep[kMaxBlockK];
  for (int64_t r = 0; r < qb.mq; ++r) {
    Acc *srow = s + r * ld, *dprow = dp + r * ld, *trow = t + r * ld;
    ctx.logits_row(qb.i0 + r, j0, nj, qb.lo[r], qb.hi[r], partial, srow, capped ? trow : nullptr);
    for (int64_t jj = nj; jj < lds; ++jj) srow[jj] = neg_inf<Acc>();
    if (ctx.rng.active) {
      // dP of the dropped-out P is dP * z, z = keep / (1 - p); P stays undropped in dS.
      ctx.rng.keep_row(qb.i0 + r, j0, nj, keep);
      keep_row(keep, nj, inv_keep, dprow);
      grad_row(srow, dprow, lds, qb.lse[r], qb.delta[r]);
      keep_row(keep, nj, inv_keep, srow);
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
    Acc acc = 0;
    for (int64_t c = 0; c < p.head_dim_v; ++c)
      acc += static_cast<Acc>(to_float(orow[c * p.out.dim_stride])) *
             static_cast<Acc>(to_float(grow[c * p.dout.dim_stride]));
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
template <typename T, typename Acc, typename Scores>
void backward_dkdv(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t hk, int64_t kblk,
                   const Acc* delta_all, Slice<Acc> ws, Scores& scores, Acc* dq_acc = nullptr) {
  const int64_t lk = p.len_k(b), j0 = kblk * plan.block_k;
  if (j0 >= lk) return;
  const int64_t nj = std::min(plan.block_k, lk - j0), k0 = p.k_start(b) + j0;
  const int64_t ldq = plan.dqk_pad, ldv = plan.dv_pad;
  const auto& L = plan.bwd;
  Acc *kt = ws.at(L.kt), *vt = ws.at(L.vt), *s = ws.at(L.s), *dp = ws.at(L.dp), *t = ws.at(L.t);
  Acc *dk = ws.at(L.acc_a), *dv = ws.at(L.acc_b), *tmp = ws.at(L.tmp), *k = ws.at(L.k);
  if (Scores::kOwnKt) scores.load_kt(p, plan, b, k0, hk, nj, kt, tmp);
  if (dq_acc) {  // K row-major for dQ += dS K, and its transpose for S = Q K^T
    load_tile<T>(p.k, b, k0, hk, nj, p.head_dim, ldq, k);
    for (int64_t x = nj * ldq; x < plan.bk_pad * ldq; ++x) k[x] = Acc(0);
    if (!Scores::kOwnKt) transpose(plan.bk_pad, ldq, k, ldq, kt, plan.bk_ld);
  } else if (!Scores::kOwnKt) {
    load_tile_t<T>(p.k, b, k0, hk, nj, p.head_dim, plan.bk_pad, plan.bk_ld, kt, tmp);
  }
  load_tile_t<T>(p.v, b, k0, hk, nj, p.head_dim_v, plan.bk_pad, plan.bk_ld, vt, tmp);
  for (int64_t x = 0; x < nj * ldq; ++x) dk[x] = Acc(0);
  for (int64_t x = 0; x < nj * ldv; ++x) dv[x] = Acc(0);

  const int64_t group = p.heads_q / p.heads_kv;
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const HeadCtx<Acc> ctx(p, b, h);
    for (int64_t i0 = 0; i0 < ctx.lq; i0 += plan.block_q) {
      QueryBlock<Acc> qb = query_block_buffers(plan, ws, i0, std::min(plan.block_q, ctx.lq - i0));
      row_ranges(ctx, qb);
      const TileKind kind = ctx.classify(qb.mq, qb.lo, qb.hi, j0, nj);
      if (kind == TileKind::skip) continue;
      load_query_block<T>(p, plan, ctx, delta_all, qb);
      scores.load_q(p, plan, ctx, qb);
      // The next query block's rows (or the next head's first) into L2 while this one computes.
      const int64_t hn = i0 + plan.block_q < ctx.lq ? h : h + 1, in = hn == h ? i0 + plan.block_q : 0;
      if (hn < (hk + 1) * group) {
        const int64_t mn = std::min(plan.block_q, p.len_q(b) - in), qn = p.q_start(b) + in;
        prefetch_rows<T>(p.q, b, qn, hn, mn, p.head_dim);
        prefetch_rows<T>(p.dout, b, qn, hn, mn, p.head_dim_v);
      }
      const KeySpan ks = seen_keys(qb, j0, nj, kind);
      tile_grad(p, plan, ctx, qb, j0 + ks.a, ks.w, kind == TileKind::partial, scores, kt, vt, ks.a, s, dp, t,
                nullptr);
      // dV += P^T dO, dK += dS^T (scale Q) over the seen keys' rows
      gemm_nn_acc(ks.w, ldv, qb.mq, s, 1, plan.bk_ld, qb.dout, ldv, dv + ks.a * ldv, ldv, nullptr, tmp);
      gemm_nn_acc(ks.w, ldq, qb.mq, dp, 1, plan.bk_ld, qb.q, ldq, dk + ks.a * ldq, ldq, nullptr, tmp);
      if (dq_acc) {
        gemm_nn_acc(qb.mq, ldq, ks.w, dp, plan.bk_ld, 1, k + ks.a * ldq, ldq,  // dQ += dS K
                    dq_acc + ((h - hk * group) * p.seqlen_q + i0) * ldq, ldq, nullptr, tmp);
      }
    }
  }
  for (int64_t r = 0; r < nj; ++r) {
    store_result<T>(p.grad_dtype, dk + r * ldq, p.head_dim, p.dk.data, row_offset(p.dk, b, k0 + r, hk),
                    p.dk.dim_stride, Acc(1));
    store_result<T>(p.grad_dtype, dv + r * ldv, p.head_dim_v, p.dv.data, row_offset(p.dv, b, k0 + r, hk),
                    p.dv.dim_stride, Acc(1));
  }
}

template <typename T, typename Acc, typename Scores>
void backward_dq(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t h, int64_t qblk,
                 const Acc* delta_all, Slice<Acc> ws, Scores& scores) {
  const HeadCtx<Acc> ctx(p, b, h);
  const int64_t i0 = qblk * plan.block_q;
  if (i0 >= ctx.lq) return;
  QueryBlock<Acc> qb = query_block_buffers(plan, ws, i0, std::min(plan.block_q, ctx.lq - i0));
  const int64_t ldq = plan.dqk_pad, lds = plan.bk_pad, ld = plan.bk_ld;
  const auto& L = plan.bwd;
  Acc *k = ws.at(L.k), *kt = ws.at(L.kt), *vt = ws.at(L.vt), *s = ws.at(L.s), *dp = ws.at(L.dp);
  Acc *t = ws.at(L.t), *dq = ws.at(L.acc_a), *tmp = ws.at(L.tmp);
  row_ranges(ctx, qb);
  load_query_block<T>(p, plan, ctx, delta_all, qb);
  scores.load_q(p, plan, ctx, qb);
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
    // K once, row-major for dQ += dS K; its transpose for S = Q K^T.
    if (Scores::kOwnKt) scores.load_kt(p, plan, b, k0 + j0, ctx.hk, nj, kt, tmp);
    load_tile<T>(p.k, b, k0 + j0, ctx.hk, nj, p.head_dim, ldq, k);
    for (int64_t x = nj * ldq; x < lds * ldq; ++x) k[x] = Acc(0);
    if (!Scores::kOwnKt) transpose(lds, ldq, k, ldq, kt, ld);
    load_tile_t<T>(p.v, b, k0 + j0, ctx.hk, nj, p.head_dim_v, lds, ld, vt, tmp);
    const KeySpan ks = seen_keys(qb, j0, nj, kind);
    tile_grad(p, plan, ctx, qb, j0 + ks.a, ks.w, kind == TileKind::partial, scores, kt, vt, ks.a, s, dp, t,
              dbias_rows);
    gemm_nn_acc(qb.mq, ldq, ks.w, dp, ld, 1, k + ks.a * ldq, ldq, dq, ldq, nullptr, tmp);  // dQ += dS K
  }
  const int64_t q0 = p.q_start(b);
  for (int64_t r = 0; r < qb.mq; ++r)
    store_result<T>(p.grad_dtype, dq + r * ldq, p.head_dim, p.dq.data, row_offset(p.dq, b, q0 + i0 + r, h),
                    p.dq.dim_stride, static_cast<Acc>(p.scale));
}

// The single pass: one task per (batch, K/V head) walks its key blocks in
// order and keeps the group's dQ in its own f32 accumulator, so every output
// has one owner and one summation order, whatever the thread count.
template <typename T, typename Acc, typename Scores>
void backward_fused(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t hk, const Acc* delta_all,
                    Slice<Acc> ws, Scores& scores) {
  const int64_t group = p.heads_q / p.heads_kv, ldq = plan.dqk_pad;
  Acc* dq_acc = ws.at(plan.bwd.dq_acc);
  for (int64_t x = 0; x < group * p.seqlen_q * ldq; ++x) dq_acc[x] = Acc(0);
  for (int64_t kblk = 0; kblk < ceil_div(p.len_k(b), plan.block_k); ++kblk)
    backward_dkdv<T, Acc>(p, plan, b, hk, kblk, delta_all, ws, scores, dq_acc);
  const int64_t q0 = p.q_start(b);
  for (int64_t g = 0; g < group; ++g)
    for (int64_t i = 0; i < p.len_q(b); ++i)
      store_result<T>(p.grad_dtype, dq_acc + (g * p.seqlen_q + i) * ldq, p.head_dim, p.dq.data,
                      row_offset(p.dq, b, q0 + i, hk * group + g), p.dq.dim_stride, static_cast<Acc>(p.scale));
}

template <typename T, typename Acc, typename Scores = F32Scores<T, Acc>>
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
  if (plan.fused) {
    parallel_for(p.batch * p.heads_kv, plan.threads, [&](int64_t task, int thread) {
      const Slice<Acc> ws{base + thread * per_thread};
      Scores scores(plan, ws);
      backward_fused<T, Acc>(p, plan, task / p.heads_kv, task % p.heads_kv, delta, ws, scores);
    });
  } else {
    parallel_for(p.batch * p.heads_kv * nkb, plan.threads, [&](int64_t task, int thread) {
      const int64_t b = task / nkb / p.heads_kv, hk = task / nkb % p.heads_kv;
      const Slice<Acc> ws{base + thread * per_thread};
      Scores scores(plan, ws);
      backward_dkdv<T, Acc>(p, plan, b, hk, task % nkb, delta, ws, scores);
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
      Scores scores(plan, ws);
      for (int64_t b = nb == p.batch ? gb : 0; b < b_end; ++b)
        for (int64_t h = nh == p.heads_q ? gh : 0; h < h_end; ++h)
          backward_dq<T, Acc>(p, plan, b, h, qblk, delta, ws, scores);
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
