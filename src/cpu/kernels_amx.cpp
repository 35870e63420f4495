// Kernels for the amx path: the avx512 path with bf16 storage's forward on
// AMX-BF16 tiles (AmxTiles in forward_amx.inl), and its backward's products on
// them too (PairBackward<AmxProducts> in backward_step.inl). Only those are
// compiled here, with avx512bf16, amx-tile and amx-bf16 added to the avx512
// target options; every other entry calls the avx512 table. Standard headers
// come first so that only flashgrad's own code is compiled with this ISA's
// target options.
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

#include "cpu/target_amx.hpp"
#ifndef NDEBUG
#define FG_DASSERT(x) assert(x)
#else
#define FG_DASSERT(x) ((void)0)
#endif

namespace flashgrad::cpu::amx {
#include "cpu/vec_avx512.inl"
#include "cpu/vec.inl"
#include "cpu/rows.inl"
#include "cpu/rng.inl"
#include "cpu/scores.inl"
#include "cpu/forward.inl"
#include "cpu/backward.inl"

namespace {

void forward_entry(const AttnParams& p, const TilePlan& plan, void* ws) {
  if (amx_call(p))
    forward_impl<bf16_t, float, AmxTiles>(p, plan, ws);
  else
    avx512::table.forward(p, plan, ws);
}
void backward_entry(const AttnParams& p, const TilePlan& plan, void* ws) {
  if (amx_call(p))
    backward_impl<bf16_t, float, PairBackward<AmxProducts>>(p, plan, ws);
  else
    avx512::table.backward(p, plan, ws);
}
void dropout_mask_entry(const AttnParams& p, uint8_t* keep) { avx512::table.dropout_mask(p, keep); }
ForwardChoice forward_path_entry(const AttnParams& p, const TilePlan& plan) {
  return amx_call(p) ? first_task_path<bf16_t, float, AmxTiles>(p, plan) : avx512::table.forward_path(p, plan);
}

}  // namespace

extern const KernelTable table;
const KernelTable table = {Isa::amx, "amx", forward_entry, backward_entry, dropout_mask_entry, forward_path_entry};
}  // namespace flashgrad::cpu::amx
#include "cpu/target_end.hpp"
