// The forward's tile products on f32 tiles (AccTiles) and on AVX512_BF16
// dot products (Bf16DotTiles): load Q, K and V, S = Q K^T, O += P V.
// Included by forward.inl, in order.

template <typename T, typename Acc>
struct AccTiles {
  const T* v_rows = nullptr;  // this tile's V rows when read in place
  int64_t v_ld = 0;
  bool v_in_place = false;
  // At 1 to kWholeRows query rows, K rows are read in place too where the ISA
  // transposes in registers (scores_rows_whole): the K^T tile's transpose
  // waited on K's loads and its 32 KiB of stores (d = 128) pushed them out
  // of L1 (tuning table: kWholeRows).
  const char* k_pf_end = nullptr;  // set_ahead
  const char* v_pf_end = nullptr;
  const T* k_rows = nullptr;  // this tile's K rows (k_n of them) when read in place
  int64_t k_ld = 0, k_n = 0;
  bool k_in_place = false;
  ScoreScale<Acc> score_scale;
  AccTiles(const AttnParams& p, int64_t mq) : score_scale(p.scale) {
    v_in_place = kVecGemm && std::is_same<Acc, float>::value && mq <= std::max(kInPlaceRows, kWholeRows) &&
                 p.v.dim_stride == 1 && p.head_dim_v % kPad == 0;
    k_in_place = std::is_same<Acc, float>::value && mq <= kWholeRows && p.k.dim_stride == 1 &&
                 p.head_dim % kLanes == 0;
  }
  // Elements per row of the Q tile.
  static int64_t q_ld(const TilePlan& plan) { return plan.dqk_pad; }
  // Rows [seq0, seq0 + n) of head h of q into dst ([n, ld]); the scale goes on S (qk).
  static void load_q(const Operand& q, int64_t b, int64_t seq0, int64_t h, int64_t n, int64_t d, int64_t ld,
                     Acc, Acc* dst) {
    load_tile<T>(q, b, seq0, h, n, d, ld, dst);
  }
  // K^T [dqk_pad, bk_pad] into kt and V [nj, dv_pad] into v (or v_rows).
  void load_kv(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t seq0, int64_t hk, int64_t nj, Acc* kt,
               Acc* v, Acc* stage) {
    if (k_in_place) {
      k_rows = static_cast<const T*>(p.k.data) + row_offset(p.k, b, seq0, hk);
      k_ld = p.k.seq_stride;
      k_n = nj;
    } else {
      load_tile_t<T>(p.k, b, seq0, hk, nj, p.head_dim, plan.bk_pad, plan.bk_pad, kt, stage);
    }
    if (!v_in_place) return load_tile<T>(p.v, b, seq0, hk, nj, p.head_dim_v, plan.dv_pad, v);
    v_rows = static_cast<const T*>(p.v.data) + row_offset(p.v, b, seq0, hk);
    v_ld = p.v.seq_stride;
  }
  // Rows read in place and contiguous in memory ([batch, heads, seq, dim]):
  // the whole-row products read 8 of them side by side, a few bytes of each
  // at a time, slower from DRAM than memory order; asking L2 for the rows
  // two 8-row blocks ahead, in memory order, wins most of it back (tuning
  // table: set_ahead). Up to n rows from this tile's first (keys of the same
  // head that exist); none where rows have gaps between them.
  void set_ahead(const AttnParams& p, int64_t n) {
    const bool k_dense = k_in_place && p.k.seq_stride == p.head_dim;
    const bool v_dense = v_in_place && p.v.seq_stride == p.head_dim_v;
    k_pf_end = k_dense ? reinterpret_cast<const char*>(k_rows + n * k_ld) : nullptr;
    v_pf_end = v_dense ? reinterpret_cast<const char*>(v_rows + n * v_ld) : nullptr;
  }
  // s [mq, bk_pad] = scale * q k^T.
  void qk(const TilePlan& plan, int64_t mq, int64_t d, const Acc* q, const Acc* kt, Acc, Acc* s) const {
#if FG_TRANSPOSE_REGS
    if constexpr (std::is_same<Acc, float>::value) {
      if (k_in_place) {
        return with_rows(mq, [&](auto m) {
          scores_rows_whole<decltype(m)::value>(k_n, d, q, plan.dqk_pad, k_rows, k_ld, s, plan.bk_pad, k_pf_end,
                                                score_scale);
        });
      }
    }
#endif
    gemm_nn(mq, plan.bk_pad, d, q, plan.dqk_pad, 1, kt, plan.bk_pad, s, plan.bk_pad, score_scale);
  }
  // o [mq, dv_pad] = o * alpha + P v over the tile's nj keys, P in s; pv is scratch.
  void pv(const TilePlan& plan, int64_t mq, int64_t nj, Acc* s, const Acc* v, const Acc* alpha, Acc* o,
          Acc* pv) const {
#if FG_VEC_GEMM
    if constexpr (std::is_same<Acc, float>::value) {
      if (v_in_place && mq <= kWholeRows)
        return with_rows(mq, [&](auto m) {
          gemm_rows_whole<decltype(m)::value>(plan.dv_pad, nj, s, plan.bk_pad, v_rows, v_ld, pv, o, plan.dv_pad, alpha,
                                              v_pf_end);
        });
      if (v_in_place)
        return gemm_f32<kGemmMr, kGemmVecs, Epi::add_rows>(mq, plan.dv_pad, nj, s, plan.bk_pad, 1, v_rows, v_ld, o,
                                                           plan.dv_pad, alpha);
    }
#endif
    gemm_nn_acc(mq, plan.dv_pad, nj, s, plan.bk_pad, 1, v, plan.dv_pad, o, plan.dv_pad, alpha, pv);
  }
};

