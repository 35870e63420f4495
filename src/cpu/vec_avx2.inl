// The f32 vector layer for AVX2 + FMA: 8 lanes. The tile product keeps 6 rows
// x 16 columns of accumulators in 12 of the 16 ymm registers.
#define FG_VEC_GEMM 1
constexpr bool kVecGemm = true;  // FG_VEC_GEMM for if constexpr
using VecF = __m256;
constexpr int64_t kLanes = 8;
constexpr int64_t kGemmMr = 6;
constexpr int64_t kGemmVecs = 2;  // 12 accumulators of the 16 ymm registers
// P V over V rows read in place at 1 to kWholeRows query rows (forward_tiles.inl) reads
// whole rows a few at a time (gemm_rows_whole): passes of one or two lines
// over every row, rows a page apart, waited on every fetch (tuning table:
// kWholeRows, gemm_rows_whole).
constexpr int64_t kWholeRows = 4;
// Narrow tiles (forward_narrow.inl) ask L2 for the next tile's K and V rows, the
// next K/V head's or the next keys', spread over the products' steps, for
// rows in place in any layout. Asking for them all at once before each
// tile did not pay: a burst stalls on its own misses (tuning table:
// kNarrowPrefetchNext).
constexpr bool kNarrowPrefetchNext = true;
// With that prefetch, narrow tiles outrun the row path (whole rows at 3 and 4
// stacked rows, staged at 5-7) from 3 rows on, with 8 lanes for 3-7 rows;
// at 1 and 2 rows the whole-row products stay ahead (tuning table:
// kNarrowMinRows). Softcapped, ALiBi, bias, masked and dropout scores take
// the narrow tiles too (forward_narrow.inl, narrow_products); ALiBi whose positions
// f32 cannot hold keeps the row path (and whole rows up to 4).
constexpr int64_t kNarrowMinRows = 3;
constexpr int64_t kNarrowMaxRows = 96;  // in chunks of kNarrowWidth (forward_narrow.inl, narrow_chunks)
constexpr int64_t kNarrowWidth = 32;    // query rows per narrow chunk: four vectors
constexpr int kNarrowAcc = 12;  // narrow tiles (forward_narrow.inl): blocks one to four vectors wide
// Narrow tiles of two vectors of rows or more step through 32 keys, not 16:
// each block of O^T's rows then reloads and stores its accumulators once per
// 32 keys; one vector of rows keeps 16 (tuning table: kNarrowVecKeys).
constexpr int64_t kNarrowWideKeys = 32;
constexpr int64_t kNarrowVecKeys = 16;
// Rows of a narrow block whose A is bf16 pairs read in place, for nv
// vectors: a pair's word and halves beside 6 rows' 12 accumulators and two
// steps of B spilled, so two vectors take 4 rows. One vector takes 8, eight
// FMA chains for two pipes of 4-cycle FMAs, where 4 rows left half of them
// idle (tuning table: narrow_bf16_rows).
constexpr int narrow_bf16_rows(int nv) { return nv == 1 ? 8 : nv == 2 ? 4 : (nv == 3 ? 3 : 2); }
// Decode across heads (vec.inl, scores_heads_g and pv_heads) asks L2 for the
// K and V rows this many keys ahead, for 16-bit K and V only: f32, whose
// decode reads nearer the triad, lost (tuning table: kHeadsAheadKeys).
constexpr int64_t kHeadsAheadKeys = 4;
inline VecF vzero() { return _mm256_setzero_ps(); }
inline VecF vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, VecF v) { _mm256_storeu_ps(p, v); }
inline VecF vbroadcast(float x) { return _mm256_set1_ps(x); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline VecF vadd(VecF a, VecF b) { return _mm256_add_ps(a, b); }
inline VecF vsub(VecF a, VecF b) { return _mm256_sub_ps(a, b); }
inline VecF vmul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline VecF vmax(VecF a, VecF b) { return _mm256_max_ps(a, b); }
inline VecF vzero_if_neg_inf(VecF v) {
  return _mm256_blendv_ps(v, vzero(), _mm256_cmp_ps(v, vbroadcast(-INFINITY), _CMP_EQ_OQ));
}
// Whether a <= b in every lane.
inline bool vall_le(VecF a, VecF b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_LE_OQ)) == 0xff; }
// s where lo <= pos <= hi, else -inf.
inline VecF vneg_inf_outside(VecF s, VecF pos, VecF lo, VecF hi) {
  const VecF out = _mm256_or_ps(_mm256_cmp_ps(pos, lo, _CMP_LT_OQ), _mm256_cmp_ps(pos, hi, _CMP_GT_OQ));
  return _mm256_blendv_ps(s, vbroadcast(-INFINITY), out);
}
inline float vreduce_add(VecF v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}
inline float vreduce_max(VecF v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}

