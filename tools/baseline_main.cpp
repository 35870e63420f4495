// flashgrad-baseline: the demo's baseline, attention materialized the way an
// unfused framework computes it, on OpenBLAS (naive_blas.hpp). It is its own
// program, built when CMake finds OpenBLAS, so that `flashgrad` links no BLAS;
// the demo runs it in child processes, as it runs its own measurements.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "cli.hpp"
#include "harness.hpp"
#include "measure.hpp"
#include "naive_blas.hpp"
#include "naive_measure.hpp"
#include "openblas.hpp"
#include "reference.hpp"

namespace flashgrad::tools {
namespace {

const char* const kProgram = "flashgrad-baseline";

const char* const kOverview =
    "usage: flashgrad-baseline <command> [flags]\n"
    "\n"
    "The naive attention `flashgrad demo` times flashgrad against: S, P and dP\n"
    "materialized for every head, the products done by OpenBLAS sgemm, f32 only.\n"
    "\n"
    "commands:\n"
    "  check    the baseline against the fp64 reference, within the bounds the\n"
    "           harness sets for any f32 implementation; exits 1 if it fails\n"
    "  info     the OpenBLAS version and the core it runs\n"
    "  measure  one timed forward+backward in this process\n"
    "\n"
    "`flashgrad-baseline <command> --help` lists the flags of a command.\n";

const testing::Buffer* baseline_output(const testing::Outputs& o, const std::string& name) {
  if (name == "out") return &o.out;
  if (name == "dq") return &o.dq;
  if (name == "dk") return &o.dk;
  if (name == "dv") return &o.dv;
  return nullptr;  // the baseline computes no lse
}

double max_abs_diff(const testing::Buffer& x, const testing::Buffer& ref) {
  const std::vector<double> a = testing::dense(x), b = testing::dense(ref);
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::fabs(a[i] - b[i]));
  return std::isnan(e) ? INFINITY : e;
}

// The baseline must be right too: its errors against the fp64 reference must
// stay within the bounds the harness sets for any f32 implementation. Prints
// one line: "<case>: ok (worst: dq at 0.12 of its bound)".
bool check_one(bool causal) {
  testing::Case c;
  c.name = "baseline";
  c.batch = 2;
  c.seqlen_q = 100;
  c.seqlen_k = 300;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = c.head_dim_v = 64;
  c.causal = causal;
  const testing::Report bounds = testing::check_case(c, true, testing::Bound::full);
  const testing::Problem p = testing::make_problem(c);
  testing::Outputs mine = testing::make_outputs(p, false), ref = testing::make_outputs(p, true);
  NaiveAttention naive(c.causal, 0.0);
  naive.forward(p.q.view, p.k.view, p.v.view, mine.out.view);
  naive.backward(p.q.view, p.k.view, p.v.view, p.dout.view, mine.dq.view, mine.dk.view, mine.dv.view);
  const auto f64 = reference::Precision::f64;
  reference::forward(p.opts, p.q.view, p.k.view, p.v.view, ref.out.view, ref.lse.view, f64);
  const Grads g{ref.dq.view, ref.dk.view, ref.dv.view, std::nullopt, std::nullopt};
  reference::backward(p.opts, p.q.view, p.k.view, p.v.view, p.dout.view, g, f64);

  bool ok = true;
  std::string worst;
  double worst_fraction = 0;
  for (const auto& t : bounds.tensors) {
    const testing::Buffer* computed = baseline_output(mine, t.name);
    if (!computed) continue;
    const double err = max_abs_diff(*computed, *baseline_output(ref, t.name));
    const double fraction = t.bound() > 0 ? err / t.bound() : (err > 0 ? INFINITY : 0);
    ok = ok && err <= t.bound();
    if (fraction >= worst_fraction) {
      worst_fraction = fraction;
      worst = t.name;
    }
  }
  std::printf("%s: %s (worst: %s at %.2f of its bound)\n", c.describe().c_str(), ok ? "ok" : "FAIL", worst.c_str(),
              worst_fraction);
  return ok;
}

int run_baseline_check(Args& args) {
  args.finish();
  const bool full = check_one(false);
  const bool causal = check_one(true);
  return full && causal ? 0 : 1;
}

int run_info(Args& args) {
  args.finish();
  const auto [core, origin] = choose_openblas_core();
  std::printf("openblas: %s\ncore: %s\ncore_origin: %s\n", openblas_version().c_str(), core.c_str(), origin.c_str());
  return 0;
}

int run_measure(Args& args) {
  const MeasureSpec spec = measure_flags(args, {"naive", "none"});
  args.finish();
  prepare_openblas_measure(args, spec, spec.impl == "naive");
  const testing::Problem p = testing::make_problem(spec.c);
  testing::Outputs o = testing::make_outputs(p, false);
  NaiveAttention naive(spec.c.causal, 0.0);
  print_measurement(spec, spec.impl == "naive" ? naive_passes(naive, p, o) : Passes{});
  return 0;
}

int dispatch(const std::string& command, Args& args) {
  if (command == "check") return run_baseline_check(args);
  if (command == "info") return run_info(args);
  if (command == "measure") return run_measure(args);
  throw UsageError(std::string(kProgram) + ": unknown command '" + command + "'; expected check, info or measure");
}

}  // namespace
}  // namespace flashgrad::tools

int main(int argc, char** argv) {
  using namespace flashgrad::tools;
  const Program program{
      kProgram,
      kOverview,
      {{"check", "usage: flashgrad-baseline check\n"
                 "  The baseline on 2 batches, L 100 x 300, 4 query and 2 key/value heads, d 64,\n"
                 "  full and causal: out, dq, dk and dv against the fp64 reference, each within\n"
                 "  the bound of flashgrad's f32 kernels (2 x naive f32 error + rounding noise).\n"},
       {"info", "usage: flashgrad-baseline info\n"
                "  Prints 'openblas: <version>', 'core: <core>' and 'core_origin: <why>'; the\n"
                "  core is the one measure runs (OPENBLAS_CORETYPE overrides it).\n"},
       {"measure", measure_usage(kProgram, "naive|none")}},
      dispatch};
  return run_program(program, argc, argv);
}
