// What decides a forward task's path (task_path, the one place it is
// chosen): the keys-major and narrow tiles' limits, heads across and
// outer; and the row bookkeeping every path shares (split results,
// finish_row). Included by forward.inl, in order.

// Keys-major score tiles: tiles (full, or cut by the causal and window
// ranges or a mask; with softcap, ALiBi, bias and dropout or not) of query tiles
// with at least kKeysMajorRows rows compute
// S^T = scale (K Q^T), with K's rows broadcast where they lie (f32) or from
// a converted copy, and run the online softmax on kLanes query rows at once
// (softmax_cols): no horizontal reductions, no K^T tile, no per-row loop.
// Each score is the same chain of FMAs over d in the same order as in
// Q K^T, scaled as it is stored, so it is bit for bit the score the backward recomputes.
// The other tiles take the row path (tuning table: kKeysMajorRows).
constexpr int64_t kKeysMajorRows = 32;

// Narrow tiles: query tiles of kNarrowMinRows <= mq <= kNarrowMaxRows rows
// (short queries beside long keys) run keys-major through both products,
// with the query rows across the lanes of one to four vectors (width W):
//   S^T [nj, W]  = scale (K Q^T)   K's elements broadcast where they lie
//   O^T [dv, W]  = O^T * alpha + V^T P^T   V's elements broadcast where they lie
// so neither K nor V is transposed or copied, and alpha scales O^T's columns.
// A 16-row tile's products as square tiles padded to 32 columns did half
// their FMAs on padding. Their rate hardly depends on mq, so fewer rows keep
// the row path (kNarrowMinRows, per ISA in vec_<isa>.inl). On AVX2 they run
// to 32 rows, three and four vectors wide, where the keys-major tiles copy
// 64-key K and V tiles for so few rows; beyond 32 rows they run in chunks
// of 32 (narrow_chunks) up to kNarrowMaxRows, each chunk through both
// products over the same K and V rows (tuning table: kNarrowMinRows,
// kNarrowMaxRows).
//
// Narrow tiles (of one vector of rows; wider ones: narrow_keys) step
// through the keys kNarrowVecKeys at a time (per ISA, vec_<isa>.inl;
// kNarrowKeys on the portable path, which runs none), every K/V head in
// turn. 16 keys read each 4 KiB page of a [batch, seq, heads, dim] K or V
// through soon after it was started: the hardware prefetchers follow
// that, where 64 keys left the reads waiting on DRAM (tuning table:
// kNarrowKeys).
constexpr int64_t kNarrowKeys = 16;

// Keys per narrow tile on bf16 dot products (narrow_dot_products): S^T in
// 16-key blocks, then one softmax step and one O^T update for all of them.
// 16 keys spent a third of the P V product's time loading, rescaling and
// storing O^T. The blocks ask for the next tile's rows (kNarrowDotAhead
// keys on): 32 keys on, into the tile itself, left the V rows of its second
// half waiting (tuning table: kNarrowDotKeys).
constexpr int64_t kNarrowDotKeys = 64;
constexpr int64_t kNarrowDotAhead = 64;

// Keys per narrow tile of w query rows (mq rounded up to kLanes): two
// vectors of rows or more step kNarrowWideKeys at a time, one vector
// kNarrowVecKeys (both per ISA in vec_<isa>.inl).
inline int64_t narrow_keys(int64_t w) {
#if FG_VEC_GEMM
  return w >= 2 * kLanes ? kNarrowWideKeys : kNarrowVecKeys;
#else
  (void)w;
  return kNarrowKeys;
#endif
}

// Scores that the softmax alone turns into P: no softcap, ALiBi, bias or dropout.
inline bool plain_scores(const AttnParams& p) {
  return p.softcap == 0 && !p.alibi && !p.bias.data && p.dropout_p == 0;
}

// Whether every ALiBi distance |i + shift - j| and the positions it comes
// from are integers f32 holds exactly (ScoreCols).
inline bool alibi_exact(const AttnParams& p) {
  const int64_t shift = p.in_block ? std::abs(p.block_total_k - p.block_total_q + p.block_q_offset - p.block_k_offset)
                                   : std::max(p.seqlen_q, p.seqlen_k);
  return shift + p.seqlen_q + p.seqlen_k < (int64_t{1} << 23);
}

