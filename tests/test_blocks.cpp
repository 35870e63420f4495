// Options::block and merge(): an attention computed as a grid of blocks (the
// way ring attention and chunked prefill split it) must meet the same
// tolerance rule against the f64 reference of the whole as one call does.
// Forward: each query block merges its key blocks' (out, lse) in f32.
// Backward: each block gets the whole's out and lse; dQ sums over key blocks,
// dK and dV over query blocks. Sinks go to one block per row (the first key
// block), and dbias blocks are disjoint.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "harness.hpp"

namespace flashgrad::testing {
namespace {

struct Grid {
  std::vector<int64_t> q_cuts, k_cuts;  // block boundaries, from 0 to seqlen
};

DType acc_dtype(DType storage) { return storage == DType::f64 ? DType::f64 : DType::f32; }

std::vector<int64_t> dims(const TensorView& v) { return {v.shape, v.shape + v.ndim}; }

// bias/mask: a dimension of size 1 broadcasts, so every block sees it whole.
TensorView bcast_slice(const TensorView& v, int dim, int64_t start, int64_t len) {
  return v.shape[dim] == 1 ? v : slice(v, dim, start, len);
}

// The options of block (qi, kj): offsets into the whole, and the bias/mask/dbias slices.
Options block_options(const Problem& p, int64_t q0, int64_t nq, int64_t k0, int64_t nk, bool first_key_block) {
  Options o = p.opts;
  o.block = Options::Block{q0, k0, p.c.seqlen_q, p.c.seqlen_k};
  if (o.bias) o.bias = bcast_slice(bcast_slice(*o.bias, 2, q0, nq), 3, k0, nk);
  if (o.mask) o.mask = bcast_slice(bcast_slice(*o.mask, 2, q0, nq), 3, k0, nk);
  if (!first_key_block) o.sinks.reset();
  return o;
}

void run_blocked(const Problem& p, Outputs& o, const Grid& g) {
  const Case& c = p.c;
  const DType acc = acc_dtype(c.dtype);
  const auto& qc = g.q_cuts;
  const auto& kc = g.k_cuts;
  for (size_t qi = 0; qi + 1 < qc.size(); ++qi) {
    const int64_t q0 = qc[qi], nq = qc[qi + 1] - q0;
    Buffer o_acc = contiguous(acc, {c.batch, nq, c.heads_q, c.head_dim_v});
    Buffer lse_acc = contiguous(acc, {c.batch, c.heads_q, nq});
    for (int64_t x : offsets(lse_acc.view)) write(lse_acc.view, x, -std::numeric_limits<double>::infinity());
    for (size_t kj = 0; kj + 1 < kc.size(); ++kj) {
      const int64_t k0 = kc[kj], nk = kc[kj + 1] - k0;
      Buffer part = contiguous(acc, dims(o_acc.view)), lse_part = contiguous(acc, dims(lse_acc.view));
      forward(block_options(p, q0, nq, k0, nk, kj == 0), slice(p.q.view, 1, q0, nq), slice(p.k.view, 1, k0, nk),
              slice(p.v.view, 1, k0, nk), part.view, lse_part.view);
      merge(o_acc.view, lse_acc.view, part.view, lse_part.view);
    }
    copy_values(o_acc.view, slice(o.out.view, 1, q0, nq));
    copy_values(lse_acc.view, slice(o.lse.view, 2, q0, nq));
  }

  Buffer dq = contiguous(acc, dims(o.dq.view)), dk = contiguous(acc, dims(o.dk.view));
  Buffer dv = contiguous(acc, dims(o.dv.view));
  Buffer dsinks = contiguous(acc, {c.heads_q});
  for (size_t qi = 0; qi + 1 < qc.size(); ++qi) {
    const int64_t q0 = qc[qi], nq = qc[qi + 1] - q0;
    for (size_t kj = 0; kj + 1 < kc.size(); ++kj) {
      const int64_t k0 = kc[kj], nk = kc[kj + 1] - k0;
      const Options opts = block_options(p, q0, nq, k0, nk, kj == 0);
      Buffer pq = contiguous(acc, dims(slice(p.q.view, 1, q0, nq)));
      Buffer pk = contiguous(acc, dims(slice(p.k.view, 1, k0, nk)));
      Buffer pv = contiguous(acc, dims(slice(p.v.view, 1, k0, nk)));
      Buffer ps = contiguous(acc, {c.heads_q});
      Grads gr{pq.view, pk.view, pv.view, std::nullopt, std::nullopt};
      if (o.dsinks.present() && opts.sinks) gr.dsinks = ps.view;
      if (o.dbias.present()) gr.dbias = slice(slice(o.dbias.view, 2, q0, nq), 3, k0, nk);
      backward(opts, slice(p.q.view, 1, q0, nq), slice(p.k.view, 1, k0, nk), slice(p.v.view, 1, k0, nk),
               slice(o.out.view, 1, q0, nq), slice(o.lse.view, 2, q0, nq), slice(p.dout.view, 1, q0, nq), gr);
      add_values(pq.view, slice(dq.view, 1, q0, nq));
      add_values(pk.view, slice(dk.view, 1, k0, nk));
      add_values(pv.view, slice(dv.view, 1, k0, nk));
      if (gr.dsinks) add_values(ps.view, dsinks.view);
    }
  }
  copy_values(dq.view, o.dq.view);
  copy_values(dk.view, o.dk.view);
  copy_values(dv.view, o.dv.view);
  if (o.dsinks.present()) copy_values(dsinks.view, o.dsinks.view);
}

class Blocks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* isa = forced_isa_missing()) GTEST_SKIP() << "this CPU lacks " << isa;
  }
};

