// A forward task (forward_task in forward.inl): its state, the walk over
// its key tiles that every path takes, and its rows' results. Included by
// forward.inl, in order.

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

// One forward task: keys [k_lo, k_hi) of batch b's sequence (split `split`)
// against query rows [i0, i0 + mqh) of every query head of K/V heads hk0..
// (nh of them), the tiles it keeps in the thread's workspace and what its
// paths share. Stacked row r of K/V head x is row i0 + r % mqh of query
// head (hk0 + x) * group + r / mqh; the head's rows of q and o start at row
// x * mq, its m, l and alpha at x * ms. Made once per task; the paths copy
// what their loops read into locals.
template <typename T, typename Acc, typename Tiles>
struct ForwardTask {
  const AttnParams& p;
  const TilePlan& plan;
  Slice<Acc> ws;
  int64_t b, hk0, nh, split;
  int64_t i0, mqh, mq;              ///< first query row, rows per query head, stacked rows per K/V head
  int64_t lk, k0, k_lo, k_hi;       ///< the sequence's keys (its first at k0 in K) and the task's
  int64_t d, ldq, ldv, lds;         ///< head_dim, and the row strides of q, o and s
  int64_t ms, mld;                  ///< m, l and alpha per K/V head; Q^T's and S^T's row stride
  Acc scale;
  Acc *q, *qt, *kt, *v, *s, *o, *stage, *pv, *m, *l, *alpha;
  int64_t *lo, *hi;                 ///< the stacked rows' visible keys [lo, hi]
  Acc *lo_f, *hi_f;                 ///< the same as floats, per column of S^T (column_bounds)
  Tiles tiles;
  PairTileCache<Acc> cache;
  std::vector<HeadCtx<Acc>> ctx;    ///< per query head, x * group + g
  TaskPath path;
  // Q^T per K/V head (keys-major paths): [q_cols, qt_cols] (elements or
  // pairs), row stride qt_ld, qt_head elements apart.
  int64_t q_cols = 0, qt_cols = 0, qt_ld = 0, qt_head = 0;
  int64_t bk = 0;                   ///< keys per tile
  bool prefetch_next = false;       ///< row tiles ask L2 for the next K/V tile
  int64_t lo_max = 0, hi_min = 0;   ///< over the stacked rows (tile_kind)
  int64_t lo_min = 0, hi_max = 0;   ///< over the stacked rows that see a key
  int64_t j_first = 0, j_end = 0;   ///< the first tile some row sees, and the end of the last one's keys
  NextTile after{0, 0, 0};          ///< the next task's first tile and query rows (aim_after)
  uint8_t keep[kMaxBlockK];         ///< a row's dropout bits

  ForwardTask(const AttnParams& p_, const TilePlan& plan_, int64_t b_, int64_t hk0_, int64_t qb, int64_t split_,
              Slice<Acc> ws_)
      : p(p_), plan(plan_), ws(ws_), b(b_), hk0(hk0_), nh(plan_.kv_heads), split(split_),
        i0(qb * plan_.head_rows), mqh(std::min(plan_.head_rows, p_.len_q(b_) - i0)), mq(plan_.group * mqh),
        lk(p_.len_k(b_)), k0(p_.k_start(b_)), k_lo(split_ * plan_.split_k), k_hi(std::min(lk, k_lo + plan_.split_k)),
        d(p_.head_dim), ldq(Tiles::q_ld(plan_)), ldv(plan_.dv_pad), lds(plan_.bk_pad), ms(round_up(mq, kPad)),
        mld(tile_ld(ms)), scale(static_cast<Acc>(p_.scale)), tiles(p_, mq),
        cache(plan_, ws_, b_, hk0_, split_, ceil_div(k_hi - k_lo, plan_.block_k)) {
    const auto& L = plan.fwd;
    q = ws.at(L.q), qt = ws.at(L.qt), kt = ws.at(L.kt), v = ws.at(L.v), s = ws.at(L.s), o = ws.at(L.o);
    stage = ws.at(L.stage), pv = ws.at(L.pv), m = ws.at(L.row_m), l = ws.at(L.row_l), alpha = ws.at(L.row_alpha);
    lo = ws.idx(L.row_lo), hi = ws.idx(L.row_hi), lo_f = ws.at(L.row_lo_f), hi_f = ws.at(L.row_hi_f);
    load_rows();
    choose_path();
  }
  ForwardTask(const ForwardTask&) = delete;
  ForwardTask& operator=(const ForwardTask&) = delete;

