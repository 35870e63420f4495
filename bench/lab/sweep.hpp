// `flashgrad-lab sweep`: the benchmark suite of docs/performance.md, in
// one run on one machine:
//
//   machine   SGEMM, bf16 GEMM and memory bandwidth (`flashgrad-lab roofline`, a child)
//   grid      forward, backward and both, f32 and bf16, d in {64, 128}, causal
//             and not, L = 512 .. --max-seqlen, B = 1, 8 heads: flashgrad, the
//             naive OpenBLAS attention (f32) and PyTorch's decomposed attention,
//             each in a child process for its peak memory (sweep.cpp)
//   extras    short queries against K/V bandwidth, call overhead at L = 128,
//             2 threads against 1 (sweep_extras.cpp, in this process)
//   reports   sweep.md, sweep.json and PNG plots (sweep_report.cpp, plot_sweep.py)
//
// Every flashgrad configuration is checked against the fp64 reference on a
// small copy (check.hpp's small_copy) before it is timed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "flashgrad/flashgrad.hpp"
#include "harness.hpp"

namespace flashgrad::tools::sweep {

constexpr int64_t kBatch = 1, kHeads = 8;
// The SGEMM size of the machine's rates, and of the one timed before each flashgrad run.
constexpr int64_t kPairedSgemmN = 2048;

struct Settings {
  std::filesystem::path out_dir;
  int threads = 0;
  int64_t min_seqlen = 512, max_seqlen = 8192;
  bool quick = false;
  bool torch = true;
  bool plot = true;
  double budget_s = 840;  // the whole run; the grid's peers are skipped past it
  double min_time = 1.0;  // seconds of timed calls per child measurement (at least 3 calls)
};

// One run of `flashgrad-lab roofline --json`.
struct MachineRates {
  std::string json;  // the roofline's object as it printed it; empty when not run
  double sgemm_gflops = NAN, sgemm_1thread_gflops = NAN, bf16_gemm_gflops = NAN, dnnl_f32_gflops = NAN;
  double triad_gbs = NAN, memcpy_gbs = NAN, triad_array_bytes = NAN;
  std::string bf16_gemm_impl;
  std::string last_level_cache;  // e.g. "L3 260 MiB", from sysfs
  struct Tile {  // one tile product's shape and the libraries' and flashgrad's rates on it, 1 thread
    std::string product, shape;
    double openblas_gflops = NAN, onednn_gflops = NAN, blis_gflops = NAN, libxsmm_gflops = NAN,
           flashgrad_gflops = NAN;
  };
  std::string blis, libxsmm;  // versions, "n/a" where not built in
  std::vector<Tile> tiles;
  struct PairTile {  // the bf16 pair product (AMX or AVX512_BF16) against oneDNN's bf16 matmul, 1 thread
    std::string product, shape;
    double onednn_gflops = NAN, flashgrad_gflops = NAN;
  };
  std::string pair_engine, pair_onednn_impl;  // e.g. "gemm_bf16 (avx512bf16)"
  std::vector<PairTile> pair_tiles;  // empty on paths without bf16 pair products
};

// The rates flashgrad's are divided by, measured at the start and at the end
// of the sweep; the higher of the two is used, so that a busy moment of the
// machine during one of them cannot flatter flashgrad.
struct Machine {
  MachineRates start, end;
  double best(double MachineRates::*rate) const {
    const double a = start.*rate, b = end.*rate;
    return std::isnan(a) ? b : std::isnan(b) ? a : std::max(a, b);
  }
  // SGEMM for f32 (and f16/f64), bf16 GEMM for bf16. Where oneDNN has no
  // bf16 matmul (CPUs without AVX-512) bf16 is held to the f32 rate, SGEMM.
  bool has_bf16_gemm() const { return !std::isnan(best(&MachineRates::bf16_gemm_gflops)); }
  double gemm_gflops(DType t) const {
    return best(t == DType::bf16 && has_bf16_gemm() ? &MachineRates::bf16_gemm_gflops : &MachineRates::sgemm_gflops);
  }
  const char* gemm_name(DType t) const {
    return t != DType::bf16 ? "SGEMM" : has_bf16_gemm() ? "bf16 GEMM" : "SGEMM (no bf16 GEMM on this CPU)";
  }
  // The fastest matmul measured at all (OpenBLAS or oneDNN, f32 or bf16): a
  // closer bound on what the cores can do than the one the ratios use.
  double best_gemm_gflops() const {
    double best = 0;
    for (double MachineRates::*rate :
         {&MachineRates::sgemm_gflops, &MachineRates::dnnl_f32_gflops, &MachineRates::bf16_gemm_gflops})
      if (const double x = this->best(rate); x > best) best = x;
    return best;
  }
  double triad_gbs() const { return best(&MachineRates::triad_gbs); }
};

// One point of the grid.
struct Config {
  DType dtype = DType::f32;
  int64_t head_dim = 64;
  bool causal = false;
  int64_t seqlen = 512;
  testing::Case to_case(int threads) const;
  std::string shape() const;  // "bf16 d=128 causal", without L
};

// One implementation timed on one configuration, in a child process.
struct Timing {
  bool present = false;
  double fwd_ms = 0, bwd_ms = 0, fwd_bwd_ms = 0;  // medians; fwd_bwd: of each run's sum
  // flashgrad only: an SGEMM timed before each run (its median, GFLOP/s) and
  // the medians of each run's forward and backward rate over it; NaN if none.
  double sgemm_paired = std::nan(""), fwd_over_sgemm = std::nan(""), bwd_over_sgemm = std::nan("");
  int64_t runs = 0;
  int64_t peak_bytes = 0;  // the child's VmHWM (ru_maxrss if it printed none)
  double wall_s = 0;       // the whole child
  std::string note;        // why there is no timing
};

struct GridRow {
  Config c;
  double forward_flops = 0;  // 4 B Hq Lq Lk d, halved when causal; backward counts 2.5x
  Timing flash, naive, torch;
};

// Forward of a few queries against long K/V: bound by reading K and V.
struct ShortQuery {
  DType dtype = DType::f32;
  int64_t seqlen_q = 1, seqlen_k = 0, head_dim = 128;
  std::string layout = "bshd";  // of K and V: "bshd" ([B, L, H, d]) or "bhsd" ([B, H, L, d], a KV cache's)
  double ms = 0;
  double kv_bytes = 0;
  double paired_triad_gbs = NAN;  // median of the triads timed before each round of calls
  double paired_ratio = NAN;      // median over the rounds of K+V GB/s over the round's triad
  double gbs() const { return kv_bytes / (ms * 1e6); }
};

// Time per call at L = 128, and how much of it is outside the kernels.
struct Overhead {
  std::string pass;         // "forward" or "backward"
  double api_us = 0;        // flashgrad::forward/backward, all threads
  double kernel_us = 0;     // the kernel table's entry alone, parameters and workspace made once
  double validate_us = 0;   // *_workspace_bytes(): validation and tile plan
  double workspace_us = 0;  // allocating and freeing the workspace
  double api_1thread_us = 0;
};

// Threads against one thread.
// One pass timed with 1 thread and with n in turn, one call each per round:
// the median ms of each, and the median of each round's 1-thread time over
// its n-thread time.
struct ThreadPair {
  double ms_1 = 0, ms_n = 0, speedup = 0;
};

struct Scaling {
  int64_t seqlen = 0, head_dim = 0;
  ThreadPair fwd, bwd;
};

struct Check {
  std::string config, small_case;
  bool passed = false;
  double worst_fraction = 0;
};

// What the machine's CPUs did over an interval of the sweep: the share of all
// CPU time that other processes used, and the share the hypervisor stole.
// (The load average cannot tell: the sweep's own threads count in it.)
struct CpuShare {
  std::string what;   // "machine rates", "extras", "grid L=4096", "whole run"
  double seconds = 0;
  double others = 0;  // (busy CPU time - this process and its children's) / (seconds * CPUs)
  double steal = 0;   // steal time / (seconds * CPUs)
};

// A point in time for CpuShare.
struct CpuSample {
  double wall = 0, busy = 0, steal = 0, own = 0;  // seconds
  static CpuSample now();
  CpuShare since(const CpuSample& start, const std::string& what) const;
};

struct Sweep {
  Settings settings;
  std::string exe;
  double start = 0, seconds = 0;
  std::string started_utc;
  std::string source;  // `git describe --always --dirty` of the source tree, when git can tell
  std::string load_start, load_end;  // /proc/loadavg (from the start on, it counts the sweep's own threads)
  std::vector<CpuShare> cpu;         // other processes' share of the CPUs, per part and for the whole run
  // SGEMM GFLOP/s just before each grid length: the machine's speed drifts
  // (other virtual machines on the host) without any process here to show it.
  std::vector<std::pair<int64_t, double>> sgemm_probe;
  std::string blas_core, blas_core_origin;
  Machine machine;
  std::string torch_version;  // empty: PyTorch is not used
  std::string torch_note;
  bool jemalloc = false;
  int64_t floor_flash = 0, floor_torch = 0;  // peak of a child that only starts up
  std::vector<Check> checks;
  std::vector<GridRow> grid;
  std::vector<ShortQuery> short_queries;
  std::vector<Overhead> overhead;
  std::vector<Scaling> scaling;
  bool check_failed = false;
};

// The check before timing: c's small copy against the fp64 reference, once per
// distinct small copy. False (and recorded) when the kernels fail it.
bool check_config(Sweep& s, const testing::Case& c);
int threads_of(const Sweep& s);
double elapsed(const Sweep& s);

void run_extras(Sweep& s);                  // sweep_extras.cpp
void write_reports(Sweep& s);               // sweep_report.cpp
std::string load_average();                 // the first three fields of /proc/loadavg
std::string tool_file(const char* name);    // a script beside the binary, or in the source tree

}  // namespace flashgrad::tools::sweep
