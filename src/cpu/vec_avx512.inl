// The f32 vector layer for AVX-512: 16 lanes. The tile product keeps 6 rows x
// 64 columns of accumulators in 24 of the 32 zmm registers.
#define FG_VEC_GEMM 1
constexpr bool kVecGemm = true;  // FG_VEC_GEMM for if constexpr
using VecF = __m512;
constexpr int64_t kLanes = 16;
// The tile product's register block: 6 rows x 4 vectors (64 columns), 24
// accumulators; fewer loads per FMA than 12 x 32 (tuning table: kGemmMr).
constexpr int64_t kGemmMr = 6;
constexpr int64_t kGemmVecs = 4;
// Whole-row decode products (forward_tiles.inl) at 1 to 4 query rows; most decode
// tasks of [B, L, H, d] go across heads (heads_across; tuning table:
// kWholeRows).
constexpr int64_t kWholeRows = 4;
// Narrow tiles (forward_narrow.inl) from 5 stacked query rows, with the next tile's
// K and V rows asked of L2 during the products (vec_avx2.inl); whole rows
// (kWholeRows) stay ahead to 4 (tuning table: kNarrowMinRows,
// kNarrowPrefetchNext).
constexpr int64_t kNarrowMinRows = 5;
constexpr int64_t kNarrowMaxRows = 31;  // to 31 (two vectors; 32 rows keys-major: not measured here)
constexpr int64_t kNarrowWidth = 32;  // query rows per narrow chunk: two vectors
constexpr bool kNarrowPrefetchNext = true;
// Decode across heads' prefetch (vec_avx2.inl): off, it did not pay here
// (tuning table: kHeadsAheadKeys).
constexpr int64_t kHeadsAheadKeys = 0;
// Narrow tiles (forward_narrow.inl): accumulators of a one- or two-vector-wide block.
constexpr int kNarrowAcc = 16;
// Keys per narrow tile of one vector of rows and of two (forward_narrow.inl,
// narrow_keys): 64 against 16, where each block of O^T's rows loaded,
// rescaled and stored its accumulators once per 16 keys (tuning table:
// kNarrowVecKeys).
constexpr int64_t kNarrowVecKeys = 64;
constexpr int64_t kNarrowWideKeys = 64;
// Rows of a narrow block whose A is bf16 pairs read in place, for nv
// vectors: as many as the f32 blocks' accumulators. The 4 rows that AVX2's
// registers allow left one vector four FMA chains for two pipes of 4-cycle
// FMAs (tuning table: narrow_bf16_rows).
constexpr int narrow_bf16_rows(int nv) { return kNarrowAcc / nv; }
inline VecF vzero() { return _mm512_setzero_ps(); }
inline VecF vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, VecF v) { _mm512_storeu_ps(p, v); }
inline VecF vbroadcast(float x) { return _mm512_set1_ps(x); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
inline VecF vadd(VecF a, VecF b) { return _mm512_add_ps(a, b); }
inline VecF vsub(VecF a, VecF b) { return _mm512_sub_ps(a, b); }
inline VecF vmul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
inline VecF vmax(VecF a, VecF b) { return _mm512_max_ps(a, b); }
inline float vreduce_add(VecF v) { return _mm512_reduce_add_ps(v); }
inline VecF vzero_if_neg_inf(VecF v) {
  return _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, vbroadcast(-INFINITY), _CMP_EQ_OQ), vzero());
}
inline float vreduce_max(VecF v) { return _mm512_reduce_max_ps(v); }
// Whether a <= b in every lane.
inline bool vall_le(VecF a, VecF b) { return _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ) == 0xffff; }
// s where lo <= pos <= hi, else -inf.
inline VecF vneg_inf_outside(VecF s, VecF pos, VecF lo, VecF hi) {
  const __mmask16 out = _mm512_cmp_ps_mask(pos, lo, _CMP_LT_OQ) | _mm512_cmp_ps_mask(pos, hi, _CMP_GT_OQ);
  return _mm512_mask_mov_ps(s, out, vbroadcast(-INFINITY));
}

