// The avx512bf16 path's pair product (gemm_bf16 in vec_avx512.inl, on
// AVX512_BF16 dot products) behind a function pointer (tile_ops.hpp).
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

#include "cpu/target_avx512bf16.hpp"
#define FG_DASSERT(x) ((void)0)

namespace flashgrad::bench::avx512bf16 {
#include "cpu/vec_avx512.inl"

void pair_gemm(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
               float* c, int64_t ldc) {
  gemm_bf16(m, n, kp, a, lda, b, ldb, c, ldc, 1.0f);
}
}  // namespace flashgrad::bench::avx512bf16
#include "cpu/target_end.hpp"