// exp_f32 (vec.inl) lane-wise: the same reduction and polynomial, its steps
// fused multiply-adds where exp_f32 rounds twice (about one result in ten
// differs in the last bit: -80 < x < 0 in steps of 0.001, on Zen 4). The
// lanes below -87.3 (-inf among them) are blended to 0 whatever they
// computed, so x needs no lower clamp. min returns its second operand for a
// NaN, which so passes through every step (a NaN's exponent bits are
// garbage, the product NaN).
inline VecF vexp(VecF x) {
  const VecF xc = _mm256_min_ps(vbroadcast(88.3f), x);
  const VecF nf = _mm256_round_ps(vmul(xc, vbroadcast(kExpLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  VecF r = _mm256_fnmadd_ps(nf, vbroadcast(kExpLn2Hi), xc);
  r = _mm256_fnmadd_ps(nf, vbroadcast(kExpLn2Lo), r);
  VecF p = vbroadcast(kExpPoly[0]);
  for (int i = 1; i < kExpPolyTerms; ++i) p = vfma(p, r, vbroadcast(kExpPoly[i]));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(nf), _mm256_set1_epi32(127)), 23);
  const VecF below = _mm256_cmp_ps(x, vbroadcast(-87.3f), _CMP_LT_OQ);
  return _mm256_blendv_ps(vmul(p, _mm256_castsi256_ps(bits)), vzero(), below);
}

#include "tanh_f64x4.inl"
#define FG_PHILOX_X8 1
#include "philox_x8.inl"
inline VecF vtanh(VecF s, double inv) { return tanh_f32x8(s, inv); }

// 8 lanes of f32, bf16 or f16 bits (exact) as f32.
inline VecF vload_as(const float* p) { return vload(p); }
inline VecF vload_bf16(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
inline VecF vload_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// 8 lanes rounded to bf16 as bf16_from rounds them (nearest even, NaN
// quieted), stored as 8 bf16 elements.
#define FG_VEC_STORE_BF16 1
inline void vstore_bf16(uint16_t* p, VecF x) {
  const __m256i u = _mm256_castps_si256(x), hi = _mm256_srli_epi32(u, 16);
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i bias = _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
  const __m256i r = _mm256_blendv_epi8(_mm256_srli_epi32(_mm256_add_epi32(u, bias), 16),
                                       _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  // 32-bit lanes below 2^16 packed to 16 bits: each 128-bit half packs its own, then halves 0 and 2 join.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

// bf16 elements p[0] and p[1] broadcast as one 32-bit word, and each half
// as f32 (vec.inl, accumulate_bf16_pairs).
#define FG_BF16_PAIRS 1
inline VecF vbroadcast_pair(const void* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(w)));
}
inline VecF vpair_lo(VecF w) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(w), 16)); }
inline VecF vpair_hi(VecF w) { return _mm256_and_ps(w, _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0xffff0000u)))); }
// 8 32-bit words (16 bf16 elements, 8 pairs) as they lie.
inline VecF vload_words(const void* p) { return _mm256_loadu_ps(static_cast<const float*>(p)); }

// r[i] = row i of an 8 x 8 block in, column i out.
#define FG_TRANSPOSE_REGS 1
inline void transpose_regs(VecF (&r)[8]) {
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm256_permute2f128_ps(r[k], r[4 + k], 0x20);
    t[4 + k] = _mm256_permute2f128_ps(r[k], r[4 + k], 0x31);
  }
  for (int i = 0; i < 8; ++i) r[i] = t[i];
}

// dst[c * ldd + r] = src[r * lds + c] for one 8 x 8 block, in registers;
// S is float, bf16_t or f16_t (vload_as converts).
constexpr int64_t kTransposeBlock = 8;
template <typename S>
inline void transpose_block(const S* src, int64_t lds, float* dst, int64_t ldd) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = vload_as(src + i * lds);
  transpose_regs(r);
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + i * ldd, r[i]);
}
