// Kernels against the f64 reference under the tolerance rule (harness.hpp),
// for O, lse, dQ, dK, dV, dsinks and dbias separately, on every ISA this CPU
// supports, or the one FLASHGRAD_ISA forces (a path the CPU lacks skips).
// Each case runs on every path in turn in one process (ScopedIsa), so that its
// references, which take nearly all of the time, are computed once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "dispatch.hpp"
#include "harness.hpp"
#include "parallel.hpp"
#include "tiling.hpp"

namespace flashgrad::testing {
namespace {

void expect_pass_on(const std::vector<Isa>& isas, const Case& c, bool backward = true) {
  const std::vector<Report> rs = check_case_on(c, isas, backward);
  for (size_t i = 0; i < isas.size(); ++i)
    EXPECT_TRUE(rs[i].pass()) << c.name << ": " << c.describe() << " on " << isa_to_string(isas[i]) << "\n"
                              << rs[i].table();
}

void expect_pass(const Case& c, bool backward = true) { expect_pass_on(isas_under_test(), c, backward); }

Case base(DType t = DType::f32) {
  Case c;
  c.dtype = t;
  c.batch = 2;
  c.seqlen_q = 33;
  c.seqlen_k = 129;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 40;
  c.head_dim_v = 24;
  return c;
}

std::string dtype_label(DType t) { return dtype_name(t); }

class Kernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* isa = forced_isa_missing()) GTEST_SKIP() << "this CPU lacks " << isa;
  }
};

// Every (Lq, Lk) pair with Lq != Lk, causal and not: block edges below, at
// and above the 64-wide tiles, and Lq > Lk (causal rows with no key).
TEST_F(Kernels, SequenceLengthPairs) {
  for (int64_t lq : {1, 7, 8, 33, 128, 300})
    for (int64_t lk : {1, 8, 31, 129, 512}) {
      if (lq == lk) continue;
      for (bool causal : {false, true}) {
        Case c = base();
        c.batch = 1;
        c.heads_q = 2;
        c.heads_kv = 1;
        c.head_dim = 16;
        c.head_dim_v = 8;
        c.seqlen_q = lq;
        c.seqlen_k = lk;
        c.causal = causal;
        c.name = "lengths";
        expect_pass(c);
      }
    }
}

TEST_F(Kernels, HeadDims) {
  const std::vector<std::pair<int64_t, int64_t>> dims = {{8, 8},     {40, 40},   {64, 64},  {96, 96},
                                                         {128, 128}, {192, 128}, {256, 256}, {512, 512}};
  for (auto [d, dv] : dims)
    for (DType t : {DType::f32, DType::bf16}) {
      Case c = base(t);
      c.batch = 1;
      c.seqlen_q = d >= 256 ? 17 : 33;
      c.seqlen_k = d >= 256 ? 70 : 129;
      c.head_dim = d;
      c.head_dim_v = dv;
      c.causal = d % 128 == 0;
      c.name = "head_dim_" + std::to_string(d) + "_" + dtype_label(t);
      expect_pass(c);
    }
}

TEST_F(Kernels, GroupedQueryRatios) {
  for (int64_t ratio : {1, 4, 8, 16})
    for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
      Case c = base(t);
      c.batch = 1;
      c.heads_kv = ratio == 16 ? 1 : 2;
      c.heads_q = c.heads_kv * ratio;
      c.seqlen_q = 31;
      c.seqlen_k = 70;
      c.causal = ratio % 8 == 0;
      c.name = "gqa_" + std::to_string(ratio) + "_" + dtype_label(t);
      expect_pass(c);
    }
}

// Each feature alone, in every dtype.
// Short queries (decode, speculative decoding) split the keys into runs of
// kSplitKeys merged at the end: splits that end mid-tile, splits a causal or
// window mask empties, sinks merged after the splits, and every query head of
// a GQA group stacked into one tile.
TEST_F(Kernels, ShortQueriesSplitTheKeys) {
  for (auto [lq, t] : {std::pair{int64_t{1}, DType::f32}, std::pair{int64_t{16}, DType::f32},
                      std::pair{int64_t{5}, DType::bf16}}) {
    Case c = base(t);
    c.batch = 1;
    c.seqlen_q = lq;
    c.seqlen_k = 2 * 2048 + 37;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = 16;
    c.head_dim_v = 8;
    c.name = "split_keys_" + std::to_string(lq);
    expect_pass(c);
    c.softcap = 2.5;
    c.input_scale = 3.0;
    expect_pass(c);
    c.softcap = 0.0;
    c.input_scale = 1.0;
    c.causal = true;
    c.sinks = true;
    c.window_left = 2000;  // the first split sees no key
    expect_pass(c);
    c.window_left = -1;
    c.dropout_p = 0.2;
    c.alibi = true;
    c.mask = MaskKind::key_padding;
    expect_pass(c);
  }
  Case v = base(DType::f16);
  v.seqlens_q = {1, 16, 0};
  v.seqlens_k = {4100, 100, 3000};
  v.heads_q = 3;
  v.heads_kv = 1;
  v.head_dim = v.head_dim_v = 8;
  v.sinks = true;
  v.name = "split_keys_varlen";
  expect_pass(v);
}

