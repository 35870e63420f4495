// The baseline the demo measures flashgrad against: attention computed the way
// an unfused framework computes it, with every score matrix materialized and
// the products done by OpenBLAS sgemm. f32 only; no dropout, bias or window.
//
// For each batch b and query head h (key/value head hk = h / (heads_q / heads_kv)):
//   forward   S = scale * Q K^T          [seqlen_q, seqlen_k]
//             P = softmax(S)             kept for backward, as autograd keeps it
//             out = P V
//   backward  dP = dout V^T
//             delta_i = sum_j P_ij dP_ij
//             dS = P * (dP - delta)      written over S's block, as a caching
//                                        allocator would hand S's block to dS
//             dq = scale * dS K,  dk = scale * dS^T Q,  dv = P^T dout
//             (dk, dv summed over the query heads that share hk)
// So three [batch, heads_q, seqlen_q, seqlen_k] f32 buffers (S/dS, P, dP) are
// alive at the peak: score_bytes().
#pragma once

#include <cstdint>
#include <memory>

#include "flashgrad/flashgrad.hpp"

namespace flashgrad::tools {

class NaiveAttention {
 public:
  // causal: bottom-right aligned, as in flashgrad. softmax_scale <= 0: 1/sqrt(head_dim).
  NaiveAttention(bool causal, double softmax_scale) : causal_(causal), scale_(softmax_scale) {}

  // q [batch, seqlen_q, heads_q, head_dim], k [batch, seqlen_k, heads_kv, head_dim],
  // v [batch, seqlen_k, heads_kv, head_dim_v], out [batch, seqlen_q, heads_q, head_dim_v];
  // all f32 with unit stride in the last dimension.
  void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out);

  // After forward() on the same q, k, v. dout has out's shape; dq, dk, dv those of q, k, v.
  void backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                const TensorView& dq, const TensorView& dk, const TensorView& dv);

  // Allocates and first-touches the score buffers for these shapes, so that
  // timed calls see warm memory, as they would from a caching allocator.
  void prepare(const TensorView& q, const TensorView& k, const TensorView& v);

  // Bytes of the score buffers this class keeps for one problem size (inline:
  // the demo predicts the baseline's memory without linking it).
  static constexpr int64_t score_bytes(int64_t batch, int64_t heads_q, int64_t seqlen_q, int64_t seqlen_k) {
    return 3 * batch * heads_q * seqlen_q * seqlen_k * static_cast<int64_t>(sizeof(float));
  }

 private:
  struct Dims {
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v;
  };
  Dims dims_of(const TensorView& q, const TensorView& k, const TensorView& v) const;
  void reserve(const Dims& d);
  float* block(float* buffer, int64_t b, int64_t h) const;
  int64_t visible_keys(int64_t i) const;  // keys 0 .. visible_keys(i) - 1 are attended
  void softmax_rows();
  void softmax_backward_rows();

  struct Free {
    void operator()(float* p) const;
  };
  using Floats = std::unique_ptr<float[], Free>;
  static Floats allocate(int64_t count);

  bool causal_;
  double scale_;
  Dims dims_{};
  int64_t capacity_ = 0;  // floats in each buffer
  Floats scores_, probs_, dprobs_;
};

}  // namespace flashgrad::tools
