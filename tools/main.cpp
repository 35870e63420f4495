// flashgrad: check, benchmark and demonstrate the library from the shell.
// It links the library and the test harness only; the demo's OpenBLAS
// baseline is a program of its own (baseline.hpp), and the measurement lab
// (A/B, the sweep, roofline) is flashgrad-lab in bench/lab/.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "baseline.hpp"
#include "case_flags.hpp"
#include "check.hpp"
#include "cli.hpp"
#include "dispatch.hpp"
#include "flashgrad/flashgrad.hpp"
#include "measure.hpp"

namespace flashgrad::tools {

int run_bench(Args& args);  // bench.cpp
int run_demo(Args& args);   // demo.cpp

namespace {

const char* const kOverview =
    "usage: flashgrad <command> [flags]\n"
    "\n"
    "commands:\n"
    "  check    compare the kernels with the fp64 reference on the edge cases\n"
    "           and on random cases; exits 1 if any case fails\n"
    "  bench    check, then time forward and backward for one configuration\n"
    "  demo     correctness, then time and peak memory of flashgrad against\n"
    "           materialized attention on OpenBLAS as the sequence grows\n"
    "  info     version, SIMD paths and threads; with --explain, the plans of\n"
    "           a configuration\n"
    "  measure  one timed forward+backward in this process (the demo runs it in\n"
    "           a child process to read that child's peak memory)\n"
    "\n"
    "`flashgrad <command> --help` lists the flags of a command.\n"
    "FLASHGRAD_ISA=scalar|avx2|avx512|avx512bf16|amx forces a SIMD path.\n"
    "The measurement lab (ab, sweep, roofline) is flashgrad-lab, built in bench/.\n";

std::map<std::string, std::string> usage() {
  return {
      {"check",
       "usage: flashgrad check [--random N] [--seed S] [--quick] [--threads T]\n"
       "  --random N   also run N random cases, seeds S .. S+N-1 (default 0)\n"
       "  --seed S     first random seed (default 1)\n"
       "  --quick      forward only: skip the backward pass and its gradients\n"
       "  --threads T  threads for the kernels (default: all cores)\n"},
      {"bench",
       std::string("usage: flashgrad bench [flags]\n") + kCaseFlagsUsage +
           "  --repeats N          timed calls per pass; the median is reported (default 5)\n"
           "  --warmup N           untimed calls first (default 1)\n"
           "  --json               print one JSON object instead of the table\n"
           "  --cold-mib M         time calls on copies of the problem (new seeds), in turn,\n"
           "                       whose inputs add up to M MiB: each call then reads its\n"
           "                       inputs from memory, not from cache (default 0: one copy)\n"
           "  --features           instead: the rate of each feature (softcap 30, dropout 0.1,\n"
           "                       bias, mask, windows 256 and 1024, MQA, short sequences at\n"
           "                       B * L = L), alone and with causal, over the plain rate,\n"
           "                       in one run; L defaults to 2048, and --dtypes (f32,bf16)\n"
           "                       and --dims (64,128) list what to run\n"
           "  The benchmark suite over many configurations is `flashgrad-lab sweep`.\n"},
      {"info", std::string("usage: flashgrad info [--explain [flags]]\n"
                           "  version, the SIMD paths and threads; with --explain, the plans of a\n"
                           "  forward and a backward on the configuration the flags describe:\n") +
                   kCaseFlagsUsage},
      {"demo",
       "usage: flashgrad demo [--out DIR] [--threads T] [--budget-s S] [--min-seqlen L]\n"
       "                      [--max-seqlen L] [--memory-gib G] [--no-plot]\n"
       "  The baseline runs in flashgrad-baseline, beside this program, built when\n"
       "  CMake finds OpenBLAS; without it the demo times flashgrad alone.\n"
       "  --out DIR        where demo.md, demo.json and demo.png go (default out/demo)\n"
       "  --threads T      threads for flashgrad and OpenBLAS (default: all cores)\n"
       "  --budget-s S     stop doubling when the next length would end past S\n"
       "                   seconds of total run time (default 225)\n"
       "  --min-seqlen L   first sequence length (default 512)\n"
       "  --max-seqlen L   last sequence length (default: memory and budget decide)\n"
       "  --memory-gib G   treat at most G GiB as available (default: MemAvailable),\n"
       "                   to reach the baseline's memory limit sooner\n"
       "  --no-plot        do not draw demo.png\n"},
      {"measure", measure_usage("flashgrad", "flashgrad|naive|none") +
                      "  --impl naive runs flashgrad-baseline measure with the same flags (f32 only).\n"},
  };
}

std::vector<std::string> isa_names() {
  std::vector<std::string> out;
  for (const Isa isa : supported_isas()) out.push_back(isa_to_string(isa));
  return out;
}

// The plans of both passes on the configuration of the case flags.
int run_explain(Args& args) {
  const testing::Case c = case_from_flags(args);
  args.finish();
  const testing::Problem p = testing::make_problem(c);
  std::printf("config:   %s\n", c.describe().c_str());
  std::printf("forward:  %s\n", explain_forward(p.opts, p.q.view, p.k.view, p.v.view).describe().c_str());
  std::printf("backward: %s\n", explain_backward(p.opts, p.q.view, p.k.view, p.v.view).describe().c_str());
  return 0;
}

int run_info(Args& args) {
  if (args.has("--explain")) return run_explain(args);
  args.finish();
  std::string supported;
  for (const auto& name : isa_names()) supported += (supported.empty() ? "" : " ") + name;
  std::printf("flashgrad %s\n", version().c_str());
  std::printf("isa in use:     %s\n", isa_name());
  std::printf("isa supported:  %s\n", supported.c_str());
  std::printf("max threads:    %d\n", max_threads());
  return 0;
}

int run_measure(Args& args) {
  const MeasureSpec spec = measure_flags(args, {"flashgrad", "naive", "none"});
  args.finish();
  if (spec.impl == "naive") {
    const Baseline baseline = find_baseline();
    if (baseline.path.empty())
      args.fail("--impl", "flashgrad or none (naive runs in flashgrad-baseline, which " + baseline.missing + ")",
                spec.impl);
    exec_baseline(baseline, args);
  }
  const testing::Problem p = testing::make_problem(spec.c);
  testing::Outputs o = testing::make_outputs(p, false);
  print_measurement(spec, spec.impl == "flashgrad" ? flashgrad_passes(p, o) : Passes{});
  return 0;
}

int dispatch(const std::string& command, Args& args) {
  if (command == "check") return run_check(args);
  if (command == "bench") return run_bench(args);
  if (command == "info") return run_info(args);
  if (command == "demo") return run_demo(args);
  if (command == "measure") return run_measure(args);
  std::string lab;
  if (command == "ab" || command == "roofline" || command == "sweep")
    lab = " (" + command + " is a command of flashgrad-lab, the measurement lab built in bench/)";
  throw UsageError("flashgrad: unknown command '" + command + "'; expected check, bench, demo, info or measure" + lab);
}

}  // namespace
}  // namespace flashgrad::tools

int main(int argc, char** argv) {
  using namespace flashgrad::tools;
  return run_program({"flashgrad", kOverview, usage(), dispatch}, argc, argv);
}
