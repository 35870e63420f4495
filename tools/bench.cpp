// `flashgrad bench`: check one configuration on a small copy of it, then time
// forward, backward and both, and report the median and GFLOP/s.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "case_flags.hpp"
#include "check.hpp"
#include "cli.hpp"
#include "harness.hpp"

namespace flashgrad::tools {
namespace {

using testing::Case;

struct Timing {
  std::string pass, key;  // key: the pass's name in --json output
  double flops = 0;
  std::vector<double> seconds;
  double median_s() const { return median(seconds); }
  double min_s() const { return *std::min_element(seconds.begin(), seconds.end()); }
  double gflops() const { return flops / median_s() / 1e9; }
};

// The timed calls take problems (copies of one shape, new seeds) in turn,
// each with its own outputs.
struct Rotation {
  std::vector<testing::Problem> copies;
  std::vector<const testing::Problem*> problems;
  std::vector<testing::Outputs> outputs;
  size_t next = 0;
  size_t take() { return next++ % problems.size(); }
};

// p, then copies of it until their inputs add up to cold_mib: each call then
// reads q, k, v and dout from memory, not from the cache that the call before
// left warm (a decode step reads a KV cache that many layers' reads evicted).
void fill_rotation(Rotation& r, const testing::Problem& p, int64_t cold_mib) {
  const int64_t bytes = static_cast<int64_t>(p.q.bytes.size() + p.k.bytes.size() + p.v.bytes.size() +
                                             p.dout.bytes.size());
  for (int64_t total = bytes; total < cold_mib * (int64_t{1} << 20); total += bytes) {
    Case c = p.c;
    c.seed += r.copies.size() + 1;
    r.copies.push_back(testing::make_problem(c));
  }
  r.problems.push_back(&p);
  for (const testing::Problem& x : r.copies) r.problems.push_back(&x);
  for (const testing::Problem* x : r.problems) r.outputs.push_back(testing::make_outputs(*x, false));
  // The backward reads each copy's out and lse, whichever copies the timed
  // forwards reach.
  for (size_t i = 0; i < r.problems.size(); ++i) {
    const testing::Problem& x = *r.problems[i];
    forward(x.opts, x.q.view, x.k.view, x.v.view, r.outputs[i].out.view, r.outputs[i].lse.view);
  }
}

std::vector<Timing> time_passes(Rotation& r, int64_t warmup, int64_t repeats) {
  auto fwd_of = [&](size_t i) {
    const testing::Problem& p = *r.problems[i];
    testing::Outputs& o = r.outputs[i];
    forward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view);
  };
  auto bwd_of = [&](size_t i) {
    const testing::Problem& p = *r.problems[i];
    testing::Outputs& o = r.outputs[i];
    const Grads g{o.dq.view, o.dk.view, o.dv.view, std::nullopt, std::nullopt};
    backward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view, p.dout.view, g);
  };
  const double f = r.problems.front()->c.forward_flops();
  std::vector<Timing> out;
  out.push_back({"forward", "forward", f, time_calls([&] { fwd_of(r.take()); }, warmup, repeats)});
  out.push_back({"backward", "backward", 2.5 * f, time_calls([&] { bwd_of(r.take()); }, warmup, repeats)});
  out.push_back({"forward+backward", "forward_backward", 3.5 * f,
                 time_calls(
                     [&] {
                       const size_t i = r.take();
                       fwd_of(i);
                       bwd_of(i);
                     },
                     warmup, repeats)});
  return out;
}

std::string config_json(const Case& c) {
  return Json()
      .add("dtype", dtype_name(c.dtype))
      .add("batch", c.batch)
      .add("seqlen_q", c.seqlen_q)
      .add("seqlen_k", c.seqlen_k)
      .add("heads_q", c.heads_q)
      .add("heads_kv", c.heads_kv)
      .add("head_dim", c.head_dim)
      .add("head_dim_v", c.head_dim_v)
      .add("causal", c.causal)
      .add("window_left", c.window_left)
      .add("window_right", c.window_right)
      .str();
}

