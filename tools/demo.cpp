// `flashgrad demo`: correctness first, then forward+backward time and peak
// memory of flashgrad against materialized attention on OpenBLAS, as the
// sequence length doubles, until the materialized scores no longer fit.
//
// Every measurement runs in a child process (`flashgrad measure`, and
// `flashgrad-baseline measure` for the baseline); the peak memory is that
// child's ru_maxrss as wait4() returns it, so it is resident memory the
// operating system really gave, not an estimate. Without flashgrad-baseline
// (no OpenBLAS when CMake ran) the demo says so once and times flashgrad alone.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "baseline.hpp"
#include "check.hpp"
#include "cli.hpp"
#include "dispatch.hpp"
#include "harness.hpp"
#include "naive_blas.hpp"  // NaiveAttention::score_bytes, inline: nothing of OpenBLAS is linked
#include "system.hpp"

namespace flashgrad::tools {
namespace {

namespace fs = std::filesystem;

// The fixed shape the demo grows: B=1, 8 heads, head_dim 64, f32.
constexpr int64_t kBatch = 1, kHeads = 8, kHeadDim = 64;
// The baseline runs only while its predicted peak stays under this share of MemAvailable.
constexpr double kMemorySafety = 0.8;
// Lengths timed with flashgrad alone once the baseline no longer fits.
constexpr int64_t kFlashOnlyDoublings = 2;

struct Settings {
  fs::path out_dir;
  int threads = 0;
  double budget_s = 225;  // "about four minutes" on the 2-core machines the demo is sized for
  int64_t min_seqlen = 512, max_seqlen = 0;
  int64_t memory_limit_bytes = 0;  // 0: MemAvailable alone
  bool plot = true;
};

struct Measurement {
  double ms = 0;
  int64_t runs = 0;
  int64_t peak_bytes = 0;    // the child's ru_maxrss
  int64_t vm_hwm_bytes = 0;  // the child's own VmHWM, a cross-check
  double flops = 0;
  double wall_s = 0;  // the whole child, setup included
  double gflops() const { return ms > 0 ? flops / (ms * 1e6) : 0; }
};

struct Row {
  int64_t seqlen = 0;
  bool causal = false;
  Measurement flash;
  std::optional<Measurement> naive;
  int64_t naive_predicted_bytes = 0;
  std::string naive_note;  // why there is no naive measurement
};

struct Demo {
  Settings settings;
  std::string exe;
  Baseline baseline;  // its path is empty when there is none
  std::string openblas, blas_core, blas_core_origin;
  double start = 0;
  int64_t floor_bytes = 0, naive_floor_bytes = 0;  // peaks of children that only start up
  int64_t edge_passed = 0, edge_total = 0;
  std::string baseline_check;
  std::vector<Row> rows;
  std::string stopped_because;
  bool naive_failed = false;
};

Settings parse_settings(Args& args) {
  Settings s;
  s.out_dir = args.value("--out").value_or("out/demo");
  s.threads = static_cast<int>(args.integer("--threads", 0, 1, 4096));
  s.budget_s = args.real("--budget-s", s.budget_s, 1);
  s.min_seqlen = args.integer("--min-seqlen", 512, 1);
  s.max_seqlen = args.integer("--max-seqlen", 0, s.min_seqlen);
  s.memory_limit_bytes = static_cast<int64_t>(args.real("--memory-gib", 0, 0) * 1024 * 1024 * 1024);
  s.plot = !args.has("--no-plot");
  args.finish();
  return s;
}

// --- (a) correctness --------------------------------------------------------

bool check_edge_cases(Demo& d) {
  const std::vector<testing::Case> cases = testing::edge_cases();
  const CheckTotals t = check_cases(cases, true, false);
  d.edge_total = static_cast<int64_t>(cases.size());
  d.edge_passed = t.passed;
  std::printf(
      "  edge cases: %lld/%lld pass err(kernel) <= 2 err(naive) + noise, forward and backward "
      "(closest: %s at %.2f of its bound)\n",
      static_cast<long long>(d.edge_passed), static_cast<long long>(d.edge_total), t.worst_where.c_str(),
      t.worst_fraction);
  return t.ok();
}

bool has_baseline(const Demo& d) { return !d.baseline.path.empty(); }

// "key: value" lines of a child's output.
std::string field(const std::string& output, const std::string& key) {
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ": ", 0) == 0) return line.substr(key.size() + 2);
  return "";
}

