#include "parallel.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <thread>

namespace flashgrad {

int resolve_threads(int n) {
  if (n > 0) return n;
  return std::max(1, omp_get_num_procs());
}

void parallel_for(int64_t num_tasks, int num_threads, TaskFn fn, void* ctx) {
  if (num_tasks <= 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(num_threads, num_tasks));
  if (threads <= 1 || omp_in_parallel()) {
    for (int64_t t = 0; t < num_tasks; ++t) fn(ctx, t, 0);
    return;
  }
  // Dynamic claiming balances causal and varlen tasks of unequal cost.
  std::atomic<int64_t> next{0};
#pragma omp parallel num_threads(threads)
  {
    const int thread = omp_get_thread_num();
    for (int64_t t = next.fetch_add(1); t < num_tasks; t = next.fetch_add(1)) fn(ctx, t, thread);
  }
}

}  // namespace flashgrad
