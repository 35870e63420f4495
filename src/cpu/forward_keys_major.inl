// Keys-major tiles, S^T = scale (K Q^T) with the softmax down its columns
// and cut tiles computed per band, and the pair tiles a thread keeps across
// query blocks. Included by forward.inl, in order.

// Where a tile the causal or window ranges cut starts, per band of kPad
// keys: band u's scores from column (query row) col[u] of S^T on, the first
// kPad-aligned block of rows that sees one of its keys, and P V for rows
// [pv[u], pv[u + 1]) over bands 0..u only (pv[u]: the least col[u..]; pv[bands] = mq).
// On a causal diagonal the first band is seen by more rows than the last,
// so a 64-key tile computes three quarters of its 64 x 64 corner instead
// of all of it.
struct TileCut {
  static constexpr int64_t kMaxBands = kMaxBlockK / kPad;
  int64_t bands = 0;
  int64_t col[kMaxBands];
  int64_t pv[kMaxBands + 1];

  // Rows r < mq see keys [lo[r], hi[r]]; the tile holds keys j0 .. j0 + nj - 1.
  void set(const int64_t* lo, const int64_t* hi, int64_t mq, int64_t j0, int64_t nj) {
    bands = ceil_div(nj, kPad);
    for (int64_t u = 0; u < bands; ++u) {
      const int64_t a = j0 + u * kPad, z = std::min(a + kPad, j0 + nj);
      int64_t r = 0;
      while (r < mq && (lo[r] > hi[r] || hi[r] < a || lo[r] >= z)) ++r;
      col[u] = r / kPad * kPad;
    }
    pv[bands] = mq;
    for (int64_t u = bands - 1; u >= 0; --u) pv[u] = std::min(col[u], pv[u + 1]);
  }
};

// One tile, keys-major: S^T [nj, ms] (row stride mld) into st, the softmax step on m, l and
// alpha ([ms]) with keys j0.. (sequence-relative) outside [lo, hi] masked (lo
// null: a full tile, cut null), and o [mq, dv_pad] = o * alpha + P V. K rows are read
// in place when they are f32 with unit stride less than a page apart, else
// converted into stage. A cut
// tile computes only the scores and products cut says some row needs; the
// scores it leaves are masked in the softmax like any unseen key, and rows
// (columns of S^T) below cut->pv[0] are left as they are.
template <typename T, typename Acc>
void keys_major_tile(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t seq0, int64_t hk, int64_t nj,
                     int64_t mq, const Acc* qt, int64_t ms, int64_t mld, Acc* v, Acc* stage, Acc* st, Acc* m, Acc* l,
                     Acc* alpha, Acc* o, const Acc* lo, const Acc* hi, const ScoreCols<Acc>& sc, int64_t j0,
                     const TileCut* cut, const NextTile& next) {
#if FG_VEC_GEMM
  if constexpr (std::is_same<Acc, float>::value) {
    // The next tile's K rows go to L2 after the S^T product and its V rows
    // after the softmax, where rows with gaps between them (heads
    // interleaved, [batch, seq, heads, dim]) leave the hardware prefetchers
    // behind: the K rows read in place and the V tile's copy then waited on
    // L3 (f32, L = 2048, 8 heads, 1 thread, alternating calls, fastest of
    // 15-25 each, without -> with: d = 64 0.93-0.96 of the time, d = 128
    // 0.94-0.96, causal 0.86-0.96; 2 threads 0.92-1.04). Contiguous rows
    // stream without it ([batch, heads, seq, dim]: 1.00-1.01 with it).
    const auto ahead = [&](const Operand& o, int64_t dim) {
      if (next.n && o.seq_stride != dim) prefetch_rows<T>(o, b, next.seq0, next.hk, next.n, dim);
    };
    // K rows each on a page of their own (a row stride of 4 KiB or more:
    // [batch, seq, heads, dim] with 8 heads of d = 128) are copied into
    // stage like V's: the S^T product, which reads a 6-row panel of K once
    // per 16 columns of S^T, runs faster from the copy; closer rows stay in
    // place (tuning table: keys-major K copy).
    int64_t kr_ld = plan.dqk_pad;
    const float* kr = stage;
    if (p.k.seq_stride * static_cast<int64_t>(sizeof(T)) >= kPageBytes)
      load_tile<T>(p.k, b, seq0, hk, nj, p.head_dim, plan.dqk_pad, stage);
    else
      kr = rows_f32<T>(p.k, b, seq0, hk, nj, p.head_dim, plan.dqk_pad, stage, kr_ld);
    load_tile<T>(p.v, b, seq0, hk, nj, p.head_dim_v, plan.dv_pad, v);
    const int64_t dv = plan.dv_pad;
    // A full tile's new row maxima come from the S^T product's epilogue,
    // gathered in alpha (which softmax_cols overwrites after reading them):
    // the softmax then skips its pass over S^T for the max (tuning table:
    // keys-major maxima).
    // A softcap caps S^T's rows where they lie (softcap_row: the same bits
    // as the row path's logits_row, so the backward's recomputed scores),
    // and ALiBi, a bias and a mask follow (ScoreCols); the softmax then
    // finds the new maxima itself.
    const float cap = static_cast<float>(p.softcap);
    const ScoreScale<float> sscale(p.scale);
    if (!cut && (cap > 0 || sc.any())) {
      gemm_nn(nj, ms, p.head_dim, kr, kr_ld, 1, qt, mld, st, mld, sscale);
      if (cap > 0)
        for (int64_t j = 0; j < nj; ++j) softcap_row(st + j * mld, ms, cap, nullptr);
      sc.apply(st, nj, ms, mld, j0);
      ahead(p.k, p.head_dim);
      softmax_cols(st, nj, ms, mld, m, l, alpha, lo, hi, static_cast<float>(j0));
      sc.dropout(st, nj, ms, mld, j0);
      ahead(p.v, p.head_dim_v);
      gemm_nn_acc(mq, dv, nj, st, 1, mld, v, dv, o, dv, alpha, nullptr);
      return;
    }
    if (!cut) {
      for (int64_t r = 0; r < ms; ++r) alpha[r] = m[r];
      gemm_f32<kGemmMr, kGemmVecs, Epi::store_colmax>(nj, ms, p.head_dim, kr, kr_ld, 1, qt, mld, st, mld, alpha, 0,
                                                      sscale);
      ahead(p.k, p.head_dim);
      softmax_cols(st, nj, ms, mld, m, l, alpha, lo, hi, static_cast<float>(j0), alpha);
      sc.dropout(st, nj, ms, mld, j0);
      ahead(p.v, p.head_dim_v);
      gemm_nn_acc(mq, dv, nj, st, 1, mld, v, dv, o, dv, alpha, nullptr);
      return;
    }
    for (int64_t u = 0; u < cut->bands; ++u) {
      const int64_t a = u * kPad, c = cut->col[u];
      gemm_nn(std::min(kPad, nj - a), ms - c, p.head_dim, kr + a * kr_ld, kr_ld, 1, qt + c, mld, st + a * mld + c,
              mld, sscale);
      if (cap > 0)
        for (int64_t j = a; j < std::min(a + kPad, nj); ++j) softcap_row(st + j * mld + c, ms - c, cap, nullptr);
      sc.at(c).apply(st + a * mld + c, std::min(kPad, nj - a), ms - c, mld, j0 + a);
    }
    ahead(p.k, p.head_dim);
    const int64_t c0 = cut->pv[0];
    softmax_cols(st + c0, nj, ms - c0, mld, m + c0, l + c0, alpha + c0, lo + c0, hi + c0, static_cast<float>(j0));
    sc.at(c0).dropout(st + c0, nj, ms - c0, mld, j0);
    ahead(p.v, p.head_dim_v);
    for (int64_t u = 0; u < cut->bands; ++u) {
      const int64_t r0 = cut->pv[u], r1 = cut->pv[u + 1];
      if (r1 > r0)
        gemm_nn_acc(r1 - r0, dv, std::min(nj, (u + 1) * kPad), st + r0, 1, mld, v, dv, o + r0 * dv, dv, alpha + r0,
                    nullptr);
    }
    return;
  }
#endif
  (void)p, (void)plan, (void)b, (void)seq0, (void)hk, (void)nj, (void)mq, (void)qt, (void)ms, (void)mld, (void)v,
  (void)stage;
  (void)st, (void)m, (void)l, (void)alpha, (void)o, (void)lo, (void)hi, (void)sc, (void)j0, (void)cut, (void)next;
}