void describe_baseline(Demo& d) {
  if (!has_baseline(d)) {
    std::printf("baseline: none: flashgrad-baseline %s; timing flashgrad alone\n\n", d.baseline.missing.c_str());
    return;
  }
  const ChildResult r = run_child({d.baseline.path, "info"});
  if (r.exit_code != 0) throw std::runtime_error("flashgrad-baseline info: the child " + how_it_ended(r));
  d.openblas = field(r.output, "openblas");
  d.blas_core = field(r.output, "core");
  d.blas_core_origin = field(r.output, "core_origin");
  // The baseline's children then load OpenBLAS on that core at once, rather
  // than each restarting itself on it.
  if (!d.blas_core.empty()) setenv("OPENBLAS_CORETYPE", d.blas_core.c_str(), 0);
  std::printf("baseline: %s sgemm, core %s (%s)\n\n", d.openblas.c_str(), d.blas_core.c_str(),
              d.blas_core_origin.c_str());
}

// The baseline must be right too (flashgrad-baseline check): one line per case.
bool check_baseline(Demo& d) {
  const ChildResult r = run_child({d.baseline.path, "check"});
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    std::printf("  OpenBLAS baseline on %s\n", line.c_str());
    d.baseline_check += (d.baseline_check.empty() ? "" : "; ") + line;
  }
  if (r.exit_code != 0 && r.output.empty())
    std::printf("  OpenBLAS baseline: flashgrad-baseline check %s\n", how_it_ended(r).c_str());
  return r.exit_code == 0;
}

// --- (b) time and memory -----------------------------------------------------

// impl "naive" runs in flashgrad-baseline; "none" (the floor) in either.
Measurement measure(const Demo& d, const std::string& exe, const std::string& impl, int64_t seqlen, bool causal) {
  std::vector<std::string> argv = {exe, "measure", "--impl", impl};
  auto flag = [&argv](const char* name, int64_t value) {
    argv.push_back(name);
    argv.push_back(std::to_string(value));
  };
  flag("--seqlen", seqlen);
  flag("--batch", kBatch);
  flag("--heads", kHeads);
  flag("--head-dim", kHeadDim);
  if (d.settings.threads > 0) flag("--threads", d.settings.threads);
  argv.insert(argv.end(), {"--min-time", "0.5"});
  if (causal) argv.push_back("--causal");
  const ChildResult r = run_child(argv);
  if (r.exit_code != 0)
    throw std::runtime_error("measuring " + impl + " at seqlen " + std::to_string(seqlen) + ": the child " +
                             how_it_ended(r));
  Measurement m;
  std::istringstream in(r.output);
  std::string field;
  while (in >> field) {
    const size_t eq = field.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = field.substr(0, eq), value = field.substr(eq + 1);
    if (key == "ms") m.ms = std::stod(value);
    if (key == "runs") m.runs = std::stoll(value);
    if (key == "vmhwm") m.vm_hwm_bytes = std::stoll(value);
    if (key == "flops") m.flops = std::stod(value);
  }
  m.peak_bytes = r.peak_rss_bytes;
  m.wall_s = r.seconds;
  return m;
}

// MemAvailable, or less with --memory-gib.
int64_t available_bytes(const Demo& d) {
  const int64_t available = mem_available_bytes();
  if (d.settings.memory_limit_bytes <= 0) return available;
  return available < 0 ? d.settings.memory_limit_bytes : std::min(available, d.settings.memory_limit_bytes);
}

