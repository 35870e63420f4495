// The row paths (rows, whole rows, dot rows, AMX): S = Q K^T and O += P V on
// the Tiles policy's products, with the online softmax along S's rows.
// Included by forward.inl, in order.

// The softmax step on the S rows [rb, re) of K/V head at.x, row r at
// sx + (r - rb) * lds (all mq rows by default): scores of keys at.j0..
// (at.nj) into P, m, l and alpha updated; next: rows to ask L2 for, a share
// per row. Rows in blocks of kLanes (rb a multiple of it): each block's
// maxima first (into alpha), then their alphas in one vector step
// (step_maxima), then their exps, while the block's S rows are still in L1.
template <typename T, typename Acc, typename Tiles>
void softmax_rows(ForwardTask<T, Acc, Tiles>& t, const TileAt& at, Acc* sx, const NextTile& next, int64_t rb = 0,
                  int64_t re = -1) {
  const AttnParams& p = t.p;
  const int64_t j0 = at.j0, nj = at.nj, x = at.x, b = t.b, d = t.d;
  const int64_t mq = t.mq, mqh = t.mqh, i0 = t.i0, lds = t.lds, ms = t.ms, group = t.plan.group;
  const int64_t *lo = t.lo, *hi = t.hi;
  const HeadCtx<Acc>* ctx = t.ctx.data();
  const TileKind kind = at.kind;
  uint8_t* keep = t.keep;
  Acc *mx_ = t.m + x * ms, *lx = t.l + x * ms, *ax = t.alpha + x * ms;
  // A row of a tile the ranges cut sees no key past hi[r]: its passes
  // stop at the block of kCutGrain keys that holds it, and its P is 0
  // beyond.
  constexpr int64_t grain = kCutGrain<Tiles>;
  const auto width = [&](int64_t r) {
    return kind == TileKind::partial ? std::min(lds, round_up(std::clamp<int64_t>(hi[r] - j0 + 1, 0, nj), grain))
                                     : lds;
  };
  if (re < 0) re = mq;
  FG_DASSERT(rb % kLanes == 0 && re <= mq);
  const bool inputs = p.bias.data || p.mask.data;
  const bool next_inputs = inputs && at.next.n && at.next.hk == t.hk0 + x;
  for (int64_t r0 = rb; r0 < re; r0 += kLanes) {
    const int64_t r1 = std::min(re, r0 + kLanes);
    for (int64_t r = r0; r < r1; ++r) {
      const HeadCtx<Acc>& c = ctx[static_cast<size_t>(x * group + r / mqh)];
      Acc* srow = sx + (r - rb) * lds;
      const int64_t wr = width(r), nr = std::min(nj, wr);
      c.logits_row(i0 + r % mqh, j0, nr, lo[r], hi[r], kind == TileKind::partial, srow, nullptr);
      for (int64_t jj = nr; jj < wr; ++jj) srow[jj] = neg_inf<Acc>();
      ax[r] = row_max(srow, wr, mx_[r]);
    }
    step_maxima(mx_ + r0, ax + r0, ax + r0, r1 - r0);
    for (int64_t r = r0; r < r1; ++r) {
      const HeadCtx<Acc>& c = ctx[static_cast<size_t>(x * group + r / mqh)];
      const int64_t i = i0 + r % mqh;
      Acc* srow = sx + (r - rb) * lds;
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
      if (inputs) {  // the strip kInputRowsAhead rows on, into the next tile's first rows
        const int64_t ra = r + kInputRowsAhead, rn = ra - mq;
        if (ra < mq) t.head_of(x, ra).prefetch_row_inputs(t.row_of(ra), j0, nj);
        else if (next_inputs) t.head_of(x, rn).prefetch_row_inputs(t.row_of(rn), at.next.seq0 - t.k0, at.next.n);
      }
      const int64_t f0 = r * next.n / mq, f1 = (r + 1) * next.n / mq, nb = next.b >= 0 ? next.b : b;
      const bool l1 = next.b >= 0;
      prefetch_rows<T>(p.k, nb, next.seq0 + f0, next.hk, f1 - f0, d, l1);
      prefetch_rows<T>(p.v, nb, next.seq0 + f0, next.hk, f1 - f0, p.head_dim_v, l1);
      for (int64_t qr = r * next.q_heads * next.q_rows / mq; qr < (r + 1) * next.q_heads * next.q_rows / mq; ++qr)
        prefetch_rows<T>(p.q, nb, next.q_seq0 + qr % next.q_rows, next.q_h0 + qr / next.q_rows, 1, d, true);
      for (int64_t a = round_up(r * next.held_bytes / mq, 64); a < (r + 1) * next.held_bytes / mq; a += 64)
        prefetch_l2(next.held + a);
    }
  }
}

