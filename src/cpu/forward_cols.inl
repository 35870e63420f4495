// Query rows as the columns of S^T, which the keys-major paths (keys-major,
// narrow, narrow-dot, AMX-narrow) compute: what happens to those columns'
// scores (ScoreCols) and the tile those paths take (ColTile). Included by
// forward.inl, in order.

// The rows of the tile after this one: n rows from seq0 of K/V head hk (n = 0: none).
struct NextTile {
  int64_t seq0, hk, n;
  const char* held = nullptr;  // or its K/V pairs, held_bytes of them (PairTileCache)
  int64_t held_bytes = 0;
  // Where the tile is the next task's first: its batch, and its query rows
  // (q_rows rows from q_seq0 of each of q_heads query heads from q_h0).
  int64_t b = -1, q_seq0 = 0, q_h0 = 0, q_heads = 0, q_rows = 0;
};

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
  // The columns of the K/V head whose per-head rows start off on (the
  // positions and dropout's rows are the same for every head).
  ScoreCols head(int64_t off) const {
    ScoreCols r = *this;
    if (slope) r.slope += off;
    if (brow) r.brow += off;
    if (mrow) r.mrow += off;
    if (drop_bh) r.drop_bh += off;
    return r;
  }
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
    int64_t c = 0;
#if FG_PHILOX_X16
    for (; c + 16 <= cols; c += 16)
      philox_drop_x16(drop_x + c, drop_bh + c, rng->off, rng->key0, rng->key1, rng->threshold, rng->col0 + key0, nj,
                      pt + c, ld);
#endif
    for (; c < cols; c += 8)
      philox_drop_x8(drop_x + c, drop_bh + c, rng->off, rng->key0, rng->key1, rng->threshold, rng->col0 + key0, nj,
                     pt + c, ld);
#else
    static_assert(!FG_VEC_GEMM, "keys-major tiles draw dropout's bits in vectors (philox_drop_x8)");
    (void)pt, (void)nj, (void)cols, (void)ld, (void)key0;
#endif
  }
  // Asks L2 for the next tile's mask at keys [key0, key0 + nj) and its
  // first kInputRowsAhead columns' bias; add_bias asks for the others'
  // while it runs, as the row paths do (kInputRowsAhead).
  void prefetch(int64_t key0, int64_t nj) const {
    prefetch_bias(key0, nj, 0, kInputRowsAhead);
    for (int64_t c = 0; mrow && mask_cs == 1 && c < rows; ++c)
      prefetch_l2_bytes(reinterpret_cast<const char*>(mrow[c]) + key0, nj);
  }
  // Columns [c0, c1)'s bias at keys [key0, key0 + nj) into L2.
  void prefetch_bias(int64_t key0, int64_t nj, int64_t c0, int64_t c1) const {
    const int64_t es = dtype_size(bias_dtype);
    for (int64_t c = c0; brow && bias_cs == 1 && c < std::min(c1, rows); ++c)
      prefetch_l2_bytes(brow[c] + key0 * es, nj * es);
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
  // Panels of kBiasPanel columns gather their mask bytes keys-major first,
  // each mask row read in order, then select along S^T's rows, where the
  // compiler vectorises the select: column by column, each score's select
  // read and wrote a row of S^T of its own (tuning table: keys-major mask).
  void mask(Acc* st, int64_t nj, int64_t cols, int64_t ld, int64_t key0) const {
    const int64_t n = std::min(cols, rows);
    int64_t c = 0;
#if FG_MASK_BITS16
    if constexpr (std::is_same<Acc, float>::value) {
      static_assert(kLanes == 16, "a keep mask of 16 bits covers one vector");
      for (; mask_cs == 1 && c + kLanes <= n; c += kLanes) {
        int64_t j = 0;
        uint16_t keep[8];
        for (; j + 8 <= nj; j += 8) {
          mask_bits16(mrow + c, key0 + j, keep);
          for (int64_t t = 0; t < 8; ++t) {
            Acc* row = st + (j + t) * ld + c;
            vstore(row, vkeep_or_neg_inf(vload(row), keep[t]));
          }
        }
        for (; j < nj; ++j)
          for (int64_t x = 0; x < kLanes; ++x)
            st[j * ld + c + x] = keep_or_neg_inf(st[j * ld + c + x], mrow[c + x][key0 + j] != 0);
      }
    }
#endif
    uint8_t keep[kBiasPanel * kBiasKeys];
    for (; mask_cs == 1 && c + kBiasPanel <= n; c += kBiasPanel)
      for (int64_t j0 = 0; j0 < nj; j0 += kBiasKeys) {
        const int64_t w = std::min(kBiasKeys, nj - j0);
        for (int64_t x = 0; x < kBiasPanel; ++x) {
          const uint8_t* r = mrow[c + x] + key0 + j0;
          for (int64_t j = 0; j < w; ++j) keep[j * kBiasPanel + x] = r[j];
        }
        for (int64_t j = 0; j < w; ++j) {
          Acc* row = st + (j0 + j) * ld + c;
          for (int64_t x = 0; x < kBiasPanel; ++x) row[x] = keep_or_neg_inf(row[x], keep[j * kBiasPanel + x] != 0);
        }
      }
    for (; c < n; ++c) {
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
        prefetch_bias(key0, nj, c + kInputRowsAhead, std::min(n, c + kInputRowsAhead + kBiasPanel));
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

// One tile of keys as a keys-major path sees it: keys seq0.. (nj of them, j0
// counted from the sequence's first) of K/V head hk, the task's head x of
// nh, against that head's stacked query rows as the columns of S^T.
template <typename Acc>
struct ColTile {
  int64_t b, seq0, hk, nj, j0, x, nh;
  int64_t rows, cols, ld;        ///< query rows, the columns computed (rows padded), Q^T's row stride
  const Acc* qt;                 ///< Q^T [dqk_pad, ld], or its pairs [dqk_pad / 2, ld]
  Acc *m, *l, *alpha;            ///< the columns' softmax state [cols]
  Acc* o;                        ///< O [rows, dv_pad], or O^T [dv, ld] (narrow tiles)
  const Acc *lo, *hi;            ///< the columns' visible keys as floats; null: a full tile
  Acc *st, *kbuf, *vbuf, *pbuf;  ///< S^T, and the path's scratch for K, V and P
  ScoreCols<Acc> sc;
  NextTile next;

  // Columns c.. of the tile (narrow_chunks); only the first chunk asks for the next tile.
  ColTile chunk(int64_t c) const {
    ColTile r = *this;
    r.qt += c, r.m += c, r.l += c, r.alpha += c, r.o += c;
    if (lo) r.lo += c;
    if (hi) r.hi += c;
    r.sc = sc.at(c);
    if (c) r.next = NextTile{0, 0, 0};
    return r;
  }
};
