// Storage conversion, exp and the tile product. Included inside a per-ISA
// namespace by kernels_<isa>.cpp, so every function here is compiled for that
// ISA and has no linkage to the other ISAs' copies.

struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

inline float to_float(float x) { return x; }
inline double to_float(double x) { return x; }
inline float to_float(bf16_t x) {
  uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float to_float(f16_t x) {
#if FG_HAVE_FLOAT16 && !FG_PORTABLE_HALF
  _Float16 h;
  std::memcpy(&h, &x.bits, 2);
  return static_cast<float>(h);
#else
  const uint32_t sign = static_cast<uint32_t>(x.bits & 0x8000u) << 16;
  uint32_t exp = (x.bits >> 10) & 0x1fu, man = x.bits & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400u));
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else {
    u = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

template <typename T> T from_acc(double x);
template <> inline float from_acc<float>(double x) { return static_cast<float>(x); }
template <> inline double from_acc<double>(double x) { return x; }
inline bf16_t bf16_from(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}
inline f16_t f16_from(float f) {
#if FG_HAVE_FLOAT16 && !FG_PORTABLE_HALF
  _Float16 h = static_cast<_Float16>(f);
  f16_t out;
  std::memcpy(&out.bits, &h, 2);
  return out;
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return f16_t{static_cast<uint16_t>(sign | 0x7e00u)};
  if (u >= 0x477ff000u) return f16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (u < 0x38800000u) {  // subnormal or zero in f16: round via float addition
    float a;
    std::memcpy(&a, &u, 4);
    a += 0.5f;  // 2^-1 aligns f16's subnormal ulp (2^-24) to float's ulp at 0.5
    uint32_t r;
    std::memcpy(&r, &a, 4);
    return f16_t{static_cast<uint16_t>(sign | (r - 0x3f000000u))};
  }
  const uint32_t odd = (u >> 13) & 1u;
  u += 0xc8000fffu + odd;  // rebias exponent (-112 << 23) and round to nearest even
  return f16_t{static_cast<uint16_t>(sign | (u >> 13))};
#endif
}
#if FG_VEC_GEMM
inline VecF vload_as(const bf16_t* p) { return vload_bf16(&p->bits); }
inline VecF vload_as(const f16_t* p) { return vload_f16(&p->bits); }
// One element of f32, bf16 or f16 (converted exactly) in every lane.
template <typename TA>
inline VecF vbroadcast_as(const TA* p) { return vbroadcast(to_float(*p)); }
#endif
template <> inline bf16_t from_acc<bf16_t>(double x) { return bf16_from(static_cast<float>(x)); }
template <> inline f16_t from_acc<f16_t>(double x) { return f16_from(static_cast<float>(x)); }

// dst[0..n) = src[0, stride, ..., (n-1) * stride] converted to Acc, times
// mul; dst[n..pad) = 0.
template <typename T, typename Acc>
inline void load_row(const T* src, int64_t stride, int64_t n, int64_t pad, Acc* dst, Acc mul = Acc(1)) {
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<Acc>(to_float(src[i])) * mul;
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<Acc>(to_float(src[i * stride])) * mul;
  }
  for (int64_t i = n; i < pad; ++i) dst[i] = Acc(0);
}

template <typename T, typename Acc>
inline void store_row(const Acc* src, int64_t n, T* dst, int64_t stride, Acc mul) {
  for (int64_t i = 0; i < n; ++i) dst[i * stride] = from_acc<T>(src[i] * mul);
}

// exp(x) for x <= ~88 in f32 (exp_poly.hpp): within 2 ulp over the range
// the softmax uses (x <= 0). Results below e^-87.3 flush to 0, exactly 0 for
// x = -inf. NaN propagates.
inline float exp_f32(float x) {
  // Written so that NaN clamps to -87.3 too: the integer steps below then
  // stay defined, and the NaN is restored at the end.
  const float xc = x > -87.3f ? (x < 88.3f ? x : 88.3f) : -87.3f;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float nf = (xc * kExpLog2e + magic) - magic;
  float r = xc - nf * kExpLn2Hi;
  r = r - nf * kExpLn2Lo;
  float p = kExpPoly[0];
  for (int i = 1; i < kExpPolyTerms; ++i) p = p * r + kExpPoly[i];
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(nf) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  float y = p * scale;
  y = x < -87.3f ? 0.0f : y;
  return x != x ? x : y;
}
#if FG_SCALAR_VEXP
inline VecF vexp(VecF x) { return exp_f32(x); }
#endif

// tanh(s * inv) rounded to f32 (exp_poly.hpp): the vector layers' vtanh lane
// by lane, the same operations in the same order. NaN propagates.
inline float tanh_f32(float s, double inv) {
  const double a = std::fmin(std::fabs(static_cast<double>(s) * inv), kTanhClamp) * 2.0;
  const double n = std::nearbyint(a * kTanhLog2e);
  double r = std::fma(-n, kTanhLn2Hi, a);
  r = std::fma(-n, kTanhLn2Lo, r);
  double p = kTanhPoly[0];
  for (int i = 1; i < kTanhPolyTerms; ++i) p = std::fma(p, r, kTanhPoly[i]);
  p = p * r;
  const uint64_t bits = static_cast<uint64_t>(static_cast<int64_t>(n) + 1023) << 52;
  double scale;
  std::memcpy(&scale, &bits, 8);
  const double e = std::fma(scale, p, scale - 1.0);
  const float t = static_cast<float>(e / (e + 2.0));
  return s != s ? s : std::copysign(t, s);
}
#if FG_SCALAR_VEXP
inline VecF vtanh(VecF s, double inv) { return tanh_f32(s, inv); }
#endif

