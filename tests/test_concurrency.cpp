// Concurrent use: many threads calling forward/backward at once on their own
// data give the bytes a serial call gives; calls made from inside an OpenMP
// parallel region, from a std::thread pool, or from inside a task finish,
// stay correct and do not oversubscribe.
//
// What the library does (src/parallel.cpp): one persistent worker pool. One
// call at a time uses it (the caller plus num_threads - 1 workers); a call
// made while another holds the pool (from another thread, an OpenMP team, or
// from inside a task) runs all its tasks on the calling thread. So P
// concurrent callers use at most P + (num_threads - 1) threads, and never
// wait on each other.
#include <dlfcn.h>
#include <gtest/gtest.h>
#if FG_TEST_OPENMP
#include <omp.h>
#endif
#include <time.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "flashgrad/flashgrad.h"
#include "harness.hpp"
#include "parallel.hpp"

namespace flashgrad::testing {
namespace {

using Bytes = std::vector<std::vector<unsigned char>>;

Bytes run_bytes(const Problem& p) {
  Outputs o = make_outputs(p, false);
  run_kernels(p, o);
  Bytes out;
  for (const Buffer* b : {&o.out, &o.lse, &o.dq, &o.dk, &o.dv, &o.dsinks, &o.dbias}) out.push_back(b->bytes);
  return out;
}

// Small problems with different data and features, one per worker.
std::vector<Case> worker_cases(int n) {
  std::vector<Case> cs;
  const DType types[] = {DType::f32, DType::bf16, DType::f16, DType::f64};
  for (int i = 0; i < n; ++i) {
    Case c;
    c.dtype = types[i % 4];
    c.batch = 1 + i % 2;
    c.seqlen_q = 40 + 7 * i;
    c.seqlen_k = 70 + 5 * i;
    c.heads_q = 4;
    c.heads_kv = i % 2 ? 2 : 4;
    c.head_dim = 32;
    c.head_dim_v = 24;
    c.causal = i % 3 == 0;
    c.sinks = i % 3 == 1;
    c.dropout_p = i % 4 == 2 ? 0.1 : 0.0;
    if (i % 5 == 3) { c.bias = BiasKind::bcast_heads; c.dbias = true; }
    c.seed = 1000 + static_cast<uint64_t>(i);
    cs.push_back(c);
  }
  return cs;
}

// Each worker runs its own problem `rounds` times with its own num_threads
// while the others run theirs; every result must equal the serial bytes.
void many_threads_bitwise(const std::vector<int>& thread_counts, int rounds) {
  const int n = static_cast<int>(thread_counts.size());
  std::vector<Case> cs = worker_cases(n);
  std::vector<Problem> ps;
  std::vector<Bytes> serial;
  for (Case& c : cs) {
    c.num_threads = 1;
    ps.push_back(make_problem(c));
    serial.push_back(run_bytes(ps.back()));
  }
  std::atomic<int> mismatches{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int w = 0; w < n; ++w)
    pool.emplace_back([&, w] {
      Problem p = ps[static_cast<size_t>(w)];  // own copy of the views, same data
      p.opts.num_threads = thread_counts[static_cast<size_t>(w)];
      while (!go.load()) std::this_thread::yield();
      for (int r = 0; r < rounds; ++r)
        if (run_bytes(p) != serial[static_cast<size_t>(w)]) ++mismatches;
    });
  go = true;
  for (auto& t : pool) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// num_threads = 1 never touches the pool.
TEST(Concurrency, StdThreadsSingleThreadedCallsAreBitwiseSerial) {
  many_threads_bitwise({1, 1, 1, 1, 1, 1}, 3);
}

TEST(Concurrency, StdThreadsWithOwnThreadCountsAreBitwiseSerial) {
  many_threads_bitwise({1, 2, 3, 0, 2, 1}, 2);
}

// fg_last_error is per thread: a failing call on one thread does not change
// the message another thread sees, and a successful call clears its own.
TEST(Concurrency, CAbiErrorMessagesAreThreadLocal) {
  const int n = 4;
  std::vector<Problem> ps;
  for (const Case& c : worker_cases(n)) ps.push_back(make_problem(c));
  std::atomic<int> bad{0};
  std::vector<std::thread> pool;
  for (int w = 0; w < n; ++w)
    pool.emplace_back([&, w] {
      for (int r = 0; r < 20; ++r) {
        fg_params prm = fg_params_default();
        prm.num_threads = 1;
        if ((w + r) % 2) {  // NULL q: an error naming this thread's call
          prm.window_left = -2 - w;
          if (fg_forward(&prm, nullptr, nullptr, nullptr, nullptr, nullptr) != FG_ERR_INVALID_ARGUMENT) ++bad;
          const std::string msg = fg_last_error();
          std::this_thread::yield();
          if (msg.empty() || std::string(fg_last_error()) != msg) ++bad;
        } else {
          const Problem& p = ps[static_cast<size_t>(w)];
          Outputs o = make_outputs(p, false);
          Options opts = p.opts;
          opts.num_threads = 1;
          forward(opts, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view);
          // A C call that succeeds clears this thread's message.
          if (fg_isa() == nullptr) ++bad;
          if (*fg_last_error() != '\0') ++bad;
        }
      }
    });
  for (auto& t : pool) t.join();
  EXPECT_EQ(bad.load(), 0);
}

// A call made from inside a task (while the pool is held) runs on the
// calling thread only.
TEST(Concurrency, NestedCallFromATaskRunsOnItsThread) {
  std::mutex m;
  std::atomic<int> bad{0};
  parallel_for(8, 2, [&](int64_t, int) {
    const auto me = std::this_thread::get_id();
    parallel_for(16, 4, [&](int64_t, int thread) {
      if (std::this_thread::get_id() != me || thread != 0) ++bad;
    });
  });
  EXPECT_EQ(bad.load(), 0);
}

// P callers at once, each asking for 2 threads, run on at most P + 1 threads:
// the pool serves one caller, the others run on their own thread.
TEST(Concurrency, ConcurrentCallersDoNotOversubscribe) {
  const int callers = 4;
  std::mutex m;
  std::set<std::thread::id> seen;
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int c = 0; c < callers; ++c)
    pool.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      for (int r = 0; r < 5; ++r)
        parallel_for(32, 2, [&](int64_t, int) {
          {
            std::lock_guard<std::mutex> l(m);
            seen.insert(std::this_thread::get_id());
          }
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        });
    });
  go = true;
  for (auto& t : pool) t.join();
  EXPECT_LE(seen.size(), static_cast<size_t>(callers + 1));
}

