// `flashgrad bench --features`: the rate of each training feature (softcap,
// dropout, bias, mask, windows, MQA, short sequences), alone and with causal,
// as a fraction of the plain configuration's rate, all timed in one run.
//
// Rates are on useful FLOPs (Case::forward_flops: only the pairs a mask
// shape lets through; backward 2.5x the forward). A feature alone is
// compared with the plain configuration; with causal, with plain causal;
// and causal itself with plain. Configurations are timed in rounds, one call
// of each per round, so that a slow spell of the machine falls on all of
// them alike.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "case_flags.hpp"
#include "check.hpp"
#include "cli.hpp"
#include "harness.hpp"

namespace flashgrad::tools {
namespace {

using testing::Case;

struct Feature {
  std::string name;
  void (*apply)(Case&, bool causal);
};

void window_of(Case& c, int64_t w, bool causal) {
  c.window_left = w;
  c.window_right = causal ? 0 : w;
  c.causal = false;  // (w, 0) is the causal window
}

// B * L stays at the plain configuration's L (at least one sequence).
void short_rows(Case& c, int64_t l) {
  c.batch = std::max<int64_t>(1, c.batch * c.seqlen_q / l);
  c.seqlen_q = c.seqlen_k = l;
}

const std::vector<Feature>& features() {
  static const std::vector<Feature> list = {
      {"plain", [](Case&, bool) {}},
      {"softcap 30", [](Case& c, bool) { c.softcap = 30.0; }},
      {"dropout 0.1", [](Case& c, bool) { c.dropout_p = 0.1; }},
      {"additive bias", [](Case& c, bool) { c.bias = testing::BiasKind::bcast_batch; }},
      {"boolean mask", [](Case& c, bool) { c.mask = testing::MaskKind::bcast_batch; }},
      {"window 256", [](Case& c, bool causal) { window_of(c, 256, causal); }},
      {"window 1024", [](Case& c, bool causal) { window_of(c, 1024, causal); }},
      {"MQA, 1 K/V head", [](Case& c, bool) { c.heads_kv = 1; }},
      {"short, L 256", [](Case& c, bool) { short_rows(c, 256); }},
      {"short, L 128", [](Case& c, bool) { short_rows(c, 128); }},
  };
  return list;
}

struct Config {
  Case c;
  std::unique_ptr<testing::Problem> p;
  testing::Outputs o;
  std::vector<double> fwd_s, bwd_s;
  double fwd_rate() const { return c.forward_flops() / median(fwd_s) / 1e9; }
  double bwd_rate() const { return 2.5 * c.forward_flops() / median(bwd_s) / 1e9; }
};

Case variant(const Case& plain, const Feature& f, bool causal) {
  Case c = plain;
  c.causal = causal;
  f.apply(c, causal);
  return c;
}

// Every configuration of one dtype and head_dim, checked on a small copy.
std::vector<Config> build(const Case& plain) {
  std::vector<Config> out;
  for (const bool causal : {false, true})
    for (const Feature& f : features()) {
      Config x;
      x.c = variant(plain, f, causal);
      const Case small = small_copy(x.c);
      const testing::Report r = testing::check_case(small);
      if (!r.pass())
        throw std::runtime_error("flashgrad bench --features: the kernels fail their check on " + small.describe() +
                                 "; not timing them\n" + r.table());
      x.p = std::make_unique<testing::Problem>(testing::make_problem(x.c));
      x.o = testing::make_outputs(*x.p, false);
      out.push_back(std::move(x));
    }
  return out;
}

void time_rounds(std::vector<Config>& cs, int64_t warmup, int64_t repeats) {
  for (int64_t round = 0; round < warmup + repeats; ++round)
    for (Config& x : cs) {
      const testing::Problem& p = *x.p;
      testing::Outputs& o = x.o;
      const double t0 = now_seconds();
      forward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view);
      const double t1 = now_seconds();
      const Grads g{o.dq.view, o.dk.view, o.dv.view, std::nullopt, std::nullopt};
      backward(p.opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view, p.dout.view, g);
      const double t2 = now_seconds();
      if (round < warmup) continue;
      x.fwd_s.push_back(t1 - t0);
      x.bwd_s.push_back(t2 - t1);
    }
}

void print_table(const Case& plain, const std::vector<Config>& cs) {
  const size_t n = features().size();
  const Config& p0 = cs[0];
  const Config& c0 = cs[n];
  std::printf("\n%s d %lld: plain %.0f / %.0f GFLOP/s, causal %.0f / %.0f (forward / backward)\n",
              dtype_name(plain.dtype), static_cast<long long>(plain.head_dim), p0.fwd_rate(), p0.bwd_rate(),
              c0.fwd_rate(), c0.bwd_rate());
  std::printf("%-18s %17s   %17s   %17s\n", "", "alone / plain", "causal / causal", "causal / plain");
  std::printf("%-18s %8s %8s   %8s %8s   %8s %8s\n", "feature", "fwd", "bwd", "fwd", "bwd", "fwd", "bwd");
  for (size_t i = 0; i < n; ++i) {
    const Config& a = cs[i];
    const Config& b = cs[n + i];
    std::printf("%-18s %8.2f %8.2f   %8.2f %8.2f   %8.2f %8.2f\n", features()[i].name.c_str(),
                a.fwd_rate() / p0.fwd_rate(), a.bwd_rate() / p0.bwd_rate(), b.fwd_rate() / c0.fwd_rate(),
                b.bwd_rate() / c0.bwd_rate(), b.fwd_rate() / p0.fwd_rate(), b.bwd_rate() / p0.bwd_rate());
  }
}

std::string rates_json(const std::vector<Config>& cs) {
  std::string rows;
  const size_t n = features().size();
  for (size_t i = 0; i < cs.size(); ++i) {
    const Config& x = cs[i];
    rows += (i ? "," : "") + Json()
                                 .add("feature", features()[i % n].name)
                                 .add("causal", i >= n)
                                 .add("case", x.c.describe())
                                 .add("forward_gflops", x.fwd_rate())
                                 .add("backward_gflops", x.bwd_rate())
                                 .str();
  }
  return "[" + rows + "]";
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = s.find(',', at);
    out.push_back(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

}  // namespace

int run_bench_features(Args& args) {
  const std::vector<std::string>& t = args.tokens();
  const bool lengths_given = std::any_of(t.begin(), t.end(), [](const std::string& x) {
    return x.rfind("--seqlen", 0) == 0;  // --seqlen, --seqlen-q, --seqlen-k, with or without =
  });
  Case base = case_from_flags(args);
  if (!lengths_given) base.seqlen_q = base.seqlen_k = 2048;
  const std::vector<std::string> dtypes = split_list(args.value("--dtypes").value_or("f32,bf16"));
  const std::vector<std::string> dim_list = split_list(args.value("--dims").value_or("64,128"));
  for (const std::string& dt : dtypes)
    if (dt != "f32" && dt != "bf16" && dt != "f16" && dt != "f64")
      args.fail("--dtypes", "a list of f32, bf16, f16 or f64", dt);
  std::vector<int64_t> dims;
  for (const std::string& d : dim_list) {
    bool ok = false;
    dims.push_back(parse_int64(d, &ok));
    if (!ok || dims.back() < 1 || dims.back() > 512) args.fail("--dims", "a list of head dims in [1, 512]", d);
  }
  const int64_t repeats = args.integer("--repeats", 5, 1);
  const int64_t warmup = args.integer("--warmup", 1, 0);
  const bool json = args.has("--json");
  args.finish();
  const int threads = base.num_threads > 0 ? base.num_threads : max_threads();
  if (!json)
    std::printf("flashgrad %s bench --features: isa %s, %d threads, B %lld, L %lld, %lld heads, median of %lld\n",
                version().c_str(), isa_name(), threads, static_cast<long long>(base.batch),
                static_cast<long long>(base.seqlen_q), static_cast<long long>(base.heads_q),
                static_cast<long long>(repeats));
  std::string tables;
  for (const std::string& dt : dtypes)
    for (const int64_t d : dims) {
      Case plain = base;
      plain.dtype = dt == "bf16" ? DType::bf16 : dt == "f16" ? DType::f16 : dt == "f64" ? DType::f64 : DType::f32;
      plain.head_dim = plain.head_dim_v = d;
      std::vector<Config> cs = build(plain);
      time_rounds(cs, warmup, repeats);
      if (json)
        tables += (tables.empty() ? "" : ",") + Json()
                                                    .add("dtype", dt)
                                                    .add("head_dim", plain.head_dim)
                                                    .add_raw("rates", rates_json(cs))
                                                    .str();
      else
        print_table(plain, cs);
    }
  if (json)
    std::printf("%s\n", Json()
                            .add("version", version())
                            .add("isa", isa_name())
                            .add("threads", threads)
                            .add("seqlen", base.seqlen_q)
                            .add("heads", base.heads_q)
                            .add_raw("tables", "[" + tables + "]")
                            .str()
                            .c_str());
  return 0;
}

}  // namespace flashgrad::tools
