// The sweep's measurements made in this process (sweep.hpp): short queries
// against the bandwidth of reading K and V, the call overhead at L = 128, and
// all threads against one.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../src/check.hpp"  // make_params; tools/check.hpp is the programs' own
#include "bandwidth.hpp"
#include "cli.hpp"
#include "dispatch.hpp"
#include "openblas.hpp"  // settle
#include "parallel.hpp"
#include "sweep.hpp"
#include "tiling.hpp"
#include "workspace.hpp"

namespace flashgrad::tools::sweep {
namespace {

// Fills a buffer's bytes with values in [-1, 1) of its dtype (f32 or bf16),
// cheaply: the short-query K and V reach 1 GiB, where the harness's normal
// draws would take longer than the timing. Values only steer the softmax.
void fill_uniform(testing::Buffer& b, uint64_t seed) {
  const size_t n = b.bytes.size() / static_cast<size_t>(dtype_size(b.view.dtype));
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float f = static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f;
    if (b.view.dtype == DType::bf16) {
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      const auto half = static_cast<uint16_t>(bits >> 16);
      std::memcpy(b.bytes.data() + 2 * i, &half, 2);
    } else {
      std::memcpy(b.bytes.data() + 4 * i, &f, 4);
    }
  }
}

// The median seconds per call: one warm-up call, then at least `min_runs`
// calls and `min_time` seconds.
double median_call(const std::function<void()>& fn, int min_runs, double min_time) {
  fn();
  std::vector<double> times;
  double total = 0;
  while (static_cast<int>(times.size()) < min_runs || (total < min_time && times.size() < 200)) {
    times.push_back(time_calls(fn, 0, 1).front());
    total += times.back();
  }
  return median(times);
}

// Seconds per call of calls that take microseconds, for several callables
// timed in turn, batch by batch, so that a slow phase of the machine hits them
// alike: the median over 9 rounds of batches of at least 20 ms each.
std::vector<double> median_small_calls(const std::vector<std::function<void()>>& fns) {
  std::vector<int64_t> per_batch;
  for (const auto& fn : fns) {
    fn();
    int64_t n = 1;
    for (double t = 0; t < 0.02; n *= 2) {
      const double t0 = now_seconds();
      for (int64_t i = 0; i < n; ++i) fn();
      t = now_seconds() - t0;
    }
    per_batch.push_back(n);
  }
  std::vector<std::vector<double>> per_call(fns.size());
  for (int round = 0; round < 9; ++round)
    for (size_t f = 0; f < fns.size(); ++f) {
      const double t0 = now_seconds();
      for (int64_t i = 0; i < per_batch[f]; ++i) fns[f]();
      per_call[f].push_back((now_seconds() - t0) / static_cast<double>(per_batch[f]));
    }
  std::vector<double> out;
  for (const auto& times : per_call) out.push_back(median(times));
  return out;
}

// --- short queries ------------------------------------------------------------------

// Each configuration runs in rounds, a triad (bandwidth.hpp) before each
// round's calls, and reports the median of the rounds' ratios beside the
// ratio to the machine's triad: the machine's bandwidth drifts over a sweep
// as its SGEMM does.
void run_short_queries(Sweep& s) {
  constexpr int64_t kDim = 128;
  const bool quick = s.settings.quick;
  const std::vector<int64_t> lengths =
      quick ? std::vector<int64_t>{4096} : std::vector<int64_t>{4096, 16384, 65536, 131072};
  const int rounds = quick ? 1 : 3;
  Triad triad(quick ? (int64_t{1} << 23) : (int64_t{1} << 25), threads_of(s));
  std::printf("\n(short queries) forward, B=%lld H=%lld d=%lld: K and V bytes read per second, against the triad\n"
              "  (and against a triad timed before each of %d rounds of calls: medians)\n",
              static_cast<long long>(kBatch), static_cast<long long>(kHeads), static_cast<long long>(kDim), rounds);
  std::printf("  %-5s %4s %4s %7s %10s %10s %9s %12s %9s\n", "dtype", "K/V", "Lq", "Lk", "ms", "K+V GB/s",
              "x triad", "paired triad", "x paired");
  // K and V as [B, Lk, H, d], and for f32 also as [B, H, Lk, d] (a head's
  // rows contiguous, as in many KV caches), where the hardware prefetchers
  // see other streams (docs/performance.md).
  for (const DType dtype : {DType::f32, DType::bf16})
    for (const int64_t lk : lengths) {
      testing::Buffer k = testing::contiguous(dtype, {kBatch, lk, kHeads, kDim});
      testing::Buffer v = testing::contiguous(dtype, {kBatch, lk, kHeads, kDim});
      fill_uniform(k, 1);
      fill_uniform(v, 2);
      for (const bool bhsd : {false, true}) {
        if (bhsd && dtype != DType::f32) continue;
        if (bhsd)  // the same bytes read as [B, H, Lk, d]
          for (testing::Buffer* x : {&k, &v})
            x->view = TensorView::strided(x->bytes.data(), dtype, {kBatch, lk, kHeads, kDim},
                                          {kHeads * lk * kDim, kDim, lk * kDim, 1});
        for (const int64_t lq : {int64_t{1}, int64_t{16}}) {
          testing::Case c = Config{dtype, kDim, false, lq}.to_case(threads_of(s));
          c.seqlen_k = lk;
          c.layout = bhsd ? testing::Layout::bhsd : testing::Layout::bshd;
          if (!check_config(s, c)) continue;
          testing::Buffer q = testing::contiguous(dtype, {kBatch, lq, kHeads, kDim});
          testing::Buffer out = testing::contiguous(dtype, {kBatch, lq, kHeads, kDim});
          testing::Buffer lse = testing::contiguous(DType::f32, {kBatch, kHeads, lq});
          fill_uniform(q, 3);
          Options o;
          o.num_threads = threads_of(s);
          const double kv_bytes = static_cast<double>(k.bytes.size() + v.bytes.size());
          std::vector<double> times, triads, ratios;
          for (int round = 0; round < rounds; ++round) {
            triads.push_back(triad.gbs(3));
            times.push_back(median_call([&] { forward(o, q.view, k.view, v.view, out.view, lse.view); }, 3,
                                        quick ? 0.05 : 0.2));
            settle();
            ratios.push_back(kv_bytes / times.back() / 1e9 / triads.back());
          }
          ShortQuery r{dtype,          lq,         lk, kDim, bhsd ? "bhsd" : "bshd", 1e3 * median(times), kv_bytes,
                       median(triads), median(ratios)};
          s.short_queries.push_back(r);
          std::printf("  %-5s %4s %4lld %7lld %10.3f %10.1f %8.2fx %12.1f %8.2fx\n", dtype_name(dtype),
                      r.layout.c_str(), static_cast<long long>(lq), static_cast<long long>(lk), r.ms, r.gbs(),
                      r.gbs() / s.machine.triad_gbs(), r.paired_triad_gbs, r.paired_ratio);
          std::fflush(stdout);
        }
      }
    }
}

// --- call overhead ----------------------------------------------------------------------

// At L = 128 (B = 1, 8 heads, d = 64, f32): the API call, the kernel table's
// entry alone with its parameters, plan and workspace made beforehand, the
// validation and plan (*_workspace_bytes), the workspace's allocation, and the
// API call with one thread.
void run_overhead(Sweep& s) {
  const testing::Case c = Config{DType::f32, 64, false, 128}.to_case(threads_of(s));
  if (!check_config(s, c)) return;
  const testing::Problem p = testing::make_problem(c);
  testing::Outputs o = testing::make_outputs(p, false);
  const Grads g{o.dq.view, o.dk.view, o.dv.view, std::nullopt, std::nullopt};
  Options one = p.opts;
  one.num_threads = 1;
  const CallTensors fwd_t{&p.q.view, &p.k.view, &p.v.view, &o.out.view, &o.lse.view};
  const CallTensors bwd_t{&p.q.view, &p.k.view, &p.v.view, &o.out.view, &o.lse.view, &p.dout.view, &g};
  const KernelTable& table = kernels();
  forward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view);  // backward reads out and lse

