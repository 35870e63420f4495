// The keys-major path: S^T = scale (K Q^T) with the softmax down its
// columns and cut tiles computed per band, and what it shares with the
// narrow paths (Q^T, the score columns, ColTile). Included by forward.inl,
// in order.

// Where a tile the causal or window ranges cut holds scores some row sees,
// in bands of kPad keys and groups of kPad query rows (columns of S^T):
// band u's scores for columns [col[u], end[u]) (none where end[u] is 0),
// then the softmax and P V in runs of columns that see the same keys. A
// causal diagonal's first band is seen by more rows than its last and a
// window's left edge the other way round, so a 64-key tile on either
// computes three quarters of its 64 x 64 corner instead of all of it.
struct TileCut {
  static constexpr int64_t kMaxBands = kMaxBlockK / kPad;
  struct Run {
    int64_t c0, c1, k0, k1;  ///< columns [c0, c1) see keys [k0, k1) of the tile
  };
  int64_t bands = 0;
  int64_t col[kMaxBands], end[kMaxBands];
  std::vector<Run> runs;

  // Rows r < mq see keys [lo[r], hi[r]]; the tile holds keys j0 .. j0 + nj - 1.
  void set(const int64_t* lo, const int64_t* hi, int64_t mq, int64_t j0, int64_t nj) {
    bands = ceil_div(nj, kPad);
    std::fill_n(col, bands, std::numeric_limits<int64_t>::max());
    std::fill_n(end, bands, int64_t{0});
    runs.clear();
    for (int64_t c0 = 0; c0 < mq; c0 += kPad) {
      int64_t ua = bands, ub = -1;  // the group's first and last band
      for (int64_t r = c0; r < std::min(mq, c0 + kPad); ++r) {
        const int64_t a = std::max(lo[r], j0), z = std::min(hi[r], j0 + nj - 1);
        if (a > z) continue;
        ua = std::min(ua, (a - j0) / kPad), ub = std::max(ub, (z - j0) / kPad);
      }
      if (ub < ua) continue;
      for (int64_t u = ua; u <= ub; ++u) col[u] = std::min(col[u], c0), end[u] = c0 + kPad;
      const Run run{c0, c0 + kPad, ua * kPad, std::min(nj, (ub + 1) * kPad)};
      if (!runs.empty() && runs.back().c1 == c0 && runs.back().k0 == run.k0 && runs.back().k1 == run.k1)
        runs.back().c1 = run.c1;
      else
        runs.push_back(run);
    }
  }
};

// Sets up what the keys-major paths read besides Q: each column's visible
// keys as floats (padding columns see no key), shared with AMX-narrow.
template <typename T, typename Acc, typename Tiles>
void column_bounds(ForwardTask<T, Acc, Tiles>& t) {
  const int64_t mq = t.mq, lk = t.lk;
  for (int64_t r = 0; r < t.ms; ++r) {
    t.lo_f[r] = r < mq ? static_cast<Acc>(std::min(t.lo[r], lk)) : Acc(1);
    t.hi_f[r] = r < mq ? static_cast<Acc>(std::max<int64_t>(t.hi[r], -1)) : Acc(0);
  }
}

// Q^T per K/V head: [q_cols, qt_cols] (row stride qt_ld), zero past row mq;
// 16-row blocks in registers.
template <typename T, typename Acc, typename Tiles>
void transpose_q(ForwardTask<T, Acc, Tiles>& t) {
  const int64_t mq = t.mq, ldq = t.ldq, q_cols = t.q_cols, qt_cols = t.qt_cols, qt_ld = t.qt_ld;
  const Acc* q = t.q;
  Acc* qt = t.qt;
  const int64_t r0 = mq / 16 * 16;
  for (int64_t x = 0; x < t.nh; ++x) {
    transpose(r0, q_cols, q + x * mq * ldq, ldq, qt + x * q_cols * qt_ld, qt_ld);
    for (int64_t c = 0; c < q_cols; ++c)
      for (int64_t r = r0; r < qt_cols; ++r)
        qt[(x * q_cols + c) * qt_ld + r] = r < mq ? q[(x * mq + r) * ldq + c] : Acc(0);
  }
}