// FLASHGRAD_SPIN_US: what is accepted, and what is refused with the
// variable's name.
TEST(Concurrency, SpinSettingParses) {
  EXPECT_EQ(parse_spin_microseconds(nullptr), 100);
  EXPECT_EQ(parse_spin_microseconds(""), 100);
  EXPECT_EQ(parse_spin_microseconds("0"), 0);
  EXPECT_EQ(parse_spin_microseconds("250"), 250);
  EXPECT_EQ(parse_spin_microseconds("1000000"), 1000000);
  for (const char* bad : {"-1", "1000001", "12x", "abc", " 5", "99999999999999999999"}) {
    try {
      parse_spin_microseconds(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("environment variable 'FLASHGRAD_SPIN_US': expected an integer number "
                                           "of microseconds in [0, 1000000], got '" +
                                           std::string(bad) + "'"),
                std::string::npos)
          << e.what();
    }
  }
}

// The setting governs what an idle worker costs: after a call, the process
// sleeps 150 ms and its CPU time grows by about min(spin, 150 ms), the worker
// watching for the next call. ctest runs this under the default, under 0 and
// under 200 ms (tests/CMakeLists.txt).
TEST(Concurrency, IdleWorkersSpinOnlyAsLongAsTheSetting) {
  const int64_t spin = spin_microseconds();
  if (spin > 1000 && spin < 100000) GTEST_SKIP() << "FLASHGRAD_SPIN_US=" << spin << " is between the cases checked";
  const auto cpu_ms = [] {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
  };
  std::atomic<int64_t> ran{0};
  parallel_for(64, 2, [&](int64_t, int) { ran.fetch_add(1); });  // starts the worker
  std::this_thread::sleep_for(std::chrono::milliseconds(300));    // past any spin: it sleeps
  parallel_for(64, 2, [&](int64_t, int) { ran.fetch_add(1); });
  const double before = cpu_ms();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const double idle = cpu_ms() - before;
  EXPECT_EQ(ran.load(), 128);
  if (spin <= 1000)
    EXPECT_LT(idle, 10.0) << "FLASHGRAD_SPIN_US=" << spin;
  else
    EXPECT_GT(idle, 20.0) << "FLASHGRAD_SPIN_US=" << spin;
}

// A host runner that runs every task on the caller, last to first, as the
// highest thread index, and counts its calls.
std::atomic<int> g_host_calls{0};
void serial_backwards(void*, int64_t num_tasks, int num_threads, ThreadRunner::Task task, void* task_ctx) {
  ++g_host_calls;
  for (int64_t t = num_tasks - 1; t >= 0; --t) task(task_ctx, t, num_threads - 1);
}

// Restores the own pool when a test ends, whichever way it ends.
struct OwnPoolAfter {
  ~OwnPoolAfter() { set_thread_runner(ThreadRunner{}); }
};