  std::printf("\n(overhead) one call at %s, microseconds\n", c.describe().c_str());
  std::printf("  %-9s %9s %9s %9s %9s %10s %9s %9s\n", "pass", "call", "kernel", "outside", "validate", "workspace",
              "1 thread", "speedup");
  for (const bool bwd : {false, true}) {
    AttnParams params = make_params("sweep", bwd ? CallKind::backward : CallKind::forward, p.opts, bwd ? bwd_t : fwd_t);
    params.num_threads = resolve_threads(params.num_threads);
    const Isa isa = kernels().isa;
    const PairEngine engine = pair_engine(isa, params);
    const TilePlan plan = bwd ? plan_backward(params, engine) : plan_forward(params, engine);
    Workspace ws("sweep", plan.total_bytes());
    auto api = [&](const Options& opts) {
      return [&, opts] {
        if (bwd)
          backward(opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view, p.dout.view, g);
        else
          forward(opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view);
      };
    };
    auto kernel = [&] {
      if (bwd)
        table.backward(params, plan, ws.data());
      else
        table.forward(params, plan, ws.data());
    };
    auto validate = [&] {
      if (bwd)
        backward_workspace_bytes(p.opts, p.q.view, p.k.view, p.v.view);
      else
        forward_workspace_bytes(p.opts, p.q.view, p.k.view, p.v.view);
    };
    auto workspace = [&] { Workspace w("sweep", plan.total_bytes()); };
    const std::vector<double> t = median_small_calls({api(p.opts), kernel, validate, workspace, api(one)});
    Overhead r;
    r.pass = bwd ? "backward" : "forward";
    r.api_us = 1e6 * t[0];
    r.kernel_us = 1e6 * t[1];
    r.validate_us = 1e6 * t[2];
    r.workspace_us = 1e6 * t[3];
    r.api_1thread_us = 1e6 * t[4];
    s.overhead.push_back(r);
    std::printf("  %-9s %9.1f %9.1f %9.1f %9.2f %10.2f %9.1f %8.2fx\n", r.pass.c_str(), r.api_us, r.kernel_us,
                r.api_us - r.kernel_us, r.validate_us, r.workspace_us, r.api_1thread_us, r.api_1thread_us / r.api_us);
  }
}