// Keys of short queries as tiling.hpp splits them, with p's shapes.
int64_t split_length_of(const Case& c) {
  const Problem p = make_problem(c);
  return split_length(make_params("test_kernels", CallKind::workspace, p.opts,
                                  CallTensors{&p.q.view, &p.k.view, &p.v.view}));
}

// Fewer keys than kSplitKeys still split in two where the K/V heads' rows
// lie side by side ([batch, seq, heads, dim]), into runs of equal length;
// [batch, heads, seq, dim] does not split them.
TEST_F(Kernels, ShortQueriesSplitFewKeysWhereHeadRowsLieSideBySide) {
  for (auto [lq, t] : {std::pair{int64_t{1}, DType::f32}, std::pair{int64_t{16}, DType::f32},
                      std::pair{int64_t{5}, DType::bf16}}) {
    Case c = base(t);
    c.batch = 2;
    c.seqlen_q = lq;
    c.seqlen_k = 300;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = 32;
    c.head_dim_v = 16;
    c.name = "split_few_keys_" + std::to_string(lq);
    for (Layout layout : {Layout::bshd, Layout::bhsd}) {
      c.layout = layout;
      ASSERT_EQ(split_length_of(c), layout == Layout::bshd ? 192 : 300) << c.describe();
    }
    c.layout = Layout::bshd;
    expect_pass(c);
    c.causal = true;
    c.window_left = 80;  // the first run sees no key
    c.sinks = true;
    c.softcap = 2.5;
    expect_pass(c);
  }
}

// A call with one K/V head (one task otherwise) splits from 512 keys, in
// either layout.
TEST_F(Kernels, ShortQueriesSplitTheKeysOfOneKvHead) {
  for (DType t : {DType::f32, DType::bf16}) {
    Case c = base(t);
    c.batch = 1;
    c.seqlen_q = 2;
    c.heads_q = 4;
    c.heads_kv = 1;
    c.head_dim = 24;
    c.head_dim_v = 40;
    c.name = "split_one_kv_head";
    for (Layout layout : {Layout::bshd, Layout::bhsd}) {
      c.layout = layout;
      c.seqlen_k = 300;
      ASSERT_EQ(split_length_of(c), 300) << c.describe();
      c.seqlen_k = 600;
      ASSERT_EQ(split_length_of(c), 320) << c.describe();
      expect_pass(c);
    }
    c.causal = true;
    c.window_left = 250;  // the first run sees no key
    c.sinks = true;
    expect_pass(c);
  }
}

// Query tiles of one to four rows (decode: Lq = 1, MHA or 2-4 query heads
// per K/V head) read V rows in place when dv is a multiple of 32; K rows
// with d = 64 are transposed where they lie, the last Lk mod 16 through
// staging. On avx2 3 and 4 rows take the narrow tiles (the last case with
// dropout drawn on P^T's columns), 1 and 2 rows whole rows.
TEST_F(Kernels, DecodeReadsValueRowsInPlace) {
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (int64_t group : {1, 2, 3, 4})
      for (int64_t lk : {int64_t{301}, int64_t{2 * 2048 + 37}}) {
        if (group > 2 && lk > 301) continue;  // the split keys as at 1 and 2 rows
        Case c = base(t);
        c.batch = 2;
        c.seqlen_q = 1;
        c.seqlen_k = lk;
        c.heads_kv = 2;
        c.heads_q = 2 * group;
        c.head_dim = 64;
        c.head_dim_v = 32;
        c.name = "decode_in_place_" + dtype_label(t) + "_g" + std::to_string(group) + "_lk" + std::to_string(lk);
        expect_pass(c);
        // A head's rows contiguous: its K/V heads one after another, and
        // the whole-row products' prefetch (forward_paths.inl, heads_outer).
        c.layout = Layout::bhsd;
        c.name += "_bhsd";
        expect_pass(c);
        c.layout = Layout::bshd;
        c.causal = true;
        c.sinks = true;
        c.dropout_p = 0.1;
        c.alibi = true;
        c.mask = MaskKind::key_padding;
        expect_pass(c);
      }
}

