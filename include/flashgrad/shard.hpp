// flashgrad sequence sharding: which global rows of one attention each of W
// ranks holds, for ring attention (context parallelism). Plain arithmetic and
// copies, with no communication: the MPI ring (flashgrad/ring.hpp) and the
// Python torch.distributed ring (flashgrad.torch.ring_attn_func) share it.
#pragma once

#include <cstdint>
#include <vector>

#include "flashgrad/flashgrad.hpp"

namespace flashgrad {

// Which global rows rank r of W holds (the same rule for queries and keys).
//   contiguous: one run of rows, in rank order; each rank may hold any number
//               of rows (its q and k counts may differ).
//   zigzag:     the sequence is cut into 2W chunks (chunk c is rows
//               [c * L / 2W, (c + 1) * L / 2W)), and rank r holds chunks r and
//               2W - 1 - r, in that order. With causal masking every rank then
//               has about the same work.
enum class Sharding { contiguous, zigzag };

// A run of global rows [start, start + length).
struct RowRange {
  int64_t start = 0, length = 0;
};

// The global rows rank of world holds for a sequence of seqlen rows, in the
// order of its local tensor (contiguous: the even split, rows
// [floor(rank * seqlen / world), floor((rank + 1) * seqlen / world))).
std::vector<RowRange> shard_rows(Sharding sharding, int64_t seqlen, int rank, int world);

// Copies this rank's rows (dimension seq_dim) from a global tensor into local,
// or back. Shapes must agree except seq_dim; dtypes must match.
void shard(Sharding sharding, int rank, int world, const TensorView& global, const TensorView& local,
           int seq_dim = 1);
void unshard(Sharding sharding, int rank, int world, const TensorView& local, const TensorView& global,
             int seq_dim = 1);

}  // namespace flashgrad
