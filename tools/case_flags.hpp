// The shape flags that `flashgrad bench` and `flashgrad ab` share.
#pragma once

#include "cli.hpp"
#include "harness.hpp"

namespace flashgrad::tools {

// --batch, --seqlen, --seqlen-q, --seqlen-k, --heads-q, --heads-kv,
// --head-dim, --head-dim-v, --dtype, --causal, --window, --softcap, --dropout, --layout,
// --threads.
testing::Case case_from_flags(Args& args);

// The flags' lines of a usage text.
extern const char* const kCaseFlagsUsage;

}  // namespace flashgrad::tools