// Decode with the K/V heads of [batch, seq, heads, dim] side by side: a
// task of split keys reads each K and V row through all its heads, 8 or 16
// heads per call (forward_paths.inl, heads_across), one or three stacked rows per
// K/V head (three take the narrow tiles on avx2); dv = 48 and 160 leave part
// of a row's vector blocks to the one-vector tail, and d = 40 part of K's
// row to the tail after bf16 K's pairs of 16 elements on avx2. Forward
// only: the backward's tiles are DecodeReadsValueRowsInPlace's.
TEST_F(Kernels, DecodeReadsRowsAcrossHeads) {
  for (DType t : {DType::f32, DType::bf16})
    for (auto [heads_kv, d] : {std::pair{int64_t{8}, int64_t{64}}, std::pair{int64_t{8}, int64_t{40}},
                               std::pair{int64_t{16}, int64_t{32}}})
      for (int64_t group : {1, 3}) {
        Case c = base(t);
        c.batch = 1;
        c.seqlen_q = 1;
        c.seqlen_k = 2048 + 37;
        c.heads_kv = heads_kv;
        c.heads_q = heads_kv * group;
        c.head_dim = d;
        c.head_dim_v = heads_kv == 16 ? 48 : 160;
        c.name = "decode_across_" + dtype_label(t) + "_h" + std::to_string(heads_kv) + "_d" + std::to_string(d) +
                 "_g" + std::to_string(group);
        expect_pass(c, false);
        c.causal = true;
        c.sinks = true;
        c.dropout_p = 0.1;
        c.alibi = true;
        c.mask = MaskKind::key_padding;
        c.softcap = 3.0;
        expect_pass(c, false);
      }
}

// Tiles of 32 or more stacked query rows, and narrow tiles (8 to 31 rows on
// avx512, 3 to 32 on avx2, one to four vectors wide; two query heads per K/V
// head here: 80, 13, 11 and 5 rows give 160, 26, 22 and 10), that
// only the causal or window ranges cut take keys-major scores (forward_keys_major.inl).
// Logits near 1e4 (q, k ~ N(0, 100^2)) and a scale that is no power of two
// make any difference between those scores and the backward's recomputed
// ones show in dQ, dK and dV: exp(S - lse) moves by the difference times
// 1e4 / ulp. (bf16 on avx512bf16 runs the calls of 32 or more stacked
// rows on dot products in both passes, dot_call, and the others on the f32
// tiles in both.)
TEST_F(Kernels, KeysMajorScoresMatchTheBackwardsRecompute) {
  for (DType t : {DType::f32, DType::bf16})
    for (auto [lq, d] : {std::pair{int64_t{80}, int64_t{64}}, std::pair{int64_t{80}, int64_t{40}},
                         std::pair{int64_t{13}, int64_t{64}}, std::pair{int64_t{11}, int64_t{40}},
                         std::pair{int64_t{5}, int64_t{40}}}) {
      Case c = base(t);
      c.seqlen_q = lq;
      c.seqlen_k = 150;
      c.head_dim = d;
      c.input_scale = 100.0;
      c.softmax_scale = 0.3;
      c.name = "keys_major_" + dtype_label(t) + "_lq" + std::to_string(lq) + "_d" + std::to_string(d);
      expect_pass(c);
      c.causal = true;
      expect_pass(c);
      // Capped logits of the same order (tanh near 0.8 at the largest): the
      // capped scores too must be the backward's bit for bit.
      c.softcap = 2e4;
      expect_pass(c);
      // ALiBi terms of the same order, slopes no power of two (so that the
      // product rounds) and one per query head of the stack.
      c.softcap = 0.0;
      c.alibi = true;
      c.alibi_scale = 300.7;
      expect_pass(c);
      // A bias of order 1e3 after ALiBi: added in another order, or
      // converted otherwise, the sums round differently. Then one bf16
      // bias plane for all heads, and one row for all query rows.
      c.bias = BiasKind::full;
      c.bias_scale = 1000.0;
      expect_pass(c);
      c.causal = false;
      c.alibi = false;
      c.bias = BiasKind::bcast_heads;
      c.bias_dtype = DType::bf16;
      expect_pass(c);
      c.bias = BiasKind::key_row;
      c.bias_dtype = DType::f32;
      c.alibi = true;
      expect_pass(c);
      // A random mask per head on top, then with the causal ranges.
      c.mask = MaskKind::bcast_batch;
      expect_pass(c);
      c.causal = true;
      expect_pass(c);
      c.causal = false;
      c.mask = MaskKind::none;
      c.alibi = false;
      c.bias = BiasKind::none;
      c.window_left = 37;
      c.window_right = 5;
      expect_pass(c);
      // At lq = 80 the left edge falls one key inside the tile at key 64 for
      // the last row of the first 16-row block alone (15 + 70 - 20 = 65):
      // the block must still mask, though its other rows see the tile whole.
      // Logits of order 1 here, so that the one key wrongly kept would count.
      c.window_left = 20;
      c.window_right = -1;
      c.input_scale = 1.0;
      expect_pass(c);
    }
}

