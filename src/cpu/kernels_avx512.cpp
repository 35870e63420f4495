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

#include "cpu/target_avx512.hpp"

namespace flashgrad::cpu::avx512 {
#include "cpu/vec_avx512.inl"
#include "cpu/kernels.inl"
}  // namespace flashgrad::cpu::avx512
#include "cpu/target_end.hpp"
