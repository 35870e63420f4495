// Decode's products over K and V rows read where they lie: S for 1 to 4
// query rows (scores_rows_whole), across heads (scores_heads, pv_heads) and
// P V (gemm_rows_whole). Included by vec.inl, in order.

#if FG_VEC_GEMM
#if FG_TRANSPOSE_REGS
// S [M, nj] = Q K^T for M = 1 to 4 rows of Q ([M, d], row stride ldq) and
// nj rows of K (f32, or bf16 / f16 converted on load) read where they lie
// (row stride ldk), d a multiple of kLanes:
// kLanes rows of K at a time, each read whole, transposed in registers, so
// no K^T tile is stored. Each score is the FMA chain over d in order that
// gemm_nn(Q, K^T) computes. Columns nj .. round_up(nj, kLanes) get
// duplicates of the last row's score. pf_end (K's rows contiguous, ldk =
// d): L2 is asked for the rows two blocks ahead, in memory order, as each
// block is read, below pf_end.
template <int M, typename TK>
inline void scores_rows_whole(int64_t nj, int64_t d, const float* q, int64_t ldq, const TK* k, int64_t ldk,
                              float* s, int64_t lds, const char* pf_end, const ScoreScale<float>& sc) {
  const int64_t pf_lines = pf_end ? ceil_div(kLanes * d * static_cast<int64_t>(sizeof(TK)), 64 * (d / kLanes)) : 0;
  for (int64_t j = 0; j < nj; j += kLanes) {
    const char* pf = reinterpret_cast<const char*>(k + (j + 2 * kLanes) * ldk);
    const TK* kr[kLanes];
    for (int64_t i = 0; i < kLanes; ++i) kr[i] = k + std::min(j + i, nj - 1) * ldk;
    VecF acc[M];
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) acc[m] = vzero();
    for (int64_t c = 0; c < d; c += kLanes) {
      VecF r[kLanes];
#pragma GCC unroll 16
      for (int i = 0; i < kLanes; ++i) r[i] = vload_as(kr[i] + c);
      for (int64_t t = 0; t < pf_lines; ++t, pf += 64)
        if (pf < pf_end) prefetch_l2(pf);
      transpose_regs(r);
#pragma GCC unroll 16
      for (int i = 0; i < kLanes; ++i)
#pragma GCC unroll 4
        for (int m = 0; m < M; ++m) acc[m] = vfma(vbroadcast(q[m * ldq + c + i]), r[i], acc[m]);
    }
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) vstore(s + m * lds + j, scale_scores(acc[m], sc));
  }
}
#endif

#if FG_TRANSPOSE_REGS
// Decode over g heads whose K and V rows lie side by side in memory (rows
// of [batch, seq, heads, dim]), each row read through, all its heads at
// once, in memory order (forward_paths.inl, heads_across).

// kLanes elements of T from src to dst, as they are, in pieces of at most
// 32 bytes: decode read K faster from DRAM when its copies were spread out
// down to half a line (tuning table: copy_lanes piece).
template <typename T>
inline void copy_lanes(T* dst, const T* src) {
  constexpr int64_t kPiece = std::min<int64_t>(kLanes, 32 / sizeof(T));
  for (int64_t x = 0; x < kLanes; x += kPiece) std::memcpy(dst + x, src + x, kPiece * sizeof(T));
}

