// The tile product, C = A B, generic and on the ISA's vector layer (f32,
// bf16 pairs), with its epilogues, and the prefetch helpers. Included by
// vec.inl, in order.

// One multiply-add of the generic tile product below. The kernels are built
// unfused (-ffp-contract=off, CMakeLists.txt), so the portable path's f32
// products fuse only where the target's FMA is as fast as a multiply
// (__FP_FAST_FMAF: Arm, but not baseline x86-64): GCC 12 then emits one
// fmla per 4 lanes on aarch64 instead of fmul and fadd.
inline float gemm_madd(float a, float b, float c) {
#if !FG_VEC_GEMM && defined(__FP_FAST_FMAF)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}
inline double gemm_madd(double a, double b, double c) { return a * b + c; }

// softmax_scale * s for a raw score s = q . k, rounded once, as the
// reference rounds its f64 scale's product: a scale rounded to f32 first
// moved every score of a row alike by up to 2^-24, and scaling q before the
// product rounded each q element, so that scores no longer followed any of
// the reference's summation orders (docs/design.md, "Scores"). For f32,
// scale = hi + lo with hi the f32 scale rounded toward zero, so lo shares
// hi's sign (an infinite s stays infinite); lo's own rounding, 2^-47 of the
// scale, can move a result only at a tie that close.
template <typename Acc>
struct ScoreScale {
  Acc hi = 1, lo = 0;
  ScoreScale() = default;
  explicit ScoreScale(double scale) {
    if (std::is_same<Acc, double>::value) {
      hi = static_cast<Acc>(scale);
      return;
    }
    float h = static_cast<float>(scale);
    if (std::fabs(static_cast<double>(h)) > std::fabs(scale)) h = std::nextafter(h, 0.0f);
    hi = static_cast<Acc>(h);
    lo = static_cast<Acc>(static_cast<float>(scale - static_cast<double>(h)));
  }
  Acc operator()(Acc s) const { return lo == 0 ? s * hi : std::fma(s, hi, s * lo); }
};

// The tile product, the one seam for faster micro-kernels:
//   C[m, 0..n) = A[m, k] * B[k, 0..n)
// A's element (r, p) is a[r * a_rs + p * a_cs], so A may be a transposed view
// (its elements are only ever broadcast); B and C are row-major; n is a
// multiple of kPad (tiles are padded). This generic form serves f64 and the scalar path; the f32
// overload below uses the ISA's vector layer when there is one.
template <typename Acc, int Mr, int Nr>
inline void gemm_block(int64_t k, const Acc* a, int64_t a_rs, int64_t a_cs, const Acc* b, int64_t ldb,
                       Acc* c, int64_t ldc, const ScoreScale<Acc>& sc = {}) {
  Acc acc[Mr][Nr] = {};
  for (int64_t p = 0; p < k; ++p) {
    const Acc* brow = b + p * ldb;
    for (int r = 0; r < Mr; ++r) {
      const Acc av = a[r * a_rs + p * a_cs];
      for (int j = 0; j < Nr; ++j) acc[r][j] = gemm_madd(av, brow[j], acc[r][j]);
    }
  }
  for (int r = 0; r < Mr; ++r)
    for (int j = 0; j < Nr; ++j) c[r * ldc + j] = sc(acc[r][j]);
}

// sc: the scores' scale, applied to each sum as it is stored (none by default).
template <typename Acc>
inline void gemm_nn(int64_t m, int64_t n, int64_t k, const Acc* a, int64_t a_rs, int64_t a_cs,
                    const Acc* b, int64_t ldb, Acc* c, int64_t ldc, const ScoreScale<Acc>& sc = {}) {
  constexpr int Nr = 8, Mr = 4;
  FG_DASSERT(n % Nr == 0);
  int64_t i = 0;
  for (; i + Mr <= m; i += Mr)
    for (int64_t j = 0; j < n; j += Nr)
      gemm_block<Acc, Mr, Nr>(k, a + i * a_rs, a_rs, a_cs, b + j, ldb, c + i * ldc + j, ldc, sc);
  for (; i < m; ++i)
    for (int64_t j = 0; j < n; j += Nr)
      gemm_block<Acc, 1, Nr>(k, a + i * a_rs, a_rs, a_cs, b + j, ldb, c + i * ldc + j, ldc, sc);
}

// Asks for one cache line in L2. Inline asm on x86 because GCC 12 deletes a
// loop whose body is only __builtin_prefetch (to it the loop does nothing);
// elsewhere the builtin, which that may drop at no cost to correctness.
inline void prefetch_l2(const char* p) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm volatile("prefetcht1 %0" : : "m"(*p));
#elif defined(__GNUC__)
  __builtin_prefetch(p, 0, 2);
#else
  (void)p;
#endif
}

