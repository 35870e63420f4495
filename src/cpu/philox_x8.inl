// Philox4x32-10 (rng.inl, Philox::block) for 8 counters at once. philox_x8:
// counter words c0 + 0..7, c1, x2 and x3 shared, out[w] holding word w of
// each of the 8 blocks. The same integer operations as the scalar form, so
// the same bits. The AVX2 layer's; the AVX-512 layer draws 16 at a time
// (philox_x16.inl) and takes these for the rest of a row.

inline void philox_mul(__m256i x, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(x, m);                         // lanes 0, 2, 4, 6 as 64 bits
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);  // lanes 1, 3, 5, 7
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xaa);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xaa);
}

// The ten rounds on 8 blocks whose counters x[0..3] hold, lane by lane.
inline void philox_rounds_x8(__m256i (&x)[4], uint32_t key0, uint32_t key1) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  uint32_t k0 = key0, k1 = key1;
  for (int round = 0; round < 10; ++round) {
    __m256i hi0, lo0, hi1, lo1;
    philox_mul(x[0], m0, hi0, lo0);
    philox_mul(x[2], m1, hi1, lo1);
    x[0] = _mm256_xor_si256(_mm256_xor_si256(hi1, x[1]), _mm256_set1_epi32(static_cast<int>(k0)));
    x[1] = lo1;
    x[2] = _mm256_xor_si256(_mm256_xor_si256(hi0, x[3]), _mm256_set1_epi32(static_cast<int>(k1)));
    x[3] = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

inline void philox_x8(uint32_t c0, uint32_t c1, uint32_t x2, uint32_t x3, uint32_t key0, uint32_t key1,
                      __m256i (&out)[4]) {
  out[0] = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(c0)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  out[1] = _mm256_set1_epi32(static_cast<int>(c1));
  out[2] = _mm256_set1_epi32(static_cast<int>(x2));
  out[3] = _mm256_set1_epi32(static_cast<int>(x3));
  philox_rounds_x8(out, key0, key1);
}

// Dropout on 8 columns of P^T (keys-major: a column is a query row): lane c
// draws for query row xs[c] of head bhs[c], so one block gives 4 keys' words
// as 8-lane rows of P^T, with no transpose. pt [nj, 8] (row stride ld) holds
// the keys whose Philox columns are y0..; a dropped key's P is zeroed.
inline void philox_drop_x8(const uint32_t* xs, const uint32_t* bhs, uint32_t off, uint32_t key0, uint32_t key1,
                           uint32_t threshold, int64_t y0, int64_t nj, float* pt, int64_t ld) {
  const __m256i c1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs));
  const __m256i x2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bhs));
  const __m256i x3 = _mm256_set1_epi32(static_cast<int>(off)), t = _mm256_set1_epi32(static_cast<int>(threshold));
  for (int64_t blk = y0 >> 2; blk <= (y0 + nj - 1) >> 2; ++blk) {
    __m256i w[4] = {_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(blk))), c1, x2, x3};
    philox_rounds_x8(w, key0, key1);
    for (int64_t e = 0; e < 4; ++e) {
      const int64_t j = blk * 4 + e - y0;
      if (j < 0 || j >= nj) continue;
      const __m256 keep = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_max_epu32(w[e], t), w[e]));
      float* row = pt + j * ld;
      _mm256_storeu_ps(row, _mm256_and_ps(_mm256_loadu_ps(row), keep));
    }
  }
}

// keep[e] = 1 where column e's word (block e / 4, word e % 4) >= threshold,
// else 0, for the 32 columns of philox_x8's 8 blocks, where a scalar loop
// over the words took a fifth of the row path's forward (tuning table:
// philox_x8).
inline void philox_keep_x8(const __m256i (&x)[4], uint32_t threshold, uint8_t keep[32]) {
  const __m256i t = _mm256_set1_epi32(static_cast<int>(threshold));
  __m256i c[4];
  for (int w = 0; w < 4; ++w) c[w] = _mm256_cmpeq_epi32(_mm256_max_epu32(x[w], t), x[w]);
  // Word-major to column-major within each 128-bit half: block b's four words
  // land in half b / 4 of vector b % 4.
  const __m256i a0 = _mm256_unpacklo_epi32(c[0], c[1]), a1 = _mm256_unpackhi_epi32(c[0], c[1]);
  const __m256i a2 = _mm256_unpacklo_epi32(c[2], c[3]), a3 = _mm256_unpackhi_epi32(c[2], c[3]);
  const __m256i b0 = _mm256_unpacklo_epi64(a0, a2), b1 = _mm256_unpackhi_epi64(a0, a2);
  const __m256i b2 = _mm256_unpacklo_epi64(a1, a3), b3 = _mm256_unpackhi_epi64(a1, a3);
  // The in-lane packs put columns 0-15 in the low half and 16-31 in the high.
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(b0, b1), _mm256_packs_epi32(b2, b3));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(keep), _mm256_and_si256(bytes, _mm256_set1_epi8(1)));
}