// The tile `at` on the row path: K and V laid out (or held, PairTileCache),
// S = Q K^T, the softmax step, O = O * alpha + P V. A tile the ranges cut
// takes Bf16DotTiles' products only as far as its rows see.
template <typename T, typename Acc, typename Tiles>
void row_tile(ForwardTask<T, Acc, Tiles>& t, const TileAt& at) {
  const AttnParams& p = t.p;
  const TilePlan& plan = t.plan;
  const int64_t j0 = at.j0, nj = at.nj, x = at.x, hk = t.hk0 + x, mq = t.mq, d = t.d, k0 = t.k0, k_lo = t.k_lo;
  const NextTile& next = at.next;
  Tiles& tiles = t.tiles;
  PairTileCache<Acc>& cache = t.cache;
  const Acc scale = t.scale;
  Acc *qx = t.q + x * mq * t.ldq, *ox = t.o + x * t.ms * t.ldv, *ax = t.alpha + x * t.ms, *s = t.s;
  // Rows of the next tile to ask L2 for, or its pairs where they are held.
  const Acc* held_next = next.n ? cache.held(next.hk - t.hk0, (next.seq0 - k0 - k_lo) / plan.block_k) : nullptr;
  NextTile ahead = t.prefetch_next && !held_next ? next : NextTile{0, 0, 0};
  if (!next.n && t.prefetch_next) ahead = t.after;
  if (held_next) ahead.held = reinterpret_cast<const char*>(held_next), ahead.held_bytes = cache.slot * sizeof(Acc);
  Acc *ktx = t.kt, *vx = t.v;
  const int64_t kt_elems = plan.dqk_pad / 2 * plan.bk_pad;
  const auto load = [&](Acc* kt_dst, Acc* v_dst) {
    tiles.load_kv(p, plan, t.b, k0 + j0, hk, nj, kt_dst, v_dst, t.stage);
  };
  // The first rows' bias and mask strips before the products; the softmax
  // asks for the others kInputRowsAhead rows before it reads them.
  if (p.bias.data || p.mask.data)
    for (int64_t r = 0; r < std::min(mq, kInputRowsAhead); ++r)
      t.head_of(x, r).prefetch_inputs(t.row_of(r), 1, j0, nj);
  if (Acc* held = cache.get(x, (j0 - k_lo) / plan.block_k, kt_elems, load))
    ktx = held, vx = held + kt_elems;
  else
    load(t.kt, t.v);
  if constexpr (std::is_same<Tiles, AccTiles<T, Acc>>::value) tiles.set_ahead(p, t.k_hi - j0);
  if constexpr (kAmxTiles<Tiles>) {
    // A block of 32 rows at a time, its S and P V in the first 32 rows of s
    // and pv, where they stay in L1: the tile's whole S (128-256 KiB) would
    // be written to L2 and read back from it.
    const int64_t ldo = plan.dv_pad;
    for (int64_t i = 0; i < mq; i += 32) {
      const RowBlock rb{i, std::min<int64_t>(32, mq - i), at.kind == TileKind::partial};
      tiles.qk_rows(plan, rb, qx, ktx, scale, s, t.lo, t.hi, j0, nj);
      softmax_rows(t, at, s, ahead, rb.i, rb.i + rb.rows);
      tiles.pv_rows(plan, rb, nj, s, vx, t.pv, t.lo, t.hi, j0);
      scale_add(rb.rows, ldo, ax + rb.i, t.pv, ox + rb.i * ldo, ldo);
    }
  } else {
    if constexpr (kDotTiles<Tiles>) {
      if (at.kind == TileKind::partial) {
        tiles.qk_cut(plan, mq, d, qx, ktx, scale, s, t.lo, t.hi, j0, nj);
        softmax_rows(t, at, s, ahead);
        tiles.pv_cut(plan, mq, nj, s, vx, ax, ox, t.lo, t.hi, j0);
        return;
      }
    }
    tiles.qk(plan, mq, d, qx, ktx, scale, s);
    softmax_rows(t, at, s, ahead);
    tiles.pv(plan, mq, nj, s, vx, ax, ox, t.pv);
  }
}

// The row paths' task: every tile on the row path.
template <typename T, typename Acc, typename Tiles>
void rows_task(ForwardTask<T, Acc, Tiles>& t) {
  walk_tiles(t, [&](const TileAt& at) { row_tile(t, at); });
}
