// Seeded random driver: fuzz_c_abi_seeds [first_seed [count [bytes]]].
// Each seed draws `bytes` random bytes and runs the harness on them; prints a
// summary line and exits 1 if any draw failed.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "fuzz_c_abi.hpp"

int main(int argc, char** argv) {
  const uint64_t first = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 0;
  const uint64_t count = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 200;
  const size_t nbytes = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 64;
  const bool verbose = std::getenv("FUZZ_VERBOSE") != nullptr;
  uint64_t valid = 0, invalid = 0, failed = 0;
  std::map<std::string, int> kinds;
  std::vector<uint8_t> bytes(nbytes);
  for (uint64_t seed = first; seed < first + count; ++seed) {
    std::mt19937_64 rng(seed);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    const auto res = flashgrad::fuzz::run_one(bytes.data(), bytes.size());
    (res.valid ? valid : invalid) += 1;
    const std::string k = res.kind.substr(0, res.kind.find('('));
    ++kinds[k];
    if (verbose) std::printf("seed %llu: %s %s\n", (unsigned long long)seed, res.describe.c_str(), res.kind.c_str());
    if (!res.ok) {
      ++failed;
      std::printf("FAIL seed %llu: %s [%s]\n  %s\n", (unsigned long long)seed, res.describe.c_str(),
                  res.kind.c_str(), res.failure.c_str());
    }
  }
  if (std::getenv("FUZZ_KINDS"))
    for (auto& [k, n] : kinds) std::printf("  %-40s %d\n", k.c_str(), n);
  std::printf("fuzz_c_abi_seeds: seeds [%llu, %llu): %llu valid, %llu invalid, %llu failed\n",
              (unsigned long long)first, (unsigned long long)(first + count), (unsigned long long)valid,
              (unsigned long long)invalid, (unsigned long long)failed);
  return failed ? 1 : 0;
}
