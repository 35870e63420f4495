// The tile routines of the avx2 path (tile_ops.hpp). Standard headers come
// first so that only flashgrad's own code is compiled for this ISA's target.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <immintrin.h>

#include "cpu/exp_poly.hpp"
#include "dispatch.hpp"
#include "tile_ops.hpp"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi2"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,bmi2")
#endif
#define FG_PORTABLE_HALF 0
#define FG_ISA_ENUM Isa::avx2
#define FG_ISA_NAME "avx2"
#define FG_DASSERT(x) ((void)0)

namespace flashgrad::bench::avx2 {
#include "cpu/vec_avx2.inl"
#include "cpu/vec.inl"
#include "cpu/rows.inl"
#include "tile_ops.inl"
}  // namespace flashgrad::bench::avx2
#if defined(__clang__)
#pragma clang attribute pop
#endif
