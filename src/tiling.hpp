// Tile sizes and the workspace layout, chosen in one place for the API (which
// allocates) and the kernels (which carve the allocation the same way).
#pragma once

#include <algorithm>
#include <cstdint>

#include "params.hpp"

namespace flashgrad {

// Tile widths are padded to this many elements so that the tile product can
// always run full vector widths; the padding is zero-filled or ignored.
constexpr int64_t kPad = 32;
constexpr int64_t kAlign = 64;  // bytes
constexpr int64_t kMaxBlockK = 256; // upper bound of TilePlan::block_k (stack buffers)
constexpr int64_t kMaxKeyGroup = 8;  // upper bound of TilePlan::key_group (stack buffers)
// Per thread, at most this many bytes of tiles kept as pair products read
// them: the forward's K/V tiles (ForwardScratch::pair_tiles), and the
// single-pass backward's q and dO blocks (BackwardScratch::held_q), which
// share the workspace with its dQ accumulators (tuning table:
// kPairCacheBytes, kHeldQueryBytes).
constexpr int64_t kPairCacheBytes = int64_t{4} << 20;
constexpr int64_t kHeldQueryBytes = int64_t{2} << 20;

// Row stride of tiles of n columns whose columns the tile products walk down
// (the forward's keys-major Q^T and S^T, the backward's K^T, V^T, S and dP):
// 16 elements (a 64-byte line in f32) past n, so that the rows of one column
// spread over the L1's sets; a stride of 1 KiB (n = 256) put 64 rows in 4
// sets of 12 ways (tuning table: tile_ld).
constexpr int64_t tile_ld(int64_t n) { return n + 16; }

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline int64_t ceil_div(int64_t x, int64_t m) { return (x + m - 1) / m; }

// Per-thread buffers, in elements of the accumulation type (float or double).
// Offsets are in elements from the start of the thread's slice.
struct ForwardScratch {
  // qt: Q^T of every K/V head of a task for keys-major score tiles;
  // row_m/l/alpha, row_slope_f, row_bias and row_mask (pointers) and
  // row_drop_bh (uint32): per K/V head a stride of round_up(block_q, kPad)
  // rows; row_drop_x (uint32) one such stride.
  int64_t q, qt, kt, v, s, o, pv, stage, row_m, row_l, row_alpha, row_lo, row_hi, row_lo_f, row_hi_f, row_pos_f,
      row_slope_f, row_bias, row_mask, row_drop_x, row_drop_bh, total;
  // Pair products only: K/V tiles as the products read them, kept across the
  // query blocks of a task's K/V heads (forward_task.inl, PairTileCache):
  // pair_slots slots of pair_slot elements each, a ready byte per slot, and
  // pair_tag (3 int64: batch, first K/V head, split) naming whose tiles
  // they hold.
  int64_t pair_tag = 0, pair_ready = 0, pair_tiles = 0, pair_slots = 0, pair_slot = 0;
  // Shared, when the keys are split: partial out [splits, batch, heads_q, seqlen_q, dv]
  // and lse [splits, batch, heads_q, seqlen_q], from the start of the shared region.
  int64_t part_o, part_lse;
};
struct BackwardScratch {
  // The dK/dV pass (a task owns a key block) and the dQ pass (a task owns a
  // query block) share one layout. s/dp/t are [block_q, bk_pad] tiles and
  // kt/vt [d, bk_pad], all with row stride TilePlan::bk_ld; acc_a holds dK or
  // dQ, acc_b holds dV. tmp stages rows for transposes, and the tile products
  // of paths without an accumulating epilogue (gemm_nn_acc). For the AMX
  // products (AmxBackward), with bq = round_up(block_q, kPad): q_pairs and
  // dout_pairs hold a query block's q and dO as bf16 pairs [bq, d / 2],
  // pairs P and dS as pairs of query rows, [bq / 2, bk_ld] each.
  int64_t k, kt, vt, q, dout, s, dp, t, acc_a, acc_b, tmp, row_a, row_b, row_lo, row_hi, total;
  // k, kt, vt, acc_a and acc_b of key block x of a key group (TilePlan::key_group) lie x * key_slot further.
  int64_t key_slot = 0;
  int64_t q_pairs = 0, dout_pairs = 0, pairs = 0;  // pair-product plans only
  // Fused only: dq_acc, the group's dQ sums [heads_q / heads_kv, seqlen_q,
  // dqk_pad] (DqSums::workspace) or, with bf16 storage, their lower halves
  // as uint16 (split_dq); dq_stage, a query block's sums [block_q, dqk_pad]
  // (in_dq and split_dq).
  int64_t dq_acc = 0, dq_stage = 0;
  // Fused pair products only: the query blocks' q and dO pairs in both
  // layouts (PairBackward::load_q), kept across the task's key blocks:
  // held_slots slots of held_slot elements, slot g * nqb + i holding block i
  // of the group's query head g, and a ready byte per slot.
  int64_t held_q = 0, held_ready = 0, held_slots = 0, held_slot = 0;
};

// A short-query forward (seqlen_q <= kSplitMaxRows) splits its keys into
// ceil(seqlen_k / kSplitKeys) runs of about equal length (rounded up to
// kSplitAlign keys), and into at least two where the K/V heads' rows lie
// side by side and seqlen_k >= 2 * kSplitMinKeys, or where the call has one
// K/V head (batch * heads_kv = 1, one task otherwise) and seqlen_k >= 2 *
// kSplitMinKeysOneHead. The runs follow from the shapes alone, not from the
// thread count, so results stay bitwise identical for any number of
// threads. Both threads then read K and V for short queries, at the cost
// of a merge (tuning table: kSplitKeys).
constexpr int64_t kSplitKeys = 2048;
constexpr int64_t kSplitMinKeys = 128;
constexpr int64_t kSplitMinKeysOneHead = 256;
constexpr int64_t kSplitAlign = 64;
constexpr int64_t kSplitMaxRows = 16;
// Keys per run of p's forward (seqlen_k, at least 1, where it does not split).
int64_t split_length(const AttnParams& p);
// Whether the forward splits p's keys (then each task takes every K/V head
// of its run).
bool split_keys(const AttnParams& p);

// Where the single pass keeps its dQ sums (backward_dq_sums.inl): per
// thread in the workspace, group * seqlen_q * head_dim * 4 bytes (f16
// gradients); in dq itself where dq holds the accumulation type (f32, f64);
// or, for bf16 dq, split: dq holds each f32 sum's upper 16 bits (the sum
// truncated to bf16) and the workspace the lower 16. All hold the same
// sums, so results are bitwise the same; the last two keep the workspace
// from growing with the group's whole dQ. dq rows that are strided or
// padded pass through dq_stage, one query block at a time.
enum class DqSums { workspace, in_dq, split_dq };

struct TilePlan {
  // Forward: a tile stacks head_rows query rows of each of the `group` query
  // heads that share one K/V head (block_q = group * head_rows rows), so each
  // K/V tile is loaded once for the whole group; keys are cut into `splits`
  // runs of split_k keys, merged at the end.
  // With split keys a task also takes kv_heads K/V heads at once, so that it
  // reads each key row of all heads together: in [batch, seq, heads, dim] one
  // head's rows are a page apart, and visiting a head at a time missed the TLB
  // on every row (tuning table: kv_heads).
  int64_t group = 1, head_rows = 64, splits = 1, split_k = 0, kv_heads = 1;
  int64_t block_q = 64;
  int64_t block_k = 64;
  int64_t dqk_pad = 0;  ///< head_dim padded to kPad
  int64_t dv_pad = 0;   ///< head_dim_v padded to kPad
  int64_t bq_pad = 0;
  int64_t bk_pad = 0;
  int64_t bk_ld = 0;    ///< backward: row stride of its [*, bk_pad] tiles, tile_ld(bk_pad)
  int64_t acc_bytes = 4;  ///< 8 for f64 storage
  int threads = 1;
  bool fused = false;     ///< backward: single pass (backward.inl)
  int64_t key_chunks = 1; ///< backward, single pass: key runs per (batch, K/V head), dQ partials in the shared region
  DqSums dq_sums = DqSums::workspace;  ///< backward, single pass with one key run
  int64_t key_group = 1;  ///< backward, single pass: key blocks each query block meets in turn (kMaxKeyGroup at most)
  ForwardScratch fwd{};
  BackwardScratch bwd{};
  int64_t per_thread_bytes = 0;  ///< one thread's slice, aligned
  int64_t shared_bytes = 0;      ///< O(seqlen) vectors (delta, dsinks partials)
  int64_t total_bytes() const {  // saturates like the sizes (tiling.cpp)
    int64_t n = 0;
    return __builtin_mul_overflow(per_thread_bytes, int64_t{threads}, &n) || __builtin_add_overflow(n, shared_bytes, &n)
               ? int64_t{1} << 62
               : n;
  }
};

// Whether the amx path runs a call's products on AMX tiles: bf16 with at
// least 3 query rows per K/V head. Decode below that keeps the avx512 f32
// tiles (V read in place) in both passes, so the backward still recomputes
// the forward's scores bit for bit. AMX's tiles lose to those there (tuning
// table: amx_call).
inline bool amx_call(const AttnParams& p) {
  return p.dtype == DType::bf16 && p.seqlen_q * (p.heads_q / std::max<int64_t>(p.heads_kv, 1)) >= 3;
}
// Whether the avx512bf16 path runs a call on AVX512_BF16 dot products (both
// passes, so the backward recomputes the forward's scores bit for bit): bf16
// with at least 32 query rows per K/V head, or 8 to 31, which take narrow
// tiles on dot products (Bf16DotTiles::narrow), where those read K
// and V in memory order: the keys split (each task then takes every K/V
// head of its rows) or each head's rows contiguous. Other calls
// take the avx512 path, whose narrow tiles read bf16 K and V where they lie
// between their FMAs, and whose decode tiles (fewer than 8 rows) read them
// whole, where the dot products' row tiles re-lay K and V as pairs
// (tuning table: dot_call).
inline bool dot_call(const AttnParams& p) {
  if (p.dtype != DType::bf16) return false;
  const int64_t rows = p.seqlen_q * (p.heads_q / std::max<int64_t>(p.heads_kv, 1));
  const bool contiguous = p.k.seq_stride == p.head_dim && p.v.seq_stride == p.head_dim_v;
  return rows >= 32 || (rows >= 8 && (split_keys(p) || contiguous));
}
// What runs the call's bf16 pair products (pair_engine in dispatch.hpp),
// if anything: with pairs the forward takes wider key tiles and the
// backward's pair buffers are laid out; AMX's backward takes taller query
// tiles.
enum class PairEngine { none, dot, amx };
TilePlan plan_forward(const AttnParams& p, PairEngine engine);
TilePlan plan_backward(const AttnParams& p, PairEngine engine);

}  // namespace flashgrad
