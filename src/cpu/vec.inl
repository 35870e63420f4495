// Storage conversion, exp and the tile products. Included inside a per-ISA
// namespace by kernels_<isa>.cpp, so every function here is compiled for that
// ISA and has no linkage to the other ISAs' copies.

#include "vec_convert.inl"
#include "vec_math.inl"
#include "vec_products.inl"
#include "vec_rows.inl"

// acc[r, 0..n) = acc[r, 0..n) * row_scale[r] + add[r, 0..n) (row_scale null: 1).
template <typename Acc>
inline void scale_add(int64_t rows, int64_t n, const Acc* row_scale, const Acc* add, Acc* acc,
                      int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    Acc* a = acc + r * ld;
    const Acc* x = add + r * ld;
    if (row_scale) {
      const Acc sc = row_scale[r];
      for (int64_t c = 0; c < n; ++c) a[c] = a[c] * sc + x[c];
    } else {
      for (int64_t c = 0; c < n; ++c) a[c] += x[c];
    }
  }
}

// C[m, 0..n) = C * row_scale[r] + A B (row_scale null: C + A B), the
// product summed on its own before it meets C (blocked summation: running
// sums over every key or query row lose accuracy, docs/performance.md).
// tmp [m, n] is scratch for the paths that stage the product. (row_scale
// takes no part in deducing Acc, so that nullptr can stand for it.)
template <typename Acc>
inline void gemm_nn_acc(int64_t m, int64_t n, int64_t k, const Acc* a, int64_t a_rs, int64_t a_cs,
                        const Acc* b, int64_t ldb, Acc* c, int64_t ldc,
                        const typename std::remove_reference<Acc&>::type* row_scale, Acc* tmp) {
  gemm_nn(m, n, k, a, a_rs, a_cs, b, ldb, tmp, n);
  for (int64_t r = 0; r < m; ++r) scale_add(1, n, row_scale ? row_scale + r : nullptr, tmp + r * n, c + r * ldc, n);
}
#if FG_VEC_GEMM
inline void gemm_nn_acc(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
                        const float* b, int64_t ldb, float* c, int64_t ldc, const float* row_scale, float*) {
  gemm_f32<kGemmMr, kGemmVecs, Epi::add_rows>(m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, row_scale);
}
#endif

// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols.
template <typename Acc>
inline void transpose(int64_t rows, int64_t cols, const Acc* src, int64_t lds, Acc* dst,
                      int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}
#if FG_VEC_GEMM
// Whole register blocks; rows and cols must be multiples of kTransposeBlock.
// src may hold f32, bf16 or f16 (converted exactly on the way).
template <typename S>
inline void transpose_cvt(int64_t rows, int64_t cols, const S* src, int64_t lds, float* dst, int64_t ldd) {
  FG_DASSERT(rows % kTransposeBlock == 0 && cols % kTransposeBlock == 0);
  for (int64_t r = 0; r < rows; r += kTransposeBlock)
    for (int64_t c = 0; c < cols; c += kTransposeBlock)
      transpose_block(src + r * lds + c, lds, dst + c * ldd + r, ldd);
}
inline void transpose(int64_t rows, int64_t cols, const float* src, int64_t lds, float* dst, int64_t ldd) {
  transpose_cvt(rows, cols, src, lds, dst, ldd);
}
#endif