// q, k, v, dout, out, dq, dk, dv in f32, and lse.
int64_t tensor_bytes(int64_t seqlen) {
  return (8 * kBatch * seqlen * kHeads * kHeadDim + kBatch * kHeads * seqlen) * 4;
}

int64_t naive_predicted_bytes(const Demo& d, int64_t seqlen) {
  return d.naive_floor_bytes + tensor_bytes(seqlen) + NaiveAttention::score_bytes(kBatch, kHeads, seqlen, seqlen);
}

std::string ms_text(double ms) { return ms >= 100 ? format("%.0f", ms) : format("%.1f", ms); }

void print_header() {
  std::printf("  %7s %-7s %13s %10s %8s %14s %10s %12s\n", "L", "mask", "flashgrad ms", "naive ms", "speedup",
              "flashgrad MiB", "naive MiB", "fg GFLOP/s");
}

void print_row(const Row& r) {
  const char* mask = r.causal ? "causal" : "full";
  if (r.naive) {
    std::printf("  %7lld %-7s %13s %10s %7.2fx %14.0f %10.0f %12.1f\n", static_cast<long long>(r.seqlen),
                mask, ms_text(r.flash.ms).c_str(), ms_text(r.naive->ms).c_str(), r.naive->ms / r.flash.ms,
                mib(r.flash.peak_bytes), mib(r.naive->peak_bytes), r.flash.gflops());
  } else {
    std::printf("  %7lld %-7s %13s %10s %8s %14.0f %10s %12.1f\n", static_cast<long long>(r.seqlen), mask,
                ms_text(r.flash.ms).c_str(), "-", "-", mib(r.flash.peak_bytes), "-", r.flash.gflops());
  }
  std::fflush(stdout);
}

bool naive_fits(const Demo& d, int64_t seqlen) {
  if (!has_baseline(d)) return false;
  const int64_t available = available_bytes(d);
  return available < 0 || naive_predicted_bytes(d, seqlen) <= kMemorySafety * available;
}

void run_length(Demo& d, int64_t seqlen, bool with_naive, const std::vector<bool>& masks) {
  for (const bool causal : masks) {
    Row r;
    r.seqlen = seqlen;
    r.causal = causal;
    r.flash = measure(d, d.exe, "flashgrad", seqlen, causal);
    r.naive_predicted_bytes = has_baseline(d) ? naive_predicted_bytes(d, seqlen) : 0;
    if (with_naive && !d.naive_failed) {
      try {
        r.naive = measure(d, d.baseline.path, "naive", seqlen, causal);
      } catch (const std::runtime_error& e) {
        d.naive_failed = true;  // the prediction was wrong, or the machine is short of memory
        r.naive_note = e.what();
        std::printf("  -- naive attention failed: %s; flashgrad goes on alone\n", e.what());
      }
    } else if (!has_baseline(d)) {
      r.naive_note = "no baseline";
    } else {
      r.naive_note = with_naive
                         ? "skipped after its failure"
                         : format("no longer fits: needs %.1f GiB", mib(r.naive_predicted_bytes) / 1024);
    }
    print_row(r);
    d.rows.push_back(r);
  }
}

// Predicted wall seconds of one row at twice seqlen: attention is quadratic
// in the length, so about four times the row at seqlen (children's setup
// included). Infinite when that row was not run.
double next_row_seconds(const Demo& d, int64_t seqlen, bool causal, bool with_naive) {
  for (const Row& r : d.rows)
    if (r.seqlen == seqlen && r.causal == causal)
      return 4 * (r.flash.wall_s + (with_naive && r.naive ? r.naive->wall_s : 0.0));
  return INFINITY;
}

