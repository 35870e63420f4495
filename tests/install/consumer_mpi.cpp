// Installed-tree consumer of flashgrad::mpi: the zigzag shard of 8 rows over 2 ranks.
#include <flashgrad/ring.hpp>

#include <cstdio>

int main() {
  const auto rows = flashgrad::shard_rows(flashgrad::Sharding::zigzag, 8, 0, 2);
  int64_t n = 0;
  for (const auto& r : rows) n += r.length;
  if (n != 4) return std::printf("consumer_mpi: rank 0 holds %lld rows, expected 4\n", (long long)n), 1;
  std::printf("consumer_mpi: ok\n");
  return 0;
}
