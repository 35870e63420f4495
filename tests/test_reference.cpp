// The reference is the oracle, so it is checked first, against nothing but
// calculus: central finite differences of loss = sum(out * dout) in f64.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <cmath>
#include <vector>

#include "harness.hpp"
#include "reference.hpp"

namespace flashgrad::testing {
namespace {

using reference::Precision;

double loss(const Problem& p) {
  Outputs o = make_outputs(p, true);
  run_reference(p, o, Precision::f64, false);
  const auto out = dense(o.out), g = dense(p.dout);
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * g[i];
  return s;
}

// Compares every element's analytic gradient with (loss(x + h) - loss(x - h)) / 2h.
// f32 inputs (sinks, bias) are perturbed by h = 2^-7 around values on a 2^-10
// grid, so that x +- h is exact in f32; their truncation error is O(h^2).
void check_gradient(Problem& p, const TensorView& x, const Buffer& grad, double h, double tol,
                    const char* name) {
  const auto g = dense(grad);
  const auto offs = offsets(x);
  ASSERT_EQ(g.size(), offs.size()) << name;
  for (size_t i = 0; i < offs.size(); ++i) {
    const double x0 = read(x, offs[i]);
    write(x, offs[i], x0 + h);
    const double up = loss(p);
    write(x, offs[i], x0 - h);
    const double down = loss(p);
    write(x, offs[i], x0);
    const double fd = (up - down) / (2 * h);
    EXPECT_NEAR(g[i], fd, tol * (1 + std::fabs(fd))) << name << "[" << i << "] of " << p.c.describe();
  }
}

void snap_to_grid(const Buffer& b) {
  for (int64_t off : offsets(b.view)) write(b.view, off, std::ldexp(std::round(std::ldexp(read(b.view, off), 10)), -10));
}

void check_all(const Case& c) {
  Problem p = make_problem(c);
  if (p.sinks.present()) snap_to_grid(p.sinks);
  if (p.bias.present()) snap_to_grid(p.bias);
  Outputs o = make_outputs(p, true);
  run_reference(p, o, Precision::f64, true);
  check_gradient(p, p.q.view, o.dq, 1e-6, 1e-7, "dq");
  check_gradient(p, p.k.view, o.dk, 1e-6, 1e-7, "dk");
  check_gradient(p, p.v.view, o.dv, 1e-6, 1e-7, "dv");
  if (p.sinks.present()) check_gradient(p, p.sinks.view, o.dsinks, 1.0 / 128, 1e-4, "dsinks");
  if (p.bias.present() && o.dbias.present()) check_gradient(p, p.bias.view, o.dbias, 1.0 / 128, 1e-4, "dbias");
}

Case small(const char* name) {
  Case c;
  c.name = name;
  c.dtype = DType::f64;
  c.batch = 2;
  c.seqlen_q = 3;
  c.seqlen_k = 5;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 4;
  c.head_dim_v = 3;
  return c;
}

TEST(ReferenceFiniteDifferences, Plain) { check_all(small("plain")); }

TEST(ReferenceFiniteDifferences, CausalBottomRight) {
  Case c = small("causal");
  c.causal = true;
  check_all(c);
}

TEST(ReferenceFiniteDifferences, WindowAlibiMask) {
  Case c = small("window");
  c.window_left = 1;
  c.window_right = 1;
  c.alibi = true;
  c.mask = MaskKind::full;
  check_all(c);
}

TEST(ReferenceFiniteDifferences, Softcap) {
  Case c = small("softcap");
  c.softcap = 1.5;
  c.input_scale = 2.0;
  check_all(c);
}

TEST(ReferenceFiniteDifferences, Sinks) {
  Case c = small("sinks");
  c.sinks = true;
  c.causal = true;
  check_all(c);
}

TEST(ReferenceFiniteDifferences, BiasBroadcastOverHeads) {
  Case c = small("bias");
  c.bias = BiasKind::bcast_heads;
  c.dbias = true;
  check_all(c);
}

TEST(ReferenceFiniteDifferences, BiasFull) {
  Case c = small("bias_full");
  c.bias = BiasKind::full;
  c.dbias = true;
  c.softcap = 2.0;
  check_all(c);
}

TEST(ReferenceFiniteDifferences, DropoutWithFixedSeed) {
  Case c = small("dropout");
  c.dropout_p = 0.3;
  check_all(c);
}

TEST(ReferenceFiniteDifferences, VarlenWithEmptySequence) {
  Case c = small("varlen");
  c.seqlens_q = {2, 0, 3};
  c.seqlens_k = {4, 2, 1};
  c.causal = true;
  check_all(c);
}

TEST(ReferenceFiniteDifferences, FullyMaskedRowsHaveZeroGradient) {
  Case c = small("masked");
  c.seqlen_q = 4;
  c.seqlen_k = 2;
  c.causal = true;  // rows 0 and 1 see no key
  Problem p = make_problem(c);
  Outputs o = make_outputs(p, true);
  run_reference(p, o, Precision::f64, true);
  const auto lse = dense(o.lse), dq = dense(o.dq);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < 2; ++i) {
        EXPECT_EQ(lse[static_cast<size_t>((b * c.heads_q + h) * c.seqlen_q + i)], -INFINITY);
        for (int64_t x = 0; x < c.head_dim; ++x)
          EXPECT_EQ(dq[static_cast<size_t>(((b * c.seqlen_q + i) * c.heads_q + h) * c.head_dim + x)], 0.0);
      }
  check_all(c);
}


// backward's ForwardOutputs are forward's, to the bit, in every precision.
TEST(ReferenceForwardOutputs, BackwardStoresWhatForwardComputes) {
  Case c = small("also");
  c.causal = true;
  c.softcap = 5;
  c.sinks = true;
  for (DType t : {DType::f64, DType::f32, DType::bf16})
    for (Precision prec : {Precision::f64, Precision::storage, Precision::storage_reversed, Precision::storage_fused,
                           Precision::storage_softmax}) {
      c.dtype = t;
      const Problem p = make_problem(c);
      Outputs fwd = make_outputs(p, true), both = make_outputs(p, true);
      reference::forward(p.opts, p.q.view, p.k.view, p.v.view, fwd.out.view, fwd.lse.view, prec);
      run_reference(p, both, prec, true);
      EXPECT_EQ(dense(fwd.out), dense(both.out)) << dtype_name(t) << " " << static_cast<int>(prec);
      EXPECT_EQ(dense(fwd.lse), dense(both.lse)) << dtype_name(t) << " " << static_cast<int>(prec);
    }
}

// Bound::verdict stops computing the bound once every output passes; its
// verdict must be full's whatever the kernel's error. Each output in turn is
// pushed off by multiples of its full bound, from passing to failing.
TEST(ToleranceRuleStages, VerdictMatchesFull) {
  std::vector<Case> cases;
  for (DType t : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    Case c = small("stages");
    c.dtype = t;
    c.seqlen_q = 7;
    c.seqlen_k = 9;
    c.head_dim = c.head_dim_v = 8;
    c.softcap = t == DType::f32 ? 3 : 0;
    c.sinks = t == DType::f64;
    c.bias = t == DType::bf16 ? BiasKind::full : BiasKind::none;
    c.dbias = c.bias != BiasKind::none;
    cases.push_back(c);
  }
  int failing = 0;
  for (const Case& c : cases) {
    const Problem p = make_problem(c);
    Outputs o = make_outputs(p, false);
    run_kernels(p, o, true);
    const Report full = compare_with_reference(p, o, true, Bound::full);
    ASSERT_TRUE(full.complete);
    ASSERT_TRUE(full.pass()) << full.table();
    const std::pair<const char*, Buffer*> bufs[] = {{"out", &o.out}, {"lse", &o.lse},   {"dq", &o.dq},
                                                    {"dk", &o.dk},   {"dv", &o.dv},     {"dsinks", &o.dsinks},
                                                    {"dbias", &o.dbias}};
    for (auto [name, b] : bufs) {
      if (!b->present()) continue;
      const int64_t off = offsets(b->view).front();
      const double x0 = read(b->view, off);
      double bound = 0;
      for (const auto& t : full.tensors)
        if (t.name == name) bound = t.bound();
      for (double factor : {0.25, 0.9, 1.1, 2.0, 8.0}) {
        write(b->view, off, x0 + factor * bound);
        const Report f = compare_with_reference(p, o, true, Bound::full);
        const Report v = compare_with_reference(p, o, true, Bound::verdict);
        EXPECT_EQ(f.pass(), v.pass()) << c.describe() << " factor " << factor << "\n" << f.table() << v.table();
        if (!v.pass()) {
          EXPECT_TRUE(v.complete);
        }
        failing += f.pass() ? 0 : 1;
      }
      write(b->view, off, x0);
    }
  }
  EXPECT_GT(failing, 10);  // the perturbations reach failing outputs
}

}  // namespace
}  // namespace flashgrad::testing