// --- threads against one thread -------------------------------------------------------------

// One call with 1 thread, then one with `threads`, round after round (at
// least 3 and min_time s), so that the machine's drift hits both alike.
ThreadPair time_thread_pair(const std::function<void()>& fn, int& num_threads, int threads, double min_time) {
  std::vector<double> one, many, ratio;
  double total = 0;
  for (int round = -1; round < 3 || (total < min_time && round < 200); ++round) {
    num_threads = 1;
    const double t1 = time_calls(fn, 0, 1).front();
    num_threads = threads;
    const double tn = time_calls(fn, 0, 1).front();
    if (round < 0) continue;  // warm-up
    one.push_back(t1);
    many.push_back(tn);
    ratio.push_back(t1 / tn);
    total += t1 + tn;
  }
  return {1e3 * median(one), 1e3 * median(many), median(ratio)};
}

void run_scaling(Sweep& s) {
  const int threads = threads_of(s);
  const std::vector<int64_t> lengths = s.settings.quick ? std::vector<int64_t>{1024} : std::vector<int64_t>{1024, 4096};
  const std::vector<int64_t> dims = s.settings.quick ? std::vector<int64_t>{64} : std::vector<int64_t>{64, 128};
  std::printf("\n(scaling) f32, B=%lld H=%lld, full mask: %d threads against 1, median ms\n",
              static_cast<long long>(kBatch), static_cast<long long>(kHeads), threads);
  std::printf("  %6s %4s %10s %10s %8s %10s %10s %8s\n", "L", "d", "fwd 1t", "fwd", "speedup", "bwd 1t", "bwd",
              "speedup");
  for (const int64_t seqlen : lengths)
    for (const int64_t d : dims) {
      const testing::Case c = Config{DType::f32, d, false, seqlen}.to_case(threads);
      if (!check_config(s, c)) continue;
      const testing::Problem p = testing::make_problem(c);
      testing::Outputs o = testing::make_outputs(p, false);
      const Grads g{o.dq.view, o.dk.view, o.dv.view, std::nullopt, std::nullopt};
      Options opts = p.opts;
      auto fwd = [&] { forward(opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view); };
      auto bwd = [&] { backward(opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view, p.dout.view, g); };
      const double min_time = s.settings.quick ? 0.1 : 1.0;
      const Scaling r{seqlen, d, time_thread_pair(fwd, opts.num_threads, threads, min_time),
                      time_thread_pair(bwd, opts.num_threads, threads, min_time)};
      s.scaling.push_back(r);
      std::printf("  %6lld %4lld %10.1f %10.1f %7.2fx %10.1f %10.1f %7.2fx\n", static_cast<long long>(seqlen),
                  static_cast<long long>(d), r.fwd.ms_1, r.fwd.ms_n, r.fwd.speedup, r.bwd.ms_1, r.bwd.ms_n,
                  r.bwd.speedup);
      std::fflush(stdout);
    }
}

}  // namespace

void run_extras(Sweep& s) {
  run_short_queries(s);
  run_overhead(s);
  run_scaling(s);
}

}  // namespace flashgrad::tools::sweep
