// The sweep's reports (sweep.hpp): sweep.md, sweep.json and the plots that
// plot_sweep.py draws from the JSON.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.hpp"
#include "openblas.hpp"
#include "sweep.hpp"
#include "system.hpp"

namespace flashgrad::tools::sweep {
namespace {

namespace fs = std::filesystem;

// GFLOP/s of each pass under the FLOP convention.
double fwd_rate(const GridRow& r, const Timing& t) { return r.forward_flops / (t.fwd_ms * 1e6); }
double bwd_rate(const GridRow& r, const Timing& t) { return 2.5 * r.forward_flops / (t.bwd_ms * 1e6); }
double both_rate(const GridRow& r, const Timing& t) { return 3.5 * r.forward_flops / (t.fwd_bwd_ms * 1e6); }

std::string num(double x, const char* fmt = "%.1f") { return std::isfinite(x) ? format(fmt, x) : "n/a"; }
std::string ms(double x) { return x >= 100 ? format("%.0f", x) : x >= 10 ? format("%.1f", x) : format("%.2f", x); }
std::string times(double x) { return format("%.2fx", x); }

// --- JSON ----------------------------------------------------------------------------------

std::string timing_json(const GridRow& r, const Timing& t, double gemm, double best) {
  if (!t.present) return Json().add("note", t.note).str();
  return Json()
      .add("fwd_ms", t.fwd_ms)
      .add("bwd_ms", t.bwd_ms)
      .add("fwd_bwd_ms", t.fwd_bwd_ms)
      .add("runs", t.runs)
      .add("peak_bytes", t.peak_bytes)
      .add("wall_s", t.wall_s)
      .add("fwd_gflops", fwd_rate(r, t))
      .add("bwd_gflops", bwd_rate(r, t))
      .add("fwd_bwd_gflops", both_rate(r, t))
      .add("fwd_ratio_to_gemm", fwd_rate(r, t) / gemm)
      .add("bwd_ratio_to_gemm", bwd_rate(r, t) / gemm)
      .add("fwd_bwd_ratio_to_gemm", both_rate(r, t) / gemm)
      .add("fwd_bwd_ratio_to_best_gemm", both_rate(r, t) / best)
      .add("sgemm_paired_gflops", t.sgemm_paired)
      .add("fwd_ratio_to_paired_sgemm", t.fwd_over_sgemm)
      .add("bwd_ratio_to_paired_sgemm", t.bwd_over_sgemm)
      .str();
}

// How many times longer the peer takes than flashgrad, per pass.
std::string speedup_json(const Timing& flash, const Timing& peer) {
  if (!flash.present || !peer.present) return "null";
  return Json()
      .add("fwd", peer.fwd_ms / flash.fwd_ms)
      .add("bwd", peer.bwd_ms / flash.bwd_ms)
      .add("fwd_bwd", peer.fwd_bwd_ms / flash.fwd_bwd_ms)
      .str();
}

std::string grid_json(const Sweep& s) {
  std::vector<std::string> rows;
  for (const GridRow& r : s.grid) {
    const double gemm = s.machine.gemm_gflops(r.c.dtype), best = s.machine.best_gemm_gflops();
    rows.push_back(Json()
                       .add("seqlen", r.c.seqlen)
                       .add("dtype", dtype_name(r.c.dtype))
                       .add("head_dim", r.c.head_dim)
                       .add("causal", r.c.causal)
                       .add("forward_flops", r.forward_flops)
                       .add("gemm", s.machine.gemm_name(r.c.dtype))
                       .add("gemm_gflops", gemm)
                       .add_raw("flashgrad", timing_json(r, r.flash, gemm, best))
                       .add_raw("naive", timing_json(r, r.naive, gemm, best))
                       .add_raw("torch", timing_json(r, r.torch, gemm, best))
                       .add_raw("speedup_vs_naive", speedup_json(r.flash, r.naive))
                       .add_raw("speedup_vs_torch", speedup_json(r.flash, r.torch))
                       .str());
  }
  return Json::array(rows);
}

std::string extras_json(const Sweep& s, std::string* overhead, std::string* scaling) {
  std::vector<std::string> items;
  for (const ShortQuery& q : s.short_queries)
    items.push_back(Json()
                        .add("dtype", dtype_name(q.dtype))
                        .add("kv_layout", q.layout)
                        .add("seqlen_q", q.seqlen_q)
                        .add("seqlen_k", q.seqlen_k)
                        .add("head_dim", q.head_dim)
                        .add("ms", q.ms)
                        .add("kv_bytes", q.kv_bytes)
                        .add("kv_gbs", q.gbs())
                        .add("ratio_to_triad", q.gbs() / s.machine.triad_gbs())
                        .add("paired_triad_gbs", q.paired_triad_gbs)
                        .add("ratio_to_paired_triad", q.paired_ratio)
                        .str());
  const std::string queries = Json::array(items);
  items.clear();
  for (const Overhead& o : s.overhead)
    items.push_back(Json()
                        .add("pass", o.pass)
                        .add("call_us", o.api_us)
                        .add("kernel_us", o.kernel_us)
                        .add("outside_us", o.api_us - o.kernel_us)
                        .add("outside_fraction", (o.api_us - o.kernel_us) / o.api_us)
                        .add("validate_and_plan_us", o.validate_us)
                        .add("workspace_alloc_us", o.workspace_us)
                        .add("call_1thread_us", o.api_1thread_us)
                        .str());
  *overhead = Json::array(items);
  items.clear();
  for (const Scaling& x : s.scaling)
    items.push_back(Json()
                        .add("seqlen", x.seqlen)
                        .add("head_dim", x.head_dim)
                        .add("fwd_ms_1thread", x.fwd.ms_1)
                        .add("fwd_ms", x.fwd.ms_n)
                        .add("bwd_ms_1thread", x.bwd.ms_1)
                        .add("bwd_ms", x.bwd.ms_n)
                        .add("fwd_speedup", x.fwd.speedup)
                        .add("bwd_speedup", x.bwd.speedup)
                        .str());
  *scaling = Json::array(items);
  return queries;
}

std::string sweep_json(const Sweep& s) {
  std::vector<std::string> checks;
  for (const Check& c : s.checks)
    checks.push_back(Json()
                         .add("config", c.config)
                         .add("checked_on", c.small_case)
                         .add("passed", c.passed)
                         .add("worst_fraction_of_bound", c.worst_fraction)
                         .str());
  std::string overhead, scaling;
  const std::string queries = extras_json(s, &overhead, &scaling);
  return Json()
      .add("version", version())
      .add("source", s.source)
      .add("isa", isa_name())
      .add("threads", threads_of(s))
      .add("quick", s.settings.quick)
      .add("started", s.started_utc)
      .add("seconds", s.seconds)
      .add("load_average_start", s.load_start)
      .add("load_average_end", s.load_end)
      .add_raw("sgemm_probe_gflops_at_length", [&] {
        Json j;
        for (const auto& [seqlen, rate] : s.sgemm_probe) j.add(std::to_string(seqlen), rate);
        return j.str();
      }())
      .add_raw("cpu_used_by_others", [&] {
        std::vector<std::string> parts;
        for (const CpuShare& c : s.cpu)
          parts.push_back(
              Json().add("part", c.what).add("seconds", c.seconds).add("others", c.others).add("steal", c.steal).str());
        return Json::array(parts);
      }())
      .add_raw("shape", Json().add("batch", kBatch).add("heads_q", kHeads).add("heads_kv", kHeads).str())
      .add("flop_convention", "forward 4*B*Hq*Lq*Lk*d, halved when causal; backward 2.5x forward")
      .add_raw("machine", s.machine.start.json)
      .add_raw("machine_at_end", s.machine.end.json.empty() ? "null" : s.machine.end.json)
      .add("sgemm_gflops_used", s.machine.gemm_gflops(DType::f32))
      .add("bf16_gemm_gflops_used", s.machine.gemm_gflops(DType::bf16))
      .add("triad_gbs_used", s.machine.triad_gbs())
      .add("best_gemm_gflops", s.machine.best_gemm_gflops())
      .add("torch_version", s.torch_version.empty() ? s.torch_note : s.torch_version)
      .add("torch_jemalloc", s.jemalloc)
      .add("process_floor_bytes_flashgrad", s.floor_flash)
      .add("process_floor_bytes_torch", s.floor_torch)
      .add_raw("checks", Json::array(checks))
      .add_raw("grid", grid_json(s))
      .add_raw("short_queries", queries)
      .add_raw("overhead", overhead)
      .add_raw("scaling", scaling)
      .str();
}

// --- markdown --------------------------------------------------------------------------------

void machine_section(std::ostringstream& md, const Sweep& s) {
  const Machine& m = s.machine;
  const MachineRates &a = m.start, &b = m.end;
  const int t = threads_of(s);
  auto row = [&](const std::string& what, double MachineRates::*rate, const char* unit) {
    md << "| " << what << " | " << num(a.*rate) << " | " << num(b.*rate) << " | **" << num(m.best(rate)) << "** "
       << unit << " |\n";
  };
  md << "## The machine\n\nMeasured at the start and at the end of the sweep (`flashgrad-lab roofline`; at the start "
        "only with --quick); ratios use the higher of the two.\n\n| rate | start | end | used |\n|:---|---:|---:|---:|\n";
  row("SGEMM, " + openblas_version() + " `cblas_sgemm` (core " + s.blas_core + "), n = 2048, " + std::to_string(t) +
          " threads",
      &MachineRates::sgemm_gflops, "GFLOP/s");
  row("SGEMM, n = 2048, 1 thread", &MachineRates::sgemm_1thread_gflops, "GFLOP/s");
  row("bf16 GEMM, oneDNN matmul bf16 x bf16 -> f32 (`" + (a.bf16_gemm_impl.empty() ? "n/a" : a.bf16_gemm_impl) +
          "`), n = 2048, " + std::to_string(t) + " threads",
      &MachineRates::bf16_gemm_gflops, "GFLOP/s");
  row("f32 GEMM, oneDNN matmul, n = 2048 (for comparison)", &MachineRates::dnnl_f32_gflops, "GFLOP/s");
  row("STREAM triad (doubles, 3 x 8 bytes per element, three arrays of " + num(a.triad_array_bytes / 1048576.0, "%.0f") +
          " MiB; last-level cache " + a.last_level_cache + "), " + std::to_string(t) + " threads",
      &MachineRates::triad_gbs, "GB/s");
  row("memcpy (read + write), " + std::to_string(t) + " threads", &MachineRates::memcpy_gbs, "GB/s");
  md << "\nThe kernels' tile products (f32; the forward's tiles are 256 query rows by 64 keys, the backward's 64 by "
        "256, and P and dS are read transposed), 1 "
        "thread, operands in cache, GFLOP/s at the start: the small-GEMM libraries and flashgrad's own tile product "
        "(`bench/tile_ops.hpp`, isa "
     << isa_name() << ") on the same operands, each result checked first, the five taking turns in rounds (medians). "
     << "OpenBLAS `cblas_sgemm`, oneDNN `dnnl_sgemm`, BLIS " << a.blis << " `bli_sgemm` (general strides), libxsmm "
     << a.libxsmm << " (`libxsmm_smmdispatch`, the transposed operand through its TRANS_B flag).\n\n"
     << "| product | m x n x k | OpenBLAS | oneDNN | BLIS | libxsmm | flashgrad |\n|:---|:---|---:|---:|---:|---:|---:|\n";
  for (const MachineRates::Tile& x : a.tiles)
    md << "| " << x.product << " | " << x.shape << " | " << num(x.openblas_gflops) << " | " << num(x.onednn_gflops)
       << " | " << num(x.blis_gflops) << " | " << num(x.libxsmm_gflops) << " | " << num(x.flashgrad_gflops) << " |\n";
  md << "\n";
  if (a.pair_tiles.empty()) return;
  md << "The bf16 tile products of this path (docs/design.md), 1 thread, GFLOP/s at the start: "
        "oneDNN's bf16 matmul (`"
     << a.pair_onednn_impl << "`, a primitive made once per shape) and flashgrad's `" << a.pair_engine
     << "`, whose operands are already in its pair layouts, each result checked first, taking turns in rounds "
        "(medians).\n\n"
     << "| product | m x n x k | oneDNN | flashgrad |\n|:---|:---|---:|---:|\n";
  for (const MachineRates::PairTile& x : a.pair_tiles)
    md << "| " << x.product << " | " << x.shape << " | " << num(x.onednn_gflops) << " | " << num(x.flashgrad_gflops)
       << " |\n";
  md << "\n";
}

void grid_gemm_section(std::ostringstream& md, const Sweep& s) {
  md << "## flashgrad against GEMM\n\n"
     << "Rates under the FLOP convention (forward 4·B·Hq·Lq·Lk·d, halved when causal; backward 2.5x forward), "
     << "divided by SGEMM for f32 and by the bf16 GEMM for bf16 (/ GEMM"
     << (s.machine.has_bf16_gemm() ? "" : "; this CPU has no oneDNN bf16 matmul, so bf16 is divided by SGEMM")
     << "), and by the fastest matmul measured at "
        "all, "
     << num(s.machine.best_gemm_gflops()) << " GFLOP/s (/ best). B = 1, Hq = Hkv = 8. "
     << "The last three columns pair each run with an SGEMM (n = " << kPairedSgemmN
     << ", the same call as the machine's rate) timed just before it: the SGEMM's median over the runs, and the "
        "medians of each run's forward and backward rate over its own SGEMM (for bf16 too), so that the machine's "
        "drift during the sweep cancels.\n\n"
     << "| L | dtype | d | mask | fwd ms | bwd ms | fwd+bwd ms | fwd GFLOP/s | bwd GFLOP/s | fwd+bwd GFLOP/s "
        "| fwd / GEMM | bwd / GEMM | fwd+bwd / GEMM | fwd+bwd / best | paired SGEMM | fwd / paired | bwd / paired |\n"
     << "|---:|:---|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const GridRow& r : s.grid) {
    md << "| " << r.c.seqlen << " | " << dtype_name(r.c.dtype) << " | " << r.c.head_dim << " | "
       << (r.c.causal ? "causal" : "full") << " | ";
    const Timing& t = r.flash;
    if (!t.present) {
      md << t.note << " | | | | | | | | | | | | |\n";
      continue;
    }
    const double g = s.machine.gemm_gflops(r.c.dtype);
    md << ms(t.fwd_ms) << " | " << ms(t.bwd_ms) << " | " << ms(t.fwd_bwd_ms) << " | " << num(fwd_rate(r, t)) << " | "
       << num(bwd_rate(r, t)) << " | " << num(both_rate(r, t)) << " | " << num(fwd_rate(r, t) / g, "%.2f") << " | "
       << num(bwd_rate(r, t) / g, "%.2f") << " | " << num(both_rate(r, t) / g, "%.2f") << " | "
       << num(both_rate(r, t) / s.machine.best_gemm_gflops(), "%.2f") << " | " << num(t.sgemm_paired, "%.0f")
       << " | " << num(t.fwd_over_sgemm, "%.2f") << " | " << num(t.bwd_over_sgemm, "%.2f") << " |\n";
  }
  md << "\n";
}

// Why entries are missing: each reason once, with the rows it applies to
// (except for reasons that apply to whole kinds of rows: "n/a", "not run").
using Notes = std::map<std::string, std::vector<std::string>>;

std::string peer_cells(const Timing& flash, const Timing& peer, Notes* notes, const char* name, const GridRow& r) {
  if (!peer.present) {
    auto& rows = (*notes)[std::string(name) + ": " + peer.note];
    if (peer.note.rfind("n/a", 0) != 0 && peer.note.rfind("not run", 0) != 0)
      rows.push_back("L = " + std::to_string(r.c.seqlen) + " " + r.c.shape());
    return "– | –";
  }
  if (!flash.present) return ms(peer.fwd_bwd_ms) + " | –";
  return ms(peer.fwd_bwd_ms) + " | " + times(peer.fwd_ms / flash.fwd_ms) + " / " + times(peer.bwd_ms / flash.bwd_ms) +
         " / " + times(peer.fwd_bwd_ms / flash.fwd_bwd_ms);
}

std::string peak(const Timing& t) { return t.present ? format("%.0f", mib(t.peak_bytes)) : "–"; }

void grid_peer_section(std::ostringstream& md, const Sweep& s) {
  md << "## flashgrad against its peers\n\n"
     << "Forward+backward median ms of each; \"speedup\" is the peer's time over flashgrad's for forward / "
        "backward / both (above 1: flashgrad is faster). naive: materialized attention with OpenBLAS sgemm "
        "(`tools/naive_blas.hpp`, f32 only). torch: PyTorch "
     << (s.torch_version.empty() ? s.torch_note : s.torch_version)
     << ", softmax(Q K^T · scale + mask) V and its autograd backward, in the storage dtype"
     << (s.jemalloc ? ", jemalloc" : "") << ". Peak: each process's peak resident memory (VmHWM), MiB.\n\n"
     << "| L | dtype | d | mask | flashgrad ms | naive ms | speedup vs naive | torch ms | speedup vs torch "
        "| peak flashgrad | peak naive | peak torch |\n"
     << "|---:|:---|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  Notes notes;
  for (const GridRow& r : s.grid) {
    md << "| " << r.c.seqlen << " | " << dtype_name(r.c.dtype) << " | " << r.c.head_dim << " | "
       << (r.c.causal ? "causal" : "full") << " | " << (r.flash.present ? ms(r.flash.fwd_bwd_ms) : "–") << " | "
       << peer_cells(r.flash, r.naive, &notes, "naive", r) << " | " << peer_cells(r.flash, r.torch, &notes, "torch", r)
       << " | " << peak(r.flash) << " | " << peak(r.naive) << " | " << peak(r.torch) << " |\n";
  }
  md << "\nAn idle child peaks at " << format("%.0f", mib(s.floor_flash)) << " MiB (flashgrad and naive: the lab)";
  if (s.floor_torch > 0) md << " and " << format("%.0f", mib(s.floor_torch)) << " MiB (Python with PyTorch imported)";
  md << "; the peaks above include that.\n";
  if (!notes.empty()) {
    md << "\nMissing entries (–):\n\n";
    for (const auto& [note, rows] : notes) {
      md << "- " << note;
      for (size_t i = 0; i < rows.size(); ++i) md << (i ? ", " : " (") << rows[i];
      md << (rows.empty() ? "\n" : ")\n");
    }
  }
  md << "\n";
}

void extras_section(std::ostringstream& md, const Sweep& s) {
  md << "## Short queries\n\nForward, B = 1, 8 heads, d = 128: the bytes of K and V over the median time, "
        "against the triad's "
     << num(s.machine.triad_gbs())
     << " GB/s, and against a triad timed before each round of calls (paired: the median of the triads, and the "
        "median of each round's ratio to its own triad). K/V: bshd is [B, Lk, H, d], bhsd [B, H, Lk, d].\n\n"
        "| dtype | K/V | Lq | Lk | ms | K+V MiB | K+V GB/s | x triad | paired triad GB/s | x paired |\n"
     << "|:---|:---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const ShortQuery& q : s.short_queries)
    md << "| " << dtype_name(q.dtype) << " | " << q.layout << " | " << q.seqlen_q << " | " << q.seqlen_k << " | " << ms(q.ms) << " | "
       << format("%.0f", q.kv_bytes / 1048576.0) << " | " << num(q.gbs()) << " | "
       << num(q.gbs() / s.machine.triad_gbs(), "%.2f") << " | " << num(q.paired_triad_gbs) << " | "
       << num(q.paired_ratio, "%.2f") << " |\n";
  md << "\n## Call overhead at L = 128\n\nf32, B = 1, 8 heads, d = 64, microseconds per call (medians of 7 "
        "batches of calls). kernel: the kernel table's entry alone, with parameters, tile plan and workspace made "
        "once; outside = call − kernel. validate: `*_workspace_bytes()`, which validates and plans; workspace: "
        "allocating and freeing it.\n\n"
     << "| pass | call | kernel | outside | outside share | validate | workspace | 1 thread | " << threads_of(s)
     << " threads over 1 |\n|:---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const Overhead& o : s.overhead)
    md << "| " << o.pass << " | " << num(o.api_us) << " | " << num(o.kernel_us) << " | "
       << num(o.api_us - o.kernel_us) << " | " << format("%.0f%%", 100 * (o.api_us - o.kernel_us) / o.api_us)
       << " | " << num(o.validate_us, "%.2f") << " | " << num(o.workspace_us, "%.2f") << " | "
       << num(o.api_1thread_us) << " | " << times(o.api_1thread_us / o.api_us) << " |\n";
  md << "\n## Threads\n\nf32, B = 1, 8 heads, full mask, median ms with 1 thread and with " << threads_of(s)
     << ", the two timed in turn, one call each per round; speedup: the median of each round's ratio.\n\n"
     << "| L | d | fwd, 1 thread | fwd | speedup | bwd, 1 thread | bwd | speedup |\n"
     << "|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const Scaling& x : s.scaling)
    md << "| " << x.seqlen << " | " << x.head_dim << " | " << ms(x.fwd.ms_1) << " | " << ms(x.fwd.ms_n) << " | "
       << times(x.fwd.speedup) << " | " << ms(x.bwd.ms_1) << " | " << ms(x.bwd.ms_n) << " | "
       << times(x.bwd.speedup) << " |\n";
  md << "\n";
}

std::string sweep_markdown(const Sweep& s) {
  std::ostringstream md;
  const double others = s.cpu.empty() ? 0 : s.cpu.back().others;
  md << "# flashgrad benchmark sweep\n\n"
     << "flashgrad " << version() << " (source " << s.source << "), isa " << isa_name() << ", " << threads_of(s)
     << " threads" << (s.settings.quick ? ", **--quick** (a small subset)" : "") << "; started " << s.started_utc
     << ", took " << format("%.0f", s.seconds) << " s. Load average before it began: " << s.load_start << ".\n\n"
     << "Other processes used " << format("%.0f%%", 100 * others) << " of the CPUs' time over the run"
     << (others > 0.05 ? " — other jobs were running, so some times are inflated and ratios rough" : "")
     << " (busy time in /proc/stat less this process's and its children's; the hypervisor stole "
     << format("%.0f%%", s.cpu.empty() ? 0.0 : 100 * s.cpu.back().steal) << "). By part:";
  for (size_t i = 0; i < s.cpu.size(); ++i)
    md << (i ? ";" : "") << " " << s.cpu[i].what << " " << format("%.0f%%", 100 * s.cpu[i].others);
  md << ".";
  if (!s.sgemm_probe.empty()) {
    md << " The machine's speed drifts with what other virtual machines on the host do, which no process here "
          "shows; SGEMM (n = 2048, median of 3) just before each length of the grid, GFLOP/s:";
    for (size_t i = 0; i < s.sgemm_probe.size(); ++i)
      md << (i ? ";" : "") << " L = " << s.sgemm_probe[i].first << ": " << num(s.sgemm_probe[i].second, "%.0f");
    md << ".";
  }
  md << "\n\n"
     << "Reproduce: `bash scripts/bench.sh` (builds, then runs `build/bench/flashgrad-lab sweep`).\n\n";
  size_t failed = 0;
  for (const Check& c : s.checks) failed += c.passed ? 0 : 1;
  md << "Correctness first: every flashgrad configuration below was checked against the fp64 reference on a small "
        "copy (the longer length scaled to 256, two heads) before it was timed, and the PyTorch script checks its "
        "own result against float64 before timing: "
     << s.checks.size() - failed << " of " << s.checks.size() << " checks passed.\n\n";
  machine_section(md, s);
  grid_gemm_section(md, s);
  grid_peer_section(md, s);
  extras_section(md, s);
  md << "## Method\n\n"
     << "- Grid: each implementation and configuration runs in its own child process (`flashgrad-lab measure "
        "--split`, or `bench/lab/torch_attention.py`): one warm-up forward+backward, then at least 3 runs and "
     << format("%g", s.settings.min_time)
     << " s of them (at most 20), forward and backward timed apart in each run; fwd+bwd is the median of each run's "
        "sum. Peak memory is the child's VmHWM, which it reports at its end (its own high-water mark since exec; "
        "ru_maxrss would also count the forked copy of the sweep's process).\n"
     << "- The paired columns come from a second child per flashgrad configuration (`--paired-sgemm " << kPairedSgemmN
     << "`), whose runs each follow an SGEMM: the faster of two calls after an untimed one, with 100 ms pauses "
        "around them so that neither library's spinning threads slow the other, then one untimed flashgrad call "
        "when a run is short; each run's rate is divided by its own SGEMM and the median taken. The other "
        "columns (times, peak memory) come from the first child, which runs no SGEMM.\n"
     << "- A peer is skipped at a length where its time (4x the previous length's) would pass the "
     << format("%.0f", s.settings.budget_s) << " s budget, or would leave less of it than flashgrad's predicted "
        "time at the next length, or where its memory (extrapolated the same way) would pass 80% of "
        "MemAvailable.\n"
     << "- The machine's rates come from `flashgrad-lab roofline` in a child (OpenBLAS core chosen from the CPU's "
        "features when a VM hides the model); medians of 3-10 calls after a warm-up.\n";
  return md.str();
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

void plot(const Sweep& s, const fs::path& json) {
  const std::string python = "/usr/bin/python3";
  if (!fs::exists(python) || run_child({python, "-c", "import matplotlib"}, true).exit_code != 0) {
    std::printf("  no plots: %s has no matplotlib (Debian: apt-get install python3-matplotlib)\n", python.c_str());
    return;
  }
  const ChildResult r = run_child({python, tool_file("plot_sweep.py"), json.string(), s.settings.out_dir.string()});
  std::printf("%s", r.output.c_str());
  if (r.exit_code != 0) std::printf("  plotting failed (status %d); the tables are complete\n", r.exit_code);
}

}  // namespace

void write_reports(Sweep& s) {
  fs::create_directories(s.settings.out_dir);
  const fs::path json = s.settings.out_dir / "sweep.json", md = s.settings.out_dir / "sweep.md";
  write_file(json, sweep_json(s) + "\n");
  write_file(md, sweep_markdown(s));
  std::printf("  wrote %s and %s\n", md.c_str(), json.c_str());
  if (s.settings.plot) plot(s, json);
}

}  // namespace flashgrad::tools::sweep
