// The ring layer's C ABI: the core's DLTensor bridge and guard around ring.hpp.
#include "flashgrad/ring.h"

#include "c_bridge.hpp"
#include "flashgrad/ring.hpp"

using namespace flashgrad::c_bridge;

namespace {

flashgrad::RingOptions ring_options(const char* fn, MPI_Comm comm, fg_sharding s) {
  if (s != FG_SHARDING_CONTIGUOUS && s != FG_SHARDING_ZIGZAG)
    throw flashgrad::Error(std::string("flashgrad::") + fn +
                           ": argument 'sharding': expected FG_SHARDING_CONTIGUOUS or FG_SHARDING_ZIGZAG, got " +
                           std::to_string(static_cast<int>(s)));
  flashgrad::RingOptions r;
  r.comm = comm;
  r.sharding = s == FG_SHARDING_ZIGZAG ? flashgrad::Sharding::zigzag : flashgrad::Sharding::contiguous;
  return r;
}

}  // namespace

extern "C" {

fg_status fg_ring_forward(const fg_params* p, MPI_Comm comm, fg_sharding sharding, const DLTensor* q,
                          const DLTensor* k, const DLTensor* v, DLTensor* out, DLTensor* lse) {
  return guarded([&] {
    const char* fn = "ring_forward";
    flashgrad::ring_forward(options(fn, p), ring_options(fn, comm, sharding), view(fn, "q", q), view(fn, "k", k),
                            view(fn, "v", v), view(fn, "out", out), view(fn, "lse", lse));
  });
}

fg_status fg_ring_backward(const fg_params* p, MPI_Comm comm, fg_sharding sharding, const DLTensor* q,
                           const DLTensor* k, const DLTensor* v, const DLTensor* out, const DLTensor* lse,
                           const DLTensor* dout, DLTensor* dq, DLTensor* dk, DLTensor* dv, DLTensor* dsinks,
                           DLTensor* dbias) {
  return guarded([&] {
    const char* fn = "ring_backward";
    flashgrad::Grads g{view(fn, "dq", dq), view(fn, "dk", dk), view(fn, "dv", dv), opt_view(fn, "dsinks", dsinks),
                       opt_view(fn, "dbias", dbias)};
    flashgrad::ring_backward(options(fn, p), ring_options(fn, comm, sharding), view(fn, "q", q), view(fn, "k", k),
                             view(fn, "v", v), view(fn, "out", out), view(fn, "lse", lse), view(fn, "dout", dout), g);
  });
}

int fg_shard_rows(fg_sharding sharding, int64_t seqlen, int rank, int world, int64_t starts[2],
                  int64_t lengths[2]) {
  int n = -1;
  guarded([&] {
    const auto rows = flashgrad::shard_rows(ring_options("shard_rows", MPI_COMM_NULL, sharding).sharding, seqlen,
                                            rank, world);
    for (size_t i = 0; i < rows.size(); ++i) {
      starts[i] = rows[i].start;
      lengths[i] = rows[i].length;
    }
    n = static_cast<int>(rows.size());
  });
  return n;
}

}  // extern "C"
