// Tile products through the libraries made for small GEMMs that Debian
// packages beside OpenBLAS and oneDNN: BLIS (libblis-dev, its typed API with
// general strides) and libxsmm (libxsmm-dev, a kernel JIT-compiled for the
// shape). `flashgrad-lab roofline` times them beside flashgrad's own tile
// product. They live apart from roofline.cpp because blis.h declares the
// BLAS and CBLAS functions that OpenBLAS's cblas.h declares too.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace flashgrad::tools {

// c [m, n] (row stride n) = A [m, k] * b [k, n] (row stride n); A is a
// [m, k] (row stride k), or with transposed_a a [k, m] (row stride m) read
// transposed, as the kernels read P and dS.
struct GemmShape {
  int64_t m, n, k;
  bool transposed_a;
};

// One call of the product on these operands, prepared once (libxsmm
// compiles its kernel here). Empty where the build lacks the library or
// the library cannot run the shape.
std::function<void()> blis_product(const GemmShape& s, const float* a, const float* b, float* c);
std::function<void()> libxsmm_product(const GemmShape& s, const float* a, const float* b, float* c);

// "0.9.0", or "1.17, JIT target cpx" (the code libxsmm generates for this
// CPU); "n/a" when the build lacks the library.
std::string blis_version();
std::string libxsmm_version();

}  // namespace flashgrad::tools
