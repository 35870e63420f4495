// Validation at the API boundary: turns user tensors and options into a
// checked AttnParams, or throws flashgrad::Error naming the function, the
// argument, what was expected and what was got. Nothing is written before all
// checks pass.
#pragma once

#include "params.hpp"

namespace flashgrad {

enum class CallKind {
  forward,            ///< outputs out (dtype of q), lse (f32)
  backward,           ///< inputs out, lse, dout; outputs dq, dk, dv (+ dsinks, dbias)
  workspace,          ///< q, k, v and options only
  reference_forward,  ///< as forward, outputs f64
  reference_backward  ///< as backward, outputs dq/dk/dv/dsinks/dbias f64, lse f32 or f64
};

struct CallTensors {
  const TensorView* q = nullptr;
  const TensorView* k = nullptr;
  const TensorView* v = nullptr;
  const TensorView* out = nullptr;
  const TensorView* lse = nullptr;
  const TensorView* dout = nullptr;
  const Grads* grads = nullptr;
};

AttnParams make_params(const char* fn, CallKind kind, const Options& opts, const CallTensors& t);

MergeParams make_merge_params(const char* fn, const TensorView& o_acc, const TensorView& lse_acc,
                              const TensorView& o_part, const TensorView& lse_part, int num_threads);

}  // namespace flashgrad
