// The per-call workspace: one aligned allocation sized by the TilePlan. The
// largest one a call releases (1 to 64 MiB, FLASHGRAD_WORKSPACE_CACHE_MIB;
// 0 keeps none) is kept for the next call that fits in it, so the process
// holds up to that much between calls; a call that needs more frees it
// first, so a call's peak is its own workspace.
#pragma once

#include <cstdint>

#include "flashgrad/flashgrad.hpp"

namespace flashgrad {

class Workspace {
 public:
  // Throws Error naming fn when the allocation fails, or when it exceeds
  // FLASHGRAD_WORKSPACE_LIMIT bytes (a limit for tests and constrained hosts).
  Workspace(const char* fn, int64_t bytes);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// Sets every element of a 4-D f32 or f64 view to 0.
void zero_strided(const TensorView& t);

}  // namespace flashgrad
