// Philox4x32-10 (rng.inl, Philox::block) for 16 counters at once on
// AVX-512: philox_x8's rounds (philox_x8.inl) on 512-bit vectors, the same
// integer operations, so the same bits. Half the rounds' instructions per
// key against philox_x8 (tuning table: philox_x16).

inline void philox_mul_x16(__m512i x, __m512i m, __m512i& hi, __m512i& lo) {
  const __m512i even = _mm512_mul_epu32(x, m);                         // lanes 0, 2, .. as 64 bits
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), m);  // lanes 1, 3, ..
  lo = _mm512_mask_blend_epi32(0xaaaa, even, _mm512_slli_epi64(odd, 32));
  hi = _mm512_mask_blend_epi32(0xaaaa, _mm512_srli_epi64(even, 32), odd);
}

inline void philox_rounds_x16(__m512i (&x)[4], uint32_t key0, uint32_t key1) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  uint32_t k0 = key0, k1 = key1;
  for (int round = 0; round < 10; ++round) {
    __m512i hi0, lo0, hi1, lo1;
    philox_mul_x16(x[0], m0, hi0, lo0);
    philox_mul_x16(x[2], m1, hi1, lo1);
    x[0] = _mm512_ternarylogic_epi32(hi1, x[1], _mm512_set1_epi32(static_cast<int>(k0)), 0x96);  // a ^ b ^ c
    x[1] = lo1;
    x[2] = _mm512_ternarylogic_epi32(hi0, x[3], _mm512_set1_epi32(static_cast<int>(k1)), 0x96);
    x[3] = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

// keep[e] = 1 where column e's word (block e / 4, word e % 4) >= threshold,
// else 0, for the 64 columns of 16 blocks with counter words c0 + 0..15, c1,
// x2 and x3.
inline void philox_keep_x16(uint32_t c0, uint32_t c1, uint32_t x2, uint32_t x3, uint32_t key0, uint32_t key1,
                            uint32_t threshold, uint8_t keep[64]) {
  __m512i w[4] = {
      _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(c0)),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)),
      _mm512_set1_epi32(static_cast<int>(c1)), _mm512_set1_epi32(static_cast<int>(x2)),
      _mm512_set1_epi32(static_cast<int>(x3))};
  philox_rounds_x16(w, key0, key1);
  const __m512i t = _mm512_set1_epi32(static_cast<int>(threshold));
  uint64_t bits = 0;  // bit 4 b + w: block b's word w kept
  for (int v = 0; v < 4; ++v)
    bits |= _pdep_u64(_mm512_cmpge_epu32_mask(w[v], t), 0x1111111111111111ull << v);
  _mm512_storeu_si512(keep, _mm512_maskz_set1_epi8(bits, 1));
}

// philox_drop_x8 on 16 columns of P^T: lane c draws for query row xs[c] of
// head bhs[c]; a dropped key's P is zeroed.
inline void philox_drop_x16(const uint32_t* xs, const uint32_t* bhs, uint32_t off, uint32_t key0, uint32_t key1,
                            uint32_t threshold, int64_t y0, int64_t nj, float* pt, int64_t ld) {
  const __m512i c1 = _mm512_loadu_si512(xs), x2 = _mm512_loadu_si512(bhs);
  const __m512i x3 = _mm512_set1_epi32(static_cast<int>(off)), t = _mm512_set1_epi32(static_cast<int>(threshold));
  for (int64_t blk = y0 >> 2; blk <= (y0 + nj - 1) >> 2; ++blk) {
    __m512i w[4] = {_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(blk))), c1, x2, x3};
    philox_rounds_x16(w, key0, key1);
    for (int64_t e = 0; e < 4; ++e) {
      const int64_t j = blk * 4 + e - y0;
      if (j < 0 || j >= nj) continue;
      float* row = pt + j * ld;
      _mm512_storeu_ps(row, _mm512_maskz_mov_ps(_mm512_cmpge_epu32_mask(w[e], t), _mm512_loadu_ps(row)));
    }
  }
}
