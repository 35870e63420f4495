#include "dispatch.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

namespace flashgrad {

const char* isa_to_string(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

bool cpu_supports(Isa isa) {
  switch (isa) {
    case Isa::scalar: return true;
#if FLASHGRAD_HAVE_X86_KERNELS
    case Isa::avx2:
      // F16C, which the path also uses, came with or before AVX2 on every x86
      // CPU (and clang 14's __builtin_cpu_supports does not know "f16c").
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::avx512:
      return cpu_supports(Isa::avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq");
#else
    default: return false;
#endif
  }
  return false;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512})
    if (cpu_supports(isa)) out.push_back(isa);
  return out;
}

const KernelTable& kernels_for(Isa isa) {
  if (!cpu_supports(isa))
    throw Error(std::string("flashgrad::isa: argument 'isa': expected an ISA this CPU and build support (") +
                    (cpu_supports(Isa::avx512) ? "scalar, avx2, avx512" : cpu_supports(Isa::avx2) ? "scalar, avx2" : "scalar") +
                    "), got '" + isa_to_string(isa) + "'",
                Error::Code::unsupported);
  switch (isa) {
#if FLASHGRAD_HAVE_X86_KERNELS
    case Isa::avx512: return cpu::avx512::table;
    case Isa::avx2: return cpu::avx2::table;
#endif
    default: return cpu::scalar::table;
  }
}

namespace {
const KernelTable& choose() {
  const char* env = std::getenv("FLASHGRAD_ISA");
  if (env && *env) {
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512})
      if (std::strcmp(env, isa_to_string(isa)) == 0) return kernels_for(isa);
    throw Error(std::string("flashgrad::isa: environment variable 'FLASHGRAD_ISA': expected scalar, avx2 or "
                            "avx512, got '") + env + "'");
  }
  return kernels_for(supported_isas().back());
}
}  // namespace

const KernelTable& kernels() {
  static const KernelTable& table = choose();
  return table;
}

}  // namespace flashgrad
