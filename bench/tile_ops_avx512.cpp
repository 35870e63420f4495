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

#include "cpu/target_avx512.hpp"
#define FG_DASSERT(x) ((void)0)

namespace flashgrad::bench::avx512 {
#include "cpu/vec_avx512.inl"
#include "cpu/vec.inl"
#include "cpu/rows.inl"
#include "cpu/rng.inl"
#include "tile_ops.inl"
}  // namespace flashgrad::bench::avx512
#include "cpu/target_end.hpp"
