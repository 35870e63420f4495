// `flashgrad-lab sweep` (sweep.hpp): settings, the machine's rates, and
// the grid of flashgrad against its peers, each measurement in a child
// process so that its ru_maxrss is that measurement's peak memory.
#include "sweep.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "check.hpp"
#include "cli.hpp"
#include "openblas.hpp"
#include "system.hpp"

namespace flashgrad::tools {
namespace sweep {

const char* const kPython = "/usr/bin/python3";
const char* const kJemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
// A peer runs only while its predicted peak stays under this share of MemAvailable.
constexpr double kMemorySafety = 0.8;

testing::Case Config::to_case(int threads) const {
  testing::Case c;
  c.name = "sweep";
  c.dtype = dtype;
  c.batch = kBatch;
  c.seqlen_q = c.seqlen_k = seqlen;
  c.heads_q = c.heads_kv = kHeads;
  c.head_dim = c.head_dim_v = head_dim;
  c.causal = causal;
  c.num_threads = threads;
  return c;
}

std::string Config::shape() const {
  return format("%s d=%lld %s", dtype_name(dtype), static_cast<long long>(head_dim), causal ? "causal" : "full");
}

int threads_of(const Sweep& s) { return s.settings.threads > 0 ? s.settings.threads : max_threads(); }
double elapsed(const Sweep& s) { return now_seconds() - s.start; }

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a.empty() ? "unknown" : a + " " + b + " " + c;
}

CpuSample CpuSample::now() {
  CpuSample x;
  x.wall = now_seconds();
  std::ifstream in("/proc/stat");
  std::string label;
  // user nice system idle iowait irq softirq steal (guest time is already in user)
  long long v[8] = {};
  in >> label;
  for (long long& f : v) in >> f;
  const double tick = 1.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  x.busy = static_cast<double>(v[0] + v[1] + v[2] + v[5] + v[6]) * tick;
  x.steal = static_cast<double>(v[7]) * tick;
  for (const int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {  // children: those already waited for
    struct rusage ru {};
    getrusage(who, &ru);
    x.own += static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
             1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  }
  return x;
}

CpuShare CpuSample::since(const CpuSample& start, const std::string& what) const {
  CpuShare c;
  c.what = what;
  c.seconds = wall - start.wall;
  const double capacity = c.seconds * static_cast<double>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  if (capacity <= 0) return c;
  c.others = std::max(0.0, (busy - start.busy) - (own - start.own)) / capacity;
  c.steal = (steal - start.steal) / capacity;
  return c;
}

std::string tool_file(const char* name) {
  const std::filesystem::path beside = std::filesystem::path(self_executable()).parent_path() / name;
  if (std::filesystem::exists(beside)) return beside.string();
  return (std::filesystem::path(FLASHGRAD_LAB_SOURCE_DIR) / name).string();
}

bool check_config(Sweep& s, const testing::Case& c) {
  const testing::Case small = small_copy(c);
  const std::string key = small.describe();
  for (const Check& done : s.checks)
    if (done.small_case == key) return done.passed;
  const testing::Report r = testing::check_case(small);
  s.checks.push_back({c.describe(), key, r.pass(), worst_fraction(r)});
  if (!r.pass()) {
    s.check_failed = true;
    std::printf("  CHECK FAILED on %s; that configuration is not timed:\n%s", key.c_str(), r.table().c_str());
  }
  return r.pass();
}

namespace {

Settings parse_settings(Args& args) {
  Settings s;
  s.quick = args.has("--quick");
  s.out_dir = args.value("--out").value_or("out/sweep");
  s.threads = static_cast<int>(args.integer("--threads", 0, 1, 4096));
  s.min_seqlen = args.integer("--min-seqlen", 512, 16);
  s.max_seqlen = args.integer("--max-seqlen", s.quick ? 1024 : 8192, s.min_seqlen);
  s.budget_s = args.real("--budget-s", s.quick ? 45 : 840, 1);
  s.min_time = s.quick ? 0.05 : 1.0;
  s.torch = !args.has("--no-torch");
  s.plot = !args.has("--no-plot");
  args.finish();
  return s;
}

// "key=value" fields of a child's output line.
std::map<std::string, std::string> fields(const std::string& output) {
  std::map<std::string, std::string> out;
  std::istringstream in(output);
  std::string field;
  while (in >> field)
    if (const size_t eq = field.find('='); eq != std::string::npos) out[field.substr(0, eq)] = field.substr(eq + 1);
  return out;
}

// A child's peak resident memory. Its own VmHWM, which it prints, counts
// only the program it runs: ru_maxrss from wait4 also counts the copy of this
// process that fork made before exec (Linux keeps the larger high-water mark
// across exec), so it can never read less than this process's size.
int64_t child_peak(const ChildResult& r) {
  const auto f = fields(r.output);
  if (const auto it = f.find("vmhwm"); it != f.end() && std::atoll(it->second.c_str()) > 0)
    return std::atoll(it->second.c_str());
  return r.peak_rss_bytes;
}

// Numbers and strings of the JSON `flashgrad-lab roofline --json` printed: this
// program's own output, one object whose top-level keys are unique.
// Every number after "key": in order (for the keys of an array's objects).
std::vector<double> json_numbers(const std::string& json, const std::string& key) {
  std::vector<double> out;
  const std::string needle = "\"" + key + "\": ";
  for (size_t at = json.find(needle); at != std::string::npos; at = json.find(needle, at + 1)) {
    const char* start = json.c_str() + at + needle.size();
    char* end = nullptr;
    const double x = std::strtod(start, &end);
    out.push_back(end == start ? NAN : x);  // null: no number
  }
  return out;
}
double json_number(const std::string& json, const std::string& key) {
  const std::vector<double> all = json_numbers(json, key);
  return all.empty() ? NAN : all.front();
}

std::vector<std::string> json_strings(const std::string& json, const std::string& key) {
  std::vector<std::string> out;
  const std::string needle = "\"" + key + "\": \"";
  for (size_t at = json.find(needle); at != std::string::npos; at = json.find(needle, at + 1)) {
    const size_t from = at + needle.size();
    out.push_back(json.substr(from, json.find('"', from) - from));
  }
  return out;
}

MachineRates measure_machine(const Sweep& s) {
  std::vector<std::string> argv = {s.exe, "roofline", "--json", "--threads", std::to_string(threads_of(s))};
  if (s.settings.quick) argv.push_back("--quick");
  const ChildResult r = run_child(argv);
  const std::string json = r.output.substr(0, r.output.find_last_of('}') + 1);
  if (r.exit_code != 0 || json.empty())
    throw std::runtime_error("measuring the machine's rates: `flashgrad-lab roofline` " + how_it_ended(r));
  MachineRates m;
  m.json = json;
  m.sgemm_gflops = json_number(json, "sgemm_gflops");
  m.sgemm_1thread_gflops = json_number(json, "sgemm_1thread_gflops");
  m.bf16_gemm_gflops = json_number(json, "bf16_gemm_gflops");
  m.dnnl_f32_gflops = json_number(json, "dnnl_f32_gemm_gflops");
  m.triad_gbs = json_number(json, "triad_gbs");
  m.memcpy_gbs = json_number(json, "memcpy_gbs");
  m.triad_array_bytes = json_number(json, "triad_array_bytes");
  const std::vector<std::string> impl = json_strings(json, "bf16_gemm_impl");
  m.bf16_gemm_impl = impl.empty() ? "" : impl.front();
  const std::vector<std::string> llc = json_strings(json, "last_level_cache");
  m.last_level_cache = llc.empty() ? "unknown" : llc.front();
  const std::vector<std::string> products = json_strings(json, "product");
  const std::vector<double> tm = json_numbers(json, "m"), tn = json_numbers(json, "n"), tk = json_numbers(json, "k");
  const std::vector<double> ob = json_numbers(json, "openblas_gflops"), od = json_numbers(json, "onednn_gflops"),
                            bl = json_numbers(json, "blis_gflops"), xs = json_numbers(json, "libxsmm_gflops"),
                            fg = json_numbers(json, "flashgrad_gflops");
  const auto at = [](const std::vector<double>& v, size_t i) { return i < v.size() ? v[i] : NAN; };
  for (size_t i = 0; i < products.size() && i < tm.size() && i < tn.size() && i < tk.size(); ++i)
    m.tiles.push_back({products[i], format("%.0f x %.0f x %.0f", tm[i], tn[i], tk[i]), at(ob, i), at(od, i),
                       at(bl, i), at(xs, i), at(fg, i)});
  const std::vector<std::string> pair_products = json_strings(json, "pair_product");
  const std::vector<double> pm = json_numbers(json, "pair_m"), pn = json_numbers(json, "pair_n"),
                            pk = json_numbers(json, "pair_k"), po = json_numbers(json, "pair_onednn_gflops"),
                            pf = json_numbers(json, "pair_flashgrad_gflops");
  for (size_t i = 0; i < pair_products.size() && i < pm.size() && i < pn.size() && i < pk.size(); ++i)
    m.pair_tiles.push_back({pair_products[i], format("%.0f x %.0f x %.0f", pm[i], pn[i], pk[i]), at(po, i), at(pf, i)});
  const std::vector<std::string> pair_engine = json_strings(json, "pair_tiles_engine"),
                                 pair_impl = json_strings(json, "pair_tiles_onednn_impl");
  m.pair_engine = pair_engine.empty() ? "n/a" : pair_engine.front();
  m.pair_onednn_impl = pair_impl.empty() ? "n/a" : pair_impl.front();
  const std::vector<std::string> blis = json_strings(json, "blis"), xsmm = json_strings(json, "libxsmm");
  m.blis = blis.empty() ? "n/a" : blis.front();
  m.libxsmm = xsmm.empty() ? "n/a" : xsmm.front();
  const auto rate = [](double x) { return std::isfinite(x) ? format("%.1f", x) : std::string("n/a"); };
  std::printf("  SGEMM n=2048 %s GFLOP/s, bf16 GEMM n=2048 %s GFLOP/s (oneDNN %s), triad %s GB/s, memcpy %s GB/s\n",
              rate(m.sgemm_gflops).c_str(), rate(m.bf16_gemm_gflops).c_str(), m.bf16_gemm_impl.c_str(),
              rate(m.triad_gbs).c_str(), rate(m.memcpy_gbs).c_str());
  return m;
}

// --- the peers' processes -----------------------------------------------------------

std::vector<std::string> torch_argv(const Sweep& s) {
  std::vector<std::string> argv;
  if (s.jemalloc) argv = {"/usr/bin/env", std::string("LD_PRELOAD=") + kJemalloc};
  argv.push_back(kPython);
  argv.push_back(tool_file("torch_attention.py"));
  argv.push_back("--threads");
  argv.push_back(std::to_string(threads_of(s)));
  return argv;
}

void setup_torch(Sweep& s) {
  if (!s.settings.torch) {
    s.torch_note = "not run (--no-torch)";
    return;
  }
  s.jemalloc = std::filesystem::exists(kJemalloc);
  if (!std::filesystem::exists(kPython)) {
    s.torch_note = std::string("n/a: no ") + kPython;
    return;
  }
  std::vector<std::string> argv = torch_argv(s);
  argv.push_back("--floor");
  const ChildResult r = run_child(argv, true);
  const auto f = fields(r.output);
  if (r.exit_code != 0 || !f.count("torch")) {
    s.torch_note = "n/a: PyTorch does not import (Debian: apt-get install python3-torch)";
    return;
  }
  s.torch_version = f.at("torch");
  s.floor_torch = child_peak(r);
}

Timing parse_timing(const ChildResult& r, const std::string& what) {
  Timing t;
  t.wall_s = r.seconds;
  const auto f = fields(r.output);
  if (r.exit_code != 0 || !f.count("fwd_ms")) {
    const std::string reason = f.count("error") ? f.at("error") : "the child " + how_it_ended(r);
    t.note = "failed: " + reason;
    std::printf("  -- %s failed: %s\n", what.c_str(), reason.c_str());
    return t;
  }
  t.present = true;
  t.fwd_ms = std::stod(f.at("fwd_ms"));
  t.bwd_ms = std::stod(f.at("bwd_ms"));
  t.fwd_bwd_ms = std::stod(f.at("fwd_bwd_ms"));
  t.runs = std::stoll(f.at("runs"));
  if (f.count("sgemm_paired")) {
    t.sgemm_paired = std::stod(f.at("sgemm_paired"));
    t.fwd_over_sgemm = std::stod(f.at("fwd_over_sgemm"));
    t.bwd_over_sgemm = std::stod(f.at("bwd_over_sgemm"));
  }
  t.peak_bytes = child_peak(r);
  return t;
}

// paired (flashgrad only): each run after an SGEMM (measure --paired-sgemm).
Timing run_impl(const Sweep& s, const std::string& impl, const Config& c, bool paired = false) {
  std::vector<std::string> argv;
  if (impl == "torch") {
    argv = torch_argv(s);
  } else {
    argv = {s.exe, "measure", "--impl", impl, "--split", "--threads", std::to_string(threads_of(s)), "--batch",
            std::to_string(kBatch)};
    if (paired) argv.insert(argv.end(), {"--paired-sgemm", std::to_string(kPairedSgemmN)});
  }
  const std::vector<std::string> common = {"--seqlen", std::to_string(c.seqlen), "--heads", std::to_string(kHeads),
                                           "--head-dim", std::to_string(c.head_dim), "--dtype", dtype_name(c.dtype),
                                           "--min-time", format("%g", s.settings.min_time)};
  argv.insert(argv.end(), common.begin(), common.end());
  if (c.causal) argv.push_back("--causal");
  return parse_timing(run_child(argv), impl + " at L=" + std::to_string(c.seqlen) + " " + c.shape());
}

// --- the grid ---------------------------------------------------------------------------

// What an implementation did at the last length it ran, per configuration
// shape, to predict the next length's time and memory (both grow as L^2).
struct Last {
  int64_t seqlen = 0;
  double wall_s = 0;
  double prev_wall_s = 0;  // at the length before (0: none)
  int64_t peak_bytes = 0;
  std::string stopped;  // non-empty: no longer run, and why
};

struct Grid {
  Sweep& s;
  std::map<std::string, Last> last;  // impl + shape

  int64_t floor_of(const std::string& impl) const { return impl == "torch" ? s.floor_torch : s.floor_flash; }

  // What l predicts for length seqlen: both grow as L^2.
  static double growth(const Last& l, int64_t seqlen) {
    return static_cast<double>(seqlen * seqlen) / static_cast<double>(l.seqlen * l.seqlen);
  }

  // flashgrad's predicted time at twice its last length, every configuration
  // it still runs; 0 before it has run two lengths. Its children's fixed
  // costs (start-up, the paired SGEMMs, a minimum time per pass) outweigh
  // the L^2 part at short lengths: L^2 alone had predicted 394 s for
  // L = 2048, whose whole grid then took 85 s, and the last doubling's
  // ratio 66 s for L = 4096, where its 8 configurations had taken about
  // 130 s in an earlier run (AVX2 host). So each configuration's
  // time is fitted as a + b L^2 to its last two lengths: w(2L) = w(L) +
  // 4 (w(L) - w(L / 2)), kept within 1x to 4x of w(L).
  double flash_wall_next() const {
    double wall = 0;
    for (const auto& [key, l] : last) {
      if (key.rfind("flashgrad", 0) != 0 || !l.stopped.empty() || l.seqlen == 0) continue;
      if (l.prev_wall_s <= 0) return 0;
      wall += std::clamp(l.wall_s + 4 * (l.wall_s - l.prev_wall_s), l.wall_s, 4 * l.wall_s);
    }
    return wall;
  }

  // Empty when impl may run at c; otherwise why not. A peer also leaves
  // flashgrad's predicted time at the next length inside the budget, where
  // that fits at all: the sweep is about flashgrad, and on a CPU without
  // bf16 GEMMs PyTorch's bf16 alone took most of the budget by L = 2048
  // (AVX2 host: 99 + 374 s predicted there), so flashgrad's own L = 4096
  // went unmeasured.
  std::string reason_to_skip(const std::string& impl, const Config& c) {
    Last& l = last[impl + c.shape()];
    if (!l.stopped.empty()) return l.stopped;
    if (l.seqlen == 0) return "";
    const int64_t next = 2 * c.seqlen;
    double kept = impl != "flashgrad" && next <= s.settings.max_seqlen ? flash_wall_next() : 0;
    if (elapsed(s) + kept > s.settings.budget_s) kept = 0;
    const double wall = l.wall_s * growth(l, c.seqlen);
    const double peak =
        static_cast<double>(floor_of(impl)) + growth(l, c.seqlen) * static_cast<double>(l.peak_bytes - floor_of(impl));
    const int64_t available = mem_available_bytes();
    if (available > 0 && peak > kMemorySafety * static_cast<double>(available))
      l.stopped = format("does not fit: needs about %.1f GiB of %.1f GiB available", mib(static_cast<int64_t>(peak)) / 1024,
                         mib(available) / 1024);
    else if (elapsed(s) + wall > s.settings.budget_s)
      l.stopped = format("skipped: about %.0f s more would pass the %.0f s budget (--budget-s)", wall,
                         s.settings.budget_s);
    else if (elapsed(s) + wall + kept > s.settings.budget_s)
      l.stopped = format("skipped: about %.0f s more would leave less than the %.0f s that flashgrad at L=%lld "
                         "needs of the %.0f s budget (--budget-s)",
                         wall, kept, static_cast<long long>(next), s.settings.budget_s);
    return l.stopped;
  }

  void record(const std::string& impl, const Config& c, const Timing& t) {
    Last& l = last[impl + c.shape()];
    if (!t.present) {
      l.stopped = "skipped after it " + t.note + " at L=" + std::to_string(c.seqlen);
      return;
    }
    l.prev_wall_s = l.seqlen ? l.wall_s : 0;
    l.seqlen = c.seqlen;
    l.wall_s = t.wall_s;
    l.peak_bytes = t.peak_bytes;
  }

  Timing measure(const std::string& impl, const Config& c) {
    if (std::string why = reason_to_skip(impl, c); !why.empty()) {
      Timing t;
      t.note = why;
      return t;
    }
    Timing t = run_impl(s, impl, c);
    record(impl, c, t);
    // The runs paired with an SGEMM give flashgrad's ratios in a child of
    // their own: the pauses around each SGEMM slowed short calls (L = 512
    // forward 2.4 -> 2.7 ms), which the times above are kept clear of.
    if (impl == "flashgrad" && t.present) {
      const Timing paired = run_impl(s, impl, c, true);
      last[impl + c.shape()].wall_s += paired.wall_s;  // both runs, for the budget
      t.sgemm_paired = paired.sgemm_paired;
      t.fwd_over_sgemm = paired.fwd_over_sgemm;
      t.bwd_over_sgemm = paired.bwd_over_sgemm;
    }
    return t;
  }
};

void print_row(const Sweep& s, const GridRow& r, const char* impl, const Timing& t) {
  if (!t.present) return;
  const double f = r.forward_flops, gemm = s.machine.gemm_gflops(r.c.dtype);
  const double rate = 3.5 * f / (t.fwd_bwd_ms * 1e6);
  std::printf("  %6lld %-17s %-9s %9.1f %9.1f %10.1f %8.1f %7.2fx %8.0f\n", static_cast<long long>(r.c.seqlen),
              r.c.shape().c_str(), impl, t.fwd_ms, t.bwd_ms, t.fwd_bwd_ms, rate, rate / gemm, mib(t.peak_bytes));
  std::fflush(stdout);
}

std::vector<Config> configs_at(const Settings& st, int64_t seqlen) {
  std::vector<Config> out;
  const std::vector<int64_t> dims = st.quick ? std::vector<int64_t>{64} : std::vector<int64_t>{64, 128};
  for (const DType dtype : {DType::f32, DType::bf16})
    for (const int64_t d : dims)
      for (const bool causal : {false, true}) out.push_back(Config{dtype, d, causal, seqlen});
  return out;
}

void run_grid(Sweep& s) {
  std::printf("\n(grid) B=%lld H=%lld, forward, backward and both; median ms; GFLOP/s and its ratio to GEMM for "
              "fwd+bwd\n", static_cast<long long>(kBatch), static_cast<long long>(kHeads));
  std::printf("  %6s %-17s %-9s %9s %9s %10s %8s %8s %8s\n", "L", "config", "impl", "fwd ms", "bwd ms",
              "f+b ms", "GFLOP/s", "x GEMM", "peak MiB");
  Grid g{s, {}};
  for (int64_t seqlen = s.settings.min_seqlen; seqlen <= s.settings.max_seqlen; seqlen *= 2) {
    const size_t first = s.grid.size();
    const CpuSample length_start = CpuSample::now();
    if (!s.settings.quick) {
      const ChildResult probe = run_child({s.exe, "roofline", "--probe", "--threads", std::to_string(threads_of(s))});
      s.sgemm_probe.emplace_back(seqlen, json_number(probe.output, "sgemm_gflops"));
      std::printf("  -- SGEMM probe before L=%lld: %.1f GFLOP/s\n", static_cast<long long>(seqlen),
                  s.sgemm_probe.back().second);
    }
    for (const Config& c : configs_at(s.settings, seqlen)) {
      GridRow r;
      r.c = c;
      const testing::Case tc = c.to_case(threads_of(s));
      r.forward_flops = tc.forward_flops();
      if (check_config(s, tc)) {
        r.flash = g.measure("flashgrad", c);
      } else {
        r.flash.note = "FAILED its check against the fp64 reference: not timed";
      }
      print_row(s, r, "flashgrad", r.flash);
      s.grid.push_back(r);
    }
    // The peers after flashgrad at each length, so that a budget cut drops
    // them first, and d = 64 before d = 128, so that it drops d = 128 first.
    std::vector<size_t> order;
    for (size_t i = first; i < s.grid.size(); ++i) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return s.grid[a].c.head_dim < s.grid[b].c.head_dim; });
    for (const size_t i : order) {
      GridRow& r = s.grid[i];
      if (r.c.dtype == DType::f32) {
        r.naive = g.measure("naive", r.c);
      } else {
        r.naive.note = "n/a: the naive baseline is f32 only";
      }
      print_row(s, r, "naive", r.naive);
    }
    for (const size_t i : order) {
      GridRow& r = s.grid[i];
      if (s.torch_version.empty()) {
        r.torch.note = s.torch_note;
      } else if (s.settings.quick && seqlen > s.settings.min_seqlen) {
        r.torch.note = "not run in --quick beyond the first length";
      } else {
        r.torch = g.measure("torch", r.c);
      }
      print_row(s, r, "torch", r.torch);
    }
    s.cpu.push_back(CpuSample::now().since(length_start, "grid L=" + std::to_string(seqlen)));
    std::printf("  -- other processes used %.0f%% of the CPUs during L=%lld (steal %.0f%%)\n",
                100 * s.cpu.back().others, static_cast<long long>(seqlen), 100 * s.cpu.back().steal);
  }
}

// The source tree's commit, "-dirty" with uncommitted changes: what the
// binary was most likely built from (the build may be older than the tree).
std::string source_version() {
  if (!std::filesystem::exists("/usr/bin/git")) return "unknown";
  const ChildResult r =
      run_child({"/usr/bin/git", "-C", FLASHGRAD_LAB_SOURCE_DIR, "describe", "--always", "--dirty"}, true);
  std::string out = r.output;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return r.exit_code == 0 && !out.empty() ? out : "unknown";
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

}  // namespace
}  // namespace sweep

