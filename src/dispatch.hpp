// Run-time ISA dispatch. One kernel source (src/cpu/kernels.inl) is compiled
// once per ISA; the table for the best ISA the CPU has is chosen once, at first
// use. FLASHGRAD_ISA=scalar|avx2|avx512|avx512bf16|amx forces one.
//
// avx512bf16 is avx512 with bf16 storage's products on AVX512_BF16 dot
// products, in both passes (dot_call). It is chosen where vdpbf16ps issues
// as fast as the f32 FMA (AMD's Zen 4 and Zen 5), not on Intel's CPUs
// without AMX, where it issues at half that rate and the f32 tiles are
// faster (docs/design.md, "bf16 on AVX512_BF16").
//
// amx is avx512 with bf16 storage's forward products and the backward's
// recomputed S on AMX-BF16 tiles, chosen where the CPU and the OS allow it
// (docs/design.md, "bf16 on AMX").
#pragma once

#include <vector>

#include "params.hpp"
#include "tiling.hpp"

namespace flashgrad {

enum class Isa { scalar, avx2, avx512, avx512bf16, amx };

// The forward's path for a call's first task (forward_paths.inl, task_path).
struct ForwardChoice {
  ForwardPath path = ForwardPath::rows;
  bool heads_outer = false;
};

struct KernelTable {
  Isa isa;
  const char* name;
  // workspace: TilePlan::total_bytes() bytes, aligned to kAlign.
  void (*forward)(const AttnParams& p, const TilePlan& plan, void* workspace);
  void (*backward)(const AttnParams& p, const TilePlan& plan, void* workspace);
  // keep u8 [batch, heads_q, seqlen_q, seqlen_k] contiguous, sequence-local positions.
  void (*dropout_mask)(const AttnParams& p, uint8_t* keep);
  ForwardChoice (*forward_path)(const AttnParams& p, const TilePlan& plan);
};

const char* isa_to_string(Isa isa);
bool cpu_supports(Isa isa);
// ISAs this CPU can run, in enum order.
std::vector<Isa> supported_isas();
// The ISA kernels() uses when FLASHGRAD_ISA is not set: the best this CPU
// has (amx over avx512bf16 over avx512), avx512bf16 only at full rate.
Isa default_isa();
// The table in use (honours FLASHGRAD_ISA; throws Error if it names an ISA the CPU lacks).
const KernelTable& kernels();
// A specific table, for tests that run every ISA. Throws Error if unsupported.
const KernelTable& kernels_for(Isa isa);

// While one lives, kernels() on the thread that made it returns isa's table:
// tests check a case on every path in one process and compute its
// reference once. Throws Error if the CPU lacks isa.
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa);
  ~ScopedIsa();
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  const KernelTable* previous_;
};

// Whether isa runs p on bf16 pair products (amx_call on amx, dot_call on
// avx512bf16): the argument plan_forward and plan_backward take.
inline bool pair_products(Isa isa, const AttnParams& p) {
  return (isa == Isa::amx && amx_call(p)) || (isa == Isa::avx512bf16 && dot_call(p));
}
inline PairEngine pair_engine(Isa isa, const AttnParams& p) {
  if (!pair_products(isa, p)) return PairEngine::none;
  return isa == Isa::amx ? PairEngine::amx : PairEngine::dot;
}

namespace cpu {
namespace scalar { extern const KernelTable table; }
namespace avx2 { extern const KernelTable table; }
namespace avx512 { extern const KernelTable table; }
namespace avx512bf16 { extern const KernelTable table; }
namespace amx { extern const KernelTable table; }
}  // namespace cpu

}  // namespace flashgrad
