// flashgrad: check, benchmark and demonstrate the library from the shell.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "case_flags.hpp"
#include "cli.hpp"
#include "dispatch.hpp"
#include "flashgrad/flashgrad.hpp"

namespace flashgrad::tools {
namespace {

const char* const kOverview =
    "usage: flashgrad <command> [flags]\n"
    "\n"
    "commands:\n"
    "  ab       time two builds of the library in turns in one process, on one\n"
    "           configuration, and compare their outputs bit for bit\n"
    "  check    compare the kernels with the fp64 reference on the edge cases\n"
    "           and on random cases; exits 1 if any case fails\n"
    "  bench    check, then time forward and backward for one configuration;\n"
    "           with --sweep, the benchmark suite against GEMM, memory and peers\n"
    "  demo     correctness, then time and peak memory of flashgrad against\n"
    "           materialized attention on OpenBLAS as the sequence grows\n"
    "  info     version, SIMD paths and threads\n"
    "  measure  one timed forward+backward in this process (the demo and the\n"
    "           sweep run it in a child process to read that child's peak memory)\n"
    "  roofline this machine's SGEMM, bf16 GEMM and memory bandwidth\n"
    "\n"
    "`flashgrad <command> --help` lists the flags of a command.\n"
    "FLASHGRAD_ISA=scalar|avx2|avx512|avx512bf16|amx forces a SIMD path.\n";

const std::map<std::string, std::string> kUsage = {
    {"ab",
     std::string("usage: flashgrad ab --lib-a A.so --lib-b B.so [flags]\n"
                 "  Loads two builds of libflashgrad (for example before and after a change)\n"
                 "  into this process, checks each against the fp64 reference on a small copy\n"
                 "  of the configuration, then times the pass with each, alternating A B B A,\n"
                 "  so that a machine whose speed drifts slows both alike. Prints each build's\n"
                 "  median, the median and quartiles of the per-pair ratio A's time / B's time\n"
                 "  (above 1: B is faster) and whether the two builds' outputs are bitwise\n"
                 "  identical. The same file twice loads B from a temporary copy: its ratios\n"
                 "  show this machine's noise. FLASHGRAD_ISA applies to both.\n"
                 "  --lib-a PATH, --lib-b PATH   the two shared libraries (required)\n"
                 "  --pass P             forward, backward or forward+backward (default forward)\n"
                 "  --pairs N            timed calls of each build (default 20)\n"
                 "  --warmup N           untimed calls of each first (default 1)\n"
                 "  --expect-identical   exit 1 if the outputs differ in any bit\n"
                 "  --json               print one JSON object instead of the text\n") +
         kCaseFlagsUsage},
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
     "\n"
     "usage: flashgrad bench --sweep [--quick] [--out DIR] [--max-seqlen L] [--min-seqlen L]\n"
     "                       [--threads T] [--budget-s S] [--no-torch] [--no-plot]\n"
     "  The benchmark suite (docs/performance.md): the machine's GEMM and memory rates,\n"
     "  then f32/bf16, d 64/128, causal or not, L doubling from --min-seqlen (512) to\n"
     "  --max-seqlen (8192): flashgrad (checked first), naive OpenBLAS attention and\n"
     "  PyTorch, each in a child process for its peak memory; short queries, call\n"
     "  overhead and thread scaling. Writes sweep.md, sweep.json and PNG plots.\n"
     "  --out DIR      (default out/sweep)\n"
     "  --quick        a small subset: L <= 1024, d 64, short runs, torch at L=512 only\n"
     "  --budget-s S   skip a peer at a length whose predicted time would end past S\n"
     "                 seconds of the whole run (default 840; 45 with --quick)\n"
     "  --no-torch     leave PyTorch out\n"
     "  --no-plot      do not draw the PNGs\n"},
    {"info", std::string("usage: flashgrad info [--explain [flags]]\n"
                         "  version, the SIMD paths and threads; with --explain, the plans of a\n"
                         "  forward and a backward on the configuration the flags describe:\n") +
                 kCaseFlagsUsage},
    {"demo",
     "usage: flashgrad demo [--out DIR] [--threads T] [--budget-s S] [--min-seqlen L]\n"
     "                      [--max-seqlen L] [--memory-gib G] [--no-plot]\n"
     "  --out DIR        where demo.md, demo.json and demo.png go (default out/demo)\n"
     "  --threads T      threads for flashgrad and OpenBLAS (default: all cores)\n"
     "  --budget-s S     stop doubling when the next length would end past S\n"
     "                   seconds of total run time (default 225)\n"
     "  --min-seqlen L   first sequence length (default 512)\n"
     "  --max-seqlen L   last sequence length (default: memory and budget decide)\n"
     "  --memory-gib G   treat at most G GiB as available (default: MemAvailable),\n"
     "                   to reach the baseline's memory limit sooner\n"
     "  --no-plot        do not draw demo.png\n"},
    {"measure",
     "usage: flashgrad measure --impl flashgrad|naive|none --seqlen L [--causal]\n"
     "                         [--batch B] [--heads H] [--head-dim D] [--threads T]\n"
     "                         [--dtype f32|bf16|f16|f64] [--min-time S] [--split]\n"
     "                         [--paired-sgemm N]\n"
     "  Times forward+backward (naive: f32 only): one warmup call, then at least 3\n"
     "  calls and --min-time seconds (default 1); a warmup slower than that is\n"
     "  reported alone. Prints 'ms=<median> runs=<n> vmhwm=<bytes> flops=<n>'.\n"
     "  --split times forward and backward apart in every run (always at least 3\n"
     "  runs) and adds fwd_ms, bwd_ms and fwd_bwd_ms. --paired-sgemm N (with\n"
     "  --split) times an N x N OpenBLAS SGEMM before every run and adds\n"
     "  sgemm_paired (its median, GFLOP/s) and fwd_over_sgemm, bwd_over_sgemm\n"
     "  (medians of each run's rate over its own SGEMM); vmhwm then leaves out\n"
     "  the SGEMM's memory. --impl none only allocates the tensors, for the\n"
     "  memory floor.\n"},
    {"roofline",
     "usage: flashgrad roofline [--threads T] [--quick] [--json] [--probe | --peak]\n"
     "  The rates the sweep divides flashgrad's by: OpenBLAS SGEMM (n=2048, T threads\n"
     "  and 1), oneDNN bf16 GEMM (n=2048; n/a without oneDNN), the tile products'\n"
     "  shapes with OpenBLAS and with flashgrad's tile product (1 thread), STREAM\n"
     "  triad and memcpy bandwidth (T threads). Medians after a warm-up call.\n"
     "  --probe: SGEMM alone, median of 3, as one JSON object (the sweep's drift probe).\n"
     "  --peak: the arithmetic peak alone: f32 FMA and bf16 pair products (AMX or\n"
     "  AVX512_BF16) in loops that touch no memory, on T threads, best of 5.\n"},
};

std::vector<std::string> isa_names() {
  std::vector<std::string> out;
  for (const Isa isa : supported_isas()) out.push_back(isa_to_string(isa));
  return out;
}

int dispatch(const std::string& command, Args& args) {
  if (command == "ab") return run_ab(args);
  if (command == "check") return run_check(args);
  if (command == "bench") return run_bench(args);
  if (command == "info") return run_info(args);
  if (command == "demo") return run_demo(args);
  if (command == "measure") return run_measure(args);
  if (command == "roofline") return run_roofline(args);
  throw UsageError("flashgrad: unknown command '" + command +
                   "'; expected ab, check, bench, demo, info, measure or roofline");
}

}  // namespace

std::string version() { return flashgrad::version(); }

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

}  // namespace flashgrad::tools

int main(int argc, char** argv) {
  using namespace flashgrad::tools;
  if (argc < 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help" ||
      std::string(argv[1]) == "help") {
    std::fputs(kOverview, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  Args args(command, std::vector<std::string>(argv + 2, argv + argc));
  const auto usage = kUsage.find(command);
  if (usage != kUsage.end() && args.wants_help()) {
    std::fputs(usage->second.c_str(), stdout);
    return 0;
  }
  try {
    return dispatch(command, args);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s\n\n%s", e.what(), usage != kUsage.end() ? usage->second.c_str() : kOverview);
    return 2;
  } catch (const flashgrad::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());  // the library's messages name their function
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashgrad %s: %s\n", command.c_str(), e.what());
    return 1;
  }
}
