// The scalar building blocks every ISA shares: the fast exp and the 16-bit
// float conversions of the portable path.
#include <gtest/gtest.h>

#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace flashgrad::vec_test {
#define FG_PORTABLE_HALF 1
#define FG_DASSERT(x) assert(x)
#include "cpu/vec.inl"

namespace {

// Measured: 1.21 ulp at worst over this grid (x = -71.05).
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
// pattern and on rounding boundaries.
#ifdef __FLT16_MANT_DIG__
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
