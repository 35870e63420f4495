// Memory: the library allocates per-thread tiles and O(seqlen) vectors, never
// anything of size seqlen_q * seqlen_k, and reports it through the workspace
// queries. Global operator new is replaced here to see every allocation.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "harness.hpp"

namespace {

std::atomic<int64_t> g_live{0}, g_peak{0};
std::atomic<bool> g_tracking{false};

// Each block carries (raw pointer, size) in the 16 bytes before the pointer
// handed out, which is then aligned up to the requested alignment.
void* track(std::size_t n, std::size_t align) {
  const std::size_t a = align < 16 ? 16 : align;
  void* raw = std::malloc(n + a + 16);
  if (!raw) return nullptr;
  const auto start = reinterpret_cast<std::uintptr_t>(raw) + 16;
  void* p = reinterpret_cast<void*>((start + a - 1) / a * a);
  static_cast<std::size_t*>(p)[-1] = n;
  static_cast<void**>(p)[-2] = raw;
  if (g_tracking) {
    const int64_t live = g_live += static_cast<int64_t>(n);
    int64_t peak = g_peak;
    while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
    }
  }
  return p;
}

void untrack(void* p) {
  if (!p) return;
  if (g_tracking) g_live -= static_cast<int64_t>(static_cast<std::size_t*>(p)[-1]);
  std::free(static_cast<void**>(p)[-2]);
}

}  // namespace

