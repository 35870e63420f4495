// The AMX-narrow path: narrow tiles of bf16 on AMX-BF16 tiles
// (AmxTiles::narrow). Included by forward.inl, in order.

#if FG_AMX
// Narrow tiles (3 to 32 stacked query rows, w = c.cols = 16 or 32) keys-major:
//   S^T [nj, w] = K Q^T   K's rows as A where they lie (contiguous bf16
//                         with d a multiple of kPad; else staged in c.kbuf),
//                         c.qt = Q^T as pairs [dqk_pad / 2, w]
//   O [w, dv_pad] = O * alpha + P V   P's rows as pairs from S^T (P^T's
//                         pairs in c.pbuf, P's after them), V's rows
//                         interleaved in c.vbuf
// with the softmax on S^T's columns (softmax_cols). Both operands of
// S^T hold pairs in memory order (the lower-indexed element low): AMX's
// result is the same for S and S^T and for either order within a pair
// (on the dev CPU, 0 of 25600 scores differed each way), so these scores
// are bit for bit the row path's and the backward's.
inline void AmxTiles::narrow(const AttnParams& p, const TilePlan& plan, const ColTile<float>& c) const {
  const int64_t dp = plan.dqk_pad / 2, dv = plan.dv_pad, nj = c.nj, w = c.cols, b = c.b, seq0 = c.seq0, hk = c.hk;
  const auto* qtv = reinterpret_cast<const uint32_t*>(c.qt);
  float *st = c.st, *o = c.o, *ptv = c.pbuf, *pp = c.pbuf + 16 * plan.bk_pad;
  const uint32_t* kr = reinterpret_cast<const uint32_t*>(c.kbuf);
  int64_t ldk = dp;
  if (k_in_place(p, plan)) {
    kr = reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(p.k.data) + row_offset(p.k, b, seq0, hk));
    ldk = p.k.seq_stride / 2;
  } else {
    auto* sw = reinterpret_cast<uint32_t*>(c.kbuf);
    for (int64_t r = 0; r < nj; ++r) {
      load_pairs(p.k, b, seq0 + r, hk, p.head_dim, dp, sw + r * dp);
      for (int64_t x = 0; x < dp; ++x) sw[r * dp + x] = sw[r * dp + x] << 16 | sw[r * dp + x] >> 16;
    }
  }
  gemm_amx(nj, w, dp, kr, ldk, qtv, w, st, w);
  const float scale = static_cast<float>(p.scale);
  if (!q_scaled)
    for (int64_t x = 0; x < nj * w; ++x) st[x] *= scale;
  softmax_cols(st, nj, w, w, c.m, c.l, c.alpha, c.lo, c.hi, static_cast<float>(c.j0));
  const int64_t kp = round_up((nj + 1) / 2, int64_t{16});
  auto* pt = reinterpret_cast<uint32_t*>(ptv);
  for (int64_t x = 0; x < kp; ++x) {
    if (2 * x >= nj) {
      std::memset(pt + x * w, 0, static_cast<size_t>(w) * 4);
      continue;
    }
    interleave_f32_rows(st + 2 * x * w, 2 * x + 1 < nj ? st + (2 * x + 1) * w : nullptr, w, pt + x * w);
  }
  transpose(kp, w, ptv, w, pp, kp);
  load_pair_rows(p.v, b, seq0, hk, nj, p.head_dim_v, kp, dv, reinterpret_cast<uint32_t*>(c.vbuf));
  const float* alpha = c.alpha;
  for (int64_t r = 0; r < w; ++r)
    for (int64_t x = 0; x < dv; ++x) o[r * dv + x] *= alpha[r];
  gemm_amx<true>(w, dv, kp, reinterpret_cast<const uint32_t*>(pp), kp, reinterpret_cast<const uint32_t*>(c.vbuf),
                 dv, o, dv);
}
#endif

// Q^T per K/V head as AmxTiles::narrow reads it: [dqk_pad / 2, qt_cols]
// pairs in memory order (the lower-indexed element low), zero past row mq.
template <typename T, typename Acc, typename Tiles>
void amx_narrow_q(ForwardTask<T, Acc, Tiles>& t) {
  const int64_t dp = t.plan.dqk_pad / 2, w = t.qt_cols, mq = t.mq, ldq = t.ldq;
  for (int64_t x = 0; x < t.nh; ++x) {
    const auto* qw = reinterpret_cast<const uint32_t*>(t.q + x * mq * ldq);
    auto* dst = reinterpret_cast<uint32_t*>(t.qt) + x * dp * w;
    for (int64_t c = 0; c < dp; ++c)
      for (int64_t r = 0; r < w; ++r) {
        const uint32_t pr = r < mq ? qw[r * ldq + c] : 0u;
        dst[c * w + r] = pr << 16 | pr >> 16;
      }
  }
}

// The AMX-narrow path's task: Q^T's pairs and the columns' bounds, then
// every tile narrow, K staged in stage, V's pairs in v, P's in kt.
template <typename T, typename Acc, typename Tiles>
void amx_narrow_task(ForwardTask<T, Acc, Tiles>& t) {
  if constexpr (kAmxTiles<Tiles>) {
    amx_narrow_q(t);
    column_bounds(t);
    const ScoreCols<Acc> plain;  // plain scores only (task_path)
    walk_tiles(t, [&](const TileAt& at) {
      ColTile<Acc> c = col_tile(t, plain, at);
      c.kbuf = t.stage, c.vbuf = t.v, c.pbuf = t.kt;
      t.tiles.narrow(t.p, t.plan, c);
    });
  }
  (void)t;
}
