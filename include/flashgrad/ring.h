/* flashgrad ring attention over MPI, C ABI (see flashgrad/ring.hpp for the
 * algorithm, the tensors each rank holds and the collective error rule).
 * Link with -lflashgrad_mpi -lflashgrad and MPI. Every rank of comm must make
 * the same call; on error every rank returns the same status and
 * fg_last_error() names the rank whose input was wrong. */
#ifndef FLASHGRAD_RING_H_
#define FLASHGRAD_RING_H_

#include <mpi.h>

#include "flashgrad/flashgrad.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  FG_SHARDING_CONTIGUOUS = 0, /* one run of rows per rank, in rank order, any lengths */
  FG_SHARDING_ZIGZAG = 1      /* chunks r and 2W-1-r of 2W equal chunks */
} fg_sharding;

/* p->cu_seqlens_* and p->block must be unset. q, k, v, out, lse: this rank's rows. */
fg_status fg_ring_forward(const fg_params* p, MPI_Comm comm, fg_sharding sharding, const DLTensor* q,
                          const DLTensor* k, const DLTensor* v, DLTensor* out, DLTensor* lse);

/* out and lse: those fg_ring_forward returned on this rank. dsinks (may be
 * NULL) receives the whole sequence's gradient on every rank; dbias (may be
 * NULL) this rank's rows against every global key. */
fg_status fg_ring_backward(const fg_params* p, MPI_Comm comm, fg_sharding sharding, const DLTensor* q,
                           const DLTensor* k, const DLTensor* v, const DLTensor* out, const DLTensor* lse,
                           const DLTensor* dout, DLTensor* dq, DLTensor* dk, DLTensor* dv, DLTensor* dsinks,
                           DLTensor* dbias);

/* The rows of a sequence of seqlen rows that rank holds: up to 2 runs
 * (starts[i], lengths[i]); returns their count, or -1 on a bad argument. */
int fg_shard_rows(fg_sharding sharding, int64_t seqlen, int rank, int world, int64_t starts[2],
                  int64_t lengths[2]);

#ifdef __cplusplus
}
#endif

#endif /* FLASHGRAD_RING_H_ */