  // Each query head's context and Q rows, the rows' key ranges and a fresh softmax state.
  void load_rows() {
    ctx.reserve(static_cast<size_t>(nh * plan.group));
    for (int64_t x = 0; x < nh; ++x) {
      const Stack st{hk0 + x, plan.group, i0, mqh};
      for (int64_t g = 0; g < plan.group; ++g) {
        ctx.emplace_back(p, b, st.head(g * mqh));
        Tiles::load_q(p.q, b, p.q_start(b) + i0, st.head(g * mqh), mqh, d, ldq, scale,
                      q + (x * mq + g * mqh) * ldq);
      }
    }
    if constexpr (kAmxTiles<Tiles>) tiles.scale_q(p, nh * mq, ldq, q);
    for (int64_t r = 0; r < mq; ++r) ctx[0].row_range(i0 + r % mqh, lo[r], hi[r]);  // the same for every head
    for (int64_t r = 0; r < nh * ms; ++r) {
      m[r] = neg_inf<Acc>();
      l[r] = Acc(0);
    }
    lo_max = std::numeric_limits<int64_t>::min(), hi_min = std::numeric_limits<int64_t>::max();
    lo_min = hi_min, hi_max = lo_max;
    for (int64_t r = 0; r < mq; ++r) {
      lo_max = std::max(lo_max, lo[r]);
      hi_min = std::min(hi_min, hi[r]);
      if (lo[r] > hi[r]) continue;
      lo_min = std::min(lo_min, lo[r]);
      hi_max = std::max(hi_max, hi[r]);
    }
  }
  // The tiles the walks visit: those that hold keys [lo_min, hi_max], on
  // the task's tile grid, so that a narrow window does not classify every
  // tile of a long sequence.
  void key_span() {
    j_first = k_lo, j_end = k_lo;
    if (lo_min > hi_max || hi_max < k_lo || lo_min >= k_hi) return;
    j_first = k_lo + std::max<int64_t>(0, lo_min - k_lo) / bk * bk;
    j_end = std::min(k_hi, hi_max + 1);
  }

  // The task's path (task_path) and what follows from it: o's rows zeroed,
  // Q^T's layout, keys per tile and the next-tile prefetch.
  void choose_path() {
    path = task_path<T, Acc, Tiles>(p, plan, tiles, lk, mq, k_hi - k_lo, nh);
    // Decode across heads (pv_heads, finish_row) touches only each head's mq
    // rows of o; zeroing all ms rows cost short decode calls (tuning table:
    // o_rows).
    const int64_t o_rows = path.across ? mq : ms;
    for (int64_t x = 0; x < nh; ++x) std::fill_n(o + x * ms * ldv, o_rows * ldv, Acc(0));
    const bool narrow_cols = path.narrow || path.amx_narrow;  // as many columns as vectors of rows hold
    q_cols = kDotTiles<Tiles> || kAmxTiles<Tiles> ? plan.dqk_pad / 2 : plan.dqk_pad;
    qt_cols = narrow_cols ? round_up(mq, kLanes) : ms;
    qt_ld = narrow_cols ? qt_cols : mld;
    qt_head = q_cols * qt_ld;
    const int64_t narrow_bk = kDotTiles<Tiles> ? kNarrowDotKeys : narrow_keys(qt_cols);
    bk = path.narrow ? std::min(narrow_bk, plan.block_k) : plan.block_k;
    key_span();
    // The next K/V tile is prefetched for tall tiles and bf16 decode, not for
    // f32 decode tiles, which it slowed (tuning table: next-tile prefetch).
    prefetch_next = mq >= 32 || (mq <= kInPlaceRows && sizeof(T) == 2);
  }

  // The next task's Q rows and its first K/V tile (b, K/V heads from hk,
  // query block qb, split sp), which the row paths ask for along this
  // task's last tile (softmax_rows). The tile is asked for only where this
  // thread has not laid it out already: another unit's, or, under a left
  // window, one left of this task's keys (blocks run last to first).
  void aim_after(int64_t nb, int64_t hk, int64_t qb, int64_t sp, bool other_unit) {
    const int64_t i = qb * plan.head_rows;
    if (i >= p.len_q(nb)) return;
    const int64_t first = first_tile(nb, hk * plan.group, i, sp);
    const int64_t keys = std::min({plan.block_k, (sp + 1) * plan.split_k - first, p.len_k(nb) - first});
    const bool kv = keys > 0 && (other_unit || first < j_first);
    after = NextTile{p.k_start(nb) + first, hk, kv ? keys : 0};
    after.b = nb, after.q_seq0 = p.q_start(nb) + i, after.q_h0 = hk * plan.group;
    after.q_heads = plan.group * plan.kv_heads, after.q_rows = std::min(plan.head_rows, p.len_q(nb) - i);
  }
  // The first key of the tile (on split sp's grid of block_k keys) that
  // holds the first key row i of query head hq of batch nb sees.
  int64_t first_tile(int64_t nb, int64_t hq, int64_t i, int64_t sp) const {
    int64_t lo = 0, hi = 0;
    HeadCtx<Acc>(p, nb, hq).row_range(i, lo, hi);
    const int64_t k_first = sp * plan.split_k;
    return k_first + std::max<int64_t>(0, lo - k_first) / plan.block_k * plan.block_k;
  }
  // Stacked row r of K/V head x (padding rows as the last real one): its
  // query head's context and its row.
  const HeadCtx<Acc>& head_of(int64_t x, int64_t r) const {
    return ctx[static_cast<size_t>(x * plan.group + std::min(r, mq - 1) / mqh)];
  }
  int64_t row_of(int64_t r) const { return i0 + std::min(r, mq - 1) % mqh; }
  // Keys in the tile from key j (0 past the task's keys).
  int64_t keys_at(int64_t j) const { return j < k_hi ? std::min(bk, k_hi - j) : int64_t{0}; }
  // Tiles every row sees whole go without classify's look at each row
  // (tuning table: full-tile test).
  TileKind tile_kind(int64_t j0, int64_t nj) const {
    return !p.mask.data && ranges_cover(j0, nj) ? TileKind::full : ctx[0].classify(mq, lo, hi, j0, nj);
  }
  // Whether every row's causal and window range holds keys [j0, j0 + nj).
  bool ranges_cover(int64_t j0, int64_t nj) const { return lo_max <= j0 && hi_min >= j0 + nj - 1; }
};