// tanh(x) in f64 (exp_poly.hpp): within 0.51 ulp, by the same operations on
// every ISA (std::fma is exact wherever it runs). NaN propagates.
inline double tanh_f64(double x) {
  const double a = std::fmin(std::fabs(x), kTanhClamp) * 2.0;
  const double n = std::nearbyint(a * kTanhLog2e);
  // r = a - n ln2 = rh + rl: a - n ln2_hi is exact (n ln2_hi is, and they lie within 2x).
  const double t = a - n * kTanhLn2Hi, p = n * kTanhLn2Lo, pe = std::fma(n, kTanhLn2Lo, -p);
  const double rh = t - p, rl = ((t - rh) - p) - pe;
  const double sq = rh * rh, sqe = std::fma(rh, rh, -sq);
  const double p3 = sq * rh, p3e = std::fma(sq, rh, -p3) + sqe * rh;
  const double c3 = p3 / 6.0, c3e = (std::fma(-c3, 6.0, p3) + p3e) * (1.0 / 6.0);
  double c = kTanh64Poly[0];
  for (int i = 1; i < kTanh64PolyTerms; ++i) c = c * rh + kTanh64Poly[i];
  // expm1(r) = mh + ml: rh + (rh^2 / 2 + rh^3 / 6) by Fast2Sum (each term the larger), the rest in ml.
  const double uh = sq * 0.5 + c3, ue = (sq * 0.5 - uh) + c3;
  const double m0 = rh + uh, me = (rh - m0) + uh;
  const double m1 = me + ue + rl + sqe * 0.5 + rh * rl + sq * rl * 0.5 + c3e + sq * sq * c;
  const double mh = m0 + m1, ml = (m0 - mh) + m1;  // renormalized: |ml| <= ulp(mh) / 2
  // e = (2^n - 1) + 2^n mh + 2^n ml, as eh + el.
  const uint64_t bits = static_cast<uint64_t>(static_cast<int64_t>(n) + 1023) << 52;
  double s;
  std::memcpy(&s, &bits, 8);
  const double ah = s - 1.0, al = (s - ah) - 1.0, b = s * mh;
  const double e0 = ah + b, bb = e0 - ah, ee = (ah - (e0 - bb)) + (b - bb);
  const double e1 = ee + al + s * ml;
  const double eh = e0 + e1, el = (e0 - eh) + e1;
  // tanh = e / (e + 2): q0 + (e - q0 (e + 2)) / (e + 2).
  const double dh = eh + 2.0, db = dh - eh, de = (eh - (dh - db)) + (2.0 - db) + el;
  const double inv = 1.0 / dh, q0 = eh * inv;
  const double rem = std::fma(-q0, dh, eh) + (el - q0 * de);
  const double th = q0 + rem * inv;
  return x != x ? x : std::copysign(th, x);
}
inline double exp_acc(double x) { return std::exp(x); }
inline float exp_acc(float x) { return exp_f32(x); }

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
      // step as an index, which unlaminates the FMA into two uops (decode
      // from L3, 1 thread, both builds at once: 10.3 -> 11.6 and 10.7 ->
      // 11.3 GB/s).
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
      // AVX2) the unrolled steps spilled a vector instead: Lq = 24 ran
      // 0.95-0.97x. At Nv = 1 (Mr = 8: Lq = 3-8 on AVX2) this loop replaced
      // 4 steps that counted the prefetch's row in each (Zen 3, f32, d =
      // 128, 8 heads, 2 threads, `flashgrad ab`, medians of 10 pairs, three
      // runs: Lq = 8, Lk = 16k 1.05-1.07x, 64k 1.06-1.08x, causal
      // 1.08-1.10x, 1 thread 1.03-1.10x; Lq = 4 1.06-1.11x; Lq = 3
      // 1.01-1.05x).
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
  // the step's 12 FMAs (decode, f32, Lq = 16, d = 128, 8 heads, two builds
  // alternating in one process, medians: Lk = 4096, 1 thread 1.05-1.12x
  // faster; Lk = 64k, 2 threads 0.99-1.09x).
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
// once, in memory order (forward.inl, heads_across).

