// Each ISA's vector exp (through its exp_row, bench/tile_ops.hpp) against
// the exact exp: the same accuracy bound as the scalar exp_f32 (test_vec.cpp)
// and the same special values, lane by lane.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tile_ops.hpp"

namespace flashgrad {
namespace {

TEST(VectorExp, EveryIsaWithinOnePointFiveUlpOnTheSoftmaxRange) {
  const int64_t n = 4000000 / 64 * 64;  // a multiple of every ISA's lane count
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = -87.0f + 87.0f * static_cast<float>(i) / static_cast<float>(n - 1);
  for (Isa isa : supported_isas()) {
    std::vector<float> y = x;
    bench::tile_ops(isa).exp_row(y.data(), n, 0.0f);
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double exact = std::exp(static_cast<double>(x[i]));
      const float rounded = static_cast<float>(exact);
      const double ulp = std::nextafter(rounded, std::numeric_limits<float>::infinity()) - rounded;
      worst = std::max(worst, std::fabs(y[i] - exact) / ulp);
    }
    EXPECT_LT(worst, 1.5) << isa_to_string(isa);
  }
}

TEST(VectorExp, EveryIsaSpecialValuesInEveryLane) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float special[] = {-inf, -100.0f, -87.4f, 0.0f, nan, 88.0f};
  for (Isa isa : supported_isas()) {
    const int64_t lanes = bench::tile_ops(isa).lanes;
    for (int64_t lane = 0; lane < lanes; ++lane)
      for (float s : special) {
        std::vector<float> y(static_cast<size_t>(lanes), -1.0f);
        y[lane] = s;
        bench::tile_ops(isa).exp_row(y.data(), lanes, 0.0f);
        const std::string where = std::string(isa_to_string(isa)) + " lane " + std::to_string(lane);
        if (std::isnan(s)) {
          EXPECT_TRUE(std::isnan(y[lane])) << where;
        } else if (s < -87.3f) {
          EXPECT_EQ(y[lane], 0.0f) << where << " x " << s;
        } else {
          EXPECT_NEAR(y[lane], std::exp(static_cast<double>(s)), 2e-7 * std::exp(static_cast<double>(s)))
              << where << " x " << s;
        }
        for (int64_t other = 0; other < lanes; ++other) {
          if (other == lane) continue;
          EXPECT_NEAR(y[other], std::exp(-1.0), 2e-7 * std::exp(-1.0)) << where;
        }
      }
  }
}

}  // namespace
}  // namespace flashgrad
