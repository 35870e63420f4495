// tanh_f32 (vec.inl) on 8 lanes, in two halves of 4 f64 lanes: the same
// operations in the same order, so the same results. The AVX2 layer's
// (vec_avx512.inl has its 8-lane form).

inline __m256d tanh_abs_f64x4(__m256d x) {
  const __m256d a = _mm256_mul_pd(
      _mm256_min_pd(_mm256_andnot_pd(_mm256_set1_pd(-0.0), x), _mm256_set1_pd(kTanhClamp)), _mm256_set1_pd(2.0));
  const __m256d n =
      _mm256_round_pd(_mm256_mul_pd(a, _mm256_set1_pd(kTanhLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(kTanhLn2Hi), a);
  r = _mm256_fnmadd_pd(n, _mm256_set1_pd(kTanhLn2Lo), r);
  __m256d p = _mm256_set1_pd(kTanhPoly[0]);
  for (int i = 1; i < kTanhPolyTerms; ++i) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kTanhPoly[i]));
  p = _mm256_mul_pd(p, r);
  const __m256i bits =
      _mm256_slli_epi64(_mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(n)), _mm256_set1_epi64x(1023)), 52);
  const __m256d scale = _mm256_castsi256_pd(bits);
  const __m256d e = _mm256_fmadd_pd(scale, p, _mm256_sub_pd(scale, _mm256_set1_pd(1.0)));
  const __m256d d = _mm256_add_pd(e, _mm256_set1_pd(2.0));
  const __m256d r0 = _mm256_cvtps_pd(_mm_div_ps(_mm_set1_ps(1.0f), _mm256_cvtpd_ps(d)));
  return _mm256_mul_pd(e, _mm256_fmadd_pd(r0, _mm256_fnmadd_pd(d, r0, _mm256_set1_pd(1.0)), r0));
}

inline __m256 tanh_f32x8(__m256 s, double inv) {
  const __m256d iv = _mm256_set1_pd(inv);
  const __m128 lo = _mm256_cvtpd_ps(tanh_abs_f64x4(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(s)), iv)));
  const __m128 hi = _mm256_cvtpd_ps(tanh_abs_f64x4(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(s, 1)), iv)));
  const __m256 t = _mm256_or_ps(_mm256_set_m128(hi, lo), _mm256_and_ps(s, _mm256_set1_ps(-0.0f)));
  return _mm256_blendv_ps(t, s, _mm256_cmp_ps(s, s, _CMP_UNORD_Q));
}