// Asks for one cache line in L1 (and L2). On Zen 4, rows of a task that
// follows were asked for in vain with prefetcht1 (tuning table: next
// task's rows).
inline void prefetch_l1(const char* p) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm volatile("prefetcht0 %0" : : "m"(*p));
#elif defined(__GNUC__)
  __builtin_prefetch(p, 0, 3);
#else
  (void)p;
#endif
}

// Asks L2 for every cache line of [p, p + bytes).
inline void prefetch_l2_bytes(const char* p, int64_t bytes) {
  const uintptr_t end = reinterpret_cast<uintptr_t>(p + bytes);
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) / 64 * 64; a < end; a += 64)
    prefetch_l2(reinterpret_cast<const char*>(a));
}

// Asks L1 for every cache line of [p, p + bytes).
inline void prefetch_l1_bytes(const char* p, int64_t bytes) {
  const uintptr_t end = reinterpret_cast<uintptr_t>(p + bytes);
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) / 64 * 64; a < end; a += 64)
    prefetch_l1(reinterpret_cast<const char*>(a));
}

// Asks for one cache line to write (prefetchw: a no-op on x86 CPUs that
// lack it, which predate Broadwell).
inline void prefetch_w(const char* p) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm volatile("prefetchw %0" : : "m"(*p));
#elif defined(__GNUC__)
  __builtin_prefetch(p, 1, 3);
#else
  (void)p;
#endif
}

// Hides p's value from the optimizer, which would otherwise fold pointers
// bumped in a loop back into one base plus the loop's index.
inline void opaque(const float*& p) {
#if defined(__GNUC__)
  asm("" : "+r"(p));
#else
  (void)p;
#endif
}

#if FG_VEC_GEMM
// Mr rows x Nv vectors of columns, all accumulators in registers: per step of
// k, Nv loads of B and Mr broadcasts of A feed Mr * Nv FMAs. (The unroll
// pragmas keep GCC from also giving the accumulator arrays a stack copy,
// which it zeroed and stored on every call: 4% of the forward.) Epilogues
// other than store add the block's sums to C only at the end, as
// C * rs[r] + sum (add_rows; rs null: C + sum) or C * rs[col] + sum
// (add_cols): the blocked summation of scale_add without its pass over a copy.
// store_colmax stores C and raises rs[col] (read and written) to the
// largest value of its column in the block, with vmax's NaN rule.
// With Pf, each step of k also asks L2 for the line pf bytes past one of
// the A elements it reads: A's elements for the step (a_cs != 1), or, when
// A's rows run along k (a_cs == 1), a line of row p mod Mr (f32 A and
// Nv <= 2: of row p mod 16, in the first Mr steps of every 16), so that
// every line of A's rows is asked for once or twice (pf: an A operand read
// in place, a few rows ahead). A is f32, or bf16 read in place where the ISA
// broadcasts bf16 pairs (accumulate_bf16_pairs).
enum class Epi { store, add_rows, add_cols, store_colmax };

