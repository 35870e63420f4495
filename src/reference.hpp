// The reference: materialized attention, written as plainly as the equation in
// flashgrad.hpp. In f64 it is the spec and the oracle; in the storage
// precision it is the "naive same-precision computation" whose error sets the
// kernels' tolerance (each product rounded to the storage dtype, as a
// framework's unfused attention would).
#pragma once

#include <cstdint>

#include "flashgrad/flashgrad.hpp"

namespace flashgrad::reference {

// storage_reversed runs every sum in the opposite order, storage_fused
// runs the matrix products' sums as FMA chains (one rounding per term, the
// way f32 tile products and BLAS kernels run them), and storage_softmax
// takes P as a framework's softmax does, exp(S - m) / sum, where the others
// take exp(S - lse), so that the error of "a" naive computation is not
// judged by one lucky rounding sequence. noise
// returns, per element, the first-order rounding noise that any algorithm in
// the accumulation precision carries where one rounding sequence cannot
// measure it: the softmax's exponents (every output) and the cancellation
// dS = P * (dP - delta) of dP and delta summed apart (the gradients);
// reference_noise.inl, docs/design.md "The tolerance rule".
enum class Precision { f64, storage, storage_reversed, storage_fused, storage_softmax, noise };

// As flashgrad::forward, but out and lse are f64 views. keep: u8
// [batch, heads_q, seqlen_q, seqlen_k] contiguous (longest sequences when
// varlen), or null to use the kernels' dropout mask.
void forward(const Options& opts, const TensorView& q, const TensorView& k, const TensorView& v,
             const TensorView& out, const TensorView& lse, Precision prec,
             const uint8_t* keep = nullptr);

// Where backward also stores the out and lse it recomputes (f64 views shaped
// as forward's), saving a caller that wants both a second forward pass.
struct ForwardOutputs {
  const TensorView& out;
  const TensorView& lse;
};

// Gradients of sum(out * dout), recomputing out and lse itself; all grads f64.
// also: null, or where to store that out and lse (not in Precision::noise).
void backward(const Options& opts, const TensorView& q, const TensorView& k, const TensorView& v,
              const TensorView& dout, const Grads& grads, Precision prec,
              const uint8_t* keep = nullptr, const ForwardOutputs* also = nullptr);

}  // namespace flashgrad::reference
