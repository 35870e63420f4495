#include "measure.hpp"

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

namespace flashgrad::tools {
namespace {

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
std::vector<std::vector<double>> timed_split_runs(const Passes& p, double min_time,
                                                  const std::function<double()>& reference) {
  p.forward();
  p.backward();
  constexpr size_t kMinRuns = 3, kMaxRuns = 20;
  std::vector<std::vector<double>> times(4);
  double total = 0;
  while (times[2].size() < kMaxRuns && (times[2].size() < kMinRuns || total < min_time)) {
    if (reference) {
      times[3].push_back(reference());
      if (times[2].empty() || times[2].back() < 0.5) {
        p.forward();
        p.backward();
      }
    }
    const double f = time_calls(p.forward, 0, 1).front(), b = time_calls(p.backward, 0, 1).front();
    times[0].push_back(f);
    times[1].push_back(b);
    times[2].push_back(f + b);
    total += f + b;
  }
  return times;
}

void print_split(const MeasureSpec& spec, const Passes& passes, const PairedRate* paired) {
  const double flops = 3.5 * spec.c.forward_flops();
  const auto t = timed_split_runs(passes, spec.min_time, paired ? paired->gflops_now : std::function<double()>{});
  const int64_t reference_bytes = paired ? paired->resident_bytes : 0;
  std::printf("ms=%.4f fwd_ms=%.4f bwd_ms=%.4f fwd_bwd_ms=%.4f runs=%zu vmhwm=%lld flops=%.6g", 1e3 * median(t[2]),
              1e3 * median(t[0]), 1e3 * median(t[1]), 1e3 * median(t[2]), t[2].size(),
              static_cast<long long>(status_bytes("VmHWM:") - reference_bytes), flops);
  if (paired) {
    std::vector<double> fwd_ratio, bwd_ratio;
    for (size_t i = 0; i < t[3].size(); ++i) {
      fwd_ratio.push_back(spec.c.forward_flops() / t[0][i] / 1e9 / t[3][i]);
      bwd_ratio.push_back(2.5 * spec.c.forward_flops() / t[1][i] / 1e9 / t[3][i]);
    }
    std::printf(" sgemm_paired=%.2f fwd_over_sgemm=%.4f bwd_over_sgemm=%.4f", median(t[3]), median(fwd_ratio),
                median(bwd_ratio));
  }
  std::printf("\n");
}

}  // namespace

MeasureSpec measure_flags(Args& args, const std::vector<std::string>& impls) {
  MeasureSpec s;
  s.impl = args.choice("--impl", "", impls);
  if (s.impl.empty()) throw UsageError(args.prefix() + ": flag --impl is required");
  testing::Case& c = s.c;
  c.name = "measure";
  const std::string dtype = args.choice("--dtype", "f32", {"f32", "bf16", "f16", "f64"});
  c.dtype = dtype == "bf16" ? DType::bf16 : dtype == "f16" ? DType::f16 : dtype == "f64" ? DType::f64 : DType::f32;
  c.batch = args.integer("--batch", 1, 1);
  c.seqlen_q = c.seqlen_k = args.integer("--seqlen", 0, 1);
  if (c.seqlen_q == 0) throw UsageError(args.prefix() + ": flag --seqlen is required");
  c.heads_q = c.heads_kv = args.integer("--heads", 8, 1);
  c.head_dim = c.head_dim_v = args.integer("--head-dim", 64, 1, 512);
  c.causal = args.has("--causal");
  c.num_threads = static_cast<int>(args.integer("--threads", 0, 1, 4096));
  s.min_time = args.real("--min-time", 1.0, 0.0);
  s.split = args.has("--split");
  return s;
}

std::string measure_usage(const std::string& program, const std::string& impls, const std::string& extra_flags) {
  const std::string head = "usage: " + program + " measure ";
  const std::string pad(head.size(), ' ');
  return head + "--impl " + impls + " --seqlen L [--causal]\n" + pad +
         "[--batch B] [--heads H] [--head-dim D] [--threads T]\n" + pad +
         "[--dtype f32|bf16|f16|f64] [--min-time S] [--split]\n" +
         (extra_flags.empty() ? "" : pad + extra_flags + "\n") +
         "  Times forward+backward: one warmup call, then at least 3 calls and\n"
         "  --min-time seconds (default 1); a warmup slower than that is reported\n"
         "  alone. Prints 'ms=<median> runs=<n> vmhwm=<bytes> flops=<n>'.\n"
         "  --split times forward and backward apart in every run (always at least 3\n"
         "  runs) and adds fwd_ms, bwd_ms and fwd_bwd_ms. --impl none only allocates\n"
         "  the tensors, for the memory floor.\n";
}

Passes flashgrad_passes(const testing::Problem& p, testing::Outputs& o) {
  const Grads g{o.dq.view, o.dk.view, o.dv.view, std::nullopt, std::nullopt};
  return {[&p, &o] { forward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view); },
          [&p, &o, g] { backward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view, p.dout.view, g); }};
}

void print_measurement(const MeasureSpec& spec, const Passes& passes, const PairedRate* paired) {
  if (spec.split && passes.forward) {
    print_split(spec, passes, paired);
    return;
  }
  std::function<void()> both;
  if (passes.forward)
    both = [&passes] {
      passes.forward();
      passes.backward();
    };
  const std::vector<double> times = both ? timed_runs(both, spec.min_time) : std::vector<double>{};
  std::printf("ms=%.4f runs=%zu vmhwm=%lld flops=%.6g\n", 1e3 * median(times), times.size(),
              static_cast<long long>(status_bytes("VmHWM:")), 3.5 * spec.c.forward_flops());
}

int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;
  return -1;
}

}  // namespace flashgrad::tools