Case base(DType t) {
  Case c;
  c.name = "blocks";
  c.dtype = t;
  c.batch = 2;
  c.seqlen_q = 70;
  c.seqlen_k = 101;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 24;
  c.head_dim_v = 16;
  return c;
}

void expect_blocked_pass(const Case& c, const Grid& g) {
  const Problem p = make_problem(c);
  Outputs o = make_outputs(p, false);
  run_blocked(p, o, g);
  const Report r = compare_with_reference(p, o);
  EXPECT_TRUE(r.pass()) << c.describe() << " on " << isa_name() << "\n" << r.table();
}

const Grid kGrid{{0, 30, 70}, {0, 17, 64, 101}};

TEST_F(Blocks, EveryFeatureThatDependsOnPosition) {
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    Case c = base(t);
    expect_blocked_pass(c, kGrid);
    c.causal = true;
    expect_blocked_pass(c, kGrid);
    c.window_left = 20;
    c.window_right = 5;
    c.alibi = true;
    expect_blocked_pass(c, kGrid);
  }
}

TEST_F(Blocks, SinksSoftcapDropoutMasksAndBias) {
  for (DType t : {DType::f32, DType::f16}) {
    Case c = base(t);
    c.causal = true;
    c.sinks = true;
    c.softcap = 5;
    expect_blocked_pass(c, kGrid);
    c.dropout_p = 0.2;
    expect_blocked_pass(c, kGrid);
    c.dropout_p = 0;
    c.mask = MaskKind::key_padding;
    c.bias = BiasKind::full;
    c.dbias = true;
    expect_blocked_pass(c, kGrid);
  }
}

// Query blocks below the key blocks' diagonal see no key at all: their merge
// must leave lse = -inf and out = 0, and a block of one row or key must work.
TEST_F(Blocks, EmptyAndSingleRowBlocks) {
  Case c = base(DType::f32);
  c.seqlen_q = 101;
  c.causal = true;
  c.window_left = 3;
  c.window_right = 0;
  expect_blocked_pass(c, Grid{{0, 1, 50, 101}, {0, 1, 2, 64, 100, 101}});
}

}  // namespace
}  // namespace flashgrad::testing
