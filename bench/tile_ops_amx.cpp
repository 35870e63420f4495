// The amx path's tile product (gemm_amx in vec_avx512.inl) behind a function
// pointer (tile_ops.hpp), with the tile registers configured and released
// around each call as a kernel task does around its products.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <immintrin.h>

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "cpu/exp_poly.hpp"
#include "dispatch.hpp"
#include "tile_ops.hpp"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,avx2,fma,f16c,bmi2"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,avx2,fma,f16c,bmi2")
#endif
#define FG_PORTABLE_HALF 0
#define FG_BF16_DOT 1
#define FG_AMX 1
#define FG_DASSERT(x) ((void)0)

namespace flashgrad::bench::amx {
#include "cpu/vec_avx512.inl"

void pair_gemm(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
               float* c, int64_t ldc) {
  amx_configure();
  gemm_amx(m, n, kp, a, lda, b, ldb, c, ldc);
  _tile_release();
}
}  // namespace flashgrad::bench::amx
#if defined(__clang__)
#pragma clang attribute pop
#endif
