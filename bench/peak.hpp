// The machine's arithmetic peak, measured by loops that touch no memory:
// independent multiply-add chains held in registers (or AMX tiles), run on
// `threads` threads at once. Every rate the benchmarks report can be read
// as a share of these.
#pragma once

#include <string>

namespace flashgrad::bench {

struct PeakRates {
  std::string f32_isa;      ///< the FMA loop's vector ISA ("avx512", "avx2" or "scalar")
  double f32_gflops = 0;    ///< f32 fused multiply-adds, 2 FLOPs each
  std::string bf16_isa;     ///< "amx" (TDPBF16PS), "avx512bf16" (VDPBF16PS) or "" (none)
  double bf16_gflops = 0;   ///< bf16 pair products into f32, 2 FLOPs per product; 0 without one
};

// Best of `repeats` runs of about 50 ms each.
PeakRates measure_peaks(int threads, int repeats);

}  // namespace flashgrad::bench