#if FG_BF16_DOT
// bf16 storage on AVX512_BF16 dot products (kernels_avx512bf16.cpp). The
// tiles hold bf16 pairs (vec_avx512.inl) in the Acc buffers' space:
//   Q   [rows, dqk_pad / 2]     pairs along d, not scaled (rounding q * scale
//                               to bf16 would lose bits: the scale goes on S in f32)
//   K   [dqk_pad / 2, bk_pad]   pairs along d, key j in column j: rows of K as
//                               pairs, transposed as 32-bit words
//   V   [bk_pad / 2, dv_pad]    pairs of consecutive keys
//   P   [mq, bk_pad / 2]        S's own rows after exp and dropout, rounded
//                               to bf16 in place (row stride bk_pad words)
// Odd d and odd key counts pad the last pair with zero. The dot products run
// in index order, so with a power-of-two scale S is bit for bit the f32
// tiles' (scale q) . k; with another scale they differ by rounding, so the
// backward recomputes S on the same dot products (PairBackward<DotProducts>).
struct Bf16DotTiles {
  // The grain of a cut tile's columns: one vector of keys (tuning table:
  // kCutKeys).
  static constexpr int64_t kCutKeys = 16;
  Bf16DotTiles(const AttnParams&, int64_t) {}
  static int64_t q_ld(const TilePlan& plan) { return plan.dqk_pad / 2; }
  // Row seq of head h of a bf16 operand (n elements) as ld pairs.
  static void load_pairs(const Operand& o, int64_t b, int64_t seq, int64_t h, int64_t n, int64_t ld, uint32_t* dst) {
    const uint16_t* src = static_cast<const uint16_t*>(o.data) + row_offset(o, b, seq, h);
    if (o.dim_stride == 1) return load_bf16_pairs(src, n, ld, dst);
    for (int64_t x = 0; x < ld; ++x) {
      const uint32_t first = 2 * x < n ? src[2 * x * o.dim_stride] : 0;
      const uint32_t second = 2 * x + 1 < n ? src[(2 * x + 1) * o.dim_stride] : 0;
      dst[x] = first << 16 | second;
    }
  }
  static void load_q(const Operand& q, int64_t b, int64_t seq0, int64_t h, int64_t n, int64_t d, int64_t ld,
                     float, float* dst) {
    for (int64_t r = 0; r < n; ++r) {
      if (r + kRowsAhead < n) prefetch_rows<bf16_t>(q, b, seq0 + r + kRowsAhead, h, 1, d);
      load_pairs(q, b, seq0 + r, h, d, ld, reinterpret_cast<uint32_t*>(dst + r * ld));
    }
  }
  // Rows [seq0, seq0 + n) of head h of o (dim elements each) as pairs,
  // transposed as 32-bit words: dst [round_up(dim, kPad) / 2, ld], row n of
  // it on zero up to w; stage holds [w, round_up(dim, kPad) / 2] words.
  static void load_pairs_t(const Operand& o, int64_t b, int64_t seq0, int64_t h, int64_t n, int64_t dim, int64_t w,
                           int64_t ld, float* dst, float* stage) {
    const int64_t dp = round_up(dim, kPad) / 2;
    auto* st = reinterpret_cast<uint32_t*>(stage);
    for (int64_t r = 0; r < n; ++r) load_pairs(o, b, seq0 + r, h, dim, dp, st + r * dp);
    std::memset(st + n * dp, 0, static_cast<size_t>((w - n) * dp) * 4);
    transpose(w, dp, stage, dp, dst, ld);
  }
  // Pair row x of dst ([pairs, pad] words) = rows seq0 + 2x and seq0 + 2x + 1
  // of head h of o (dim elements each) interleaved, rows at or past seq0 + n zero.
  static void load_pair_rows(const Operand& o, int64_t b, int64_t seq0, int64_t h, int64_t n, int64_t dim,
                             int64_t pairs, int64_t pad, uint32_t* dst) {
    const auto* base = static_cast<const uint16_t*>(o.data);
    for (int64_t x = 0; x < pairs; ++x) {
      uint32_t* row = dst + x * pad;
      if (2 * x >= n) {
        std::memset(row, 0, static_cast<size_t>(pad) * 4);
        continue;
      }
      const uint16_t* r0 = base + row_offset(o, b, seq0 + 2 * x, h);
      const uint16_t* r1 = 2 * x + 1 < n ? base + row_offset(o, b, seq0 + 2 * x + 1, h) : nullptr;
      if (o.dim_stride == 1) {
        interleave_bf16_rows(r0, r1, dim, pad, row);
        continue;
      }
      for (int64_t c = 0; c < pad; ++c) {
        const bool in = c < dim;
        row[c] = (in ? uint32_t{r0[c * o.dim_stride]} << 16 : 0u) | (in && r1 ? r1[c * o.dim_stride] : 0u);
      }
    }
  }
  void load_kv(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t seq0, int64_t hk, int64_t nj,
               float* kt, float* v, float* stage) {
    load_pairs_t(p.k, b, seq0, hk, nj, p.head_dim, plan.bk_pad, plan.bk_pad, kt, stage);
    load_pair_rows(p.v, b, seq0, hk, nj, p.head_dim_v, (nj + 1) / 2, plan.dv_pad, reinterpret_cast<uint32_t*>(v));
  }
  static void qk(const TilePlan& plan, int64_t mq, int64_t d, const float* q, const float* kt, float scale,
                 float* s) {
    gemm_bf16(mq, plan.bk_pad, (d + 1) / 2, reinterpret_cast<const uint32_t*>(q), plan.dqk_pad / 2,
              reinterpret_cast<const uint32_t*>(kt), plan.bk_pad, s, plan.bk_pad, scale);
  }
  // qk and pv for a tile the ranges cut: each block of kPairMr rows takes
  // the products only over the keys its rows see, from the first key one of
  // them sees (rounded down to kCutKeys) to the last (lo, hi: each row's
  // first and last visible key), since the softmax sets every score outside
  // a row's range to -inf without reading it and leaves P zero there. A
  // causal diagonal tile then costs about half, and a window's left edge
  // likewise. The softmax's passes over such a row stop at a multiple of
  // kCutKeys too (softmax_rows).
  static int64_t keys_seen(const int64_t* hi, int64_t r0, int64_t r1, int64_t j0, int64_t nj) {
    int64_t n = 0;
    for (int64_t r = r0; r < r1; ++r) n = std::max(n, std::clamp<int64_t>(hi[r] - j0 + 1, 0, nj));
    return n;
  }
  static int64_t keys_first(const int64_t* lo, const int64_t* hi, int64_t r0, int64_t r1, int64_t j0, int64_t nj) {
    int64_t f = nj;
    for (int64_t r = r0; r < r1; ++r)
      if (lo[r] <= hi[r] && hi[r] >= j0) f = std::min(f, std::clamp<int64_t>(lo[r] - j0, 0, nj));
    return f / kCutKeys * kCutKeys;
  }
  static void qk_cut(const TilePlan& plan, int64_t mq, int64_t d, const float* q, const float* kt, float scale,
                     float* s, const int64_t* lo, const int64_t* hi, int64_t j0, int64_t nj) {
    const int64_t ldq = plan.dqk_pad / 2, lds = plan.bk_pad;
    for (int64_t i = 0; i < mq; i += kPairMr) {
      const int64_t rows = std::min(kPairMr, mq - i);
      const int64_t n = round_up(keys_seen(hi, i, i + rows, j0, nj), kCutKeys);
      const int64_t f = std::min(n, keys_first(lo, hi, i, i + rows, j0, nj));
      gemm_bf16(rows, n - f, (d + 1) / 2, reinterpret_cast<const uint32_t*>(q + i * ldq), ldq,
                reinterpret_cast<const uint32_t*>(kt) + f, lds, s + i * lds + f, lds, scale);
    }
  }
  static void pv_cut(const TilePlan& plan, int64_t mq, int64_t nj, const float* s, const float* v,
                     const float* alpha, float* o, const int64_t* lo, const int64_t* hi, int64_t j0) {
    const int64_t lds = plan.bk_pad, ldo = plan.dv_pad;
    for (int64_t i = 0; i < mq; i += kPairMr) {
      const int64_t rows = std::min(kPairMr, mq - i);
      const int64_t kp = (keys_seen(hi, i, i + rows, j0, nj) + 1) / 2;
      const int64_t f = std::min(kp, keys_first(lo, hi, i, i + rows, j0, nj) / 2);
      gemm_bf16_epi<PairEpi::rescale>(rows, ldo, kp - f, reinterpret_cast<const uint32_t*>(s + i * lds) + f, lds,
                                      reinterpret_cast<const uint32_t*>(v) + f * ldo, ldo, o + i * ldo, ldo, 1.0f,
                                      alpha + i);
    }
  }
  // P in s as pairs (the softmax rounds it); its padding columns (nj and
  // beyond) are 0, so an odd nj's last pair is (P, 0).
  void pv(const TilePlan& plan, int64_t mq, int64_t nj, float* s, const float* v, const float* alpha, float* o,
          float*) const {
    const int64_t lds = plan.bk_pad;
    gemm_bf16_epi<PairEpi::rescale>(mq, plan.dv_pad, (nj + 1) / 2, reinterpret_cast<const uint32_t*>(s), lds,
                                    reinterpret_cast<const uint32_t*>(v), plan.dv_pad, o, plan.dv_pad, 1.0f, alpha);
  }
  // Narrow tiles keys-major (narrow_usable; forward_narrow_dot.inl).
  void narrow(const AttnParams& p, const TilePlan& plan, const ColTile<float>& c) const;
};
#endif

// Whether Tiles computes S on AVX512_BF16 dot products (Bf16DotTiles): its
// narrow tiles then take S^T on the same products (Bf16DotTiles::narrow).
template <typename Tiles>
constexpr bool kDotTiles = false;
#if FG_BF16_DOT
template <>
constexpr bool kDotTiles<Bf16DotTiles> = true;
#endif

// The grain, in keys, at which the row paths' softmax stops a row of a tile
// the ranges cut: where Tiles' products stop it.
template <typename Tiles>
constexpr int64_t kCutGrain = kPad;
#if FG_BF16_DOT
template <>
constexpr int64_t kCutGrain<Bf16DotTiles> = Bf16DotTiles::kCutKeys;
#endif

template <typename Tiles>
constexpr bool kAmxTiles = false;