// Narrow tiles of more than 32 stacked rows on avx2 run in chunks of 32
// query rows over each K/V tile, for tasks that walk 2048 keys or more
// (forward_narrow.inl, narrow_chunks): 20 and 45 rows over two query heads per K/V
// head give 40 (32 + 8) and 90 (32 + 32 + 26). Logits near 1e4 as above,
// so any difference between a chunk's scores and the backward's shows.
TEST_F(Kernels, NarrowChunksMatchTheBackwardsRecompute) {
  for (DType t : {DType::f32, DType::bf16})
    for (int64_t lq : {20, 45}) {
      Case c = base(t);
      c.batch = 1;
      c.seqlen_q = lq;
      c.seqlen_k = 2048 + 37;
      c.head_dim = 40;
      c.input_scale = 100.0;
      c.softmax_scale = 0.3;
      c.name = "narrow_chunks_" + dtype_label(t) + "_lq" + std::to_string(lq);
      expect_pass(c);
      c.causal = true;
      c.softcap = 2e4;
      expect_pass(c);
      c.softcap = 0.0;
      // ALiBi with a slope per query head, a bias and a mask, at three
      // chunks (each reads its own columns' slopes, positions, bias and
      // mask rows).
      if (lq == 45) {
        c.alibi = true;
        c.alibi_scale = 10.3;
        c.bias = BiasKind::full;
        c.bias_scale = 1000.0;
        c.mask = MaskKind::full;
        expect_pass(c);
        c.alibi = false;
        c.bias = BiasKind::none;
        c.mask = MaskKind::none;
      }
      c.causal = false;
      c.window_left = 1000;
      c.window_right = 3;
      expect_pass(c);
      // Logits of order 1 and rows that see 21 keys each: a chunk's rows
      // masked with another chunk's ranges would show.
      c.window_left = 20;
      c.window_right = 0;
      c.input_scale = 1.0;
      expect_pass(c);
    }
}

TEST_F(Kernels, FeaturesAlonePerDtype) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    std::vector<Case> cs;
    Case c = base(t);
    c.causal = true; cs.push_back(c);
    c = base(t); c.window_left = 7; c.window_right = 2; cs.push_back(c);
    c = base(t); c.window_left = 0; c.window_right = 0; cs.push_back(c);
    c = base(t); c.softcap = 2.5; c.input_scale = 3.0; cs.push_back(c);
    c = base(t); c.alibi = true; cs.push_back(c);
    c = base(t); c.bias = BiasKind::full; c.dbias = true; cs.push_back(c);
    c.bias_dtype = DType::f64; cs.push_back(c);
    c = base(t); c.bias = BiasKind::bcast_batch; c.bias_dtype = DType::bf16; c.dbias = true; cs.push_back(c);
    c = base(t); c.bias = BiasKind::bcast_heads; c.bias_dtype = DType::f16; c.dbias = true; cs.push_back(c);
    c = base(t); c.bias = BiasKind::key_row; cs.push_back(c);
    c = base(t); c.mask = MaskKind::full; cs.push_back(c);
    c = base(t); c.mask = MaskKind::bcast_batch; cs.push_back(c);
    c = base(t); c.mask = MaskKind::key_padding; cs.push_back(c);
    c = base(t); c.sinks = true; cs.push_back(c);
    c = base(t); c.dropout_p = 0.25; cs.push_back(c);
    c = base(t); c.layout = Layout::bhsd; cs.push_back(c);
    c = base(t); c.layout = Layout::padded; cs.push_back(c);
    c = base(t); c.softmax_scale = 0.3; cs.push_back(c);
    c = base(t); c.seqlens_q = {5, 0, 70, 1}; c.seqlens_k = {9, 4, 130, 0}; cs.push_back(c);
    for (auto& x : cs) {
      x.name = "feature_" + dtype_label(t);
      expect_pass(x);
    }
  }
}

