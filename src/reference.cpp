#include "reference.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/exp_poly.hpp"
#include "check.hpp"
#include "dispatch.hpp"
#include "params.hpp"

namespace flashgrad::reference {
namespace detail {
#define FG_PORTABLE_HALF 1
#define FG_DASSERT(x) assert(x)
#include "cpu/vec.inl"
}  // namespace detail

namespace {

std::vector<uint8_t> keep_mask(const AttnParams& p, const uint8_t*& keep) {
  std::vector<uint8_t> owned;
  if (p.dropout_p > 0 && !keep) {
    owned.resize(static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q * p.seqlen_k));
    kernels_for(Isa::scalar).dropout_mask(p, owned.data());
    keep = owned.data();
  }
  return owned;
}

}  // namespace

// The oracle's arithmetic (Real). For 16- and 32-bit storage, double: 29 bits
// finer than the f32 accumulation the naive modes round to, and, as a naive
// mode's operands and results are f32 values, its products are exact and its
// sums round as f32's (53 >= 2 * 24 + 2 bits, so rounding twice is
// innocuous). f64 storage needs an oracle finer than f64, so that a naive f64
// computation has a measurable error: long double, x87 extended (64-bit
// mantissa) on x86 and quad elsewhere, 3.5-6 times slower than double on
// x86 (the kernel tests took 229 s per ISA in long double throughout, 65 s
// in double) and emulated in software on Arm.
namespace oracle_double {
using Real = double;
#include "reference.inl"
}  // namespace oracle_double

namespace oracle_long_double {
using Real = long double;
#include "reference.inl"
}  // namespace oracle_long_double

void forward(const Options& opts, const TensorView& q, const TensorView& k, const TensorView& v,
             const TensorView& out, const TensorView& lse, Precision prec, const uint8_t* keep) {
  CallTensors t{&q, &k, &v, &out, &lse};
  const AttnParams p = make_params("reference::forward", CallKind::reference_forward, opts, t);
  const auto owned = keep_mask(p, keep);
  if (p.dtype == DType::f64) return oracle_long_double::forward(p, prec, keep);
  oracle_double::forward(p, prec, keep);
}

void backward(const Options& opts, const TensorView& q, const TensorView& k, const TensorView& v,
              const TensorView& dout, const Grads& grads, Precision prec, const uint8_t* keep,
              const ForwardOutputs* also) {
  CallTensors t{&q, &k, &v, nullptr, nullptr, &dout, &grads};
  const AttnParams p = make_params("reference::backward", CallKind::reference_backward, opts, t);
  AttnParams pf;
  if (also) {
    assert(prec != Precision::noise);
    CallTensors tf{&q, &k, &v, &also->out, &also->lse};
    pf = make_params("reference::backward", CallKind::reference_forward, opts, tf);
  }
  const AttnParams* fwd = also ? &pf : nullptr;
  const auto owned = keep_mask(p, keep);
  if (p.dtype == DType::f64) return oracle_long_double::backward(p, grads, prec, keep, fwd);
  oracle_double::backward(p, grads, prec, keep, fwd);
}

}  // namespace flashgrad::reference
