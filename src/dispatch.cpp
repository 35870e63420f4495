#include "dispatch.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#if FLASHGRAD_HAVE_X86_KERNELS
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace flashgrad {

namespace {
constexpr Isa kAll[] = {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512bf16, Isa::amx};

#if FLASHGRAD_HAVE_X86_KERNELS
// CPUID.(EAX=7, ECX=1):EAX bit 5. Asked directly: not every compiler's
// __builtin_cpu_supports knows "avx512bf16". The zmm state it needs is the
// one the avx512 check already found enabled.
bool has_avx512_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  if (a < 1) return false;  // leaf 7 has no subleaf 1
  __cpuid_count(7, 1, a, b, c, d);
  return (a >> 5) & 1u;
}

// AMX-TILE and AMX-BF16 (CPUID.(EAX=7, ECX=0):EDX bits 24 and 22), their
// state enabled by the OS (XCR0 bits 17 and 18), and, on Linux, this
// process allowed to use it (arch_prctl ARCH_REQ_XCOMP_PERM for
// XTILEDATA, once per process; without it the first tile instruction
// faults).
bool has_amx_bf16() {
#if defined(__linux__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  if (!((d >> 24) & 1u) || !((d >> 22) & 1u)) return false;
  __cpuid(1, a, b, c, d);
  if (!((c >> 27) & 1u)) return false;  // OSXSAVE: xgetbv usable
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

// Whether vdpbf16ps issues as fast as the f32 FMA, so that bf16 pairs
// double the products' rate: AMD's, the Zen 4 and Zen 5 cores being the
// AMD CPUs with AVX512_BF16. Intel's without AMX issue it at half the FMA
// rate (docs/design.md; tuning table: default ISA).
bool full_rate_bf16_dot() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  __cpuid(0, a, b, c, d);
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  return std::strcmp(vendor, "AuthenticAMD") == 0;
}
#endif
}  // namespace

const char* isa_to_string(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512bf16: return "avx512bf16";
    case Isa::amx: return "amx";
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
    case Isa::avx512bf16: {
      static const bool yes = cpu_supports(Isa::avx512) && has_avx512_bf16();
      return yes;
    }
    case Isa::amx: {
      static const bool yes = cpu_supports(Isa::avx512bf16) && has_amx_bf16();
      return yes;
    }
#else
    default: return false;
#endif
  }
  return false;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : kAll)
    if (cpu_supports(isa)) out.push_back(isa);
  return out;
}

// The last supported ISA, but avx512bf16 only where its dot products run
// at full rate (dispatch.hpp).
Isa default_isa() {
  Isa best = Isa::scalar;
  for (Isa isa : supported_isas()) {
#if FLASHGRAD_HAVE_X86_KERNELS
    if (isa == Isa::avx512bf16 && !full_rate_bf16_dot()) continue;
#endif
    best = isa;
  }
  return best;
}

namespace {
// what: "argument 'isa'" or "environment variable 'FLASHGRAD_ISA'".
[[noreturn]] void throw_unsupported(const char* what, Isa isa) {
  std::string names;
  for (Isa s : supported_isas()) names += std::string(names.empty() ? "" : ", ") + isa_to_string(s);
  throw Error(std::string("flashgrad::isa: ") + what + ": expected an ISA this CPU and build support (" + names +
                  "), got '" + isa_to_string(isa) + "'",
              Error::Code::unsupported);
}
}  // namespace

const KernelTable& kernels_for(Isa isa) {
  if (!cpu_supports(isa)) throw_unsupported("argument 'isa'", isa);
  switch (isa) {
#if FLASHGRAD_HAVE_X86_KERNELS
    case Isa::amx: return cpu::amx::table;
    case Isa::avx512bf16: return cpu::avx512bf16::table;
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
    for (Isa isa : kAll) {
      if (std::strcmp(env, isa_to_string(isa)) != 0) continue;
      if (!cpu_supports(isa)) throw_unsupported("environment variable 'FLASHGRAD_ISA'", isa);
      return kernels_for(isa);
    }
    throw Error(std::string("flashgrad::isa: environment variable 'FLASHGRAD_ISA': expected scalar, avx2, "
                            "avx512, avx512bf16 or amx, got '") + env + "'");
  }
  return kernels_for(default_isa());
}
}  // namespace

namespace {
thread_local const KernelTable* t_scoped = nullptr;
}  // namespace

ScopedIsa::ScopedIsa(Isa isa) : previous_(t_scoped) { t_scoped = &kernels_for(isa); }
ScopedIsa::~ScopedIsa() { t_scoped = previous_; }

const KernelTable& kernels() {
  if (t_scoped) return *t_scoped;
  static const KernelTable& table = choose();
  return table;
}

}  // namespace flashgrad
