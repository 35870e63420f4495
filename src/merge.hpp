// The one merge of two partial attentions of the same query row over disjoint
// key sets, in f32 (f64 for f64 storage). flashgrad::merge, the split-KV
// forward and the ring layer all go through merge_row, so they round identically.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace flashgrad {

// acc[c * acc_stride], c < dv, with log-sum-exp *lse_acc, absorbs part (lse_part).
//   lse = log(e^lse_acc + e^lse_part) = m + log(e^(lse_acc - m) + e^(lse_part - m)), m = max
// The weights are computed against the larger lse so neither exp overflows.
template <typename F>
inline void merge_row(F* acc, int64_t acc_stride, F* lse_acc, const F* part, int64_t part_stride, F lse_part,
                      int64_t dv) {
  const F ninf = -std::numeric_limits<F>::infinity();
  if (lse_part == ninf) return;  // the part saw no key
  const F la = *lse_acc;
  if (la == ninf) {
    for (int64_t c = 0; c < dv; ++c) acc[c * acc_stride] = part[c * part_stride];
    *lse_acc = lse_part;
    return;
  }
  // A NaN in either lse reaches m or one weight, and from there every output.
  const F m = la > lse_part ? la : lse_part;
  const F wa = std::exp(la - m), wp = std::exp(lse_part - m), sum = wa + wp;
  const F ca = wa / sum, cp = wp / sum;
  for (int64_t c = 0; c < dv; ++c) acc[c * acc_stride] = ca * acc[c * acc_stride] + cp * part[c * part_stride];
  *lse_acc = m + std::log(sum);
}

}  // namespace flashgrad
