// Dropout's random keep decisions: Philox4x32-10 (Salmon et al., SC'11), a
// counter-based generator, so any (b, h, i, j) can be regenerated on its own.
// It draws at (x, y) = (rng_row0 + i, rng_col0 + j), so a block of a longer
// attention (chunked or ring) gets the bits the whole would.
//   key     = (seed_lo, seed_hi ^ offset_hi)
//   counter = (floor(y / 4), x, b * heads_q + h, offset_lo), lane y mod 4
// P[i, j] is kept when the lane's 32-bit value is >= p * 2^32.

struct Philox {
  uint32_t key0, key1;
  uint32_t bh, off;
  int64_t row0, col0;
  uint32_t threshold;
  bool active;

  static Philox make(const AttnParams& p, int64_t b, int64_t h) {
    Philox r;
    r.key0 = static_cast<uint32_t>(p.seed);
    r.key1 = static_cast<uint32_t>(p.seed >> 32) ^ static_cast<uint32_t>(p.offset >> 32);
    r.bh = static_cast<uint32_t>(b * p.heads_q + h);
    r.off = static_cast<uint32_t>(p.offset);
    r.row0 = p.rng_row0();
    r.col0 = p.rng_col0();
    const double t = p.dropout_p * 4294967296.0;
    r.threshold = t >= 4294967295.0 ? 0xffffffffu : static_cast<uint32_t>(t);
    r.active = p.dropout_p > 0.0;
    return r;
  }

  void block(uint32_t c0, uint32_t c1, uint32_t out[4]) const {
    uint32_t x0 = c0, x1 = c1, x2 = bh, x3 = off, k0 = key0, k1 = key1;
    for (int round = 0; round < 10; ++round) {
      const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * x0;
      const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * x2;
      const uint32_t y0 = static_cast<uint32_t>(p1 >> 32) ^ x1 ^ k0;
      const uint32_t y1 = static_cast<uint32_t>(p1);
      const uint32_t y2 = static_cast<uint32_t>(p0 >> 32) ^ x3 ^ k1;
      const uint32_t y3 = static_cast<uint32_t>(p0);
      x0 = y0; x1 = y1; x2 = y2; x3 = y3;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    out[0] = x0; out[1] = x1; out[2] = x2; out[3] = x3;
  }

  // keep[jj] for columns j0 + jj, jj < n, of row i.
  void keep_row(int64_t i, int64_t j0, int64_t n, uint8_t* keep) const {
    uint32_t lanes[4];
    int64_t jj = 0;
    const uint32_t x = static_cast<uint32_t>(row0 + i);
#if FG_PHILOX_X16
    // 16 blocks (64 columns) at a time.
    while (n - jj > 32) {
      const int64_t y = col0 + j0 + jj;
      const int64_t e = y & 3, m = std::min<int64_t>(64 - e, n - jj);
      if (e == 0 && m == 64) {
        philox_keep_x16(static_cast<uint32_t>(y >> 2), x, bh, off, key0, key1, threshold, keep + jj);
      } else {
        uint8_t k[64];
        philox_keep_x16(static_cast<uint32_t>(y >> 2), x, bh, off, key0, key1, threshold, k);
        std::memcpy(keep + jj, k + e, static_cast<size_t>(m));
      }
      jj += m;
    }
#endif
#if FG_PHILOX_X8
    // 8 blocks (32 columns) at a time; their words interleave as the columns.
    for (__m256i w[4]; n - jj > 8;) {
      const int64_t y = col0 + j0 + jj;
      philox_x8(static_cast<uint32_t>(y >> 2), x, bh, off, key0, key1, w);
      const int64_t e = y & 3, m = std::min<int64_t>(32 - e, n - jj);
      if (e == 0 && m == 32) {
        philox_keep_x8(w, threshold, keep + jj);
      } else {
        uint8_t k[32];
        philox_keep_x8(w, threshold, k);
        std::memcpy(keep + jj, k + e, static_cast<size_t>(m));
      }
      jj += m;
    }
#endif
    while (jj < n) {
      const int64_t y = col0 + j0 + jj;
      block(static_cast<uint32_t>(y >> 2), x, lanes);
      for (int64_t lane = y & 3; lane < 4 && jj < n; ++lane, ++jj)
        keep[jj] = lanes[lane] >= threshold ? 1 : 0;
    }
  }
};
