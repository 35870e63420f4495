#include "openblas.hpp"

#include <cblas.h>

#include <cctype>
#include <cstdlib>
#include <initializer_list>
#include <sstream>

#include "dispatch.hpp"

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

}  // namespace flashgrad::tools
