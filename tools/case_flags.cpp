#include "case_flags.hpp"

#include <string>

namespace flashgrad::tools {
namespace {

DType parse_dtype(const std::string& name) {
  if (name == "f64") return DType::f64;
  if (name == "bf16") return DType::bf16;
  if (name == "f16") return DType::f16;
  return DType::f32;
}

testing::Layout parse_layout(const std::string& name) {
  if (name == "bhsd") return testing::Layout::bhsd;
  if (name == "padded") return testing::Layout::padded;
  return testing::Layout::bshd;
}

}  // namespace

const char* const kCaseFlagsUsage =
    "  --batch B            (default 1)\n"
    "  --seqlen L           sets --seqlen-q and --seqlen-k (default 1024)\n"
    "  --seqlen-q L, --seqlen-k L\n"
    "  --heads-q H          (default 8)\n"
    "  --heads-kv H         (default: --heads-q)\n"
    "  --head-dim D         (default 64)\n"
    "  --head-dim-v D       (default: --head-dim)\n"
    "  --dtype T            f32, f64, bf16 or f16 (default f32)\n"
    "  --causal\n"
    "  --window L,R         sliding window; -1 is unbounded\n"
    "  --softcap C          logits capped as C tanh(S / C) (default 0: off)\n"
    "  --dropout P          attention dropout probability in [0, 1) (default 0)\n"
    "  --alibi              ALiBi with slopes 2^-(h % 8 + 1) for query head h\n"
    "  --bias               an additive f32 bias [1, heads_q, seqlen_q, seqlen_k]\n"
    "  --mask               a random boolean mask [1, heads_q, seqlen_q, seqlen_k], 70% kept\n"
    "  --layout X           bshd ([batch, seq, heads, dim], default), bhsd (the same\n"
    "                       shape with each head's rows contiguous) or padded (rows\n"
    "                       padded, head_dim strided by 2)\n"
    "  --threads T          (default: all cores)\n";

testing::Case case_from_flags(Args& args) {
  testing::Case c;
  c.name = args.command();
  c.batch = args.integer("--batch", 1, 1);
  const int64_t seqlen = args.integer("--seqlen", 1024, 1);
  c.seqlen_q = args.integer("--seqlen-q", seqlen, 1);
  c.seqlen_k = args.integer("--seqlen-k", seqlen, 1);
  c.heads_q = args.integer("--heads-q", 8, 1);
  c.heads_kv = args.integer("--heads-kv", c.heads_q, 1);
  if (c.heads_q % c.heads_kv != 0)
    args.fail("--heads-kv", "a divisor of --heads-q (" + std::to_string(c.heads_q) + ")",
              std::to_string(c.heads_kv));
  c.head_dim = args.integer("--head-dim", 64, 1, 512);
  c.head_dim_v = args.integer("--head-dim-v", c.head_dim, 1, 512);
  c.dtype = parse_dtype(args.choice("--dtype", "f32", {"f32", "f64", "bf16", "f16"}));
  c.causal = args.has("--causal");
  if (const auto w = args.integer_pair("--window", -1)) {
    c.window_left = w->first;
    c.window_right = w->second;
  }
  c.softcap = args.real("--softcap", 0.0, 0.0);
  c.dropout_p = args.real("--dropout", 0.0, 0.0);
  if (c.dropout_p >= 1.0) args.fail("--dropout", "a probability below 1", std::to_string(c.dropout_p));
  c.alibi = args.has("--alibi");
  if (args.has("--bias")) c.bias = testing::BiasKind::bcast_batch;
  if (args.has("--mask")) c.mask = testing::MaskKind::bcast_batch;
  c.layout = parse_layout(args.choice("--layout", "bshd", {"bshd", "bhsd", "padded"}));
  c.num_threads = static_cast<int>(args.integer("--threads", 0, 1, 4096));
  return c;
}

}  // namespace flashgrad::tools