void print_json(const Case& c, const Case& small, const testing::Report& r, int threads,
                const std::vector<Timing>& timings, int64_t warmup, int64_t repeats, int64_t ws_fwd,
                int64_t ws_bwd, size_t copies, const std::pair<std::string, std::string>& plans) {
  Json j;
  j.add("version", version()).add("isa", isa_name()).add("threads", threads);
  j.add_raw("plan", Json().add("forward", plans.first).add("backward", plans.second).str());
  j.add_raw("config", config_json(c));
  j.add_raw("check", Json()
                         .add("case", small.describe())
                         .add("passed", r.pass())
                         .add("worst_fraction_of_bound", worst_fraction(r))
                         .str());
  j.add_raw("workspace_bytes", Json().add("forward", ws_fwd).add("backward", ws_bwd).str());
  j.add("warmup", warmup).add("repeats", repeats).add("input_copies", static_cast<int64_t>(copies));
  for (const Timing& t : timings)
    j.add_raw(t.key, Json()
                         .add("flops", t.flops)
                         .add("median_ms", 1e3 * t.median_s())
                         .add("min_ms", 1e3 * t.min_s())
                         .add("gflops", t.gflops())
                         .str());
  std::printf("%s\n", j.str().c_str());
}

void print_table(const Case& c, const Case& small, const testing::Report& r, int threads,
                 const std::vector<Timing>& timings, int64_t repeats, int64_t ws_fwd, int64_t ws_bwd,
                 size_t copies, const std::pair<std::string, std::string>& plans) {
  std::printf("flashgrad %s bench: isa %s, %d threads\n", version().c_str(), isa_name(), threads);
  std::printf("config:    %s\n", c.describe().c_str());
  std::printf("check:     ok on %s (worst error %.2f of its bound)\n", small.describe().c_str(),
              worst_fraction(r));
  std::printf("workspace: forward %.2f MiB, backward %.2f MiB\n", mib(ws_fwd), mib(ws_bwd));
  std::printf("plan:      %s\n           %s\n", plans.first.c_str(), plans.second.c_str());
  if (copies > 1) std::printf("inputs:    %zu copies, taken in turn\n", copies);
  std::printf("\n%-18s %12s %12s %10s   (median of %lld)\n", "pass", "median ms", "min ms", "GFLOP/s",
              static_cast<long long>(repeats));
  for (const Timing& t : timings)
    std::printf("%-18s %12.3f %12.3f %10.2f\n", t.pass.c_str(), 1e3 * t.median_s(), 1e3 * t.min_s(),
                t.gflops());
}

}  // namespace

int run_bench_features(Args& args);  // bench_features.cpp

int run_bench(Args& args) {
  if (args.has("--features")) return run_bench_features(args);
  const Case c = case_from_flags(args);
  const int64_t repeats = args.integer("--repeats", 5, 1);
  const int64_t warmup = args.integer("--warmup", 1, 0);
  const bool json = args.has("--json");
  const int64_t cold_mib = args.integer("--cold-mib", 0, 0);
  args.finish();
  const int threads = c.num_threads > 0 ? c.num_threads : max_threads();

  // A wrong kernel must never be reported as fast.
  const Case small = small_copy(c);
  const testing::Report r = testing::check_case(small);
  if (!r.pass()) {
    std::fprintf(stderr, "flashgrad bench: the kernels fail their check on %s; not timing them\n%s",
                 small.describe().c_str(), r.table().c_str());
    return 1;
  }
  const testing::Problem p = testing::make_problem(c);
  const int64_t ws_fwd = forward_workspace_bytes(p.opts, p.q.view, p.k.view, p.v.view);
  const int64_t ws_bwd = backward_workspace_bytes(p.opts, p.q.view, p.k.view, p.v.view);
  const std::pair<std::string, std::string> plans{explain_forward(p.opts, p.q.view, p.k.view, p.v.view).describe(),
                                                  explain_backward(p.opts, p.q.view, p.k.view, p.v.view).describe()};
  Rotation calls;
  fill_rotation(calls, p, cold_mib);
  const std::vector<Timing> timings = time_passes(calls, warmup, repeats);
  if (json)
    print_json(c, small, r, threads, timings, warmup, repeats, ws_fwd, ws_bwd, calls.problems.size(), plans);
  else
    print_table(c, small, r, threads, timings, repeats, ws_fwd, ws_bwd, calls.problems.size(), plans);
  return 0;
}

}  // namespace flashgrad::tools
