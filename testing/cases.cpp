#include <random>

#include "harness.hpp"

namespace flashgrad::testing {

std::vector<Case> edge_cases() {
  std::vector<Case> cs;
  auto add = [&](Case c, const char* name) {
    c.name = name;
    cs.push_back(c);
  };
  Case base;
  base.batch = 2;
  base.seqlen_q = 33;
  base.seqlen_k = 129;
  base.heads_q = 4;
  base.heads_kv = 2;
  base.head_dim = 40;
  base.head_dim_v = 24;
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    Case c = base;
    c.dtype = t;
    add(c, "plain");
    c.causal = true;
    add(c, "causal");
  }
  Case c = base;
  c.window_left = 5; c.window_right = 3;
  add(c, "window");
  c = base; c.softcap = 2.0; c.input_scale = 3.0;
  add(c, "softcap");
  c = base; c.alibi = true; c.causal = true;
  add(c, "alibi_causal");
  c = base; c.bias = BiasKind::full; c.dbias = true;
  add(c, "bias_dbias");
  c = base; c.bias = BiasKind::bcast_heads; c.bias_dtype = DType::bf16; c.dbias = true;
  add(c, "bias_bcast_heads");
  c = base; c.mask = MaskKind::full;
  add(c, "mask");
  c = base; c.mask = MaskKind::key_padding;
  add(c, "mask_key_padding");
  c = base; c.sinks = true; c.causal = true;
  add(c, "sinks");
  c = base; c.dropout_p = 0.2;
  add(c, "dropout");
  c = base; c.seqlens_q = {5, 0, 40}; c.seqlens_k = {9, 3, 0}; c.causal = true;
  add(c, "varlen_empty");
  c = base; c.layout = Layout::bhsd;
  add(c, "bhsd");
  c = base; c.layout = Layout::padded; c.dtype = DType::bf16;
  add(c, "padded_bf16");
  c = base; c.seqlen_q = 7; c.seqlen_k = 1; c.causal = true; c.window_left = 0;
  add(c, "fully_masked_rows");
  c = base; c.seqlen_k = 0;
  add(c, "empty_keys");
  c = base; c.head_dim = 512; c.head_dim_v = 512; c.seqlen_q = 9; c.seqlen_k = 31; c.heads_q = 2; c.heads_kv = 1;
  add(c, "head_dim_512");
  c = base; c.head_dim = 1; c.head_dim_v = 1;
  add(c, "head_dim_1");
  c = base; c.heads_q = 16; c.heads_kv = 1; c.seqlen_q = 8; c.seqlen_k = 31;
  add(c, "mqa_16");
  c = base; c.causal = true; c.window_left = 16; c.softcap = 5; c.alibi = true; c.bias = BiasKind::bcast_batch;
  c.dbias = true; c.mask = MaskKind::bcast_batch; c.sinks = true; c.dropout_p = 0.1; c.dtype = DType::bf16;
  add(c, "everything_bf16");
  return cs;
}

Case random_case(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::initializer_list<int64_t> xs) {
    return *(xs.begin() + std::uniform_int_distribution<size_t>(0, xs.size() - 1)(rng));
  };
  auto coin = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  Case c;
  c.name = "random_" + std::to_string(seed);
  c.seed = seed;
  const DType types[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
  c.dtype = types[pick({0, 1, 2, 3})];
  c.batch = pick({1, 2, 3});
  c.seqlen_q = pick({1, 7, 8, 33, 64, 65, 128, 200});
  c.seqlen_k = pick({1, 8, 31, 64, 129, 300});
  c.heads_kv = pick({1, 2});
  c.heads_q = c.heads_kv * pick({1, 2, 4});
  c.head_dim = pick({8, 16, 40, 64, 96, 128});
  c.head_dim_v = coin(0.7) ? c.head_dim : pick({8, 24, 64});
  c.causal = coin(0.4);
  if (coin(0.25)) { c.window_left = pick({0, 3, 17}); c.window_right = pick({-1, 0, 5}); }
  if (coin(0.2)) { c.softcap = 3.0; c.input_scale = 2.0; }
  c.alibi = coin(0.2);
  if (coin(0.2)) { c.bias = coin(0.5) ? BiasKind::full : BiasKind::bcast_heads; c.dbias = coin(0.5); }
  if (coin(0.2)) c.mask = coin(0.5) ? MaskKind::full : MaskKind::key_padding;
  c.sinks = coin(0.2);
  if (coin(0.2)) c.dropout_p = 0.15;
  c.layout = static_cast<Layout>(pick({0, 1, 2}));
  if (coin(0.2)) {
    c.seqlens_q.clear();
    c.seqlens_k.clear();
    for (int64_t b = 0; b < c.batch; ++b) {
      c.seqlens_q.push_back(static_cast<int32_t>(pick({0, 1, 9, 40, 70})));
      c.seqlens_k.push_back(static_cast<int32_t>(pick({0, 1, 20, 64, 90})));
    }
  }
  return c;
}

}  // namespace flashgrad::testing