TEST_F(Kernels, FeaturesCombined) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    Case c = base(t);
    c.causal = true;
    c.window_left = 20;
    c.softcap = 4.0;
    c.alibi = true;
    c.bias = BiasKind::bcast_heads;
    c.dbias = true;
    c.mask = MaskKind::key_padding;
    c.sinks = true;
    c.dropout_p = 0.1;
    c.layout = Layout::bhsd;
    c.name = "combined_" + dtype_label(t);
    expect_pass(c);
    c.seqlens_q = {40, 0, 3};
    c.seqlens_k = {100, 7, 0};
    c.layout = Layout::padded;
    c.bias = BiasKind::full;
    c.name = "combined_varlen_" + dtype_label(t);
    expect_pass(c);
  }
}

TEST_F(Kernels, EdgeCases) {
  for (const Case& c : edge_cases()) expect_pass(c);
}

TEST_F(Kernels, RandomCases) {
  for (uint64_t seed = 0; seed < 40; ++seed) expect_pass(random_case(seed));
}

// Rows that see no key: out = 0, lse = -inf (the sink with sinks), grads 0.
TEST_F(Kernels, FullyMaskedRowsAreZeroNotNan) {
  for (Isa isa : isas_under_test()) {
    const ScopedIsa on(isa);
    SCOPED_TRACE(isa_to_string(isa));
    for (bool sinks : {false, true}) {
      Case c = base();
      c.seqlen_q = 40;
      c.seqlen_k = 8;
      c.causal = true;  // rows i < 32 see nothing
      c.sinks = sinks;
      Problem p = make_problem(c);
      Outputs o = make_outputs(p, false);
      run_kernels(p, o);
      const auto out = dense(o.out), lse = dense(o.lse), dq = dense(o.dq), sk = dense(p.sinks);
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t h = 0; h < c.heads_q; ++h)
          for (int64_t i = 0; i < 32; ++i) {
            const double l = lse[static_cast<size_t>((b * c.heads_q + h) * c.seqlen_q + i)];
            if (sinks)
              EXPECT_FLOAT_EQ(l, sk[static_cast<size_t>(h)]);
            else
              EXPECT_EQ(l, -INFINITY);
            for (int64_t x = 0; x < c.head_dim_v; ++x)
              EXPECT_EQ(out[static_cast<size_t>(((b * c.seqlen_q + i) * c.heads_q + h) * c.head_dim_v + x)], 0.0);
            for (int64_t x = 0; x < c.head_dim; ++x)
              EXPECT_EQ(dq[static_cast<size_t>(((b * c.seqlen_q + i) * c.heads_q + h) * c.head_dim + x)], 0.0);
          }
    }
  }
}

// Strided outputs: nothing is written into the gaps between a view's elements.
TEST_F(Kernels, PaddedOutputsKeepTheirGaps) {
  Case c = base(DType::bf16);
  c.layout = Layout::padded;
  Problem p = make_problem(c);
  for (Isa isa : isas_under_test()) {
    const ScopedIsa on(isa);
    Outputs o = make_outputs(p, false);
    run_kernels(p, o);
    for (const Buffer* b : {&o.out, &o.dq, &o.dk, &o.dv}) {
      std::vector<char> inside(b->bytes.size(), 0);
      const int64_t es = dtype_size(b->view.dtype);
      for (int64_t off : offsets(b->view))
        for (int64_t x = 0; x < es; ++x) inside[static_cast<size_t>(off * es + x)] = 1;
      for (size_t i = 0; i < b->bytes.size(); ++i)
        if (!inside[i]) {
          ASSERT_EQ(b->bytes[i], 0) << "byte " << i << " outside the view was written on " << isa_to_string(isa);
        }
    }
  }
}