void* operator new(std::size_t n) {
  if (void* p = track(n, 16)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = track(n, static_cast<std::size_t>(a))) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return track(n, static_cast<std::size_t>(a));
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return track(n, 16); }
void operator delete(void* p) noexcept { untrack(p); }
void operator delete[](void* p) noexcept { untrack(p); }
void operator delete(void* p, std::size_t) noexcept { untrack(p); }
void operator delete[](void* p, std::size_t) noexcept { untrack(p); }
void operator delete(void* p, std::align_val_t) noexcept { untrack(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { untrack(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { untrack(p); }

namespace flashgrad::testing {
namespace {

struct Shape {
  int64_t seqlen, heads, dim;
};

// Workspace query without data: zero-stride views of the right shapes would be
// rejected only for outputs, so q/k/v can point at one dummy element.
int64_t workspace(bool backward, Shape s, int threads) {
  static float dummy = 0;
  TensorView q = TensorView::strided(&dummy, DType::bf16, {1, s.seqlen, s.heads, s.dim}, {0, 0, 0, 0});
  Options o;
  o.num_threads = threads;
  return backward ? backward_workspace_bytes(o, q, q, q) : forward_workspace_bytes(o, q, q, q);
}

TEST(Workspace, LinearInSequenceLengthAt32k) {
  const int64_t L = 32768;
  for (int threads : {1, 2}) {
    const int64_t fwd = workspace(false, {L, 8, 128}, threads);
    const int64_t bwd = workspace(true, {L, 8, 128}, threads);
    const int64_t bwd_half = workspace(true, {L / 2, 8, 128}, threads);
    const int64_t score_matrix = L * L * 4;
    RecordProperty("forward_bytes_32k", std::to_string(fwd));
    RecordProperty("backward_bytes_32k", std::to_string(bwd));
    EXPECT_EQ(fwd, workspace(false, {L / 2, 8, 128}, threads)) << "forward workspace must not grow with L";
    // The single-pass backward adds one f32 dQ accumulator [L, 128] per thread
    // (capped at 48 MiB for all threads); the rest is tiles and, on bf16 pair
    // products, the query blocks it holds as pairs (2 MiB per thread).
    const int64_t dq_acc = threads * L * 128 * 4;
    EXPECT_LT(bwd, (8 << 20) + dq_acc) << "backward workspace at L=32768";
    EXPECT_LT(bwd * 100, score_matrix);
    // O(L) growth: the backward's L-dependent part (delta, dsinks partials and
    // the dQ accumulators) is a few bytes per (head, row) plus 4 bytes per
    // (thread, row, head_dim column).
    EXPECT_LE(bwd - bwd_half, (L / 2) * 8 * 8 + dq_acc / 2 + 4096);
    EXPECT_GE(bwd, bwd_half);
  }
}

// Issue 3's memory goal: forward + backward at B = 1, H = 8, d = 64,
// L = 65536 in bf16 need the inputs, outputs and gradients plus < 64 MiB
// (CallsAllocateWhatTheQueryReports shows a call allocates what is reported).
TEST(Workspace, LongBf16TrainingStepUnder64MiB) {
  for (int threads : {1, 2}) {
    const int64_t fwd = workspace(false, {65536, 8, 64}, threads);
    const int64_t bwd = workspace(true, {65536, 8, 64}, threads);
    RecordProperty("bytes_65536_threads_" + std::to_string(threads), std::to_string(fwd + bwd));
    EXPECT_LT(fwd + bwd, int64_t{64} << 20) << "threads " << threads << ": forward " << fwd << ", backward " << bwd;
  }
}

// What a call really allocates, seen through operator new: the workspace the
// query reported, and nothing of size Lq * Lk. The workspace cache is off
// (FLASHGRAD_WORKSPACE_CACHE_MIB=0), so each call allocates its own.
TEST(Workspace, CallsAllocateWhatTheQueryReports) {
  ::setenv("FLASHGRAD_WORKSPACE_CACHE_MIB", "0", 1);
  Case c;
  c.batch = 1;
  c.seqlen_q = 4096;
  c.seqlen_k = 4096;
  c.heads_q = 2;
  c.heads_kv = 1;
  c.head_dim = 32;
  c.head_dim_v = 32;
  c.causal = true;
  c.num_threads = 2;
  Problem p = make_problem(c);
  Outputs o = make_outputs(p, false);
  const int64_t fwd = forward_workspace_bytes(p.opts, p.q.view, p.k.view, p.v.view);
  const int64_t bwd = backward_workspace_bytes(p.opts, p.q.view, p.k.view, p.v.view);
  g_live = 0;
  g_peak = 0;
  g_tracking = true;
  forward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view);
  const int64_t fwd_peak = g_peak;
  g_peak = 0;
  g_live = 0;
  backward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view, p.dout.view,
           Grads{o.dq.view, o.dk.view, o.dv.view, std::nullopt, std::nullopt});
  const int64_t bwd_peak = g_peak;
  g_tracking = false;
  // Slack for the thread runtime's own bookkeeping on first use.
  const int64_t slack = 64 << 10;
  EXPECT_LE(fwd_peak, fwd + slack);
  EXPECT_LE(bwd_peak, bwd + slack);
  EXPECT_GE(fwd_peak, fwd);
  EXPECT_GE(bwd_peak, bwd);
  EXPECT_LT(bwd_peak, c.seqlen_q * c.seqlen_k) << "an allocation the size of the score matrix";
  ::unsetenv("FLASHGRAD_WORKSPACE_CACHE_MIB");
}

// B = 1, L = 2048, 8 query heads over heads_kv, head dim d, 2 threads.
Case two_threads_l2048(int64_t heads_kv, int64_t d) {
  Case c;
  c.seqlen_q = c.seqlen_k = 2048;
  c.heads_q = 8;
  c.heads_kv = heads_kv;
  c.head_dim = c.head_dim_v = d;
  c.num_threads = 2;
  return c;
}

// With the cache on (the default), a call reuses the workspace the call
// before it released: the second of two backward calls allocates none.
TEST(Workspace, ARepeatedCallReusesTheWorkspace) {
  ::unsetenv("FLASHGRAD_WORKSPACE_CACHE_MIB");
  Problem p = make_problem(two_threads_l2048(1, 64));
  Outputs o = make_outputs(p, false);
  const int64_t bwd = backward_workspace_bytes(p.opts, p.q.view, p.k.view, p.v.view);
  ASSERT_GE(bwd, int64_t{1} << 20) << "too small a workspace to be kept";
  const Grads g{o.dq.view, o.dk.view, o.dv.view, std::nullopt, std::nullopt};
  forward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view);
  backward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view, p.dout.view, g);
  g_live = 0;
  g_peak = 0;
  g_tracking = true;
  backward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view, p.dout.view, g);
  g_tracking = false;
  EXPECT_LT(g_peak, bwd / 2);
}

// A call that needs more than the kept workspace frees it before it
// allocates: a backward after a forward holds the backward's workspace
// only, not the forward's beside it.
TEST(Workspace, ALargerCallFreesTheKeptWorkspaceFirst) {
  ::unsetenv("FLASHGRAD_WORKSPACE_CACHE_MIB");
  Problem p = make_problem(two_threads_l2048(2, 128));
  Outputs o = make_outputs(p, false);
  const int64_t fwd = forward_workspace_bytes(p.opts, p.q.view, p.k.view, p.v.view);
  const int64_t bwd = backward_workspace_bytes(p.opts, p.q.view, p.k.view, p.v.view);
  ASSERT_GE(fwd, int64_t{1} << 20) << "too small a forward workspace to be kept";
  ASSERT_GT(bwd, fwd);
  ::setenv("FLASHGRAD_WORKSPACE_CACHE_MIB", "0", 1);
  forward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view);  // drops what was kept
  ::unsetenv("FLASHGRAD_WORKSPACE_CACHE_MIB");
  forward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view);  // keeps its workspace
  g_live = fwd;
  g_peak = fwd;
  g_tracking = true;
  backward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view, p.dout.view,
           Grads{o.dq.view, o.dk.view, o.dv.view, std::nullopt, std::nullopt});
  g_tracking = false;
  EXPECT_LE(g_peak, bwd + (64 << 10)) << "forward " << fwd << " bytes, backward " << bwd;
}

}  // namespace
}  // namespace flashgrad::testing
