// Numerical hazards: logits near the f32/bf16 limits, softcap on huge
// inputs, f16 inputs whose unscaled q.k overflows f16, lse of rows that see
// no key or are dominated by their sink, and NaN/Inf inputs that must reach
// only the rows and heads that read them. ctest runs it once per ISA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "dispatch.hpp"
#include "harness.hpp"

namespace flashgrad::testing {
namespace {

class Hazards : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* isa = forced_isa_missing()) GTEST_SKIP() << "this CPU lacks " << isa;
  }
};

Case small(DType t) {
  Case c;
  c.dtype = t;
  c.batch = 2;
  c.seqlen_q = 33;
  c.seqlen_k = 70;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.head_dim_v = 24;
  return c;
}

bool all_finite(const std::vector<double>& x) {
  return std::all_of(x.begin(), x.end(), [](double v) { return std::isfinite(v); });
}

// max |kernel - f64 reference| / max(1, max |reference|) for each output.
struct RelErr {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;
};
double rel(const Buffer& k, const Buffer& r) {
  const auto kd = dense(k), rd = dense(r);
  double top = 1, e = 0;
  for (size_t i = 0; i < rd.size(); ++i) {
    top = std::max(top, std::fabs(rd[i]));
    const double d = std::fabs(kd[i] - rd[i]);
    if (!(d <= e)) e = d;
  }
  return e / top;
}
RelErr against_f64(const Problem& p, Outputs& ker) {
  Outputs ref = make_outputs(p, true);
  run_kernels(p, ker);
  run_reference(p, ref, reference::Precision::f64);
  return {rel(ker.out, ref.out), rel(ker.lse, ref.lse), rel(ker.dq, ref.dq), rel(ker.dk, ref.dk),
          rel(ker.dv, ref.dv)};
}

// Logits of ~1e3 and ~1e33 (f32 and bf16 share the 8-bit exponent, max 3.4e38):
// the online softmax subtracts the running max, so nothing overflows.
TEST_F(Hazards, ExtremeLogitsF32Bf16) {
  for (DType t : {DType::f32, DType::bf16})
    for (double scale : {30.0, 1e16}) {
      Case c = small(t);
      c.input_scale = scale;  // |S| ~ scale^2 * sqrt(d) / sqrt(d) = scale^2
      c.causal = true;
      const Report r = check_case(c);
      EXPECT_TRUE(r.pass()) << c.describe() << " input_scale " << scale << "\n" << r.table();
      Problem p = make_problem(c);
      Outputs o = make_outputs(p, false);
      run_kernels(p, o);
      EXPECT_TRUE(all_finite(dense(o.out)) && all_finite(dense(o.lse))) << c.describe() << " scale " << scale;
    }
}

// S = softcap * tanh(S / softcap) with |S| ~ 1e10 (f32): saturated logits,
// finite results, gradients through tanh' ~ 0.
TEST_F(Hazards, SoftcapWithHugeInputs) {
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (double scale : {10.0, t == DType::f16 ? 100.0 : 1e5}) {
      Case c = small(t);
      c.softcap = 5.0;
      c.input_scale = scale;
      const Report r = check_case(c);
      EXPECT_TRUE(r.pass()) << c.describe() << " input_scale " << scale << "\n" << r.table();
      Problem p = make_problem(c);
      Outputs o = make_outputs(p, false);
      run_kernels(p, o);
      for (const Buffer* b : {&o.out, &o.lse, &o.dq, &o.dk, &o.dv})
        EXPECT_TRUE(all_finite(dense(*b))) << c.describe() << " scale " << scale;
    }
}

