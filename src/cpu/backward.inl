// Backward in three named phases, as in FlashAttention-2:
//   compute_delta   delta_i = rowsum(dout_i * out_i)          task: (b, h, query block)
//   backward_keys   dK, dV for a key block, summed over the     task: (b, kv head, key block)
//                   query heads of its group; each task owns its rows, no atomics
//   backward_dq     dQ for a query block (and dbias rows)       task: (b, h, query block)
// Scores are recomputed per tile from lse: P = exp(S - lse).
// When there are enough (batch, K/V head) pairs to occupy the threads, the
// last two phases fuse (TilePlan::fused, backward_fused): the dK/dV walk also
// adds dS K into a dQ accumulator, 5 tile products per tile pair instead of 7,
// and meets each query block with TilePlan::key_group key blocks in turn.
// Both forms add the same dS K tiles to dQ in the same key order, so their
// results are bitwise identical and the choice may depend on the thread count.
// A call with a single (batch, K/V head) pair (MQA at batch 1), which
// would leave all threads but one to the two-pass form, cuts its keys into
// TilePlan::key_chunks runs instead, one single-pass task per run with a
// dQ partial of its own, summed in run order at the end: a choice made from
// the shapes alone, since those sums round differently from the two forms'.

#include "backward_step.inl"
#include "backward_dq_sums.inl"

