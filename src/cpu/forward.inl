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
// forward_task's own samples in a causal bf16 forward (L = 2048, d = 128).
constexpr int64_t kRowsAhead = 16;

// Loads the same rows transposed: dst[c * ld + r] for c < round_up(dim, kPad),
// r < w (<= ld), zero where r >= n or c >= dim. Contiguous rows needing no padding
// are converted and transposed in register blocks straight from their place
// (decode f32 Lk = 128k: K+V read 16.5 -> 18.9 GB/s); the others, and
// the last n mod kTransposeBlock rows, are staged contiguously in stage
// ([w, round_up(dim, kPad)]) first. (Scattering strided stores instead cost
// ~20% of the forward at d = 128.)
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
// they lie. Decode at Lk = 128k, 8 heads, d = 128, 2 threads, K+V read per
// second, staged -> in place: f32 18.0 -> 25.3 GB/s at 1 row, about even at
// 2 and 3 rows, 17.7 -> 15.4 at 4 rows; bf16 11.5 -> 12.9 at 1 row (AMX
// host). Where the ISA sets kWholeRows (avx2), tiles of up to that many rows
// read both K and V in place, whole rows at a time (below).
constexpr int64_t kInPlaceRows = 2;

// f(std::integral_constant<int, mq>) for 1 <= mq <= 4.
template <typename F>
void with_rows(int64_t mq, F f) {
  if (mq == 1) return f(std::integral_constant<int, 1>{});
  if (mq == 2) return f(std::integral_constant<int, 2>{});
  if (mq == 3) return f(std::integral_constant<int, 3>{});
  return f(std::integral_constant<int, 4>{});
}