// f16 q, k of magnitude ~200: the unscaled products q.k reach ~1e5 > 65504
// (f16 max). The kernels scale q by softmax_scale in f32 and accumulate in
// f32, so out, lse and the gradients stay finite and close to the f64
// reference. (The naive f16 reference overflows here, so check_case's
// bound is infinite and says nothing; this test compares to f64 directly.)
TEST_F(Hazards, F16UnscaledDotProductsOverflow) {
  for (int64_t d : {64, 40}) {
    Case c = small(DType::f16);
    c.head_dim = d;
    c.input_scale = 200.0;
    Problem p = make_problem(c);
    // Confirm the hazard: some unscaled q.k exceeds the f16 range.
    const auto q = dense(p.q), k = dense(p.k);
    double top = 0;
    for (int64_t i = 0; i < c.seqlen_q; ++i)
      for (int64_t j = 0; j < c.seqlen_k; ++j) {
        double s = 0;  // batch 0, head 0 (kv head 0)
        for (int64_t x = 0; x < d; ++x)
          s += q[static_cast<size_t>((i * c.heads_q) * d + x)] * k[static_cast<size_t>((j * c.heads_kv) * d + x)];
        top = std::max(top, std::fabs(s));
      }
    ASSERT_GT(top, 65504.0) << "the case does not overflow f16; raise input_scale";
    Outputs o = make_outputs(p, false);
    const RelErr e = against_f64(p, o);
    for (const Buffer* b : {&o.out, &o.lse, &o.dq, &o.dk, &o.dv}) EXPECT_TRUE(all_finite(dense(*b))) << "d=" << d;
    // out and dv: f16 rounding of O(1) values (2^-11) plus argmax-like
    // attention; lse is f32 of values ~1e4; dq/dk: f16 of values up to ~1e2.
    EXPECT_LT(e.out, 4e-3) << "d=" << d;
    EXPECT_LT(e.dv, 4e-3) << "d=" << d;
    EXPECT_LT(e.lse, 1e-5) << "d=" << d;
    EXPECT_LT(e.dq, 4e-3) << "d=" << d;
    EXPECT_LT(e.dk, 4e-3) << "d=" << d;
  }
}

// lse of a row that sees no key (mask row of zeros, window past the keys,
// empty key set) is -inf, out 0, grads 0, with or without sinks (then lse =
// sink). A row whose sink dwarfs every logit has lse = sink, out ~ 0.
TEST_F(Hazards, FullyMaskedAndAllSinkRows) {
  for (bool sinks : {false, true}) {
    Case c = small(DType::f32);
    c.mask = MaskKind::full;
    c.sinks = sinks;
    Problem p = make_problem(c);
    for (int64_t j = 0; j < c.seqlen_k; ++j) write(p.mask.view, (0 * c.heads_q + 1) * c.seqlen_q * c.seqlen_k + 5 * c.seqlen_k + j, 0);
    Outputs o = make_outputs(p, false);
    run_kernels(p, o);
    const auto lse = dense(o.lse), out = dense(o.out), dq = dense(o.dq);
    const double l = lse[static_cast<size_t>((0 * c.heads_q + 1) * c.seqlen_q + 5)];
    if (sinks) EXPECT_FLOAT_EQ(l, dense(p.sinks)[1]);
    else EXPECT_EQ(l, -INFINITY);
    for (int64_t x = 0; x < c.head_dim_v; ++x)
      EXPECT_EQ(out[static_cast<size_t>((5 * c.heads_q + 1) * c.head_dim_v + x)], 0.0);
    for (int64_t x = 0; x < c.head_dim; ++x)
      EXPECT_EQ(dq[static_cast<size_t>((5 * c.heads_q + 1) * c.head_dim + x)], 0.0);
    for (const Buffer* b : {&o.out, &o.dq, &o.dk, &o.dv, &o.dsinks}) EXPECT_TRUE(all_finite(dense(*b)));
  }
  {  // A window that leaves a row with no key, and no keys at all.
    Case c = small(DType::bf16);
    c.seqlen_q = 70;
    c.seqlen_k = 33;
    c.causal = true;
    c.window_left = 0;  // rows i < 37 see no key
    const Report r = check_case(c);
    EXPECT_TRUE(r.pass()) << r.table();
    c.seqlen_k = 0;
    const Report r0 = check_case(c);
    EXPECT_TRUE(r0.pass()) << r0.table();
  }
  {  // Sinks of 1e4 (exp overflows f32 unless shifted): lse = sink, out ~ 0.
    Case c = small(DType::f32);
    c.sinks = true;
    Problem p = make_problem(c);
    for (int64_t h = 0; h < c.heads_q; ++h) write(p.sinks.view, h, 1e4);
    Outputs o = make_outputs(p, false);
    const RelErr e = against_f64(p, o);
    for (double l : dense(o.lse)) EXPECT_FLOAT_EQ(l, 1e4);
    for (double x : dense(o.out)) EXPECT_EQ(x, 0.0);
    for (const Buffer* b : {&o.dq, &o.dk, &o.dv, &o.dsinks}) EXPECT_TRUE(all_finite(dense(*b)));
    EXPECT_LT(e.out + e.dq + e.dk + e.dv, 1e-6);
  }
}

