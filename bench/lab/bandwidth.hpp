// Memory bandwidth probes: the STREAM triad a = b + s * c over doubles (3 x 8
// bytes per element counted, as STREAM does: the write-allocate read is not)
// and memcpy (read + write counted), on T threads. `flashgrad-lab roofline`
// reports both; the sweep times a triad beside each short-query run.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

namespace flashgrad::tools {

class Triad {
 public:
  // Three arrays of n doubles, 64-byte aligned, each thread first touching
  // the part it will run over.
  Triad(int64_t n, int threads);

  // GB/s: the median of `repeats` passes after a warm-up pass, checked, then
  // a pause (settle) so that the OpenMP threads' spinning ends before the
  // next measurement.
  double gbs(int repeats);
  int64_t array_bytes() const { return n_ * 8; }

 private:
  struct Free {
    void operator()(double* p) const { std::free(p); }
  };
  using Doubles = std::unique_ptr<double[], Free>;
  int64_t n_;
  int threads_;
  Doubles a_, b_, c_;
};

// memcpy of `bytes` split across the threads, in GB/s (read + write), checked.
double memcpy_gbs(int64_t bytes, int threads, int repeats);

}  // namespace flashgrad::tools
