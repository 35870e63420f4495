// The AMX path: the forward's tile products on AMX-BF16 tiles (AmxTiles).
// Included by forward.inl, in order.

// Rows [i, i + rows) of a tile, which its ranges cut or not.
struct RowBlock {
  int64_t i, rows;
  bool cut;
};

#if FG_AMX
// bf16 storage on AMX-BF16 tiles (kernels_amx.cpp): Bf16DotTiles' layouts,
// both products on TDPBF16PS, whose sums differ from the f32 tiles' by
// rounding (vec_avx512.inl), so lse does too, by about an ulp of S. The tile
// registers are configured per task and released with it.
struct AmxTiles : Bf16DotTiles {
  const bool q_scaled;  // scale_on_q
  AmxTiles(const AttnParams& p, int64_t mq) : Bf16DotTiles(p, mq), q_scaled(scale_on_q(p)) { amx_configure(); }
  ~AmxTiles() { _tile_release(); }
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;
  // As Bf16DotTiles, with V's pair rows zero up to the 16-pair step the P V
  // product reads (stale rows would meet P's zeros: 0 * inf = NaN).
  void load_kv(const AttnParams& p, const TilePlan& plan, int64_t b, int64_t seq0, int64_t hk, int64_t nj,
               float* kt, float* v, float* stage) {
    load_pairs_t(p.k, b, seq0, hk, nj, p.head_dim, plan.bk_pad, plan.bk_pad, kt, stage);
    load_pair_rows(p.v, b, seq0, hk, nj, p.head_dim_v, round_up((nj + 1) / 2, int64_t{16}), plan.dv_pad,
                   reinterpret_cast<uint32_t*>(v));
  }
  // A power-of-two scale goes on q's pairs instead of on S: the products
  // and AMX's sums then scale exactly, and the pass over S that applied it
  // (the first read of S after the tile stores, ~9% of a d = 64 forward's
  // samples) goes. AmxBackward scales its q the same way, so S stays the
  // forward's bit for bit.
  static bool scale_on_q(const AttnParams& p) {
    int e = 0;
    return std::isnormal(p.scale) && std::frexp(p.scale, &e) == 0.5 && std::isnormal(static_cast<float>(p.scale));
  }
  // n pairs times scale, each half rounded back to bf16 (nearest even).
  static void scale_pairs(uint32_t* w, int64_t n, float scale) {
    for (int64_t x = 0; x < n; ++x) {
      const uint32_t hi = w[x] & 0xffff0000u, lo = w[x] << 16;
      float fh, fl;
      std::memcpy(&fh, &hi, 4);
      std::memcpy(&fl, &lo, 4);
      w[x] = uint32_t{bf16_from(fh * scale).bits} << 16 | bf16_from(fl * scale).bits;
    }
  }
  static void load_q(const Operand& q, int64_t b, int64_t seq0, int64_t h, int64_t n, int64_t d, int64_t ld,
                     float, float* dst) {
    Bf16DotTiles::load_q(q, b, seq0, h, n, d, ld, 1.0f, dst);
  }
  void scale_q(const AttnParams& p, int64_t rows, int64_t ld, float* q) const {
    if (scale_on_q(p)) scale_pairs(reinterpret_cast<uint32_t*>(q), rows * ld, static_cast<float>(p.scale));
  }
  // S = Q K^T and P V for the block of rows rb (at most 32) of a tile, S's
  // and P V's rows from the first of s and pv. On a tile the ranges cut
  // (rb.cut) the products run only over the keys the block's rows see, as
  // Bf16DotTiles' (keys_first, keys_seen). A score's sum runs over the head
  // dimension alone, so S keeps its bits; P V drops chunks of P that are all
  // 0, whose products added +-0 to the sums.
  struct KeySpan {
    int64_t first, end;  // keys [first, end) of the tile, multiples of 32
  };
  static KeySpan span(const RowBlock& rb, const int64_t* lo, const int64_t* hi, int64_t j0, int64_t nj, int64_t lds) {
    if (!rb.cut) return {0, lds};
    const int64_t end = round_up(keys_seen(hi, rb.i, rb.i + rb.rows, j0, nj), 32);
    return {std::min(end, keys_first(lo, hi, rb.i, rb.i + rb.rows, j0, nj)), end};
  }
  void qk_rows(const TilePlan& plan, const RowBlock& rb, const float* q, const float* kt, float scale, float* s,
               const int64_t* lo, const int64_t* hi, int64_t j0, int64_t nj) const {
    const int64_t lds = plan.bk_pad, ldq = plan.dqk_pad / 2;
    const KeySpan k = span(rb, lo, hi, j0, nj, lds);
    if (k.end == k.first) return;
    gemm_amx(rb.rows, k.end - k.first, ldq, reinterpret_cast<const uint32_t*>(q + rb.i * ldq), ldq,
             reinterpret_cast<const uint32_t*>(kt) + k.first, lds, s + k.first, lds);
    if (!q_scaled)
      for (int64_t r = 0; r < rb.rows; ++r)
        for (int64_t x = k.first; x < k.end; ++x) s[r * lds + x] *= scale;
  }
  // P's columns from nj on are exp(-inf) = 0.
  void pv_rows(const TilePlan& plan, const RowBlock& rb, int64_t nj, float* s, const float* v, float* pv,
               const int64_t* lo, const int64_t* hi, int64_t j0) const {
    const int64_t lds = plan.bk_pad, ldo = plan.dv_pad;
    const KeySpan k = span(rb, lo, hi, j0, nj, lds);
    const int64_t kp = round_up((std::min(k.end, nj) + 1) / 2, int64_t{16}), f = std::min(kp, k.first / 2);
    if (kp == f) {
      std::fill(pv, pv + rb.rows * ldo, 0.0f);
      return;
    }
    for (int64_t r = 0; r < rb.rows; ++r) round_bf16_pairs(s + r * lds, 2 * kp);
    gemm_amx(rb.rows, ldo, kp - f, reinterpret_cast<const uint32_t*>(s) + f, lds,
             reinterpret_cast<const uint32_t*>(v) + f * ldo, ldo, pv, ldo);
  }

  // Narrow tiles of 3 to 32 stacked query rows keys-major (forward_amx_narrow.inl).
  static bool k_in_place(const AttnParams& p, const TilePlan& plan) {
    return p.k.dim_stride == 1 && p.head_dim == plan.dqk_pad && p.k.seq_stride % 2 == 0;
  }
  void narrow(const AttnParams& p, const TilePlan& plan, const ColTile<float>& c) const;
};
template <>
constexpr bool kAmxTiles<AmxTiles> = true;
#endif
