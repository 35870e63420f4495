// flashgrad-lab: the measurement lab of docs/performance.md. It times
// flashgrad against the machine's GEMM and memory rates and against its
// peers, and two builds of the library against each other; the user's CLI,
// flashgrad (tools/), does without all of it.
#include <map>
#include <optional>
#include <string>

#include "case_flags.hpp"
#include "cli.hpp"
#include "harness.hpp"
#include "measure.hpp"
#include "naive_measure.hpp"
#include "openblas.hpp"

namespace flashgrad::tools {

int run_ab(Args& args);        // ab.cpp
int run_roofline(Args& args);  // roofline.cpp
int run_sweep(Args& args);     // sweep.cpp

namespace {

const char* const kProgram = "flashgrad-lab";

const char* const kOverview =
    "usage: flashgrad-lab <command> [flags]\n"
    "\n"
    "commands:\n"
    "  ab       time two builds of the library in turns in one process, on one\n"
    "           configuration, and compare their outputs bit for bit\n"
    "  sweep    the benchmark suite: flashgrad against GEMM, memory and peers\n"
    "  roofline this machine's SGEMM, bf16 GEMM and memory bandwidth\n"
    "  measure  one timed forward+backward in this process (the sweep runs it in\n"
    "           a child process to read that child's peak memory)\n"
    "\n"
    "`flashgrad-lab <command> --help` lists the flags of a command.\n"
    "FLASHGRAD_ISA=scalar|avx2|avx512|avx512bf16|amx forces a SIMD path.\n";

std::map<std::string, std::string> usage() {
  return {
      {"ab",
       std::string("usage: flashgrad-lab ab --lib-a A.so --lib-b B.so [flags]\n"
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
      {"sweep",
       "usage: flashgrad-lab sweep [--quick] [--out DIR] [--max-seqlen L] [--min-seqlen L]\n"
       "                           [--threads T] [--budget-s S] [--no-torch] [--no-plot]\n"
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
      {"roofline",
       "usage: flashgrad-lab roofline [--threads T] [--quick] [--json] [--probe | --peak]\n"
       "  The rates the sweep divides flashgrad's by: OpenBLAS SGEMM (n=2048, T threads\n"
       "  and 1), oneDNN bf16 GEMM (n=2048; n/a without oneDNN), the tile products'\n"
       "  shapes with OpenBLAS, oneDNN, BLIS, libxsmm and flashgrad's tile product\n"
       "  (1 thread), STREAM triad and memcpy bandwidth (T threads). Medians after a\n"
       "  warm-up call.\n"
       "  --probe: SGEMM alone, median of 3, as one JSON object (the sweep's drift probe).\n"
       "  --peak: the arithmetic peak alone: f32 FMA and bf16 pair products (AMX or\n"
       "  AVX512_BF16) in loops that touch no memory, on T threads, best of 5.\n"},
      {"measure",
       measure_usage(kProgram, "flashgrad|naive|none", "[--paired-sgemm N]") +
           "  --impl naive is f32 only. --paired-sgemm N (with --split) times an N x N\n"
           "  OpenBLAS SGEMM before every run and adds sgemm_paired (its median, GFLOP/s)\n"
           "  and fwd_over_sgemm, bwd_over_sgemm (medians of each run's rate over its own\n"
           "  SGEMM); vmhwm then leaves out the SGEMM's memory.\n"},
  };
}

int run_measure(Args& args) {
  const MeasureSpec spec = measure_flags(args, {"flashgrad", "naive", "none"});
  const int64_t paired_n = args.integer("--paired-sgemm", 0, 0, 16384);
  args.finish();
  if (paired_n > 0 && !spec.split) args.fail("--paired-sgemm", "--split beside it", std::to_string(paired_n));
  prepare_openblas_measure(args, spec, paired_n > 0 || spec.impl == "naive");
  const testing::Problem p = testing::make_problem(spec.c);
  testing::Outputs o = testing::make_outputs(p, false);
  NaiveAttention naive(spec.c.causal, 0.0);
  const Passes passes = spec.impl == "flashgrad" ? flashgrad_passes(p, o)
                        : spec.impl == "naive"   ? naive_passes(naive, p, o)
                                                 : Passes{};
  if (paired_n == 0 || !passes.forward) {
    print_measurement(spec, passes);
    return 0;
  }
  // An SGEMM before each run divides each run's rate by the machine's GEMM
  // rate of that moment: this VM's speed drifts by up to 1.5x within minutes
  // (docs/performance.md). Its operands and OpenBLAS's buffers stay resident
  // from its first call on, so the peak memory reported leaves out what that
  // call added.
  const int64_t before = status_bytes("VmRSS:");
  Sgemm gemm(paired_n);
  gemm.run();
  const PairedRate paired{[&gemm] { return gemm.gflops_now(); }, status_bytes("VmRSS:") - before};
  print_measurement(spec, passes, &paired);
  return 0;
}

int dispatch(const std::string& command, Args& args) {
  if (command == "ab") return run_ab(args);
  if (command == "sweep") return run_sweep(args);
  if (command == "roofline") return run_roofline(args);
  if (command == "measure") return run_measure(args);
  throw UsageError(std::string(kProgram) + ": unknown command '" + command +
                   "'; expected ab, sweep, roofline or measure");
}

}  // namespace
}  // namespace flashgrad::tools

int main(int argc, char** argv) {
  using namespace flashgrad::tools;
  return run_program({kProgram, kOverview, usage(), dispatch}, argc, argv);
}
