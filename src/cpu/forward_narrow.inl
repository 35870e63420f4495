// The narrow path: query tiles of kNarrowMinRows to kNarrowMaxRows stacked
// rows keeping O^T, on f32 FMAs (narrow_usable, forward_paths.inl).
// Included by forward.inl, in order.

#if FG_VEC_GEMM
// One narrow tile (see narrow_usable) of Nv vectors of query rows: S^T
// [nj, W] into st (capped where a softcap is set, as keys_major_tile caps
// its rows), the softmax step on m, l and alpha ([W]), keys j0..
// outside [lo, hi] masked (lo null: a full tile), and ot [dv, W] = ot * alpha
// + V^T P^T. The S^T blocks take 8 key rows: each row is a pointer of its
// own, and 16 of them spilled to vector registers (tuning table: narrow S^T
// key rows).
//
// K and V rows read in place closer than a 4 KiB page apart (a head's rows
// contiguous, as in [batch, heads, seq, dim], or few heads) are asked for
// kNarrowAheadKeys keys ahead from inside the products, spread over their
// steps. Rows a page or more apart (8 heads of d = 128 interleaved) start a
// page each, and the hardware prefetchers, following 32 pages at once, keep
// ahead of the products on their own. Both ISAs now ask for the next tile's
// rows instead, whatever the layout (tuning table: kNarrowAheadKeys,
// kNarrowPrefetchNext).
constexpr int64_t kNarrowAheadKeys = 32;

// The byte offset from rows of o read in place (ld: their stride in
// elements of TA) to the rows the products ask L2 for: with
// kNarrowPrefetchNext, the next tile's (none after the last); else the
// rows kNarrowAheadKeys ahead when rows lie closer than a page apart and
// those are still keys of batch c.b. 0: none.
template <typename TA>
int64_t narrow_ahead(const AttnParams& p, const Operand& o, const ColTile<float>& c, bool in_place, int64_t ld) {
  if (!in_place) return 0;
  if constexpr (kNarrowPrefetchNext) {
    (void)p, (void)ld;
    if (!c.next.n) return 0;
    return (row_offset(o, c.b, c.next.seq0, c.next.hk) - row_offset(o, c.b, c.seq0, c.hk)) *
           static_cast<int64_t>(sizeof(TA));
  } else {
    (void)o;
    const int64_t row_bytes = ld * static_cast<int64_t>(sizeof(TA));
    const bool near = row_bytes < kPageBytes;
    return near && c.seq0 + kNarrowAheadKeys + c.nj <= p.k_start(c.b) + p.len_k(c.b) ? kNarrowAheadKeys * row_bytes
                                                                                        : 0;
  }
}

// A narrow tile's steps between its products, on S^T [nj, W] (in c.st): its
// cap, ALiBi, bias and mask (c.sc), and the softmax step on m, l and alpha
// ([W]), which leaves P^T in c.st.
template <int Nv>
void narrow_softmax(const AttnParams& p, const ColTile<float>& c) {
  constexpr int64_t W = Nv * kLanes;
  const int64_t nj = c.nj, j0 = c.j0;
  float* st = c.st;
  if (p.softcap > 0) softcap_row(st, nj * W, static_cast<float>(p.softcap), nullptr);
  c.sc.apply(st, nj, W, W, j0);
  softmax_cols(st, nj, W, W, c.m, c.l, c.alpha, c.lo, c.hi, static_cast<float>(j0));
  c.sc.dropout(st, nj, W, W, j0);
}

// Where a narrow tile's K and V rows are read: f32 rows, or bf16 read
// where they lie (k_ld, v_ld: their strides in elements).
template <typename TK, typename TV>
struct NarrowRows {
  const TK* k;
  int64_t k_ld;
  bool k_in_place;
  const TV* v;
  int64_t v_ld;
  bool v_in_place;
};

// narrow_tile's products and softmax for one chunk of W query rows (columns
// of c.qt and c.o, whose rows are c.ld apart, or W without chunks).
template <int Nv, bool Chunked, typename TK, typename TV>
void narrow_products(const AttnParams& p, const ColTile<float>& c, const NarrowRows<TK, TV>& kv) {
  constexpr int64_t W = Nv * kLanes;
  const int64_t ld = Chunked ? c.ld : W;
  constexpr int Mr = kNarrowAcc / Nv;
  constexpr int MrK = std::is_same<TK, float>::value ? (Mr < 8 ? Mr : 8) : narrow_bf16_rows(Nv);
  constexpr int MrV = std::is_same<TV, float>::value ? Mr : narrow_bf16_rows(Nv);
  const int64_t k_ahead = narrow_ahead<TK>(p, p.k, c, kv.k_in_place, kv.k_ld);
  const int64_t v_ahead = narrow_ahead<TV>(p, p.v, c, kv.v_in_place, kv.v_ld);
  const ScoreScale<float> sscale(p.scale);
  const int64_t nj = c.nj;
  if (k_ahead)
    gemm_f32<MrK, Nv, Epi::store, true>(nj, W, p.head_dim, kv.k, kv.k_ld, 1, c.qt, ld, c.st, W, nullptr, k_ahead,
                                        sscale);
  else
    gemm_f32<MrK, Nv>(nj, W, p.head_dim, kv.k, kv.k_ld, 1, c.qt, ld, c.st, W, nullptr, 0, sscale);
  narrow_softmax<Nv>(p, c);
  if (v_ahead)
    gemm_f32<MrV, Nv, Epi::add_cols, true>(p.head_dim_v, W, nj, kv.v, 1, kv.v_ld, c.st, W, c.o, ld, c.alpha,
                                           v_ahead);
  else
    gemm_f32<MrV, Nv, Epi::add_cols>(p.head_dim_v, W, nj, kv.v, 1, kv.v_ld, c.st, W, c.o, ld, c.alpha);
}