// What the keys-major paths' ScoreCols read, per K/V head x at x * ms: each
// stacked row's (column's) ALiBi slope and position, bias and mask rows and
// dropout rows; padding columns act as the last real row, with slope 0.
// Returns head 0's ScoreCols (head x's: head(x * ms)).
template <typename T, typename Acc, typename Tiles>
ScoreCols<Acc> score_columns(ForwardTask<T, Acc, Tiles>& t) {
  const AttnParams& p = t.p;
  const auto& L = t.plan.fwd;
  const HeadCtx<Acc>& c0 = t.ctx[0];
  const int64_t mq = t.mq, ms = t.ms;
  const bool alibi_cols = p.alibi, bias_cols = p.bias.data, mask_cols = p.mask.data, drop_cols = c0.rng.active;
  Acc *pos_f = t.ws.at(L.row_pos_f), *slope_f = t.ws.at(L.row_slope_f);
  const char** brow = reinterpret_cast<const char**>(t.ws.idx(L.row_bias));
  const uint8_t** mrow = reinterpret_cast<const uint8_t**>(t.ws.idx(L.row_mask));
  uint32_t *drop_x = reinterpret_cast<uint32_t*>(t.ws.idx(L.row_drop_x)),
           *drop_bh = reinterpret_cast<uint32_t*>(t.ws.idx(L.row_drop_bh));
  for (int64_t x = 0; x < t.nh; ++x)
    for (int64_t r = 0; r < ms; ++r) {
      const HeadCtx<Acc>& c = t.head_of(x, r);
      if (alibi_cols) slope_f[x * ms + r] = r < mq ? c.slope : Acc(0);
      if (bias_cols) brow[x * ms + r] = c.bias + t.row_of(r) * c.bias_rs * c.bias_es;
      if (mask_cols) mrow[x * ms + r] = c.mask + t.row_of(r) * c.mask_rs;
      if (drop_cols) drop_bh[x * ms + r] = c.rng.bh;
    }
  for (int64_t r = 0; r < ms; ++r) {
    if (alibi_cols) pos_f[r] = r < mq ? static_cast<Acc>(t.row_of(r) + c0.shift) : Acc(0);
    if (drop_cols) drop_x[r] = static_cast<uint32_t>(c0.rng.row0 + t.row_of(r));
  }
  ScoreCols<Acc> sc;
  if (alibi_cols) sc.slope = slope_f, sc.pos = pos_f;
  sc.rows = mq;
  if (bias_cols) sc.brow = brow, sc.bias_cs = c0.bias_cs, sc.bias_dtype = p.bias.dtype;
  if (mask_cols) sc.mrow = mrow, sc.mask_cs = c0.mask_cs;
  if (drop_cols) sc.drop_x = drop_x, sc.drop_bh = drop_bh, sc.rng = &c0.rng;
  return sc;
}

// Q^T, the columns' bounds and their ScoreCols, for the keys-major, narrow
// and narrow-dot paths.
template <typename T, typename Acc, typename Tiles>
ScoreCols<Acc> keys_major_setup(ForwardTask<T, Acc, Tiles>& t) {
  transpose_q(t);
  column_bounds(t);
  return score_columns(t);
}

// The tile `at` of K/V head at.x as ColTile: head 0's columns cols moved to
// the head's, the bounds only where the ranges cut it; no scratch (the
// path's to set).
template <typename T, typename Acc, typename Tiles>
ColTile<Acc> col_tile(const ForwardTask<T, Acc, Tiles>& t, const ScoreCols<Acc>& cols, const TileAt& at) {
  const bool cut = at.kind == TileKind::partial;
  const int64_t x = at.x, ms = t.ms;
  ColTile<Acc> c;
  c.b = t.b, c.seq0 = t.k0 + at.j0, c.hk = t.hk0 + x, c.nj = at.nj, c.j0 = at.j0, c.x = x, c.nh = t.nh;
  c.rows = t.mq, c.cols = t.qt_cols, c.ld = t.qt_ld;
  c.qt = t.qt + x * t.qt_head;
  c.m = t.m + x * ms, c.l = t.l + x * ms, c.alpha = t.alpha + x * ms, c.o = t.o + x * ms * t.ldv;
  c.lo = cut ? t.lo_f : nullptr, c.hi = cut ? t.hi_f : nullptr;
  c.st = t.s, c.kbuf = nullptr, c.vbuf = nullptr, c.pbuf = nullptr;
  c.sc = cols.head(x * ms);
  c.next = at.next;
  return c;
}

#if FG_VEC_GEMM
// The next tile's K rows go to L2 after the S^T product and its V rows
// after the softmax, where rows with gaps between them (heads interleaved,
// [batch, seq, heads, dim]) leave the hardware prefetchers behind;
// contiguous rows stream without it (tuning table: keys-major next-tile
// prefetch).
template <typename T>
void keys_major_ahead(const Operand& o, int64_t dim, const ColTile<float>& c) {
  if (c.next.n && o.seq_stride != dim) prefetch_rows<T>(o, c.b, c.next.seq0, c.next.hk, c.next.n, dim);
}
// The next tile's bias and mask strips, when it is the same head's.
inline void keys_major_inputs_ahead(const ColTile<float>& c) {
  if (c.next.n && c.next.hk == c.hk) c.sc.prefetch(c.next.seq0 - (c.seq0 - c.j0), c.next.n);
}

