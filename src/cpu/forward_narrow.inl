// Scores down S^T's columns (ScoreCols) and the narrow tiles: 8 to 64
// query rows keeping O^T, on f32 FMAs or AVX512_BF16 dot products.
// Included by forward.inl, in order.

// What logits_row does to a row's scores after the softcap, done to S^T's
// columns (stacked query rows) in the same order with the same roundings
// (the kernels are built without FMA contraction), so that the scores are
// the backward's bit for bit:
// - ALiBi (slope null: none): column c's score of key j less slope[c] *
//   |pos[c] - j|, where pos[c], the row's position i + shift, is exact in
//   f32 (alibi_exact), so |pos[c] - j| is the integer distance logits_row
//   converts;
// - an additive bias (brow null: none): column c's score of key j plus
//   element j * bias_cs of the bias row brow[c], converted as logits_row
//   converts it;
// - a mask (mrow null: none): column c's score of key j -inf where element
//   j * mask_cs of the mask row mrow[c] is 0.
// The bias and the mask leave the columns from rows on (padding) as they are.
// After the softmax, dropout (dropout below) does to P^T's columns what
// dropout_row does to a row of P.
template <typename Acc>
struct ScoreCols {
  const Acc* slope = nullptr;
  const Acc* pos = nullptr;
  const char* const* brow = nullptr;
  const uint8_t* const* mrow = nullptr;
  int64_t rows = 0, bias_cs = 0, mask_cs = 0;
  DType bias_dtype = DType::f32;
  // Dropout, which acts on P^T after the softmax (dropout below): column c
  // draws as Philox::keep_row's row drop_x[c] of head drop_bh[c]; rng holds
  // what the heads share. Null when off.
  const uint32_t* drop_x = nullptr;
  const uint32_t* drop_bh = nullptr;
  const Philox* rng = nullptr;

