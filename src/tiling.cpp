#include "tiling.hpp"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>

namespace flashgrad {
namespace {

constexpr int64_t kHuge = int64_t{1} << 60;

int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) || r > kHuge ? kHuge : r;
}
int64_t sat_mul(std::initializer_list<int64_t> xs) {
  int64_t r = 1;
  for (int64_t x : xs) r = sat_mul(r, x);
  return r;
}
int64_t sat_add(int64_t a, int64_t b) { return a > kHuge - b ? kHuge : a + b; }

// Keep the working set of one tile step (Q, K, V, S, O tiles) near L2 size
// (1 MiB per Zen 4 core): 64 x 64 tiles up to d = 128, shorter query tiles
// beyond, so that d = 512 still fits. The forward (128 or 256 query rows)
// and the backward (128 or 256 keys) widen them for d <= 128 below.
void choose_blocks(const AttnParams& p, TilePlan& t) {
  const int64_t d = std::max(p.head_dim, p.head_dim_v);
  t.block_k = 64;
  t.block_q = d <= 128 ? 64 : (d <= 256 ? 32 : 16);
  t.acc_bytes = p.dtype == DType::f64 ? 8 : 4;
  t.dqk_pad = round_up(p.head_dim, kPad);
  t.dv_pad = round_up(p.head_dim_v, kPad);
  t.bq_pad = round_up(t.block_q, kPad);
  t.bk_pad = round_up(t.block_k, kPad);
  t.threads = std::max(1, p.num_threads);
}

// A window's band cuts every tile it touches, and taller or wider tiles
// add to what its cut tiles compute for nothing, so windows keep the
// smaller tiles below. (A causal diagonal cuts only the tiles on it.)
bool windowed(const AttnParams& p) { return p.window_left >= 0 || p.window_right >= 0; }

// The most keys a query row sees under the causal mask and the window.
int64_t band_keys(const AttnParams& p) {
  const int64_t lk = p.seqlen_k;
  const int64_t left = p.window_left >= 0 ? std::min(p.window_left, lk) : lk;
  const int64_t right = p.causal ? 0 : p.window_right >= 0 ? std::min(p.window_right, lk) : lk;
  return std::min(lk, left + right + 1);
}
// A band of at most this many keys cuts most of the backward's query
// blocks, whose products run over every key some row of the block sees:
// blocks of 32 rows then compute fewer masked pairs than blocks of 64
// (tuning table: backward block_q).
constexpr int64_t kNarrowBandKeys = 320;
bool narrow_band(const AttnParams& p) {
  return (p.causal || windowed(p)) && band_keys(p) <= kNarrowBandKeys;
}

// Lays out consecutive buffers, each rounded to kAlign bytes. Sizes saturate
// at kHuge (absurd shapes in a workspace query), which no allocation meets.
struct Carver {
  int64_t acc_bytes;
  int64_t at = 0;
  int64_t take(int64_t elems) {
    const int64_t off = at;
    at = sat_add(at, round_up(sat_mul(elems, acc_bytes), kAlign) / acc_bytes);
    return off;
  }
};

}  // namespace

int64_t split_length(const AttnParams& p) {
  const int64_t lk = std::max<int64_t>(p.seqlen_k, 1);
  if (p.seqlen_q > kSplitMaxRows) return lk;
  int64_t n = ceil_div(lk, kSplitKeys);
  const bool rows_side_by_side = p.heads_kv > 1 && p.k.head_stride == p.head_dim && p.v.head_stride == p.head_dim_v;
  const bool one_task = p.batch * p.heads_kv == 1;
  if ((rows_side_by_side && lk >= 2 * kSplitMinKeys) || (one_task && lk >= 2 * kSplitMinKeysOneHead))
    n = std::max<int64_t>(n, 2);
  // Split partials beyond 1 GiB (absurd batch * heads) are not worth it.
  const int64_t acc_bytes = p.dtype == DType::f64 ? 8 : 4;
  if (n == 1 || sat_mul({n, p.batch, p.heads_q, p.seqlen_q, p.head_dim_v + 1, acc_bytes}) > (int64_t{1} << 30)) return lk;
  return round_up(ceil_div(lk, n), kSplitAlign);
}

