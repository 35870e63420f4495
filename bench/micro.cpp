// Google Benchmark micro-benchmarks of the kernels' pieces, on every ISA this
// CPU runs:
//
//   gemm_block/<isa>/k:64              one register block of the tile product
//   gemm_nn/<isa>/<product>            whole tiles, at the shapes forward and backward multiply
//   softmax_rows, grad_rows/<isa>      the softmax and its gradient over a 128 x 64 score tile
//   softcap_rows, dropout_rows/<isa>   the softcap's tanh and dropout over such a tile
//   transpose/<isa>                    a 64 x 128 K tile, in register blocks
//   forward, backward/<isa>/<dtype>/L256_d<d>   B = 1, 4 heads, one thread,
//                                      through that ISA's kernel table
//   forward/<isa>/<dtype>/Lq16_Lk512_d128      short queries (narrow tiles)
//
// Operands stay in L1/L2: these are the compute rates of the pieces. Whole
// calls against memory and against peers are `flashgrad-lab sweep`'s job.
// Each benchmark checks its result before timing it (forward and backward on
// a shorter copy against the fp64 reference); a wrong result is reported as
// an error, and makes the exit status 1, instead of a time.
//
//   build/bench/flashgrad_microbench --benchmark_filter='gemm_nn/avx512'
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "check.hpp"
#include "dispatch.hpp"
#include "flashgrad/flashgrad.hpp"
#include "harness.hpp"
#include "parallel.hpp"
#include "tile_ops.hpp"
#include "tiling.hpp"

namespace flashgrad::bench {
namespace {

bool g_failed = false;

void fail(benchmark::State& state, const std::string& why) {
  g_failed = true;
  state.SkipWithError(why.c_str());
}

void set_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["FLOP/s"] = benchmark::Counter(flops_per_iteration, benchmark::Counter::kIsIterationInvariantRate);
}

// --- the tile product ----------------------------------------------------------

// max |c - A b| over c [m, n], with A(r, p) = a[r * a_rs + p * a_cs].
double gemm_error(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                  int64_t ldb, const float* c, int64_t ldc) {
  double worst = 0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int64_t p = 0; p < k; ++p) want += static_cast<double>(a[r * a_rs + p * a_cs]) * b[p * ldb + j];
      worst = std::max(worst, std::fabs(want - c[r * ldc + j]));
    }
  return worst;
}

// Inputs are in [-1, 1]: an f32 dot product of length k is within k * 2^-23 of exact.
bool gemm_ok(double err, int64_t k) { return err <= 1e-6 * static_cast<double>(k); }

