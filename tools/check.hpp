// Running Case lists through the harness's tolerance rule, shared by
// `flashgrad check` and `flashgrad demo`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness.hpp"

namespace flashgrad::tools {

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

}  // namespace flashgrad::tools
