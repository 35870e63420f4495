// Kernels for the avx2 path. Standard headers come first so that only
// flashgrad's own code is compiled with this ISA's target options.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <immintrin.h>

#include "cpu/exp_poly.hpp"
#include "dispatch.hpp"
#include "merge.hpp"
#include "parallel.hpp"
#include "params.hpp"
#include "tiling.hpp"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,bmi2"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,bmi2")
#endif
#define FG_PORTABLE_HALF 0
#define FG_ISA_ENUM Isa::avx2
#define FG_ISA_NAME "avx2"

namespace flashgrad::cpu::avx2 {
#include "cpu/vec_avx2.inl"
#include "cpu/kernels.inl"
}  // namespace flashgrad::cpu::avx2
#if defined(__clang__)
#pragma clang attribute pop
#endif