// The dropout mask the kernels apply is the one dropout_keep_mask returns,
// and its keep rate is 1 - p.
TEST_F(Kernels, DropoutMaskMatchesRequestedRate) {
  Options o;
  o.dropout_p = 0.3;
  o.seed = 99;
  std::vector<uint8_t> keep(2 * 3 * 64 * 96);
  dropout_keep_mask(o, 2, 3, 64, 96, TensorView::contiguous(keep.data(), DType::u8, {2, 3, 64, 96}));
  double kept = 0;
  for (uint8_t k : keep) kept += k;
  EXPECT_NEAR(kept / static_cast<double>(keep.size()), 0.7, 0.01);
  std::vector<uint8_t> again(keep.size());
  o.seed = 100;
  dropout_keep_mask(o, 2, 3, 64, 96, TensorView::contiguous(again.data(), DType::u8, {2, 3, 64, 96}));
  EXPECT_NE(keep, again) << "a different seed must give a different mask";
}

// ScopedIsa, which the tests here use to run each path, switches the table
// of the thread that made it, nested scopes restore the one before, and other
// threads keep the process's.
TEST(Dispatch, ScopedIsaSwitchesItsThreadWhileItLives) {
  const Isa before = kernels().isa;
  for (Isa isa : supported_isas()) {
    const ScopedIsa on(isa);
    EXPECT_EQ(kernels().isa, isa);
    EXPECT_STREQ(isa_name(), isa_to_string(isa));
    {
      const ScopedIsa inner(Isa::scalar);
      EXPECT_EQ(kernels().isa, Isa::scalar);
    }
    EXPECT_EQ(kernels().isa, isa);
    Isa other = isa;
    std::thread([&] { other = kernels().isa; }).join();
    EXPECT_EQ(other, before);
  }
  EXPECT_EQ(kernels().isa, before);
}

// Each ISA's dropout decisions (Philox blocks eight at a time on avx2,
// sixteen then eight on the AVX-512 paths, rng.inl) are the portable path's
// bit for bit: row lengths around the 32 and 64 columns of eight and
// sixteen blocks, and a chunk of a longer attention whose first key is not
// a multiple of 4 (its blocks start mid-way).
TEST_F(Kernels, DropoutMaskIsThePortableBits) {
  for (Isa isa : isas_under_test())
    for (int64_t k_offset : {0, 5, 130})
      for (int64_t lk : {1, 7, 9, 31, 32, 33, 41, 63, 64, 65, 97, 100, 129, 257}) {
        AttnParams p;
        p.batch = 2;
        p.heads_q = 3;
        p.seqlen_q = 5;
        p.seqlen_k = lk;
        p.dropout_p = 0.3;
        p.seed = 0x123456789abcdefull;
        p.offset = 0xfedcba9876543ull;
        p.in_block = k_offset > 0;
        p.block_q_offset = 7;
        p.block_k_offset = k_offset;
        const size_t n = static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q * lk);
        std::vector<uint8_t> got(n, 2), want(n, 2);
        kernels_for(isa).dropout_mask(p, got.data());
        kernels_for(Isa::scalar).dropout_mask(p, want.data());
        EXPECT_EQ(got, want) << isa_to_string(isa) << " lk " << lk << " k_offset " << k_offset;
      }
}


// The bf16 forwards of the avx512bf16 path (AVX512_BF16 dot products,
// Bf16DotTiles in forward_tiles.inl) and of the amx path (AMX-BF16 tiles,
// AmxTiles), whatever kernels() picks: these tests call the path's table
// directly for the forward, the backward (the same path's, ScopedIsa)
// through the API. Where FLASHGRAD_ISA forces another path they skip.
class Bf16Forward : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!cpu_supports(GetParam())) GTEST_SKIP() << "this CPU lacks " << isa_to_string(GetParam());
    const char* env = std::getenv("FLASHGRAD_ISA");
    if (env && *env && std::strcmp(env, isa_to_string(GetParam())) != 0)
      GTEST_SKIP() << "FLASHGRAD_ISA forces another path than " << isa_to_string(GetParam());
  }
};
INSTANTIATE_TEST_SUITE_P(Paths, Bf16Forward, ::testing::Values(Isa::avx512bf16, Isa::amx),
                         [](const ::testing::TestParamInfo<Isa>& i) { return std::string(isa_to_string(i.param)); });

