#include "naive_measure.hpp"

#include <cblas.h>
#include <omp.h>

#include <string>

#include "openblas.hpp"

namespace flashgrad::tools {

void prepare_openblas_measure(const Args& args, const MeasureSpec& spec, bool chosen_core) {
  if (spec.impl == "naive" && spec.c.dtype != DType::f32)
    args.fail("--dtype", "f32 with --impl naive (the naive baseline is f32 only)", dtype_name(spec.c.dtype));
  if (chosen_core) use_chosen_openblas_core(args.prefix());
  if (spec.c.num_threads > 0) {
    omp_set_num_threads(spec.c.num_threads);
    openblas_set_num_threads(spec.c.num_threads);
  }
}

Passes naive_passes(NaiveAttention& naive, const testing::Problem& p, testing::Outputs& o) {
  naive.prepare(p.q.view, p.k.view, p.v.view);
  return {[&naive, &p, &o] { naive.forward(p.q.view, p.k.view, p.v.view, o.out.view); },
          [&naive, &p, &o] {
            naive.backward(p.q.view, p.k.view, p.v.view, p.dout.view, o.dq.view, o.dk.view, o.dv.view);
          }};
}

}  // namespace flashgrad::tools
