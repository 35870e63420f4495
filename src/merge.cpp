// flashgrad::merge: validate, then merge_row over every (batch, head, row).
#include "check.hpp"
#include "flashgrad/flashgrad.hpp"
#include "merge.hpp"
#include "parallel.hpp"

namespace flashgrad {
namespace {

template <typename F>
void merge_all(const MergeParams& m) {
  F* oa = static_cast<F*>(m.o_acc.data);
  F* la = static_cast<F*>(m.lse_acc.data);
  const F* op = static_cast<const F*>(m.o_part.data);
  const F* lp = static_cast<const F*>(m.lse_part.data);
  parallel_for(m.batch * m.heads, resolve_threads(m.num_threads), [&](int64_t task, int) {
    const int64_t b = task / m.heads, h = task % m.heads;
    for (int64_t i = 0; i < m.seqlen; ++i)
      merge_row(oa + row_offset(m.o_acc, b, i, h), m.o_acc.dim_stride, la + row_offset(m.lse_acc, b, i, h),
                op + row_offset(m.o_part, b, i, h), m.o_part.dim_stride, lp[row_offset(m.lse_part, b, i, h)],
                m.dv);
  });
}

}  // namespace

void merge(const TensorView& o_acc, const TensorView& lse_acc, const TensorView& o_part,
           const TensorView& lse_part, int num_threads) {
  const MergeParams m = make_merge_params("merge", o_acc, lse_acc, o_part, lse_part, num_threads);
  spin_microseconds();
  if (m.dtype == DType::f64)
    merge_all<double>(m);
  else
    merge_all<float>(m);
}

}  // namespace flashgrad
