// `flashgrad check`: every edge case and N random cases through the Case
// harness's tolerance rule, one table row per output tensor.
#include "check.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.hpp"
#include "system.hpp"

namespace flashgrad::tools {
namespace {

using testing::Case;
using testing::Report;

void print_case_line(int64_t index, int64_t total, const Case& c, const char* result) {
  std::printf("%3lld/%-3lld %-18s %s  %s\n", static_cast<long long>(index + 1), static_cast<long long>(total),
              c.name.c_str(), c.describe().c_str(), result);
}

void print_tensors(const Report& r) {
  for (const auto& t : r.tensors)
    std::printf("          %-7s %10.2e %10.2e %10.2e  %s\n", t.name.c_str(), t.err_kernel, t.err_naive,
                t.bound(), t.pass ? "ok" : "FAIL");
}

void tally(CheckTotals& s, const Case& c, const Report& r) {
  (r.pass() ? s.passed : s.failed) += 1;
  for (const auto& t : r.tensors) {
    const double fraction = t.bound() > 0 ? t.err_kernel / t.bound() : (t.err_kernel > 0 ? 1e30 : 0);
    if (fraction > s.worst_fraction || s.worst_where.empty()) {
      s.worst_fraction = fraction;
      s.worst_where = t.name + " of " + c.name;
    }
  }
}

std::vector<Case> cases_to_run(int64_t random, int64_t seed, int threads) {
  std::vector<Case> cases = testing::edge_cases();
  for (int64_t i = 0; i < random; ++i) cases.push_back(testing::random_case(static_cast<uint64_t>(seed + i)));
  if (threads > 0)
    for (Case& c : cases)
      if (c.num_threads == 0) c.num_threads = threads;
  return cases;
}

}  // namespace

Case small_copy(const Case& c) {
  constexpr int64_t kMaxSeqlen = 256;
  Case s = c;
  s.name = c.name + "_check";
  s.batch = std::min<int64_t>(c.batch, 2);
  // Heads run the same code: keep at most two key/value heads, each with its
  // whole group of query heads.
  s.heads_kv = std::min<int64_t>(c.heads_kv, 2);
  s.heads_q = c.heads_q / c.heads_kv * s.heads_kv;
  const int64_t longest = std::max(c.seqlen_q, c.seqlen_k);
  if (longest > kMaxSeqlen) {
    s.seqlen_q = std::max<int64_t>(1, c.seqlen_q * kMaxSeqlen / longest);
    s.seqlen_k = std::max<int64_t>(1, c.seqlen_k * kMaxSeqlen / longest);
  }
  return s;
}

double worst_fraction(const Report& r) {
  double worst = 0;
  for (const auto& t : r.tensors) worst = std::max(worst, t.bound() > 0 ? t.err_kernel / t.bound() : 0.0);
  return worst;
}

CheckTotals check_cases(const std::vector<Case>& cases, bool backward, bool verbose) {
  CheckTotals s;
  const int64_t total = static_cast<int64_t>(cases.size());
  ProgressBar bar(total);
  const double t0 = now_seconds();
  for (int64_t i = 0; i < total; ++i) {
    const Case& c = cases[static_cast<size_t>(i)];
    bar.update(i, c.name);
    try {
      const Report r = testing::check_case(c, backward, testing::Bound::full);
      tally(s, c, r);
      if (!verbose && r.pass()) continue;
      bar.clear();
      print_case_line(i, total, c, r.pass() ? "ok" : "FAIL");
      print_tensors(r);
    } catch (const std::exception& e) {
      s.errors += 1;
      bar.clear();
      print_case_line(i, total, c, "ERROR");
      std::printf("          %s\n", e.what());
    }
  }
  s.seconds = now_seconds() - t0;
  return s;
}

int run_check(Args& args) {
  const int64_t random = args.integer("--random", 0, 0);
  const int64_t seed = args.integer("--seed", 1, 0);
  const bool quick = args.has("--quick");
  const int threads = static_cast<int>(args.integer("--threads", 0, 1, 4096));
  args.finish();

  const std::vector<Case> cases = cases_to_run(random, seed, threads);
  const int64_t total = static_cast<int64_t>(cases.size());
  std::string what = std::to_string(total - random) + " edge cases";
  if (random > 0)
    what += format(" + %lld random (seeds %lld..%lld)", static_cast<long long>(random),
                   static_cast<long long>(seed), static_cast<long long>(seed + random - 1));
  std::printf("flashgrad %s check: isa %s, %d threads, %s, %s\n", version().c_str(), isa_name(),
              threads > 0 ? threads : max_threads(), what.c_str(),
              quick ? "forward only" : "forward and backward");
  std::printf("rule: kernel error <= bound = 2 * naive error + rounding noise (max-abs vs fp64)\n");
  std::printf("%-7s %-18s %s\n%10s%-7s %10s %10s %10s  %s\n", "#", "case", "configuration", "", "tensor",
              "kernel", "naive", "bound", "result");

  const CheckTotals s = check_cases(cases, !quick, true);
  std::printf(
      "%s: %lld cases, %lld passed, %lld failed, %lld errors in %.1f s; closest to its bound: %s at %.2f\n",
      s.ok() ? "PASS" : "FAIL", static_cast<long long>(total), static_cast<long long>(s.passed),
      static_cast<long long>(s.failed), static_cast<long long>(s.errors), s.seconds, s.worst_where.c_str(),
      s.worst_fraction);
  return s.ok() ? 0 : 1;
}

}  // namespace flashgrad::tools