bool split_keys(const AttnParams& p) { return split_length(p) < p.seqlen_k; }

TilePlan plan_forward(const AttnParams& p, PairEngine engine) {
  const bool pairs = engine != PairEngine::none;
  TilePlan t;
  choose_blocks(p, t);
  // The forward keeps no per-key state, so a taller query tile halves the
  // K/V tile loads and transposes per FLOP: 256 rows, causal too since the
  // rows below the diagonal of a tile it cuts skip the masking. bf16 pairs up
  // to 1024 query rows take 128: twice the tasks for two threads, and from 4
  // blocks a head the held pair tiles (tuning table: forward block_q).
  if (std::max(p.head_dim, p.head_dim_v) <= 128)
    t.block_q = windowed(p) || (pairs && p.seqlen_q <= 1024) ? 128 : 256;
  // bf16 pairs: the products cost little beside what each key tile costs
  // per row (the softmax's row passes, O's rescale), so 256-key tiles, and
  // 128 under a window, whose band 256-key tiles overshoot (tuning table:
  // kMaxBlockK).
  if (pairs && std::max(p.head_dim, p.head_dim_v) <= 128) {
    t.block_k = windowed(p) ? 128 : kMaxBlockK;
    t.bk_pad = t.block_k;
  }
  t.group = p.heads_q / std::max<int64_t>(p.heads_kv, 1);
  t.head_rows = std::max<int64_t>(1, std::min(t.block_q / t.group, std::max<int64_t>(p.seqlen_q, 1)));
  t.block_q = t.group * t.head_rows;
  t.bq_pad = round_up(t.block_q, kPad);
  t.split_k = std::max<int64_t>(p.seqlen_k, 1);
  if (split_keys(p)) {
    t.split_k = split_length(p);
    t.splits = ceil_div(p.seqlen_k, t.split_k);
    t.kv_heads = p.heads_kv;
  }
  // Pair products and the softmax run a tile's whole width: no wider than
  // a task's keys (tuning table: short key runs).
  if (pairs) {
    t.block_k = std::min(t.block_k, round_up(t.split_k, kPad));
    t.bk_pad = t.block_k;
  }
  Carver c{t.acc_bytes};
  auto& f = t.fwd;
  const int64_t rows = t.kv_heads * t.block_q;  // q, o and row state for every head of a task
  const int64_t rows_pad = sat_mul(t.kv_heads, round_up(t.block_q, kPad));
  f.q = c.take(sat_mul(rows, t.dqk_pad));
  const int64_t km_ld = tile_ld(round_up(t.block_q, kPad));
  f.qt = c.take(sat_mul({t.kv_heads, km_ld, t.dqk_pad}));
  f.kt = c.take(t.dqk_pad * t.bk_pad);
  f.v = c.take(t.block_k * t.dv_pad);
  // Decode tiles across heads keep S of every head of a task, of at most
  // kWholeRows (<= 4) rows each (forward_heads.inl, heads_tile).
  const int64_t s_rows = std::max(round_up(t.block_q, kPad), sat_mul(t.kv_heads, std::min<int64_t>(t.block_q, 4)));
  f.s = c.take(std::max(sat_mul(s_rows, t.bk_pad), sat_mul(t.bk_pad, km_ld)));
  f.o = c.take(sat_mul(rows_pad, t.dv_pad));  // per K/V head: round_up(block_q, kPad) rows, or O^T [dv_pad, <= kPad]
  f.pv = c.take(sat_mul(rows, t.dv_pad));
  f.stage = c.take(t.bk_pad * t.dqk_pad);
  f.row_m = c.take(rows_pad);
  f.row_l = c.take(rows_pad);
  f.row_alpha = c.take(rows_pad);
  f.row_lo = c.take(sat_mul(t.block_q, 8) / t.acc_bytes);
  f.row_hi = c.take(sat_mul(t.block_q, 8) / t.acc_bytes);
  f.row_lo_f = c.take(round_up(t.block_q, kPad));
  f.row_hi_f = c.take(round_up(t.block_q, kPad));
  f.row_pos_f = c.take(round_up(t.block_q, kPad));
  f.row_slope_f = c.take(rows_pad);
  f.row_bias = c.take(sat_mul(rows_pad, 8) / t.acc_bytes);  // a pointer per row
  f.row_mask = c.take(sat_mul(rows_pad, 8) / t.acc_bytes);
  f.row_drop_x = c.take(ceil_div(sat_mul(round_up(t.block_q, kPad), 4), t.acc_bytes));
  f.row_drop_bh = c.take(ceil_div(sat_mul(rows_pad, 4), t.acc_bytes));
  // Pair tiles kept across query blocks (ForwardScratch::pair_tiles), where
  // a thread takes at least two blocks of a head in a row (tuning table:
  // kPairCacheBytes).
  if (pairs && ceil_div(p.seqlen_q, t.head_rows) >= 2 * t.threads) {
    f.pair_slot = t.dqk_pad / 2 * t.bk_pad + ceil_div(t.block_k, 2) * t.dv_pad;
    const int64_t tiles = sat_mul(t.kv_heads, ceil_div(t.split_k, t.block_k));
    f.pair_slots = std::min(tiles, kPairCacheBytes / (f.pair_slot * t.acc_bytes));
    f.pair_tag = c.take(3 * 8 / t.acc_bytes);
    f.pair_ready = c.take(ceil_div(f.pair_slots, t.acc_bytes));
    f.pair_tiles = c.take(sat_mul(f.pair_slots, f.pair_slot));
  }
  f.total = c.at;
  t.per_thread_bytes = round_up(sat_mul(f.total, t.acc_bytes), kAlign);
  t.shared_bytes = 0;
  if (t.splits > 1) {
    Carver s{t.acc_bytes};
    const int64_t part_rows = sat_mul({t.splits, p.batch, p.heads_q, p.seqlen_q});
    f.part_o = s.take(sat_mul(part_rows, p.head_dim_v));
    f.part_lse = s.take(part_rows);
    t.shared_bytes = sat_mul(s.at, t.acc_bytes);
  }
  return t;
}