// A narrow tile of c.cols query rows in chunks of kNarrowWidth (the last one
// kLanes to kNarrowWidth wide), each through both products over the same
// K and V rows, which the later chunks find in L1 or L2; the first asks for
// the next tile's rows.
template <typename TK, typename TV>
void narrow_chunks(const AttnParams& p, const ColTile<float>& c, const NarrowRows<TK, TV>& kv) {
  const int64_t w = c.cols;
  // bf16 pairs read in place run in chunks of two vectors, but for a tile
  // of three, whose 3 x 3 blocks outran them: the four-vector chunk's
  // 2-row blocks wait on FMA latency (tuning table: bf16 chunk width).
  const int64_t chunk_w = std::is_same<TK, float>::value || w <= 3 * kLanes ? kNarrowWidth : 2 * kLanes;
  constexpr int64_t kMaxVecs = kNarrowWidth / kLanes;
  static_assert(kMaxVecs >= 1 && kMaxVecs <= 4, "narrow tiles are one to four vectors wide");
  for (int64_t off = 0; off < w; off += chunk_w) {
    const ColTile<float> part = c.chunk(off);
    // A single chunk's W as a constant: with w in a register, Lq = 16 and 32
    // ran 1-4% slower.
    const auto chunk = [&](auto nv) {
      const auto run = [&](auto chunked) {
        narrow_products<decltype(nv)::value, decltype(chunked)::value>(p, part, kv);
      };
      if (w > chunk_w)
        run(std::true_type{});
      else
        run(std::false_type{});
    };
    switch (std::min(chunk_w, w - off) / kLanes) {
      case 1: chunk(std::integral_constant<int, 1>{}); break;
      case 2: if constexpr (kMaxVecs >= 2) chunk(std::integral_constant<int, 2>{}); break;
      case 3: if constexpr (kMaxVecs >= 3) chunk(std::integral_constant<int, 3>{}); break;
      case 4: if constexpr (kMaxVecs >= 4) chunk(std::integral_constant<int, 4>{}); break;
      default: FG_DASSERT(false);
    }
  }
}

// bf16 K and V rows with unit dim stride are read where they lie where the
// ISA broadcasts bf16 pairs (FG_BF16_PAIRS), instead of converted into f32
// stages (c.kbuf, c.vbuf) first (tuning table: FG_BF16_PAIRS). The products
// give the staged path's results bit for bit.
template <typename T>
void narrow_tile(const AttnParams& p, const TilePlan& plan, const ColTile<float>& c) {
#if FG_BF16_PAIRS
  if constexpr (std::is_same<T, bf16_t>::value) {
    if (p.k.dim_stride == 1 && p.v.dim_stride == 1) {
      const T* kr = static_cast<const T*>(p.k.data) + row_offset(p.k, c.b, c.seq0, c.hk);
      const T* vr = static_cast<const T*>(p.v.data) + row_offset(p.v, c.b, c.seq0, c.hk);
      return narrow_chunks(p, c, NarrowRows<T, T>{kr, p.k.seq_stride, true, vr, p.v.seq_stride, true});
    }
  }
#endif
  int64_t kr_ld = 0, vr_ld = 0;
  const float* kr = rows_f32<T>(p.k, c.b, c.seq0, c.hk, c.nj, p.head_dim, plan.dqk_pad, c.kbuf, kr_ld);
  const float* vr = rows_f32<T>(p.v, c.b, c.seq0, c.hk, c.nj, p.head_dim_v, plan.dv_pad, c.vbuf, vr_ld);
  narrow_chunks(p, c, NarrowRows<float, float>{kr, kr_ld, kr != c.kbuf, vr, vr_ld, vr != c.vbuf});
}
#endif

// The narrow path's task: Q^T and the score columns (keys_major_setup),
// then every tile narrow, with K in stage and V in v where they are staged.
template <typename T, typename Acc, typename Tiles>
void narrow_task(ForwardTask<T, Acc, Tiles>& t) {
#if FG_VEC_GEMM
  if constexpr (std::is_same<Acc, float>::value && std::is_same<Tiles, AccTiles<T, Acc>>::value) {
    const ScoreCols<Acc> cols = keys_major_setup(t);
    walk_tiles(t, [&](const TileAt& at) {
      ColTile<Acc> c = col_tile(t, cols, at);
      c.kbuf = t.stage, c.vbuf = t.v;
      narrow_tile<T>(t.p, t.plan, c);
    });
  }
#endif
  (void)t;
}
