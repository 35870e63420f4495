// The tile routines of src/cpu/ (the tile product, the softmax rows, the
// softcap, the register-block transpose) for each ISA, behind function pointers, so that
// the micro-benchmarks (micro.cpp) and `flashgrad-lab roofline` can time each
// ISA's copy on its own. Each tile_ops_<isa>.cpp compiles the same sources the
// kernels use (vec_<isa>.inl, vec.inl, rows.inl) with that ISA's target.
#pragma once

#include <cstdint>

#include "dispatch.hpp"

namespace flashgrad::bench {

struct TileOps {
  Isa isa;
  const char* name;
  int64_t lanes;       ///< f32 lanes of the ISA's vector layer
  int64_t block_rows;  ///< rows of the tile product's register block
  int64_t block_cols;  ///< columns of that block; gemm_nn's n must be a multiple

  // c [m, n] (row stride ldc) = A [m, k] * b [k, n] (row stride ldb), where
  // A(r, p) = a[r * a_rs + p * a_cs]: a_rs = lda, a_cs = 1 for a row-major A,
  // a_rs = 1, a_cs = lda for the transposed view the backward uses.
  void (*gemm_nn)(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
                  const float* b, int64_t ldb, float* c, int64_t ldc);
  // One register block: c [block_rows, block_cols] = A [block_rows, k] * b [k, block_cols].
  void (*gemm_block)(int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb,
                     float* c, int64_t ldc);
  // s[j] = exp(s[j] - m) for j < n (a multiple of lanes); returns the sum.
  float (*exp_row)(float* s, int64_t n, float m);
  // max(init, s[0..n)).
  float (*row_max)(const float* s, int64_t n, float init);
  // p = exp(s - lse) into s, dS = p * (dp - delta) into dp.
  void (*grad_row)(float* s, float* dp, int64_t n, float lse, float delta);
  // s[j] = softcap * tanh(s[j] / softcap) and t[j] = the tanh, for j < n (any n).
  void (*softcap_row)(float* s, int64_t n, float softcap, float* t);
  // Dropout on row i of a score tile: x[j] = 0 where Philox drops (i, j) at
  // probability p, for j < n (any n), as the kernels decide it.
  void (*dropout_row)(float* x, int64_t n, int64_t i, float p);
  // dst [cols, rows] (row stride ldd) = transpose of src [rows, cols] (row stride lds);
  // rows and cols multiples of 16.
  void (*transpose)(int64_t rows, int64_t cols, const float* src, int64_t lds, float* dst, int64_t ldd);
  // dst[0..n) = src[0..n) rounded to bf16 bits, as the kernels store bf16 results (store_row).
  void (*store_bf16)(const float* src, int64_t n, uint16_t* dst);
};

// The routines of an ISA this CPU and build support; throws flashgrad::Error otherwise.
const TileOps& tile_ops(Isa isa);

// A bf16 pair product: c [m, n] (f32, row stride ldc) = A B, A [m, kp] and
// B [kp, n] 32-bit words each holding two bf16, the lower-indexed element
// low in both (lda, ldb in words; n a multiple of 32, kp of 16).
using PairGemm = void (*)(int64_t m, int64_t n, int64_t kp, const uint32_t* a, int64_t lda, const uint32_t* b,
                          int64_t ldb, float* c, int64_t ldc);
struct PairEngine {
  const char* isa = nullptr;     ///< the path whose product this is: "amx" or "avx512bf16"
  const char* kernel = nullptr;  ///< its name in src/cpu/vec_avx512.inl
  PairGemm gemm = nullptr;
};
// The pair product the bf16 kernels of the ISA in use (kernels()) run on:
// AMX tiles (gemm_amx, docs/design.md "bf16 on AMX") on the amx path,
// AVX512_BF16 dot products (gemm_bf16) on the avx512bf16 path; no gemm on
// the others.
PairEngine pair_engine();

}  // namespace flashgrad::bench
