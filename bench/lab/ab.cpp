// `flashgrad-lab ab`: two builds of the library loaded into one process and timed
// in turns on one configuration. On a virtual machine the speed drifts by
// more than the 3-5% a kernel change is worth (docs/performance.md); calls
// that alternate A B B A share the drift, and the time ratio of each
// adjacent pair cancels it: a build against a copy of itself reads 0.985-1.015.
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "case_flags.hpp"
#include "check.hpp"
#include "cli.hpp"
#include "flashgrad/flashgrad.h"
#include "harness.hpp"

namespace flashgrad::tools {
namespace {

using testing::Buffer;
using testing::Case;
using testing::Outputs;
using testing::Problem;
constexpr auto dl = testing::dl_view;

using ForwardFn = fg_status (*)(const fg_params*, const DLTensor*, const DLTensor*, const DLTensor*, DLTensor*,
                                DLTensor*);
using BackwardFn = fg_status (*)(const fg_params*, const DLTensor*, const DLTensor*, const DLTensor*,
                                 const DLTensor*, const DLTensor*, const DLTensor*, DLTensor*, DLTensor*,
                                 DLTensor*, DLTensor*);

// One build's C ABI, from its own copy of the library.
struct Build {
  std::string label, path;
  bool copy = false;  // loaded from a temporary copy of path
  fg_params (*params_default)() = nullptr;
  ForwardFn forward = nullptr;
  BackwardFn backward = nullptr;
  const char* (*last_error)() = nullptr;
  const char* (*version)() = nullptr;
  const char* (*isa)() = nullptr;
};

void* open_library(const std::string& path) {
  int flags = RTLD_NOW | RTLD_LOCAL;
#ifdef RTLD_DEEPBIND
  // The library's own symbols before this tool's, which links flashgrad statically.
  flags |= RTLD_DEEPBIND;
#endif
  // Without a slash dlopen would search the library path instead of the file named.
  return dlopen((path.find('/') == std::string::npos ? "./" + path : path).c_str(), flags);
}

// dlopen hands back the loaded copy for a file it has open already, so the
// same build twice (a self-comparison) loads B from a temporary copy.
std::string temporary_copy(const std::string& path) {
  const char* dir = std::getenv("TMPDIR");
  std::string name = std::string(dir && *dir ? dir : "/tmp") + "/flashgrad-ab-XXXXXX.so";
  const int fd = mkstemps(name.data(), 3);
  if (fd < 0) throw std::runtime_error("cannot create a temporary copy of " + path + " at " + name);
  close(fd);
  std::ifstream in(path, std::ios::binary);
  std::ofstream out(name, std::ios::binary);
  out << in.rdbuf();
  if (!in || !out) {
    unlink(name.c_str());
    throw std::runtime_error("cannot copy " + path + " to " + name);
  }
  return name;
}

template <typename F>
F symbol(void* handle, const std::string& path, const char* name) {
  void* s = dlsym(handle, name);
  if (!s) throw std::runtime_error(path + " has no symbol " + name + ": not a flashgrad library?");
  return reinterpret_cast<F>(s);
}

// Loads both builds; neither is ever closed (their thread pools' workers are detached).
std::vector<Build> load_builds(const std::string& path_a, const std::string& path_b) {
  std::vector<Build> builds{{"A", path_a}, {"B", path_b}};
  void* handles[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    handles[i] = open_library(builds[i].path);
    if (i == 1 && handles[1] == handles[0]) {
      const std::string copy = temporary_copy(path_b);
      handles[1] = open_library(copy);
      builds[1].copy = true;
      unlink(copy.c_str());  // the mapping stays
    }
    if (!handles[i]) {
      const char* why = dlerror();
      throw UsageError("flashgrad-lab ab: flag --lib-" + std::string(i ? "b" : "a") +
                       ": expected a flashgrad shared library, got '" + builds[i].path +
                       "' (cannot load it: " + (why ? why : "unknown error") + ")");
    }
    Build& b = builds[i];
    b.params_default = symbol<fg_params (*)()>(handles[i], b.path, "fg_params_default");
    b.forward = symbol<ForwardFn>(handles[i], b.path, "fg_forward");
    b.backward = symbol<BackwardFn>(handles[i], b.path, "fg_backward");
    b.last_error = symbol<const char* (*)()>(handles[i], b.path, "fg_last_error");
    b.version = symbol<const char* (*)()>(handles[i], b.path, "fg_version");
    b.isa = symbol<const char* (*)()>(handles[i], b.path, "fg_isa");
  }
  return builds;
}

enum class Pass { forward, backward, both };

struct Runner {
  const Build& build;
  const Problem& p;
  Outputs& o;
  fg_params prm;
  DLTensor alibi{}, bias{}, mask{};  // prm.alibi_slopes, prm.bias and prm.mask point here

