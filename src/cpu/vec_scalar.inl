// The portable layer: one lane. The row loops in rows.inl run on it as
// written; the tile product uses the generic form in vec.inl, which the
// compiler vectorizes as far as the target allows.
#define FG_VEC_GEMM 0
constexpr bool kVecGemm = false;  // FG_VEC_GEMM for if constexpr
#define FG_SCALAR_VEXP 1
using VecF = float;
constexpr int64_t kLanes = 1;
constexpr int64_t kWholeRows = 0;  // no whole-row products (vec_rows.inl)
inline VecF vzero() { return 0.0f; }
inline VecF vload(const float* p) { return *p; }
inline void vstore(float* p, VecF v) { *p = v; }
inline VecF vbroadcast(float x) { return x; }
inline VecF vfma(VecF a, VecF b, VecF c) { return a * b + c; }
inline VecF vadd(VecF a, VecF b) { return a + b; }
inline VecF vsub(VecF a, VecF b) { return a - b; }
inline VecF vmul(VecF a, VecF b) { return a * b; }
inline VecF vmax(VecF a, VecF b) { return a > b ? a : b; }
inline float vreduce_add(VecF v) { return v; }
inline float vreduce_max(VecF v) { return v; }
inline VecF vzero_if_neg_inf(VecF v) { return v == -std::numeric_limits<float>::infinity() ? 0.0f : v; }
inline VecF vload_as(const float* p) { return *p; }
constexpr int64_t kTransposeBlock = 1;
inline void transpose_block(const float* src, int64_t, float* dst, int64_t) { *dst = *src; }