// A tile of a task's walk: keys j0.. (nj of them, counted from the
// sequence's first) of K/V head hk0 + x, its kind, and the tile after it.
struct TileAt {
  int64_t j0, nj, x;
  TileKind kind;
  NextTile next;
};

// Runs f(j0, nj, kind) on each key tile of the task that some row sees, in order.
template <typename T, typename Acc, typename Tiles, typename F>
void walk_key_tiles(const ForwardTask<T, Acc, Tiles>& t, F&& f) {
  for (int64_t j0 = t.j_first; j0 < t.j_end; j0 += t.bk) {
    const int64_t nj = t.keys_at(j0);
    const TileKind kind = t.tile_kind(j0, nj);
    if (kind != TileKind::skip) f(j0, nj, kind);
  }
}

// Runs step(TileAt) on each tile that some row sees, in the task's order:
// each K/V head through all its keys in turn (heads_outer), or every head
// at each key tile.
template <typename T, typename Acc, typename Tiles, typename Step>
void walk_tiles(const ForwardTask<T, Acc, Tiles>& t, Step&& step) {
  const int64_t nh = t.nh, hk0 = t.hk0, k0 = t.k0, j_first = t.j_first, j_end = t.j_end, bk = t.bk;
  if (t.path.heads_outer) {
    for (int64_t x = 0; x < nh; ++x)
      for (int64_t j0 = j_first; j0 < j_end; j0 += bk) {
        const int64_t nj = t.keys_at(j0);
        const TileKind kind = t.tile_kind(j0, nj);
        if (kind == TileKind::skip) continue;
        // The tile after this one: the next keys', or the next K/V head's first.
        const bool last = j0 + bk >= j_end;
        const int64_t jn = last ? j_first : j0 + bk;
        const NextTile next{k0 + jn, hk0 + x + (last ? 1 : 0), last && x + 1 == nh ? 0 : t.keys_at(jn)};
        step(TileAt{j0, nj, x, kind, next});
      }
    return;
  }
  walk_key_tiles(t, [&](int64_t j0, int64_t nj, TileKind kind) {
    for (int64_t x = 0; x < nh; ++x) {
      // The tile after this one: the next K/V head's, or the next keys'.
      const int64_t jn = x + 1 < nh ? j0 : j0 + bk;
      const int64_t n = jn < j_end ? t.keys_at(jn) : 0;
      step(TileAt{j0, nj, x, kind, NextTile{k0 + jn, x + 1 < nh ? hk0 + x + 1 : hk0, n}});
    }
  });
}

// Every stacked row's result (finish_row), narrow tiles' O^T back to rows
// first; out's rows are asked for kRowsAhead rows ahead of their stores.
template <typename T, typename Acc, typename Tiles>
void finish_task(ForwardTask<T, Acc, Tiles>& t, Slice<Acc> shared) {
  const AttnParams& p = t.p;
  const TilePlan& plan = t.plan;
  const int64_t mq = t.mq, ms = t.ms, ldv = t.ldv, b = t.b;
  const bool ahead = plan.splits == 1 && p.out.dim_stride == 1 && mq > kRowsAhead;
  const int64_t esize = p.out_dtype == DType::f32 ? 4 : static_cast<int64_t>(sizeof(T));
  const int64_t out_bytes = p.head_dim_v * esize;
  for (int64_t x = 0; x < t.nh; ++x) {
    const Stack st{t.hk0 + x, plan.group, t.i0, t.mqh};
    const Acc* ox = t.o + x * ms * ldv;
    if (t.path.narrow) {  // O^T [dv, W] back to rows
      transpose<Acc>(p.head_dim_v, mq, ox, t.qt_cols, t.pv, ldv);  // any shape: once per task
      ox = t.pv;
    }
    for (int64_t r = 0; r < mq; ++r) {
      if (ahead && r + kRowsAhead < mq) {
        const int64_t ra = r + kRowsAhead;
        const char* row = static_cast<const char*>(p.out.data) +
                          row_offset(p.out, b, p.q_start(b) + st.row(ra), st.head(ra)) * esize;
        for (int64_t at = 0; at < out_bytes; at += 64) prefetch_w(row + at);
      }
      finish_row<T, Acc>(p, plan, shared, b, st.head(r), st.row(r), t.split, t.m[x * ms + r], t.l[x * ms + r],
                         ox + r * ldv);
    }
  }
}
