// The plan a call reports (explain_forward / explain_backward) names the path
// the kernels take, on every ISA this CPU has: a change of choice fails here
// and is made on purpose.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "dispatch.hpp"
#include "flashgrad/flashgrad.h"
#include "flashgrad/flashgrad.hpp"
#include "harness.hpp"

namespace {

using flashgrad::ForwardPath;
using flashgrad::Isa;

// Views over one element: a plan reads shapes and strides, never the data.
struct Shape {
  flashgrad::DType dtype = flashgrad::DType::f32;
  int64_t seqlen_q = 2048, seqlen_k = 2048, heads_q = 8, heads_kv = 8, head_dim = 128;
  bool heads_major = false;  // [batch, heads, seq, dim] instead of [batch, seq, heads, dim]
};

struct Views {
  double cell = 0;
  flashgrad::TensorView q, k, v;
};

flashgrad::TensorView view_of(void* data, const Shape& s, int64_t seqlen, int64_t heads) {
  const int64_t d = s.head_dim;
  if (s.heads_major)
    return flashgrad::TensorView::strided(data, s.dtype, {1, seqlen, heads, d}, {heads * seqlen * d, d, seqlen * d, 1});
  return flashgrad::TensorView::contiguous(data, s.dtype, {1, seqlen, heads, d});
}

Views views(const Shape& s) {
  Views v;
  v.q = view_of(&v.cell, s, s.seqlen_q, s.heads_q);
  v.k = view_of(&v.cell, s, s.seqlen_k, s.heads_kv);
  v.v = view_of(&v.cell, s, s.seqlen_k, s.heads_kv);
  return v;
}

flashgrad::Plan forward_plan(const Shape& s) {
  const Views v = views(s);
  flashgrad::Options o;
  o.num_threads = 2;
  return flashgrad::explain_forward(o, v.q, v.k, v.v);
}

struct Expect {
  const char* name;
  Shape shape;
  // The path on scalar, avx2, avx512, avx512bf16 and amx.
  ForwardPath on[5];
  bool heads_outer;
};

const flashgrad::DType bf16 = flashgrad::DType::bf16;
const ForwardPath R = ForwardPath::rows, KM = ForwardPath::keys_major, N = ForwardPath::narrow,
                  HA = ForwardPath::heads_across, WR = ForwardPath::whole_rows;

const std::vector<Expect> kExpected = {
    {"f32 L 2048", {}, {R, KM, KM, KM, KM}, false},
    {"f32 Lq 16 Lk 4096", {flashgrad::DType::f32, 16, 4096}, {R, N, N, N, N}, false},
    {"f32 decode", {flashgrad::DType::f32, 1, 4096}, {R, HA, HA, HA, HA}, false},
    {"f32 decode, heads major", {flashgrad::DType::f32, 1, 4096, 8, 8, 128, true}, {R, WR, WR, WR, WR}, true},
    {"bf16 L 512", {bf16, 512, 512}, {R, KM, KM, ForwardPath::dot_rows, ForwardPath::amx}, false},
    {"bf16 Lq 16 Lk 4096", {bf16, 16, 4096}, {R, N, N, ForwardPath::narrow_dot, ForwardPath::amx_narrow}, false},
};

TEST(Plan, ForwardPathByShapeOnEveryIsa) {
  for (Isa isa : flashgrad::supported_isas()) {
    const flashgrad::ScopedIsa on(isa);
    for (const Expect& e : kExpected) {
      const flashgrad::Plan plan = forward_plan(e.shape);
      EXPECT_EQ(flashgrad::path_name(plan.forward_path), std::string(flashgrad::path_name(e.on[static_cast<int>(isa)])))
          << e.name << " on " << flashgrad::isa_to_string(isa) << ": " << plan.describe();
      EXPECT_EQ(plan.heads_outer, e.heads_outer) << e.name << " on " << flashgrad::isa_to_string(isa);
    }
  }
}

TEST(Plan, KernelNameSaysDtypeIsaPathAndTiles) {
  const flashgrad::ScopedIsa on(Isa::scalar);
  const flashgrad::Plan plan = forward_plan(Shape{});
  EXPECT_EQ(plan.kernel, "fwd_f32_scalar_rows_q" + std::to_string(plan.block_q) + "k" + std::to_string(plan.block_k));
  EXPECT_EQ(plan.describe().rfind(plan.kernel + ": rows, block_q ", 0), 0u) << plan.describe();
}

TEST(Plan, WorkspaceIsWhatTheCallAllocates) {
  const Views v = views(Shape{});
  flashgrad::Options o;
  o.num_threads = 2;
  EXPECT_EQ(flashgrad::explain_forward(o, v.q, v.k, v.v).workspace_bytes,
            flashgrad::forward_workspace_bytes(o, v.q, v.k, v.v));
  EXPECT_EQ(flashgrad::explain_backward(o, v.q, v.k, v.v).workspace_bytes,
            flashgrad::backward_workspace_bytes(o, v.q, v.k, v.v));
}

TEST(Plan, BackwardTakesOnePassUntilItsDqSumsOutgrowTheirCap) {
  Shape s;
  flashgrad::Options o;
  o.num_threads = 2;
  Views v = views(s);
  const flashgrad::Plan one = flashgrad::explain_backward(o, v.q, v.k, v.v);
  EXPECT_EQ(one.backward_path, flashgrad::BackwardPath::single_pass) << one.describe();
  EXPECT_EQ(one.kernel.rfind("bwd_f32_", 0), 0u) << one.kernel;
  s.seqlen_q = s.seqlen_k = 16384;  // 8 query heads per K/V head: 2 x 8 x 16384 x 128 f32 sums
  s.heads_q = 64;
  s.dtype = flashgrad::DType::f16;  // whose sums stay in the workspace
  v = views(s);
  const flashgrad::Plan two = flashgrad::explain_backward(o, v.q, v.k, v.v);
  EXPECT_EQ(two.backward_path, flashgrad::BackwardPath::two_pass) << two.describe();
  s.dtype = flashgrad::DType::f32;  // whose sums dq holds
  v = views(s);
  const flashgrad::Plan in_dq = flashgrad::explain_backward(o, v.q, v.k, v.v);
  EXPECT_EQ(in_dq.backward_path, flashgrad::BackwardPath::single_pass) << in_dq.describe();
}

// 2048 keys make 8 or 16 key blocks: the single pass meets each query
// block with 4 of them in turn; a window keeps one, the two-pass form too.
TEST(Plan, SinglePassGroupsItsKeyBlocks) {
  flashgrad::Options o;
  o.num_threads = 2;
  Shape s;
  Views v = views(s);
  const flashgrad::Plan grouped = flashgrad::explain_backward(o, v.q, v.k, v.v);
  ASSERT_EQ(grouped.backward_path, flashgrad::BackwardPath::single_pass) << grouped.describe();
  EXPECT_EQ(grouped.key_group, 4) << grouped.describe();
  EXPECT_NE(grouped.describe().find(", key blocks in groups of 4"), std::string::npos) << grouped.describe();
  o.window_left = 256;
  const flashgrad::Plan window = flashgrad::explain_backward(o, v.q, v.k, v.v);
  EXPECT_EQ(window.key_group, 1) << window.describe();
  EXPECT_EQ(window.describe().find("groups of"), std::string::npos) << window.describe();
  o.window_left = -1;
  o.num_threads = 3;  // 8 tasks on 3 threads: the two-pass form
  const flashgrad::Plan two = flashgrad::explain_backward(o, v.q, v.k, v.v);
  ASSERT_EQ(two.backward_path, flashgrad::BackwardPath::two_pass) << two.describe();
  EXPECT_EQ(two.key_group, 1) << two.describe();
}

TEST(Plan, SinglePassSaysWhereItKeepsItsDqSums) {
  flashgrad::Options o;
  o.num_threads = 2;
  // (dtype, K/V heads, seqlen, where). 4 query heads per K/V head at 2048:
  // 4 MiB of f32 sums per thread, past the 2 MiB kept in the workspace; 1
  // MiB with 8 K/V heads. f32 dq holds a GQA group's sums at any size.
  using flashgrad::DType;
  const std::tuple<DType, int64_t, int64_t, const char*> expect[] = {
      {DType::f32, 2, 2048, "dq"}, {bf16, 2, 2048, "split dq"},  {DType::f16, 2, 2048, "workspace"},
      {bf16, 8, 2048, "workspace"}, {DType::f32, 8, 2048, "workspace"}, {DType::f32, 2, 256, "dq"},
      {bf16, 2, 256, "workspace"}};
  for (const auto& [dtype, heads_kv, seqlen, where] : expect) {
    Shape s;
    s.dtype = dtype;
    s.heads_kv = heads_kv;
    s.seqlen_q = s.seqlen_k = seqlen;
    const Views v = views(s);
    const flashgrad::Plan plan = flashgrad::explain_backward(o, v.q, v.k, v.v);
    ASSERT_EQ(plan.backward_path, flashgrad::BackwardPath::single_pass) << plan.describe();
    EXPECT_STREQ(plan.dq_sums, where) << plan.describe();
    EXPECT_NE(plan.describe().find(std::string("dQ sums in ") + where), std::string::npos) << plan.describe();
  }
}

TEST(Plan, NarrowBandsTakeBackwardQueryBlocksOf32Rows) {
  // (causal, window left, window right, seqlen, rows per block on every ISA but amx)
  const std::tuple<bool, int64_t, int64_t, int64_t, int64_t> expect[] = {
      {true, -1, -1, 128, 32}, {true, -1, -1, 256, 32},  {true, -1, -1, 512, 64},
      {false, 256, 0, 2048, 32}, {false, 256, 256, 2048, 64}, {false, -1, -1, 128, 64}};
  for (Isa isa : flashgrad::supported_isas()) {
    if (isa == Isa::amx) continue;  // its backward takes 128 rows (tuning table)
    const flashgrad::ScopedIsa on(isa);
    for (const auto& [causal, left, right, seqlen, rows] : expect) {
      Shape s;
      s.seqlen_q = s.seqlen_k = seqlen;
      const Views v = views(s);
      flashgrad::Options o;
      o.num_threads = 2;
      o.causal = causal;
      o.window_left = left;
      o.window_right = right;
      const flashgrad::Plan plan = flashgrad::explain_backward(o, v.q, v.k, v.v);
      EXPECT_EQ(plan.block_q, rows) << flashgrad::isa_to_string(isa) << ": " << plan.describe();
    }
  }
}

TEST(Plan, ExplainRejectsWhatTheCallRejects) {
  Shape s;
  s.heads_q = 3;  // not a multiple of heads_kv
  const Views v = views(s);
  try {
    flashgrad::explain_forward(flashgrad::Options{}, v.q, v.k, v.v);
    FAIL() << "no error";
  } catch (const flashgrad::Error& e) {
    EXPECT_NE(std::string(e.what()).find("explain_forward"), std::string::npos) << e.what();
  }
}

TEST(Plan, CAbiExplainsBothPasses) {
  float cell = 0;
  int64_t shape[4] = {1, 64, 2, 16};
  DLTensor t{};
  t.data = &cell;
  t.device = {kDLCPU, 0};
  t.ndim = 4;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  const fg_params p = fg_params_default();
  const char* fwd = fg_explain(&p, &t, &t, &t, 0);
  ASSERT_NE(fwd, nullptr) << fg_last_error();
  EXPECT_EQ(std::strncmp(fwd, "fwd_f32_", 8), 0) << fwd;
  const char* bwd = fg_explain(&p, &t, &t, &t, 1);
  ASSERT_NE(bwd, nullptr) << fg_last_error();
  EXPECT_EQ(std::strncmp(bwd, "bwd_f32_", 8), 0) << bwd;
  EXPECT_EQ(fg_explain(&p, nullptr, &t, &t, 0), nullptr);
  EXPECT_NE(std::string(fg_last_error()).find("'q'"), std::string::npos) << fg_last_error();
}

}  // namespace
