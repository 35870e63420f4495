// The C ABI fuzzer's draws that once failed (docs/reliability.md), run
// through its harness on every test run: each seed's 64 bytes come from
// mt19937_64, as fuzz_c_abi_seeds draws them.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "fuzz_c_abi.hpp"
#include "harness.hpp"

namespace {

flashgrad::fuzz::Outcome run_seed(uint64_t seed) {
  std::vector<uint8_t> bytes(64);
  std::mt19937_64 rng(seed);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return flashgrad::fuzz::run_one(bytes.data(), bytes.size());
}

class FuzzSeeds : public ::testing::TestWithParam<uint64_t> {};

TEST_P(FuzzSeeds, PassOnThisIsa) {
  if (const char* isa = flashgrad::testing::forced_isa_missing()) GTEST_SKIP() << isa << " not on this CPU";
  const auto res = run_seed(GetParam());
  EXPECT_TRUE(res.ok) << "seed " << GetParam() << ": " << res.describe << " [" << res.kind << "]\n" << res.failure;
}

// 216435: f32, Lq 1, Lk 31, d 72, softcap 30, inputs x2, bias with dbias:
// scores scaled by a rounded f32 scale after a rounded q (out, lse, dv).
// 213158: f64, one query row of 64 keys (varlen), d 1 / 24, softcap 30:
// glibc's tanh, up to 2.1 ulp, in the f64 softcap (dv).
INSTANTIATE_TEST_SUITE_P(Issue48, FuzzSeeds, ::testing::Values(216435, 213158));

// Rows of few effective keys (d 1-3, one to seven query rows, sinks, masks,
// varlen rows of one key), f32, f64 and bf16: the naive paths' error there is one
// rounding sequence and can be near 0; the rule's exponent noise covers
// them (docs/design.md, "The tolerance rule"). 10131401: f64, d 1, one key
// of a row at P = 0.8: the sums of l and P V rounding alike, over 20 terms.
// 12511855, 13319189: f16, rows where the sink takes nearly all of P: out is f16
// subnormal, so its rounding is absolute, and delta and dsinks carry it.
INSTANTIATE_TEST_SUITE_P(FewKeys, FuzzSeeds,
                         ::testing::Values(991117, 1005209, 1006432, 1007969, 1009046, 1013081, 1013478, 1014994,
                                           1017385, 1021469, 1022183, 1027752, 1029370, 1032768, 1042884, 1047558,
                                           1051888, 1055528, 5032900, 10131401, 12511855, 13319189));

}  // namespace