template <typename T, typename Acc, typename Tiles>
bool keys_major_tiles(const AttnParams& p) {
  return kVecGemm && std::is_same<Acc, float>::value && std::is_same<Tiles, AccTiles<T, Acc>>::value &&
         (!p.alibi || alibi_exact(p));
}
template <typename T, typename Acc, typename Tiles>
bool keys_major_usable(const AttnParams& p, int64_t mq) {
  return mq >= kKeysMajorRows && keys_major_tiles<T, Acc, Tiles>(p);
}
// Narrow tiles in more than one chunk (mq > kNarrowWidth) only for a task
// that walks kNarrowChunkedMinKeys keys or more, where K and V come from
// memory: from cache the keys-major tiles' products run faster (tuning
// table: kNarrowChunkedMinKeys).
constexpr int64_t kNarrowChunkedMinKeys = 2048;

// keys: how many keys the task walks.
template <typename T, typename Acc, typename Tiles>
bool narrow_usable(const AttnParams& p, int64_t mq, int64_t keys) {
#if FG_VEC_GEMM
  if constexpr (kDotTiles<Tiles>)
    return mq >= kNarrowMinRows && mq <= std::min(kNarrowMaxRows, kNarrowWidth) && (!p.alibi || alibi_exact(p)) &&
           p.k.dim_stride == 1 && p.v.dim_stride == 1;
  return mq >= kNarrowMinRows && mq <= kNarrowMaxRows && (mq <= kNarrowWidth || keys >= kNarrowChunkedMinKeys) &&
         keys_major_tiles<T, Acc, Tiles>(p);
#else
  (void)p, (void)mq, (void)keys;
  return false;
#endif
}

// Whether keys-major tiles may take the tiles that the causal and window
// ranges or a mask cut: key indices stay exact in f32 (the ranges' cuts),
// and a mask's -inf come with the scores (ScoreCols).
inline bool ranges_exact(const AttnParams&, int64_t lk) { return lk < (int64_t{1} << 24); }

// Whether a task walks its K/V heads one after another, each through all
// its keys, instead of every head at each key tile: where a head's K and V
// rows are contiguous ([batch, heads, seq, dim]), their reads then stay one
// stream each, which the whole-row products' prefetch (AccTiles::set_ahead)
// follows across tiles. Results are the same either way. The order pays
// only with that prefetch (tuning table: heads_outer).
inline bool heads_outer(const AttnParams& p, int64_t nh) {
  return nh > 1 && p.k.dim_stride == 1 && p.v.dim_stride == 1 && p.k.seq_stride == p.head_dim &&
         p.v.seq_stride == p.head_dim_v;
}

// How many of a task's nh K/V heads each call of scores_heads and pv_heads
// takes (0: none, the task goes a head at a time): where the whole-row
// products read K and V in place and the heads' rows lie side by side
// ([batch, seq, heads, dim]), a divisor of kLanes of at least 2 heads, and
// at least the task's mq rows per head, so that Q's lanes (qx) fit in Q^T's
// space. A head at a time reads 512 bytes of each 4 KiB row (8 heads, d =
// 128, f32) per pass, where memory order lets the L2 streamer run ahead of
// the loads (tuning table: heads_across).
template <typename T, typename Acc>
int64_t heads_across(const AttnParams& p, const TilePlan& plan, const AccTiles<T, Acc>& tiles, int64_t nh,
                     int64_t mq) {
#if FG_TRANSPOSE_REGS
  if (!tiles.k_in_place || !tiles.v_in_place || mq > kWholeRows || heads_outer(p, nh)) return 0;
  if (p.k.head_stride != p.head_dim || p.v.head_stride != p.head_dim_v || p.head_dim_v % kLanes != 0) return 0;
  int64_t g = kLanes;  // the largest power of two dividing nh, at most kLanes
  while (nh % g != 0) g /= 2;
  // The lanes of a tile's scores (heads_tile) go to kt.
  const bool lanes_fit = mq * round_up(plan.block_k, kHeadsBlocks * kLanes / g) * g <= plan.dqk_pad * plan.bk_pad;
  return g >= 2 && g >= mq && lanes_fit ? g : 0;
#else
  (void)p, (void)plan, (void)tiles, (void)nh, (void)mq;
  return 0;
#endif
}

