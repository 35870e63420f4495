// The TileOps table of one ISA. Included by tile_ops_<isa>.cpp inside
// namespace flashgrad::bench::<isa>, after vec_<isa>.inl, vec.inl, rows.inl and
// rng.inl.

namespace {

#if FG_VEC_GEMM
constexpr int64_t kBlockRows = kGemmMr, kBlockCols = kGemmVecs * kLanes;
void block_fn(int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb, float* c,
              int64_t ldc) {
  gemm_f32_block<kGemmMr, kGemmVecs, Epi::store, false, false>(k, a, a_rs, a_cs, b, ldb, c, ldc, nullptr, 0,
                                                               ScoreScale<float>{});
}
#else
// The generic gemm_nn in vec.inl works in 4 x 8 blocks.
constexpr int64_t kBlockRows = 4, kBlockCols = 8;
void block_fn(int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb, float* c,
              int64_t ldc) {
  gemm_block<float, 4, 8>(k, a, a_rs, a_cs, b, ldb, c, ldc);
}
#endif

void gemm_fn(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
             int64_t ldb, float* c, int64_t ldc) {
  gemm_nn(m, n, k, a, a_rs, a_cs, b, ldb, c, ldc);
}
float exp_fn(float* s, int64_t n, float m) { return exp_row(s, n, m); }
float max_fn(const float* s, int64_t n, float init) { return row_max(s, n, init); }
void grad_fn(float* s, float* dp, int64_t n, float lse, float delta) { grad_row(s, dp, n, lse, delta); }
void softcap_fn(float* s, int64_t n, float softcap, float* t) { softcap_row(s, n, softcap, t); }
void dropout_fn(float* x, int64_t n, int64_t i, float p) {
  Philox rng{0x2545F491u, 0x9E3779B9u, 0, 0, 0, 0, static_cast<uint32_t>(static_cast<double>(p) * 4294967296.0), true};
  uint8_t keep[256];
  for (int64_t j0 = 0; j0 < n; j0 += 256) {
    const int64_t m = std::min<int64_t>(256, n - j0);
    rng.keep_row(i, j0, m, keep);
    drop_row(keep, m, x + j0);
  }
}
void transpose_fn(int64_t rows, int64_t cols, const float* src, int64_t lds, float* dst, int64_t ldd) {
  transpose(rows, cols, src, lds, dst, ldd);
}

void store_bf16_fn(const float* src, int64_t n, uint16_t* dst) {
  store_row(src, n, reinterpret_cast<bf16_t*>(dst), 1, 1.0f);
}

}  // namespace

extern const TileOps table;
const TileOps table = {FG_ISA_ENUM, FG_ISA_NAME, kLanes,     kBlockRows, kBlockCols,   gemm_fn,
                       block_fn,    exp_fn,      max_fn,     grad_fn,    softcap_fn,   dropout_fn,
                       transpose_fn, store_bf16_fn};