// The masks to run at `next` within the time budget: both, or, once flashgrad
// runs alone, only the cheaper causal one rather than none; empty to stop.
std::vector<bool> masks_within_budget(Demo& d, int64_t seqlen, int64_t next) {
  const double elapsed = now_seconds() - d.start, budget = d.settings.budget_s;
  const bool with_naive = naive_fits(d, next);
  const double full = next_row_seconds(d, seqlen, false, with_naive);
  const double causal = next_row_seconds(d, seqlen, true, with_naive);
  if (elapsed + full + causal <= budget) return {false, true};
  if (!with_naive && elapsed + causal <= budget) {
    std::printf(
        "  -- L=%lld: the full mask would take about %.0f s more; timing the causal one only (--budget-s)\n",
        static_cast<long long>(next), full);
    return {true};
  }
  d.stopped_because =
      format("L=%lld would take about %.0f s more after %.0f s, past the %.0f s budget (--budget-s)",
             static_cast<long long>(next), (std::isfinite(full) ? full : 0.0) + causal, elapsed, budget);
  return {};
}

void run_lengths(Demo& d) {
  print_header();
  int64_t flash_only = 0;
  std::vector<bool> masks = {false, true};
  for (int64_t seqlen = d.settings.min_seqlen;; seqlen *= 2) {
    const bool with_naive = naive_fits(d, seqlen);
    if (!with_naive && has_baseline(d) && flash_only == 0)
      std::printf(
          "  -- naive attention no longer fits from L=%lld: it needs %.1f GiB, %.1f GiB are available "
          "and it may use %.0f%% of them\n",
          static_cast<long long>(seqlen), mib(naive_predicted_bytes(d, seqlen)) / 1024,
          mib(available_bytes(d)) / 1024, 100 * kMemorySafety);
    run_length(d, seqlen, with_naive, masks);
    if (!with_naive && has_baseline(d) && ++flash_only >= kFlashOnlyDoublings) {
      d.stopped_because = format("flashgrad ran %lld doublings past the baseline's memory limit",
                                 static_cast<long long>(kFlashOnlyDoublings));
      return;
    }
    const int64_t next = 2 * seqlen;
    if (d.settings.max_seqlen > 0 && next > d.settings.max_seqlen) {
      d.stopped_because = format("--max-seqlen %lld reached", static_cast<long long>(d.settings.max_seqlen));
      return;
    }
    masks = masks_within_budget(d, seqlen, next);
    if (masks.empty()) return;
  }
}

// --- reports -------------------------------------------------------------------

std::string measurement_json(const Measurement& m) {
  return Json()
      .add("ms", m.ms)
      .add("runs", m.runs)
      .add("peak_bytes", m.peak_bytes)
      .add("vm_hwm_bytes", m.vm_hwm_bytes)
      .add("gflops", m.gflops())
      .add("wall_s", m.wall_s)
      .str();
}

std::string demo_json(const Demo& d) {
  std::vector<std::string> rows;
  for (const Row& r : d.rows) {
    Json j;
    j.add("seqlen", r.seqlen).add("causal", r.causal).add_raw("flashgrad", measurement_json(r.flash));
    if (r.naive)
      j.add_raw("naive", measurement_json(*r.naive));
    else
      j.add_null("naive");
    j.add("naive_predicted_bytes", r.naive_predicted_bytes).add("naive_note", r.naive_note);
    rows.push_back(j.str());
  }
  return Json()
      .add("version", version())
      .add("isa", isa_name())
      .add("threads", d.settings.threads > 0 ? d.settings.threads : max_threads())
      .add("mem_available_bytes", available_bytes(d))
      .add_raw("shape", Json()
                            .add("batch", kBatch)
                            .add("heads_q", kHeads)
                            .add("heads_kv", kHeads)
                            .add("head_dim", kHeadDim)
                            .add("dtype", "f32")
                            .str())
      .add_raw("edge_cases", Json().add("passed", d.edge_passed).add("total", d.edge_total).str())
      .add("baseline", has_baseline(d) ? d.baseline.path : "none: flashgrad-baseline " + d.baseline.missing)
      .add("baseline_check", d.baseline_check)
      .add("openblas", d.openblas)
      .add("openblas_core", d.blas_core)
      .add("openblas_core_origin", d.blas_core_origin)
      .add("process_floor_bytes", d.floor_bytes)
      .add("baseline_floor_bytes", d.naive_floor_bytes)
      .add_raw("rows", Json::array(rows))
      .add("stopped_because", d.stopped_because)
      .add("total_seconds", now_seconds() - d.start)
      .str();
}