  bool any() const { return slope || brow || mrow; }
  ScoreCols at(int64_t c) const {
    ScoreCols r = *this;
    if (slope) r.slope += c, r.pos += c;
    if (brow) r.brow += c;
    if (mrow) r.mrow += c;
    if (drop_x) r.drop_x += c, r.drop_bh += c;
    r.rows = std::max<int64_t>(rows - c, 0);
    return r;
  }
  // P^T [nj, cols] (row stride ld) holds keys key0.. in its rows: each
  // column's dropped keys are zeroed, the bits keep_row gives its row. The
  // 1 / (1 - p) is the output's (dropout_scale).
  void dropout(Acc* pt, int64_t nj, int64_t cols, int64_t ld, int64_t key0) const {
    if (!drop_x) return;
#if FG_PHILOX_X8
    FG_DASSERT(cols % 8 == 0);  // whole vectors of query rows
    for (int64_t c = 0; c < cols; c += 8)
      philox_drop_x8(drop_x + c, drop_bh + c, rng->off, rng->key0, rng->key1, rng->threshold, rng->col0 + key0, nj,
                     pt + c, ld);
#else
    static_assert(!FG_VEC_GEMM, "keys-major tiles draw dropout's bits in vectors (philox_drop_x8)");
    (void)pt, (void)nj, (void)cols, (void)ld, (void)key0;
#endif
  }
  // st [nj, cols] (row stride ld) holds keys key0.. in its rows.
  void apply(Acc* st, int64_t nj, int64_t cols, int64_t ld, int64_t key0) const {
    if (slope)
      for (int64_t j = 0; j < nj; ++j) {
        const Acc key = static_cast<Acc>(key0 + j);
        Acc* row = st + j * ld;
        for (int64_t c = 0; c < cols; ++c) row[c] -= slope[c] * std::fabs(pos[c] - key);
      }
    if (brow) switch (bias_dtype) {
        case DType::bf16: add_bias<bf16_t>(st, nj, cols, ld, key0); break;
        case DType::f16: add_bias<f16_t>(st, nj, cols, ld, key0); break;
        case DType::f64: add_bias<double>(st, nj, cols, ld, key0); break;
        default: add_bias<float>(st, nj, cols, ld, key0); break;
      }
    if (mrow) mask(st, nj, cols, ld, key0);
  }
  void mask(Acc* st, int64_t nj, int64_t cols, int64_t ld, int64_t key0) const {
    for (int64_t c = 0; c < std::min(cols, rows); ++c) {
      const uint8_t* r = mrow[c] + key0 * mask_cs;
      for (int64_t j = 0; j < nj; ++j) st[j * ld + c] = keep_or_neg_inf(st[j * ld + c], r[j * mask_cs] != 0);
    }
  }
  // Columns [c0, c1) over keys [j0, j1), one column at a time.
  template <typename B>
  void add_bias_cols(Acc* st, int64_t ld, int64_t key0, int64_t c0, int64_t c1, int64_t j0, int64_t j1) const {
    for (int64_t c = c0; c < c1; ++c) {
      const B* r = reinterpret_cast<const B*>(brow[c]) + key0 * bias_cs;
      for (int64_t j = j0; j < j1; ++j) st[j * ld + c] += static_cast<Acc>(to_float(r[j * bias_cs]));
    }
  }
  // Panels of kBiasPanel columns whose bias rows lie evenly apart (one
  // query head's) are transposed from their rows in register blocks, keys
  // contiguous, and added to S^T's rows as vectors: down S^T's columns
  // every score missed L1, and along its rows the bias rows (a power of two
  // apart at L = 2048) fought over L1's sets; either way the bias took a
  // third of the forward (f32, d = 64, L = 2048, 8 heads, 1 thread).
  static constexpr int64_t kBiasPanel = 16, kBiasKeys = 64;
  template <typename B>
  void add_bias(Acc* st, int64_t nj, int64_t cols, int64_t ld, int64_t key0) const {
    const int64_t n = std::min(cols, rows);
    int64_t c = 0;
#if FG_VEC_GEMM
    if constexpr (std::is_same<Acc, float>::value && !std::is_same<B, double>::value) {
      const int64_t nb = nj / kTransposeBlock * kTransposeBlock;
      alignas(64) float tmp[kBiasPanel * kBiasKeys];
      for (; bias_cs == 1 && nb > 0 && c + kBiasPanel <= n; c += kBiasPanel) {
        const std::ptrdiff_t step = brow[c + 1] - brow[c];
        bool even = step % static_cast<std::ptrdiff_t>(sizeof(B)) == 0;
        for (int64_t x = 2; x < kBiasPanel; ++x) even = even && brow[c + x] - brow[c + x - 1] == step;
        if (!even) {
          add_bias_cols<B>(st, ld, key0, c, c + kBiasPanel, 0, nj);
          continue;
        }
        const B* src = reinterpret_cast<const B*>(brow[c]) + key0;
        for (int64_t j0 = 0; j0 < nb; j0 += kBiasKeys) {
          const int64_t w = std::min(kBiasKeys, nb - j0);
          transpose_cvt(kBiasPanel, w, src + j0, step / static_cast<std::ptrdiff_t>(sizeof(B)), tmp, kBiasPanel);
          for (int64_t j = 0; j < w; ++j)
            for (int64_t x = 0; x < kBiasPanel; x += kLanes) {
              float* d = st + (j0 + j) * ld + c + x;
              vstore(d, vadd(vload(d), vload(tmp + j * kBiasPanel + x)));
            }
        }
        add_bias_cols<B>(st, ld, key0, c, c + kBiasPanel, nb, nj);
      }
    }
#endif
    add_bias_cols<B>(st, ld, key0, c, n, 0, nj);
  }
};

// The rows of the tile after this one: n rows from seq0 of K/V head hk (n = 0: none).
struct NextTile {
  int64_t seq0, hk, n;
  const char* held = nullptr;  // or its K/V pairs, held_bytes of them (PairTileCache)
  int64_t held_bytes = 0;
};

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
// those are still keys of batch b. 0: none.
template <typename TA>
int64_t narrow_ahead(const AttnParams& p, const Operand& o, int64_t b, int64_t seq0, int64_t hk, int64_t nj,
                     const NextTile& next, bool in_place, int64_t ld) {
  if (!in_place) return 0;
  if constexpr (kNarrowPrefetchNext) {
    (void)p, (void)nj, (void)ld;
    if (!next.n) return 0;
    return (row_offset(o, b, next.seq0, next.hk) - row_offset(o, b, seq0, hk)) * static_cast<int64_t>(sizeof(TA));
  } else {
    (void)o, (void)hk, (void)next;
    const int64_t row_bytes = ld * static_cast<int64_t>(sizeof(TA));
    const bool near = row_bytes < kPageBytes;
    return near && seq0 + kNarrowAheadKeys + nj <= p.k_start(b) + p.len_k(b) ? kNarrowAheadKeys * row_bytes : 0;
  }
}

