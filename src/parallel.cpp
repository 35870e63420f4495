#include "parallel.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "flashgrad/flashgrad.hpp"

namespace flashgrad {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// A persistent pool whose caller never waits for a worker to show up: it
// claims tasks itself, and waits only for tasks that a worker has started.
// With OpenMP's fork/join, a worker that the OS had not yet scheduled held
// every call at the closing barrier (tuning table: parallel_for pool).
//
// Claims are made on one 64-bit word, (generation << 32) | next task, so a
// worker that wakes after its job is over can never take a task of the next.
class Pool {
 public:
  static Pool& instance() {
    static Pool* pool = new Pool();  // never destroyed: workers may outlive static destructors
    return *pool;
  }

  void run(int64_t num_tasks, int num_threads, TaskFn fn, void* ctx) {
    // A concurrent call, or one made from inside a task, runs on its own thread.
    if (busy_.exchange(true, std::memory_order_acquire)) {
      for (int64_t t = 0; t < num_tasks; ++t) fn(ctx, t, 0);
      return;
    }
    grow(num_threads - 1);
    uint64_t gen;
    bool sleeping;
    {
      std::lock_guard<std::mutex> lock(mu_);
      gen = (generation_.load(std::memory_order_relaxed) + 1) & 0xffffffffu;
      job_ = Job{fn, ctx, num_tasks, num_threads};
      done_.store(0, std::memory_order_relaxed);
      claim_.store(gen << 32, std::memory_order_release);
      generation_.fetch_add(1, std::memory_order_release);
      sleeping = sleepers_ > 0;
    }
    if (sleeping) cv_.notify_all();
    int64_t mine = work(gen, job_, 0);
    // Wait only for tasks that workers claimed and have not finished.
    for (int spins = 0; done_.load(std::memory_order_acquire) + mine < num_tasks; ++spins)
      if (spins > 64) std::this_thread::yield();
    busy_.store(false, std::memory_order_release);
  }

 private:
  struct Job {
    TaskFn fn = nullptr;
    void* ctx = nullptr;
    int64_t num_tasks = 0;
    int num_threads = 1;
  };

  // Runs tasks of generation gen until none is left; returns how many.
  int64_t work(uint64_t gen, const Job& job, int slot) {
    int64_t count = 0;
    uint64_t word = claim_.load(std::memory_order_acquire);
    for (;;) {
      if ((word >> 32) != gen) break;
      const int64_t task = static_cast<int64_t>(word & 0xffffffffu);
      if (task >= job.num_tasks) break;
      if (!claim_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel)) continue;
      job.fn(job.ctx, task, slot);
      ++count;
      word = claim_.load(std::memory_order_acquire);
    }
    return count;
  }

  void grow(int workers) {
    while (static_cast<int>(threads_.size()) < workers) {
      const int slot = static_cast<int>(threads_.size()) + 1;
      threads_.emplace_back([this, slot] { worker(slot); });
      threads_.back().detach();
    }
  }

  // A worker that has just finished watches for the next job for spin_
  // before it sleeps: a sleeping worker starts its first task late, a whole
  // task in short calls (tuning table: FLASHGRAD_SPIN_US).
  // A bad FLASHGRAD_SPIN_US has already thrown at the API; any other caller
  // gets the default.
  static std::chrono::microseconds spin_setting() {
    try {
      return std::chrono::microseconds{spin_microseconds()};
    } catch (const Error&) {
      return std::chrono::microseconds{parse_spin_microseconds(nullptr)};
    }
  }
  const std::chrono::microseconds spin_ = spin_setting();

  void worker(int slot) {
    uint64_t seen = 0;
    for (;;) {
      const auto until = std::chrono::steady_clock::now() + spin_;
      for (int spins = 1; generation_.load(std::memory_order_acquire) == seen; ++spins) {
        cpu_relax();
        if (spins % 64 == 0 && std::chrono::steady_clock::now() > until) break;
      }
      Job job;
      uint64_t gen;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ++sleepers_;
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
        --sleepers_;
        seen = generation_.load(std::memory_order_relaxed);
        gen = seen & 0xffffffffu;
        job = job_;
      }
      if (slot >= job.num_threads) continue;
      const int64_t n = work(gen, job, slot);
      if (n) done_.fetch_add(n, std::memory_order_acq_rel);
    }
  }

  std::atomic<bool> busy_{false};  // one call at a time uses the workers
  std::mutex mu_;  // guards job_ and sleepers_, and orders generation_'s writes
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  int sleepers_ = 0;
  Job job_;
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};
  std::vector<std::thread> threads_;
};

}  // namespace

int64_t parse_spin_microseconds(const char* text) {
  constexpr int64_t kDefault = 100, kMax = 1000000;
  if (!text || !*text) return kDefault;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (!std::isdigit(static_cast<unsigned char>(text[0])) || errno != 0 || *end != '\0' || v > kMax)
    throw Error(std::string("flashgrad::spin_microseconds: environment variable 'FLASHGRAD_SPIN_US': expected an "
                            "integer number of microseconds in [0, ") +
                std::to_string(kMax) + "], got '" + text + "'");
  return v;
}

int64_t spin_microseconds() {
  static const int64_t us = parse_spin_microseconds(std::getenv("FLASHGRAD_SPIN_US"));
  return us;
}

int resolve_threads(int n) {
  if (n > 0) return n;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

void parallel_for(int64_t num_tasks, int num_threads, TaskFn fn, void* ctx) {
  if (num_tasks <= 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(num_threads, num_tasks));
  if (threads <= 1) {
    for (int64_t t = 0; t < num_tasks; ++t) fn(ctx, t, 0);
    return;
  }
  Pool::instance().run(num_tasks, threads, fn, ctx);
}

}  // namespace flashgrad
