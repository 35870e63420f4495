// Register-only peak loops (peak.hpp). Each function carries its own target
// attribute, so one source serves every ISA; the one run is the best this
// CPU has (dispatch.hpp's supported_isas).
#include "peak.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "dispatch.hpp"

#if FLASHGRAD_BENCH_X86
#include <immintrin.h>
// GCC 12's _mm512_reduce_add_ps reads an undefined vector on purpose.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace flashgrad::bench {
namespace {

// FLOPs per loop iteration are returned by each kernel; the loop count is
// large enough that the call overhead is noise. Accumulators are summed and
// returned so that the compiler keeps every chain.
using PeakFn = double (*)(int64_t iters, double* flops_per_iter);

double fma_scalar(int64_t iters, double* fpi) {
  float acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = 1.0f + static_cast<float>(i) * 1e-3f;
  const float a = 0.999f, b = 1e-4f;
  for (int64_t it = 0; it < iters; ++it)
    for (float& x : acc) x = x * a + b;
  *fpi = 32;
  double s = 0;
  for (float x : acc) s += x;
  return s;
}

#if FLASHGRAD_BENCH_X86
// 16 chains: enough to cover 2 FMA ports x 4-5 cycles of latency on every x86 core.
__attribute__((target("avx512f"))) double fma_avx512(int64_t iters, double* fpi) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(1.0f + static_cast<float>(i) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-4f);
  for (int64_t it = 0; it < iters; ++it)
    for (auto& x : acc) x = _mm512_fmadd_ps(x, a, b);
  *fpi = 16 * 16 * 2;
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) double fma_avx2(int64_t iters, double* fpi) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(1.0f + static_cast<float>(i) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-4f);
  for (int64_t it = 0; it < iters; ++it)
    for (auto& x : acc) x = _mm256_fmadd_ps(x, a, b);
  *fpi = 12 * 8 * 2;
  alignas(32) float out[8];
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  _mm256_store_ps(out, s);
  double r = 0;
  for (float x : out) r += x;
  return r;
}

// VDPBF16PS: 16 lanes x 2 products each.
__attribute__((target("avx512f,avx512bf16"))) double dot_avx512bf16(int64_t iters, double* fpi) {
  __m512 acc[16];
  for (auto& x : acc) x = _mm512_setzero_ps();
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // pairs of 1.0
  const __m512bh b = (__m512bh)_mm512_set1_epi32(0x33803380);  // pairs of 2^-24
  for (int64_t it = 0; it < iters; ++it)
    for (auto& x : acc) x = _mm512_dpbf16_ps(x, a, b);
  *fpi = 16 * 32 * 2;
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

// TDPBF16PS on 16 x 64-byte tiles: 16 x 16 results of 32 products each; four
// accumulators from two A and two B tiles, as a GEMM's inner block.
__attribute__((target("amx-tile,amx-bf16"))) double tile_amx(int64_t iters, double* fpi) {
  alignas(64) uint8_t cfg[64] = {};
  cfg[0] = 1;
  for (int t = 0; t < 8; ++t) {
    cfg[16 + 2 * t] = 64;
    cfg[48 + t] = 16;
  }
  _tile_loadconfig(cfg);
  alignas(64) uint16_t ones[16 * 32];
  std::fill(std::begin(ones), std::end(ones), uint16_t{0x3f80});
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float c[16 * 16];
  _tile_stored(0, c, 64);
  _tile_release();
  *fpi = 4.0 * 16 * 16 * 32 * 2;
  return c[0];
}
#endif

// Runs fn on `threads` threads at once (started together), best of repeats;
// the rate counts every thread's FLOPs over the slowest thread's time.
double rate(PeakFn fn, int threads, int repeats) {
  double fpi = 0;
  int64_t iters = 1 << 12;
  for (;;) {  // size one run to about 50 ms on one thread
    const auto t0 = std::chrono::steady_clock::now();
    volatile double sink = fn(iters, &fpi);
    (void)sink;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0.05) break;
    iters *= s < 0.005 ? 8 : 2;
  }
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    std::atomic<int> ready{0};
    std::vector<double> secs(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        ready.fetch_add(1);
        while (ready.load() < threads) {
        }
        const auto t0 = std::chrono::steady_clock::now();
        double f = 0;
        volatile double sink = fn(iters, &f);
        (void)sink;
        secs[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      });
    for (auto& th : pool) th.join();
    const double slowest = *std::max_element(secs.begin(), secs.end());
    best = std::max(best, static_cast<double>(threads) * static_cast<double>(iters) * fpi / slowest * 1e-9);
  }
  return best;
}

bool supports(Isa isa) {
  const auto all = supported_isas();
  return std::find(all.begin(), all.end(), isa) != all.end();
}

}  // namespace

PeakRates measure_peaks(int threads, int repeats) {
  PeakRates r;
  r.f32_isa = "scalar";
  PeakFn f32 = fma_scalar;
#if FLASHGRAD_BENCH_X86
  if (supports(Isa::avx512)) {
    r.f32_isa = "avx512";
    f32 = fma_avx512;
  } else if (supports(Isa::avx2)) {
    r.f32_isa = "avx2";
    f32 = fma_avx2;
  }
  PeakFn bf16 = nullptr;
  if (supports(Isa::amx)) {
    kernels_for(Isa::amx);  // asks the kernel for the tile state (arch_prctl) once
    r.bf16_isa = "amx";
    bf16 = tile_amx;
  } else if (supports(Isa::avx512bf16)) {
    r.bf16_isa = "avx512bf16";
    bf16 = dot_avx512bf16;
  }
  if (bf16) r.bf16_gflops = rate(bf16, threads, repeats);
#endif
  r.f32_gflops = rate(f32, threads, repeats);
  return r;
}

}  // namespace flashgrad::bench
