// flashgrad ring attention (context parallelism) over MPI.
//
// The ranks of comm each hold a shard of one global attention along the
// sequence: rank r has q rows and k/v rows of the global q, k, v (which rows:
// Sharding in flashgrad/shard.hpp). K/V blocks travel around the ring r -> r + 1 with
// nonblocking MPI while each rank computes on the block it holds:
//
//   step t = 0 .. W-1: rank r holds the K/V block of rank (r - t) mod W
//     out_r, lse_r  <-  merge(out_r, lse_r, attention(q_r, K_block, V_block))
//
// where attention() is flashgrad::forward on that block with Options::block
// set to the global positions, so causal (aligned bottom-right on the global
// lengths), window, ALiBi and dropout act as on the whole sequence. Blocks
// that causal or the window mask entirely are skipped. Partial results are
// merged in f32 (f64 for f64 storage) by flashgrad::merge's row function.
//
// Backward takes the global out and lse of this rank's rows (those ring_forward
// returned). dK/dV accumulators (f32) travel with their K/V block and arrive
// back at the owner after W steps, summed in the fixed ring order, so results
// are bitwise identical for a fixed number of ranks.
//
// Tensors on rank r (L_q, L_k: this rank's row counts; the global lengths are
// their sums over ranks):
//   q [batch, L_q, heads_q, d], k [batch, L_k, heads_kv, d], v [batch, L_k, heads_kv, dv]
//   out, lse, dq, dk, dv: as in flashgrad.hpp, for this rank's rows
//   bias, mask: [batch|1, heads_q|1, L_q|1, seqlen_k_global|1], this rank's
//     query rows against every global key, keys in global order
//   sinks: one logit per head, joined once per row; dsinks is the gradient of
//     the whole sequence (summed over ranks in rank order), the same on every rank
// Every Options field works as in flashgrad.hpp, except cu_seqlens (varlen)
// and Options::block, which the ring sets itself: both are unsupported.
//
// Errors: every rank validates its inputs, then the ranks agree on the result
// before any data moves. If one rank's input is bad, every rank throws
// flashgrad::Error with that rank's message, instead of some ranks waiting
// forever. An error during the steps (out of memory) is carried to the end
// of the ring the same way.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "flashgrad/flashgrad.hpp"
#include "flashgrad/shard.hpp"

namespace flashgrad {

struct RingStats {
  int steps = 0;
  double compute_seconds = 0;  ///< in flashgrad kernels and merges
  double wait_seconds = 0;     ///< blocked in MPI waits after computing
  int64_t bytes_sent = 0;
};

struct RingOptions {
  MPI_Comm comm = MPI_COMM_WORLD;
  Sharding sharding = Sharding::contiguous;
  RingStats* stats = nullptr;  ///< filled in if non-null
};

void ring_forward(const Options& opts, const RingOptions& ring, const TensorView& q, const TensorView& k,
                  const TensorView& v, const TensorView& out, const TensorView& lse);

void ring_backward(const Options& opts, const RingOptions& ring, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& out, const TensorView& lse, const TensorView& dout,
                   const Grads& grads);

}  // namespace flashgrad
