// Kernels for the scalar path. Standard headers come first so that only
// flashgrad's own code is compiled with this ISA's target options.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/exp_poly.hpp"
#include "dispatch.hpp"
#include "merge.hpp"
#include "parallel.hpp"
#include "params.hpp"
#include "tiling.hpp"

#define FG_PORTABLE_HALF 1
#define FG_ISA_ENUM Isa::scalar
#define FG_ISA_NAME "scalar"

namespace flashgrad::cpu::scalar {
#include "cpu/vec_scalar.inl"
#include "cpu/kernels.inl"
}  // namespace flashgrad::cpu::scalar