int run_sweep(Args& args) {
  using namespace sweep;
  Sweep s;
  s.settings = parse_settings(args);
  s.exe = self_executable();
  s.start = now_seconds();
  s.started_utc = utc_now();
  s.load_start = load_average();
  s.source = source_version();
  std::tie(s.blas_core, s.blas_core_origin) = choose_openblas_core();
  std::printf("flashgrad-lab %s sweep%s (source %s): isa %s, %d threads, load average %s at the start\n",
              version().c_str(), s.settings.quick ? " (quick)" : "", s.source.c_str(), isa_name(), threads_of(s),
              s.load_start.c_str());
  std::printf("peers: %s sgemm (core %s), ", openblas_version().c_str(), s.blas_core.c_str());
  setup_torch(s);
  if (!s.torch_version.empty())
    std::printf("PyTorch %s%s\n", s.torch_version.c_str(), s.jemalloc ? " with jemalloc" : "");
  else
    std::printf("PyTorch %s\n", s.torch_note.c_str());

  const CpuSample run_start = CpuSample::now();
  std::printf("\n(machine) the rates flashgrad is divided by\n");
  s.machine.start = measure_machine(s);
  s.cpu.push_back(CpuSample::now().since(run_start, "machine rates at the start"));
  s.floor_flash = child_peak(run_child({s.exe, "measure", "--impl", "none", "--seqlen", "1"}));
  const CpuSample extras_start = CpuSample::now();
  run_extras(s);
  s.cpu.push_back(CpuSample::now().since(extras_start, "short queries, overhead, threads"));
  run_grid(s);
  if (!s.settings.quick) {
    std::printf("\n(machine) again, at the end; the higher of each pair of rates is used\n");
    const CpuSample end_start = CpuSample::now();
    s.machine.end = measure_machine(s);
    s.cpu.push_back(CpuSample::now().since(end_start, "machine rates at the end"));
  }
  s.cpu.push_back(CpuSample::now().since(run_start, "whole run"));
  s.load_end = load_average();
  s.seconds = elapsed(s);
  std::printf("\n  other processes used %.0f%% of the CPUs over the run (steal %.0f%%); the sweep took %.0f s\n",
              100 * s.cpu.back().others, 100 * s.cpu.back().steal, s.seconds);
  write_reports(s);
  if (s.check_failed) {
    std::printf("sweep: a configuration failed its check against the fp64 reference (see above)\n");
    return 1;
  }
  return 0;
}

}  // namespace flashgrad::tools