namespace {

// Where the single pass keeps its dQ sums (DqSums, tiling.hpp): in the
// workspace while a thread's take at most kDqSumsInWorkspaceMiB, where
// they stay in L2; dq's own rows, a head's rows strided among the others'
// in [batch, seq, heads, dim], cost more (tuning table: dq sums). f32 and
// f64 storage have gradients of their own dtype, which hold the sums of a
// GQA group (a thread's sums are then its whole group's rows): in the
// workspace those put a call's peak memory above torch's flash SDPA's.
// bf16 storage may have f32 gradients, which then take the split form's
// workspace, so that backward_workspace_bytes, which sees no dq, reports
// what a call takes. FLASHGRAD_DQ_SUMS_WORKSPACE_MIB sets that size (0:
// out of the workspace at every size, but for f16's).
constexpr int64_t kDqSumsInWorkspaceMiB = 2;

DqSums dq_sums(const AttnParams& p, int64_t sums_bytes) {
  const char* env = std::getenv("FLASHGRAD_DQ_SUMS_WORKSPACE_MIB");
  const int64_t mib = env && *env ? std::strtoll(env, nullptr, 10) : kDqSumsInWorkspaceMiB;
  const bool own_dtype = p.dtype == DType::f32 || p.dtype == DType::f64;
  if (own_dtype && p.heads_q > p.heads_kv) return DqSums::in_dq;
  if (mib > 0 && sums_bytes <= (std::min<int64_t>(mib, int64_t{1} << 40) << 20)) return DqSums::workspace;
  if (own_dtype) return DqSums::in_dq;
  if (p.dtype == DType::bf16) return p.grad_dtype == DType::f32 ? DqSums::in_dq : DqSums::split_dq;
  return DqSums::workspace;
}

// The backward's key blocks, and one key run's dQ partial (the size of dQ in f32).
int64_t key_blocks(const AttnParams& p, const TilePlan& t) {
  return ceil_div(std::max<int64_t>(p.seqlen_k, 1), t.block_k);
}
int64_t run_partial_bytes(const AttnParams& p, const TilePlan& t) {
  return sat_mul({p.batch, p.heads_q, p.seqlen_q, t.dqk_pad, t.acc_bytes});
}

// Whether the backward takes the single pass (TilePlan::fused) and in how
// many key runs; returns where its dQ sums would be kept.
DqSums choose_single_pass(const AttnParams& p, TilePlan& t) {
  // Single pass when every thread gets whole (batch, K/V head) tasks and the
  // threads' f32 dQ sums stay within kFusedBytes, unless dq holds them;
  // dbias needs the dQ pass's ownership of its rows (tuning table:
  // kFusedBytes).
  constexpr int64_t kFusedBytes = int64_t{48} << 20;
  const int64_t tasks = p.batch * p.heads_kv;
  const int64_t dq_elems = sat_mul({p.heads_q / std::max<int64_t>(p.heads_kv, 1), p.seqlen_q, t.dqk_pad});
  // A single (batch, K/V head) pair (MQA at batch 1) cuts its keys into
  // runs: a power of two of them (thread counts mostly are), at most
  // kRuns and as many as let the runs' dQ partials (each the size of dQ in
  // f32) fit in kFusedBytes; from the shapes alone, so that the thread
  // count does not change the sums. Two or more pairs keep whole runs
  // (tuning table: kRuns).
  constexpr int64_t kRuns = 8;
  const int64_t nkb = key_blocks(p, t), part_bytes = run_partial_bytes(p, t);
  if (!p.dbias.data && tasks == 1) {
    const int64_t most = std::min({kRuns, nkb, kFusedBytes / std::max<int64_t>(part_bytes, 1)});
    while (t.key_chunks * 2 <= most) t.key_chunks *= 2;
  }
  const DqSums sums = dq_sums(p, sat_mul(dq_elems, t.acc_bytes));
  // bf16 storage counts its sums whatever dq's dtype, as the workspace query sees no dq.
  const bool dq_holds = sums == DqSums::in_dq && p.dtype != DType::bf16;
  const int64_t sums_bytes = dq_holds ? 0 : sat_mul(dq_elems, t.acc_bytes);
  t.fused = !p.dbias.data && (t.key_chunks > 1 || (sat_mul(sums_bytes, t.threads) <= kFusedBytes &&
                                                   (tasks % t.threads == 0 || tasks >= 4 * t.threads)));
  return sums;
}

// Key blocks a single pass's query block meets in turn: up to kKeyGroup, no
// more than a key run has, and one under a window, whose query blocks meet
// few of them (tuning table: kKeyGroup). The results do not depend on it.
int64_t key_group(const AttnParams& p, const TilePlan& t) {
  constexpr int64_t kKeyGroup = 4;
  static_assert(kKeyGroup <= kMaxKeyGroup, "stack buffers of backward_keys");
  if (!t.fused || windowed(p)) return 1;
  return std::min(kKeyGroup, ceil_div(key_blocks(p, t), t.key_chunks));
}

}  // namespace