// ScoreScale on kLanes scores: the same operations as its scalar form.
inline VecF scale_scores(VecF x, const ScoreScale<float>& sc) {
  return sc.lo == 0 ? vmul(x, vbroadcast(sc.hi)) : vfma(x, vbroadcast(sc.hi), vmul(x, vbroadcast(sc.lo)));
}

#if FG_BF16_PAIRS
// bf16 A read where it lies: two of its elements adjacent in memory are
// broadcast as one 32-bit word and split into two f32 (vpair_lo: the
// lower-indexed element, vpair_hi), one load for two broadcasts; along k
// when A's rows run along it (a_cs == 1), else across rows r and r + 1
// (A1). Each C element gets the same FMAs in the same order as from f32 A
// holding the same values.
template <int Mr, int Nv, bool Pf, bool A1, typename TB>
inline void accumulate_bf16_pairs(VecF (&acc)[Mr][Nv], int64_t k, const bf16_t* a, int64_t a_rs, int64_t a_cs,
                                  const TB* b, int64_t ldb, int64_t pf) {
  if constexpr (A1) {
    for (int64_t p = 0; p < k; ++p) {
      if constexpr (Pf) prefetch_l2(reinterpret_cast<const char*>(a + p * a_cs) + pf);
      VecF bv[Nv];
#pragma GCC unroll 4
      for (int j = 0; j < Nv; ++j) bv[j] = vload_as(b + p * ldb + j * kLanes);
#pragma GCC unroll 8
      for (int r = 0; r + 1 < Mr; r += 2) {
        const VecF w = vbroadcast_pair(a + r + p * a_cs), lo = vpair_lo(w), hi = vpair_hi(w);
#pragma GCC unroll 4
        for (int j = 0; j < Nv; ++j) {
          acc[r][j] = vfma(lo, bv[j], acc[r][j]);
          acc[r + 1][j] = vfma(hi, bv[j], acc[r + 1][j]);
        }
      }
      if constexpr (Mr % 2 == 1) {
        const VecF av = vbroadcast_as(a + (Mr - 1) + p * a_cs);
#pragma GCC unroll 4
        for (int j = 0; j < Nv; ++j) acc[Mr - 1][j] = vfma(av, bv[j], acc[Mr - 1][j]);
      }
    }
    return;
  }
  FG_DASSERT(a_cs == 1);
  (void)a_cs;
  int64_t p = 0;
  int r_pf = 0;  // the row whose line this step asks for, in turn
  for (; p + 2 <= k; p += 2) {
    if constexpr (Pf) {
      prefetch_l2(reinterpret_cast<const char*>(a + r_pf * a_rs + p) + pf);
      if (++r_pf == Mr) r_pf = 0;
    }
    VecF b0[Nv], b1[Nv];
#pragma GCC unroll 4
    for (int j = 0; j < Nv; ++j) {
      b0[j] = vload_as(b + p * ldb + j * kLanes);
      b1[j] = vload_as(b + (p + 1) * ldb + j * kLanes);
    }
#pragma GCC unroll 16
    for (int r = 0; r < Mr; ++r) {
      const VecF w = vbroadcast_pair(a + r * a_rs + p), lo = vpair_lo(w), hi = vpair_hi(w);
#pragma GCC unroll 4
      for (int j = 0; j < Nv; ++j) acc[r][j] = vfma(hi, b1[j], vfma(lo, b0[j], acc[r][j]));
    }
  }
  if (p < k) {
    VecF bv[Nv];
#pragma GCC unroll 4
    for (int j = 0; j < Nv; ++j) bv[j] = vload_as(b + p * ldb + j * kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < Mr; ++r) {
      const VecF av = vbroadcast_as(a + r * a_rs + p);
#pragma GCC unroll 4
      for (int j = 0; j < Nv; ++j) acc[r][j] = vfma(av, bv[j], acc[r][j]);
    }
  }
}
#endif