// exp_f32 (vec.inl) lane-wise: the same reduction and polynomial, its steps
// fused multiply-adds where exp_f32 rounds twice (about one result in ten
// differs in the last bit: -80 < x < 0 in steps of 0.001, on Zen 4). The
// lanes below -87.3 (-inf among them) are zeroed by the mask of vscalefps,
// whatever they computed, so x needs no lower clamp; vscalefps multiplies by
// 2^n in one instruction where the exponent bits took four. min returns its
// second operand for a NaN, which so passes through every step.
inline VecF vexp(VecF x) {
  const __mmask16 keep = _mm512_cmp_ps_mask(x, vbroadcast(-87.3f), _CMP_NLT_UQ);
  const VecF xc = _mm512_min_ps(vbroadcast(88.3f), x);
  const VecF nf = _mm512_roundscale_ps(vmul(xc, vbroadcast(kExpLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  VecF r = _mm512_fnmadd_ps(nf, vbroadcast(kExpLn2Hi), xc);
  r = _mm512_fnmadd_ps(nf, vbroadcast(kExpLn2Lo), r);
  VecF p = vbroadcast(kExpPoly[0]);
  for (int i = 1; i < kExpPolyTerms; ++i) p = vfma(p, r, vbroadcast(kExpPoly[i]));
  return _mm512_maskz_scalef_ps(keep, p, nf);
}

// tanh_f32 (vec.inl) lane-wise, in two halves of 8 f64 lanes: the same
// operations in the same order as tanh_f64x4.inl's, so the same results.
#define FG_PHILOX_X8 1
#include "philox_x8.inl"
#define FG_PHILOX_X16 1
#include "philox_x16.inl"
inline __m256 tanh_abs_f32x8(__m256 s, double inv) {
  const __m512d x = _mm512_mul_pd(_mm512_cvtps_pd(s), _mm512_set1_pd(inv));
  const __m512d a = _mm512_mul_pd(_mm512_min_pd(_mm512_abs_pd(x), _mm512_set1_pd(kTanhClamp)), _mm512_set1_pd(2.0));
  const __m512d n =
      _mm512_roundscale_pd(_mm512_mul_pd(a, _mm512_set1_pd(kTanhLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(kTanhLn2Hi), a);
  r = _mm512_fnmadd_pd(n, _mm512_set1_pd(kTanhLn2Lo), r);
  __m512d p = _mm512_set1_pd(kTanhPoly[0]);
  for (int i = 1; i < kTanhPolyTerms; ++i) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kTanhPoly[i]));
  p = _mm512_mul_pd(p, r);
  const __m512i bits =
      _mm512_slli_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_cvtpd_epi32(n)), _mm512_set1_epi64(1023)), 52);
  const __m512d scale = _mm512_castsi512_pd(bits);
  const __m512d e = _mm512_fmadd_pd(scale, p, _mm512_sub_pd(scale, _mm512_set1_pd(1.0)));
  const __m512d d = _mm512_add_pd(e, _mm512_set1_pd(2.0));
  const __m512d r0 = _mm512_cvtps_pd(_mm256_div_ps(_mm256_set1_ps(1.0f), _mm512_cvtpd_ps(d)));
  return _mm512_cvtpd_ps(_mm512_mul_pd(e, _mm512_fmadd_pd(r0, _mm512_fnmadd_pd(d, r0, _mm512_set1_pd(1.0)), r0)));
}
inline VecF vtanh(VecF s, double inv) {
  const __m256 lo = tanh_abs_f32x8(_mm512_castps512_ps256(s), inv);
  const __m256 hi = tanh_abs_f32x8(_mm512_extractf32x8_ps(s, 1), inv);
  const VecF t = _mm512_or_ps(_mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1),
                              _mm512_and_ps(s, _mm512_set1_ps(-0.0f)));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(s, s, _CMP_UNORD_Q), t, s);
}