// Dropout's 1 / (1 - p) (1 without dropout). P's rows keep their values where
// kept (drop_row), and this factor scales what they sum into, out and dV,
// once per element instead of once per key, which rounded every kept P.
template <typename Acc>
Acc dropout_scale(const AttnParams& p) {
  return p.dropout_p > 0 ? static_cast<Acc>(1.0 / (1.0 - p.dropout_p)) : Acc(1);
}

// lse is f32, or f64 alongside f64 storage.
inline double lse_load(const AttnParams& p, int64_t off) {
  return p.lse_dtype == DType::f64 ? static_cast<const double*>(p.lse.data)[off]
                                   : static_cast<const float*>(p.lse.data)[off];
}
inline void lse_store(const AttnParams& p, int64_t off, double x) {
  if (p.lse_dtype == DType::f64)
    static_cast<double*>(p.lse.data)[off] = x;
  else
    static_cast<float*>(p.lse.data)[off] = static_cast<float>(x);
}

// Results (out, dq, dk, dv) hold the storage type T, or f32 when T is a 16-bit type.
template <typename T, typename Acc>
inline void store_result(DType dt, const Acc* src, int64_t n, void* base, int64_t off, int64_t stride,
                         Acc mul) {
  if (!std::is_same<T, float>::value && dt == DType::f32)
    store_row(src, n, static_cast<float*>(base) + off, stride, mul);
  else
    store_row(src, n, static_cast<T*>(base) + off, stride, mul);
}

// Which (head, row) stacked row r is: head hk * group + r / mqh, row i0 + r % mqh.
struct Stack {
  int64_t hk, group, i0, mqh;
  int64_t head(int64_t r) const { return hk * group + r / mqh; }
  int64_t row(int64_t r) const { return i0 + r % mqh; }
  int64_t rows() const { return group * mqh; }
};

// One split's result for stacked row r: out normalized over the split's keys
// and its lse (no sink), or, without splits, the final out and lse.
template <typename T, typename Acc>
void finish_row(const AttnParams& p, const TilePlan& plan, Slice<Acc> shared, int64_t b, int64_t h, int64_t i,
                int64_t split, Acc mx, Acc sum, const Acc* orow) {
  const int64_t dv = p.head_dim_v;
  const Acc keep_scale = dropout_scale<Acc>(p);
  if (plan.splits > 1) {
    const int64_t row = ((split * p.batch + b) * p.heads_q + h) * p.seqlen_q + i;
    Acc* po = shared.at(plan.fwd.part_o) + row * dv;
    for (int64_t c = 0; c < dv; ++c) po[c] = sum == Acc(0) ? Acc(0) : orow[c] * keep_scale / sum;
    shared.at(plan.fwd.part_lse)[row] = sum == Acc(0) ? neg_inf<Acc>() : mx + std::log(sum);
    return;
  }
  Acc ores = Acc(1);
  if (p.sinks) {
    // sink logit joins the denominator: rescale to the larger of the two maxima
    const Acc sk = static_cast<Acc>(p.sinks[h * p.sinks_stride]);
    const Acc mnew = sk > mx ? sk : mx;
    const Acc a = exp_acc(mx - mnew);
    sum = sum * a + exp_acc(sk - mnew);
    ores = a;
    mx = mnew;
  }
  // sum == 0 only when no key is visible: out = 0, lse = -inf (or the sink).
  const Acc mul = sum == Acc(0) ? Acc(0) : ores * keep_scale / sum;
  const Acc row_lse = sum == Acc(0) ? neg_inf<Acc>() : mx + std::log(sum);
  const int64_t q = p.q_start(b) + i;
  store_result<T>(p.out_dtype, orow, dv, p.out.data, row_offset(p.out, b, q, h), p.out.dim_stride, mul);
  lse_store(p, row_offset(p.lse, b, q, h), static_cast<double>(row_lse));
}

