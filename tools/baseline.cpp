#include "baseline.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "system.hpp"

namespace flashgrad::tools {

Baseline find_baseline() {
  Baseline b;
#if FLASHGRAD_BASELINE_BUILT
  const std::filesystem::path beside =
      std::filesystem::path(self_executable()).parent_path() / "flashgrad-baseline";
  if (access(beside.c_str(), X_OK) == 0) {
    b.path = beside.string();
  } else {
    b.missing = "is not at " + beside.string() + " (build it: cmake --build <build dir> --target flashgrad_baseline)";
  }
#else
  b.missing = FLASHGRAD_BASELINE_MISSING;  // from CMake: why it was not built
#endif
  return b;
}

void exec_baseline(const Baseline& baseline, const Args& args) {
  std::vector<std::string> argv = {baseline.path, args.command()};
  argv.insert(argv.end(), args.tokens().begin(), args.tokens().end());
  std::vector<char*> raw;
  for (std::string& a : argv) raw.push_back(a.data());
  raw.push_back(nullptr);
  std::fflush(stdout);
  execv(raw[0], raw.data());
  throw std::runtime_error("cannot run " + baseline.path + ": " + std::strerror(errno));
}

}  // namespace flashgrad::tools
