#include "convert.hpp"

#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/exp_poly.hpp"

namespace flashgrad {
#define FG_DASSERT(x) assert(x)
namespace convert_detail {
#include "cpu/vec_scalar.inl"
#include "cpu/vec.inl"
}  // namespace convert_detail
#undef FG_DASSERT

namespace {

using convert_detail::bf16_t;
using convert_detail::f16_t;

double load(const char* p, DType t) {
  switch (t) {
    case DType::f64: return *reinterpret_cast<const double*>(p);
    case DType::bf16: return convert_detail::to_float(*reinterpret_cast<const bf16_t*>(p));
    case DType::f16: return convert_detail::to_float(*reinterpret_cast<const f16_t*>(p));
    default: return *reinterpret_cast<const float*>(p);
  }
}

void store(char* p, DType t, double x) {
  switch (t) {
    case DType::f64: *reinterpret_cast<double*>(p) = x; break;
    case DType::bf16: *reinterpret_cast<bf16_t*>(p) = convert_detail::from_acc<bf16_t>(x); break;
    case DType::f16: *reinterpret_cast<f16_t*>(p) = convert_detail::from_acc<f16_t>(x); break;
    default: *reinterpret_cast<float*>(p) = static_cast<float>(x); break;
  }
}

// Calls f(src_element, dst_element) over the 4-D index space (missing dims are 1).
template <typename F>
void for_pairs(const TensorView& src, const TensorView& dst, F&& f) {
  int64_t n[4] = {1, 1, 1, 1}, ss[4] = {0, 0, 0, 0}, ds[4] = {0, 0, 0, 0};
  const int pad = 4 - src.ndim;
  for (int i = 0; i < src.ndim; ++i) {
    assert(src.shape[i] == dst.shape[i]);
    n[pad + i] = src.shape[i];
    ss[pad + i] = src.strides[i] * dtype_size(src.dtype);
    ds[pad + i] = dst.strides[i] * dtype_size(dst.dtype);
  }
  const char* s = static_cast<const char*>(src.data);
  char* d = static_cast<char*>(dst.data);
  for (int64_t a = 0; a < n[0]; ++a)
    for (int64_t b = 0; b < n[1]; ++b)
      for (int64_t c = 0; c < n[2]; ++c) {
        const char* sr = s + a * ss[0] + b * ss[1] + c * ss[2];
        char* dr = d + a * ds[0] + b * ds[1] + c * ds[2];
        for (int64_t e = 0; e < n[3]; ++e) f(sr + e * ss[3], dr + e * ds[3]);
      }
}

}  // namespace

void convert_values(const TensorView& src, const TensorView& dst) {
  if (src.dtype == dst.dtype) {
    const size_t es = static_cast<size_t>(dtype_size(src.dtype));
    for_pairs(src, dst, [es](const char* s, char* d) { std::memcpy(d, s, es); });
  } else {
    for_pairs(src, dst, [&](const char* s, char* d) { store(d, dst.dtype, load(s, src.dtype)); });
  }
}

void accumulate_values(const TensorView& src, const TensorView& dst) {
  assert(src.dtype == dst.dtype);
  if (src.dtype == DType::f64)
    for_pairs(src, dst, [](const char* s, char* d) {
      *reinterpret_cast<double*>(d) += *reinterpret_cast<const double*>(s);
    });
  else
    for_pairs(src, dst, [](const char* s, char* d) {
      *reinterpret_cast<float*>(d) += *reinterpret_cast<const float*>(s);
    });
}

}  // namespace flashgrad
