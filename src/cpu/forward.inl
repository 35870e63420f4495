// Forward: one task per (batch, K/V head, query block, key split). A task's
// tile stacks the same query rows of every query head of the K/V head's group,
// so each K/V tile is loaded once per group. Keys are visited in blocks with
// an online softmax, so no seqlen_q x seqlen_k buffer exists. Short queries
// split the keys (TilePlan::splits) and merge the splits' (out, lse) with
// merge_row in split order. The tile products and their layouts are the
// Tiles policy's: AccTiles everywhere, Bf16DotTiles for bf16 on AVX512_BF16
// (the calls dot_call takes), AmxTiles for bf16 on AMX-BF16 (with narrow
// tiles of its own).

// The smallest page size: the hardware prefetchers stop at its boundaries,
// so rows this far apart each start a stream of their own.
constexpr int64_t kPageBytes = 4096;

template <typename Acc>
struct Slice {
  Acc* base;
  Acc* at(int64_t off) const { return base + off; }
  int64_t* idx(int64_t off) const { return reinterpret_cast<int64_t*>(base + off); }
};

// Loads rows [r0, r0 + n) of head h of operand o, times mul, as a row-major [n, pad] tile.
template <typename T, typename Acc>
void load_tile(const Operand& o, int64_t b, int64_t seq0, int64_t h, int64_t n, int64_t dim,
               int64_t pad, Acc* dst, Acc mul = Acc(1)) {
  const T* base = static_cast<const T*>(o.data);
  for (int64_t r = 0; r < n; ++r)
    load_row(base + row_offset(o, b, seq0 + r, h), o.dim_stride, dim, pad, dst + r * pad, mul);
}

// Rows [seq0, seq0 + n) of head h of o (dim elements each) into L2, one tile
// ahead of their loads. In [batch, seq, heads, dim] layouts each row of a
// head starts a new 4 KiB page at d = 128, where the hardware prefetchers
// stop, so without this the loads waited on L3.
template <typename T>
void prefetch_rows(const Operand& o, int64_t b, int64_t seq0, int64_t h, int64_t n, int64_t dim) {
  if (o.dim_stride != 1) return;
  const char* base = reinterpret_cast<const char*>(static_cast<const T*>(o.data));
  const int64_t bytes = dim * static_cast<int64_t>(sizeof(T));
  for (int64_t r = 0; r < n; ++r) {
    const char* row = base + row_offset(o, b, seq0 + r, h) * static_cast<int64_t>(sizeof(T));
    for (int64_t x = 0; x < bytes; x += 64) prefetch_l2(row + x);
  }
}

// How many rows ahead a task's Q load (bf16 pairs) and its out store ask
// for the lines they read or write: their misses had 36% and 35% of
// forward_task's own samples in a causal bf16 forward (L = 2048, d = 128;
// tuning table: kRowsAhead).
constexpr int64_t kRowsAhead = 16;

// Loads the same rows transposed: dst[c * ld + r] for c < round_up(dim, kPad),
// r < w (<= ld), zero where r >= n or c >= dim. Contiguous rows needing no padding
// are converted and transposed in register blocks straight from their place;
// the others, and the last n mod kTransposeBlock rows, are staged
// contiguously in stage ([w, round_up(dim, kPad)]) first, where scattered
// strided stores were slower (tuning table: load_tile_t).
template <typename T, typename Acc>
void load_tile_t(const Operand& o, int64_t b, int64_t seq0, int64_t h, int64_t n, int64_t dim,
                 int64_t w, int64_t ld, Acc* dst, Acc* stage) {
  const int64_t pad = round_up(dim, kPad);
  int64_t r0 = 0;
#if FG_VEC_GEMM
  if constexpr (std::is_same<Acc, float>::value) {
    if (o.dim_stride == 1 && dim == pad) {
      r0 = n / kTransposeBlock * kTransposeBlock;
      transpose_cvt(r0, pad, static_cast<const T*>(o.data) + row_offset(o, b, seq0, h), o.seq_stride, dst, ld);
    }
  }
#endif
  load_tile<T>(o, b, seq0 + r0, h, n - r0, dim, pad, stage);
  for (int64_t x = (n - r0) * pad; x < (w - r0) * pad; ++x) stage[x] = Acc(0);
  transpose(w - r0, pad, stage, pad, dst + r0, ld);
}

