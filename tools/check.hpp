// Running Case lists through the harness's tolerance rule, shared by
// `flashgrad check`, `flashgrad demo`, `flashgrad bench` and the lab.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli.hpp"
#include "harness.hpp"

namespace flashgrad::tools {

// `flashgrad check`.
int run_check(Args& args);

struct CheckTotals {
  int64_t passed = 0, failed = 0, errors = 0;
  double worst_fraction = 0;  // the largest kernel error / bound over all tensors
  std::string worst_where;    // "<tensor> of <case>"
  double seconds = 0;
  bool ok() const { return failed == 0 && errors == 0; }
};

// Checks every case, with a progress bar on a terminal. verbose: a row per
// output tensor of every case; otherwise only failing cases are printed.
CheckTotals check_cases(const std::vector<testing::Case>& cases, bool backward, bool verbose);

// The same configuration with both sequence lengths scaled down together (the
// longer to at most 256), at most 2 batches and 2 key/value heads (with their
// query-head groups), so that the fp64 reference stays cheap but the mask's
// shape and the GQA ratio are kept: what the benchmarks check before they time
// a configuration.
testing::Case small_copy(const testing::Case& c);

// The largest err(kernel) / bound over the report's tensors.
double worst_fraction(const testing::Report& r);

}  // namespace flashgrad::tools
