// The naive baseline's side of `measure` (measure.hpp), shared by
// flashgrad-baseline and flashgrad-lab, the programs that link OpenBLAS.
#pragma once

#include "cli.hpp"
#include "harness.hpp"
#include "measure.hpp"
#include "naive_blas.hpp"

namespace flashgrad::tools {

// Before the problem is made: checks that --impl naive comes with --dtype
// f32, restarts this process once on the OpenBLAS core choose_openblas_core()
// picks when chosen_core is set, and gives OpenBLAS and OpenMP the spec's
// threads (0: their own default).
void prepare_openblas_measure(const Args& args, const MeasureSpec& spec, bool chosen_core);

// The baseline's forward and backward on p, writing o; naive's score buffers
// are made and first touched here, untimed.
Passes naive_passes(NaiveAttention& naive, const testing::Problem& p, testing::Outputs& o);

}  // namespace flashgrad::tools
