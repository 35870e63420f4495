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

#if !FLASHGRAD_BENCH_X86
PairGemm amx_pair_gemm() { return nullptr; }
#endif

}  // namespace flashgrad::bench