// 16 lanes of f32, bf16 or f16 bits (exact) as f32.
inline VecF vload_as(const float* p) { return vload(p); }
inline VecF vload_bf16(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
inline VecF vload_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
// 16 lanes rounded to bf16 as bf16_from rounds them (nearest even, NaN
// quieted), stored as 16 bf16 elements.
#define FG_VEC_STORE_BF16 1
inline void vstore_bf16(uint16_t* p, VecF x) {
  const __m512i u = _mm512_castps_si512(x), hi = _mm512_srli_epi32(u, 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i bias = _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
  const __m512i r = _mm512_mask_mov_epi32(_mm512_srli_epi32(_mm512_add_epi32(u, bias), 16), nan,
                                          _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}

// bf16 elements p[0] and p[1] broadcast as one 32-bit word, and each half
// as f32 (vec.inl, accumulate_bf16_pairs): the narrow tiles read bf16 K and
// V in place instead of converting them into f32 stages (tuning table:
// FG_BF16_PAIRS).
#define FG_BF16_PAIRS 1
inline VecF vbroadcast_pair(const void* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(w)));
}
inline VecF vpair_lo(VecF w) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(w), 16)); }
inline VecF vpair_hi(VecF w) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(w), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// r[i] = row i of a 16 x 16 block in, column i out.
#define FG_TRANSPOSE_REGS 1
inline void transpose_regs(VecF (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // 32-bit interleave of row pairs
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // 64-bit interleave: r[4i + k] holds column 4L + k of rows 4i..4i+3 in lane L
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int k = 0; k < 4; ++k) {  // gather lane L of r[k], r[4+k], r[8+k], r[12+k] into row 4L + k
    const __m512 v0 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0x88), v1 = _mm512_shuffle_f32x4(r[k], r[4 + k], 0xdd);
    const __m512 w0 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0x88), w1 = _mm512_shuffle_f32x4(r[8 + k], r[12 + k], 0xdd);
    t[0 + k] = _mm512_shuffle_f32x4(v0, w0, 0x88);
    t[8 + k] = _mm512_shuffle_f32x4(v0, w0, 0xdd);
    t[4 + k] = _mm512_shuffle_f32x4(v1, w1, 0x88);
    t[12 + k] = _mm512_shuffle_f32x4(v1, w1, 0xdd);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// A boolean mask's bytes at keys [key, key + 8) of 16 rows (each readable
// there) as 8 keep masks, bit x of keep[t] set where rows[x][key + t] is
// not 0: two 64-bit gathers in place of 128 byte loads and stores (tuning
// table: keys-major mask). vkeep_or_neg_inf: lanes whose bit is 0 become -inf.
#define FG_MASK_BITS16 1
inline void mask_bits16(const uint8_t* const* rows, int64_t key, uint16_t (&keep)[8]) {
  const __m512i k = _mm512_set1_epi64(key);
  const __m512i lo = _mm512_i64gather_epi64(_mm512_add_epi64(_mm512_loadu_si512(rows), k), nullptr, 1);
  const __m512i hi = _mm512_i64gather_epi64(_mm512_add_epi64(_mm512_loadu_si512(rows + 8), k), nullptr, 1);
  for (int t = 0; t < 8; ++t) {
    const __m512i byte = _mm512_set1_epi64(int64_t{0xff} << (8 * t));
    keep[t] = static_cast<uint16_t>(_mm512_test_epi64_mask(lo, byte) | (_mm512_test_epi64_mask(hi, byte) << 8));
  }
}
inline VecF vkeep_or_neg_inf(VecF x, uint16_t keep) {
  return _mm512_mask_blend_ps(keep, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), x);
}

// dst[c * ldd + r] = src[r * lds + c] for one 16 x 16 block, in registers;
// S is float, bf16_t or f16_t (vload_as converts).
constexpr int64_t kTransposeBlock = 16;
template <typename S>
inline void transpose_block(const S* src, int64_t lds, float* dst, int64_t ldd) {
  __m512 r[16];
  for (int i = 0; i < 16; ++i) r[i] = vload_as(src + i * lds);
  transpose_regs(r);
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ldd, r[i]);
}

#if FG_BF16_DOT
// AVX512_BF16, compiled only in kernels_avx512bf16.cpp. A pair is two bf16
// values in one 32-bit word, the lower-indexed one in the HIGH half:
// vdpbf16ps adds the high halves' product to an f32 lane first, then the low
// halves' (each step one rounding, to nearest even; inputs and results below
// 2^-126 count as zero), so a dot product runs in index order, as the f32
// tile product's FMAs do. bf16 products are exact in f32, so the two agree
// bit for bit (scale aside; see Bf16DotTiles).
inline __m512bh as_pairs(__m512i x) { return (__m512bh)x; }
inline __m512i as_words(__m512bh x) { return (__m512i)x; }

