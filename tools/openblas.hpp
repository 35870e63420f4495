// OpenBLAS set-up shared by the programs that measure against it (the demo's
// baseline, flashgrad-baseline, and the lab's roofline and sweep).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace flashgrad::tools {

// OpenBLAS picks its kernels from the CPU model. Where a virtual machine hides
// the model it falls back to an SSE3 core ("Prescott") whose sgemm is several
// times slower than the CPU allows, which would flatter flashgrad; so unless
// OPENBLAS_CORETYPE is set, this sets it to the core the CPU's features allow,
// for child processes (this process's OpenBLAS chose its core when it loaded).
// Returns the core's name and where it came from.
std::pair<std::string, std::string> choose_openblas_core();

// Whether this process's OpenBLAS runs the core named (case-insensitive).
bool openblas_core_is(const std::string& core);

// choose_openblas_core(), and when this process's OpenBLAS (which chose its
// core as it loaded) runs another core, this command again as a new process
// image that loads it with the chosen one (once: the core may be one OpenBLAS
// cannot run). `command` ("flashgrad-lab roofline") names the command in the
// message if exec fails.
void use_chosen_openblas_core(const std::string& command);

// "OpenBLAS 0.3.21": the first two words of its configuration string.
std::string openblas_version();

// C = A B by cblas_sgemm on n x n operands made once: the f32 GEMM that
// flashgrad's rates are divided by.
class Sgemm {
 public:
  explicit Sgemm(int64_t n);
  void run();
  double flops() const { return 2.0 * static_cast<double>(n_) * static_cast<double>(n_) * static_cast<double>(n_); }
  // GFLOP/s now: the faster of two calls after an untimed one, with a pause
  // before and after, since OpenBLAS's workers (and the thread pool of
  // whatever ran before) spin a little after a call; the pause keeps that
  // out of these calls' time and of the next measurement's.
  double gflops_now();

 private:
  int64_t n_;
  std::vector<float> a_, b_, c_;
};

// Pause between measurements of different libraries (why: Sgemm::gflops_now).
void settle();

}  // namespace flashgrad::tools
