#include "naive_blas.hpp"

#include <cblas.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

namespace flashgrad::tools {
namespace {

// The start of head h of batch b in a [batch, seq, heads, dim] view; rows are
// view.strides[1] apart, which is the leading dimension sgemm takes.
float* head(const TensorView& t, int64_t b, int64_t h) {
  return static_cast<float*>(t.data) + b * t.strides[0] + h * t.strides[2];
}

int ld(const TensorView& t) { return static_cast<int>(t.strides[1]); }

void require(bool ok, const char* arg, const std::string& expected) {
  if (!ok) throw Error(std::string("NaiveAttention: argument '") + arg + "': expected " + expected);
}

void require_layout(const TensorView& t, const char* arg) {
  require(t.dtype == DType::f32 && t.ndim == 4 && t.strides[3] == 1 && t.data != nullptr, arg,
          "a 4-d f32 tensor with unit stride in its last dimension");
}

void require_shape(const TensorView& t, const char* arg, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  require_layout(t, arg);
  require(t.shape[0] == d0 && t.shape[1] == d1 && t.shape[2] == d2 && t.shape[3] == d3, arg,
          "shape [" + std::to_string(d0) + ", " + std::to_string(d1) + ", " + std::to_string(d2) + ", " +
              std::to_string(d3) + "]");
}

void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, double alpha,
          const float* a, int lda, const float* b, int ldb, double beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              static_cast<float>(alpha), a, lda, b, ldb, static_cast<float>(beta), c, ldc);
}

// A framework's softmax is vectorized, exp included; so is this one (the file
// is built with -ffast-math, which lets GCC call glibc's vector expf, and the
// clones pick the widest the CPU has). No infinity is involved: masked keys
// are outside [0, visible) rather than set to -inf.
#if defined(__x86_64__)
#define FG_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FG_VECTOR_CLONES
#endif

// p[0, len) = softmax of s[0, visible), zero past it.
FG_VECTOR_CLONES void softmax_row(const float* s, float* p, int64_t visible, int64_t len) {
  float top = visible > 0 ? s[0] : 0.0f;
  for (int64_t j = 1; j < visible; ++j) top = std::max(top, s[j]);
  float sum = 0;
  for (int64_t j = 0; j < visible; ++j) {
    p[j] = std::exp(s[j] - top);
    sum += p[j];
  }
  const float inv = visible > 0 ? 1.0f / sum : 0.0f;
  for (int64_t j = 0; j < visible; ++j) p[j] *= inv;
  for (int64_t j = visible; j < len; ++j) p[j] = 0.0f;
}

// ds = p * (dp - delta), delta = sum_j p_j dp_j.
FG_VECTOR_CLONES void softmax_backward_row(const float* p, const float* dp, float* ds, int64_t len) {
  float delta = 0;
  for (int64_t j = 0; j < len; ++j) delta += p[j] * dp[j];
  for (int64_t j = 0; j < len; ++j) ds[j] = p[j] * (dp[j] - delta);
}

}  // namespace

NaiveAttention::Dims NaiveAttention::dims_of(const TensorView& q, const TensorView& k,
                                             const TensorView& v) const {
  require_layout(q, "q");
  require_layout(k, "k");
  require_layout(v, "v");
  Dims d{q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3]};
  require(d.seqlen_q > 0 && d.seqlen_k > 0, "q/k", "non-empty sequences");
  require(d.heads_q % d.heads_kv == 0, "heads_kv", "a divisor of heads_q");
  require(k.shape[0] == d.batch && v.shape[0] == d.batch && v.shape[1] == d.seqlen_k &&
              v.shape[2] == d.heads_kv && k.shape[3] == d.head_dim,
          "k/v", "shapes matching q");
  return d;
}

void NaiveAttention::reserve(const Dims& d) {
  dims_ = d;
  const int64_t need = d.batch * d.heads_q * d.seqlen_q * d.seqlen_k;
  if (need <= capacity_) return;
  scores_.reset();
  probs_.reset();
  dprobs_.reset();
  scores_ = allocate(need);
  probs_ = allocate(need);
  dprobs_ = allocate(need);
  capacity_ = need;
}

void NaiveAttention::Free::operator()(float* p) const { std::free(p); }

// Gigabytes of scores in 4 KiB pages cost a million page faults to first
// touch; transparent huge pages cut that to a few thousand. This only helps
// the baseline (its timed calls never fault), and keeps the demo short.
NaiveAttention::Floats NaiveAttention::allocate(int64_t count) {
  constexpr int64_t kHugePage = int64_t{2} << 20;
  const int64_t bytes = (count * static_cast<int64_t>(sizeof(float)) + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(static_cast<size_t>(kHugePage), static_cast<size_t>(bytes));
  if (!p)
    throw Error("NaiveAttention: cannot allocate " + std::to_string(bytes) + " bytes of scores",
                Error::Code::out_of_memory);
  madvise(p, static_cast<size_t>(bytes), MADV_HUGEPAGE);  // advice only: failure is harmless
  return Floats(static_cast<float*>(p));
}

void NaiveAttention::prepare(const TensorView& q, const TensorView& k, const TensorView& v) {
  reserve(dims_of(q, k, v));
  for (float* buffer : {scores_.get(), probs_.get(), dprobs_.get()}) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < capacity_; ++i) buffer[i] = 0.0f;
  }
}