// dst[0..npairs) = the pairs of src[0..n) (contiguous), zero past element n;
// npairs is a multiple of 16. Memory holds src[2p] in the low half of word
// p: the rotation swaps the halves.
inline void load_bf16_pairs(const uint16_t* src, int64_t n, int64_t npairs, uint32_t* dst) {
  for (int64_t p = 0; p < npairs; p += 16) {
    const int64_t left = n - 2 * p;
    if (left <= 0) {
      _mm512_storeu_si512(dst + p, _mm512_setzero_si512());
      continue;
    }
    const __mmask32 k = left >= 32 ? ~__mmask32(0) : (__mmask32(1) << left) - 1;
    _mm512_storeu_si512(dst + p, _mm512_rol_epi32(_mm512_maskz_loadu_epi16(k, src + 2 * p), 16));
  }
}

// dst[c] = pair (r0[c], r1[c]) for c < n, (r0[c], 0) when r1 is null, 0 for
// n <= c < pad (a multiple of 16): two rows interleaved into the pair layout
// of the B operand, whose pairs run down the k index.
inline void interleave_bf16_rows(const uint16_t* r0, const uint16_t* r1, int64_t n, int64_t pad, uint32_t* dst) {
  // 32 columns at a time: each row's quarters spread so that the in-lane
  // word unpacks leave the pairs in column order. Against 16 columns of
  // widened words: half the loads and shuffles (tuning table:
  // interleave_bf16_rows).
  const __m512i spread = _mm512_set_epi64(7, 3, 6, 2, 5, 1, 4, 0);
  int64_t c = 0;
  for (; c + 32 <= pad && c < n; c += 32) {
    const int64_t left = n - c;
    const __mmask32 k = left >= 32 ? ~__mmask32(0) : (__mmask32(1) << left) - 1;
    const __m512i first = _mm512_permutexvar_epi64(spread, _mm512_maskz_loadu_epi16(k, r0 + c));
    const __m512i second =
        r1 ? _mm512_permutexvar_epi64(spread, _mm512_maskz_loadu_epi16(k, r1 + c)) : _mm512_setzero_si512();
    _mm512_storeu_si512(dst + c, _mm512_unpacklo_epi16(second, first));
    _mm512_storeu_si512(dst + c + 16, _mm512_unpackhi_epi16(second, first));
  }
  for (; c < pad; c += 16) {
    const int64_t left = n - c;
    if (left <= 0) {
      _mm512_storeu_si512(dst + c, _mm512_setzero_si512());
      continue;
    }
    const __mmask16 k = left >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << left) - 1);
    const __m512i first = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, r0 + c)), 16);
    const __m512i second = r1 ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, r1 + c)) : _mm512_setzero_si512();
    _mm512_storeu_si512(dst + c, _mm512_or_si512(first, second));
  }
}

// s[0..n) (f32, n a multiple of 32) rounded to bf16 pairs in place: word p
// of the row then holds the pair (s[2p], s[2p + 1]). Each store lands on
// words the loop has already read.
inline void round_bf16_pairs(float* s, int64_t n) {
  for (int64_t j = 0; j < n; j += 32) {
    const __m512 lo = _mm512_loadu_ps(s + j), hi = _mm512_loadu_ps(s + j + 16);
    _mm512_storeu_si512(s + j / 2, _mm512_rol_epi32(as_words(_mm512_cvtne2ps_pbh(hi, lo)), 16));
  }
}

// exp_row and round_bf16_pairs in one pass: s[j] = exp(s[j] - m) for j < n
// (a multiple of 16), summed in f32 in exp_row's order before the rounding,
// then rounded to bf16 pairs in place over words [0, w / 2) (w >= n, a
// multiple of 32; pairs past n hold zero). Returns the sum.
inline float exp_row_pairs(float* s, int64_t n, float m, int64_t w) {
  FG_DASSERT(n % 16 == 0 && w % 32 == 0 && n <= w);
  const VecF mv = vbroadcast(m);
  VecF sum = vzero();
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const VecF lo = vexp(vsub(vload(s + j), mv));
    sum = vadd(sum, lo);
    const VecF hi = vexp(vsub(vload(s + j + 16), mv));
    sum = vadd(sum, hi);
    _mm512_storeu_si512(s + j / 2, _mm512_rol_epi32(as_words(_mm512_cvtne2ps_pbh(hi, lo)), 16));
  }
  if (j < n) {
    const VecF lo = vexp(vsub(vload(s + j), mv));
    sum = vadd(sum, lo);
    _mm512_storeu_si512(s + j / 2, _mm512_rol_epi32(as_words(_mm512_cvtne2ps_pbh(vzero(), lo)), 16));
    j += 32;
  }
  for (; j < w; j += 32) _mm512_storeu_si512(s + j / 2, _mm512_setzero_si512());
  return vreduce_add(sum);
}