template <int Mr, int Nv, Epi E, bool Pf, bool A1, typename TA, typename TB>
inline void gemm_f32_block(int64_t k, const TA* a, int64_t a_rs_, int64_t a_cs, const TB* b,
                           int64_t ldb, float* c, int64_t ldc, const float* rs, int64_t pf,
                           const ScoreScale<float>& sc) {
  const int64_t a_rs = A1 ? 1 : a_rs_;
  VecF acc[Mr][Nv];
#pragma GCC unroll 16
  for (int r = 0; r < Mr; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < Nv; ++j) acc[r][j] = vzero();
  int64_t p = 0;
#if FG_BF16_PAIRS
  if constexpr (std::is_same<TA, bf16_t>::value) {
    accumulate_bf16_pairs<Mr, Nv, Pf, A1>(acc, k, a, a_rs, a_cs, b, ldb, pf);
    p = k;
  }
#endif
  if constexpr (Nv == 1 && !Pf && !A1 && std::is_same<TA, float>::value) {
    if (a_cs == 1) {
      // Mr rows along k under one vector (the narrow tiles' S^T without a
      // prefetch): each FMA's broadcast is an offset from its row's
      // pointer, bumped every 4 steps, instead of the row's base plus the
      // step as an index, which unlaminates the FMA into two uops (tuning
      // table: gemm_f32_block row pointers).
      const float* ar[Mr];
#pragma GCC unroll 16
      for (int r = 0; r < Mr; ++r) ar[r] = a + r * a_rs;
      for (; p + 4 <= k; p += 4) {
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) {
          const VecF bv = vload_as(b + (p + u) * ldb);
#pragma GCC unroll 16
          for (int r = 0; r < Mr; ++r) acc[r][0] = vfma(vbroadcast(ar[r][u]), bv, acc[r][0]);
        }
#pragma GCC unroll 16
        for (int r = 0; r < Mr; ++r) {
          ar[r] += 4;
          opaque(ar[r]);
        }
      }
    }
  }
  if constexpr (Pf && Nv <= 2 && !A1 && std::is_same<TA, float>::value) {
    if (a_cs == 1) {
      // Rows along k with a prefetch (the narrow tiles' S^T on K read in
      // place): a line of each row per 16 steps, on a fixed step, and the
      // rows' pointers bumped per line. Counting the prefetch's row in
      // every step took 10 scalar uops beside its 12 FMAs (at Mr = 6),
      // and spilled a row pointer. At Nv = 3 (Mr = 4, 16 live vectors on
      // AVX2) the unrolled steps spilled a vector instead, so that keeps the
      // counted form (tuning table: gemm_f32_block prefetch).
      static_assert(Mr <= 16, "one prefetch per row and line of 16 steps");
      constexpr int64_t kLine = 64 / sizeof(float);
      const float* ar[Mr];
#pragma GCC unroll 16
      for (int r = 0; r < Mr; ++r) ar[r] = a + r * a_rs;
      for (; p + kLine <= k; p += kLine) {
        const TB* bp = b + p * ldb;
#pragma GCC unroll 16
        for (int u = 0; u < kLine; ++u, bp += ldb) {
          if (u < Mr) prefetch_l2(reinterpret_cast<const char*>(ar[u]) + pf);
          VecF bv[Nv];
#pragma GCC unroll 4
          for (int j = 0; j < Nv; ++j) bv[j] = vload_as(bp + j * kLanes);
#pragma GCC unroll 16
          for (int r = 0; r < Mr; ++r) {
            const VecF av = vbroadcast(ar[r][u]);
#pragma GCC unroll 4
            for (int j = 0; j < Nv; ++j) acc[r][j] = vfma(av, bv[j], acc[r][j]);
          }
        }
#pragma GCC unroll 16
        for (int r = 0; r < Mr; ++r) {
          ar[r] += kLine;
          opaque(ar[r]);
        }
      }
    }
  }
  const auto step = [&](int64_t p) {
    VecF bv[Nv];
#pragma GCC unroll 4
    for (int j = 0; j < Nv; ++j) bv[j] = vload_as(b + p * ldb + j * kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < Mr; ++r) {
      const VecF av = vbroadcast_as(a + r * a_rs + p * a_cs);
#pragma GCC unroll 4
      for (int j = 0; j < Nv; ++j) acc[r][j] = vfma(av, bv[j], acc[r][j]);
    }
  };
  // The prefetch's row is counted and its line's address bumped, instead of
  // p % Mr and a test of a_cs in every step: those took 7 scalar uops beside
  // the step's 12 FMAs (tuning table: gemm_f32_block prefetch).
  if constexpr (Pf) {
    if (a_cs == 1) {
      int64_t r = p % Mr;
      for (; p < k; ++p) {
        prefetch_l2(reinterpret_cast<const char*>(a + r * a_rs + (p - r)) + pf);
        if (++r == Mr) r = 0;
        step(p);
      }
    } else {
      const char* line = reinterpret_cast<const char*>(a + p * a_cs) + pf;
      for (; p < k; ++p, line += a_cs * static_cast<int64_t>(sizeof(TA))) {
        prefetch_l2(line);
        step(p);
      }
    }
  }
  for (; p < k; ++p) step(p);
  if constexpr (E == Epi::store || E == Epi::store_colmax) {
    if (sc.lo != 0 || sc.hi != 1)
#pragma GCC unroll 16
      for (int r = 0; r < Mr; ++r)
#pragma GCC unroll 4
        for (int j = 0; j < Nv; ++j) acc[r][j] = scale_scores(acc[r][j], sc);
  }
  if constexpr (E == Epi::store_colmax) {
    float* cm = const_cast<float*>(rs);
#pragma GCC unroll 4
    for (int j = 0; j < Nv; ++j) {
      VecF mj = vload(cm + j * kLanes);
#pragma GCC unroll 16
      for (int r = 0; r < Mr; ++r) mj = vmax(mj, acc[r][j]);
      vstore(cm + j * kLanes, mj);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < Mr; ++r) {
    float* cr = c + r * ldc;
    if constexpr (E == Epi::add_cols) {
#pragma GCC unroll 4
      for (int j = 0; j < Nv; ++j) acc[r][j] = vfma(vload(cr + j * kLanes), vload(rs + j * kLanes), acc[r][j]);
    } else if constexpr (E == Epi::add_rows) {
      if (rs) {
        const VecF sc = vbroadcast(rs[r]);
#pragma GCC unroll 4
        for (int j = 0; j < Nv; ++j) acc[r][j] = vfma(vload(cr + j * kLanes), sc, acc[r][j]);
      } else {
#pragma GCC unroll 4
        for (int j = 0; j < Nv; ++j) acc[r][j] = vadd(vload(cr + j * kLanes), acc[r][j]);
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < Nv; ++j) vstore(cr + j * kLanes, acc[r][j]);
  }
}

// Mr rows: blocks Nv vectors wide, then 2-vector blocks for the rest of n.
template <int Mr, int Nv, Epi E, bool Pf, bool A1, typename TA, typename TB>
inline void gemm_f32_rows(int64_t n, int64_t k, const TA* a, int64_t a_rs, int64_t a_cs,
                          const TB* b, int64_t ldb, float* c, int64_t ldc, const float* rs, int64_t pf,
                          const ScoreScale<float>& sc) {
  // add_cols and store_colmax: rs has one entry per column
  const int64_t col_step = E == Epi::add_cols || E == Epi::store_colmax ? 1 : 0;
  int64_t j = 0;
  for (; j + Nv * kLanes <= n; j += Nv * kLanes)
    gemm_f32_block<Mr, Nv, E, Pf, A1>(k, a, a_rs, a_cs, b + j, ldb, c + j, ldc, rs + j * col_step, pf, sc);
  if constexpr (Nv > 2)
    for (; j < n; j += 2 * kLanes)
      gemm_f32_block<Mr, 2, E, Pf, A1>(k, a, a_rs, a_cs, b + j, ldb, c + j, ldc, rs + j * col_step, pf, sc);
}

// The last rows (m mod Mr) in one block of their own height.
template <int R, int Nv, Epi E, bool Pf, bool A1, typename TA, typename TB>
inline void gemm_f32_rest(int64_t rest, int64_t n, int64_t k, const TA* a, int64_t a_rs, int64_t a_cs,
                          const TB* b, int64_t ldb, float* c, int64_t ldc, const float* rs, int64_t pf,
                          const ScoreScale<float>& sc) {
  if constexpr (R > 0) {
    if (rest == R) return gemm_f32_rows<R, Nv, E, Pf, A1>(n, k, a, a_rs, a_cs, b, ldb, c, ldc, rs, pf, sc);
    gemm_f32_rest<R - 1, Nv, E, Pf, A1>(rest, n, k, a, a_rs, a_cs, b, ldb, c, ldc, rs, pf, sc);
  }
}

template <int Mr, int Nv, Epi E, bool Pf, bool A1, typename TA, typename TB>
inline void gemm_f32_m(int64_t m, int64_t n, int64_t k, const TA* a, int64_t a_rs, int64_t a_cs,
                       const TB* b, int64_t ldb, float* c, int64_t ldc, const float* rs, int64_t pf,
                       const ScoreScale<float>& sc) {
  const int64_t rs_step = E == Epi::add_rows ? 1 : 0;  // add_cols: the same columns in every row block
  int64_t i = 0;
  for (; i + Mr <= m; i += Mr)
    gemm_f32_rows<Mr, Nv, E, Pf, A1>(n, k, a + i * a_rs, a_rs, a_cs, b, ldb, c + i * ldc, ldc,
                                     rs ? rs + i * rs_step : rs, pf, sc);
  gemm_f32_rest<Mr - 1, Nv, E, Pf, A1>(m - i, n, k, a + i * a_rs, a_rs, a_cs, b, ldb, c + i * ldc, ldc,
                                       rs ? rs + i * rs_step : rs, pf, sc);
}

// gemm_nn (or, with an adding epilogue, gemm_nn_acc) with Mr x Nv register
// blocks; n a multiple of 2 * kLanes, or of kLanes when Nv is 1. B may hold
// f32, bf16 or f16 (converted exactly as it is loaded). A with unit row
// stride (A^T read in place: V^T, P^T, dS^T) gets blocks of its own, whose
// broadcasts of a column's Mr elements are offsets from one pointer: with
// a_rs known only at run time, GCC kept Mr row offsets, and at Mr = 16 it
// spilled them, reloading one before each FMA.
template <int Mr, int Nv, Epi E = Epi::store, bool Pf = false, typename TA, typename TB>
inline void gemm_f32(int64_t m, int64_t n, int64_t k, const TA* a, int64_t a_rs, int64_t a_cs,
                     const TB* b, int64_t ldb, float* c, int64_t ldc, const float* rs = nullptr, int64_t pf = 0,
                     const ScoreScale<float>& sc = {}) {
  FG_DASSERT(n % ((Nv == 1 ? 1 : 2) * kLanes) == 0);
  if (a_rs == 1) return gemm_f32_m<Mr, Nv, E, Pf, true>(m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, rs, pf, sc);
  gemm_f32_m<Mr, Nv, E, Pf, false>(m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, rs, pf, sc);
}

inline void gemm_nn(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
                    const float* b, int64_t ldb, float* c, int64_t ldc, const ScoreScale<float>& sc = {}) {
  gemm_f32<kGemmMr, kGemmVecs>(m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, nullptr, 0, sc);
}
#endif  // FG_VEC_GEMM, which vec_rows.inl opens again
