// `flashgrad measure`: one timed forward+backward in this process. The demo
// and the sweep run it as a child so that the child's ru_maxrss is this
// measurement's peak memory and nothing else's.
#include <cblas.h>
#include <omp.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include "cli.hpp"
#include "harness.hpp"
#include "naive_blas.hpp"
#include "openblas.hpp"

namespace flashgrad::tools {
namespace {

testing::Case demo_case(Args& args) {
  testing::Case c;
  c.name = "measure";
  const std::string dtype = args.choice("--dtype", "f32", {"f32", "bf16", "f16", "f64"});
  c.dtype = dtype == "bf16" ? DType::bf16 : dtype == "f16" ? DType::f16 : dtype == "f64" ? DType::f64 : DType::f32;
  c.batch = args.integer("--batch", 1, 1);
  c.seqlen_q = c.seqlen_k = args.integer("--seqlen", 0, 1);
  if (c.seqlen_q == 0) throw UsageError("flashgrad measure: flag --seqlen is required");
  c.heads_q = c.heads_kv = args.integer("--heads", 8, 1);
  c.head_dim = c.head_dim_v = args.integer("--head-dim", 64, 1, 512);
  c.causal = args.has("--causal");
  c.num_threads = static_cast<int>(args.integer("--threads", 0, 1, 4096));
  return c;
}

// The first call is the warmup; one slower than min_time is the measurement
// itself, so that the longest lengths run once.
std::vector<double> timed_runs(const std::function<void()>& fn, double min_time) {
  const double first = time_calls(fn, 0, 1).front();
  if (first > min_time) return {first};
  constexpr size_t kMinRuns = 3, kMaxRuns = 20;
  std::vector<double> times;
  double total = 0;
  while (times.size() < kMaxRuns && (times.size() < kMinRuns || total < min_time)) {
    times.push_back(time_calls(fn, 0, 1).front());
    total += times.back();
  }
  return times;
}

// As timed_runs, but forward and backward are timed apart in each run:
// [0] forward, [1] backward, [2] their sum in the same run, and with a
// reference, [3] its rate measured just before each run. Short runs get an
// untimed call after the reference, whose operands push theirs out of L2.
std::vector<std::vector<double>> timed_split_runs(const std::function<void()>& fwd, const std::function<void()>& bwd,
                                                  double min_time, const std::function<double()>& reference) {
  fwd();
  bwd();
  constexpr size_t kMinRuns = 3, kMaxRuns = 20;
  std::vector<std::vector<double>> times(4);
  double total = 0;
  while (times[2].size() < kMaxRuns && (times[2].size() < kMinRuns || total < min_time)) {
    if (reference) {
      times[3].push_back(reference());
      if (times[2].empty() || times[2].back() < 0.5) {
        fwd();
        bwd();
      }
    }
    const double f = time_calls(fwd, 0, 1).front(), b = time_calls(bwd, 0, 1).front();
    times[0].push_back(f);
    times[1].push_back(b);
    times[2].push_back(f + b);
    total += f + b;
  }
  return times;
}

// VmHWM (the high-water mark, a cross-check of the parent's ru_maxrss) or
// VmRSS of this process image.
int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;
  return -1;
}

}  // namespace

int run_measure(Args& args) {
  const std::string impl = args.choice("--impl", "", {"flashgrad", "naive", "none"});
  if (impl.empty()) throw UsageError("flashgrad measure: flag --impl is required");
  const testing::Case c = demo_case(args);
  const double min_time = args.real("--min-time", 1.0, 0.0);
  const bool split = args.has("--split");
  const int64_t paired_n = args.integer("--paired-sgemm", 0, 0, 16384);
  args.finish();
  if (paired_n > 0 && !split) throw UsageError("flashgrad measure: --paired-sgemm needs --split");
  if (paired_n > 0 || impl == "naive") use_chosen_openblas_core("measure");
  if (impl == "naive" && c.dtype != DType::f32)
    throw UsageError("flashgrad measure: the naive baseline is f32 only, got --dtype " +
                     std::string(dtype_name(c.dtype)));
  if (c.num_threads > 0) {
    omp_set_num_threads(c.num_threads);
    openblas_set_num_threads(c.num_threads);
  }

  const testing::Problem p = testing::make_problem(c);
  testing::Outputs o = testing::make_outputs(p, false);
  std::function<void()> fwd, bwd;
  NaiveAttention naive(c.causal, 0.0);
  if (impl == "flashgrad") {
    const Grads g{o.dq.view, o.dk.view, o.dv.view, std::nullopt, std::nullopt};
    fwd = [&p, &o] { forward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view); };
    bwd = [&p, &o, g] {
      backward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view, p.dout.view, g);
    };
  } else if (impl == "naive") {
    naive.prepare(p.q.view, p.k.view, p.v.view);
    fwd = [&] { naive.forward(p.q.view, p.k.view, p.v.view, o.out.view); };
    bwd = [&] { naive.backward(p.q.view, p.k.view, p.v.view, p.dout.view, o.dq.view, o.dk.view, o.dv.view); };
  }
  const double flops = 3.5 * c.forward_flops();
  if (split && fwd) {
    // With --paired-sgemm N, an N x N SGEMM runs before each run, so that each
    // run's rate is divided by the machine's GEMM rate of that moment: this
    // VM's speed drifts by up to 1.5x within minutes (docs/performance.md).
    // The SGEMM's operands and OpenBLAS's buffers stay resident from its
    // first call on, so the peak memory reported is the high-water mark less
    // what that call added.
    std::optional<Sgemm> gemm;
    std::function<double()> reference;
    int64_t gemm_bytes = 0;
    if (paired_n > 0) {
      const int64_t before = status_bytes("VmRSS:");
      gemm.emplace(paired_n);
      gemm->run();
      gemm_bytes = status_bytes("VmRSS:") - before;
      reference = [&gemm] { return gemm->gflops_now(); };
    }
    const auto t = timed_split_runs(fwd, bwd, min_time, reference);
    std::printf("ms=%.4f fwd_ms=%.4f bwd_ms=%.4f fwd_bwd_ms=%.4f runs=%zu vmhwm=%lld flops=%.6g",
                1e3 * median(t[2]), 1e3 * median(t[0]), 1e3 * median(t[1]), 1e3 * median(t[2]), t[2].size(),
                static_cast<long long>(status_bytes("VmHWM:") - gemm_bytes), flops);
    if (gemm) {
      std::vector<double> fwd_ratio, bwd_ratio;
      for (size_t i = 0; i < t[3].size(); ++i) {
        fwd_ratio.push_back(c.forward_flops() / t[0][i] / 1e9 / t[3][i]);
        bwd_ratio.push_back(2.5 * c.forward_flops() / t[1][i] / 1e9 / t[3][i]);
      }
      std::printf(" sgemm_paired=%.2f fwd_over_sgemm=%.4f bwd_over_sgemm=%.4f", median(t[3]), median(fwd_ratio),
                  median(bwd_ratio));
    }
    std::printf("\n");
    return 0;
  }
  std::function<void()> both;
  if (fwd)
    both = [&] {
      fwd();
      bwd();
    };
  const std::vector<double> times = both ? timed_runs(both, min_time) : std::vector<double>{};
  std::printf("ms=%.4f runs=%zu vmhwm=%lld flops=%.6g\n", 1e3 * median(times), times.size(),
              static_cast<long long>(status_bytes("VmHWM:")), flops);
  return 0;
}

}  // namespace flashgrad::tools
