#include "parallel.hpp"

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
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

// The runner set by set_thread_runner, or null for the own pool. Every runner
// ever set stays allocated: a call that read one before it was replaced may
// still be using it.
struct Runners {
  std::mutex m;
  std::vector<std::unique_ptr<ThreadRunner>> all;
  std::atomic<const ThreadRunner*> current{nullptr};
};
Runners& runners() {
  static Runners* r = new Runners();  // never destroyed, as the pool
  return *r;
}

// An OpenMP runtime's entry points, and one call's tasks handed out to its team.
struct OpenMp {
  void (*parallel)(void (*)(void*), void*, unsigned, unsigned) = nullptr;  // GOMP_parallel
  int (*thread_num)() = nullptr;                                           // omp_get_thread_num
};
struct OpenMpJob {
  const OpenMp* omp;
  ThreadRunner::Task task;
  void* task_ctx;
  int64_t num_tasks;
  std::atomic<int64_t> next{0};
};
void openmp_team_member(void* data) {
  auto* job = static_cast<OpenMpJob*>(data);
  const int thread = job->omp->thread_num();
  for (int64_t t; (t = job->next.fetch_add(1, std::memory_order_relaxed)) < job->num_tasks;)
    job->task(job->task_ctx, t, thread);
}
void run_openmp(void* ctx, int64_t num_tasks, int num_threads, ThreadRunner::Task task, void* task_ctx) {
  OpenMpJob job{static_cast<const OpenMp*>(ctx), task, task_ctx, num_tasks};
  job.omp->parallel(openmp_team_member, &job, static_cast<unsigned>(num_threads), 0);
}

}  // namespace

void set_thread_runner(const ThreadRunner& runner) {
  Runners& r = runners();
  const std::lock_guard<std::mutex> lock(r.m);
  if (!runner.run) {
    r.current.store(nullptr, std::memory_order_release);
    return;
  }
  r.all.push_back(std::make_unique<ThreadRunner>(runner));
  r.current.store(r.all.back().get(), std::memory_order_release);
}

void use_openmp_runtime(const std::string& library) {
  if (library.empty()) return set_thread_runner(ThreadRunner{});
  const std::string fn = "flashgrad::use_openmp_runtime: argument 'library': expected ";
  // Never closed: its threads run flashgrad's tasks from now on.
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw Error(fn + "a loadable shared library, got '" + library + "' (" + dlerror() + ")");
  auto omp = std::make_unique<OpenMp>();
  omp->parallel = reinterpret_cast<decltype(omp->parallel)>(dlsym(handle, "GOMP_parallel"));
  omp->thread_num = reinterpret_cast<decltype(omp->thread_num)>(dlsym(handle, "omp_get_thread_num"));
  if (!omp->parallel || !omp->thread_num)
    throw Error(fn + "an OpenMP runtime with GOMP_parallel and omp_get_thread_num, got '" + library +
                "' without " + (omp->parallel ? "omp_get_thread_num" : "GOMP_parallel"));
  static std::vector<std::unique_ptr<OpenMp>>* kept = new std::vector<std::unique_ptr<OpenMp>>();
  OpenMp* ctx = omp.get();
  {
    const std::lock_guard<std::mutex> lock(runners().m);
    kept->push_back(std::move(omp));
  }
  set_thread_runner(ThreadRunner{run_openmp, ctx, "openmp " + library});
}

std::string thread_runner_name() {
  const ThreadRunner* r = runners().current.load(std::memory_order_acquire);
  return r ? r->name : "flashgrad";
}

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
  if (const ThreadRunner* r = runners().current.load(std::memory_order_acquire))
    return r->run(r->ctx, num_tasks, threads, fn, ctx);
  Pool::instance().run(num_tasks, threads, fn, ctx);
}

}  // namespace flashgrad
