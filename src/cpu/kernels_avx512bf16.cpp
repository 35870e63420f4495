// Kernels for the avx512bf16 path: the avx512 path with bf16 storage on
// AVX512_BF16 dot products in both passes (Bf16DotTiles in forward_tiles.inl,
// PairBackward<DotProducts> in backward_step.inl) for the calls dot_call takes.
// Only those are compiled here, with avx512bf16 added to the avx512 target
// options; every other entry calls the avx512 table, whose code never
// contains a BF16 instruction. Standard headers come first so that only
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

// As in kernels_avx512.cpp: GCC 12 warns inside its own _mm512_reduce_*.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "cpu/exp_poly.hpp"
#include "dispatch.hpp"
#include "merge.hpp"
#include "parallel.hpp"
#include "params.hpp"
#include "tiling.hpp"

#include "cpu/target_avx512bf16.hpp"
#ifndef NDEBUG
#define FG_DASSERT(x) assert(x)
#else
#define FG_DASSERT(x) ((void)0)
#endif

namespace flashgrad::cpu::avx512bf16 {
#include "cpu/vec_avx512.inl"
#include "cpu/vec.inl"
#include "cpu/rows.inl"
#include "cpu/rng.inl"
#include "cpu/scores.inl"
#include "cpu/forward.inl"
#include "cpu/backward.inl"

namespace {

void forward_entry(const AttnParams& p, const TilePlan& plan, void* ws) {
  if (dot_call(p))
    forward_impl<bf16_t, float, Bf16DotTiles>(p, plan, ws);
  else
    avx512::table.forward(p, plan, ws);
}
void backward_entry(const AttnParams& p, const TilePlan& plan, void* ws) {
  if (dot_call(p))
    backward_impl<bf16_t, float, PairBackward<DotProducts>>(p, plan, ws);
  else
    avx512::table.backward(p, plan, ws);
}
void dropout_mask_entry(const AttnParams& p, uint8_t* keep) { avx512::table.dropout_mask(p, keep); }
ForwardChoice forward_path_entry(const AttnParams& p, const TilePlan& plan) {
  return dot_call(p) ? first_task_path<bf16_t, float, Bf16DotTiles>(p, plan) : avx512::table.forward_path(p, plan);
}

}  // namespace

extern const KernelTable table;
const KernelTable table = {Isa::avx512bf16, "avx512bf16", forward_entry, backward_entry, dropout_mask_entry,
                           forward_path_entry};
}  // namespace flashgrad::cpu::avx512bf16
#include "cpu/target_end.hpp"