// S for M query rows of each of G heads (G divides kLanes): lane L of a
// vector is key j + L / G of head L % G, whose row segment lies at
// k + (j + L / G) * ldk + (L % G) * d (keys past nj repeat the last).
// qx [M][d][kLanes]: row m's Q element of lane L's head. st[m * ldst + j *
// G + L] gets lane L of the vector for keys j..; each score is the FMA
// chain over d in order that gemm_nn(Q, K^T) computes. B blocks of
// kLanes / G keys at a time, B independent chains: their rows' G
// segments are first copied in memory order to stage ([B * kLanes / G, G *
// d]): the lanes' own loads stride through each row (f32: line h * d / 16
// + c of head h at step c), an order DRAM serves at about half the rate of
// memory order (tuning table: scores_heads_g stage).
// bf16 K on avx2 goes through scores_heads_g as pairs of elements: the
// kLanes segments of 2 * kLanes elements each read as 32-bit words,
// transposed, each word split into its two f32 (vpair_lo, vpair_hi),
// instead of kLanes elements of each widened on load and transposed: half
// the transposes and no widening, on the shuffle ports. The FMAs, their
// order and so the scores stay the same. Only here: scores_rows_whole and
// pv_heads gained nothing from pairs (tuning table: kPairRows).
template <typename TK>
constexpr bool kPairRows = FG_BF16_PAIRS && kLanes == 8 && std::is_same<TK, bf16_t>::value;

// How many keys ahead decode across heads asks L2 for K's and V's rows of
// type T (kHeadsAheadKeys, 16-bit types only); 0: none.
template <typename T>
constexpr int64_t kHeadsAhead = sizeof(T) == 2 ? kHeadsAheadKeys : 0;

// Row j + ahead's n elements from row, ld apart, into L2, if j + ahead < end.
template <typename T>
inline void prefetch_row_ahead(const T* row, int64_t ld, int64_t n, int64_t j, int64_t ahead, int64_t end) {
  if (ahead == 0 || j + ahead >= end) return;
  const char* p = reinterpret_cast<const char*>(row + ahead * ld);
  for (int64_t x = 0; x < n * static_cast<int64_t>(sizeof(T)); x += 64) prefetch_l2(p + x);
}

template <int M, int G, int B, typename TK>
inline void scores_heads_g(int64_t nj, int64_t d, const float* qx, const TK* k, int64_t ldk, float* st,
                           int64_t ldst, TK* stage) {
  constexpr int64_t kpv = kLanes / G;
  const int64_t run = G * d;
  for (int64_t j = 0; j < nj; j += B * kpv) {
    const TK* kb[B][kpv];
    for (int64_t y = 0; y < B * kpv; ++y) {
      const TK* src = k + std::min(j + y, nj - 1) * ldk;
      TK* dst = stage + y * run;
      prefetch_row_ahead(src, ldk, run, j + y, kHeadsAhead<TK>, nj);
      for (int64_t x = 0; x < run; x += kLanes) copy_lanes(dst + x, src + x);
    }
#pragma GCC unroll 4
    for (int u = 0; u < B; ++u)
#pragma GCC unroll 16
      for (int64_t y = 0; y < kpv; ++y) kb[u][y] = stage + (u * kpv + y) * run;
    VecF acc[B][M];
#pragma GCC unroll 4
    for (int u = 0; u < B; ++u)
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) acc[u][m] = vzero();
    int64_t c = 0;
    if constexpr (kPairRows<TK>) {
      for (; c + 2 * kLanes <= d; c += 2 * kLanes) {
#pragma GCC unroll 4
        for (int u = 0; u < B; ++u) {
          VecF r[kLanes];
#pragma GCC unroll 16
          for (int x = 0; x < kLanes; ++x) r[x] = vload_words(kb[u][x / G] + x % G * d + c);
          transpose_regs(r);
#pragma GCC unroll 16
          for (int i = 0; i < kLanes; ++i) {
            const VecF lo = vpair_lo(r[i]), hi = vpair_hi(r[i]);
#pragma GCC unroll 4
            for (int m = 0; m < M; ++m)
              acc[u][m] = vfma(vload(qx + ((m * d) + c + 2 * i + 1) * kLanes), hi,
                               vfma(vload(qx + ((m * d) + c + 2 * i) * kLanes), lo, acc[u][m]));
          }
        }
      }
    }
    for (; c < d; c += kLanes) {
#pragma GCC unroll 4
      for (int u = 0; u < B; ++u) {
        VecF r[kLanes];
#pragma GCC unroll 16
        for (int x = 0; x < kLanes; ++x) r[x] = vload_as(kb[u][x / G] + x % G * d + c);
        transpose_regs(r);
#pragma GCC unroll 16
        for (int i = 0; i < kLanes; ++i)
#pragma GCC unroll 4
          for (int m = 0; m < M; ++m) acc[u][m] = vfma(vload(qx + ((m * d) + c + i) * kLanes), r[i], acc[u][m]);
      }
    }
#pragma GCC unroll 4
    for (int u = 0; u < B; ++u)
#pragma GCC unroll 4
      for (int m = 0; m < M; ++m) vstore(st + m * ldst + (j + u * kpv) * G, acc[u][m]);
  }
}
// scores_heads' blocks per pass: st holds round_up(nj, kHeadsBlocks * kLanes / g) * g lanes per row
// (tuning table: kHeadsBlocks).
constexpr int kHeadsBlocks = 2;
template <int M, typename TK>
inline void scores_heads(int64_t nj, int64_t g, int64_t d, const float* qx, const TK* k, int64_t ldk, float* st,
                         int64_t ldst, TK* stage) {
  constexpr int B = kHeadsBlocks;
  switch (g) {
    case 2: return scores_heads_g<M, 2, B>(nj, d, qx, k, ldk, st, ldst, stage);
    case 4: return scores_heads_g<M, 4, B>(nj, d, qx, k, ldk, st, ldst, stage);
    case 8: return scores_heads_g<M, 8, B>(nj, d, qx, k, ldk, st, ldst, stage);
    default:
      FG_DASSERT(g == 16 && kLanes == 16);
      if constexpr (kLanes == 16) return scores_heads_g<M, 16, B>(nj, d, qx, k, ldk, st, ldst, stage);
  }
}