// The forward's two tile products and the tile layouts they read, in Acc
// (every ISA and dtype): S = scale (Q K^T), the scale applied as each score
// is stored (ScoreScale), K^T staged as an Acc tile,
// both products in gemm_nn. V is staged too, except for query tiles of at
// most kInPlaceRows rows (decode), where P V reads contiguous V rows where
// they lie (tuning table: kInPlaceRows). Where the ISA sets kWholeRows
// (avx2), tiles of up to that many rows read both K and V in place, whole
// rows at a time (below).
constexpr int64_t kInPlaceRows = 2;

// f(std::integral_constant<int, mq>) for 1 <= mq <= 4.
template <typename F>
void with_rows(int64_t mq, F f) {
  if (mq == 1) return f(std::integral_constant<int, 1>{});
  if (mq == 2) return f(std::integral_constant<int, 2>{});
  if (mq == 3) return f(std::integral_constant<int, 3>{});
  return f(std::integral_constant<int, 4>{});
}

#include "forward_tiles.inl"
#include "forward_amx.inl"
#include "forward_paths.inl"
#include "forward_narrow.inl"
#include "forward_keys_major.inl"

// The tile routine a forward task runs: the one place the forward's path is
// chosen, from the call, the task's mq stacked rows of each of its nh K/V
// heads and the keys it walks (plan_forward's path is the first task's).
struct TaskPath {
  bool ranged = false;      ///< keys-major tiles may take tiles the ranges cut (ranges_exact)
  bool narrow = false;      ///< narrow tiles (narrow_usable), O^T kept
  bool keys_major = false;  ///< S^T = K Q^T tiles (narrow ones included)
  int64_t across = 0;       ///< heads per scores_heads call (heads_across), 0: none
  bool amx_narrow = false;  ///< AmxTiles::narrow
  bool heads_outer = false; ///< each K/V head through all its keys in turn
};

template <typename T, typename Acc, typename Tiles>
TaskPath task_path(const AttnParams& p, const TilePlan& plan, const Tiles& tiles, int64_t lk, int64_t mq,
                   int64_t keys, int64_t nh) {
  TaskPath t;
  t.ranged = ranges_exact(p, lk);
  t.narrow = t.ranged && narrow_usable<T, Acc, Tiles>(p, mq, keys);
  t.keys_major = t.narrow || keys_major_usable<T, Acc, Tiles>(p, mq);
  if constexpr (std::is_same<Tiles, AccTiles<T, Acc>>::value)
    if (!t.keys_major) t.across = heads_across(p, plan, tiles, nh, mq);
  if constexpr (kAmxTiles<Tiles>)
    t.amx_narrow = t.ranged && mq > kInPlaceRows && mq <= 2 * kLanes && plain_scores(p) && !p.mask.data;
  t.heads_outer = heads_outer(p, nh);
  (void)plan, (void)tiles;
  return t;
}

// The path of the call's first task: batch 0's first query block, its
// first key run (Plan::forward_path).
template <typename T, typename Acc, typename Tiles = AccTiles<T, Acc>>
ForwardChoice first_task_path(const AttnParams& p, const TilePlan& plan) {
  const int64_t lk = p.len_k(0), mq = plan.group * std::max<int64_t>(1, std::min(plan.head_rows, p.len_q(0)));
  const Tiles tiles(p, mq);
  const TaskPath t = task_path<T, Acc, Tiles>(p, plan, tiles, lk, mq, std::min(lk, plan.split_k), plan.kv_heads);
  ForwardChoice c;
  c.heads_outer = t.heads_outer;
  if constexpr (kAmxTiles<Tiles>) {
    c.path = t.amx_narrow ? ForwardPath::amx_narrow : ForwardPath::amx;
  } else if constexpr (kDotTiles<Tiles>) {
    c.path = t.narrow ? ForwardPath::narrow_dot : ForwardPath::dot_rows;
  } else {
    c.path = t.narrow       ? ForwardPath::narrow
             : t.keys_major ? ForwardPath::keys_major
             : t.across     ? ForwardPath::heads_across
             : tiles.k_in_place ? ForwardPath::whole_rows
                                : ForwardPath::rows;
  }
  return c;
}

