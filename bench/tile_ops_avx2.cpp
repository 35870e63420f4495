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

#include "cpu/target_avx2.hpp"
#define FG_DASSERT(x) ((void)0)

namespace flashgrad::bench::avx2 {
#include "cpu/vec_avx2.inl"
#include "cpu/vec.inl"
#include "cpu/rows.inl"
#include "cpu/rng.inl"
#include "tile_ops.inl"
}  // namespace flashgrad::bench::avx2
#include "cpu/target_end.hpp"