void gemm_block_bench(benchmark::State& state, Isa isa) {
  const TileOps& ops = tile_ops(isa);
  const int64_t k = state.range(0), m = ops.block_rows, n = ops.block_cols;
  const std::vector<float> a = testing::uniform_floats(static_cast<size_t>(m * k), 1),
                           b = testing::uniform_floats(static_cast<size_t>(k * n), 2);
  std::vector<float> c(static_cast<size_t>(m * n));
  ops.gemm_block(k, a.data(), k, 1, b.data(), n, c.data(), n);
  if (!gemm_ok(gemm_error(m, n, k, a.data(), k, 1, b.data(), n, c.data(), n), k))
    return fail(state, "wrong result");
  for (auto _ : state) {
    ops.gemm_block(k, a.data(), k, 1, b.data(), n, c.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * static_cast<double>(m * n * k));
  state.SetLabel(std::to_string(m) + "x" + std::to_string(n) + " block");
}

// The products of one tile step at d = 64 and 128, the shapes of `flashgrad
// roofline`'s comparison with the small-GEMM libraries: the forward's
// keys-major tiles are 256 query rows by 64 keys, the backward's 64 query
// rows by 256 keys.
struct Product {
  const char* name;
  int64_t m, n, k;
  bool transposed_a;
};
const Product kProducts[] = {
    {"scores_d64", 64, 256, 64, false},  // forward S^T = K (scale Q)^T; backward S = Q K^T, dP = dO V^T
    {"scores_d128", 64, 256, 128, false},
    {"pv_d64", 256, 64, 64, true},  // forward O += P V, P read from S^T; backward dV += P^T dO, dK += dS^T Q
    {"pv_d128", 256, 128, 64, true},
    {"dq_d64", 64, 64, 256, false},  // backward dQ += dS K
    {"dq_d128", 64, 128, 256, false},
};

void gemm_nn_bench(benchmark::State& state, Isa isa, Product pr) {
  const TileOps& ops = tile_ops(isa);
  const int64_t m = pr.m, n = pr.n, k = pr.k;
  // A is stored [m, k], or [k, m] and read transposed.
  const int64_t a_rs = pr.transposed_a ? 1 : k, a_cs = pr.transposed_a ? m : 1;
  const std::vector<float> a = testing::uniform_floats(static_cast<size_t>(m * k), 3),
                           b = testing::uniform_floats(static_cast<size_t>(k * n), 4);
  std::vector<float> c(static_cast<size_t>(m * n));
  ops.gemm_nn(m, n, k, a.data(), a_rs, a_cs, b.data(), n, c.data(), n);
  if (!gemm_ok(gemm_error(m, n, k, a.data(), a_rs, a_cs, b.data(), n, c.data(), n), k))
    return fail(state, "wrong result");
  for (auto _ : state) {
    ops.gemm_nn(m, n, k, a.data(), a_rs, a_cs, b.data(), n, c.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, 2.0 * static_cast<double>(m * n * k));
  state.SetLabel(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                 (pr.transposed_a ? ", A transposed" : ""));
}

// --- softmax rows and the transpose ------------------------------------------------

constexpr int64_t kRows = 128, kCols = 64;  // a forward score tile: block_q x block_k

// The forward's row step on every row of a tile: m = max(row), row = exp(row - m).
// Repeating it keeps the values in [e^-1, 1], so the timed loop sees normal numbers.
void softmax_rows_bench(benchmark::State& state, Isa isa) {
  const TileOps& ops = tile_ops(isa);
  std::vector<float> s = testing::uniform_floats(static_cast<size_t>(kRows * kCols), 5);
  const std::vector<float> x = s;
  for (int64_t r = 0; r < kRows; ++r) {
    float* row = s.data() + r * kCols;
    const float mx = ops.row_max(row, kCols, -INFINITY);
    const float sum = ops.exp_row(row, kCols, mx);
    double want_sum = 0, worst = 0;
    const float want_max = *std::max_element(x.begin() + r * kCols, x.begin() + (r + 1) * kCols);
    for (int64_t j = 0; j < kCols; ++j) {
      const double e = std::exp(static_cast<double>(x[r * kCols + j]) - want_max);
      want_sum += e;
      worst = std::max(worst, std::fabs(row[j] - e) / e);
    }
    if (mx != want_max || worst > 4e-7 || std::fabs(sum - want_sum) > 1e-6 * want_sum)
      return fail(state, "wrong result");
  }
  for (auto _ : state) {
    for (int64_t r = 0; r < kRows; ++r) {
      float* row = s.data() + r * kCols;
      benchmark::DoNotOptimize(ops.exp_row(row, kCols, ops.row_max(row, kCols, -INFINITY)));
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
  state.SetLabel("128 rows of 64");
}

// The softcap over a 128 x 64 score tile: s = cap tanh(s / cap), keeping the
// tanh as the backward does. Restored from a copy each pass (outside the
// timing's count of elements, inside its time), so the inputs stay on the
// range the logits have.
void softcap_rows_bench(benchmark::State& state, Isa isa) {
  const TileOps& ops = tile_ops(isa);
  const int64_t n = kRows * kCols;
  std::vector<float> x = testing::uniform_floats(static_cast<size_t>(n), 7);
  for (float& v : x) v *= 60.0f;
  std::vector<float> s = x, t(x.size());
  ops.softcap_row(s.data(), n, 30.0f, t.data());
  for (int64_t j = 0; j < n; ++j)
    if (std::fabs(t[j] - std::tanh(static_cast<double>(x[j]) / 30.0)) > 1e-7) return fail(state, "wrong result");
  for (auto _ : state) {
    std::copy(x.begin(), x.end(), s.begin());
    ops.softcap_row(s.data(), n, 30.0f, t.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetLabel("128 x 64 scores, cap 30");
}

// Dropout over a 128 x 64 score tile at p = 0.1: Philox's keep decisions
// and the zeroing, as the kernels run them per score.
void dropout_rows_bench(benchmark::State& state, Isa isa) {
  const TileOps& ops = tile_ops(isa);
  std::vector<float> s(static_cast<size_t>(kRows * kCols), 1.0f);
  for (int64_t r = 0; r < kRows; ++r) ops.dropout_row(s.data() + r * kCols, kCols, r, 0.1f);
  const double kept = static_cast<double>(std::count(s.begin(), s.end(), 1.0f)) / static_cast<double>(s.size());
  if (kept < 0.87 || kept > 0.93) return fail(state, "wrong result");
  for (auto _ : state) {
    for (int64_t r = 0; r < kRows; ++r) ops.dropout_row(s.data() + r * kCols, kCols, r, 0.1f);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
  state.SetLabel("128 x 64 scores, p 0.1");
}

// The backward's row step: P = exp(S - lse), dS = P * (dP - delta). With
// lse = 2 and delta = -0.5, repeating it converges to S ~ 0.16, dS ~ 0.1.
void grad_rows_bench(benchmark::State& state, Isa isa) {
  const TileOps& ops = tile_ops(isa);
  std::vector<float> s = testing::uniform_floats(static_cast<size_t>(kRows * kCols), 6),
                     dp = testing::uniform_floats(s.size(), 7);
  const std::vector<float> s0 = s, dp0 = dp;
  constexpr float kLse = 2.0f, kDelta = -0.5f;
  for (int64_t r = 0; r < kRows; ++r) ops.grad_row(s.data() + r * kCols, dp.data() + r * kCols, kCols, kLse, kDelta);
  for (size_t i = 0; i < s.size(); ++i) {
    const double p = std::exp(static_cast<double>(s0[i]) - kLse), ds = p * (dp0[i] - kDelta);
    if (std::fabs(s[i] - p) > 4e-7 * p || std::fabs(dp[i] - ds) > 1e-6 * (std::fabs(ds) + p))
      return fail(state, "wrong result");
  }
  for (auto _ : state) {
    for (int64_t r = 0; r < kRows; ++r) ops.grad_row(s.data() + r * kCols, dp.data() + r * kCols, kCols, kLse, kDelta);
    benchmark::DoNotOptimize(s.data());
    benchmark::DoNotOptimize(dp.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
  state.SetLabel("128 rows of 64");
}

// A K tile [block_k = 64, head_dim = 128] into K^T [128, 64], as the forward stages it.
void transpose_bench(benchmark::State& state, Isa isa) {
  const TileOps& ops = tile_ops(isa);
  constexpr int64_t rows = 64, cols = 128;
  const std::vector<float> src = testing::uniform_floats(static_cast<size_t>(rows * cols), 8);
  std::vector<float> dst(src.size());
  ops.transpose(rows, cols, src.data(), cols, dst.data(), rows);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if (dst[c * rows + r] != src[r * cols + c]) return fail(state, "wrong result");
  for (auto _ : state) {
    ops.transpose(rows, cols, src.data(), cols, dst.data(), rows);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * rows * cols * static_cast<int64_t>(sizeof(float)));
  state.SetLabel("64x128");
}

// --- forward and backward through one ISA's kernel table -------------------------------

struct AlignedFree {
  void operator()(void* p) const { ::operator delete(p, std::align_val_t(kAlign)); }
};

// One small problem with its parameters, plans and workspace made once, so
// that the timed loop is the kernel table's entry point alone.
struct KernelCall {
  testing::Problem problem;
  testing::Outputs out;
  Grads grads;
  AttnParams fwd, bwd;
  TilePlan fwd_plan, bwd_plan;
  std::unique_ptr<void, AlignedFree> workspace;

  explicit KernelCall(const testing::Case& c)
      : problem(testing::make_problem(c)), out(testing::make_outputs(problem, false)),
        grads{out.dq.view, out.dk.view, out.dv.view, std::nullopt, std::nullopt} {
    const testing::Problem& p = problem;
    fwd = make_params("microbench", CallKind::forward, p.opts,
                      CallTensors{&p.q.view, &p.k.view, &p.v.view, &out.out.view, &out.lse.view});
    bwd = make_params("microbench", CallKind::backward, p.opts,
                      CallTensors{&p.q.view, &p.k.view, &p.v.view, &out.out.view, &out.lse.view, &p.dout.view,
                                  &grads});
    fwd.num_threads = bwd.num_threads = resolve_threads(c.num_threads);
    fwd_plan = plan_forward(fwd, pair_engine(kernels().isa, fwd));
    bwd_plan = plan_backward(bwd, pair_engine(kernels().isa, bwd));
    const int64_t bytes = round_up(std::max(fwd_plan.total_bytes(), bwd_plan.total_bytes()), kAlign);
    workspace.reset(::operator new(static_cast<size_t>(bytes), std::align_val_t(kAlign)));
  }
};

// 256 x 256, or 16 queries against 512 keys (K and V: 2 MiB at d = 128).
testing::Case small_case(DType dtype, int64_t head_dim, bool short_q) {
  testing::Case c;
  c.name = "microbench";
  c.dtype = dtype;
  c.batch = 1;
  c.seqlen_q = short_q ? 16 : 256;
  c.seqlen_k = short_q ? 512 : 256;
  c.heads_q = c.heads_kv = 4;
  c.head_dim = c.head_dim_v = head_dim;
  c.num_threads = 1;
  return c;
}

// Forward and backward of this ISA, dtype and head dim against the fp64
// reference (the harness's tolerance rule), on a shorter copy of the timed
// shape so that the reference stays cheap; once per combination.
std::string check_kernels(Isa isa, DType dtype, int64_t head_dim, bool short_q) {
  static std::map<std::string, std::string> done;
  const std::string key =
      std::string(isa_to_string(isa)) + dtype_name(dtype) + std::to_string(head_dim) + (short_q ? "s" : "");
  if (const auto it = done.find(key); it != done.end()) return it->second;
  testing::Case c = small_case(dtype, head_dim, short_q);
  c.seqlen_q = short_q ? 16 : 70;  // a full query tile and a partial one against two key tiles
  c.seqlen_k = short_q ? 150 : 100;
  c.heads_q = c.heads_kv = 2;
  const KernelTable& table = kernels_for(isa);
  KernelCall call(c);
  table.forward(call.fwd, call.fwd_plan, call.workspace.get());
  table.backward(call.bwd, call.bwd_plan, call.workspace.get());
  const testing::Report report = testing::compare_with_reference(call.problem, call.out, true);
  return done[key] = report.pass() ? "" : "fails the fp64 reference check on " + c.describe() + ":\n" + report.table();
}

void attention_bench(benchmark::State& state, Isa isa, DType dtype, int64_t head_dim, bool backward,
                     bool short_q) {
  if (const std::string why = check_kernels(isa, dtype, head_dim, short_q); !why.empty())
    return fail(state, why);
  const KernelTable& table = kernels_for(isa);
  const testing::Case c = small_case(dtype, head_dim, short_q);
  KernelCall call(c);
  void* ws = call.workspace.get();
  table.forward(call.fwd, call.fwd_plan, ws);  // backward reads out and lse
  for (auto _ : state) {
    if (backward)
      table.backward(call.bwd, call.bwd_plan, ws);
    else
      table.forward(call.fwd, call.fwd_plan, ws);
    benchmark::ClobberMemory();
  }
  set_flops(state, (backward ? 2.5 : 1.0) * c.forward_flops());
  state.SetLabel(c.describe() + ", 1 thread");
}

void register_isa(Isa isa) {
  const std::string name = isa_to_string(isa);
  benchmark::RegisterBenchmark(("gemm_block/" + name).c_str(), gemm_block_bench, isa)->ArgName("k")->Arg(64);
  for (const Product& pr : kProducts)
    benchmark::RegisterBenchmark(("gemm_nn/" + name + "/" + pr.name).c_str(), gemm_nn_bench, isa, pr);
  benchmark::RegisterBenchmark(("softmax_rows/" + name).c_str(), softmax_rows_bench, isa);
  benchmark::RegisterBenchmark(("grad_rows/" + name).c_str(), grad_rows_bench, isa);
  benchmark::RegisterBenchmark(("softcap_rows/" + name).c_str(), softcap_rows_bench, isa);
  benchmark::RegisterBenchmark(("dropout_rows/" + name).c_str(), dropout_rows_bench, isa);
  benchmark::RegisterBenchmark(("transpose/" + name).c_str(), transpose_bench, isa);
  for (const bool backward : {false, true})
    for (const DType dtype : {DType::f32, DType::bf16})
      for (const int64_t d : {64, 128}) {
        const std::string label = std::string(backward ? "backward/" : "forward/") + name + "/" +
                                  dtype_name(dtype) + "/L256_d" + std::to_string(d);
        benchmark::RegisterBenchmark(label.c_str(), attention_bench, isa, dtype, d, backward, false)
            ->Unit(benchmark::kMicrosecond);
      }
  for (const DType dtype : {DType::f32, DType::bf16}) {
    const std::string label = "forward/" + name + "/" + dtype_name(dtype) + "/Lq16_Lk512_d128";
    benchmark::RegisterBenchmark(label.c_str(), attention_bench, isa, dtype, int64_t{128}, false, true)
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace
}  // namespace flashgrad::bench

int main(int argc, char** argv) {
  using namespace flashgrad;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("flashgrad", version());
  benchmark::AddCustomContext("flashgrad isa in use", isa_name());
  for (const Isa isa : supported_isas()) bench::register_isa(isa);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (bench::g_failed) std::fprintf(stderr, "flashgrad_microbench: a benchmark's result check failed\n");
  return bench::g_failed ? 1 : 0;
}