std::string demo_markdown(const Demo& d) {
  std::ostringstream s;
  s << "# flashgrad demo\n\n"
    << "flashgrad " << version() << ", isa " << isa_name() << ", "
    << (d.settings.threads > 0 ? d.settings.threads : max_threads()) << " threads. "
    << "Shape: batch " << kBatch << ", " << kHeads << " heads, head_dim " << kHeadDim << ", f32, "
    << "forward + backward.\n\n"
    << "| L | mask | flashgrad ms | naive ms | speedup | flashgrad peak MiB | naive peak MiB | flashgrad "
       "GFLOP/s |\n"
    << "|---:|:---|---:|---:|---:|---:|---:|---:|\n";
  for (const Row& r : d.rows) {
    s << "| " << r.seqlen << " | " << (r.causal ? "causal" : "full") << " | " << ms_text(r.flash.ms) << " | ";
    if (r.naive)
      s << ms_text(r.naive->ms) << " | " << format("%.2fx", r.naive->ms / r.flash.ms) << " | "
        << format("%.0f", mib(r.flash.peak_bytes)) << " | " << format("%.0f", mib(r.naive->peak_bytes));
    else
      s << r.naive_note << " | - | " << format("%.0f", mib(r.flash.peak_bytes)) << " | -";
    s << " | " << format("%.1f", r.flash.gflops()) << " |\n";
  }
  s << "\nEach time is the median forward+backward call in a child process; a call over half a second is "
    << "timed once. Peak memory is that child's maximum resident set (ru_maxrss from wait4): the program "
    << format("itself (an idle flashgrad child peaks at %.0f MiB", mib(d.floor_bytes))
    << (has_baseline(d) ? format(", an idle baseline child at %.0f MiB", mib(d.naive_floor_bytes)) : "")
    << "), the f32 inputs, outputs and gradients, and what the implementation allocates. ";
  if (has_baseline(d))
    s << "The naive baseline (flashgrad-baseline) keeps S (reused for dS), P and dP for every head, "
      << "3 x L x L x 4 bytes per head, and multiplies with " << d.openblas << " sgemm (core " << d.blas_core
      << "); it is skipped once its predicted peak exceeds "
      << format("%.0f%% of the %.1f GiB available", 100 * kMemorySafety, mib(available_bytes(d)) / 1024) << ".";
  else
    s << "There is no baseline: flashgrad-baseline " << d.baseline.missing << ".";
  s << "\n\nCorrectness: " << d.edge_passed << "/" << d.edge_total << " edge cases pass against the fp64 reference"
    << (has_baseline(d) ? "; the baseline: " + d.baseline_check : "") << ".\n\nStopped: " << d.stopped_because
    << ".\n";
  return s.str();
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::string plot_script() {
  const fs::path beside = fs::path(self_executable()).parent_path() / "plot_demo.py";
  if (fs::exists(beside)) return beside.string();
  return (fs::path(FLASHGRAD_TOOLS_SOURCE_DIR) / "plot_demo.py").string();
}

void plot(const Demo& d, const fs::path& json_path) {
  const std::string python = "/usr/bin/python3";
  if (!fs::exists(python) || run_child({python, "-c", "import matplotlib"}, true).exit_code != 0) {
    std::printf("  no plot: %s has no matplotlib (Debian: apt-get install python3-matplotlib)\n",
                python.c_str());
    return;
  }
  const fs::path png = d.settings.out_dir / "demo.png";
  const ChildResult r = run_child({python, plot_script(), json_path.string(), png.string()});
  if (r.exit_code == 0)
    std::printf("  wrote %s\n", png.c_str());
  else
    std::printf("  plotting failed (status %d); the table above is complete\n", r.exit_code);
}

void write_reports(const Demo& d) {
  fs::create_directories(d.settings.out_dir);
  const fs::path json = d.settings.out_dir / "demo.json", md = d.settings.out_dir / "demo.md";
  write_file(json, demo_json(d) + "\n");
  write_file(md, demo_markdown(d));
  std::printf("  wrote %s and %s\n", md.c_str(), json.c_str());
  if (d.settings.plot) plot(d, json);
}

void print_summary(const Demo& d) {
  const Row* both = nullptr;
  for (const Row& r : d.rows)
    if (r.naive && !r.causal) both = &r;
  if (both)
    std::printf(
        "\n  At L=%lld flashgrad's process peaked at %.0f MiB, the naive one at %.0f MiB (%.0fx more).\n",
        static_cast<long long>(both->seqlen), mib(both->flash.peak_bytes), mib(both->naive->peak_bytes),
        static_cast<double>(both->naive->peak_bytes) / static_cast<double>(both->flash.peak_bytes));
  if (d.rows.empty()) return;
  const Row& last = d.rows.back();
  std::printf("  Longest: L=%lld (%s), flashgrad forward+backward in %.1f s with %.0f MiB peak.\n",
              static_cast<long long>(last.seqlen), last.causal ? "causal" : "full", last.flash.ms / 1e3,
              mib(last.flash.peak_bytes));
  if (last.naive) {
    const int64_t next = 2 * last.seqlen;
    std::printf("  Naive attention at L=%lld would need %.1f GiB (%.1f GiB are available).\n",
                static_cast<long long>(next), mib(naive_predicted_bytes(d, next)) / 1024,
                mib(available_bytes(d)) / 1024);
  }
  std::printf("  Stopped: %s.\n", d.stopped_because.c_str());
}

}  // namespace

