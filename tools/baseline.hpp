// How `flashgrad` reaches the demo's baseline, flashgrad-baseline
// (baseline_main.cpp): a program of its own beside this one, so that
// flashgrad itself links no BLAS. CMake builds it when it finds OpenBLAS.
#pragma once

#include <string>
#include <vector>

#include "cli.hpp"

namespace flashgrad::tools {

struct Baseline {
  std::string path;     // flashgrad-baseline beside this executable; empty when there is none
  // Why there is none, after the program's name: "was not built: CMake found
  // no OpenBLAS (Debian: ...)", "is not at <path> (...)".
  std::string missing;
};

Baseline find_baseline();

// Replaces this process with `flashgrad-baseline <command> <the same flags>`.
[[noreturn]] void exec_baseline(const Baseline& baseline, const Args& args);

}  // namespace flashgrad::tools
