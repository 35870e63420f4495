// Forward: one task per (batch, K/V heads, query block, key split). A task's
// tile stacks the same query rows of every query head of a K/V head's
// group, so each K/V tile is loaded once per group. Keys are visited in
// blocks with an online softmax, so no seqlen_q x seqlen_k buffer exists.
// Short queries split the keys (TilePlan::splits) and merge the splits'
// (out, lse) with merge_row in split order. A task (ForwardTask,
// forward_task.inl) runs one path (task_path, forward_paths.inl), each in a
// file of its own: the row paths (forward_rows.inl) on the Tiles policy's
// products (AccTiles everywhere, Bf16DotTiles for bf16 on AVX512_BF16, the
// calls dot_call takes, AmxTiles for bf16 on AMX-BF16), heads across
// (forward_heads.inl), keys-major (forward_keys_major.inl), narrow
// (forward_narrow.inl), narrow-dot (forward_narrow_dot.inl) and AMX-narrow
// (forward_amx_narrow.inl).

// The smallest page size: the hardware prefetchers stop at its boundaries,
// so rows this far apart each start a stream of their own.
constexpr int64_t kPageBytes = 4096;

template <typename Acc>
struct Slice {
  Acc* base;
  Acc* at(int64_t off) const { return base + off; }
  int64_t* idx(int64_t off) const { return reinterpret_cast<int64_t*>(base + off); }
};

// Loads rows [r0, r0 + n) of head h of operand o, times mul, as a row-major [n, pad] tile.
template <typename T, typename Acc>
void load_tile(const Operand& o, int64_t b, int64_t seq0, int64_t h, int64_t n, int64_t dim,
               int64_t pad, Acc* dst, Acc mul = Acc(1)) {
  const T* base = static_cast<const T*>(o.data);
  for (int64_t r = 0; r < n; ++r)
    load_row(base + row_offset(o, b, seq0 + r, h), o.dim_stride, dim, pad, dst + r * pad, mul);
}

// Rows [seq0, seq0 + n) of head h of o (dim elements each) into L2, one tile
// ahead of their loads. In [batch, seq, heads, dim] layouts each row of a
// head starts a new 4 KiB page at d = 128, where the hardware prefetchers
// stop, so without this the loads waited on L3.
// With to_l1, into L1 as well (prefetch_l1).
template <typename T>
void prefetch_rows(const Operand& o, int64_t b, int64_t seq0, int64_t h, int64_t n, int64_t dim, bool to_l1 = false) {
  if (o.dim_stride != 1) return;
  const char* base = reinterpret_cast<const char*>(static_cast<const T*>(o.data));
  const int64_t bytes = dim * static_cast<int64_t>(sizeof(T));
  for (int64_t r = 0; r < n; ++r) {
    const char* row = base + row_offset(o, b, seq0 + r, h) * static_cast<int64_t>(sizeof(T));
    for (int64_t x = 0; x < bytes; x += 64) to_l1 ? prefetch_l1(row + x) : prefetch_l2(row + x);
  }
}

// How many rows ahead a task's Q load (bf16 pairs) and its out store ask
// for the lines they read or write: their misses had 36% and 35% of
// forward_task's own samples in a causal bf16 forward (L = 2048, d = 128;
// tuning table: kRowsAhead).
constexpr int64_t kRowsAhead = 16;

// How many rows ahead the row paths' softmax asks L2 for a row's bias and
// mask strip. Rows of an [L, L] bias lie a power of two apart at the usual
// lengths, so a whole tile's strips fall into a few L2 sets, more lines
// than those sets hold (tuning table: bias and mask prefetch).
constexpr int64_t kInputRowsAhead = 16;

