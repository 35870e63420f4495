#include "openblas.hpp"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <thread>
#include <vector>

#include "dispatch.hpp"
#include "harness.hpp"
#include "system.hpp"

namespace flashgrad::tools {
namespace {

std::string lower(std::string text) {
  for (char& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return text;
}

bool names_one_of(const std::string& core, std::initializer_list<const char*> names) {
  const std::string l = lower(core);
  for (const char* name : names)
    if (l == name) return true;
  return false;
}

}  // namespace

std::pair<std::string, std::string> choose_openblas_core() {
  if (const char* set = std::getenv("OPENBLAS_CORETYPE"); set && *set) return {set, "from OPENBLAS_CORETYPE"};
  const std::string detected = openblas_get_corename();
  const bool avx512_core = names_one_of(detected, {"skylakex", "cooperlake", "sapphirerapids"});
  const bool avx2_core = avx512_core || names_one_of(detected, {"haswell", "zen"});
  const char* better = nullptr;
  if (cpu_supports(Isa::avx512) && !avx512_core)
    better = "SkylakeX";
  else if (cpu_supports(Isa::avx2) && !avx2_core)
    better = "Haswell";
  if (!better) return {detected, "detected by OpenBLAS"};
  setenv("OPENBLAS_CORETYPE", better, 1);
  return {better, "OpenBLAS detected " + detected + "; set OPENBLAS_CORETYPE to override"};
}

bool openblas_core_is(const std::string& core) { return lower(openblas_get_corename()) == lower(core); }

std::string openblas_version() {
  std::istringstream config(openblas_get_config());
  std::string name, number;
  config >> name >> number;
  return name + " " + number;
}

Sgemm::Sgemm(int64_t n)
    : n_(n),
      a_(testing::uniform_floats(static_cast<size_t>(n * n), 1)),
      b_(testing::uniform_floats(static_cast<size_t>(n * n), 2)),
      c_(static_cast<size_t>(n * n)) {}

void Sgemm::run() {
  const int n = static_cast<int>(n_);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a_.data(), n, b_.data(), n, 0.0f, c_.data(),
              n);
}

double Sgemm::gflops_now() {
  settle();
  run();
  double best = 0;
  for (int i = 0; i < 2; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::max(best, flops() / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  settle();
  return best / 1e9;
}

void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }

void use_chosen_openblas_core(const std::string& command) {
  const std::string core = choose_openblas_core().first;
  if (openblas_core_is(core) || std::getenv("FLASHGRAD_OPENBLAS_RESTARTED")) return;
  setenv("FLASHGRAD_OPENBLAS_RESTARTED", "1", 1);
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  for (std::string arg; std::getline(in, arg, '\0');) argv.push_back(arg);
  std::vector<char*> raw;
  const std::string exe = self_executable();
  raw.push_back(const_cast<char*>(exe.c_str()));
  for (size_t i = 1; i < argv.size(); ++i) raw.push_back(argv[i].data());
  raw.push_back(nullptr);
  std::fflush(stdout);
  execv(exe.c_str(), raw.data());
  std::fprintf(stderr, "%s: could not restart with OPENBLAS_CORETYPE=%s; measuring as is\n", command.c_str(),
               core.c_str());
}

}  // namespace flashgrad::tools