float* NaiveAttention::block(float* buffer, int64_t b, int64_t h) const {
  return buffer + (b * dims_.heads_q + h) * dims_.seqlen_q * dims_.seqlen_k;
}

int64_t NaiveAttention::visible_keys(int64_t i) const {
  if (!causal_) return dims_.seqlen_k;
  return std::clamp<int64_t>(i + dims_.seqlen_k - dims_.seqlen_q + 1, 0, dims_.seqlen_k);
}

void NaiveAttention::softmax_rows() {
  const int64_t rows = dims_.batch * dims_.heads_q * dims_.seqlen_q, lk = dims_.seqlen_k;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    softmax_row(scores_.get() + r * lk, probs_.get() + r * lk, visible_keys(r % dims_.seqlen_q), lk);
}

void NaiveAttention::softmax_backward_rows() {
  const int64_t rows = dims_.batch * dims_.heads_q * dims_.seqlen_q, lk = dims_.seqlen_k;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    softmax_backward_row(probs_.get() + r * lk, dprobs_.get() + r * lk, scores_.get() + r * lk, lk);
}

void NaiveAttention::forward(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out) {
  const Dims d = dims_of(q, k, v);
  require_shape(out, "out", d.batch, d.seqlen_q, d.heads_q, d.head_dim_v);
  reserve(d);
  const double scale = scale_ > 0 ? scale_ : 1.0 / std::sqrt(static_cast<double>(d.head_dim));
  const int64_t group = d.heads_q / d.heads_kv;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads_q; ++h)
      gemm(CblasNoTrans, CblasTrans, d.seqlen_q, d.seqlen_k, d.head_dim, scale, head(q, b, h), ld(q),
           head(k, b, h / group), ld(k), 0.0, block(scores_.get(), b, h), static_cast<int>(d.seqlen_k));
  softmax_rows();
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads_q; ++h)
      gemm(CblasNoTrans, CblasNoTrans, d.seqlen_q, d.head_dim_v, d.seqlen_k, 1.0, block(probs_.get(), b, h),
           static_cast<int>(d.seqlen_k), head(v, b, h / group), ld(v), 0.0, head(out, b, h), ld(out));
}

void NaiveAttention::backward(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& dout, const TensorView& dq, const TensorView& dk,
                              const TensorView& dv) {
  const Dims d = dims_of(q, k, v);
  require_shape(dout, "dout", d.batch, d.seqlen_q, d.heads_q, d.head_dim_v);
  require_shape(dq, "dq", d.batch, d.seqlen_q, d.heads_q, d.head_dim);
  require_shape(dk, "dk", d.batch, d.seqlen_k, d.heads_kv, d.head_dim);
  require_shape(dv, "dv", d.batch, d.seqlen_k, d.heads_kv, d.head_dim_v);
  require(capacity_ > 0 && d.batch == dims_.batch && d.seqlen_q == dims_.seqlen_q &&
              d.seqlen_k == dims_.seqlen_k && d.heads_q == dims_.heads_q,
          "q", "the shapes of the last forward() call");
  const double scale = scale_ > 0 ? scale_ : 1.0 / std::sqrt(static_cast<double>(d.head_dim));
  const int64_t group = d.heads_q / d.heads_kv;
  const int lk = static_cast<int>(d.seqlen_k);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads_q; ++h)
      gemm(CblasNoTrans, CblasTrans, d.seqlen_q, d.seqlen_k, d.head_dim_v, 1.0, head(dout, b, h), ld(dout),
           head(v, b, h / group), ld(v), 0.0, block(dprobs_.get(), b, h), lk);
  softmax_backward_rows();
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads_q; ++h) {
      const float* ds = block(scores_.get(), b, h);
      const float* p = block(probs_.get(), b, h);
      const int64_t hk = h / group;
      const double beta = h % group == 0 ? 0.0 : 1.0;  // the first head of a group overwrites
      gemm(CblasNoTrans, CblasNoTrans, d.seqlen_q, d.head_dim, d.seqlen_k, scale, ds, lk, head(k, b, hk),
           ld(k), 0.0, head(dq, b, h), ld(dq));
      gemm(CblasTrans, CblasNoTrans, d.seqlen_k, d.head_dim, d.seqlen_q, scale, ds, lk, head(q, b, h), ld(q),
           beta, head(dk, b, hk), ld(dk));
      gemm(CblasTrans, CblasNoTrans, d.seqlen_k, d.head_dim_v, d.seqlen_q, 1.0, p, lk, head(dout, b, h),
           ld(dout), beta, head(dv, b, hk), ld(dv));
    }
  }
}

}  // namespace flashgrad::tools