// dst[c] = pair (r0[c], r1[c]) of f32 rows rounded to bf16 (nearest even),
// for c < n (a multiple of 16); r1 null: (r0[c], 0).
inline void interleave_f32_rows(const float* r0, const float* r1, int64_t n, uint32_t* dst) {
  for (int64_t c = 0; c < n; c += 16) {
    const __m512i first = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(r0 + c)));
    const __m512i second =
        r1 ? _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(r1 + c))) : _mm512_setzero_si512();
    _mm512_storeu_si512(dst + c, _mm512_or_si512(_mm512_slli_epi32(first, 16), second));
  }
}

// What gemm_bf16's blocks do with each sum from zero, acc, at C's element:
//   store    C = mul * acc
//   add      C = mul * acc + C
//   rescale  C = C * row_scale[r] + acc (mul unused), rounded after the
//            product as scale_add rounds it: the forward's O * alpha + P V
enum class PairEpi { store, add, rescale };

// C[m, 0..n) from sum_p A[m, p] . B[p, 0..n), p over kp pairs, as E says:
// A's pair (r, p) at a[r * lda + p] is broadcast, B is [kp, ldb] pairs, C
// is f32. Mr rows x Nv vectors of accumulators; every element's sum runs in
// pair order whatever the blocking.
template <PairEpi E, int Mr, int Nv>
inline void gemm_bf16_block(int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                            float* c, int64_t ldc, __m512 mul, const float* row_scale) {
  __m512 acc[Mr][Nv];
#pragma GCC unroll 16
  for (int r = 0; r < Mr; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < Nv; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    __m512bh bv[Nv];
#pragma GCC unroll 4
    for (int v = 0; v < Nv; ++v) bv[v] = as_pairs(_mm512_loadu_si512(b + p * ldb + 16 * v));
#pragma GCC unroll 16
    for (int r = 0; r < Mr; ++r) {
      const __m512bh av = as_pairs(_mm512_set1_epi32(static_cast<int>(a[r * lda + p])));
#pragma GCC unroll 4
      for (int v = 0; v < Nv; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < Mr; ++r) {
    [[maybe_unused]] const __m512 rs = E == PairEpi::rescale ? _mm512_set1_ps(row_scale[r]) : mul;
#pragma GCC unroll 4
    for (int v = 0; v < Nv; ++v) {
      float* cr = c + r * ldc + 16 * v;
      if constexpr (E == PairEpi::add)
        _mm512_storeu_ps(cr, _mm512_fmadd_ps(acc[r][v], mul, _mm512_loadu_ps(cr)));
      else if constexpr (E == PairEpi::rescale)
        _mm512_storeu_ps(cr, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(cr), rs), acc[r][v]));
      else
        _mm512_storeu_ps(cr, _mm512_mul_ps(acc[r][v], mul));
    }
  }
}

// 64-column blocks, then a 32-column one and a 16-column one.
template <PairEpi E, int Mr>
inline void gemm_bf16_rows(int64_t n, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                           float* c, int64_t ldc, __m512 mul, const float* row_scale) {
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) gemm_bf16_block<E, Mr, 4>(kp, a, lda, b + j, ldb, c + j, ldc, mul, row_scale);
  if (j + 32 <= n) {
    gemm_bf16_block<E, Mr, 2>(kp, a, lda, b + j, ldb, c + j, ldc, mul, row_scale);
    j += 32;
  }
  if (j < n) gemm_bf16_block<E, Mr, 1>(kp, a, lda, b + j, ldb, c + j, ldc, mul, row_scale);
}

// Tuning table: kPairMr.
constexpr int64_t kPairMr = 6;  // gemm_bf16's rows per register block