TilePlan plan_backward(const AttnParams& p, PairEngine engine) {
  const bool pairs = engine != PairEngine::none;
  TilePlan t;
  choose_blocks(p, t);
  // Wider key tiles cut the Q and dO loads per FLOP of the dK/dV walk: 256
  // keys, causal too, since partial tiles run their products only over the
  // keys some row sees (seen_keys); 128 under a window (tuning table:
  // backward block_k).
  if (std::max(p.head_dim, p.head_dim_v) <= 128) {
    t.block_k = windowed(p) ? 128 : 256;
    t.bk_pad = t.block_k;
    // AMX's dK/dV products load and store their accumulator tiles once
    // per query block: 128 rows halve that (tuning table: backward block_q).
    if (engine == PairEngine::amx) {
      t.block_q = 128;
      t.bq_pad = round_up(t.block_q, kPad);
    }
  }
  if (engine != PairEngine::amx && narrow_band(p)) {
    t.block_q = std::min<int64_t>(t.block_q, 32);
    t.bq_pad = round_up(t.block_q, kPad);
  }
  // Key tiles are laid out and zeroed over their whole width: no wider than
  // the keys (tuning table: short key runs).
  t.block_k = std::min(t.block_k, round_up(std::max<int64_t>(p.seqlen_k, 1), kPad));
  t.bk_pad = round_up(t.block_k, kPad);
  Carver c{t.acc_bytes};
  auto& g = t.bwd;
  const int64_t bq = t.block_q, bk = t.block_k;
  const int64_t bkp = t.bk_pad;
  t.bk_ld = tile_ld(bkp);
  // A key block's tiles and accumulators first, key_group slots of them.
  g.k = c.take(bkp * t.dqk_pad);
  g.kt = c.take(t.dqk_pad * t.bk_ld);
  g.vt = c.take(t.dv_pad * t.bk_ld);
  g.acc_a = c.take(std::max(bk, bq) * t.dqk_pad);
  g.acc_b = c.take(bk * t.dv_pad);
  g.key_slot = c.at;
  const DqSums sums = choose_single_pass(p, t);
  t.key_group = key_group(p, t);
  c.take(sat_mul(t.key_group - 1, g.key_slot));
  g.q = c.take(bq * t.dqk_pad);
  g.dout = c.take(bq * t.dv_pad);
  g.s = c.take(bq * t.bk_ld);
  g.dp = c.take(bq * t.bk_ld);
  g.t = c.take(bq * t.bk_ld);
  g.tmp = c.take(std::max(bkp, bq) * std::max(t.dqk_pad, t.dv_pad));
  g.row_a = c.take(bq);
  g.row_b = c.take(bq);
  g.row_lo = c.take(bq * 8 / t.acc_bytes);
  g.row_hi = c.take(bq * 8 / t.acc_bytes);
  if (pairs) {
    const int64_t bq_pairs = round_up(bq, kPad);
    g.q_pairs = c.take(bq_pairs * t.dqk_pad / 2);
    g.dout_pairs = c.take(bq_pairs * t.dv_pad / 2);
    g.pairs = c.take(bq_pairs * t.bk_ld);
  }
  if (t.fused && t.key_chunks == 1) {
    const int64_t dq_elems = sat_mul({p.heads_q / std::max<int64_t>(p.heads_kv, 1), p.seqlen_q, t.dqk_pad});
    t.dq_sums = sums;
    if (t.dq_sums == DqSums::workspace) g.dq_acc = c.take(dq_elems);
    else if (p.dtype == DType::bf16) g.dq_acc = c.take(ceil_div(dq_elems * 2, t.acc_bytes));
    if (t.dq_sums != DqSums::workspace) g.dq_stage = c.take(bq * t.dqk_pad);
  }
  // Held q and dO pairs pay from 4 key blocks on, where each query block
  // meets one key block at a time (tuning table: kHeldQueryBytes).
  if (t.fused && pairs && t.key_group == 1 && ceil_div(key_blocks(p, t), t.key_chunks) >= 4) {
    const int64_t bq_pairs = round_up(bq, kPad), mh = round_up(ceil_div(bq, 2), 16);
    g.held_slot = bq_pairs * (t.dqk_pad + t.dv_pad) / 2 + mh * (t.dqk_pad + t.dv_pad);
    const int64_t blocks = sat_mul(p.heads_q / std::max<int64_t>(p.heads_kv, 1), ceil_div(p.seqlen_q, bq));
    g.held_slots = std::min(blocks, kHeldQueryBytes / (g.held_slot * t.acc_bytes));
    g.held_ready = c.take(ceil_div(g.held_slots, t.acc_bytes));
    g.held_q = c.take(sat_mul(g.held_slots, g.held_slot));
  }
  g.total = c.at;
  t.per_thread_bytes = round_up(sat_mul(g.total, t.acc_bytes), kAlign);
  // delta [batch, heads_q, seqlen_q] and one dsinks partial per (batch, head, query block).
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  const int64_t blocks = p.batch * p.heads_q * ceil_div(p.seqlen_q, t.block_q);
  t.shared_bytes = round_up(rows * t.acc_bytes, kAlign) + round_up(blocks * 8, kAlign);
  if (t.key_chunks > 1)
    t.shared_bytes += sat_mul(t.key_chunks, run_partial_bytes(p, t));
  return t;
}

}  // namespace flashgrad