// out and lse of c's forward through one kernel table.
void forward_with(const KernelTable& table, const Problem& p, Outputs& o) {
  AttnParams prm = make_params("test_kernels", CallKind::forward, p.opts,
                               CallTensors{&p.q.view, &p.k.view, &p.v.view, &o.out.view, &o.lse.view});
  prm.num_threads = resolve_threads(prm.num_threads);
  const TilePlan plan = plan_forward(prm, pair_engine(table.isa, prm));
  std::vector<double> ws(static_cast<size_t>(plan.total_bytes() / 8 + 8));  // 8-byte aligned
  void* base = ws.data();
  size_t space = ws.size() * 8;
  table.forward(prm, plan, std::align(static_cast<size_t>(kAlign), static_cast<size_t>(plan.total_bytes()), base, space));
}

void expect_bf16_forward_pass(Isa isa, const Case& c) {
  Problem p = make_problem(c);
  Outputs o = make_outputs(p, false);
  forward_with(kernels_for(isa), p, o);
  Grads g{o.dq.view, o.dk.view, o.dv.view, std::nullopt, std::nullopt};
  if (o.dsinks.present()) g.dsinks = o.dsinks.view;
  if (o.dbias.present()) g.dbias = o.dbias.view;
  const ScopedIsa on(isa);
  flashgrad::backward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view, p.dout.view, g);
  const Report r = compare_with_reference(p, o, true);
  EXPECT_TRUE(r.pass()) << c.name << ": " << c.describe() << " on " << isa_to_string(isa) << "\n" << r.table();
}

// Odd head dims and odd key counts pad the last pair with zero; the padded
// layout (head_dim strided) takes the element-wise packing.
TEST_P(Bf16Forward, OddDimsAndKeyCountsPassTheToleranceRule) {
  const std::vector<std::pair<int64_t, int64_t>> dims = {{1, 1},   {3, 5},   {17, 9},    {33, 31},
                                                         {64, 64}, {127, 65}, {128, 128}, {256, 256}};
  for (auto [d, dv] : dims)
    for (int64_t lk : {1, 7, 65, 130}) {
      Case c = base(DType::bf16);
      c.batch = 1;
      c.seqlen_q = d >= 256 ? 17 : 33;
      c.seqlen_k = lk;
      c.head_dim = d;
      c.head_dim_v = dv;
      c.causal = lk == 130;
      c.name = "bf16_d" + std::to_string(d) + "_dv" + std::to_string(dv) + "_lk" + std::to_string(lk);
      expect_bf16_forward_pass(GetParam(), c);
    }
  for (Layout l : {Layout::bhsd, Layout::padded}) {
    Case c = base(DType::bf16);
    c.head_dim = 33;
    c.head_dim_v = 7;
    c.layout = l;
    c.name = "bf16_layout";
    expect_bf16_forward_pass(GetParam(), c);
  }
}

TEST_P(Bf16Forward, FeaturesGroupsAndSplitKeysPassTheToleranceRule) {
  std::vector<Case> cs;
  Case c = base(DType::bf16);
  cs.push_back(c);
  c.heads_q = 16; c.heads_kv = 2; c.causal = true; cs.push_back(c);
  c = base(DType::bf16); c.window_left = 7; c.window_right = 2; cs.push_back(c);
  c = base(DType::bf16); c.softcap = 2.5; c.input_scale = 3.0; cs.push_back(c);
  c = base(DType::bf16); c.alibi = true; c.bias = BiasKind::full; c.dbias = true; cs.push_back(c);
  c = base(DType::bf16); c.mask = MaskKind::key_padding; c.sinks = true; cs.push_back(c);
  c = base(DType::bf16); c.dropout_p = 0.25; cs.push_back(c);
  c = base(DType::bf16); c.softmax_scale = 0.3; cs.push_back(c);
  c = base(DType::bf16); c.seqlens_q = {5, 0, 70, 1}; c.seqlens_k = {9, 4, 131, 0}; cs.push_back(c);
  // 3 query rows (6 stacked) take the path's row tiles, 8 (16) over split
  // keys narrow tiles: on dot products on avx512bf16, AMX's own on amx.
  for (int64_t lq : {3, 8}) {
    c = base(DType::bf16); c.seqlen_q = lq; c.seqlen_k = 2 * 2048 + 37; c.head_dim = 16; c.head_dim_v = 8;
    c.causal = true; c.sinks = true; cs.push_back(c);
  }
  // Logits ~1e32: the backward needs S - lse <= 0 from the forward's lse, so
  // it must recompute S bit for bit as the forward computed it: it runs on
  // the forward's products (dot_call, amx_call). 33 query rows (66 stacked)
  // take the dot products' row tiles on avx512bf16; 8 (16 stacked) take
  // the f32 narrow tiles there (keys not split, heads side by side) and
  // AMX's narrow tiles on amx; 1 (2 stacked) runs both passes on the f32
  // tiles on both paths.
  for (int64_t lq : {33, 8, 1}) {
    c = base(DType::bf16); c.seqlen_q = lq; c.head_dim = 64; c.input_scale = 1e16; c.causal = true;
    cs.push_back(c);
  }
  for (auto& x : cs) {
    x.name = "bf16_features";
    expect_bf16_forward_pass(GetParam(), x);
  }
}

