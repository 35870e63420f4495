// Kernels for the avx512 path. Standard headers come first so that only
// flashgrad's own code is compiled with this ISA's target options.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "dispatch.hpp"
#include "parallel.hpp"
#include "params.hpp"
#include "tiling.hpp"

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2")
#define FG_NR 32
#define FG_PORTABLE_HALF 0
#define FG_ISA_ENUM Isa::avx512
#define FG_ISA_NAME "avx512"

namespace flashgrad::cpu::avx512 {
#include "cpu/kernels.inl"
}  // namespace flashgrad::cpu::avx512
