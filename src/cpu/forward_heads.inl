// The heads-across path: decode tiles of every K/V head of a task at once,
// `across` heads per scores_heads and pv_heads call (heads_across,
// forward_paths.inl). Included by forward.inl, in order.

// Per group of `across` heads, Q's lanes qx [mq][d][kLanes] (scores_heads)
// in Q^T's space.
template <typename T, typename Acc, typename Tiles>
void heads_setup(ForwardTask<T, Acc, Tiles>& t) {
  const int64_t across = t.path.across, mq = t.mq, d = t.d, ldq = t.ldq;
  const Acc* q = t.q;
  Acc* qt = t.qt;
  for (int64_t h0 = 0; h0 < t.nh; h0 += across)
    for (int64_t r = 0; r < mq; ++r)
      for (int64_t c = 0; c < d; ++c)
        for (int64_t x = 0; x < kLanes; ++x)
          qt[((h0 / across * mq + r) * d + c) * kLanes + x] = q[((h0 + x % across) * mq + r) * ldq + c];
}

// The tile of keys j0.. (nj of them) of every K/V head of the task, across
// heads at a time: S of head x in rows x * mq.. of s, the calls' lanes
// first in kt.
template <typename T, typename Acc, typename Tiles>
void heads_tile(ForwardTask<T, Acc, Tiles>& t, int64_t j0, int64_t nj, TileKind kind) {
#if FG_TRANSPOSE_REGS
  if constexpr (std::is_same<Acc, float>::value) {
    const AttnParams& p = t.p;
    const int64_t g = t.path.across, nh = t.nh, mq = t.mq, d = t.d, lds = t.lds, ms = t.ms, ldv = t.ldv, b = t.b;
    const int64_t ldst = round_up(nj, kHeadsBlocks * kLanes / g) * g, k0 = t.k0, hk0 = t.hk0;
    Acc *s = t.s, *kt = t.kt, *qt = t.qt;
    const ScoreScale<Acc> score_scale = t.tiles.score_scale;
    const T* kr = static_cast<const T*>(p.k.data) + row_offset(p.k, b, k0 + j0, hk0);
    const T* vr = static_cast<const T*>(p.v.data) + row_offset(p.v, b, k0 + j0, hk0);
    for (int64_t h0 = 0; h0 < nh; h0 += g) {
      with_rows(mq, [&](auto mm) {
        scores_heads<decltype(mm)::value>(nj, g, d, qt + h0 / g * mq * d * kLanes, kr + h0 * d, p.k.seq_stride,
                                          kt, ldst, reinterpret_cast<T*>(t.stage));
      });
      for (int64_t r = 0; r < mq; ++r)
        for (int64_t x = 0; x < g; ++x)
          for (int64_t j = 0; j < nj; ++j)
            s[((h0 + x) * mq + r) * lds + j] = score_scale(kt[r * ldst + j * g + x]);
    }
    for (int64_t x = 0; x < nh; ++x)
      softmax_rows(t, TileAt{j0, nj, x, kind, NextTile{0, 0, 0}}, s + x * mq * lds, NextTile{0, 0, 0});
    for (int64_t h0 = 0; h0 < nh; h0 += g)
      with_rows(mq, [&](auto mm) {
        pv_heads<decltype(mm)::value>(g, p.head_dim_v, nj, s + h0 * mq * lds, mq * lds, lds,
                                      vr + h0 * p.head_dim_v, p.v.seq_stride, t.pv, t.o + h0 * ms * ldv, ms * ldv,
                                      ldv, t.alpha + h0 * ms, ms);
      });
    return;
  }
#endif
  (void)t, (void)j0, (void)nj, (void)kind;
}

// The heads-across path's task: Q's lanes, then each key tile across heads.
template <typename T, typename Acc, typename Tiles>
void heads_across_task(ForwardTask<T, Acc, Tiles>& t) {
  if constexpr (std::is_same<Tiles, AccTiles<T, Acc>>::value) {
    heads_setup(t);
    walk_key_tiles(t, [&](int64_t j0, int64_t nj, TileKind kind) { heads_tile(t, j0, nj, kind); });
  }
  (void)t;
}
