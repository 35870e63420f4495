// Run-time ISA dispatch. One kernel source (src/cpu/kernels.inl) is compiled
// once per ISA; the table for the best ISA the CPU has is chosen once, at first
// use. FLASHGRAD_ISA=scalar|avx2|avx512 forces one.
#pragma once

#include <vector>

#include "params.hpp"
#include "tiling.hpp"

namespace flashgrad {

enum class Isa { scalar, avx2, avx512 };

struct KernelTable {
  Isa isa;
  const char* name;
  // workspace: TilePlan::total_bytes() bytes, aligned to kAlign.
  void (*forward)(const AttnParams& p, const TilePlan& plan, void* workspace);
  void (*backward)(const AttnParams& p, const TilePlan& plan, void* workspace);
  // keep u8 [batch, heads_q, seqlen_q, seqlen_k] contiguous, sequence-local positions.
  void (*dropout_mask)(const AttnParams& p, uint8_t* keep);
};

const char* isa_to_string(Isa isa);
bool cpu_supports(Isa isa);
// ISAs this CPU can run, best last.
std::vector<Isa> supported_isas();
// The table in use (honours FLASHGRAD_ISA; throws Error if it names an ISA the CPU lacks).
const KernelTable& kernels();
// A specific table, for tests that run every ISA. Throws Error if unsupported.
const KernelTable& kernels_for(Isa isa);

namespace cpu {
namespace scalar { extern const KernelTable table; }
namespace avx2 { extern const KernelTable table; }
namespace avx512 { extern const KernelTable table; }
}  // namespace cpu

}  // namespace flashgrad