// For each of g heads h and M rows r: C_hr [n] = C_hr * rs[h * rs_hs + r] +
// P_hr V_h (rs null: C_hr + P_hr V_h) over k keys, with P_hr at p + h *
// p_hs + r * ldp, C_hr at c + h * c_hs + r * ldc, and V_h's row j at b + j *
// ldb + h * n. V's rows are read in memory order, each through all its
// heads before the next, in place (tuning table: pv_heads order). Every C
// element gets the same FMAs in the same order as from gemm_rows_whole.
// acc: [g * M * n] scratch.
template <int M, int Xv, typename TB>
inline void pv_heads_block(int64_t x, const float* ph, int64_t ldp, const TB* bh, float* ah, int64_t n) {
  VecF pb[M];
#pragma GCC unroll 4
  for (int r = 0; r < M; ++r) pb[r] = vbroadcast(ph[r * ldp]);
#pragma GCC unroll 8
  for (int v = 0; v < Xv; ++v) {
    const VecF bv = vload_as(bh + x + v * kLanes);
#pragma GCC unroll 4
    for (int r = 0; r < M; ++r) vstore(ah + r * n + x + v * kLanes, vfma(pb[r], bv, vload(ah + r * n + x + v * kLanes)));
  }
}
template <int M, typename TB>
inline void pv_heads(int64_t g, int64_t n, int64_t k, const float* p, int64_t p_hs, int64_t ldp, const TB* b,
                     int64_t ldb, float* acc, float* c, int64_t c_hs, int64_t ldc, const float* rs, int64_t rs_hs) {
  constexpr int Xv = 8;
  for (int64_t x = 0; x < g * M * n; x += kLanes) vstore(acc + x, vzero());
  for (int64_t j = 0; j < k; ++j)
    for (int64_t h = 0; h < g; ++h) {
      const float* ph = p + h * p_hs + j;
      const TB* bh = b + j * ldb + h * n;
      prefetch_row_ahead(bh, ldb, n, j, kHeadsAhead<TB>, k);
      float* ah = acc + h * M * n;
      int64_t x = 0;
      for (; x + Xv * kLanes <= n; x += Xv * kLanes) pv_heads_block<M, Xv>(x, ph, ldp, bh, ah, n);
      for (; x < n; x += kLanes) pv_heads_block<M, 1>(x, ph, ldp, bh, ah, n);
    }
  for (int64_t h = 0; h < g; ++h)
    for (int r = 0; r < M; ++r) {
      float* cr = c + h * c_hs + r * ldc;
      const float* ar = acc + (h * M + r) * n;
      const VecF sc = rs ? vbroadcast(rs[h * rs_hs + r]) : vzero();
      for (int64_t x = 0; x < n; x += kLanes) {
        const VecF sum = vload(ar + x);
        vstore(cr + x, rs ? vfma(vload(cr + x), sc, sum) : vadd(vload(cr + x), sum));
      }
    }
}
#endif