// kLanes elements of T from src to dst, as they are, in pieces of at most
// 32 bytes: decode read K faster from DRAM when its copies were spread out
// down to half a line. Lq = 1, d = 128, 8 heads, 2 threads, `flashgrad ab
// --pass forward`, 11 pairs (the unchanged build against itself 1.005x):
// f32 on AVX-512 in 32-byte pieces against whole lines, Lk = 4096 1.02x,
// 16k 1.06x, 64k 1.06-1.13x (d = 64 1.06x, 16 heads 1.05x, Lq = 2 1.05x),
// 128k 1.06-1.09x (avx512 path 1.10x); in 16-byte pieces against 32,
// 0.98x. bf16 in whole lines against 32-byte pieces, 0.84x at 64k and
// 0.77x at 128k; in 16-byte pieces, 1.01x.
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
// + c of head h at step c), an order a reading test read at 34 GB/s against
// 67-78 in memory order (Zen 5, 2 threads). Without the copy, decode (Lq =
// 1, 8 heads, d = 128, f32) read K and V at about the staged K^T tiles'
// rate (32-34 GB/s, alternating runs); with it, `flashgrad ab` against
// those tiles: f32 1.08x, bf16 1.36x. Prefetching the next blocks' rows
// while copying measured 0.86-1.05x.
// bf16 K on avx2 goes through scores_heads_g as pairs of elements: the
// kLanes segments of 2 * kLanes elements each read as 32-bit words,
// transposed, each word split into its two f32 (vpair_lo, vpair_hi),
// instead of kLanes elements of each widened on load and transposed: half
// the transposes and no widening, on the shuffle ports. The FMAs, their
// order and so the scores stay the same. Zen 3, bf16, Lq = 1, d = 128, 8
// heads, `flashgrad ab --expect-identical` (outputs bitwise identical), 2
// threads: Lk = 4096 1.22x, 16k 1.11x, 64k 1.12x, 128k 1.22x; d = 64 (16k)
// 1.20x; 16 heads 1.11x; Lq = 2 1.05x; 1 thread, K and V in L3 (Lk =
// 1024) 1.38x. The same in scores_rows_whole ([B, H, Lk, d], a head at a
// time) read 1.00-1.02x, and V read as pairs in pv_heads 0.98-1.01x:
// neither kept.
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
// scores_heads' blocks per pass: st holds round_up(nj, kHeadsBlocks * kLanes / g) * g lanes per row.
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
// heads before the next: against 2 to 16 rows per pass of a head, f32
// 0.96-1.08x (within this host's noise), bf16 1.03-1.42x; against V copied
// in memory order first, as K is, 1.03-1.08x. Every C element gets
// the same FMAs in the same order as from gemm_rows_whole. acc: [g * M *
// n] scratch.
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

// acc[r, 0..n) = acc[r, 0..n) * row_scale[r] + add[r, 0..n) (row_scale null: 1).
template <typename Acc>
inline void scale_add(int64_t rows, int64_t n, const Acc* row_scale, const Acc* add, Acc* acc,
                      int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    Acc* a = acc + r * ld;
    const Acc* x = add + r * ld;
    if (row_scale) {
      const Acc sc = row_scale[r];
      for (int64_t c = 0; c < n; ++c) a[c] = a[c] * sc + x[c];
    } else {
      for (int64_t c = 0; c < n; ++c) a[c] += x[c];
    }
  }
}

// C[m, 0..n) = C * row_scale[r] + A B (row_scale null: C + A B), the
// product summed on its own before it meets C (blocked summation: running
// sums over every key or query row lose accuracy, docs/performance.md).
// tmp [m, ldc] is scratch for the paths that stage the product. (row_scale
// takes no part in deducing Acc, so that nullptr can stand for it.)
template <typename Acc>
inline void gemm_nn_acc(int64_t m, int64_t n, int64_t k, const Acc* a, int64_t a_rs, int64_t a_cs,
                        const Acc* b, int64_t ldb, Acc* c, int64_t ldc,
                        const typename std::remove_reference<Acc&>::type* row_scale, Acc* tmp) {
  gemm_nn(m, n, k, a, a_rs, a_cs, b, ldb, tmp, ldc);
  scale_add(m, n, row_scale, tmp, c, ldc);
}
#if FG_VEC_GEMM
inline void gemm_nn_acc(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
                        const float* b, int64_t ldb, float* c, int64_t ldc, const float* row_scale, float*) {
  gemm_f32<kGemmMr, kGemmVecs, Epi::add_rows>(m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, row_scale);
}
#endif

// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols.
template <typename Acc>
inline void transpose(int64_t rows, int64_t cols, const Acc* src, int64_t lds, Acc* dst,
                      int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}
#if FG_VEC_GEMM
// Whole register blocks; rows and cols must be multiples of kTransposeBlock.
// src may hold f32, bf16 or f16 (converted exactly on the way).
template <typename S>
inline void transpose_cvt(int64_t rows, int64_t cols, const S* src, int64_t lds, float* dst, int64_t ldd) {
  FG_DASSERT(rows % kTransposeBlock == 0 && cols % kTransposeBlock == 0);
  for (int64_t r = 0; r < rows; r += kTransposeBlock)
    for (int64_t c = 0; c < cols; c += kTransposeBlock)
      transpose_block(src + r * lds + c, lds, dst + c * ldd + r, ldd);
}
inline void transpose(int64_t rows, int64_t cols, const float* src, int64_t lds, float* dst, int64_t ldd) {
  transpose_cvt(rows, cols, src, lds, dst, ldd);
}
#endif
