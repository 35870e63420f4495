// The tile routines of the avx512 path (tile_ops.hpp). Standard headers come
// first so that only flashgrad's own code is compiled for this ISA's target.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <immintrin.h>

// As in kernels_avx512.cpp: GCC 12 warns inside its own _mm512_reduce_*.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "cpu/exp_poly.hpp"
#include "dispatch.hpp"
#include "tile_ops.hpp"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2")
#endif
#define FG_PORTABLE_HALF 0
#define FG_ISA_ENUM Isa::avx512
#define FG_ISA_NAME "avx512"
#define FG_DASSERT(x) ((void)0)

namespace flashgrad::bench::avx512 {
#include "cpu/vec_avx512.inl"
#include "cpu/vec.inl"
#include "cpu/rows.inl"
#include "tile_ops.inl"
}  // namespace flashgrad::bench::avx512
#if defined(__clang__)
#pragma clang attribute pop
#endif