// C [M, n] = C * rs[r] + A B (rs null: C + A B) for M = 1 to 4 rows of A
// (along k) and B's rows read where they lie: G rows of B at a time, each
// read whole, their sums kept in acc ([M, n]) between groups. Every C
// element gets the same FMAs in the same order as from gemm_f32's add_rows,
// whose passes over n read one vector block of every B row in turn.
// pf_end: as in scores_rows_whole, B's rows contiguous (ldb = n).
template <int M, typename TB>
inline void gemm_rows_whole(int64_t n, int64_t k, const float* a, int64_t a_rs, const TB* b, int64_t ldb,
                            float* acc, float* c, int64_t ldc, const float* rs, const char* pf_end = nullptr) {
  constexpr int G = M == 1 ? 8 : M == 2 ? 4 : 2;
  const int64_t pf_lines = pf_end ? ceil_div(G * n * static_cast<int64_t>(sizeof(TB)), 64 * (n / kLanes)) : 0;
  for (int64_t x = 0; x < M * n; x += kLanes) vstore(acc + x, vzero());
  const auto group = [&](int64_t j, auto gs) {
    constexpr int Gs = decltype(gs)::value;
    const char* pf = reinterpret_cast<const char*>(b + (j + 2 * G) * ldb);
    VecF pb[M][Gs];
#pragma GCC unroll 8
    for (int r = 0; r < M; ++r)
#pragma GCC unroll 8
      for (int g = 0; g < Gs; ++g) pb[r][g] = vbroadcast(a[r * a_rs + j + g]);
    for (int64_t x = 0; x < n; x += kLanes) {
      VecF sum[M];
#pragma GCC unroll 4
      for (int r = 0; r < M; ++r) sum[r] = vload(acc + r * n + x);
#pragma GCC unroll 8
      for (int g = 0; g < Gs; ++g) {
        const VecF bv = vload_as(b + (j + g) * ldb + x);
#pragma GCC unroll 4
        for (int r = 0; r < M; ++r) sum[r] = vfma(pb[r][g], bv, sum[r]);
      }
#pragma GCC unroll 4
      for (int r = 0; r < M; ++r) vstore(acc + r * n + x, sum[r]);
      for (int64_t t = 0; t < pf_lines; ++t, pf += 64)
        if (pf < pf_end) prefetch_l2(pf);
    }
  };
  int64_t j = 0;
  for (; j + G <= k; j += G) group(j, std::integral_constant<int, G>{});
  for (; j < k; ++j) group(j, std::integral_constant<int, 1>{});
  for (int r = 0; r < M; ++r) {
    float* cr = c + r * ldc;
    const VecF sc = rs ? vbroadcast(rs[r]) : vzero();
    for (int64_t x = 0; x < n; x += kLanes) {
      const VecF sum = vload(acc + r * n + x);
      vstore(cr + x, rs ? vfma(vload(cr + x), sc, sum) : vadd(vload(cr + x), sum));
    }
  }
}
#endif
