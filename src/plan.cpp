// The plan of a call, as forward() and backward() make it (api.cpp), with
// names for what they choose: the public Plan (flashgrad.hpp).
#include <sstream>
#include <string>

#include "check.hpp"
#include "dispatch.hpp"
#include "flashgrad/flashgrad.hpp"
#include "parallel.hpp"
#include "tiling.hpp"

namespace flashgrad {

const char* path_name(ForwardPath p) {
  switch (p) {
    case ForwardPath::rows: return "rows";
    case ForwardPath::whole_rows: return "whole_rows";
    case ForwardPath::heads_across: return "heads_across";
    case ForwardPath::keys_major: return "keys_major";
    case ForwardPath::narrow: return "narrow";
    case ForwardPath::dot_rows: return "dot_rows";
    case ForwardPath::narrow_dot: return "narrow_dot";
    case ForwardPath::amx: return "amx";
    case ForwardPath::amx_narrow: return "amx_narrow";
  }
  return "?";
}

const char* path_name(BackwardPath p) { return p == BackwardPath::single_pass ? "single_pass" : "two_pass"; }

std::string Plan::describe() const {
  std::ostringstream s;
  s << kernel << ": " << (backward ? path_name(backward_path) : path_name(forward_path));
  if (heads_outer) s << ", heads outer";
  s << ", block_q " << block_q << ", block_k " << block_k;
  if (splits > 1) s << ", " << splits << " key splits";
  if (key_chunks > 1) s << ", " << key_chunks << " key chunks";
  if (key_group > 1) s << ", key blocks in groups of " << key_group;
  if (*dq_sums) s << ", dQ sums in " << dq_sums;
  s << ", " << threads << (threads == 1 ? " thread" : " threads");
  if (!thread_runner.empty() && thread_runner != "flashgrad") s << " on " << thread_runner;
  s << ", workspace " << workspace_bytes << " bytes";
  return s.str();
}

namespace {

// The table's name, or avx512 where the amx and avx512bf16 tables hand a
// call without pair products to the avx512 kernels.
const char* kernel_isa(const KernelTable& kt, const AttnParams& p) {
  if ((kt.isa == Isa::amx || kt.isa == Isa::avx512bf16) && !pair_products(kt.isa, p)) return "avx512";
  return kt.name;
}

Plan common(const KernelTable& kt, const AttnParams& p, const TilePlan& t, bool backward) {
  Plan plan;
  plan.isa = kt.name;
  plan.backward = backward;
  plan.pair_products = pair_products(kt.isa, p);
  plan.block_q = t.block_q;
  plan.block_k = t.block_k;
  plan.threads = t.threads;
  plan.thread_runner = thread_runner_name();
  plan.workspace_bytes = t.total_bytes();
  return plan;
}

std::string kernel_name(const char* pass, const AttnParams& p, const KernelTable& kt, const char* path,
                        const TilePlan& t) {
  return std::string(pass) + "_" + dtype_name(p.dtype) + "_" + kernel_isa(kt, p) + "_" + path + "_q" +
         std::to_string(t.block_q) + "k" + std::to_string(t.block_k);
}

AttnParams params_of(const char* fn, const Options& opts, const TensorView& q, const TensorView& k,
                     const TensorView& v) {
  CallTensors c{&q, &k, &v};
  AttnParams p = make_params(fn, CallKind::workspace, opts, c);
  p.num_threads = resolve_threads(p.num_threads);
  return p;
}

}  // namespace

Plan explain_forward(const Options& opts, const TensorView& q, const TensorView& k, const TensorView& v) {
  const AttnParams p = params_of("explain_forward", opts, q, k, v);
  const KernelTable& kt = kernels();
  const TilePlan t = plan_forward(p, pair_engine(kt.isa, p));
  Plan plan = common(kt, p, t, false);
  const ForwardChoice c = kt.forward_path(p, t);
  plan.forward_path = c.path;
  plan.heads_outer = c.heads_outer;
  plan.splits = t.splits;
  plan.kernel = kernel_name("fwd", p, kt, path_name(c.path), t);
  return plan;
}

Plan explain_backward(const Options& opts, const TensorView& q, const TensorView& k, const TensorView& v) {
  const AttnParams p = params_of("explain_backward", opts, q, k, v);
  const KernelTable& kt = kernels();
  const TilePlan t = plan_backward(p, pair_engine(kt.isa, p));
  Plan plan = common(kt, p, t, true);
  plan.backward_path = t.fused ? BackwardPath::single_pass : BackwardPath::two_pass;
  plan.key_chunks = t.fused ? t.key_chunks : 1;
  plan.key_group = t.key_group;
  if (t.fused && t.key_chunks == 1)
    plan.dq_sums = t.dq_sums == DqSums::in_dq ? "dq" : t.dq_sums == DqSums::split_dq ? "split dq" : "workspace";
  plan.kernel = kernel_name("bwd", p, kt, path_name(plan.backward_path), t);
  return plan;
}

}  // namespace flashgrad