template <typename T, typename Acc, typename Tiles>
void forward_task(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t hk0, int64_t qb, int64_t split,
                  Slice<Acc> ws, Slice<Acc> shared) {
  const int64_t lq = p.len_q(b), lk = p.len_k(b), nh = plan.kv_heads;
  const int64_t i0 = qb * plan.head_rows, mqh = std::min(plan.head_rows, lq - i0);
  if (mqh <= 0) return;  // an empty key range still finishes its rows: "no key"
  const int64_t k_lo = split * plan.split_k, k_hi = std::min(lk, k_lo + plan.split_k);
  const int64_t mq = plan.group * mqh;  // stacked rows of one K/V head
  const int64_t d = p.head_dim;
  const int64_t ldq = Tiles::q_ld(plan), ldv = plan.dv_pad, lds = plan.bk_pad;
  const int64_t ms = round_up(mq, kPad);  // stride of m, l and alpha per K/V head; columns of Q^T
  const int64_t mld = tile_ld(ms);   // row stride of Q^T and S^T
  const auto& L = plan.fwd;
  // Per K/V head x: its rows of q and o start at x * mq rows, of m, l and alpha at x * ms.
  Acc *q = ws.at(L.q), *qt = ws.at(L.qt), *kt = ws.at(L.kt), *v = ws.at(L.v), *s = ws.at(L.s), *o = ws.at(L.o);
  Acc *stage = ws.at(L.stage), *pv = ws.at(L.pv), *m = ws.at(L.row_m), *l = ws.at(L.row_l), *alpha = ws.at(L.row_alpha);
  int64_t *lo = ws.idx(L.row_lo), *hi = ws.idx(L.row_hi);
  Acc *lo_f = ws.at(L.row_lo_f), *hi_f = ws.at(L.row_hi_f), *pos_f = ws.at(L.row_pos_f), *slope_f = ws.at(L.row_slope_f);
  uint8_t keep[kMaxBlockK];
  Tiles tiles(p, mq);
  PairTileCache<Acc> cache(plan, ws, b, hk0, split, ceil_div(k_hi - k_lo, plan.block_k));
  const int64_t kt_elems = plan.dqk_pad / 2 * plan.bk_pad;

  std::vector<HeadCtx<Acc>> ctx;  // one per query head of the task
  ctx.reserve(static_cast<size_t>(nh * plan.group));
  const Acc scale = static_cast<Acc>(p.scale);
  for (int64_t x = 0; x < nh; ++x) {
    const Stack st{hk0 + x, plan.group, i0, mqh};
    for (int64_t g = 0; g < plan.group; ++g) {
      ctx.emplace_back(p, b, st.head(g * mqh));
      Tiles::load_q(p.q, b, p.q_start(b) + i0, st.head(g * mqh), mqh, d, ldq, scale, q + (x * mq + g * mqh) * ldq);
    }
  }
  if constexpr (kAmxTiles<Tiles>) tiles.scale_q(p, nh * mq, ldq, q);
  for (int64_t r = 0; r < mq; ++r) ctx[0].row_range(i0 + r % mqh, lo[r], hi[r]);  // the same for every head
  for (int64_t r = 0; r < nh * ms; ++r) {
    m[r] = neg_inf<Acc>();
    l[r] = Acc(0);
  }
  // Tiles the causal or window ranges cut take keys-major scores too
  // (ranges_exact). Narrow tiles keep O^T, so a task takes them only where
  // every tile can.
  const TaskPath path = task_path<T, Acc, Tiles>(p, plan, tiles, lk, mq, k_hi - k_lo, nh);
  const bool ranged = path.ranged, narrow = path.narrow, keys_major = path.keys_major;
  const bool keys_major_ranged = keys_major && ranged;
  const int64_t across = path.across;  // where no keys-major tile needs Q^T
  // Decode across heads (pv_heads, finish_row) touches only each head's mq
  // rows of o; zeroing all ms rows cost short decode calls (tuning table:
  // o_rows).
  const int64_t o_rows = across ? mq : ms;
  for (int64_t x = 0; x < nh; ++x) std::fill_n(o + x * ms * ldv, o_rows * ldv, Acc(0));
  if (across) {  // per group of across heads, qx [mq][d][kLanes] (scores_heads) in Q^T's space
    for (int64_t h0 = 0; h0 < nh; h0 += across)
      for (int64_t r = 0; r < mq; ++r)
        for (int64_t c = 0; c < d; ++c)
          for (int64_t x = 0; x < kLanes; ++x)
            qt[((h0 / across * mq + r) * d + c) * kLanes + x] = q[((h0 + x % across) * mq + r) * ldq + c];
  }
  const bool amx_narrow = path.amx_narrow;
  const int64_t amx_w = round_up(mq, kLanes);
  // Q^T per K/V head: [dqk_pad, ms] (row stride mld), or [dqk_pad, W] for narrow tiles.
  const int64_t qt_cols = narrow ? round_up(mq, kLanes) : ms, qt_ld = narrow ? qt_cols : mld;
  const int64_t q_cols = kDotTiles<Tiles> ? plan.dqk_pad / 2 : plan.dqk_pad;  // Q's columns: elements or pairs
  if (keys_major) {  // zero past row mq; 16-row blocks in registers
    const int64_t r0 = mq / 16 * 16;
    for (int64_t x = 0; x < nh; ++x) {
      transpose(r0, q_cols, q + x * mq * ldq, ldq, qt + x * q_cols * qt_ld, qt_ld);
      for (int64_t c = 0; c < q_cols; ++c)
        for (int64_t r = r0; r < qt_cols; ++r)
          qt[(x * q_cols + c) * qt_ld + r] = r < mq ? q[(x * mq + r) * ldq + c] : Acc(0);
    }
  }
  if (keys_major || amx_narrow) {
    for (int64_t r = 0; r < ms; ++r) {  // padding columns see no key
      lo_f[r] = r < mq ? static_cast<Acc>(std::min(lo[r], lk)) : Acc(1);
      hi_f[r] = r < mq ? static_cast<Acc>(std::max<int64_t>(hi[r], -1)) : Acc(0);
    }
  }
  const bool alibi_cols = keys_major && p.alibi, bias_cols = keys_major && p.bias.data,
             mask_cols = keys_major && p.mask.data, drop_cols = keys_major && ctx[0].rng.active;
  // Stacked row r of K/V head x (padding rows as the last real one): its
  // query head's context and its row i.
  const auto head_of = [&](int64_t x, int64_t r) -> const HeadCtx<Acc>& {
    return ctx[static_cast<size_t>(x * plan.group + std::min(r, mq - 1) / mqh)];
  };
  const auto row_of = [&](int64_t r) { return i0 + std::min(r, mq - 1) % mqh; };
  const char** brow = reinterpret_cast<const char**>(ws.idx(L.row_bias));
  const uint8_t** mrow = reinterpret_cast<const uint8_t**>(ws.idx(L.row_mask));
  uint32_t *drop_x = reinterpret_cast<uint32_t*>(ws.idx(L.row_drop_x)),
           *drop_bh = reinterpret_cast<uint32_t*>(ws.idx(L.row_drop_bh));
  for (int64_t x = 0; x < nh; ++x)
    for (int64_t r = 0; r < ms; ++r) {
      const HeadCtx<Acc>& c = head_of(x, r);
      if (alibi_cols) slope_f[x * ms + r] = r < mq ? c.slope : Acc(0);  // padding columns: slope 0
      if (bias_cols) brow[x * ms + r] = c.bias + row_of(r) * c.bias_rs * c.bias_es;
      if (mask_cols) mrow[x * ms + r] = c.mask + row_of(r) * c.mask_rs;
      if (drop_cols) drop_bh[x * ms + r] = c.rng.bh;
    }
  for (int64_t r = 0; r < ms; ++r) {
    if (alibi_cols) pos_f[r] = r < mq ? static_cast<Acc>(row_of(r) + ctx[0].shift) : Acc(0);
    if (drop_cols) drop_x[r] = static_cast<uint32_t>(ctx[0].rng.row0 + row_of(r));
  }
  // AmxTiles::narrow's Q^T per K/V head: [dqk_pad / 2, amx_w] pairs in memory order, zero past row mq.
  if (amx_narrow) {
    const int64_t dp = plan.dqk_pad / 2;
    for (int64_t x = 0; x < nh; ++x) {
      const auto* qw = reinterpret_cast<const uint32_t*>(q + x * mq * ldq);
      auto* dst = reinterpret_cast<uint32_t*>(qt) + x * dp * amx_w;
      for (int64_t c = 0; c < dp; ++c)
        for (int64_t r = 0; r < amx_w; ++r) {
          const uint32_t pr = r < mq ? qw[r * ldq + c] : 0u;
          dst[c * amx_w + r] = pr << 16 | pr >> 16;
        }
    }
  }

  // The next K/V tile is prefetched for tall tiles and bf16 decode, not for
  // f32 decode tiles, which it slowed (tuning table: next-tile prefetch).
  const bool prefetch = mq >= 32 || (mq <= kInPlaceRows && sizeof(T) == 2);
  const int64_t k0 = p.k_start(b);
  // Tiles every row sees whole go without classify's look at each row
  // (tuning table: full-tile test).
  int64_t lo_max = std::numeric_limits<int64_t>::min(), hi_min = std::numeric_limits<int64_t>::max();
  for (int64_t r = 0; r < mq; ++r) {
    lo_max = std::max(lo_max, lo[r]);
    hi_min = std::min(hi_min, hi[r]);
  }
  const auto every_row_sees = [&](int64_t j0, int64_t nj) {
    return !p.mask.data && lo_max <= j0 && hi_min >= j0 + nj - 1;
  };
  const int64_t narrow_bk = kDotTiles<Tiles> ? kNarrowDotKeys : narrow_keys(qt_cols);
  const int64_t bk = narrow ? std::min(narrow_bk, plan.block_k) : plan.block_k;
  const auto tile_kind = [&](int64_t j0, int64_t nj) {
    return every_row_sees(j0, nj) ? TileKind::full : ctx[0].classify(mq, lo, hi, j0, nj);
  };
  // The softmax step on the S rows of K/V head hk0 + x in sx ([mq, lds]):
  // scores of keys j0.. (nj) into P, m, l and alpha updated; next: rows to
  // ask L2 for, a share per row.
  // Rows in blocks of kLanes: each block's maxima first (into alpha), then
  // their alphas in one vector step (step_maxima), then their exps, while
  // the block's S rows are still in L1.
  const auto softmax_rows = [&](int64_t j0, int64_t nj, int64_t x, TileKind kind, Acc* sx, const NextTile& next) {
    Acc *mx_ = m + x * ms, *lx = l + x * ms, *ax = alpha + x * ms;
    // A row of a tile the ranges cut sees no key past hi[r]: its passes
    // stop at the kPad block that holds it, and its P is 0 beyond.
    const auto width = [&](int64_t r) {
      return kind == TileKind::partial ? std::min(lds, round_up(std::clamp<int64_t>(hi[r] - j0 + 1, 0, nj), kPad))
                                       : lds;
    };
    for (int64_t r0 = 0; r0 < mq; r0 += kLanes) {
      const int64_t r1 = std::min(mq, r0 + kLanes);
      for (int64_t r = r0; r < r1; ++r) {
        const HeadCtx<Acc>& c = ctx[static_cast<size_t>(x * plan.group + r / mqh)];
        Acc* srow = sx + r * lds;
        const int64_t wr = width(r), nr = std::min(nj, wr);
        c.logits_row(i0 + r % mqh, j0, nr, lo[r], hi[r], kind == TileKind::partial, srow, nullptr);
        for (int64_t jj = nr; jj < wr; ++jj) srow[jj] = neg_inf<Acc>();
        ax[r] = row_max(srow, wr, mx_[r]);
      }
      step_maxima(mx_ + r0, ax + r0, ax + r0, r1 - r0);
      for (int64_t r = r0; r < r1; ++r) {
        const HeadCtx<Acc>& c = ctx[static_cast<size_t>(x * plan.group + r / mqh)];
        const int64_t i = i0 + r % mqh;
        Acc* srow = sx + r * lds;
        const int64_t wr = width(r);
        const Acc mref = mx_[r] == neg_inf<Acc>() ? Acc(0) : mx_[r];
#if FG_BF16_DOT
        // Bf16DotTiles' P V reads P as pairs: rounded as the exp writes it
        // unless dropout acts on P in f32 first.
        if constexpr (kDotTiles<Tiles>) {
          if (!c.rng.active) {
            lx[r] = lx[r] * ax[r] + exp_row_pairs(srow, wr, mref, lds);
          } else {
            lx[r] = lx[r] * ax[r] + exp_row(srow, wr, mref);
            for (int64_t jj = wr; jj < lds; ++jj) srow[jj] = Acc(0);
            c.dropout_row(i, j0, nj, keep, srow);
            round_bf16_pairs(srow, lds);
          }
        } else
#endif
        {
          lx[r] = lx[r] * ax[r] + exp_row(srow, wr, mref);
          for (int64_t jj = wr; jj < lds; ++jj) srow[jj] = Acc(0);
          c.dropout_row(i, j0, nj, keep, srow);
        }
        const int64_t f0 = r * next.n / mq, f1 = (r + 1) * next.n / mq;
        prefetch_rows<T>(p.k, b, next.seq0 + f0, next.hk, f1 - f0, d);
        prefetch_rows<T>(p.v, b, next.seq0 + f0, next.hk, f1 - f0, p.head_dim_v);
        for (int64_t at = round_up(r * next.held_bytes / mq, 64); at < (r + 1) * next.held_bytes / mq; at += 64)
          prefetch_l2(next.held + at);
      }
    }
  };
  // The tile of keys j0.. (nj of them) of K/V head hk0 + x.
  const auto head_tile = [&](int64_t j0, int64_t nj, int64_t x, TileKind kind, const TileCut& tile_cut,
                             const NextTile& next) {
    const bool cut = kind == TileKind::partial;
    const int64_t hk = hk0 + x;
    Acc *qx = q + x * mq * ldq, *ox = o + x * ms * ldv, *mx_ = m + x * ms, *lx = l + x * ms, *ax = alpha + x * ms;
    if constexpr (kAmxTiles<Tiles>) {
      if (amx_narrow) {
        const auto* qtv = reinterpret_cast<const uint32_t*>(qt) + x * (plan.dqk_pad / 2) * amx_w;
        // P^T's and P's pairs ([bk_pad / 2, <= 32] words each) in kt's space.
        tiles.narrow(p, plan, b, k0 + j0, hk, nj, amx_w, qtv, stage, s, mx_, lx, ax, ox, v, kt,
                     kt + 16 * plan.bk_pad, cut ? lo_f : nullptr, cut ? hi_f : nullptr, j0);
        return;
      }
    }
    if (keys_major && (kind == TileKind::full || keys_major_ranged)) {
      const Acc *qtx = qt + x * q_cols * qt_ld, *lof = cut ? lo_f : nullptr, *hif = cut ? hi_f : nullptr;
      ScoreCols<Acc> sc;
      if (alibi_cols) sc.slope = slope_f + x * ms, sc.pos = pos_f;
      sc.rows = mq;
      if (bias_cols) sc.brow = brow + x * ms, sc.bias_cs = ctx[0].bias_cs, sc.bias_dtype = p.bias.dtype;
      if (mask_cols) sc.mrow = mrow + x * ms, sc.mask_cs = ctx[0].mask_cs;
      if (drop_cols) sc.drop_x = drop_x, sc.drop_bh = drop_bh + x * ms, sc.rng = &ctx[0].rng;
      if (narrow) {
#if FG_BF16_DOT
        if constexpr (kDotTiles<Tiles>)
          return narrow_dot_tile(p, plan, b, k0 + j0, hk, x, nh, nj, qt_cols, reinterpret_cast<const uint32_t*>(qtx),
                                 reinterpret_cast<uint32_t*>(kt), reinterpret_cast<uint32_t*>(v),
                                 reinterpret_cast<uint32_t*>(stage), s, mx_, lx, ax, ox, lof, hif, sc, j0);
#endif
        narrow_step<T>(p, plan, b, k0 + j0, hk, nj, next, qt_cols, qtx, v, stage, s, mx_, lx, ax, ox, lof, hif, sc,
                       j0);
      } else {
        keys_major_tile<T>(p, plan, b, k0 + j0, hk, nj, mq, qtx, ms, mld, v, stage, s, mx_, lx, ax, ox, lof, hif, sc,
                           j0, cut ? &tile_cut : nullptr, next);
      }
      return;
    }
    // Rows of the next tile to ask L2 for, or its pairs where they are held.
    const Acc* held_next = next.n ? cache.held(next.hk - hk0, (next.seq0 - k0 - k_lo) / plan.block_k) : nullptr;
    NextTile ahead = prefetch && !held_next ? next : NextTile{0, 0, 0};
    if (held_next) ahead.held = reinterpret_cast<const char*>(held_next), ahead.held_bytes = cache.slot * sizeof(Acc);
    Acc *ktx = kt, *vx = v;
    const auto load = [&](Acc* kt_dst, Acc* v_dst) { tiles.load_kv(p, plan, b, k0 + j0, hk, nj, kt_dst, v_dst, stage); };
    if (Acc* held = cache.get(x, (j0 - k_lo) / plan.block_k, kt_elems, load))
      ktx = held, vx = held + kt_elems;
    else
      load(kt, v);
    if constexpr (std::is_same<Tiles, AccTiles<T, Acc>>::value) tiles.set_ahead(p, k_hi - j0);
#if FG_BF16_DOT
    if constexpr (kDotTiles<Tiles>) {
      if (cut) {
        tiles.qk_cut(plan, mq, d, qx, ktx, scale, s, hi, j0, nj);
        softmax_rows(j0, nj, x, kind, s, ahead);
        tiles.pv_cut(plan, mq, nj, s, vx, ax, ox, hi, j0);
        return;
      }
    }
#endif
    tiles.qk(plan, mq, d, qx, ktx, scale, s);
    softmax_rows(j0, nj, x, kind, s, ahead);
    tiles.pv(plan, mq, nj, s, vx, ax, ox, pv);
  };
  // The tile of keys j0.. (nj of them) of every K/V head of the task, across
  // heads at a time (heads_across): S of head x in rows x * mq.. of s, the
  // calls' lanes first in kt.
  const auto heads_tile = [&](int64_t j0, int64_t nj, TileKind kind) {
#if FG_TRANSPOSE_REGS
    if constexpr (std::is_same<Tiles, AccTiles<T, Acc>>::value && std::is_same<Acc, float>::value) {
      const int64_t g = across, ldst = round_up(nj, kHeadsBlocks * kLanes / g) * g;
      const T* kr = static_cast<const T*>(p.k.data) + row_offset(p.k, b, k0 + j0, hk0);
      const T* vr = static_cast<const T*>(p.v.data) + row_offset(p.v, b, k0 + j0, hk0);
      for (int64_t h0 = 0; h0 < nh; h0 += g) {
        with_rows(mq, [&](auto mm) {
          scores_heads<decltype(mm)::value>(nj, g, d, qt + h0 / g * mq * d * kLanes, kr + h0 * d, p.k.seq_stride,
                                            kt, ldst, reinterpret_cast<T*>(stage));
        });
        for (int64_t r = 0; r < mq; ++r)
          for (int64_t x = 0; x < g; ++x)
            for (int64_t j = 0; j < nj; ++j) s[((h0 + x) * mq + r) * lds + j] = tiles.score_scale(kt[r * ldst + j * g + x]);
      }
      for (int64_t x = 0; x < nh; ++x) softmax_rows(j0, nj, x, kind, s + x * mq * lds, NextTile{0, 0, 0});
      for (int64_t h0 = 0; h0 < nh; h0 += g)
        with_rows(mq, [&](auto mm) {
          pv_heads<decltype(mm)::value>(g, p.head_dim_v, nj, s + h0 * mq * lds, mq * lds, lds,
                                        vr + h0 * p.head_dim_v, p.v.seq_stride, pv, o + h0 * ms * ldv, ms * ldv, ldv,
                                        alpha + h0 * ms, ms);
        });
      return;
    }
#endif
    (void)j0, (void)nj, (void)kind;
  };
  const auto tile_cut_of = [&](int64_t j0, int64_t nj, TileKind kind) {
    TileCut tile_cut;
    if (kind == TileKind::partial && keys_major_ranged && !narrow) tile_cut.set(lo, hi, mq, j0, nj);
    return tile_cut;
  };
  const auto n_at = [&](int64_t j) { return j < k_hi ? std::min(bk, k_hi - j) : int64_t{0}; };
  if (path.heads_outer) {
    for (int64_t x = 0; x < nh; ++x)
      for (int64_t j0 = k_lo; j0 < k_hi; j0 += bk) {
        const int64_t nj = n_at(j0);
        const TileKind kind = tile_kind(j0, nj);
        if (kind == TileKind::skip) continue;
        // The tile after this one: the next keys', or the next K/V head's first.
        const bool last = j0 + bk >= k_hi;
        const int64_t jn = last ? k_lo : j0 + bk;
        const NextTile next{k0 + jn, hk0 + x + (last ? 1 : 0), last && x + 1 == nh ? 0 : n_at(jn)};
        head_tile(j0, nj, x, kind, tile_cut_of(j0, nj, kind), next);
      }
  } else {
    for (int64_t j0 = k_lo; j0 < k_hi; j0 += bk) {
      const int64_t nj = n_at(j0);
      const TileKind kind = tile_kind(j0, nj);
      if (kind == TileKind::skip) continue;
      if (across) {
        heads_tile(j0, nj, kind);
        continue;
      }
      const TileCut tile_cut = tile_cut_of(j0, nj, kind);
      for (int64_t x = 0; x < nh; ++x) {
        // The tile after this one: the next K/V head's, or the next keys'.
        const int64_t jn = x + 1 < nh ? j0 : j0 + bk;
        head_tile(j0, nj, x, kind, tile_cut, NextTile{k0 + jn, x + 1 < nh ? hk0 + x + 1 : hk0, n_at(jn)});
      }
    }
  }
  for (int64_t x = 0; x < nh; ++x) {
    const Stack st{hk0 + x, plan.group, i0, mqh};
    const Acc* ox = o + x * ms * ldv;
    if (narrow) {  // O^T [dv, W] back to rows
      transpose<Acc>(p.head_dim_v, mq, ox, qt_cols, pv, ldv);  // any shape: once per task
      ox = pv;
    }
    const bool ahead = plan.splits == 1 && p.out.dim_stride == 1 && mq > kRowsAhead;
    const int64_t esize = p.out_dtype == DType::f32 ? 4 : static_cast<int64_t>(sizeof(T));
    const int64_t out_bytes = p.head_dim_v * esize;
    for (int64_t r = 0; r < mq; ++r) {
      if (ahead && r + kRowsAhead < mq) {
        const int64_t ra = r + kRowsAhead;
        const char* row = static_cast<const char*>(p.out.data) +
                          row_offset(p.out, b, p.q_start(b) + st.row(ra), st.head(ra)) * esize;
        for (int64_t at = 0; at < out_bytes; at += 64) prefetch_w(row + at);
      }
      finish_row<T, Acc>(p, plan, shared, b, st.head(r), st.row(r), split, m[x * ms + r], l[x * ms + r],
                         ox + r * ldv);
    }
  }
}