class Bf16DotProducts : public Bf16Forward {};
INSTANTIATE_TEST_SUITE_P(Paths, Bf16DotProducts, ::testing::Values(Isa::avx512bf16),
                         [](const ::testing::TestParamInfo<Isa>& i) { return std::string(isa_to_string(i.param)); });

// With a scale that is no power of two the dot products' S differs from the
// f32 tiles' by rounding, and at logits near 1e6 an f32 recompute of S in the
// backward puts exp(S - lse) past 1 and dV out of bounds (docs/design.md).
// The backward recomputes S on the same dot products, so both passes agree
// bit for bit and the tolerance rule holds: here, through the API, whose
// forward and backward both run on avx512bf16 (ScopedIsa). 40 query
// rows (80 stacked) take the row tiles; 12 (24) and 5 (10), with each
// head's rows contiguous, the narrow tiles two and one vector wide; 6 rows
// over 4133 keys split the keys, each task over both K/V heads, whose rows
// lie side by side.
TEST_P(Bf16DotProducts, BackwardRecomputesTheForwardsScores) {
  for (int64_t lq : {40, 12, 5})
    for (int64_t d : {40, 128})
      for (bool causal : {false, true}) {
        Case c = base(DType::bf16);
        c.seqlen_q = lq;
        c.seqlen_k = 150;
        if (lq < 16) c.layout = Layout::bhsd;
        c.head_dim = d;
        c.input_scale = 1000.0;
        c.softmax_scale = 0.3;
        c.causal = causal;
        c.window_left = causal ? 37 : -1;
        c.name = "dot_recompute_lq" + std::to_string(lq) + "_d" + std::to_string(d);
        const Problem p = make_problem(c);
        ASSERT_TRUE(dot_call(make_params("test_kernels", CallKind::workspace, p.opts,
                                         CallTensors{&p.q.view, &p.k.view, &p.v.view})));
        expect_pass_on({Isa::avx512bf16}, c);
      }
  Case c = base(DType::bf16);
  c.batch = 1;
  c.seqlen_q = 6;
  c.seqlen_k = 2 * 2048 + 37;
  c.head_dim = 128;
  c.head_dim_v = 64;
  c.input_scale = 1000.0;
  c.softmax_scale = 0.3;
  c.name = "dot_recompute_split";
  const Problem p = make_problem(c);
  ASSERT_TRUE(dot_call(make_params("test_kernels", CallKind::workspace, p.opts,
                                   CallTensors{&p.q.view, &p.k.view, &p.v.view})));
  expect_pass_on({Isa::avx512bf16}, c);
}

// The dot products' narrow tiles take up to 64 keys, their S^T in blocks
// of 16 (forward_narrow_dot.inl, narrow_dot_products): key counts that end a tile
// inside a block, on an odd key, or one key past a tile. 8 query rows over
// two query heads per K/V head stack to 16; the logits of order 1, so that
// one key lost or counted twice shows. Each head's rows contiguous, so
// that the call runs on the dot products (dot_call).
TEST_P(Bf16DotProducts, NarrowTilesTakeAnyKeyCount) {
  for (int64_t lk : {1, 15, 17, 33, 64, 65, 127, 150})
    for (int64_t d : {40, 128}) {
      Case c = base(DType::bf16);
      c.seqlen_q = 8;
      c.seqlen_k = lk;
      c.layout = Layout::bhsd;
      c.head_dim = d;
      c.head_dim_v = d == 40 ? 24 : 128;
      c.name = "dot_narrow_lk" + std::to_string(lk) + "_d" + std::to_string(d);
      const Problem p = make_problem(c);
      ASSERT_TRUE(dot_call(make_params("test_kernels", CallKind::workspace, p.opts,
                                       CallTensors{&p.q.view, &p.k.view, &p.v.view})));
      expect_pass_on({Isa::avx512bf16}, c);
    }
}

}  // namespace
}  // namespace flashgrad::testing