// Element offset of (b, s, h, x) in a bshd view.
int64_t at(const TensorView& v, int64_t b, int64_t s, int64_t h, int64_t x) {
  return b * v.strides[0] + s * v.strides[1] + h * v.strides[2] + x * v.strides[3];
}

// Which (b, s, h) rows of a [B, L, H, D] output hold any non-finite value.
std::vector<std::vector<std::vector<bool>>> bad_rows(const Buffer& buf) {
  const TensorView& v = buf.view;
  std::vector<std::vector<std::vector<bool>>> bad(
      static_cast<size_t>(v.shape[0]),
      std::vector<std::vector<bool>>(static_cast<size_t>(v.shape[1]), std::vector<bool>(static_cast<size_t>(v.shape[2]))));
  for (int64_t b = 0; b < v.shape[0]; ++b)
    for (int64_t s = 0; s < v.shape[1]; ++s)
      for (int64_t h = 0; h < v.shape[2]; ++h)
        for (int64_t x = 0; x < v.shape[3]; ++x)
          if (!std::isfinite(read(v, at(v, b, s, h, x)))) bad[b][s][h] = true;
  return bad;
}

// NaN in one q row reaches out/lse/dq of that row only, and dk/dv of that
// batch's kv head only; Inf in one k row reaches only that batch and kv group.
TEST_F(Hazards, NanInfPropagateOnlyWhereRead) {
  for (DType t : {DType::f32, DType::bf16}) {
    Case c = small(t);  // heads 4 over kv 2: q heads 0,1 -> kv 0; 2,3 -> kv 1
    Problem p = make_problem(c);
    write(p.q.view, at(p.q.view, 0, 5, 1, 3), std::nan(""));
    Outputs o = make_outputs(p, false);
    run_kernels(p, o);
    const auto out = bad_rows(o.out), dq = bad_rows(o.dq), dk = bad_rows(o.dk), dv = bad_rows(o.dv);
    const auto lse = dense(o.lse);
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads_q; ++h)
        for (int64_t i = 0; i < c.seqlen_q; ++i) {
          const bool hit = b == 0 && h == 1 && i == 5;
          EXPECT_EQ(out[b][i][h], hit) << dtype_name(t) << " out b" << b << " i" << i << " h" << h;
          EXPECT_EQ(dq[b][i][h], hit) << dtype_name(t) << " dq b" << b << " i" << i << " h" << h;
          EXPECT_EQ(std::isnan(lse[static_cast<size_t>((b * c.heads_q + h) * c.seqlen_q + i)]), hit);
        }
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t j = 0; j < c.seqlen_k; ++j)
        for (int64_t h = 0; h < c.heads_kv; ++h) {
          if (b == 1 || h == 1) {
            EXPECT_FALSE(dk[b][j][h]) << dtype_name(t) << " dk b" << b << " j" << j << " h" << h;
            EXPECT_FALSE(dv[b][j][h]) << dtype_name(t) << " dv b" << b << " j" << j << " h" << h;
          }
        }

    Problem p2 = make_problem(c);
    write(p2.k.view, at(p2.k.view, 0, 9, 0, 0), INFINITY);
    Outputs o2 = make_outputs(p2, false);
    run_kernels(p2, o2);
    const auto out2 = bad_rows(o2.out), dq2 = bad_rows(o2.dq), dk2 = bad_rows(o2.dk);
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = 0; i < c.seqlen_q; ++i)
        for (int64_t h = 0; h < c.heads_q; ++h)
          if (b == 1 || h >= 2) {
            EXPECT_FALSE(out2[b][i][h]) << dtype_name(t) << " inf k: out b" << b << " i" << i << " h" << h;
            EXPECT_FALSE(dq2[b][i][h]) << dtype_name(t) << " inf k: dq b" << b << " i" << i << " h" << h;
          }
    for (int64_t j = 0; j < c.seqlen_k; ++j) {
      EXPECT_FALSE(dk2[1][j][0] || dk2[1][j][1] || dk2[0][j][1]) << dtype_name(t) << " inf k: dk j" << j;
    }
  }
}

}  // namespace
}  // namespace flashgrad::testing