// Split keys: row (b, h, i) merges its splits in split order, then the sink.
template <typename T, typename Acc>
void merge_splits(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t h, Slice<Acc> ws,
                  Slice<Acc> shared) {
  const int64_t dv = p.head_dim_v;
  Acc* acc = ws.at(plan.fwd.o);
  const Acc zero = Acc(0);
  for (int64_t i = 0; i < p.len_q(b); ++i) {
    Acc lse = neg_inf<Acc>();
    for (int64_t sp = 0; sp < plan.splits; ++sp) {
      const int64_t row = ((sp * p.batch + b) * p.heads_q + h) * p.seqlen_q + i;
      merge_row(acc, 1, &lse, shared.at(plan.fwd.part_o) + row * dv, 1, shared.at(plan.fwd.part_lse)[row], dv);
    }
    if (lse == neg_inf<Acc>())
      for (int64_t c = 0; c < dv; ++c) acc[c] = Acc(0);
    if (p.sinks)  // the sink is one more key whose value row is zero
      merge_row(acc, 1, &lse, &zero, 0, static_cast<Acc>(p.sinks[h * p.sinks_stride]), dv);
    const int64_t q = p.q_start(b) + i;
    store_result<T>(p.out_dtype, acc, dv, p.out.data, row_offset(p.out, b, q, h), p.out.dim_stride, Acc(1));
    lse_store(p, row_offset(p.lse, b, q, h), static_cast<double>(lse));
  }
}

