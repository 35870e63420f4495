// OpenBLAS set-up shared by the commands that measure against it (demo,
// roofline, the sweep).
#pragma once

#include <string>
#include <utility>

namespace flashgrad::tools {

// OpenBLAS picks its kernels from the CPU model. Where a virtual machine hides
// the model it falls back to an SSE3 core ("Prescott") whose sgemm is several
// times slower than the CPU allows, which would flatter flashgrad; so unless
// OPENBLAS_CORETYPE is set, this sets it to the core the CPU's features allow,
// for child processes (this process's OpenBLAS chose its core when it loaded).
// Returns the core's name and where it came from.
std::pair<std::string, std::string> choose_openblas_core();

// Whether this process's OpenBLAS runs the core named (case-insensitive).
bool openblas_core_is(const std::string& core);

// "OpenBLAS 0.3.21": the first two words of its configuration string.
std::string openblas_version();

}  // namespace flashgrad::tools
