// The tile routines of the scalar path (tile_ops.hpp). Standard headers come
// first so that only flashgrad's own code is compiled for this ISA's target.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/exp_poly.hpp"
#include "dispatch.hpp"
#include "tile_ops.hpp"

#define FG_PORTABLE_HALF 1
#define FG_ISA_ENUM Isa::scalar
#define FG_ISA_NAME "scalar"
#define FG_DASSERT(x) ((void)0)

namespace flashgrad::bench::scalar {
#include "cpu/vec_scalar.inl"
#include "cpu/vec.inl"
#include "cpu/rows.inl"
#include "cpu/rng.inl"
#include "tile_ops.inl"
}  // namespace flashgrad::bench::scalar
