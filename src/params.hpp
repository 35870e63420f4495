// AttnParams: the only contract between the API layer and the kernels.
// Everything here has been validated by check.cpp; kernels only debug-assert.
// All strides are in elements of the operand's own dtype.
#pragma once

#include <cstdint>

#include "flashgrad/flashgrad.hpp"

namespace flashgrad {

// Row (b, i, h) of a [batch, seq, heads, dim] operand starts at
//   data + b * batch_stride + (seq_start(b) + i) * seq_stride + h * head_stride
// and its elements are dim_stride apart. Varlen operands have batch_stride 0.
struct Operand {
  void* data = nullptr;
  int64_t batch_stride = 0;
  int64_t seq_stride = 0;
  int64_t head_stride = 0;
  int64_t dim_stride = 1;
};

// A [batch, heads, rows, cols] operand with broadcast dims at stride 0.
struct Operand4 {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t stride[4] = {0, 0, 0, 0};
  int64_t batch = 0;  ///< 1 when broadcast over batch (used by dbias reduction)
  int64_t heads = 0;  ///< 1 when broadcast over heads
};

struct AttnParams {
  DType dtype = DType::f32;      ///< q, k, v, dout
  DType out_dtype = DType::f32;   ///< out: dtype, or f32 with bf16/f16 storage (f64 for the reference)
  DType grad_dtype = DType::f32;  ///< dq, dk, dv: likewise
  DType lse_dtype = DType::f32;  ///< f32 (or f64 with f64 storage)

  int64_t batch = 0;
  int64_t seqlen_q = 0;  ///< longest query sequence when varlen
  int64_t seqlen_k = 0;  ///< longest key sequence when varlen
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t head_dim = 0;
  int64_t head_dim_v = 0;

  const int32_t* cu_seqlens_q = nullptr;  ///< [batch + 1] or null
  const int32_t* cu_seqlens_k = nullptr;  ///< [batch + 1] or null

  Operand q, k, v;    ///< [batch, seqlen_{q,k,k}, heads_{q,kv,kv}, head_dim{,,_v}]
  Operand out, dout;  ///< [batch, seqlen_q, heads_q, head_dim_v]
  Operand dq, dk, dv; ///< shapes of q, k, v
  Operand lse;        ///< [batch, heads_q, seqlen_q] viewed as seq=i, head=h (dim unused)

  double scale = 1.0;
  double softcap = 0.0;
  bool causal = false;
  // This call is a block of a longer attention (Options::block): its query
  // row i is row q_offset + i of total_q rows, its key j is key k_offset + j of total_k.
  bool in_block = false;
  int64_t block_q_offset = 0, block_k_offset = 0, block_total_q = 0, block_total_k = 0;
  int64_t window_left = -1;
  int64_t window_right = -1;

  const float* alibi = nullptr;  ///< slope of (b, h) at alibi[b * alibi_batch_stride + h * alibi_head_stride]
  int64_t alibi_batch_stride = 0;
  int64_t alibi_head_stride = 0;

  Operand4 bias;   ///< data null when absent
  Operand4 mask;   ///< u8, data null when absent
  Operand4 dbias;  ///< f32 (or f64 with f64 storage), data null when not requested; zeroed by the API

  const float* sinks = nullptr;  ///< sinks[h * sinks_stride]
  int64_t sinks_stride = 0;
  void* dsinks = nullptr;  ///< f32 (or f64 with f64 storage; f64 for the reference) [heads_q]
  DType dsinks_dtype = DType::f32;
  int64_t dsinks_stride = 0;

  double dropout_p = 0.0;
  uint64_t seed = 0;
  uint64_t offset = 0;
  const uint8_t* keep = nullptr;  ///< reference only: explicit keep mask [batch, heads_q, seqlen_q, seqlen_k]

  int num_threads = 1;  ///< resolved, >= 1

  // Query/key range of sequence b inside the packed or batched operands.
  int64_t q_start(int64_t b) const { return cu_seqlens_q ? cu_seqlens_q[b] : 0; }
  int64_t k_start(int64_t b) const { return cu_seqlens_k ? cu_seqlens_k[b] : 0; }
  int64_t len_q(int64_t b) const { return cu_seqlens_q ? cu_seqlens_q[b + 1] - cu_seqlens_q[b] : seqlen_q; }
  int64_t len_k(int64_t b) const { return cu_seqlens_k ? cu_seqlens_k[b + 1] - cu_seqlens_k[b] : seqlen_k; }
  // Query i of sequence b sits at key index i + shift(b) (bottom-right alignment
  // of the whole attention), which causal, window and ALiBi compare against.
  int64_t shift(int64_t b) const {
    return in_block ? block_total_k - block_total_q + block_q_offset - block_k_offset : len_k(b) - len_q(b);
  }
  // Dropout draws the bit of (i, j) at (row0 + i, col0 + j) of the whole attention.
  int64_t rng_row0() const { return in_block ? block_q_offset : 0; }
  int64_t rng_col0() const { return in_block ? block_k_offset : 0; }
};

// flashgrad::merge: o_* [batch, seqlen, heads, dv] and lse_* [batch, heads, seqlen], all f32 or all f64.
struct MergeParams {
  DType dtype = DType::f32;
  int64_t batch = 0, seqlen = 0, heads = 0, dv = 0;
  Operand o_acc, o_part, lse_acc, lse_part;  // lse_* indexed (b, i, h) like lse
  int num_threads = 1;
};

// Element offset of row (b, i, h) of an operand.
inline int64_t row_offset(const Operand& o, int64_t b, int64_t seq, int64_t h) {
  return b * o.batch_stride + seq * o.seq_stride + h * o.head_stride;
}

}  // namespace flashgrad
