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

#include "cpu/target_amx.hpp"
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
#include "cpu/target_end.hpp"
