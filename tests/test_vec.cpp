// The scalar building blocks every ISA shares: the fast exp and the 16-bit
// float conversions of the portable path.
#include <gtest/gtest.h>

#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/exp_poly.hpp"
#include "dispatch.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace flashgrad::vec_test {
#define FG_PORTABLE_HALF 1
#define FG_DASSERT(x) assert(x)
#include "cpu/vec.inl"

namespace {

// Measured: 1.15 ulp at worst over this grid (x = -49.52; 0.87 with FMA contraction).
TEST(FastExp, WithinOnePointFiveUlpOnTheSoftmaxRange) {
  double worst = 0;
  const int64_t n = 4000000;
  for (int64_t i = 0; i <= n; ++i) {
    const float x = -87.0f + 87.0f * static_cast<float>(i) / static_cast<float>(n);
    const double exact = std::exp(static_cast<double>(x));
    const float rounded = static_cast<float>(exact);
    const double ulp = std::nextafter(rounded, std::numeric_limits<float>::infinity()) - rounded;
    worst = std::max(worst, std::fabs(exp_f32(x) - exact) / ulp);
  }
  EXPECT_LT(worst, 1.5);
}

TEST(FastExp, SpecialValues) {
  EXPECT_EQ(exp_f32(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_f32(-100.0f), 0.0f);
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(exp_f32(std::numeric_limits<float>::quiet_NaN())));
}

// The portable f16 conversion against the compiler's _Float16, on every bit
// pattern and on rounding boundaries, where C++ has _Float16 (CMakeLists.txt).
#if FG_HAVE_FLOAT16
TEST(PortableHalf, MatchesCompilerFloat16Exhaustively) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    _Float16 h;
    const auto b16 = static_cast<uint16_t>(bits);
    std::memcpy(&h, &b16, 2);
    const float want = static_cast<float>(h);
    const float got = to_float(f16_t{b16});
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << bits;
    } else {
      EXPECT_EQ(want, got) << bits;
    }
  }
  for (uint32_t u = 0; u < 0x7f800000u; u += 4099) {  // positive floats, stepping through every exponent
    float f;
    std::memcpy(&f, &u, 4);
    for (float x : {f, -f}) {
      const _Float16 h = static_cast<_Float16>(x);
      uint16_t want;
      std::memcpy(&want, &h, 2);
      EXPECT_EQ(want, f16_from(x).bits) << x;
    }
  }
}
#endif

