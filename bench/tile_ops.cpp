#include "tile_ops.hpp"

namespace flashgrad::bench {

namespace scalar { extern const TileOps table; }
#if FLASHGRAD_BENCH_X86
namespace avx2 { extern const TileOps table; }
namespace avx512 { extern const TileOps table; }
#endif

const TileOps& tile_ops(Isa isa) {
  kernels_for(isa);  // throws the library's error for an ISA this CPU or build lacks
  switch (isa) {
#if FLASHGRAD_BENCH_X86
    case Isa::avx512:
    case Isa::avx512bf16:
    case Isa::amx: return avx512::table;  // their f32 tile routines are avx512's
    case Isa::avx2: return avx2::table;
#endif
    default: return scalar::table;
  }
}

#if FLASHGRAD_BENCH_X86
namespace amx {
void pair_gemm(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
               float* c, int64_t ldc);
}
namespace avx512bf16 {
void pair_gemm(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
               float* c, int64_t ldc);
}
#endif

PairEngine pair_engine() {
#if FLASHGRAD_BENCH_X86
  switch (kernels().isa) {
    case Isa::amx: return {"amx", "gemm_amx", &amx::pair_gemm};
    case Isa::avx512bf16: return {"avx512bf16", "gemm_bf16", &avx512bf16::pair_gemm};
    default: break;
  }
#endif
  return {};
}

}  // namespace flashgrad::bench