// n a multiple of 16. Blocks of 6 rows x 64 columns (24 accumulators, 10
// loads per 24 dot products where 12 x 32 took 14). row_scale: [m], for
// PairEpi::rescale only.
template <PairEpi E>
inline void gemm_bf16_epi(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b,
                          int64_t ldb, float* c, int64_t ldc, float mul, const float* row_scale) {
  FG_DASSERT(n % 16 == 0);
  FG_DASSERT(E != PairEpi::rescale || row_scale);
  const __m512 mv = _mm512_set1_ps(mul);
  int64_t i = 0;
  constexpr int64_t kMr = kPairMr;
  for (; i + kMr <= m; i += kMr)
    gemm_bf16_rows<E, kMr>(n, kp, a + i * lda, lda, b, ldb, c + i * ldc, ldc, mv, row_scale ? row_scale + i : nullptr);
  a += i * lda;
  c += i * ldc;
  if (row_scale) row_scale += i;
  switch (m - i) {
    case 0: break;
    case 1: gemm_bf16_rows<E, 1>(n, kp, a, lda, b, ldb, c, ldc, mv, row_scale); break;
    case 2: gemm_bf16_rows<E, 2>(n, kp, a, lda, b, ldb, c, ldc, mv, row_scale); break;
    case 3: gemm_bf16_rows<E, 3>(n, kp, a, lda, b, ldb, c, ldc, mv, row_scale); break;
    case 4: gemm_bf16_rows<E, 4>(n, kp, a, lda, b, ldb, c, ldc, mv, row_scale); break;
    default: gemm_bf16_rows<E, 5>(n, kp, a, lda, b, ldb, c, ldc, mv, row_scale); break;
  }
}

// C = mul * A B, or C += mul * A B when Add (the sum formed from zero first).
template <bool Add = false>
inline void gemm_bf16(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b,
                      int64_t ldb, float* c, int64_t ldc, float mul) {
  gemm_bf16_epi<Add ? PairEpi::add : PairEpi::store>(m, n, kp, a, lda, b, ldb, c, ldc, mul, nullptr);
}

// kt [round_up(kp, 16), 16] = n <= 16 rows of bf16 (ld elements apart, d
// elements each, kp = (d + 1) / 2) as pairs, transposed: key j's pair p at
// kt[16 p + j]; zero past row n and past element d.
inline void load_pairs_keys16(const uint16_t* rows, int64_t ld, int64_t n, int64_t d, uint32_t* kt) {
  for (int64_t c = 0; 2 * c < d; c += 16) {
    const int64_t left = d - 2 * c;
    const __mmask32 k = left >= 32 ? ~__mmask32(0) : (__mmask32(1) << left) - 1;
    __m512 r[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      if (j >= n) {
        r[j] = _mm512_setzero_ps();
        continue;
      }
      r[j] = _mm512_castsi512_ps(_mm512_rol_epi32(_mm512_maskz_loadu_epi16(k, rows + j * ld + 2 * c), 16));
    }
    transpose_regs(r);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) _mm512_storeu_si512(kt + (c + i) * 16, _mm512_castps_si512(r[i]));
  }
}

// Lines to ask L2 for, one per step() in memory order: rows of span bytes
// (a multiple of 64), ld bytes apart, from at; none once rows reaches 0.
struct LineWalk {
  const char* at = nullptr;
  int64_t rows = 0, span = 0, ld = 0;
  int64_t left = 0;  // bytes left in the row at `at`
  LineWalk() = default;
  LineWalk(const char* start, int64_t n, int64_t span_, int64_t ld_)
      : at(start), rows(n), span(span_), ld(ld_), left(span_) {}
  void step() {
    if (rows == 0) return;
    _mm_prefetch(at, _MM_HINT_T1);
    at += 64;
    left -= 64;
    if (left == 0) {
      at += ld - span;
      left = span;
      --rows;
    }
  }
  // The lines step() has not reached.
  void rest() {
    while (rows) step();
  }
};

