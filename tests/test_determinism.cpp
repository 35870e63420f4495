// Results are bitwise identical across runs and thread counts: tasks own
// their outputs and every reduction has a fixed order.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "dispatch.hpp"
#include "harness.hpp"

namespace flashgrad::testing {
namespace {

std::vector<std::vector<unsigned char>> run_bytes(const Case& c) {
  Problem p = make_problem(c);
  Outputs o = make_outputs(p, false);
  run_kernels(p, o);
  std::vector<std::vector<unsigned char>> out;
  for (const Buffer* b : {&o.out, &o.lse, &o.dq, &o.dk, &o.dv, &o.dsinks, &o.dbias}) out.push_back(b->bytes);
  return out;
}

void expect_deterministic(Case c) {
  if (const char* isa = forced_isa_missing()) GTEST_SKIP() << "this CPU lacks " << isa;
  c.num_threads = 1;
  const auto ref = run_bytes(c);
  for (int threads : {1, 2, 3}) {
    c.num_threads = threads;
    const auto got = run_bytes(c);
    for (size_t t = 0; t < ref.size(); ++t)
      EXPECT_TRUE(got[t] == ref[t]) << "output " << t << " differs with " << threads << " threads: " << c.describe();
  }
}

Case multi_block() {
  Case c;
  c.batch = 2;
  c.seqlen_q = 200;
  c.seqlen_k = 300;
  c.heads_q = 4;
  c.heads_kv = 1;
  c.head_dim = 48;
  c.head_dim_v = 32;
  return c;
}

// B * H_kv = 8 tasks: 1 and 2 threads take the single-pass backward, 3
// threads the two-pass one (tiling.cpp), which must give the same bits.
// With fewer tasks (multi_block's 2) every thread count cuts the keys into
// runs (TilePlan::key_chunks).
TEST(Determinism, PlainAcrossThreadCounts) {
  Case c = multi_block();
  c.heads_q = 8;
  c.heads_kv = 4;
  expect_deterministic(c);
  expect_deterministic(multi_block());
}

TEST(Determinism, CausalGqaSinksDropoutBf16) {
  Case c = multi_block();
  c.dtype = DType::bf16;
  c.causal = true;
  c.sinks = true;
  c.dropout_p = 0.1;
  expect_deterministic(c);
}

TEST(Determinism, BroadcastBiasGradientSumsInFixedOrder) {
  Case c = multi_block();
  c.bias = BiasKind::bcast_heads;
  c.dbias = true;
  expect_deterministic(c);
  c.bias = BiasKind::bcast_batch;
  expect_deterministic(c);
}

TEST(Determinism, SplitKeysForShortQueries) {
  Case c = multi_block();
  c.seqlen_q = 3;
  c.seqlen_k = 5000;
  c.heads_q = 8;
  c.heads_kv = 2;
  c.sinks = true;
  expect_deterministic(c);
}

TEST(Determinism, VarlenF16) {
  Case c = multi_block();
  c.dtype = DType::f16;
  c.seqlens_q = {100, 0, 250, 3};
  c.seqlens_k = {90, 40, 260, 0};
  c.window_left = 30;
  expect_deterministic(c);
}

// The single pass meets each query block with up to 4 key blocks in turn
// (TilePlan::key_group); the two-pass form takes one key block at a time.
// 1100 keys make 5 key blocks of 256 (groups of 4 and 1); under the causal
// mask with 450 rows, the first query blocks see the group's third block
// but not its fourth. 8 tasks: 1 and 2 threads take the single pass, 3
// the two-pass form.
TEST(Determinism, KeyGroupsChangeNoBits) {
  Case c = multi_block();
  c.batch = 4;
  c.heads_q = 2;
  c.heads_kv = 2;
  c.head_dim = c.head_dim_v = 16;
  c.seqlen_q = 450;
  c.seqlen_k = 1100;
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool causal : {false, true}) {
      c.dtype = dtype;
      c.causal = causal;
      expect_deterministic(c);
    }
}

// The single pass keeps its dQ sums in the workspace, in dq itself (f32,
// f64; rows that are strided or padded pass through a staging block) or
// split between bf16 dq and the workspace (TilePlan::dq_sums); here, with
// FLASHGRAD_DQ_SUMS_WORKSPACE_MIB=0, out of the workspace. With
// B * H_kv = 8 tasks, 1 and 2 threads take the single pass, 3 the two-pass
// backward, whose dQ sums are its own: the bits must agree. d = 64 in the
// bshd layout adds into dq where it lies; the padded layout's dq is
// strided.
TEST(Determinism, DqSumsInEveryForm) {
  Case c = multi_block();
  c.heads_q = 8;
  c.heads_kv = 4;
  c.head_dim = 64;
  ::setenv("FLASHGRAD_DQ_SUMS_WORKSPACE_MIB", "0", 1);
  for (DType dtype : {DType::f32, DType::f64, DType::bf16})
    for (Layout layout : {Layout::bshd, Layout::padded}) {
      c.dtype = dtype;
      c.layout = layout;
      expect_deterministic(c);
    }
  ::unsetenv("FLASHGRAD_DQ_SUMS_WORKSPACE_MIB");
}

// On bf16 pair products the forward keeps K/V tiles per thread across a
// head's query blocks (PairTileCache) where each thread takes at least two
// blocks, and the single-pass backward keeps q and dO blocks across its key
// blocks (BackwardScratch::held_q) from 4 key blocks on where it meets
// them one at a time (under a window). One and two threads hold them in
// these cases, three do not (fewer query blocks per thread; 8 tasks on 3
// threads take the two-pass backward), and the bits must not tell. The
// batches switch the held tiles' owner; the wide case has more key tiles
// (46 of 64 keys) than the forward's slots (39 at d = 512, dv = 320), the
// tall one under a window more query blocks (20 of 16 rows) than the
// backward's (19); the last splits its keys, so that a forward task holds
// both K/V heads' tiles.
TEST(Determinism, PairsHeldAcrossBlocks) {
  if (const char* isa = forced_isa_missing()) GTEST_SKIP() << "this CPU lacks " << isa;
  if (kernels().isa != Isa::avx512bf16 && kernels().isa != Isa::amx)
    GTEST_SKIP() << "bf16 runs on f32 tiles on this path: no pair tiles to hold";
  Case c = multi_block();
  c.dtype = DType::bf16;
  c.heads_q = 8;
  c.heads_kv = 4;
  c.seqlens_q = {200, 140};
  c.seqlens_k = {300, 1100};
  c.causal = true;
  expect_deterministic(c);
  c.causal = false;
  c.window_left = 70;
  expect_deterministic(c);
  const auto bf16_case = [](int64_t b, int64_t lq, int64_t lk, int64_t hq, int64_t hkv, int64_t d, int64_t dv) {
    Case x;
    x.dtype = DType::bf16;
    x.batch = b, x.seqlen_q = lq, x.seqlen_k = lk, x.heads_q = hq, x.heads_kv = hkv, x.head_dim = d, x.head_dim_v = dv;
    return x;
  };
  expect_deterministic(bf16_case(1, 32, 2900, 2, 1, 512, 320));  // wide
  expect_deterministic(bf16_case(8, 160, 256, 2, 1, 512, 320));  // tall
  Case tall_window = bf16_case(8, 160, 256, 2, 1, 512, 320);
  tall_window.window_left = 100;  // key blocks one at a time: the backward holds q and dO
  expect_deterministic(tall_window);
  expect_deterministic(bf16_case(1, 16, 2500, 64, 2, 32, 32));   // split keys
}

}  // namespace
}  // namespace flashgrad::testing
