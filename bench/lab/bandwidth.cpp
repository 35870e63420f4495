#include "bandwidth.hpp"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "cli.hpp"
#include "openblas.hpp"

namespace flashgrad::tools {
namespace {

// 64-byte aligned doubles, freed with std::free.
double* aligned_doubles(int64_t n) {
  auto* p = static_cast<double*>(std::aligned_alloc(64, static_cast<size_t>((n * 8 + 63) / 64 * 64)));
  if (!p) throw std::runtime_error("cannot allocate the bandwidth test's arrays");
  return p;
}

}  // namespace

Triad::Triad(int64_t n, int threads)
    : n_(n), threads_(threads), a_(aligned_doubles(n)), b_(aligned_doubles(n)), c_(aligned_doubles(n)) {
  double *a = a_.get(), *b = b_.get(), *c = c_.get();
#pragma omp parallel for num_threads(threads_) schedule(static)
  for (int64_t i = 0; i < n_; ++i) {
    a[i] = 0.0;
    b[i] = 1.0;
    c[i] = 2.0;
  }
}

double Triad::gbs(int repeats) {
  const double s = 3.0;
  double *a = a_.get(), *b = b_.get(), *c = c_.get();
  auto triad = [&] {
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int64_t i = 0; i < n_; ++i) a[i] = b[i] + s * c[i];
  };
  const double rate = 3.0 * 8.0 * static_cast<double>(n_) / median(time_calls(triad, 1, repeats)) / 1e9;
  if (a[n_ / 2] != 7.0) throw std::runtime_error("the triad computed a wrong result");
  settle();
  return rate;
}

double memcpy_gbs(int64_t bytes, int threads, int repeats) {
  const int64_t n = bytes / 8;
  const std::unique_ptr<double[], void (*)(void*)> src_owner(aligned_doubles(n), std::free),
      dst_owner(aligned_doubles(n), std::free);
  double *src = src_owner.get(), *dst = dst_owner.get();
  const int64_t chunk = (n + threads - 1) / threads;
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), lo = std::min(n, t * chunk), hi = std::min(n, lo + chunk);
    for (int64_t i = lo; i < hi; ++i) src[i] = static_cast<double>(i), dst[i] = 0.0;
  }
  auto copy = [&] {
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), lo = std::min(n, t * chunk), hi = std::min(n, lo + chunk);
      if (hi > lo) std::memcpy(dst + lo, src + lo, static_cast<size_t>(hi - lo) * 8);
    }
  };
  const double rate = 2.0 * static_cast<double>(n * 8) / median(time_calls(copy, 1, repeats)) / 1e9;
  if (dst[n - 1] != static_cast<double>(n - 1)) throw std::runtime_error("memcpy copied a wrong result");
  settle();
  return rate;
}

}  // namespace flashgrad::tools