// C [16, 16 Nv] (row stride ldc) = mul * K Q^T over kp pairs, with K's
// pairs as load_pairs_keys16 lays them out (kt) and Q^T's as [kp, ldq]
// words: every sum from zero in pair order, as gemm_bf16's, whose product
// it is with the operands' roles swapped (bf16 products are exact, so the
// order of a product's factors changes nothing). Keys in blocks of 16 / Nv,
// 16 accumulators. Each step of the first block walks a line of wk and wv.
template <int Nv>
inline void gemm_bf16_keys16(int64_t kp, const uint32_t* kt, const uint32_t* qt, int64_t ldq, float* c, int64_t ldc,
                             float mul, LineWalk& wk, LineWalk& wv) {
  constexpr int Keys = 16 / Nv;
  const __m512 mv = _mm512_set1_ps(mul);
  for (int j0 = 0; j0 < 16; j0 += Keys) {
    __m512 acc[Keys][Nv];
#pragma GCC unroll 16
    for (int j = 0; j < Keys; ++j)
#pragma GCC unroll 2
      for (int v = 0; v < Nv; ++v) acc[j][v] = _mm512_setzero_ps();
    for (int64_t p = 0; p < kp; ++p) {
      if (j0 == 0) {
        wk.step();
        wv.step();
      }
      __m512bh bv[Nv];
#pragma GCC unroll 2
      for (int v = 0; v < Nv; ++v) bv[v] = as_pairs(_mm512_loadu_si512(qt + p * ldq + 16 * v));
#pragma GCC unroll 16
      for (int j = 0; j < Keys; ++j) {
        const __m512bh av = as_pairs(_mm512_set1_epi32(static_cast<int>(kt[p * 16 + j0 + j])));
#pragma GCC unroll 2
        for (int v = 0; v < Nv; ++v) acc[j][v] = _mm512_dpbf16_ps(acc[j][v], av, bv[v]);
      }
    }
#pragma GCC unroll 16
    for (int j = 0; j < Keys; ++j)
#pragma GCC unroll 2
      for (int v = 0; v < Nv; ++v) _mm512_storeu_ps(c + (j0 + j) * ldc + 16 * v, _mm512_mul_ps(acc[j][v], mv));
  }
}

