// One place that runs tasks on threads. Tasks are independent and each writes
// only what it owns, so results do not depend on which thread runs which task.
#pragma once

#include <cstdint>

namespace flashgrad {

// Calls fn(ctx, task, thread) for every task in [0, num_tasks) on up to
// num_threads threads (the caller and persistent workers); thread is in
// [0, num_threads) and indexes per-thread scratch. One call at a time uses the
// workers: a call made while another holds them (from another thread, or from
// inside a task) runs all its tasks on the calling thread, so concurrent
// callers never oversubscribe the workers and never wait on each other.
using TaskFn = void (*)(void* ctx, int64_t task, int thread);
void parallel_for(int64_t num_tasks, int num_threads, TaskFn fn, void* ctx);

// Threads to use for a request of n (0 = all cores).
int resolve_threads(int n);

// How long a pool worker that has run out of tasks watches for the next call
// before it sleeps, in microseconds: FLASHGRAD_SPIN_US, read once (default
// 100; 0 sleeps at once and leaves the cores to other work between calls).
// Throws flashgrad::Error naming the variable unless it is an integer in [0,
// 1000000]; the API calls it before any kernel runs.
int64_t spin_microseconds();
// The parse behind it: null or empty text gives the default.
int64_t parse_spin_microseconds(const char* text);

// Wraps a callable so that it can go through parallel_for's function pointer.
template <typename F>
void parallel_for(int64_t num_tasks, int num_threads, F&& f) {
  parallel_for(
      num_tasks, num_threads,
      [](void* ctx, int64_t task, int thread) { (*static_cast<F*>(ctx))(task, thread); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace flashgrad