// The worker cases and their bytes on one thread, computed before a test
// sets a runner.
struct SerialCases {
  std::vector<Problem> problems;
  std::vector<Bytes> bytes;
};
SerialCases serial_cases() {
  SerialCases sc;
  for (Case& c : worker_cases(4)) {
    c.num_threads = 1;
    sc.problems.push_back(make_problem(c));
    sc.bytes.push_back(run_bytes(sc.problems.back()));
  }
  return sc;
}

// Every worker case's bytes with num_threads 2 on the runner in use, against
// the serial bytes (computed before the runner was set).
void runner_cases_bitwise(const std::vector<Problem>& ps, const std::vector<Bytes>& serial) {
  for (size_t w = 0; w < ps.size(); ++w) {
    Problem p = ps[w];
    p.opts.num_threads = 2;
    EXPECT_EQ(run_bytes(p), serial[w]) << "case " << w << " on " << thread_runner_name();
  }
}

TEST(Concurrency, HostRunnerTakesEveryTaskAndKeepsTheBytes) {
  const SerialCases sc = serial_cases();
  const std::vector<Problem>& ps = sc.problems;
  const std::vector<Bytes>& serial = sc.bytes;
  OwnPoolAfter restore;
  EXPECT_EQ(thread_runner_name(), "flashgrad");
  ThreadRunner r;
  r.run = serial_backwards, r.name = "serial";
  set_thread_runner(r);
  EXPECT_EQ(thread_runner_name(), "serial");
  g_host_calls = 0;
  runner_cases_bitwise(ps, serial);
  EXPECT_GT(g_host_calls.load(), 0);
  Problem p = ps[0];
  p.opts.num_threads = 2;
  EXPECT_NE(explain_forward(p.opts, p.q.view, p.k.view, p.v.view).describe().find("2 threads on serial"),
            std::string::npos);
  set_thread_runner(ThreadRunner{});
  EXPECT_EQ(thread_runner_name(), "flashgrad");
}

TEST(Concurrency, OpenMpRuntimeErrorsNameTheLibrary) {
  OwnPoolAfter restore;
  try {
    use_openmp_runtime("/nonexistent/libgomp.so.1");
    ADD_FAILURE() << "no error for a missing library";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use_openmp_runtime: argument 'library'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("/nonexistent/libgomp.so.1"), std::string::npos) << e.what();
  }
  try {
    use_openmp_runtime("libm.so.6");
    ADD_FAILURE() << "no error for a library without GOMP_parallel";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without GOMP_parallel"), std::string::npos) << e.what();
  }
  EXPECT_EQ(thread_runner_name(), "flashgrad");
}

#if FG_TEST_OPENMP
// The libgomp this test links: the runtime a host framework would pass.
std::string linked_openmp_runtime() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&omp_get_thread_num), &info) || !info.dli_fname) return "";
  return info.dli_fname;
}

TEST(Concurrency, OpenMpRuntimeRunsCallsBitwise) {
  const std::string lib = linked_openmp_runtime();
  if (lib.empty()) GTEST_SKIP() << "dladdr found no OpenMP runtime";
  const SerialCases sc = serial_cases();
  const std::vector<Problem>& ps = sc.problems;
  const std::vector<Bytes>& serial = sc.bytes;
  OwnPoolAfter restore;
  use_openmp_runtime(lib);
  EXPECT_EQ(thread_runner_name(), "openmp " + lib);
  runner_cases_bitwise(ps, serial);
  // From inside a team the nested region has one thread: all tasks on the caller.
  std::atomic<int> mismatches{0};
#pragma omp parallel for num_threads(2) schedule(static, 1)
  for (int w = 0; w < 4; ++w) {
    Problem p = ps[static_cast<size_t>(w)];
    p.opts.num_threads = 2;
    mismatches += run_bytes(p) != serial[static_cast<size_t>(w)] ? 1 : 0;
  }
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(Concurrency, CallsInsideOmpParallelRegionAreBitwiseSerial) {
  const SerialCases sc = serial_cases();
  const std::vector<Problem>& ps = sc.problems;
  const std::vector<Bytes>& serial = sc.bytes;
  // Every iteration adds to mismatches, so that its read-modify-writes order
  // each iteration's work before the load below for ThreadSanitizer too: the
  // team's join is libgomp's, which is not instrumented, and TSan took the
  // main thread's frees after it for races with the team's (and the pool's)
  // reads of the problems.
  std::atomic<int> mismatches{0};
#pragma omp parallel for num_threads(2) schedule(static, 1)
  for (int w = 0; w < 4; ++w) {
    Problem p = ps[static_cast<size_t>(w)];
    p.opts.num_threads = 0;  // "all cores": the pool serves one caller at a time
    mismatches += run_bytes(p) != serial[static_cast<size_t>(w)] ? 1 : 0;
  }
  EXPECT_EQ(mismatches.load(), 0);
}

#endif  // FG_TEST_OPENMP

}  // namespace
}  // namespace flashgrad::testing