// C [m, 16 Nv] (row stride ldc, m a multiple of 16 / Nv) = C * alpha + A B
// over kp pairs: A's pair (r, p) at a[p * lda + r] (pair rows, as
// interleave_bf16_rows lays out V), B [kp, 16 Nv] words, alpha [16 Nv]; each
// sum from zero in pair order, then added with one rounding.
template <int Nv>
inline void gemm_bf16_cols(int64_t m, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, float* c,
                           int64_t ldc, const float* alpha, LineWalk* walk = nullptr) {
  constexpr int Mr = 16 / Nv;
  __m512 al[Nv];
#pragma GCC unroll 2
  for (int v = 0; v < Nv; ++v) al[v] = _mm512_loadu_ps(alpha + 16 * v);
  for (int64_t r0 = 0; r0 < m; r0 += Mr) {
    __m512 acc[Mr][Nv];
#pragma GCC unroll 16
    for (int r = 0; r < Mr; ++r)
#pragma GCC unroll 2
      for (int v = 0; v < Nv; ++v) acc[r][v] = _mm512_setzero_ps();
    for (int64_t p = 0; p < kp; ++p) {
      if (walk) walk->step();
      __m512bh bv[Nv];
#pragma GCC unroll 2
      for (int v = 0; v < Nv; ++v) bv[v] = as_pairs(_mm512_loadu_si512(b + p * 16 * Nv + 16 * v));
#pragma GCC unroll 16
      for (int r = 0; r < Mr; ++r) {
        const __m512bh av = as_pairs(_mm512_set1_epi32(static_cast<int>(a[p * lda + r0 + r])));
#pragma GCC unroll 2
        for (int v = 0; v < Nv; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < Mr; ++r)
#pragma GCC unroll 2
      for (int v = 0; v < Nv; ++v) {
        float* cr = c + (r0 + r) * ldc + 16 * v;
        _mm512_storeu_ps(cr, _mm512_fmadd_ps(_mm512_loadu_ps(cr), al[v], acc[r][v]));
      }
  }
}
#endif

#if FG_AMX
// AMX-BF16, compiled only in kernels_amx.cpp, on the pair layouts above.
// TDPBF16PS sums a 16-pair step's products in an order and precision of its
// own (on the dev CPU its results match none of: index-order FMAs, pairs
// added then summed, each step summed exactly then added), so its products
// differ from the f32 tiles' by rounding. Every tile register holds 16 rows
// of 64 bytes: tmm0-3 a 32 x 32 block of C, tmm4-5 two 16-row slices of A,
// tmm6-7 two 16-column slices of B.
inline void amx_configure() {
  alignas(64) uint8_t cfg[64] = {};
  cfg[0] = 1;  // palette 1
  for (int t = 0; t < 8; ++t) {
    cfg[16 + 2 * t] = 64;  // bytes per row (little-endian u16)
    cfg[48 + t] = 16;      // rows
  }
  _tile_loadconfig(cfg);
}

// c[16 Mt, 16 Nt] = a[16 Mt, kp] b[kp, 16 Nt] in pairs, plus c itself when
// Add (Mt, Nt in {1, 2}; kp a multiple of 16; strides in words).
template <bool Add, int Mt = 2, int Nt = 2>
inline void amx_block(int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb, float* c,
                      int64_t ldc) {
  const int64_t sc = ldc * 4, sa = lda * 4, sb = ldb * 4;
  if constexpr (Add) {
    _tile_loadd(0, c, sc);
    if constexpr (Nt == 2) _tile_loadd(1, c + 16, sc);
    if constexpr (Mt == 2) _tile_loadd(2, c + 16 * ldc, sc);
    if constexpr (Mt == 2 && Nt == 2) _tile_loadd(3, c + 16 * ldc + 16, sc);
  } else {
    _tile_zero(0);
    if constexpr (Nt == 2) _tile_zero(1);
    if constexpr (Mt == 2) _tile_zero(2);
    if constexpr (Mt == 2 && Nt == 2) _tile_zero(3);
  }
  for (int64_t k = 0; k < kp; k += 16) {
    _tile_loadd(4, a + k, sa);
    if constexpr (Mt == 2) _tile_loadd(5, a + 16 * lda + k, sa);
    _tile_loadd(6, b + k * ldb, sb);
    if constexpr (Nt == 2) _tile_loadd(7, b + k * ldb + 16, sb);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (Nt == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (Mt == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (Mt == 2 && Nt == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, sc);
  if constexpr (Nt == 2) _tile_stored(1, c + 16, sc);
  if constexpr (Mt == 2) _tile_stored(2, c + 16 * ldc, sc);
  if constexpr (Mt == 2 && Nt == 2) _tile_stored(3, c + 16 * ldc + 16, sc);
}

constexpr int64_t kAmxMaxPairs = 256;  // head_dim <= 512, key tiles <= 512

// Rows [i, i + 16 Mt) of C over every column: n / 32 blocks of 32 columns and a last 16.
template <bool Add, int Mt>
inline void amx_rows(int64_t n, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                     float* c, int64_t ldc) {
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) amx_block<Add, Mt, 2>(kp, a, lda, b + j, ldb, c + j, ldc);
  if (j < n) amx_block<Add, Mt, 1>(kp, a, lda, b + j, ldb, c + j, ldc);
}

// C[m, 0..n) = sum_p A[m, p] . B[p, 0..n) over kp pairs, plus C when Add
// (n a multiple of 16, kp of 16, kp <= kAmxMaxPairs), tiles configured by
// amx_configure. Rows past m are neither read nor written: the last m mod
// 16 rows go through zero-padded copies.
template <bool Add = false>
inline void gemm_amx(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b,
                     int64_t ldb, float* c, int64_t ldc) {
  FG_DASSERT(n % 16 == 0 && kp % 16 == 0 && kp <= kAmxMaxPairs);
  int64_t i = 0;
  for (; i + 32 <= m; i += 32) amx_rows<Add, 2>(n, kp, a + i * lda, lda, b, ldb, c + i * ldc, ldc);
  if (i + 16 <= m) {
    amx_rows<Add, 1>(n, kp, a + i * lda, lda, b, ldb, c + i * ldc, ldc);
    i += 16;
  }
  const int64_t mr = m - i;
  if (mr == 0) return;
  alignas(64) uint32_t abuf[16 * kAmxMaxPairs];
  alignas(64) float cbuf[16 * 32];
  for (int64_t r = 0; r < 16; ++r)
    for (int64_t x = 0; x < kp; ++x) abuf[r * kp + x] = r < mr ? a[(i + r) * lda + x] : 0u;
  for (int64_t j = 0; j < n; j += 32) {
    const int64_t nc = std::min<int64_t>(32, n - j);
    if constexpr (Add)
      for (int64_t r = 0; r < mr; ++r) std::memcpy(cbuf + r * 32, c + (i + r) * ldc + j, nc * sizeof(float));
    if (nc == 32)
      amx_block<Add, 1, 2>(kp, abuf, kp, b + j, ldb, cbuf, 32);
    else
      amx_block<Add, 1, 1>(kp, abuf, kp, b + j, ldb, cbuf, 32);
    for (int64_t r = 0; r < mr; ++r) std::memcpy(c + (i + r) * ldc + j, cbuf + r * 32, nc * sizeof(float));
  }
}
#endif
