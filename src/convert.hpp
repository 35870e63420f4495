// Element-wise copies between float views of the same shape, rounding to the
// destination dtype the way the kernels store results. For layers above the
// kernels (the ring layer's packing and its f32 accumulators); not validated.
#pragma once

#include "flashgrad/flashgrad.hpp"

namespace flashgrad {

// dst = src (up to 4-D; f32, f64, bf16 or f16 on either side).
void convert_values(const TensorView& src, const TensorView& dst);
// dst += src, both f32 or both f64.
void accumulate_values(const TensorView& src, const TensorView& dst);

}  // namespace flashgrad
