// The f32 vector layer for AVX-512: 16 lanes. The tile product keeps 12 rows x
// 32 columns of accumulators in 24 of the 32 zmm registers.
#define FG_VEC_GEMM 1
using VecF = __m512;
constexpr int64_t kLanes = 16;
constexpr int64_t kGemmMr = 12;
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
inline float vreduce_max(VecF v) { return _mm512_reduce_max_ps(v); }

// exp_f32 (vec.inl) lane-wise: same reduction, polynomial and special cases.
inline VecF vexp(VecF x) {
  const VecF lo = vbroadcast(-87.3f);
  const VecF xc = _mm512_min_ps(_mm512_max_ps(x, lo), vbroadcast(88.3f));
  const VecF nf = _mm512_roundscale_ps(vmul(xc, vbroadcast(1.44269504088896341f)),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  VecF r = _mm512_fnmadd_ps(nf, vbroadcast(0.693145751953125f), xc);
  r = _mm512_fnmadd_ps(nf, vbroadcast(1.428606765330187045e-06f), r);
  VecF p = vbroadcast(1.0f / 5040.0f);
  for (float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f})
    p = vfma(p, r, vbroadcast(c));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(nf), _mm512_set1_epi32(127)), 23);
  VecF y = vmul(p, _mm512_castsi512_ps(bits));
  y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), vzero());
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

// dst[c * ldd + r] = src[r * lds + c] for one 16 x 16 block, in registers.
constexpr int64_t kTransposeBlock = 16;
inline void transpose_block(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
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
    _mm512_storeu_ps(dst + (0 + k) * ldd, _mm512_shuffle_f32x4(v0, w0, 0x88));
    _mm512_storeu_ps(dst + (8 + k) * ldd, _mm512_shuffle_f32x4(v0, w0, 0xdd));
    _mm512_storeu_ps(dst + (4 + k) * ldd, _mm512_shuffle_f32x4(v1, w1, 0x88));
    _mm512_storeu_ps(dst + (12 + k) * ldd, _mm512_shuffle_f32x4(v1, w1, 0xdd));
  }
}