// sum_c o[c] g[c] over n elements (strides os, gs), in Acc. Contiguous f32
// rows sum in kLanes lanes with FMAs, then across the lanes: the scalar
// chain, one add waiting on the last, took 4.4% of a bf16 backward's
// samples at L = 512 (d = 64, causal, 1 thread).
template <typename Acc, typename O, typename T>
Acc row_dot(const O* o, int64_t os, const T* g, int64_t gs, int64_t n) {
  Acc acc = 0;
  int64_t c = 0;
  if constexpr (kVecGemm && std::is_same<Acc, float>::value && !std::is_same<T, double>::value) {
    if (os == 1 && gs == 1 && n >= kLanes) {
      VecF v = vzero();
      for (; c + kLanes <= n; c += kLanes) v = vfma(vload_as(o + c), vload_as(g + c), v);
      acc = vreduce_add(v);
    }
  }
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

// A dK/dV task's key block: keys [j0, j0 + nj) of batch b's K/V head hk
// (k0: the first one's row in K), the step's tiles, K row-major (k, for
// dQ += dS K), the dK and dV accumulators and tmp (staging), all in the
// thread's workspace.
template <typename Acc>
struct KeyBlock {
  int64_t b, hk, j0, nj, k0;
  Acc *kt, *vt, *s, *dp, *t, *k, *dk, *dv, *tmp;
  StepTiles<Acc> step() const { return StepTiles<Acc>{kt, vt, s, dp, t}; }
};

// Loads the key block as the products read it (with K row-major where
// with_k) and zeroes its accumulators: dK [nj, dqk_pad] and dV [nj,
// dv_pad], or with pair products dK^T and dV^T [pad, bk_pad].
template <typename T, typename Acc, typename Bwd>
void load_key_block(const AttnParams& p, const TilePlan& plan, const KeyBlock<Acc>& kb, const Bwd& bwd,
                    bool with_k) {
  const int64_t ldq = plan.dqk_pad, ldv = plan.dv_pad, b = kb.b, hk = kb.hk, nj = kb.nj, k0 = kb.k0;
  Acc *kt = kb.kt, *vt = kb.vt, *k = kb.k, *dk = kb.dk, *dv = kb.dv, *tmp = kb.tmp;
  int64_t dk_n = nj * ldq, dv_n = nj * ldv;
  if constexpr (Bwd::kPairs) {
    bwd.load_kv(p, plan, b, k0, hk, nj, kt, vt, with_k ? k : nullptr, tmp);
    dk_n = ldq * plan.bk_pad;
    dv_n = ldv * plan.bk_pad;
  } else {
    if (with_k) {  // K row-major for dQ += dS K, and its transpose for S = Q K^T
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
}

// The key block's dK = scale dS^T Q and dV (times dropout's 1 / (1 - p))
// into dk and dv, pair products' transposed accumulators back to rows first.
template <typename T, typename Acc, typename Bwd>
void store_key_block(const AttnParams& p, const TilePlan& plan, const KeyBlock<Acc>& kb) {
  const int64_t ldq = plan.dqk_pad, ldv = plan.dv_pad, b = kb.b, hk = kb.hk, k0 = kb.k0;
  // Pair products' accumulators go back to rows in tmp, one at a time.
  const auto rows = [&](Acc* acc, int64_t ld) -> const Acc* {
    if constexpr (Bwd::kPairs) {
      transpose(ld, plan.bk_pad, acc, plan.bk_pad, kb.tmp, ld);
      return kb.tmp;
    } else {
      return acc;
    }
  };
  const Acc* dk = rows(kb.dk, ldq);
  for (int64_t r = 0; r < kb.nj; ++r)  // dK = scale dS^T Q
    store_result<T>(p.grad_dtype, dk + r * ldq, p.head_dim, p.dk.data, row_offset(p.dk, b, k0 + r, hk),
                    p.dk.dim_stride, static_cast<Acc>(p.scale));
  const Acc* dv = rows(kb.dv, ldv);
  for (int64_t r = 0; r < kb.nj; ++r)
    store_result<T>(p.grad_dtype, dv + r * ldv, p.head_dim_v, p.dv.data, row_offset(p.dv, b, k0 + r, hk),
                    p.dv.dim_stride, dropout_scale<Acc>(p));
}

// Key block kblk of (b, hk) in workspace slot x of TilePlan::key_group.
template <typename Acc>
KeyBlock<Acc> key_block(const AttnParams& p, const TilePlan& plan, Slice<Acc> ws, int64_t b, int64_t hk,
                        int64_t kblk, int64_t x) {
  const int64_t j0 = kblk * plan.block_k, nj = std::min(plan.block_k, p.len_k(b) - j0), o = x * plan.bwd.key_slot;
  const auto& L = plan.bwd;
  return KeyBlock<Acc>{b,           hk,          j0,         nj,          p.k_start(b) + j0,
                       ws.at(L.kt + o), ws.at(L.vt + o), ws.at(L.s), ws.at(L.dp), ws.at(L.t),
                       ws.at(L.k + o),  ws.at(L.acc_a + o), ws.at(L.acc_b + o), ws.at(L.tmp)};
}

// One query block's step against key block kb: dV += P^T dO and dK += dS^T
// Q over the keys it sees and, into dq_rows (row stride ld) when given,
// dQ += dS K.
template <typename Acc, typename Bwd>
void key_step(const AttnParams& p, const TilePlan& plan, const HeadCtx<Acc>& ctx, const QueryBlock<Acc>& qb,
              const KeyBlock<Acc>& kb, TileKind kind, Bwd& bwd, Acc* dq_rows, int64_t ld) {
  const int64_t ldq = plan.dqk_pad, ldv = plan.dv_pad;
  Acc *s = kb.s, *dp = kb.dp, *tmp = kb.tmp;
  const KeySpan ks = seen_keys(qb, kb.j0, kb.nj, kind);
  StepTiles<Acc> step = kb.step();
  step.dq = dq_rows != nullptr;
  tile_grad(p, plan, ctx, qb, bwd, step, ks, nullptr);
  if constexpr (Bwd::kPairs) {
    bwd.dk_dv(plan, qb, ks.a, round_up(ks.w, kPad), kb.dk, kb.dv);
  } else {
    gemm_nn_acc(ks.w, ldv, qb.mq, s, 1, plan.bk_ld, qb.dout, ldv, kb.dv + ks.a * ldv, ldv, nullptr, tmp);
    gemm_nn_acc(ks.w, ldq, qb.mq, dp, 1, plan.bk_ld, qb.q, ldq, kb.dk + ks.a * ldq, ldq, nullptr, tmp);
  }
  if (!dq_rows) return;
  if constexpr (Bwd::kPairs)
    bwd.dq(plan, qb, ks.a, round_up(ks.w, kPad), dp, kb.k, dq_rows, ld);
  else
    gemm_nn_acc(qb.mq, ldq, ks.w, dp, plan.bk_ld, 1, kb.k + ks.a * ldq, ldq, dq_rows, ld, nullptr, tmp);
}

// dK and dV of key blocks [kb0, kb0 + n) of (b, hk), n <= TilePlan::key_group,
// summed over the query heads of the group; dq_sums, when given (the single
// pass), receives dS K for every query row of the group. Each query block
// meets the n key blocks in turn, so that its q, dO and dQ rows are loaded
// once for all of them; every dK, dV and dQ sum still adds its terms in
// the order of one key block at a time (heads, then query blocks; keys in
// order), so the results do not depend on n.
template <typename T, typename Acc, typename Bwd>
void backward_keys(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t hk, int64_t kb0, int64_t n,
                   const Acc* delta_all, Slice<Acc> ws, Bwd& bwd, GroupDq<Acc>* dq_sums = nullptr) {
  FG_DASSERT(n >= 1 && n <= plan.key_group && n <= kMaxKeyGroup);
  const int64_t group = p.heads_q / p.heads_kv;
  const auto& L = plan.bwd;
  KeyBlock<Acc> kbs[kMaxKeyGroup];
  int64_t m = 0, first = p.seqlen_q, last = -1;
  for (; m < n && (kb0 + m) * plan.block_k < p.len_k(b); ++m) {
    kbs[m] = key_block(p, plan, ws, b, hk, kb0 + m, m);
    load_key_block<T>(p, plan, kbs[m], bwd, dq_sums != nullptr);
    // Only the query blocks whose causal and window ranges can reach the
    // key blocks (the same for every head), so that a narrow window's work
    // does not grow with the sequence's length.
    int64_t f = 0, l = 0;
    HeadCtx<Acc>(p, b, hk * group).rows_seeing(kbs[m].j0, kbs[m].nj, f, l);
    first = std::min(first, f), last = std::max(last, l);
  }
  if (m == 0) return;
  first = first / plan.block_q * plan.block_q;
  // The single pass keeps the group's query blocks as pairs (held_q) up to its slots.
  const auto slot_of = [&](int64_t hq, int64_t iq) {
    const int64_t x = (hq - hk * group) * ceil_div(p.seqlen_q, plan.block_q) + iq / plan.block_q;
    return dq_sums && x < L.held_slots ? x : int64_t{-1};
  };
  uint8_t* ready = reinterpret_cast<uint8_t*>(ws.at(L.held_ready));
  TileKind kinds[kMaxKeyGroup];
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    const HeadCtx<Acc> ctx(p, b, h);
    for (int64_t i0 = first; i0 <= last; i0 += plan.block_q) {
      QueryBlock<Acc> qb = query_block_buffers(plan, ws, i0, std::min(plan.block_q, ctx.lq - i0));
      row_ranges(ctx, qb);
      bool any = false;
      for (int64_t x = 0; x < m; ++x) {
        kinds[x] = ctx.classify(qb.mq, qb.lo, qb.hi, kbs[x].j0, kbs[x].nj);
        any = any || kinds[x] != TileKind::skip;
      }
      if (!any) continue;
      load_query_block<T>(p, plan, ctx, delta_all, qb, !Bwd::kPairs);
      if constexpr (Bwd::kPairs) {
        const int64_t x = slot_of(h, i0);
        bwd.load_q(p, plan, ctx, qb, true, kbs[0].tmp, x >= 0 ? ws.at(L.held_q) + x * L.held_slot : nullptr,
                   x >= 0 && ready[x]);
        if (x >= 0) ready[x] = 1;
      }
      // The next query block's rows (or the next head's first) into L2 while
      // this one computes, unless they are held as pairs.
      const int64_t hn = i0 + plan.block_q <= last ? h : h + 1, in = hn == h ? i0 + plan.block_q : first;
      const int64_t xn = hn < (hk + 1) * group ? slot_of(hn, in) : -1;
      if (xn >= 0 && ready[xn]) {
        const char* next = reinterpret_cast<const char*>(ws.at(L.held_q) + xn * L.held_slot);
        for (int64_t at = 0; at < L.held_slot * static_cast<int64_t>(sizeof(Acc)); at += 64) prefetch_l2(next + at);
      } else if (hn < (hk + 1) * group) {
        const int64_t mn = std::min(plan.block_q, p.len_q(b) - in), qn = p.q_start(b) + in;
        prefetch_rows<T>(p.q, b, qn, hn, mn, p.head_dim);
        prefetch_rows<T>(p.dout, b, qn, hn, mn, p.head_dim_v);
      }
      const int64_t g = h - hk * group;
      int64_t ld = 0;
      Acc* dq_rows = dq_sums ? dq_sums->open(g, i0, qb.mq, &ld) : nullptr;
      for (int64_t x = 0; x < m; ++x)
        if (kinds[x] != TileKind::skip) key_step(p, plan, ctx, qb, kbs[x], kinds[x], bwd, dq_rows, ld);
      if (dq_sums) dq_sums->close(g, i0, qb.mq);
    }
  }
  for (int64_t x = 0; x < m; ++x) store_key_block<T, Acc, Bwd>(p, plan, kbs[x]);
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
    tile_grad(p, plan, ctx, qb, bwd, StepTiles<Acc>{kt, vt, s, dp, t, false, true}, ks, dbias_rows);
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
// order and keeps the group's dQ sums (GroupDq) to itself, so every output
// has one owner and one summation order, whatever the thread count. With
// key runs (part: the run's dQ partial [group, seqlen_q, dqk_pad]) it walks
// key blocks [kb0, kb1) into part, which dq_from_runs then sums and stores.
template <typename T, typename Acc, typename Bwd>
void backward_fused(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t hk, const Acc* delta_all,
                    Slice<Acc> ws, Bwd& bwd, int64_t kb0 = 0, int64_t kb1 = -1, Acc* part = nullptr) {
  GroupDq<Acc> dq(p, plan, b, hk, ws, part);
  dq.zero();
  std::memset(ws.at(plan.bwd.held_ready), 0, static_cast<size_t>(plan.bwd.held_slots));
  const int64_t k_end = kb1 < 0 ? ceil_div(p.len_k(b), plan.block_k) : kb1;
  for (int64_t kblk = kb0; kblk < k_end; kblk += plan.key_group)
    backward_keys<T, Acc>(p, plan, b, hk, kblk, std::min(plan.key_group, k_end - kblk), delta_all, ws, bwd, &dq);
  if (!part) dq.template finish<T>();
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
      backward_keys<T, Acc>(p, plan, b, hk, task % nkb, 1, delta, ws, bwd);
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