// A narrow tile's steps between its products, on S^T [nj, W] (in st): its
// cap, ALiBi, bias and mask (sc), and the softmax step on m, l and alpha
// ([W]), which leaves P^T in st.
template <int Nv>
void narrow_softmax(const AttnParams& p, int64_t nj, float* st, float* m, float* l, float* alpha, const float* lo,
                    const float* hi, const ScoreCols<float>& sc, int64_t j0) {
  constexpr int64_t W = Nv * kLanes;
  if (p.softcap > 0) softcap_row(st, nj * W, static_cast<float>(p.softcap), nullptr);
  sc.apply(st, nj, W, W, j0);
  softmax_cols(st, nj, W, W, m, l, alpha, lo, hi, static_cast<float>(j0));
  sc.dropout(st, nj, W, W, j0);
}

// narrow_tile's products and softmax for one chunk of W query rows (columns
// of qt and ot, whose rows are ld apart, or W without chunks) over K rows kr
// and V rows vr (kr_ld, vr_ld: their strides), of f32, or of bf16 read where
// they lie.
template <int Nv, bool Chunked, typename TK, typename TV>
void narrow_products(const AttnParams& p, int64_t b, int64_t seq0, int64_t hk, int64_t nj, const NextTile& next,
                     const TK* kr, int64_t kr_ld, bool k_in_place, const TV* vr, int64_t vr_ld, bool v_in_place,
                     const float* qt, int64_t chunked_ld, float* st, float* m, float* l, float* alpha, float* ot,
                     const float* lo, const float* hi, const ScoreCols<float>& sc, int64_t j0) {
  constexpr int64_t W = Nv * kLanes;
  const int64_t ld = Chunked ? chunked_ld : W;
  constexpr int Mr = kNarrowAcc / Nv;
  constexpr int MrK = std::is_same<TK, float>::value ? (Mr < 8 ? Mr : 8) : narrow_bf16_rows(Nv);
  constexpr int MrV = std::is_same<TV, float>::value ? Mr : narrow_bf16_rows(Nv);
  const int64_t k_ahead = narrow_ahead<TK>(p, p.k, b, seq0, hk, nj, next, k_in_place, kr_ld);
  const int64_t v_ahead = narrow_ahead<TV>(p, p.v, b, seq0, hk, nj, next, v_in_place, vr_ld);
  const ScoreScale<float> sscale(p.scale);
  if (k_ahead)
    gemm_f32<MrK, Nv, Epi::store, true>(nj, W, p.head_dim, kr, kr_ld, 1, qt, ld, st, W, nullptr, k_ahead, sscale);
  else
    gemm_f32<MrK, Nv>(nj, W, p.head_dim, kr, kr_ld, 1, qt, ld, st, W, nullptr, 0, sscale);
  narrow_softmax<Nv>(p, nj, st, m, l, alpha, lo, hi, sc, j0);
  if (v_ahead)
    gemm_f32<MrV, Nv, Epi::add_cols, true>(p.head_dim_v, W, nj, vr, 1, vr_ld, st, W, ot, ld, alpha, v_ahead);
  else
    gemm_f32<MrV, Nv, Epi::add_cols>(p.head_dim_v, W, nj, vr, 1, vr_ld, st, W, ot, ld, alpha);
}

