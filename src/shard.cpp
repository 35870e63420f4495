// Which global rows a rank holds, and copies between global and local tensors.
#include <string>

#include "convert.hpp"
#include "flashgrad/shard.hpp"

namespace flashgrad {
namespace {

[[noreturn]] void fail(const char* fn, const char* arg, const std::string& expected, const std::string& got) {
  throw Error(std::string("flashgrad::") + fn + ": argument '" + arg + "': expected " + expected + ", got " + got);
}

TensorView rows_of(const TensorView& t, int dim, int64_t start, int64_t len) {
  TensorView s = t;
  s.data = static_cast<char*>(t.data) + start * t.strides[dim] * dtype_size(t.dtype);
  s.shape[dim] = len;
  return s;
}

void copy_shard(const char* fn, Sharding sharding, int rank, int world, const TensorView& global,
                const TensorView& local, int seq_dim, bool to_local) {
  if (world < 1 || rank < 0 || rank >= world)
    fail(fn, "rank", "0 <= rank < world (world >= 1)", std::to_string(rank) + " of " + std::to_string(world));
  if (global.ndim < 1 || global.ndim > 4 || seq_dim < 0 || seq_dim >= global.ndim)
    fail(fn, "seq_dim", "a dimension of global (" + std::to_string(global.ndim) + "-D)", std::to_string(seq_dim));
  if (local.ndim != global.ndim || local.dtype != global.dtype)
    fail(fn, "local", std::string("the rank and dtype of global (") + dtype_name(global.dtype) + ")",
         std::to_string(local.ndim) + "-D " + dtype_name(local.dtype));
  const auto rows = shard_rows(sharding, global.shape[seq_dim], rank, world);
  int64_t total = 0;
  for (const auto& r : rows) total += r.length;
  for (int i = 0; i < global.ndim; ++i) {
    const int64_t want = i == seq_dim ? total : global.shape[i];
    if (local.shape[i] != want)
      fail(fn, "local", "size " + std::to_string(want) + " in dimension " + std::to_string(i),
           std::to_string(local.shape[i]));
  }
  if (!global.data || !local.data) fail(fn, global.data ? "local" : "global", "data", "NULL");
  int64_t at = 0;
  for (const auto& r : rows) {
    const TensorView g = rows_of(global, seq_dim, r.start, r.length), l = rows_of(local, seq_dim, at, r.length);
    if (to_local)
      convert_values(g, l);
    else
      convert_values(l, g);
    at += r.length;
  }
}

}  // namespace

std::vector<RowRange> shard_rows(Sharding sharding, int64_t seqlen, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world || seqlen < 0)
    fail("shard_rows", "rank", "0 <= rank < world (world >= 1) and seqlen >= 0",
         std::to_string(rank) + " of " + std::to_string(world) + ", seqlen " + std::to_string(seqlen));
  // Boundary c of n pieces: floor(c * seqlen / n), without overflow for any int64 seqlen.
  auto cut = [seqlen](int64_t c, int64_t n) { return (seqlen / n) * c + (seqlen % n) * c / n; };
  if (sharding == Sharding::contiguous) return {{cut(rank, world), cut(rank + 1, world) - cut(rank, world)}};
  const int64_t n = 2 * static_cast<int64_t>(world), a = rank, b = n - 1 - rank;
  return {{cut(a, n), cut(a + 1, n) - cut(a, n)}, {cut(b, n), cut(b + 1, n) - cut(b, n)}};
}

void shard(Sharding sharding, int rank, int world, const TensorView& global, const TensorView& local, int seq_dim) {
  copy_shard("shard", sharding, rank, world, global, local, seq_dim, true);
}

void unshard(Sharding sharding, int rank, int world, const TensorView& local, const TensorView& global,
             int seq_dim) {
  copy_shard("unshard", sharding, rank, world, global, local, seq_dim, false);
}

}  // namespace flashgrad