  Runner(const Build& b, const Problem& problem, Outputs& outputs)
      : build(b), p(problem), o(outputs), prm(b.params_default()) {
    const Case& c = p.c;
    if (p.opts.alibi_slopes) {
      alibi = dl(*p.opts.alibi_slopes);
      prm.alibi_slopes = &alibi;
    }
    if (p.opts.bias) {
      bias = dl(*p.opts.bias);
      prm.bias = &bias;
    }
    if (p.opts.mask) {
      mask = dl(*p.opts.mask);
      prm.mask = &mask;
    }
    prm.softmax_scale = c.softmax_scale;
    prm.causal = c.causal;
    prm.softcap = c.softcap;
    prm.dropout_p = p.opts.dropout_p;
    prm.seed = p.opts.seed;
    prm.offset = p.opts.offset;
    prm.window_left = c.window_left;
    prm.window_right = c.window_right;
    prm.num_threads = c.num_threads;
  }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;
  void ok(fg_status s, const char* what) const {
    if (s != FG_OK)
      throw std::runtime_error(build.label + " (" + build.path + "): " + what + ": " + build.last_error());
  }
  void forward() {
    const DLTensor q = dl(p.q.view), k = dl(p.k.view), v = dl(p.v.view);
    DLTensor out = dl(o.out.view), lse = dl(o.lse.view);
    ok(build.forward(&prm, &q, &k, &v, &out, &lse), "fg_forward");
  }
  void backward() {
    const DLTensor q = dl(p.q.view), k = dl(p.k.view), v = dl(p.v.view), out = dl(o.out.view),
                   lse = dl(o.lse.view), dout = dl(p.dout.view);
    DLTensor dq = dl(o.dq.view), dk = dl(o.dk.view), dv = dl(o.dv.view);
    ok(build.backward(&prm, &q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv, nullptr), "fg_backward");
  }
  void run(Pass pass) {
    if (pass != Pass::backward) forward();
    if (pass != Pass::forward) backward();
  }
};

struct Difference {
  std::string tensor;
  double max_abs = 0;
};

// The tensors the timed pass wrote, compared bit for bit between the builds.
std::vector<Difference> differences(const Outputs& a, const Outputs& b, Pass pass) {
  std::vector<std::pair<const char*, Buffer Outputs::*>> tensors;
  if (pass != Pass::backward) tensors = {{"out", &Outputs::out}, {"lse", &Outputs::lse}};
  if (pass != Pass::forward) tensors.insert(tensors.end(), {{"dq", &Outputs::dq}, {"dk", &Outputs::dk}, {"dv", &Outputs::dv}});
  std::vector<Difference> out;
  for (const auto& [name, member] : tensors) {
    const Buffer &x = a.*member, &y = b.*member;
    if (x.bytes == y.bytes) continue;
    const std::vector<double> u = testing::dense(x), w = testing::dense(y);
    Difference d{name};
    for (size_t i = 0; i < u.size(); ++i)
      d.max_abs = std::max(d.max_abs, std::isnan(u[i]) != std::isnan(w[i]) ? INFINITY : std::abs(u[i] - w[i]));
    out.push_back(d);
  }
  return out;
}

double quantile(std::vector<double> xs, double q) {
  std::sort(xs.begin(), xs.end());
  return xs[static_cast<size_t>(q * static_cast<double>(xs.size() - 1) + 0.5)];
}

}  // namespace

int run_ab(Args& args) {
  const auto lib_a = args.value("--lib-a"), lib_b = args.value("--lib-b");
  const Case c = case_from_flags(args);
  const std::string pass_name = args.choice("--pass", "forward", {"forward", "backward", "forward+backward"});
  const int64_t pairs = args.integer("--pairs", 20, 1);
  const int64_t warmup = args.integer("--warmup", 1, 0);
  const bool expect_identical = args.has("--expect-identical");
  const bool json = args.has("--json");
  args.finish();
  if (!lib_a || lib_a->empty()) args.fail("--lib-a", "the path of a flashgrad shared library", lib_a.value_or(""));
  if (!lib_b || lib_b->empty()) args.fail("--lib-b", "the path of a flashgrad shared library", lib_b.value_or(""));
  const Pass pass = pass_name == "forward" ? Pass::forward : (pass_name == "backward" ? Pass::backward : Pass::both);
  const std::vector<Build> builds = load_builds(*lib_a, *lib_b);

  // Each build is checked against the fp64 reference before it is timed.
  const Case small = small_copy(c);
  std::vector<double> worst;
  for (const Build& b : builds) {
    const Problem sp = testing::make_problem(small);
    Outputs so = testing::make_outputs(sp, false);
    Runner(b, sp, so).run(Pass::both);
    const testing::Report r = testing::compare_with_reference(sp, so, true);
    if (!r.pass()) {
      std::fprintf(stderr, "flashgrad-lab ab: build %s (%s) fails its check on %s; not timing it\n%s", b.label.c_str(),
                   b.path.c_str(), small.describe().c_str(), r.table().c_str());
      return 1;
    }
    worst.push_back(worst_fraction(r));
  }

  const Problem p = testing::make_problem(c);
  // Built in place: a Buffer's view points into its own bytes, so a copy would dangle.
  Outputs outs[2] = {testing::make_outputs(p, false), testing::make_outputs(p, false)};
  Runner runners[2] = {Runner(builds[0], p, outs[0]), Runner(builds[1], p, outs[1])};
  if (pass == Pass::backward)
    for (Runner& r : runners) r.forward();
  std::vector<double> seconds[2];
  for (int64_t i = 0; i < 2 * (warmup + pairs); ++i) {
    const int arm = (i / 2) % 2 ? static_cast<int>(1 - i % 2) : static_cast<int>(i % 2);  // A B B A A B B A ...
    const double t0 = now_seconds();
    runners[arm].run(pass);
    if (i >= 2 * warmup) seconds[arm].push_back(now_seconds() - t0);
  }
  std::vector<double> ratio;
  for (int64_t i = 0; i < pairs; ++i) ratio.push_back(seconds[0][i] / seconds[1][i]);
  const double flops = c.forward_flops() * (pass == Pass::forward ? 1.0 : (pass == Pass::backward ? 2.5 : 3.5));
  const double med[2] = {median(seconds[0]), median(seconds[1])};
  const std::vector<Difference> diff = differences(outs[0], outs[1], pass);

  if (json) {
    std::vector<std::string> items;
    for (int i = 0; i < 2; ++i)
      items.push_back(Json()
                          .add("path", builds[i].path)
                          .add("temporary_copy", builds[i].copy)
                          .add("version", builds[i].version())
                          .add("isa", builds[i].isa())
                          .add("check_worst_fraction_of_bound", worst[i])
                          .add("median_ms", 1e3 * med[i])
                          .add("gflops", flops / med[i] / 1e9)
                          .str());
    std::vector<std::string> diffs;
    for (const Difference& d : diff) diffs.push_back(Json().add("tensor", d.tensor).add("max_abs", d.max_abs).str());
    std::printf("%s\n", Json()
                            .add("config", c.describe())
                            .add("pass", pass_name)
                            .add("pairs", pairs)
                            .add_raw("a", items[0])
                            .add_raw("b", items[1])
                            .add("pair_ratio_median", quantile(ratio, 0.5))
                            .add("pair_ratio_q1", quantile(ratio, 0.25))
                            .add("pair_ratio_q3", quantile(ratio, 0.75))
                            .add("identical", diff.empty())
                            .add_raw("differences", Json::array(diffs))
                            .str()
                            .c_str());
  } else {
    std::printf("flashgrad-lab ab: %s, %s, %lld pairs in A B B A order\n", pass_name.c_str(), c.describe().c_str(),
                static_cast<long long>(pairs));
    for (int i = 0; i < 2; ++i)
      std::printf("%s  %s%s (flashgrad %s, isa %s): checked on %s, worst error %.2f of its bound\n"
                  "   median %.3f ms, %.2f GFLOP/s\n",
                  builds[i].label.c_str(), builds[i].path.c_str(), builds[i].copy ? ", a temporary copy" : "",
                  builds[i].version(), builds[i].isa(),
                  small.describe().c_str(), worst[i], 1e3 * med[i], flops / med[i] / 1e9);
    std::printf("B's speed over A's, per pair (A's time / B's): median %.3f, quartiles %.3f - %.3f\n",
                quantile(ratio, 0.5), quantile(ratio, 0.25), quantile(ratio, 0.75));
    if (diff.empty()) std::printf("outputs: bitwise identical\n");
    for (const Difference& d : diff)
      std::printf("outputs: %s differs, largest |A - B| %.3g\n", d.tensor.c_str(), d.max_abs);
  }
  return expect_identical && !diff.empty() ? 1 : 0;
}

}  // namespace flashgrad::tools
