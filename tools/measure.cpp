// `flashgrad measure`: one timed forward+backward in this process. The demo
// runs it as a child so that the child's ru_maxrss is this measurement's peak
// memory and nothing else's.
#include <cblas.h>
#include <omp.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "cli.hpp"
#include "harness.hpp"
#include "naive_blas.hpp"

namespace flashgrad::tools {
namespace {

testing::Case demo_case(Args& args) {
  testing::Case c;
  c.name = "measure";
  c.dtype = DType::f32;
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

// VmHWM of this process image, as a cross-check of the parent's ru_maxrss.
int64_t vm_hwm_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

}  // namespace

int run_measure(Args& args) {
  const std::string impl = args.choice("--impl", "", {"flashgrad", "naive", "none"});
  if (impl.empty()) throw UsageError("flashgrad measure: flag --impl is required");
  const testing::Case c = demo_case(args);
  const double min_time = args.real("--min-time", 1.0, 0.0);
  args.finish();
  if (c.num_threads > 0) {
    omp_set_num_threads(c.num_threads);
    openblas_set_num_threads(c.num_threads);
  }

  const testing::Problem p = testing::make_problem(c);
  testing::Outputs o = testing::make_outputs(p, false);
  std::function<void()> fn;
  NaiveAttention naive(c.causal, 0.0);
  if (impl == "flashgrad") {
    const Grads g{o.dq.view, o.dk.view, o.dv.view, std::nullopt, std::nullopt};
    fn = [&p, &o, g] {
      forward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view);
      backward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view, p.dout.view, g);
    };
  } else if (impl == "naive") {
    naive.prepare(p.q.view, p.k.view, p.v.view);
    fn = [&] {
      naive.forward(p.q.view, p.k.view, p.v.view, o.out.view);
      naive.backward(p.q.view, p.k.view, p.v.view, p.dout.view, o.dq.view, o.dk.view, o.dv.view);
    };
  }
  const std::vector<double> times = fn ? timed_runs(fn, min_time) : std::vector<double>{};
  std::printf("ms=%.4f runs=%zu vmhwm=%lld flops=%.6g\n", 1e3 * median(times), times.size(),
              static_cast<long long>(vm_hwm_bytes()), 3.5 * c.forward_flops());
  return 0;
}

}  // namespace flashgrad::tools