// Loads the same rows transposed: dst[c * ld + r] for c < round_up(dim, kPad),
// r < w (<= ld), zero where r >= n or c >= dim. Contiguous rows needing no padding
// are converted and transposed in register blocks straight from their place;
// the others, and the last n mod kTransposeBlock rows, are staged
// contiguously in stage ([w, round_up(dim, kPad)]) first, where scattered
// strided stores were slower (tuning table: load_tile_t).
template <typename T, typename Acc>
void load_tile_t(const Operand& o, int64_t b, int64_t seq0, int64_t h, int64_t n, int64_t dim,
                 int64_t w, int64_t ld, Acc* dst, Acc* stage) {
  const int64_t pad = round_up(dim, kPad);
  int64_t r0 = 0;
#if FG_VEC_GEMM
  if constexpr (std::is_same<Acc, float>::value) {
    if (o.dim_stride == 1 && dim == pad) {
      r0 = n / kTransposeBlock * kTransposeBlock;
      transpose_cvt(r0, pad, static_cast<const T*>(o.data) + row_offset(o, b, seq0, h), o.seq_stride, dst, ld);
    }
  }
#endif
  load_tile<T>(o, b, seq0 + r0, h, n - r0, dim, pad, stage);
  for (int64_t x = (n - r0) * pad; x < (w - r0) * pad; ++x) stage[x] = Acc(0);
  transpose(w - r0, pad, stage, pad, dst + r0, ld);
}

// The forward's two tile products and the tile layouts they read, in Acc
// (every ISA and dtype): S = scale (Q K^T), the scale applied as each score
// is stored (ScoreScale), K^T staged as an Acc tile,
// both products in gemm_nn. V is staged too, except for query tiles of at
// most kInPlaceRows rows (decode), where P V reads contiguous V rows where
// they lie (tuning table: kInPlaceRows). Where the ISA sets kWholeRows
// (avx2), tiles of up to that many rows read both K and V in place, whole
// rows at a time (below).
constexpr int64_t kInPlaceRows = 2;

// f(std::integral_constant<int, mq>) for 1 <= mq <= 4.
template <typename F>
void with_rows(int64_t mq, F f) {
  if (mq == 1) return f(std::integral_constant<int, 1>{});
  if (mq == 2) return f(std::integral_constant<int, 2>{});
  if (mq == 3) return f(std::integral_constant<int, 3>{});
  return f(std::integral_constant<int, 4>{});
}

#include "forward_cols.inl"
#include "forward_tiles.inl"
#include "forward_amx.inl"
#include "forward_paths.inl"
#include "forward_task.inl"
#include "forward_rows.inl"
#include "forward_heads.inl"
#include "forward_keys_major.inl"
#include "forward_narrow.inl"
#include "forward_narrow_dot.inl"
#include "forward_amx_narrow.inl"

// A forward task's place: batch b (-1: none), K/V heads from hk0, query
// block qb, key split.
struct TaskAt {
  int64_t b = -1, hk0 = 0, qb = 0, split = 0;
};

// One task: its state and Q (ForwardTask), its path's tiles, its rows'
// results; next, the task likely to follow on this thread, if any.
template <typename T, typename Acc, typename Tiles>
void forward_task(const AttnParams& p, const TilePlan& plan, const TaskAt& at, const TaskAt& next, Slice<Acc> ws,
                  Slice<Acc> shared) {
  const int64_t b = at.b;
  if (at.qb * plan.head_rows >= p.len_q(b)) return;  // an empty key range still finishes its rows: "no key"
  ForwardTask<T, Acc, Tiles> t(p, plan, b, at.hk0, at.qb, at.split, ws);
  const bool other_unit = next.b != b || next.hk0 != at.hk0 || next.split != at.split;
  if (next.b >= 0) t.aim_after(next.b, next.hk0, next.qb, next.split, other_unit);
  switch (t.path.kind) {
    case ForwardPath::heads_across: heads_across_task(t); break;
    case ForwardPath::keys_major: keys_major_task(t); break;
    case ForwardPath::narrow: narrow_task(t); break;
    case ForwardPath::narrow_dot: narrow_dot_task(t); break;
    case ForwardPath::amx_narrow: amx_narrow_task(t); break;
    case ForwardPath::rows:
    case ForwardPath::whole_rows:
    case ForwardPath::dot_rows:
    case ForwardPath::amx: rows_task(t); break;
  }
  finish_task(t, shared);
}

