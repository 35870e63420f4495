#include "small_gemm.hpp"

#if FLASHGRAD_HAVE_BLIS
#include <blis.h>
#include <dlfcn.h>
#endif
#if FLASHGRAD_HAVE_LIBXSMM
#include <libxsmm.h>
#endif

namespace flashgrad::tools {

#if FLASHGRAD_HAVE_BLIS
namespace {
// BLIS is opened on its own (RTLD_LOCAL): linked in, its cblas_sgemm and
// sgemm_ could come before OpenBLAS's in the symbol search, and the
// roofline's SGEMM and the naive baseline would run on BLIS unawares. Its
// own typed API is all this file calls.
struct Blis {
  decltype(&bli_sgemm) sgemm = nullptr;
  decltype(&bli_thread_set_num_threads) set_threads = nullptr;
  decltype(&bli_info_get_version_str) version = nullptr;
  Blis() {
    void* lib = nullptr;
    for (const char* name : {"libblis.so.4", "libblis.so"})
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!lib) return;
    sgemm = reinterpret_cast<decltype(sgemm)>(dlsym(lib, "bli_sgemm"));
    set_threads = reinterpret_cast<decltype(set_threads)>(dlsym(lib, "bli_thread_set_num_threads"));
    version = reinterpret_cast<decltype(version)>(dlsym(lib, "bli_info_get_version_str"));
    if (!sgemm || !set_threads || !version) sgemm = nullptr;
  }
};
const Blis& blis() {
  static const Blis b;
  return b;
}
}  // namespace
#endif

std::function<void()> blis_product(const GemmShape& s, const float* a, const float* b, float* c) {
#if FLASHGRAD_HAVE_BLIS
  const Blis& lib = blis();
  if (!lib.sgemm) return {};
  lib.set_threads(1);
  // General strides: the transposed view is A with unit row stride.
  const inc_t rsa = s.transposed_a ? 1 : s.k, csa = s.transposed_a ? s.m : 1;
  return [=, &lib] {
    float one = 1.0f, zero = 0.0f;
    lib.sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, s.m, s.n, s.k, &one, const_cast<float*>(a), rsa, csa,
              const_cast<float*>(b), s.n, 1, &zero, c, s.n, 1);
  };
#else
  (void)s, (void)a, (void)b, (void)c;
  return {};
#endif
}

std::function<void()> libxsmm_product(const GemmShape& s, const float* a, const float* b, float* c) {
#if FLASHGRAD_HAVE_LIBXSMM
  // libxsmm is column-major: row-major C = A B is C^T = B^T A^T there, with
  // b as its first operand ([n, k], leading dimension n) and a as its second
  // ([k, m], leading dimension k), or a transposed by the kernel (flag
  // TRANS_B, leading dimension m) when a holds A^T.
  const libxsmm_blasint m = s.n, n = s.m, k = s.k, lda = s.n, ldb = s.transposed_a ? s.m : s.k, ldc = s.n;
  const float alpha = 1.0f, beta = 0.0f;
  const int flags = s.transposed_a ? LIBXSMM_GEMM_FLAG_TRANS_B : LIBXSMM_GEMM_FLAG_NONE;
  const int prefetch = LIBXSMM_PREFETCH_NONE;
  const libxsmm_smmfunction kernel = libxsmm_smmdispatch(m, n, k, &lda, &ldb, &ldc, &alpha, &beta, &flags, &prefetch);
  if (!kernel) return {};
  return [=] { kernel(b, a, c); };
#else
  (void)s, (void)a, (void)b, (void)c;
  return {};
#endif
}

std::string blis_version() {
#if FLASHGRAD_HAVE_BLIS
  return blis().sgemm ? blis().version() : "n/a (libblis.so.4 not loaded)";
#else
  return "n/a";
#endif
}

std::string libxsmm_version() {
#if FLASHGRAD_HAVE_LIBXSMM
  return std::string(LIBXSMM_VERSION) + ", JIT target " + libxsmm_get_target_arch();
#else
  return "n/a";
#endif
}

}  // namespace flashgrad::tools
