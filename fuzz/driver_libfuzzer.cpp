// libFuzzer driver (clang -fsanitize=fuzzer): aborts on the first failed draw
// so that libFuzzer saves the input as a crash file.
#include <cstdio>
#include <cstdlib>

#include "fuzz_c_abi.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto res = flashgrad::fuzz::run_one(data, size);
  if (!res.ok) {
    std::fprintf(stderr, "FAIL: %s [%s]\n  %s\n", res.describe.c_str(), res.kind.c_str(), res.failure.c_str());
    std::abort();
  }
  return 0;
}