template <typename T, typename Acc, typename Tiles = AccTiles<T, Acc>>
void forward_impl(const AttnParams& p, const TilePlan& plan, void* workspace) {
  const int64_t nqb = ceil_div(p.seqlen_q, plan.head_rows);
  const int64_t per_thread = plan.per_thread_bytes / static_cast<int64_t>(sizeof(Acc));
  Acc* base = static_cast<Acc*>(workspace);
  const Slice<Acc> shared{base + per_thread * plan.threads};
  const int64_t splits = plan.splits;
  const int64_t head_runs = p.heads_kv / plan.kv_heads;
  // Threads claim tasks in order; under a causal mask later query blocks
  // see more keys, so each head's blocks go last to first and the short
  // ones even out where the threads finish.
  PairTileCache<Acc>::clear(plan, base, per_thread);
  // Where threads hold pair tiles and the (batch, K/V heads, split) units,
  // all of one size, divide evenly among them, a task takes a unit's query
  // blocks whole, so that one thread lays out each of the unit's K/V tiles
  // once; blocks claimed in turn had every thread lay out most of them.
  // Units of other counts or sizes keep the blocks, which even out where
  // whole units would leave a thread one unit behind.
  const int64_t units = p.batch * head_runs * splits;
  const bool whole = plan.fwd.pair_slots > 0 && units % plan.threads == 0 && !p.cu_seqlens_q && !p.cu_seqlens_k;
  const auto run = [&](int64_t unit, int64_t qb, int thread) {
    const int64_t sp = unit % splits, bh = unit / splits;
    forward_task<T, Acc, Tiles>(p, plan, bh / head_runs, bh % head_runs * plan.kv_heads, qb, sp,
                                Slice<Acc>{base + thread * per_thread}, shared);
  };
  if (whole) {
    parallel_for(units, plan.threads, [&](int64_t unit, int thread) {
      for (int64_t qb = nqb - 1; qb >= 0; --qb) run(unit, qb, thread);
    });
  } else {
    parallel_for(units * nqb, plan.threads, [&](int64_t task, int thread) {
      run(task / splits / nqb * splits + task % splits, nqb - 1 - task / splits % nqb, thread);
    });
  }
  if (splits == 1) return;
  parallel_for(p.batch * p.heads_q, plan.threads, [&](int64_t task, int thread) {
    merge_splits<T, Acc>(p, plan, task / p.heads_q, task % p.heads_q, Slice<Acc>{base + thread * per_thread}, shared);
  });
}