// The tile's K rows for the S^T product (their row stride into kr_ld) and
// its V tile into c.vbuf ([nj, dv_pad]). K rows each on a page of their own
// (a row stride of 4 KiB or more: [batch, seq, heads, dim] with 8 heads of
// d = 128) are copied into c.kbuf like V's: the S^T product, which reads a
// 6-row panel of K once per 16 columns of S^T, runs faster from the copy;
// closer rows stay in place (tuning table: keys-major K copy).
template <typename T>
const float* keys_major_kv(const AttnParams& p, const TilePlan& plan, const ColTile<float>& c, int64_t& kr_ld) {
  kr_ld = plan.dqk_pad;
  const float* kr = c.kbuf;
  if (p.k.seq_stride * static_cast<int64_t>(sizeof(T)) >= kPageBytes)
    load_tile<T>(p.k, c.b, c.seq0, c.hk, c.nj, p.head_dim, plan.dqk_pad, c.kbuf);
  else
    kr = rows_f32<T>(p.k, c.b, c.seq0, c.hk, c.nj, p.head_dim, plan.dqk_pad, c.kbuf, kr_ld);
  load_tile<T>(p.v, c.b, c.seq0, c.hk, c.nj, p.head_dim_v, plan.dv_pad, c.vbuf);
  return kr;
}

// A full tile with a softcap, ALiBi, a bias or a mask: the softcap caps
// S^T's rows where they lie (softcap_row: the same bits as the row path's
// logits_row, so the backward's recomputed scores), ALiBi, the bias and
// the mask follow (ScoreCols), and the softmax finds the new maxima itself.
template <typename T>
void keys_major_scored(const AttnParams& p, const TilePlan& plan, const ColTile<float>& c, const float* kr,
                       int64_t kr_ld) {
  const int64_t nj = c.nj, ms = c.cols, mld = c.ld, dv = plan.dv_pad, j0 = c.j0;
  float *st = c.st, *m = c.m, *l = c.l, *alpha = c.alpha;
  const float cap = static_cast<float>(p.softcap);
  const ScoreScale<float> sscale(p.scale);
  gemm_nn(nj, ms, p.head_dim, kr, kr_ld, 1, c.qt, mld, st, mld, sscale);
  if (cap > 0)
    for (int64_t j = 0; j < nj; ++j) softcap_row(st + j * mld, ms, cap, nullptr);
  c.sc.apply(st, nj, ms, mld, j0);
  keys_major_inputs_ahead(c);
  keys_major_ahead<T>(p.k, p.head_dim, c);
  softmax_cols(st, nj, ms, mld, m, l, alpha, c.lo, c.hi, static_cast<float>(j0));
  c.sc.dropout(st, nj, ms, mld, j0);
  keys_major_ahead<T>(p.v, p.head_dim_v, c);
  gemm_nn_acc(c.rows, dv, nj, st, 1, mld, c.vbuf, dv, c.o, dv, alpha, nullptr);
}

// A full tile of plain scores (dropout or not): its new row maxima come from
// the S^T product's epilogue, gathered in alpha (which softmax_cols
// overwrites after reading them), so the softmax skips its pass over S^T
// for the max (tuning table: keys-major maxima).
template <typename T>
void keys_major_full(const AttnParams& p, const TilePlan& plan, const ColTile<float>& c, const float* kr,
                     int64_t kr_ld) {
  const int64_t nj = c.nj, ms = c.cols, mld = c.ld, dv = plan.dv_pad, j0 = c.j0;
  float *st = c.st, *m = c.m, *l = c.l, *alpha = c.alpha;
  const ScoreScale<float> sscale(p.scale);
  for (int64_t r = 0; r < ms; ++r) alpha[r] = m[r];
  gemm_f32<kGemmMr, kGemmVecs, Epi::store_colmax>(nj, ms, p.head_dim, kr, kr_ld, 1, c.qt, mld, st, mld, alpha, 0,
                                                  sscale);
  keys_major_ahead<T>(p.k, p.head_dim, c);
  softmax_cols(st, nj, ms, mld, m, l, alpha, c.lo, c.hi, static_cast<float>(j0), alpha);
  c.sc.dropout(st, nj, ms, mld, j0);
  keys_major_ahead<T>(p.v, p.head_dim_v, c);
  gemm_nn_acc(c.rows, dv, nj, st, 1, mld, c.vbuf, dv, c.o, dv, alpha, nullptr);
}

