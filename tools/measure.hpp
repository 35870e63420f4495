// The protocol of `measure`: one timed forward+backward in this process,
// printed as one line of key=value fields. The demo and the sweep run it in a
// child process, so that the child's peak memory is this measurement's and
// nothing else's. Each program offers `measure` for the implementations it
// links: `flashgrad` (flashgrad, none), `flashgrad-baseline` (naive, none)
// and `flashgrad-lab` (all three, and an SGEMM paired with each run).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cli.hpp"
#include "harness.hpp"

namespace flashgrad::tools {

struct MeasureSpec {
  std::string impl;     // "flashgrad", "naive" or "none" (allocate the tensors only: the memory floor)
  testing::Case c;      // batch, seqlen (q and k), heads (q and kv), head_dim (= head_dim_v), dtype, causal, threads
  double min_time = 1;  // seconds of timed calls, at least 3 calls
  bool split = false;   // time forward and backward apart in each run
};

// Reads --impl (one of impls; required), --seqlen (required), --batch,
// --heads, --head-dim, --dtype, --causal, --threads, --min-time and --split.
// The caller reads its own flags, then calls args.finish().
MeasureSpec measure_flags(Args& args, const std::vector<std::string>& impls);

// The usage text of those flags: "usage: <program> measure --impl <impls> ...",
// a line of the program's own flags (extra_flags) if any, and what they do.
std::string measure_usage(const std::string& program, const std::string& impls, const std::string& extra_flags = "");

struct Passes {
  std::function<void()> forward, backward;  // both empty for impl none
};
Passes flashgrad_passes(const testing::Problem& p, testing::Outputs& o);

// A rate (GFLOP/s) timed just before each run with --split, so that each
// run's rate can be divided by the machine's speed of that moment.
struct PairedRate {
  std::function<double()> gflops_now;
  int64_t resident_bytes = 0;  // what it keeps resident, left out of vmhwm
};

// Times the passes as the spec says and prints
// "ms=<median> runs=<n> vmhwm=<bytes> flops=<n>"; with --split also fwd_ms,
// bwd_ms and fwd_bwd_ms, and with a paired rate sgemm_paired, fwd_over_sgemm
// and bwd_over_sgemm.
void print_measurement(const MeasureSpec& spec, const Passes& passes, const PairedRate* paired = nullptr);

// A "Key:" line of /proc/self/status (VmHWM:, VmRSS:) in bytes, or -1.
int64_t status_bytes(const std::string& key);

}  // namespace flashgrad::tools
