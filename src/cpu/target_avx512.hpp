// The avx512 path's target, for the kernels (src/cpu/kernels_avx512.cpp) and
// the benchmarks' tile routines (bench/tile_ops_avx512.cpp): every function
// that follows, up to target_end.hpp, is compiled for these instruction
// sets, and the vector layer's switches are set. Included once, after the
// standard headers and <immintrin.h>, so that only flashgrad's code gets them.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2")
#endif
#define FG_PORTABLE_HALF 0
#define FG_ISA_ENUM Isa::avx512
#define FG_ISA_NAME "avx512"