// A tile the ranges cut: only the scores and products cut says some row
// needs. A run's softmax masks the scores it holds outside each row's
// range like any unseen key, and rows (columns of S^T) in no run are left
// as they are.
template <typename T>
void keys_major_cut(const AttnParams& p, const TilePlan& plan, const ColTile<float>& c, const float* kr,
                    int64_t kr_ld, const TileCut& cut) {
  const int64_t nj = c.nj, mld = c.ld, dv = plan.dv_pad, j0 = c.j0;
  float *st = c.st, *m = c.m, *l = c.l, *alpha = c.alpha;
  const float* qt = c.qt;
  const float cap = static_cast<float>(p.softcap);
  const ScoreScale<float> sscale(p.scale);
  for (int64_t u = 0; u < cut.bands; ++u) {
    const int64_t a = u * kPad, col = cut.col[u], n = cut.end[u] - col, kn = std::min(kPad, nj - a);
    if (n <= 0) continue;
    gemm_nn(kn, n, p.head_dim, kr + a * kr_ld, kr_ld, 1, qt + col, mld, st + a * mld + col, mld, sscale);
    if (cap > 0)
      for (int64_t j = a; j < a + kn; ++j) softcap_row(st + j * mld + col, n, cap, nullptr);
    c.sc.at(col).apply(st + a * mld + col, kn, n, mld, j0 + a);
  }
  keys_major_inputs_ahead(c);
  keys_major_ahead<T>(p.k, p.head_dim, c);
  for (const TileCut::Run& r : cut.runs) {
    float* sr = st + r.k0 * mld + r.c0;
    softmax_cols(sr, r.k1 - r.k0, r.c1 - r.c0, mld, m + r.c0, l + r.c0, alpha + r.c0, c.lo + r.c0, c.hi + r.c0,
                 static_cast<float>(j0 + r.k0));
    c.sc.at(r.c0).dropout(sr, r.k1 - r.k0, r.c1 - r.c0, mld, j0 + r.k0);
  }
  keys_major_ahead<T>(p.v, p.head_dim_v, c);
  for (const TileCut::Run& r : cut.runs)
    gemm_nn_acc(r.c1 - r.c0, dv, r.k1 - r.k0, st + r.k0 * mld + r.c0, 1, mld, c.vbuf + r.k0 * dv, dv,
                c.o + r.c0 * dv, dv, alpha + r.c0, nullptr);
}

// One tile, keys-major: S^T [nj, cols] (row stride ld) into c.st, the
// softmax step on the columns' m, l and alpha with keys outside [lo, hi]
// masked (lo null: a full tile, cut null), and O [rows, dv_pad] = O * alpha
// + P V. K rows are read in place when they are f32 with unit stride less
// than a page apart, else converted into c.kbuf.
template <typename T>
void keys_major_tile(const AttnParams& p, const TilePlan& plan, const ColTile<float>& c, const TileCut* cut) {
  int64_t kr_ld = 0;
  const float* kr = keys_major_kv<T>(p, plan, c, kr_ld);
  if (cut) return keys_major_cut<T>(p, plan, c, kr, kr_ld, *cut);
  if (static_cast<float>(p.softcap) > 0 || c.sc.any()) return keys_major_scored<T>(p, plan, c, kr, kr_ld);
  keys_major_full<T>(p, plan, c, kr, kr_ld);
}
#endif

// The keys-major path's task: Q^T and the score columns, then every tile
// keys-major but those the ranges cut where key indices would not stay
// exact (ranges_exact), which take the row path. A key tile's cut is the
// same for every K/V head.
template <typename T, typename Acc, typename Tiles>
void keys_major_task(ForwardTask<T, Acc, Tiles>& t) {
#if FG_VEC_GEMM
  if constexpr (std::is_same<Acc, float>::value && std::is_same<Tiles, AccTiles<T, Acc>>::value) {
    const ScoreCols<Acc> cols = keys_major_setup(t);
    TileCut cut;
    int64_t cut_j0 = -1;
    walk_tiles(t, [&](const TileAt& at) {
      // A tile that only the mask cuts goes as a full one, its mask applied
      // by ScoreCols: the cut tiles' products run 32 keys at a time
      // (tuning table: keys-major mask).
      const bool partial = at.kind == TileKind::partial && !t.ranges_cover(at.j0, at.nj);
      if (partial && !t.path.ranged) return row_tile(t, at);
      if (partial && cut_j0 != at.j0) cut.set(t.lo, t.hi, t.mq, at.j0, at.nj), cut_j0 = at.j0;
      TileAt whole = at;
      if (!partial) whole.kind = TileKind::full;
      ColTile<Acc> c = col_tile(t, cols, whole);
      c.kbuf = t.stage, c.vbuf = t.v;
      keys_major_tile<T>(t.p, t.plan, c, partial ? &cut : nullptr);
    });
  }
#endif
  (void)t;
}