// A narrow tile of w query rows in chunks of kNarrowWidth (the last one
// kLanes to kNarrowWidth wide), each through both products over the same
// K and V rows, which the later chunks find in L1 or L2; the first asks for
// the next tile's rows.
template <typename TK, typename TV>
void narrow_chunks(const AttnParams& p, int64_t b, int64_t seq0, int64_t hk, int64_t nj, const NextTile& next,
                   const TK* kr, int64_t kr_ld, bool k_in_place, const TV* vr, int64_t vr_ld, bool v_in_place,
                   int64_t w, const float* qt, float* st, float* m, float* l, float* alpha, float* ot,
                   const float* lo, const float* hi, const ScoreCols<float>& sc, int64_t j0) {
  // bf16 pairs read in place run in chunks of two vectors, but for a tile
  // of three, whose 3 x 3 blocks outran them: the four-vector chunk's
  // 2-row blocks wait on FMA latency (tuning table: bf16 chunk width).
  const int64_t chunk_w = std::is_same<TK, float>::value || w <= 3 * kLanes ? kNarrowWidth : 2 * kLanes;
  constexpr int64_t kMaxVecs = kNarrowWidth / kLanes;
  static_assert(kMaxVecs >= 1 && kMaxVecs <= 4, "narrow tiles are one to four vectors wide");
  for (int64_t c = 0; c < w; c += chunk_w) {
    const NextTile nx = c == 0 ? next : NextTile{0, 0, 0};
    // A single chunk's W as a constant: with w in a register, Lq = 16 and 32
    // ran 1-4% slower.
    const auto chunk = [&](auto nv) {
      const auto run = [&](auto chunked) {
        narrow_products<decltype(nv)::value, decltype(chunked)::value>(
            p, b, seq0, hk, nj, nx, kr, kr_ld, k_in_place, vr, vr_ld, v_in_place, qt + c, w, st, m + c, l + c,
            alpha + c, ot + c, lo ? lo + c : nullptr, hi ? hi + c : nullptr, sc.at(c), j0);
      };
      if (w > chunk_w)
        run(std::true_type{});
      else
        run(std::false_type{});
    };
    switch (std::min(chunk_w, w - c) / kLanes) {
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
// stages first (tuning table: FG_BF16_PAIRS). The products give the staged
// path's results bit for bit.
template <typename T>
void narrow_tile(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t seq0, int64_t hk, int64_t nj,
                 const NextTile& next, int64_t w, const float* qt, float* vstage, float* kstage, float* st, float* m,
                 float* l, float* alpha, float* ot, const float* lo, const float* hi, const ScoreCols<float>& sc,
                 int64_t j0) {
#if FG_BF16_PAIRS
  if constexpr (std::is_same<T, bf16_t>::value) {
    if (p.k.dim_stride == 1 && p.v.dim_stride == 1) {
      const T* kr = static_cast<const T*>(p.k.data) + row_offset(p.k, b, seq0, hk);
      const T* vr = static_cast<const T*>(p.v.data) + row_offset(p.v, b, seq0, hk);
      return narrow_chunks(p, b, seq0, hk, nj, next, kr, p.k.seq_stride, true, vr, p.v.seq_stride, true, w, qt, st,
                           m, l, alpha, ot, lo, hi, sc, j0);
    }
  }
#endif
  int64_t kr_ld = 0, vr_ld = 0;
  const float* kr = rows_f32<T>(p.k, b, seq0, hk, nj, p.head_dim, plan.dqk_pad, kstage, kr_ld);
  const float* vr = rows_f32<T>(p.v, b, seq0, hk, nj, p.head_dim_v, plan.dv_pad, vstage, vr_ld);
  narrow_chunks(p, b, seq0, hk, nj, next, kr, kr_ld, kr != kstage, vr, vr_ld, vr != vstage, w, qt, st, m, l, alpha,
                ot, lo, hi, sc, j0);
}
#endif

#if FG_BF16_DOT
// The lines of K or V (o, dim elements a row) that head x of a task's nh
// K/V heads (from hk - x) asks L2 for during its block of `keys` keys from
// seq0: those of the block kNarrowDotAhead on. K's are asked for during
// each 16-key block's S^T, V's during the tile's P V: during S^T alone
// they came in bursts. Where the task's heads lie side by side in each row
// ([batch, seq, heads, dim]), head x takes rows x * keys / nh.. of that
// block whole, across every head, so that the heads together ask for it in
// memory order; a head's own rows alone, short pieces a row apart, kept the
// reads waiting (tuning table: narrow_dot_walk). A head's own rows
// otherwise, where they lie closer than a page apart (narrow_ahead).
inline LineWalk narrow_dot_walk(const AttnParams& p, const Operand& o, int64_t dim, int64_t b, int64_t seq0,
                                int64_t hk, int64_t x, int64_t nh, int64_t keys) {
  const int64_t row_bytes = o.seq_stride * 2, span = dim * 2;
  if (seq0 + kNarrowDotAhead + keys > p.k_start(b) + p.len_k(b) || span % 64 != 0) return LineWalk{};
  const auto* base = static_cast<const char*>(o.data);
  const int64_t ahead = seq0 + kNarrowDotAhead;
  if (nh > 1 && o.head_stride == dim) {
    const int64_t r0 = x * keys / nh, r1 = (x + 1) * keys / nh;
    return LineWalk(base + row_offset(o, b, ahead + r0, hk - x) * 2, r1 - r0, nh * span, row_bytes);
  }
  if (row_bytes >= kPageBytes) return LineWalk{};
  return LineWalk(base + row_offset(o, b, ahead, hk) * 2, keys, span, row_bytes);
}

// A narrow tile of bf16 on AVX512_BF16 dot products, w <= 32 query rows:
//   S^T [nj <= 64, w] = scale * K Q^T   16 keys at a time, K's rows as pairs
//                                       transposed into kt
//                                       (load_pairs_keys16), qtp = Q^T as
//                                       pairs [dqk_pad / 2, w]
//   O^T [dv_pad, w] = O^T * alpha + V^T P^T   V's pair rows in vp
//                                       (interleave_bf16_rows), P^T's pairs
//                                       [nj / 2, w] in ptp (interleave_f32_rows)
// with narrow_softmax between. S^T's sums are gemm_bf16's, so every score
// is the row path's and the backward's (PairBackward<DotProducts>) bit for
// bit; P is rounded to bf16 as the row path's is.
template <int Nv>
void narrow_dot_products(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t seq0, int64_t hk, int64_t x,
                         int64_t nh, int64_t nj, const uint32_t* qtp, uint32_t* kt, uint32_t* vp, uint32_t* ptp,
                         float* st, float* m, float* l, float* alpha, float* ot, const float* lo, const float* hi,
                         const ScoreCols<float>& sc, int64_t j0) {
  constexpr int64_t W = Nv * kLanes;
  FG_DASSERT(nj <= kNarrowDotKeys && p.k.dim_stride == 1 && p.v.dim_stride == 1);
  const auto* kr = static_cast<const uint16_t*>(p.k.data) + row_offset(p.k, b, seq0, hk);
  for (int64_t u = 0; u < nj; u += 16) {
    load_pairs_keys16(kr + u * p.k.seq_stride, p.k.seq_stride, std::min<int64_t>(16, nj - u), p.head_dim, kt);
    LineWalk wk = narrow_dot_walk(p, p.k, p.head_dim, b, seq0 + u, hk, x, nh, 16), none;
    gemm_bf16_keys16<Nv>((p.head_dim + 1) / 2, kt, qtp, W, st + u * W, W, static_cast<float>(p.scale), wk, none);
    wk.rest();
  }
  narrow_softmax<Nv>(p, nj, st, m, l, alpha, lo, hi, sc, j0);
  const int64_t kp = round_up(nj, int64_t{16}) / 2;  // P^T is 0 past key nj
  for (int64_t u = 0; u < kp; ++u) {
    if (2 * u >= nj) {
      std::memset(ptp + u * W, 0, W * 4);
      continue;
    }
    interleave_f32_rows(st + 2 * u * W, 2 * u + 1 < nj ? st + (2 * u + 1) * W : nullptr, W, ptp + u * W);
  }
  Bf16DotTiles::load_pair_rows(p.v, b, seq0, hk, nj, p.head_dim_v, kp, plan.dv_pad, vp);
  LineWalk wv = narrow_dot_walk(p, p.v, p.head_dim_v, b, seq0, hk, x, nh, nj);
  gemm_bf16_cols<Nv>(plan.dv_pad, kp, vp, plan.dv_pad, ptp, ot, W, alpha, &wv);
  wv.rest();
}

inline void narrow_dot_tile(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t seq0, int64_t hk,
                            int64_t x, int64_t nh, int64_t nj, int64_t w, const uint32_t* qtp, uint32_t* kt,
                            uint32_t* vp, uint32_t* ptp, float* st, float* m, float* l, float* alpha, float* ot,
                            const float* lo, const float* hi, const ScoreCols<float>& sc, int64_t j0) {
  if (w <= kLanes)
    return narrow_dot_products<1>(p, plan, b, seq0, hk, x, nh, nj, qtp, kt, vp, ptp, st, m, l, alpha, ot, lo, hi, sc,
                                  j0);
  FG_DASSERT(w == 2 * kLanes);
  narrow_dot_products<2>(p, plan, b, seq0, hk, x, nh, nj, qtp, kt, vp, ptp, st, m, l, alpha, ot, lo, hi, sc, j0);
}
#endif

// narrow_tile for w (mq rounded up to kLanes) query rows.
template <typename T, typename Acc>
void narrow_step(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t seq0, int64_t hk, int64_t nj,
                 const NextTile& next, int64_t w, const Acc* qt, Acc* vstage, Acc* kstage, Acc* st, Acc* m, Acc* l,
                 Acc* alpha, Acc* ot, const Acc* lo, const Acc* hi, const ScoreCols<Acc>& sc, int64_t j0) {
#if FG_VEC_GEMM
  if constexpr (std::is_same<Acc, float>::value)
    return narrow_tile<T>(p, plan, b, seq0, hk, nj, next, w, qt, vstage, kstage, st, m, l, alpha, ot, lo, hi, sc,
                          j0);
#endif
  (void)p, (void)plan, (void)b, (void)seq0, (void)hk, (void)nj, (void)next, (void)w, (void)qt, (void)vstage,
  (void)kstage;
  (void)st, (void)m, (void)l, (void)alpha, (void)ot, (void)lo, (void)hi, (void)sc, (void)j0;
}