// K/V tiles as pair products read them, kept per thread across the query
// blocks of its task's K/V heads (ForwardScratch::pair_tiles): a thread
// takes a head's blocks in turn (forward_impl), and each block laid every
// tile out as pairs again. Slot x * per_head + t holds tile t of K/V head
// hk0 + x of the tag's run; tiles past the plan's slots are laid out per use.
template <typename Acc>
struct PairTileCache {
  int64_t slots = 0, slot = 0, per_head = 0;
  uint8_t* ready = nullptr;
  Acc* tiles = nullptr;

  PairTileCache(const TilePlan& plan, Slice<Acc> ws, int64_t b, int64_t hk0, int64_t split, int64_t per_head_)
      : slots(plan.fwd.pair_slots), slot(plan.fwd.pair_slot), per_head(per_head_) {
    if (!slots) return;
    ready = reinterpret_cast<uint8_t*>(ws.at(plan.fwd.pair_ready));
    tiles = ws.at(plan.fwd.pair_tiles);
    int64_t* tag = ws.idx(plan.fwd.pair_tag);
    if (tag[0] == b && tag[1] == hk0 && tag[2] == split) return;
    tag[0] = b, tag[1] = hk0, tag[2] = split;
    std::memset(ready, 0, static_cast<size_t>(slots));
  }
  // Forgets every thread's tiles: a call's K and V are not the last call's.
  static void clear(const TilePlan& plan, Acc* base, int64_t per_thread) {
    if (!plan.fwd.pair_slots) return;
    for (int t = 0; t < plan.threads; ++t) Slice<Acc>{base + t * per_thread}.idx(plan.fwd.pair_tag)[0] = -1;
  }
  int64_t index(int64_t x, int64_t t) const { return x * per_head + t < slots ? x * per_head + t : -1; }
  // Tile t of head x if it is held, else null.
  const Acc* held(int64_t x, int64_t t) const {
    const int64_t i = index(x, t);
    return i >= 0 && ready[i] ? tiles + i * slot : nullptr;
  }
  // Tile t of head x, laid out by load(kt, v) into its slot the first time;
  // null past the slots.
  template <typename Load>
  Acc* get(int64_t x, int64_t t, int64_t kt_elems, Load&& load) {
    const int64_t i = index(x, t);
    if (i < 0) return nullptr;
    Acc* kt = tiles + i * slot;
    if (!ready[i]) {
      load(kt, kt + kt_elems);
      ready[i] = 1;
    }
    return kt;
  }
};
