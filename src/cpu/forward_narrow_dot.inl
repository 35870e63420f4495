// The narrow-dot path: narrow tiles of bf16 on AVX512_BF16 dot products
// (Bf16DotTiles::narrow). Included by forward.inl, in order.

#if FG_BF16_DOT
// The lines of K or V (o, dim elements a row) that head c.x of a task's
// c.nh K/V heads asks L2 for during its block of `keys` keys from seq0:
// those of the block kNarrowDotAhead on. K's are asked for during
// each 16-key block's S^T, V's during the tile's P V: during S^T alone
// they came in bursts. Where the task's heads lie side by side in each row
// ([batch, seq, heads, dim]), head x takes rows x * keys / nh.. of that
// block whole, across every head, so that the heads together ask for it in
// memory order; a head's own rows alone, short pieces a row apart, kept the
// reads waiting (tuning table: narrow_dot_walk). A head's own rows
// otherwise, where they lie closer than a page apart (narrow_ahead).
inline LineWalk narrow_dot_walk(const AttnParams& p, const Operand& o, int64_t dim, const ColTile<float>& c,
                                int64_t seq0, int64_t keys) {
  const int64_t row_bytes = o.seq_stride * 2, span = dim * 2, b = c.b, hk = c.hk, x = c.x, nh = c.nh;
  if (seq0 + kNarrowDotAhead + keys > p.k_start(b) + p.len_k(b) || span % 64 != 0) return LineWalk{};
  const auto* base = static_cast<const char*>(o.data);
  const int64_t ahead = seq0 + kNarrowDotAhead;
  if (nh > 1 && o.head_stride == dim) {
    const int64_t r0 = x * keys / nh, r1 = (x + 1) * keys / nh;
    return LineWalk(base + row_offset(o, b, ahead + r0, hk - x) * 2, r1 - r0, nh * span, row_bytes);
  }
  if (row_bytes >= kPageBytes) return LineWalk{};
  return LineWalk(base + row_offset(o, b, ahead, hk) * 2, keys, span, row_bytes);
}

// A narrow tile of bf16 on AVX512_BF16 dot products, W = 16 Nv <= 32 query rows:
//   S^T [nj <= 64, W] = scale * K Q^T   16 keys at a time, K's rows as pairs
//                                       transposed into c.kbuf
//                                       (load_pairs_keys16), c.qt = Q^T as
//                                       pairs [dqk_pad / 2, W]
//   O^T [dv_pad, W] = O^T * alpha + V^T P^T   V's pair rows in c.vbuf
//                                       (interleave_bf16_rows), P^T's pairs
//                                       [nj / 2, W] in c.pbuf (interleave_f32_rows)
// with narrow_softmax between. S^T's sums are gemm_bf16's, so every score
// is the row path's and the backward's (PairBackward<DotProducts>) bit for
// bit; P is rounded to bf16 as the row path's is.
template <int Nv>
void narrow_dot_products(const AttnParams& p, const TilePlan& plan, const ColTile<float>& c) {
  constexpr int64_t W = Nv * kLanes;
  const int64_t nj = c.nj, seq0 = c.seq0;
  const auto* qtp = reinterpret_cast<const uint32_t*>(c.qt);
  auto *kt = reinterpret_cast<uint32_t*>(c.kbuf), *vp = reinterpret_cast<uint32_t*>(c.vbuf),
       *ptp = reinterpret_cast<uint32_t*>(c.pbuf);
  float* st = c.st;
  FG_DASSERT(nj <= kNarrowDotKeys && p.k.dim_stride == 1 && p.v.dim_stride == 1);
  const auto* kr = static_cast<const uint16_t*>(p.k.data) + row_offset(p.k, c.b, seq0, c.hk);
  for (int64_t u = 0; u < nj; u += 16) {
    load_pairs_keys16(kr + u * p.k.seq_stride, p.k.seq_stride, std::min<int64_t>(16, nj - u), p.head_dim, kt);
    LineWalk wk = narrow_dot_walk(p, p.k, p.head_dim, c, seq0 + u, 16), none;
    gemm_bf16_keys16<Nv>((p.head_dim + 1) / 2, kt, qtp, W, st + u * W, W, static_cast<float>(p.scale), wk, none);
    wk.rest();
  }
  narrow_softmax<Nv>(p, c);
  const int64_t kp = round_up(nj, int64_t{16}) / 2;  // P^T is 0 past key nj
  for (int64_t u = 0; u < kp; ++u) {
    if (2 * u >= nj) {
      std::memset(ptp + u * W, 0, W * 4);
      continue;
    }
    interleave_f32_rows(st + 2 * u * W, 2 * u + 1 < nj ? st + (2 * u + 1) * W : nullptr, W, ptp + u * W);
  }
  Bf16DotTiles::load_pair_rows(p.v, c.b, seq0, c.hk, nj, p.head_dim_v, kp, plan.dv_pad, vp);
  LineWalk wv = narrow_dot_walk(p, p.v, p.head_dim_v, c, seq0, nj);
  gemm_bf16_cols<Nv>(plan.dv_pad, kp, vp, plan.dv_pad, ptp, c.o, W, c.alpha, &wv);
  wv.rest();
}

inline void Bf16DotTiles::narrow(const AttnParams& p, const TilePlan& plan, const ColTile<float>& c) const {
  if (c.cols <= kLanes) return narrow_dot_products<1>(p, plan, c);
  FG_DASSERT(c.cols == 2 * kLanes);
  narrow_dot_products<2>(p, plan, c);
}
#endif

// The narrow-dot path's task: Q^T as pairs and the score columns
// (keys_major_setup), then every tile narrow, K's pairs in kt, V's in v
// and P^T's in stage.
template <typename T, typename Acc, typename Tiles>
void narrow_dot_task(ForwardTask<T, Acc, Tiles>& t) {
  if constexpr (kDotTiles<Tiles>) {
    const ScoreCols<Acc> cols = keys_major_setup(t);
    walk_tiles(t, [&](const TileAt& at) {
      ColTile<Acc> c = col_tile(t, cols, at);
      c.kbuf = t.kt, c.vbuf = t.v, c.pbuf = t.stage;
      t.tiles.narrow(t.p, t.plan, c);
    });
  }
  (void)t;
}
