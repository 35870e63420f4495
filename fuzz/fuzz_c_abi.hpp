// The differential fuzzer of the C ABI: one harness, two drivers
// (driver_libfuzzer.cpp for clang's libFuzzer, driver_seeds.cpp for a seeded
// random run with any compiler). See docs/reliability.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flashgrad::fuzz {

struct Outcome {
  bool valid = true;     ///< the draw was a valid call (else a deliberately corrupted one)
  bool ok = true;        ///< every check held
  std::string kind;      ///< "valid" or the corruption's name
  std::string describe;  ///< the case, for reproducing
  std::string failure;   ///< what did not hold
};

// Decodes a draw from the bytes (missing bytes read as 0) and runs it through
// fg_forward / fg_backward. A valid draw must return FG_OK, leave every byte
// outside the outputs' elements untouched and pass the harness's tolerance
// rule against the fp64 reference; a corrupted draw must return an error
// status with a non-empty fg_last_error() and leave every output byte as it
// was. Never throws.
Outcome run_one(const uint8_t* data, size_t size);

}  // namespace flashgrad::fuzz