// Split keys: row (b, h, i) merges its splits in split order, then the sink.
template <typename T, typename Acc>
void merge_splits(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t h, Slice<Acc> ws,
                  Slice<Acc> shared) {
  const int64_t dv = p.head_dim_v;
  Acc* acc = ws.at(plan.fwd.o);
  const Acc zero = Acc(0);
  for (int64_t i = 0; i < p.len_q(b); ++i) {
    Acc lse = neg_inf<Acc>();
    for (int64_t sp = 0; sp < plan.splits; ++sp) {
      const int64_t row = ((sp * p.batch + b) * p.heads_q + h) * p.seqlen_q + i;
      merge_row(acc, 1, &lse, shared.at(plan.fwd.part_o) + row * dv, 1, shared.at(plan.fwd.part_lse)[row], dv);
    }
    if (lse == neg_inf<Acc>())
      for (int64_t c = 0; c < dv; ++c) acc[c] = Acc(0);
    if (p.sinks)  // the sink is one more key whose value row is zero
      merge_row(acc, 1, &lse, &zero, 0, static_cast<Acc>(p.sinks[h * p.sinks_stride]), dv);
    const int64_t q = p.q_start(b) + i;
    store_result<T>(p.out_dtype, acc, dv, p.out.data, row_offset(p.out, b, q, h), p.out.dim_stride, Acc(1));
    lse_store(p, row_offset(p.lse, b, q, h), static_cast<double>(lse));
  }
}

template <typename T, typename Acc, typename Tiles = AccTiles<T, Acc>>
void forward_impl(const AttnParams& p, const TilePlan& plan, void* workspace) {
  const int64_t nqb = ceil_div(p.seqlen_q, plan.head_rows);
  const int64_t per_thread = plan.per_thread_bytes / static_cast<int64_t>(sizeof(Acc));
  Acc* base = static_cast<Acc*>(workspace);
  const Slice<Acc> shared{base + per_thread * plan.threads};
  const int64_t splits = plan.splits;
  const int64_t head_runs = p.heads_kv / plan.kv_heads;
  // Threads claim tasks in order; under a causal mask later query blocks
  // see more keys, so each head's blocks go last to first and the short
  // ones even out where the threads finish.
  PairTileCache<Acc>::clear(plan, base, per_thread);
  // Where threads hold pair tiles and the (batch, K/V heads, split) units,
  // all of one size, divide evenly among them, a task takes a unit's query
  // blocks whole, so that one thread lays out each of the unit's K/V tiles
  // once; blocks claimed in turn had every thread lay out most of them.
  // Units of other counts or sizes keep the blocks, which even out where
  // whole units would leave a thread one unit behind.
  const int64_t units = p.batch * head_runs * splits;
  const bool whole = plan.fwd.pair_slots > 0 && units % plan.threads == 0 && !p.cu_seqlens_q && !p.cu_seqlens_k;
  const auto place = [&](int64_t unit, int64_t qb) {
    const int64_t bh = unit / splits;
    return TaskAt{bh / head_runs, bh % head_runs * plan.kv_heads, qb, unit % splits};
  };
  const auto run = [&](const TaskAt& at, const TaskAt& next, int thread) {
    forward_task<T, Acc, Tiles>(p, plan, at, next, Slice<Acc>{base + thread * per_thread}, shared);
  };
  // A task asks for the Q rows of the task its thread likely takes next,
  // and for its first K/V tile where that is another unit's: the unit's
  // next query block, or the unit plan.threads on, as threads claim tasks
  // in turn. Short sequences read every row once and waited on memory for
  // them (tuning table: next task's rows).
  const auto next_of = [&](int64_t unit, int64_t qb) {
    if (qb > 0) return place(unit, qb - 1);
    return unit + plan.threads < units ? place(unit + plan.threads, nqb - 1) : TaskAt{};
  };
  if (whole) {
    parallel_for(units, plan.threads, [&](int64_t unit, int thread) {
      for (int64_t qb = nqb - 1; qb >= 0; --qb) run(place(unit, qb), next_of(unit, qb), thread);
    });
  } else {
    parallel_for(units * nqb, plan.threads, [&](int64_t task, int thread) {
      const int64_t unit = task / splits / nqb * splits + task % splits, qb = nqb - 1 - task / splits % nqb;
      run(place(unit, qb), next_of(unit, qb), thread);
    });
  }
  if (splits == 1) return;
  parallel_for(p.batch * p.heads_q, plan.threads, [&](int64_t task, int thread) {
    merge_splits<T, Acc>(p, plan, task / p.heads_q, task % p.heads_q, Slice<Acc>{base + thread * per_thread}, shared);
  });
}