TEST(PortableHalf, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_from(1.0f).bits, 0x3f80);
  float x;
  uint32_t u = 0x3f808000u;  // exactly halfway between 0x3f80 and 0x3f81: ties to even
  std::memcpy(&x, &u, 4);
  EXPECT_EQ(bf16_from(x).bits, 0x3f80);
  u = 0x3f818000u;  // halfway between 0x3f81 and 0x3f82: ties to even
  std::memcpy(&x, &u, 4);
  EXPECT_EQ(bf16_from(x).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(to_float(bf16_from(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(to_float(bf16_from(std::numeric_limits<float>::infinity())), std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace flashgrad::vec_test

// The AVX512_BF16 pieces of the avx512bf16 forward (vec_avx512.inl under
// FG_BF16_DOT), compiled here with that path's target options and run when
// the CPU has AVX512_BF16.
#if defined(__x86_64__) || defined(__i386__)
// As in kernels_avx512.cpp: GCC 12 warns inside its own intrinsics headers.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")
#endif
namespace flashgrad::vec_bf16_test {
#define FG_BF16_DOT 1
#include "cpu/vec_avx512.inl"

// c = mul * a b through the pair layouts the forward uses: rows of a as
// pairs (load_bf16_pairs), k rows of b interleaved two by two; with c0,
// c = c0 + a b as the backward accumulates (mul 1).
std::vector<float> gemm_pairs(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, int64_t m,
                              int64_t n, int64_t k, float mul, const std::vector<float>* c0 = nullptr) {
  const int64_t kp = (k + 1) / 2, lda = (kp + 15) / 16 * 16;
  std::vector<uint32_t> ap(static_cast<size_t>(m * lda)), bp(static_cast<size_t>(kp * n));
  for (int64_t r = 0; r < m; ++r) load_bf16_pairs(a.data() + r * k, k, lda, ap.data() + r * lda);
  for (int64_t x = 0; x < kp; ++x)
    interleave_bf16_rows(b.data() + 2 * x * n, 2 * x + 1 < k ? b.data() + (2 * x + 1) * n : nullptr, n, n,
                         bp.data() + x * n);
  std::vector<float> c(static_cast<size_t>(m * n));
  if (c0) {
    c = *c0;
    gemm_bf16<true>(m, n, kp, ap.data(), lda, bp.data(), n, c.data(), n, 1.0f);
  } else {
    gemm_bf16(m, n, kp, ap.data(), lda, bp.data(), n, c.data(), n, mul);
  }
  return c;
}

void round_row(float* s, int64_t n) { round_bf16_pairs(s, n); }

// S^T [16, w] = mul * K Q^T through the narrow tiles' products: K's nj rows
// (ld elements apart, d each) as load_pairs_keys16 lays them out, Q's w
// rows (d each) as pairs, transposed.
std::vector<float> narrow_scores(const std::vector<uint16_t>& k, int64_t ld, int64_t nj, const std::vector<uint16_t>& q,
                                 int64_t w, int64_t d, float mul) {
  const int64_t kp = (d + 1) / 2, kpp = (kp + 15) / 16 * 16;
  std::vector<uint32_t> kt(static_cast<size_t>(kpp * 16)), qp(static_cast<size_t>(w * kpp)),
      qt(static_cast<size_t>(kp * w));
  load_pairs_keys16(k.data(), ld, nj, d, kt.data());
  for (int64_t r = 0; r < w; ++r) load_bf16_pairs(q.data() + r * d, d, kpp, qp.data() + r * kpp);
  for (int64_t x = 0; x < kp; ++x)
    for (int64_t r = 0; r < w; ++r) qt[static_cast<size_t>(x * w + r)] = qp[static_cast<size_t>(r * kpp + x)];
  std::vector<float> c(static_cast<size_t>(16 * w));
  LineWalk none_k, none_v;
  if (w == 16)
    gemm_bf16_keys16<1>(kp, kt.data(), qt.data(), w, c.data(), w, mul, none_k, none_v);
  else
    gemm_bf16_keys16<2>(kp, kt.data(), qt.data(), w, c.data(), w, mul, none_k, none_v);
  return c;
}

// c [m, w] = c * alpha + V^T P^T through the narrow tiles' P V: V's 2 kp
// rows (m each) interleaved two by two, P^T's rows ([2 kp, w] f32) rounded
// to pairs.
void narrow_pv(const std::vector<uint16_t>& v, const std::vector<float>& pt, int64_t kp, int64_t m, int64_t w,
               const std::vector<float>& alpha, std::vector<float>& c) {
  std::vector<uint32_t> vp(static_cast<size_t>(kp * m)), pp(static_cast<size_t>(kp * w));
  for (int64_t x = 0; x < kp; ++x) {
    interleave_bf16_rows(v.data() + 2 * x * m, v.data() + (2 * x + 1) * m, m, m, vp.data() + x * m);
    interleave_f32_rows(pt.data() + 2 * x * w, pt.data() + (2 * x + 1) * w, w, pp.data() + x * w);
  }
  if (w == 16)
    gemm_bf16_cols<1>(m, kp, vp.data(), m, pp.data(), c.data(), w, alpha.data());
  else
    gemm_bf16_cols<2>(m, kp, vp.data(), m, pp.data(), c.data(), w, alpha.data());
}
}  // namespace flashgrad::vec_bf16_test
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#pragma GCC diagnostic pop

namespace flashgrad::vec_test {
namespace {

float bf16_value(uint16_t bits) { return to_float(bf16_t{bits}); }

// The pair layout keeps each dot product in index order, one rounding per
// term, as the f32 tile product's FMAs: with a power-of-two scale the result
// is bit for bit that of sum_p fma(scale * a[p], b[p]), the f32 tiles'
// score, so the dot products' scores are then the f32 path's.
TEST(Bf16Pairs, DotProductsRunInIndexOrderAsTheF32Fmas) {
  if (!cpu_supports(Isa::avx512bf16)) GTEST_SKIP() << "this CPU lacks AVX512_BF16";
  std::mt19937 gen(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int64_t k : {1, 2, 7, 64, 129}) {
    const int64_t m = 13, n = 64;
    std::vector<uint16_t> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
    for (auto& x : a) x = bf16_from(nd(gen)).bits;
    for (auto& x : b) x = bf16_from(nd(gen)).bits;
    const float scale = 0.125f;
    const std::vector<float> got = vec_bf16_test::gemm_pairs(a, b, m, n, k, scale);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        float acc = 0;
        for (int64_t p = 0; p < k; ++p)
          acc = std::fma(scale * bf16_value(a[r * k + p]), bf16_value(b[p * n + c]), acc);
        ASSERT_EQ(got[static_cast<size_t>(r * n + c)], acc) << "k " << k << " row " << r << " col " << c;
      }
  }
}

// The backward's accumulating form: each product summed from zero in index
// order, then added to C with one rounding (m = 14: a 12-row block and a
// 2-row rest).
TEST(Bf16Pairs, AccumulatingProductsAddTheSumToC) {
  if (!cpu_supports(Isa::avx512bf16)) GTEST_SKIP() << "this CPU lacks AVX512_BF16";
  std::mt19937 gen(9);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int64_t k : {1, 31, 64}) {
    const int64_t m = 14, n = 32;
    std::vector<uint16_t> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
    for (auto& x : a) x = bf16_from(nd(gen)).bits;
    for (auto& x : b) x = bf16_from(nd(gen)).bits;
    std::vector<float> c0(static_cast<size_t>(m * n));
    for (auto& x : c0) x = 100.0f * nd(gen);
    const std::vector<float> got = vec_bf16_test::gemm_pairs(a, b, m, n, k, 1.0f, &c0);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        float acc = 0;
        for (int64_t p = 0; p < k; ++p) acc = std::fma(bf16_value(a[r * k + p]), bf16_value(b[p * n + c]), acc);
        const size_t i = static_cast<size_t>(r * n + c);
        ASSERT_EQ(got[i], c0[i] + acc) << "k " << k << " row " << r << " col " << c;
      }
  }
}

// The narrow tiles' scores on dot products (forward_narrow_dot.inl, Bf16DotTiles::narrow)
// must be the row path's and the backward's bit for bit, whatever the
// scale: S^T from K's rows where they lie (ld apart, fewer than 16 at a
// tile's end) is S = mul * Q K^T from gemm_bf16, transposed.
TEST(Bf16Pairs, NarrowScoresAreTheRowProductsTransposed) {
  if (!cpu_supports(Isa::avx512bf16)) GTEST_SKIP() << "this CPU lacks AVX512_BF16";
  std::mt19937 gen(13);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const float mul = 0.3f;
  for (int64_t d : {1, 7, 64, 100, 128})
    for (int64_t nj : {16, 5})
      for (int64_t w : {16, 32}) {
        const int64_t ld = 3 * d + 5;
        std::vector<uint16_t> k(static_cast<size_t>(nj * ld)), q(static_cast<size_t>(w * d)),
            kt(static_cast<size_t>(d * 32), 0);
        for (auto& x : k) x = bf16_from(nd(gen)).bits;
        for (auto& x : q) x = bf16_from(nd(gen)).bits;
        for (int64_t j = 0; j < nj; ++j)
          for (int64_t c = 0; c < d; ++c) kt[static_cast<size_t>(c * 32 + j)] = k[static_cast<size_t>(j * ld + c)];
        const std::vector<float> want = vec_bf16_test::gemm_pairs(q, kt, w, 32, d, mul);
        const std::vector<float> got = vec_bf16_test::narrow_scores(k, ld, nj, q, w, d, mul);
        for (int64_t j = 0; j < nj; ++j)
          for (int64_t i = 0; i < w; ++i)
            ASSERT_EQ(got[static_cast<size_t>(j * w + i)], want[static_cast<size_t>(i * 32 + j)])
                << "d " << d << " nj " << nj << " w " << w << " key " << j << " row " << i;
      }
}

// The narrow tiles' P V: each O^T element's sum from zero over the keys in
// index order, P rounded to bf16, then added to O^T * alpha with one
// rounding.
TEST(Bf16Pairs, NarrowPvSumsInKeyOrderThenRescales) {
  if (!cpu_supports(Isa::avx512bf16)) GTEST_SKIP() << "this CPU lacks AVX512_BF16";
  std::mt19937 gen(17);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  for (int64_t w : {16, 32}) {
    const int64_t kp = 8, m = 48;
    std::vector<uint16_t> v(static_cast<size_t>(2 * kp * m));
    std::vector<float> pt(static_cast<size_t>(2 * kp * w)), alpha(static_cast<size_t>(w)),
        c(static_cast<size_t>(m * w));
    for (auto& x : v) x = bf16_from(nd(gen)).bits;
    for (auto& x : pt) x = ud(gen);
    for (auto& x : alpha) x = ud(gen);
    for (auto& x : c) x = nd(gen);
    const std::vector<float> c0 = c;
    vec_bf16_test::narrow_pv(v, pt, kp, m, w, alpha, c);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t i = 0; i < w; ++i) {
        float acc = 0;
        for (int64_t j = 0; j < 2 * kp; ++j)
          acc = std::fma(bf16_value(v[static_cast<size_t>(j * m + r)]),
                         bf16_value(bf16_from(pt[static_cast<size_t>(j * w + i)]).bits), acc);
        const size_t e = static_cast<size_t>(r * w + i);
        ASSERT_EQ(c[e], std::fma(c0[e], alpha[static_cast<size_t>(i)], acc))
            << "w " << w << " row " << r << " col " << i;
      }
  }
}

// P rounded in place: word p of the row holds (s[2p], s[2p + 1]), the first
// in the high half, each rounded to nearest even as bf16_from does (normal
// values, ties, infinities, NaN).
TEST(Bf16Pairs, RoundingInPlaceMatchesBf16From) {
  if (!cpu_supports(Isa::avx512bf16)) GTEST_SKIP() << "this CPU lacks AVX512_BF16";
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> ud(-2.0f, 2.0f);
  std::vector<float> row(96), src;
  for (auto& x : row) x = ud(gen);
  const uint32_t ties[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7f7fffffu};
  for (int i = 0; i < 4; ++i) std::memcpy(&row[static_cast<size_t>(10 + i)], &ties[i], 4);
  row[20] = std::numeric_limits<float>::infinity();
  row[21] = -std::numeric_limits<float>::infinity();
  row[22] = std::numeric_limits<float>::quiet_NaN();
  row[23] = 0.0f;
  src = row;
  vec_bf16_test::round_row(row.data(), 96);
  for (size_t p = 0; p < 48; ++p) {
    uint32_t w;
    std::memcpy(&w, &row[p], 4);
    for (int half = 0; half < 2; ++half) {
      const float x = src[2 * p + static_cast<size_t>(half)];
      const uint16_t got = static_cast<uint16_t>(half == 0 ? w >> 16 : w & 0xffffu);
      if (std::isnan(x))
        EXPECT_TRUE(std::isnan(bf16_value(got))) << "element " << 2 * p + half;
      else
        EXPECT_EQ(got, bf16_from(x).bits) << "element " << 2 * p + half << " = " << x;
    }
  }
}

}  // namespace
}  // namespace flashgrad::vec_test
#endif