// Rows [seq0, seq0 + nj) of head h of o as f32 rows: where they lie when
// they are contiguous f32 (ld: o's row stride), else converted into stage
// ([nj, pad]).
template <typename T>
const float* rows_f32(const Operand& o, int64_t b, int64_t seq0, int64_t h, int64_t nj, int64_t dim, int64_t pad,
                      float* stage, int64_t& ld) {
  if (std::is_same<T, float>::value && o.dim_stride == 1) {
    ld = o.seq_stride;
    return reinterpret_cast<const float*>(static_cast<const T*>(o.data)) + row_offset(o, b, seq0, h);
  }
  load_tile<T>(o, b, seq0, h, nj, dim, pad, stage);
  ld = pad;
  return stage;
}

// A forward task's path: its tile routine (kind), chosen from the call, the
// task's mq stacked rows of each of its nh K/V heads and the keys it walks,
// and the facts that chose it.
struct TaskPath {
  ForwardPath kind = ForwardPath::rows;
  bool ranged = false;      ///< keys-major tiles may take tiles the ranges cut (ranges_exact)
  bool narrow = false;      ///< narrow tiles (narrow_usable), O^T kept
  bool keys_major = false;  ///< S^T = K Q^T tiles (narrow ones included)
  int64_t across = 0;       ///< heads per scores_heads call (heads_across), 0: none
  bool amx_narrow = false;  ///< AmxTiles::narrow
  bool heads_outer = false; ///< each K/V head through all its keys in turn
};

// Tiles the causal or window ranges cut take keys-major scores too
// (ranges_exact). Narrow tiles keep O^T, so a task takes them only where
// every tile can.
template <typename T, typename Acc, typename Tiles>
TaskPath task_path(const AttnParams& p, const TilePlan& plan, const Tiles& tiles, int64_t lk, int64_t mq,
                   int64_t keys, int64_t nh) {
  TaskPath t;
  t.ranged = ranges_exact(p, lk);
  t.narrow = t.ranged && narrow_usable<T, Acc, Tiles>(p, mq, keys);
  t.keys_major = t.narrow || keys_major_usable<T, Acc, Tiles>(p, mq);
  if constexpr (std::is_same<Tiles, AccTiles<T, Acc>>::value)
    if (!t.keys_major) t.across = heads_across(p, plan, tiles, nh, mq);
  if constexpr (kAmxTiles<Tiles>)
    t.amx_narrow = t.ranged && mq > kInPlaceRows && mq <= 2 * kLanes && plain_scores(p) && !p.mask.data;
  t.heads_outer = heads_outer(p, nh);
  if constexpr (kAmxTiles<Tiles>) {
    t.kind = t.amx_narrow ? ForwardPath::amx_narrow : ForwardPath::amx;
  } else if constexpr (kDotTiles<Tiles>) {
    t.kind = t.narrow ? ForwardPath::narrow_dot : ForwardPath::dot_rows;
  } else {
    t.kind = t.narrow       ? ForwardPath::narrow
             : t.keys_major ? ForwardPath::keys_major
             : t.across     ? ForwardPath::heads_across
             : tiles.k_in_place ? ForwardPath::whole_rows
                                : ForwardPath::rows;
  }
  (void)plan, (void)tiles;
  return t;
}

// The path of the call's first task: batch 0's first query block, its
// first key run (Plan::forward_path).
template <typename T, typename Acc, typename Tiles = AccTiles<T, Acc>>
ForwardChoice first_task_path(const AttnParams& p, const TilePlan& plan) {
  const int64_t lk = p.len_k(0), mq = plan.group * std::max<int64_t>(1, std::min(plan.head_rows, p.len_q(0)));
  const Tiles tiles(p, mq);
  const TaskPath t = task_path<T, Acc, Tiles>(p, plan, tiles, lk, mq, std::min(lk, plan.split_k), plan.kv_heads);
  ForwardChoice c;
  c.heads_outer = t.heads_outer;
  c.path = t.kind;
  return c;
}