int run_demo(Args& args) {
  Demo d;
  d.settings = parse_settings(args);
  d.exe = self_executable();
  d.start = now_seconds();
  d.baseline = find_baseline();
  const int threads = d.settings.threads > 0 ? d.settings.threads : max_threads();
  std::printf("flashgrad %s demo: isa %s, %d threads, %.1f GiB available\n", version().c_str(), isa_name(),
              threads, mib(available_bytes(d)) / 1024);
  describe_baseline(d);

  std::printf("(a) correctness against the fp64 reference\n");
  const bool edges_ok = check_edge_cases(d);
  const bool baseline_ok = !has_baseline(d) || check_baseline(d);
  if (!edges_ok || !baseline_ok) {
    std::printf("\ndemo: a correctness check failed; not timing a wrong result.\n");
    return 1;
  }

  std::printf("\n(b) forward+backward, B=%lld H=%lld d=%lld f32: time (median) and peak resident memory\n",
              static_cast<long long>(kBatch), static_cast<long long>(kHeads),
              static_cast<long long>(kHeadDim));
  d.floor_bytes = measure(d, d.exe, "none", 1, false).peak_bytes;
  if (has_baseline(d)) {
    d.naive_floor_bytes = measure(d, d.baseline.path, "none", 1, false).peak_bytes;
    std::printf("  each measurement runs in its own process; an idle one peaks at %.0f MiB (the baseline's %.0f MiB)\n",
                mib(d.floor_bytes), mib(d.naive_floor_bytes));
  } else {
    std::printf("  each measurement runs in its own process; an idle one peaks at %.0f MiB\n", mib(d.floor_bytes));
  }
  run_lengths(d);
  print_summary(d);
  std::printf("\n");
  write_reports(d);
  std::printf("  demo took %.0f s\n", now_seconds() - d.start);
  return 0;
}

}  // namespace flashgrad::tools
