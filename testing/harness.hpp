// One description of an attention problem (Case) shared by the tests, the
// CLI's `check` and the benchmarks: it builds the tensors, runs the kernels
// and the references, and applies the tolerance rule
//   err(kernel) <= 2 * err(naive, same precision) + noise
// where both errors are max-abs against the f64 reference and the naive error
// is the worst of four naive computations (three summation orders, and the
// softmax as exp(S - m) / sum). noise is the final rounding, the larger of
// flash-attn's 2 * max |((ref + 0.3) - 0.3) - ref| in the storage dtype and
// one ulp of max |ref|, plus the largest first-order noise of an
// element (reference::Precision::noise: the softmax's exponents, and for dQ,
// dK, dsinks and dbias the cancellation dS = P * (dP - delta));
// docs/design.md, "The tolerance rule".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <dlpack/dlpack.h>

#include "flashgrad/flashgrad.hpp"
#include "dispatch.hpp"
#include "reference.hpp"

namespace flashgrad::testing {

enum class Layout { bshd, bhsd, padded };  // padded: rows padded and head_dim strided by 2
enum class BiasKind { none, full, bcast_batch, bcast_heads, key_row };  // key_row: [B, 1, 1, Lk]
enum class MaskKind { none, full, bcast_batch, key_padding };

struct Case {
  std::string name;
  DType dtype = DType::f32;
  int64_t batch = 1, seqlen_q = 8, seqlen_k = 8, heads_q = 1, heads_kv = 1;
  int64_t head_dim = 16, head_dim_v = 16;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  double softcap = 0.0;
  double softmax_scale = 0.0;  // 0: default
  bool alibi = false;
  double alibi_scale = 1.0;  // slope of head h: alibi_scale * 2^-(h % 8 + 1), rounded to f32
  BiasKind bias = BiasKind::none;
  DType bias_dtype = DType::f32;
  double bias_scale = 1.0;  // the bias's standard deviation
  bool dbias = false;
  MaskKind mask = MaskKind::none;
  bool sinks = false;
  std::vector<int32_t> seqlens_q, seqlens_k;  // non-empty: varlen (batch = size)
  double dropout_p = 0.0;
  uint64_t seed = 1234;
  Layout layout = Layout::bshd;
  int num_threads = 0;
  double input_scale = 1.0;  // q/k magnitude, for extreme-logit cases

  bool varlen() const { return !seqlens_q.empty(); }
  // 2 * (d + dv) per visible (query, key) pair, summed over batch and heads:
  // 4 * B * Hq * Lq * Lk * d, halved when causal (the benchmarks' convention),
  // and counting only the pairs a window lets through.
  double forward_flops() const;
  std::string describe() const;
};

// A tensor that owns its bytes; view() may be strided inside them.
struct Buffer {
  std::vector<unsigned char> bytes;
  TensorView view;
  bool present() const { return view.ndim > 0; }
};

struct Problem {
  Case c;
  Buffer q, k, v, dout, bias, mask, alibi, sinks, cu_q, cu_k;
  Options opts;
};

struct Outputs {
  Buffer out, lse, dq, dk, dv, dsinks, dbias;
};

Problem make_problem(const Case& c);

// Allocates outputs shaped for the problem: storage dtype (f64 for references).
Outputs make_outputs(const Problem& p, bool f64);

// Kernel forward, then kernel backward from the kernel's out and lse.
void run_kernels(const Problem& p, Outputs& o, bool backward = true);
void run_reference(const Problem& p, Outputs& o, reference::Precision prec, bool backward = true);

// n floats drawn uniformly from [-1, 1) by mt19937(seed): operands for the
// benchmarks' bare tile products and GEMMs.
std::vector<float> uniform_floats(size_t n, uint32_t seed);

// DLPack's type for a dtype, and a DLTensor over a view's memory for the C
// ABI (its shape and strides point into v, which must outlive it).
DLDataType dl_dtype(DType t);
DLTensor dl_view(const TensorView& v);

// A zeroed compact tensor (storage for at least one element).
Buffer contiguous(DType t, const std::vector<int64_t>& dims);

// Logical-order values of a view, as doubles.
std::vector<double> dense(const Buffer& b);
// Element offsets of a view in logical (row-major index) order.
std::vector<int64_t> offsets(const TensorView& v);
double read(const TensorView& v, int64_t offset);
void write(const TensorView& v, int64_t offset, double x);  // rounds to v's dtype
// Elements [start, start + len) of dimension dim (a view into the same memory).
TensorView slice(const TensorView& v, int dim, int64_t start, int64_t len);
// dst = src, or dst += src, element by element in logical order (same shapes).
void copy_values(const TensorView& src, const TensorView& dst);
void add_values(const TensorView& src, const TensorView& dst);

struct TensorError {
  std::string name;
  double err_kernel = 0, err_naive = 0, noise = 0, max_ref = 0;
  bool pass = true;
  double bound() const { return 2 * err_naive + noise; }
};

struct Report {
  std::vector<TensorError> tensors;
  bool complete = true;  // every term of the bound computed (Bound)
  bool pass() const;
  std::string table() const;
};

// How much of the bound to compute. Every term of it is a maximum of
// nonnegative quantities, so an output under the bound that part of the
// references give is under the whole bound. verdict runs the references in
// stages (the oracle and one naive order; the first-order noise; the other
// two naive orders) and stops at the first under which every output passes:
// the same verdict as full, at a fraction of the cost. full runs them all,
// for reports whose numbers are printed (flashgrad check, the demo).
enum class Bound { verdict, full };

// Runs kernels and the references, and applies the rule to every output.
Report check_case(const Case& c, bool backward = true, Bound bound = Bound::verdict);
// The rule applied to outputs the kernels already wrote for p (by any route,
// for example the C ABI).
Report compare_with_reference(const Problem& p, const Outputs& kernel, bool backward = true,
                              Bound bound = Bound::verdict);
// check_case on each of isas in turn (ScopedIsa), the references computed
// once for all of them: one report per ISA, in the order given.
std::vector<Report> check_case_on(const Case& c, const std::vector<Isa>& isas, bool backward = true,
                                  Bound bound = Bound::verdict);

// FLASHGRAD_ISA when it names an ISA this CPU lacks (tests then skip), else null.
const char* forced_isa_missing();
// The ISAs a test process checks: the one FLASHGRAD_ISA forces, else every
// one this CPU supports.
std::vector<Isa> isas_under_test();

// The matrix the CLI's `check` and the tests draw from.
std::vector<Case> edge_cases();
Case random_case(uint64_t seed);

}  // namespace flashgrad::testing
