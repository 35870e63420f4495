// Kernels for the avx512 path. Standard headers come first so that only
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

// GCC 12 warns inside its own _mm512_reduce_* (an intentionally undefined
// register operand); the warning is about the header, not this code.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "cpu/exp_poly.hpp"
#include "dispatch.hpp"
#include "merge.hpp"
#include "parallel.hpp"
#include "params.hpp"
#include "tiling.hpp"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2")
#endif
#define FG_PORTABLE_HALF 0
#define FG_ISA_ENUM Isa::avx512
#define FG_ISA_NAME "avx512"

namespace flashgrad::cpu::avx512 {
#include "cpu/vec_avx512.inl"
#include "cpu/kernels.inl"
}  // namespace flashgrad::cpu::avx512
#if defined(__clang__)
#pragma clang attribute pop
#endif
