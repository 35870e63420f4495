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

#include "cpu/target_avx2.hpp"

namespace flashgrad::cpu::avx2 {
#include "cpu/vec_avx2.inl"
#include "cpu/kernels.inl"
}  // namespace flashgrad::cpu::avx2
#include "cpu/target_end.hpp"