template <typename T, typename Acc>
struct AccTiles {
  const T* v_rows = nullptr;  // this tile's V rows when read in place
  int64_t v_ld = 0;
  bool v_in_place = false;
  // At 1 to kWholeRows query rows, K rows are read in place too where the ISA
  // transposes in registers (scores_rows_whole): the K^T tile's transpose
  // waited on K's loads and its 32 KiB of stores (d = 128) pushed them out
  // of L1 (decode, d = 128, 8 heads, alternating calls, medians of K+V read
  // per second, avx2: f32 Lk = 64k 2 threads 11.4 / 11.6 -> 13.3 / 13.9
  // GB/s, 1 thread 6.8 / 7.1 -> 8.2 / 8.3, 2 query rows 9.6 / 9.0 -> 10.3 /
  // 9.8; [B, H, L, d] 9.5 -> 10.6; Lk = 4096 1 thread 6.4 -> 8.1; bf16 K and
  // V both read whole rows against neither: 2 threads 5.4 / 4.2 -> 6.3 /
  // 4.9, 1 thread 2.6 / 2.4 -> 3.0 / 2.4, 2 query rows 4.8 / 4.5 -> 7.6 / 7.9;
  // 3 and 4 rows, K and V whole against staged: f32 8.7 / 8.2 -> 9.7 / 9.3
  // and 8.7 / 7.3 -> 9.9 / 8.4, bf16 5.7 / 4.6 -> 6.2 / 4.9 and 5.3 / 4.9 ->
  // 5.4 / 5.2).
  const char* k_pf_end = nullptr;  // set_ahead
  const char* v_pf_end = nullptr;
  const T* k_rows = nullptr;  // this tile's K rows (k_n of them) when read in place
  int64_t k_ld = 0, k_n = 0;
  bool k_in_place = false;
  ScoreScale<Acc> score_scale;
  AccTiles(const AttnParams& p, int64_t mq) : score_scale(p.scale) {
#if FG_VEC_GEMM
    v_in_place = std::is_same<Acc, float>::value && mq <= std::max(kInPlaceRows, kWholeRows) && p.v.dim_stride == 1 &&
                 p.head_dim_v % kPad == 0;
#endif
#if FG_TRANSPOSE_REGS
    k_in_place = std::is_same<Acc, float>::value && mq <= kWholeRows && p.k.dim_stride == 1 &&
                 p.head_dim % kLanes == 0;
#endif
    (void)p, (void)mq;
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
  // the whole-row products read 8 of them side by side, 32 bytes of each at
  // a time, which reads a page at 6.2-7.3 GB/s from DRAM on one thread
  // against 10.9 in memory order (a reading test over [1M, 128] f32 rows);
  // asking L2 for the rows two 8-row blocks ahead, in memory order, as they
  // go took it to 9.5-9.7. Up to n rows from this tile's first (keys of
  // the same head that exist); none where rows have gaps between them.
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
  // the products only up to the last key one of its rows sees (hi: each
  // row's last visible key), since the softmax reads no score past it and
  // leaves P zero there. A causal diagonal tile then costs about half.
  static int64_t keys_seen(const int64_t* hi, int64_t r0, int64_t r1, int64_t j0, int64_t nj) {
    int64_t n = 0;
    for (int64_t r = r0; r < r1; ++r) n = std::max(n, std::clamp<int64_t>(hi[r] - j0 + 1, 0, nj));
    return n;
  }
  static void qk_cut(const TilePlan& plan, int64_t mq, int64_t d, const float* q, const float* kt, float scale,
                     float* s, const int64_t* hi, int64_t j0, int64_t nj) {
    const int64_t ldq = plan.dqk_pad / 2, lds = plan.bk_pad;
    for (int64_t i = 0; i < mq; i += kPairMr) {
      const int64_t rows = std::min(kPairMr, mq - i);
      const int64_t n = round_up(keys_seen(hi, i, i + rows, j0, nj), 32);
      gemm_bf16(rows, n, (d + 1) / 2, reinterpret_cast<const uint32_t*>(q + i * ldq), ldq,
                reinterpret_cast<const uint32_t*>(kt), lds, s + i * lds, lds, scale);
    }
  }
  static void pv_cut(const TilePlan& plan, int64_t mq, int64_t nj, const float* s, const float* v,
                     const float* alpha, float* o, const int64_t* hi, int64_t j0) {
    const int64_t lds = plan.bk_pad, ldo = plan.dv_pad;
    for (int64_t i = 0; i < mq; i += kPairMr) {
      const int64_t rows = std::min(kPairMr, mq - i);
      const int64_t kp = (keys_seen(hi, i, i + rows, j0, nj) + 1) / 2;
      gemm_bf16_epi<PairEpi::rescale>(rows, ldo, kp, reinterpret_cast<const uint32_t*>(s + i * lds), lds,
                                      reinterpret_cast<const uint32_t*>(v), ldo, o + i * ldo, ldo, 1.0f, alpha + i);
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
};
#endif

// Whether Tiles computes S on AVX512_BF16 dot products (Bf16DotTiles): its
// narrow tiles then take S^T on the same products (narrow_dot_tile).
template <typename Tiles>
constexpr bool kDotTiles = false;
#if FG_BF16_DOT
template <>
constexpr bool kDotTiles<Bf16DotTiles> = true;
#endif

template <typename Tiles>
constexpr bool kAmxTiles = false;

#if FG_AMX
// bf16 storage on AMX-BF16 tiles (kernels_amx.cpp): Bf16DotTiles' layouts,
// both products on TDPBF16PS, whose sums differ from the f32 tiles' by
// rounding (vec_avx512.inl), so lse does too, by about an ulp of S. The tile
// registers are configured per task and released with it.
struct AmxTiles : Bf16DotTiles {
  const bool q_scaled;  // scale_on_q
  AmxTiles(const AttnParams& p, int64_t mq) : Bf16DotTiles(p, mq), q_scaled(scale_on_q(p)) { amx_configure(); }
  ~AmxTiles() { _tile_release(); }
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;
  // As Bf16DotTiles, with V's pair rows zero up to the 16-pair step the P V
  // product reads (stale rows would meet P's zeros: 0 * inf = NaN).
  void load_kv(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t seq0, int64_t hk, int64_t nj,
               float* kt, float* v, float* stage) {
    load_pairs_t(p.k, b, seq0, hk, nj, p.head_dim, plan.bk_pad, plan.bk_pad, kt, stage);
    load_pair_rows(p.v, b, seq0, hk, nj, p.head_dim_v, round_up((nj + 1) / 2, int64_t{16}), plan.dv_pad,
                   reinterpret_cast<uint32_t*>(v));
  }
  // A power-of-two scale goes on q's pairs instead of on S: the products
  // and AMX's sums then scale exactly, and the pass over S that applied it
  // (the first read of S after the tile stores, ~9% of a d = 64 forward's
  // samples) goes. AmxBackward scales its q the same way, so S stays the
  // forward's bit for bit.
  static bool scale_on_q(const AttnParams& p) {
    int e = 0;
    return std::isnormal(p.scale) && std::frexp(p.scale, &e) == 0.5 && std::isnormal(static_cast<float>(p.scale));
  }
  // n pairs times scale, each half rounded back to bf16 (nearest even).
  static void scale_pairs(uint32_t* w, int64_t n, float scale) {
    for (int64_t x = 0; x < n; ++x) {
      const uint32_t hi = w[x] & 0xffff0000u, lo = w[x] << 16;
      float fh, fl;
      std::memcpy(&fh, &hi, 4);
      std::memcpy(&fl, &lo, 4);
      w[x] = uint32_t{bf16_from(fh * scale).bits} << 16 | bf16_from(fl * scale).bits;
    }
  }
  static void load_q(const Operand& q, int64_t b, int64_t seq0, int64_t h, int64_t n, int64_t d, int64_t ld,
                     float, float* dst) {
    Bf16DotTiles::load_q(q, b, seq0, h, n, d, ld, 1.0f, dst);
  }
  void scale_q(const AttnParams& p, int64_t rows, int64_t ld, float* q) const {
    if (scale_on_q(p)) scale_pairs(reinterpret_cast<uint32_t*>(q), rows * ld, static_cast<float>(p.scale));
  }
  void qk(const TilePlan& plan, int64_t mq, int64_t d, const float* q, const float* kt, float scale,
          float* s) const {
    (void)d;
    const int64_t lds = plan.bk_pad;
    gemm_amx(mq, lds, plan.dqk_pad / 2, reinterpret_cast<const uint32_t*>(q), plan.dqk_pad / 2,
             reinterpret_cast<const uint32_t*>(kt), lds, s, lds);
    if (!q_scaled)
      for (int64_t x = 0; x < mq * lds; ++x) s[x] *= scale;
  }
  // P's columns from nj on are exp(-inf) = 0.
  void pv(const TilePlan& plan, int64_t mq, int64_t nj, float* s, const float* v, const float* alpha, float* o,
          float* pv) const {
    const int64_t lds = plan.bk_pad;
    for (int64_t r = 0; r < mq; ++r) round_bf16_pairs(s + r * lds, lds);
    gemm_amx(mq, plan.dv_pad, round_up((nj + 1) / 2, int64_t{16}), reinterpret_cast<const uint32_t*>(s), lds,
             reinterpret_cast<const uint32_t*>(v), plan.dv_pad, pv, plan.dv_pad);
    scale_add(mq, plan.dv_pad, alpha, pv, o, plan.dv_pad);
  }

  // Narrow tiles (3 to 32 stacked query rows, w = 16 or 32 columns) keys-major:
  //   S^T [nj, w] = K Q^T   K's rows as A where they lie (contiguous bf16
  //                         with d a multiple of kPad; else staged), qtv =
  //                         Q^T as pairs [dqk_pad / 2, w]
  //   O [w, dv_pad] = O * alpha + P V   P's rows as pairs from S^T, V's rows interleaved
  // with the softmax on S^T's columns (softmax_cols). Both operands of
  // S^T hold pairs in memory order (the lower-indexed element low): AMX's
  // result is the same for S and S^T and for either order within a pair
  // (on the dev CPU, 0 of 25600 scores differed each way), so these scores
  // are bit for bit the row path's and the backward's.
  static bool k_in_place(const AttnParams& p, const TilePlan& plan) {
    return p.k.dim_stride == 1 && p.head_dim == plan.dqk_pad && p.k.seq_stride % 2 == 0;
  }
  void narrow(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t seq0, int64_t hk, int64_t nj, int64_t w,
              const uint32_t* qtv, float* stage, float* st, float* m, float* l, float* alpha, float* o, float* vp,
              float* ptv, float* pp, const float* lo, const float* hi, int64_t j0) const {
    const int64_t dp = plan.dqk_pad / 2, dv = plan.dv_pad;
    const uint32_t* kr = reinterpret_cast<const uint32_t*>(stage);
    int64_t ldk = dp;
    if (k_in_place(p, plan)) {
      kr = reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(p.k.data) + row_offset(p.k, b, seq0, hk));
      ldk = p.k.seq_stride / 2;
    } else {
      auto* sw = reinterpret_cast<uint32_t*>(stage);
      for (int64_t r = 0; r < nj; ++r) {
        load_pairs(p.k, b, seq0 + r, hk, p.head_dim, dp, sw + r * dp);
        for (int64_t x = 0; x < dp; ++x) sw[r * dp + x] = sw[r * dp + x] << 16 | sw[r * dp + x] >> 16;
      }
    }
    gemm_amx(nj, w, dp, kr, ldk, qtv, w, st, w);
    const float scale = static_cast<float>(p.scale);
    if (!q_scaled)
      for (int64_t x = 0; x < nj * w; ++x) st[x] *= scale;
    softmax_cols(st, nj, w, w, m, l, alpha, lo, hi, static_cast<float>(j0));
    const int64_t kp = round_up((nj + 1) / 2, int64_t{16});
    auto* pt = reinterpret_cast<uint32_t*>(ptv);
    for (int64_t x = 0; x < kp; ++x) {
      if (2 * x >= nj) {
        std::memset(pt + x * w, 0, static_cast<size_t>(w) * 4);
        continue;
      }
      interleave_f32_rows(st + 2 * x * w, 2 * x + 1 < nj ? st + (2 * x + 1) * w : nullptr, w, pt + x * w);
    }
    transpose(kp, w, ptv, w, pp, kp);
    load_pair_rows(p.v, b, seq0, hk, nj, p.head_dim_v, kp, dv, reinterpret_cast<uint32_t*>(vp));
    for (int64_t r = 0; r < w; ++r)
      for (int64_t c = 0; c < dv; ++c) o[r * dv + c] *= alpha[r];
    gemm_amx<true>(w, dv, kp, reinterpret_cast<const uint32_t*>(pp), kp, reinterpret_cast<const uint32_t*>(vp), dv,
                   o, dv);
  }
};
template <>
constexpr bool kAmxTiles<AmxTiles> = true;
#endif

// Keys-major score tiles: tiles (full, or cut by the causal and window
// ranges or a mask; with softcap, ALiBi, bias and dropout or not) of query tiles
// with at least kKeysMajorRows rows compute
// S^T = scale (K Q^T), with K's rows broadcast where they lie (f32) or from
// a converted copy, and run the online softmax on kLanes query rows at once
// (softmax_cols): no horizontal reductions, no K^T tile, no per-row loop.
// Each score is the same chain of FMAs over d in the same order as in
// Q K^T, scaled as it is stored, so it is bit for bit the score the backward recomputes.
// The other tiles take the row path.
constexpr int64_t kKeysMajorRows = 32;

// Narrow tiles: query tiles of kNarrowMinRows <= mq <= kNarrowMaxRows rows
// (short queries beside long keys) run keys-major through both products,
// with the query rows across the lanes of one to four vectors (width W):
//   S^T [nj, W]  = scale (K Q^T)   K's elements broadcast where they lie
//   O^T [dv, W]  = O^T * alpha + V^T P^T   V's elements broadcast where they lie
// so neither K nor V is transposed or copied, and alpha scales O^T's columns.
// A 16-row tile's products as square tiles padded to 32 columns did half
// their FMAs on padding. Their rate hardly depends on mq (f32, d = 128, 8
// heads, 2 threads, K+V read per second against the row path, Lk = 4096 /
// 128k: 3 rows 20.2 / 19.6 against 25.1 / 17.4, 6 rows 19.8 / 18.5 against
// 24.7 / 18.5, 8 rows 20.9 / 18.9 against 21.0 / 16.5, 12 rows 18.7 / 18.7
// against 17.9 / 14.9, 16 rows 19.8 / 17.8 against 16.3 / 13.0), so fewer
// rows keep the row path there (kNarrowMinRows, per ISA in vec_<isa>.inl).
// On AVX2 they run to 32 rows, three and four vectors wide, where 17-31
// rows took the row path and 32 the keys-major tiles, which copy 64-key K
// and V tiles for so few rows (f32, d = 128, 8 heads, 2 threads, `flashgrad
// ab`, 9 pairs, medians of the pair ratios, Lk = 16k: 20 rows 1.51x, 24
// rows 1.52x (bf16 1.41x), 32 rows 1.38x (bf16 1.09x; causal 1.30x; 1
// thread 1.27x; [B, H, L, d] 1.17x); 32 query heads over 4 K/V heads, Lq
// = 4, Lk = 32k 1.21x; 32 rows, d = 64, Lk = 4096 1.26x; from cache
// about even: 32 rows, Lk = 1024 0.99x, Lk = 512 0.97x; 24 rows, Lk = 512
// 1.05x). Beyond 32 rows they run in chunks of 32 (narrow_chunks) up to
// kNarrowMaxRows, each chunk through both products over the same K and V
// rows, where the keys-major tiles copied 64-key tiles (f32, Lk = 16k,
// same setup: 48 rows 1.26-1.33x, 64 rows 1.13x (causal 1.14x), 80 rows
// 1.14x, 96 rows 1.05-1.06x, 128 rows even; d = 64: 48 rows 1.32x, 64
// rows 1.26x, 96 rows 1.05x; Lk = 2048, d = 64: 48 rows 1.22x, 64 rows
// 1.14x).
//
// Narrow tiles (of one vector of rows; wider ones: narrow_keys) step
// through the keys kNarrowVecKeys at a time (per ISA, vec_<isa>.inl;
// kNarrowKeys on the portable path, which runs none), every K/V head in
// turn. 16 keys read each 4 KiB page of a [batch, seq, heads, dim] K or V
// through soon after it was started: the hardware prefetchers follow
// that, where 64 keys (with or without the next tile prefetched in
// software) left the reads
// waiting on DRAM (decode, f32, d = 128, 8 heads, Lk = 128k, 2 threads,
// interleaved runs, medians of K+V read per second: 64 keys 12.1 GB/s
// (prefetched 13.9), 32 keys 14.8, 16 keys 17.2 (prefetched 15.0); in
// another series 8 keys 17.1 against 17.7 for 16). Those were AVX-512
// numbers on an Intel host, before the products asked for the next tile.
constexpr int64_t kNarrowKeys = 16;

// Keys per narrow tile on bf16 dot products (narrow_dot_products): S^T in
// 16-key blocks, then one softmax step and one O^T update for all of them.
// 16 keys spent a third of the P V product's time loading, rescaling and
// storing O^T (bf16, Lq = 16, d = 128, 8 heads, 2 threads, Zen 4,
// `flashgrad ab`, 20-60 pairs, 16 -> 64 keys: Lk = 4096 1.07x, 16k 1.06x,
// 64k 1.05x; [b, h, s, d] 1.06x; d = 64 1.14x; Lq = 8 1.04x; 24 rows
// even; GQA 32/8, Lq = 4, 1.02x). 32 and 128 keys measured within 3% of
// 64. The blocks ask for the next tile's rows (kNarrowDotAhead keys on):
// 32 keys on, into the tile itself, left the V rows of its second half
// waiting (Lk = 4096 1.00x against 16 keys); 128 on, 0.97x at 64k.
constexpr int64_t kNarrowDotKeys = 64;
constexpr int64_t kNarrowDotAhead = 64;

// Keys per narrow tile of w query rows (mq rounded up to kLanes): two
// vectors of rows or more step kNarrowWideKeys at a time, one vector
// kNarrowVecKeys (both per ISA in vec_<isa>.inl).
inline int64_t narrow_keys(int64_t w) {
#if FG_VEC_GEMM
  return w >= 2 * kLanes ? kNarrowWideKeys : kNarrowVecKeys;
#else
  (void)w;
  return kNarrowKeys;
#endif
}

// Scores that the softmax alone turns into P: no softcap, ALiBi, bias or dropout.
inline bool plain_scores(const AttnParams& p) {
  return p.softcap == 0 && !p.alibi && !p.bias.data && p.dropout_p == 0;
}

// Whether every ALiBi distance |i + shift - j| and the positions it comes
// from are integers f32 holds exactly (ScoreCols).
inline bool alibi_exact(const AttnParams& p) {
  const int64_t shift = p.in_block ? std::abs(p.block_total_k - p.block_total_q + p.block_q_offset - p.block_k_offset)
                                   : std::max(p.seqlen_q, p.seqlen_k);
  return shift + p.seqlen_q + p.seqlen_k < (int64_t{1} << 23);
}

template <typename T, typename Acc, typename Tiles>
bool keys_major_tiles(const AttnParams& p) {
#if FG_VEC_GEMM
  return std::is_same<Acc, float>::value && std::is_same<Tiles, AccTiles<T, Acc>>::value &&
         (!p.alibi || alibi_exact(p));
#else
  (void)p;
  return false;
#endif
}
template <typename T, typename Acc, typename Tiles>
bool keys_major_usable(const AttnParams& p, int64_t mq) {
  return mq >= kKeysMajorRows && keys_major_tiles<T, Acc, Tiles>(p);
}
// Narrow tiles in more than one chunk (mq > kNarrowWidth) only for a task
// that walks kNarrowChunkedMinKeys keys or more, where K and V come from
// memory: from cache the keys-major tiles' products run faster (f32, d =
// 64, 64 rows, Lk = 1024, 8 heads, 2 threads: chunks 0.89x).
constexpr int64_t kNarrowChunkedMinKeys = 2048;

// keys: how many keys the task walks.
template <typename T, typename Acc, typename Tiles>
bool narrow_usable(const AttnParams& p, int64_t mq, int64_t keys) {
#if FG_VEC_GEMM
  if constexpr (kDotTiles<Tiles>)
    return mq >= kNarrowMinRows && mq <= std::min(kNarrowMaxRows, kNarrowWidth) && (!p.alibi || alibi_exact(p)) &&
           p.k.dim_stride == 1 && p.v.dim_stride == 1;
  return mq >= kNarrowMinRows && mq <= kNarrowMaxRows && (mq <= kNarrowWidth || keys >= kNarrowChunkedMinKeys) &&
         keys_major_tiles<T, Acc, Tiles>(p);
#else
  (void)p, (void)mq, (void)keys;
  return false;
#endif
}

// Whether keys-major tiles may take the tiles that the causal and window
// ranges or a mask cut: key indices stay exact in f32 (the ranges' cuts),
// and a mask's -inf come with the scores (ScoreCols).
inline bool ranges_exact(const AttnParams&, int64_t lk) { return lk < (int64_t{1} << 24); }

// Whether a task walks its K/V heads one after another, each through all
// its keys, instead of every head at each key tile: where a head's K and V
// rows are contiguous ([batch, heads, seq, dim]), their reads then stay one
// stream each, which the whole-row products' prefetch (AccTiles::set_ahead)
// follows across tiles. Results are the same either way. Decode, d = 128,
// 8 heads, Lk = 64k, alternating calls, medians, K+V GB/s, neither ->
// both: f32 1 row 4.1 -> 4.7 (1 thread), 8.2 -> 10.9 (2 threads); 2 rows
// 4.0 -> 7.1, 5.9 -> 8.7; bf16 1 row 2.5 -> 5.0, 5.9 -> 11.8; f32 Lk = 4096
// 7.4 -> 8.9; narrow tiles (16 rows) 8.4 -> 8.6. The order alone measured
// even (f32 1 row 7.3 -> 7.2); with the prefetch it added 6.3 -> 7.4 and
// 10.6 -> 12.5.
inline bool heads_outer(const AttnParams& p, int64_t nh) {
  return nh > 1 && p.k.dim_stride == 1 && p.v.dim_stride == 1 && p.k.seq_stride == p.head_dim &&
         p.v.seq_stride == p.head_dim_v;
}

// How many of a task's nh K/V heads each call of scores_heads and pv_heads
// takes (0: none, the task goes a head at a time): where the whole-row
// products read K and V in place and the heads' rows lie side by side
// ([batch, seq, heads, dim]), a divisor of kLanes of at least 2 heads, and
// at least the task's mq rows per head, so that Q's lanes (qx) fit in Q^T's
// space. A head at a time reads 512 bytes of each 4 KiB row (8 heads, d =
// 128, f32) per pass; a reading test over such rows on Zen 5 (2 threads)
// read 34-38 GB/s in that order and 67-78 in memory order, where the L2
// streamer runs ahead of the loads. Decode, d = 128, 8 heads, Lk = 64k, 2
// threads, `flashgrad ab --pass forward`, 11 pairs, against the head at a
// time (on avx512 against the staged K^T tiles it had before the whole
// rows): avx512 f32 Lq = 1 1.13x, Lq = 2 1.05x, Lq = 4 0.99x, 32 query
// heads over 8 0.99x; bf16 1.51x, 1.19x, 1.24x, 1.23x; avx2 f32 Lq = 1
// 1.32x, Lq = 2 1.51x, 16 over 8 1.45x; bf16 1.42x, 1.53x, 1.43x.
template <typename T, typename Acc>
int64_t heads_across(const AttnParams& p, const TilePlan& plan, const AccTiles<T, Acc>& tiles, int64_t nh,
                     int64_t mq) {
#if FG_TRANSPOSE_REGS
  if (!tiles.k_in_place || !tiles.v_in_place || mq > kWholeRows || heads_outer(p, nh)) return 0;
  if (p.k.head_stride != p.head_dim || p.v.head_stride != p.head_dim_v || p.head_dim_v % kLanes != 0) return 0;
  int64_t g = kLanes;  // the largest power of two dividing nh, at most kLanes
  while (nh % g != 0) g /= 2;
  // The lanes of a tile's scores (heads_tile) go to kt.
  const bool lanes_fit = mq * round_up(plan.block_k, kHeadsBlocks * kLanes / g) * g <= plan.dqk_pad * plan.bk_pad;
  return g >= 2 && g >= mq && lanes_fit ? g : 0;
#else
  (void)p, (void)plan, (void)tiles, (void)nh, (void)mq;
  return 0;
#endif
}

// Dropout's 1 / (1 - p) (1 without dropout). P's rows keep their values where
// kept (drop_row), and this factor scales what they sum into, out and dV,
// once per element instead of once per key, which rounded every kept P.
template <typename Acc>
Acc dropout_scale(const AttnParams& p) {
  return p.dropout_p > 0 ? static_cast<Acc>(1.0 / (1.0 - p.dropout_p)) : Acc(1);
}

// lse is f32, or f64 alongside f64 storage.
inline double lse_load(const AttnParams& p, int64_t off) {
  return p.lse_dtype == DType::f64 ? static_cast<const double*>(p.lse.data)[off]
                                   : static_cast<const float*>(p.lse.data)[off];
}
inline void lse_store(const AttnParams& p, int64_t off, double x) {
  if (p.lse_dtype == DType::f64)
    static_cast<double*>(p.lse.data)[off] = x;
  else
    static_cast<float*>(p.lse.data)[off] = static_cast<float>(x);
}

// Results (out, dq, dk, dv) hold the storage type T, or f32 when T is a 16-bit type.
template <typename T, typename Acc>
inline void store_result(DType dt, const Acc* src, int64_t n, void* base, int64_t off, int64_t stride,
                         Acc mul) {
  if (!std::is_same<T, float>::value && dt == DType::f32)
    store_row(src, n, static_cast<float*>(base) + off, stride, mul);
  else
    store_row(src, n, static_cast<T*>(base) + off, stride, mul);
}

// Which (head, row) stacked row r is: head hk * group + r / mqh, row i0 + r % mqh.
struct Stack {
  int64_t hk, group, i0, mqh;
  int64_t head(int64_t r) const { return hk * group + r / mqh; }
  int64_t row(int64_t r) const { return i0 + r % mqh; }
  int64_t rows() const { return group * mqh; }
};

// One split's result for stacked row r: out normalized over the split's keys
// and its lse (no sink), or, without splits, the final out and lse.
template <typename T, typename Acc>
void finish_row(const AttnParams& p, const TilePlan& plan, Slice<Acc> shared, int64_t b, int64_t h, int64_t i,
                int64_t split, Acc mx, Acc sum, const Acc* orow) {
  const int64_t dv = p.head_dim_v;
  const Acc keep_scale = dropout_scale<Acc>(p);
  if (plan.splits > 1) {
    const int64_t row = ((split * p.batch + b) * p.heads_q + h) * p.seqlen_q + i;
    Acc* po = shared.at(plan.fwd.part_o) + row * dv;
    for (int64_t c = 0; c < dv; ++c) po[c] = sum == Acc(0) ? Acc(0) : orow[c] * keep_scale / sum;
    shared.at(plan.fwd.part_lse)[row] = sum == Acc(0) ? neg_inf<Acc>() : mx + std::log(sum);
    return;
  }
  Acc ores = Acc(1);
  if (p.sinks) {
    // sink logit joins the denominator: rescale to the larger of the two maxima
    const Acc sk = static_cast<Acc>(p.sinks[h * p.sinks_stride]);
    const Acc mnew = sk > mx ? sk : mx;
    const Acc a = exp_acc(mx - mnew);
    sum = sum * a + exp_acc(sk - mnew);
    ores = a;
    mx = mnew;
  }
  // sum == 0 only when no key is visible: out = 0, lse = -inf (or the sink).
  const Acc mul = sum == Acc(0) ? Acc(0) : ores * keep_scale / sum;
  const Acc row_lse = sum == Acc(0) ? neg_inf<Acc>() : mx + std::log(sum);
  const int64_t q = p.q_start(b) + i;
  store_result<T>(p.out_dtype, orow, dv, p.out.data, row_offset(p.out, b, q, h), p.out.dim_stride, mul);
  lse_store(p, row_offset(p.lse, b, q, h), static_cast<double>(row_lse));
}

// Rows [seq0, seq0 + nj) of head h of o as f32 rows: where they lie when
// they are contiguous f32 (ld: o's row stride), else converted into stage
// ([nj, pad]).
template <typename T>
const float* rows_f32(const Operand& o, int64_t b, int64_t seq0, int64_t h, int64_t nj, int64_t dim, int64_t pad,
                      float* stage, int64_t& ld) {
  if (std::is_same<T, float>::value && o.dim_stride == 1) {
    ld = o.seq_stride;
    return reinterpret_cast<const float*>(static_cast<const T*>(o.data)) + row_offset(o, b, seq0, h);
  }
  load_tile<T>(o, b, seq0, h, nj, dim, pad, stage);
  ld = pad;
  return stage;
}

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
// own, and 16 of them spilled to vector registers (decode, Lk = 128k:
// 17.3 -> 17.8 GB/s with 8; from L3, Lk = 4096: 18.5 -> 19.8).
//
// K and V rows read in place closer than a 4 KiB page apart (a head's rows
// contiguous, as in [batch, heads, seq, dim], or few heads) are asked for
// kNarrowAheadKeys keys ahead from inside the products, spread over their
// steps. Rows a page or more apart (8 heads of d = 128 interleaved) start a
// page each, and the hardware prefetchers, following 32 pages at once, keep
// ahead of the products on their own; a step's few pages did not (decode,
// Lq = 16, Lk = 1M / heads, f32, d = 128, 2 threads, interleaved runs,
// medians of K+V read per second, without -> with: 1 head 9.9 -> 15.8 GB/s,
// 2 heads 10.0 -> 15.1, 4 heads 9.6 -> 13.4, 8 heads d = 64 9.3 -> 14.6,
// 8 heads [b, h, s, d] 9.0 -> 15.5; with rows a page apart it cost: 8 heads
// 16.7 -> 13.6, 16 heads d = 64 even). 16, 32 and 64 keys ahead measured
// alike. Those were AVX-512 numbers on an Intel host; on AVX2, and on
// AVX-512 since a Zen 4 host measured it (kNarrowPrefetchNext,
// vec_avx512.inl), the products ask for the next tile's rows instead,
// whatever the layout.
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
  // 2-row blocks wait on FMA latency (bf16, d = 128, 8 heads, Lk = 16k,
  // `flashgrad ab`, 9 pairs: 32 rows 1.11x, 40 rows 1.08x, 64 rows 1.08x;
  // 24 rows as two chunks 0.94x).
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
// stages first (avx2 on Zen 3, d = 128, 8 heads, Lk = 64k, 2 threads,
// alternating runs, K+V read per second: Lq = 16 3.3 / 3.8 / 3.8 -> 4.5 /
// 4.6 / 5.0 GB/s, Lq = 8 4.2 / 4.0 / 4.0 -> 5.4 / 5.6 / 6.0). The products
// give the staged path's results bit for bit.
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
// they came in bursts (bf16, Lq = 16, d = 128, 8 heads, 2 threads, Zen 4,
// `flashgrad ab`, 16-20 pairs: [B, H, L, d] 1.10x, [B, L, H, d] 0.99-1.03x).
// Where the task's heads lie side by side in each row ([batch, seq, heads,
// dim]), head x takes rows x * keys / nh.. of that block whole, across
// every head, so that the heads together
// ask for it in memory order; a head's own rows alone, short pieces a row
// apart, kept the reads waiting (bf16, Lq = 16, d = 128, 8 heads, Lk =
// 64k, 2 threads, `flashgrad ab` against the f32 narrow tiles, 9 pairs:
// the head's rows 1.01x and 0.99x, whole rows 1.19x and 1.18x; 16 heads,
// rows a page apart: none asked for 0.90x, whole rows 1.45x). A head's own
// rows otherwise, where they lie closer than a page apart (narrow_ahead).
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
    // per 16 columns of S^T, ran faster from the copy (avx2, L = 2048, 8
    // heads, 2 threads, two builds alternating in one process, medians of
    // each pair's ratio: d = 128 1.03-1.05x, causal 1.03-1.04x; with rows
    // 2 KiB apart, d = 64, 0.98-1.01x, and contiguous rows 0.99-1.03x, so
    // those stay in place).
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
    // the softmax then skips its pass over S^T for the max (f32, L = 2048,
    // 1 thread, both builds at once: d = 64 125.8 -> 127.5, d = 128 133.7 ->
    // 135.8 GFLOP/s).
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
  // rows of o; zeroing all ms rows (64 KiB at 8 heads, d = 128) took 5% of
  // a decode call at Lk = 256 (8 heads, f32, 2 threads: 1.045x at 256, 1.025x
  // at 512, even from 1024).
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

  // Prefetching the next K/V tile, measured (2 threads, d = 128, K+V from
  // DRAM): f32 forward L = 4096 +1-3%; decode tiles (V in place) f32 24 -> 19
  // GB/s, so not there, but bf16 13 -> 18.6 GB/s (from L3, Lk = 16k: 31 -> 27).
  const bool prefetch = mq >= 32 || (mq <= kInPlaceRows && sizeof(T) == 2);
  const int64_t k0 = p.k_start(b);
  // Tiles every row sees whole go without classify's look at each row (1.3%
  // of a d = 64 forward's samples at 256 rows; f32, L = 2048, 1 thread, both
  // builds at once, medians: 120.5 -> 122.3 GFLOP/s).
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
