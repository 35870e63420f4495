// The API boundary: every bad call throws one flashgrad::Error that names the
// function, the argument, what was expected and what was got, and leaves every
// output byte as it was; valid edge inputs (empty keys, empty varlen
// sequences, NaN scale) do not throw.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "flashgrad/flashgrad.hpp"
#include "harness.hpp"

namespace flashgrad::testing {
namespace {

constexpr unsigned char kSentinel = 0xA5;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// B=2, Lq=5, Lk=7, Hq=4, Hkv=2, d=dv=8 (equal so that out can alias q exactly).
Case base_case() {
  Case c;
  c.name = "errors";
  c.batch = 2;
  c.seqlen_q = 5;
  c.seqlen_k = 7;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 8;
  c.head_dim_v = 8;
  return c;
}

Case varlen_case() {
  Case c = base_case();
  c.seqlens_q = {3, 2};  // total_q 5
  c.seqlens_k = {4, 5};  // total_k 9
  return c;
}

enum class Fn { forward, backward, forward_ws, backward_ws };

const char* fn_name(Fn f) {
  switch (f) {
    case Fn::forward: return "forward";
    case Fn::backward: return "backward";
    case Fn::forward_ws: return "forward_workspace_bytes";
    case Fn::backward_ws: return "backward_workspace_bytes";
  }
  return "?";
}

// A valid problem whose views a test bends into a bad call. Every output
// buffer (and any buffer a test adds) is watched: filled with a sentinel
// before the call and compared after it.
struct Call {
  Problem p;
  Outputs o;
  std::deque<Buffer> extra;  // stable addresses
  Options opts;
  TensorView q, k, v, out, lse, dout;
  Grads g;
  std::vector<Buffer*> watched;

  explicit Call(const Case& c) : p(make_problem(c)), o(make_outputs(p, false)) {
    opts = p.opts;
    q = p.q.view;
    k = p.k.view;
    v = p.v.view;
    dout = p.dout.view;
    out = o.out.view;
    lse = o.lse.view;
    g.dq = o.dq.view;
    g.dk = o.dk.view;
    g.dv = o.dv.view;
    if (o.dsinks.present()) g.dsinks = o.dsinks.view;
    if (o.dbias.present()) g.dbias = o.dbias.view;
    for (Buffer* b : {&o.out, &o.lse, &o.dq, &o.dk, &o.dv, &o.dsinks, &o.dbias})
      if (b->present()) watched.push_back(b);
  }
  Call(const Call&) = delete;

  // A zeroed compact tensor (at least one element of storage), watched.
  TensorView make(DType t, std::vector<int64_t> dims) {
    Buffer& b = extra.emplace_back(contiguous(t, dims));
    watched.push_back(&b);
    return b.view;
  }
  void watch(Buffer& b) { watched.push_back(&b); }

  void run(Fn f) {
    switch (f) {
      case Fn::forward: forward(opts, q, k, v, out, lse); break;
      case Fn::backward: backward(opts, q, k, v, out, lse, dout, g); break;
      case Fn::forward_ws: forward_workspace_bytes(opts, q, k, v); break;
      case Fn::backward_ws: backward_workspace_bytes(opts, q, k, v); break;
    }
  }
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The call throws Error(code) naming fn and arg (and `also`, if given), with
// "expected" and "got", and no watched byte changes.
::testing::AssertionResult rejects(Call& c, Fn f, const std::string& arg, const std::string& also = "",
                                   Error::Code code = Error::Code::invalid_argument) {
  std::vector<std::vector<unsigned char>> before;
  for (Buffer* b : c.watched) {
    std::memset(b->bytes.data(), kSentinel, b->bytes.size());
    before.push_back(b->bytes);
  }
  std::string what;
  try {
    c.run(f);
    return ::testing::AssertionFailure() << fn_name(f) << " accepted a call that should fail on '" << arg << "'";
  } catch (const Error& e) {
    what = e.what();
    if (e.code() != code)
      return ::testing::AssertionFailure() << "wrong Error::code " << static_cast<int>(e.code()) << ": " << what;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-flashgrad exception: " << e.what();
  }
  const std::string head = std::string("flashgrad::") + fn_name(f) + ": ";
  if (what.rfind(head, 0) != 0)
    return ::testing::AssertionFailure() << "message does not start with '" << head << "': " << what;
  if (!arg.empty() && !contains(what, "argument '" + arg + "'"))
    return ::testing::AssertionFailure() << "message does not name argument '" << arg << "': " << what;
  if (!also.empty() && !contains(what, also))
    return ::testing::AssertionFailure() << "message does not mention " << also << ": " << what;
  if (!contains(what, "expected") || !contains(what, "got"))
    return ::testing::AssertionFailure() << "message lacks 'expected ... got ...': " << what;
  for (size_t i = 0; i < c.watched.size(); ++i)
    if (c.watched[i]->bytes != before[i])
      return ::testing::AssertionFailure() << "an output was written before the throw (buffer " << i
                                           << "); message: " << what;
  return ::testing::AssertionSuccess() << what;
}

using Mutate = std::function<void(Call&)>;

// The same bad call through each of fns, on a fresh problem each time.
void expect_rejected(const Case& cs, std::initializer_list<Fn> fns, const Mutate& mutate,
                     const std::string& arg, const std::string& also = "") {
  for (Fn f : fns) {
    Call c(cs);
    mutate(c);
    EXPECT_TRUE(rejects(c, f, arg, also)) << "in " << fn_name(f);
  }
}

const std::initializer_list<Fn> kBoth = {Fn::forward, Fn::backward};
const std::initializer_list<Fn> kAll = {Fn::forward, Fn::backward, Fn::forward_ws, Fn::backward_ws};
const std::initializer_list<Fn> kBwd = {Fn::backward};

// --- shapes ------------------------------------------------------------------

TEST(Errors, KeyValueSeqlenMismatch) {
  expect_rejected(base_case(), kAll, [](Call& c) { c.v = c.make(DType::f32, {2, 8, 2, 8}); }, "v");
}

TEST(Errors, BatchMismatch) {
  expect_rejected(base_case(), kAll, [](Call& c) { c.k = c.make(DType::f32, {3, 7, 2, 8}); }, "k");
  expect_rejected(base_case(), kAll, [](Call& c) { c.v = c.make(DType::f32, {1, 7, 2, 8}); }, "v");
}

TEST(Errors, WrongRank) {
  expect_rejected(base_case(), kAll, [](Call& c) { c.q = c.make(DType::f32, {10, 4, 8}); }, "q");
  expect_rejected(base_case(), kAll, [](Call& c) { c.q.ndim = 0; }, "q");
  expect_rejected(base_case(), kAll, [](Call& c) { c.k.ndim = 5; }, "k");
}

TEST(Errors, OutShapeWrong) {
  expect_rejected(base_case(), kBoth, [](Call& c) { c.out = c.make(DType::f32, {2, 5, 4, 9}); }, "out");
  expect_rejected(base_case(), kBoth, [](Call& c) { c.out = c.make(DType::f32, {2, 6, 4, 8}); }, "out");
}

TEST(Errors, LseShapeWrong) {
  // [batch, seqlen_q, heads_q] instead of [batch, heads_q, seqlen_q].
  expect_rejected(base_case(), kBoth, [](Call& c) { c.lse = c.make(DType::f32, {2, 5, 4}); }, "lse");
  expect_rejected(base_case(), kBoth, [](Call& c) { c.lse = c.make(DType::f32, {2, 4}); }, "lse");
}

TEST(Errors, GradShapesWrong) {
  expect_rejected(base_case(), kBwd, [](Call& c) { c.g.dq = c.make(DType::f32, {2, 5, 4, 9}); }, "dq");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.g.dk = c.make(DType::f32, {2, 8, 2, 8}); }, "dk");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.g.dv = c.make(DType::f32, {2, 7, 4, 8}); }, "dv");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.dout = c.make(DType::f32, {2, 5, 4, 7}); }, "dout");
}

TEST(Errors, HeadsQNotMultipleOfHeadsKv) {
  auto hkv = [](int64_t n) {
    return [n](Call& c) {
      c.k = c.make(DType::f32, {2, 7, n, 8});
      c.v = c.make(DType::f32, {2, 7, n, 8});
    };
  };
  expect_rejected(base_case(), kAll, hkv(3), "k");
  expect_rejected(base_case(), kAll, hkv(0), "k");
}

TEST(Errors, HeadDimOutOfRange) {
  for (int64_t d : {int64_t{0}, int64_t{513}}) {
    expect_rejected(base_case(), kAll, [d](Call& c) {
      c.q = c.make(DType::f32, {2, 5, 4, d});
      c.k = c.make(DType::f32, {2, 7, 2, d});
      c.g.dq = c.make(DType::f32, {2, 5, 4, d});
      c.g.dk = c.make(DType::f32, {2, 7, 2, d});
    }, "q");
    expect_rejected(base_case(), kAll, [d](Call& c) {
      c.v = c.make(DType::f32, {2, 7, 2, d});
      c.out = c.make(DType::f32, {2, 5, 4, d});
      c.dout = c.make(DType::f32, {2, 5, 4, d});
      c.g.dv = c.make(DType::f32, {2, 7, 2, d});
    }, "v");
  }
}

TEST(Errors, HeadDimMismatch) {
  expect_rejected(base_case(), kAll, [](Call& c) { c.k = c.make(DType::f32, {2, 7, 2, 9}); }, "k");
}

TEST(Errors, NegativeSize) {
  expect_rejected(base_case(), kAll, [](Call& c) { c.q.shape[1] = -5; }, "q");
}

// --- dtypes ------------------------------------------------------------------

TEST(Errors, MixedInputDtypes) {
  expect_rejected(base_case(), kAll, [](Call& c) { c.k = c.make(DType::f16, {2, 7, 2, 8}); }, "k");
  expect_rejected(base_case(), kAll, [](Call& c) { c.v = c.make(DType::bf16, {2, 7, 2, 8}); }, "v");
}

TEST(Errors, UnsupportedInputDtype) {
  for (DType t : {DType::i32, DType::u8}) {
    expect_rejected(base_case(), kAll, [t](Call& c) {
      c.q = c.make(t, {2, 5, 4, 8});
      c.k = c.make(t, {2, 7, 2, 8});
      c.v = c.make(t, {2, 7, 2, 8});
    }, "q", dtype_name(t));
  }
}

TEST(Errors, WrongOutputDtype) {
  expect_rejected(base_case(), kBoth, [](Call& c) { c.out = c.make(DType::f16, {2, 5, 4, 8}); }, "out");
  // f64 lse is only for f64 storage.
  expect_rejected(base_case(), kBoth, [](Call& c) { c.lse = c.make(DType::f64, {2, 4, 5}); }, "lse");
  expect_rejected(base_case(), kBoth, [](Call& c) { c.lse = c.make(DType::f16, {2, 4, 5}); }, "lse");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.g.dq = c.make(DType::f64, {2, 5, 4, 8}); }, "dq");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.g.dv = c.make(DType::bf16, {2, 7, 2, 8}); }, "dv");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.dout = c.make(DType::f16, {2, 5, 4, 8}); }, "dout");
}

// --- data pointers, aliasing, strides -----------------------------------------

TEST(Errors, NullDataWithElements) {
  expect_rejected(base_case(), kAll, [](Call& c) { c.q.data = nullptr; }, "q");
  expect_rejected(base_case(), kAll, [](Call& c) { c.k.data = nullptr; }, "k");
  expect_rejected(base_case(), kAll, [](Call& c) { c.v.data = nullptr; }, "v");
  expect_rejected(base_case(), kBoth, [](Call& c) { c.out.data = nullptr; }, "out");
  expect_rejected(base_case(), kBoth, [](Call& c) { c.lse.data = nullptr; }, "lse");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.dout.data = nullptr; }, "dout");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.g.dq.data = nullptr; }, "dq");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.g.dk.data = nullptr; }, "dk");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.g.dv.data = nullptr; }, "dv");
}

TEST(Errors, OutputAliasesInput) {
  // (In backward, out is an input: inputs may alias each other.)
  expect_rejected(base_case(), {Fn::forward}, [](Call& c) {
    c.watch(c.p.q);
    c.out.data = c.q.data;
  }, "out", "'q'");
  expect_rejected(base_case(), {Fn::forward}, [](Call& c) {  // partial overlap: v at 0..224, out at 100..420
    const TensorView arena = c.make(DType::f32, {420});
    c.v.data = arena.data;
    c.out.data = static_cast<float*>(arena.data) + 100;
  }, "out", "'v'");
  expect_rejected(base_case(), kBwd, [](Call& c) {
    c.watch(c.p.dout);
    c.g.dv.data = c.dout.data;
  }, "dv", "'dout'");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.lse.data = c.g.dq.data; }, "dq", "'lse'");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.g.dq.data = c.out.data; }, "dq", "'out'");
}

TEST(Errors, OutputsOverlapEachOther) {
  expect_rejected(base_case(), {Fn::forward}, [](Call& c) { c.lse.data = c.out.data; }, "lse", "'out'");
  expect_rejected(base_case(), kBwd, [](Call& c) {
    // dk starts 10 elements into dq's 320.
    c.g.dk.data = static_cast<float*>(c.g.dq.data) + 10;
  }, "dk", "'dq'");
}

TEST(Errors, OutputWithStrideZero) {
  expect_rejected(base_case(), {Fn::forward}, [](Call& c) { c.out.strides[1] = 0; }, "out");
  expect_rejected(base_case(), {Fn::forward}, [](Call& c) { c.lse.strides[2] = 0; }, "lse");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.g.dq.strides[0] = 0; }, "dq");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.g.dk.strides[2] = 0; }, "dk");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.g.dv.strides[3] = 0; }, "dv");
}

TEST(Errors, ElementCountOverflow) {
  // [2^40, 2^40, 1, 1] over a real (small) buffer: must fail before any access.
  auto huge = [](TensorView& t) {
    t.shape[0] = t.shape[1] = int64_t{1} << 40;
    t.shape[2] = t.shape[3] = 1;
    t.strides[0] = int64_t{1} << 40;
    t.strides[1] = t.strides[2] = t.strides[3] = 1;
  };
  expect_rejected(base_case(), kAll, [&](Call& c) { huge(c.q); }, "q");
  expect_rejected(base_case(), kBoth, [&](Call& c) { huge(c.out); }, "out");
  expect_rejected(base_case(), kBwd, [&](Call& c) { huge(c.g.dq); }, "dq");
  // A count that fits but a stride extent that does not.
  expect_rejected(base_case(), kAll, [](Call& c) { c.k.strides[0] = c.k.strides[1] = int64_t{1} << 62; }, "k");
  // A count that fits but a byte extent that does not: 2^61 f32.
  expect_rejected(base_case(), kAll, [](Call& c) {
    c.v.shape[0] = int64_t{1} << 31;
    c.v.shape[1] = int64_t{1} << 30;
    c.v.shape[2] = c.v.shape[3] = 1;
    c.v.strides[0] = int64_t{1} << 30;
    c.v.strides[1] = c.v.strides[2] = c.v.strides[3] = 1;
  }, "v");
}

// --- optional inputs -----------------------------------------------------------

TEST(Errors, BiasNotBroadcastable) {
  auto with_bias = [](std::vector<int64_t> dims, DType t = DType::f32) {
    return [dims, t](Call& c) { c.opts.bias = c.make(t, dims); };
  };
  expect_rejected(base_case(), kAll, with_bias({2, 4, 5, 8}), "bias");  // seqlen_k 8 != 7
  expect_rejected(base_case(), kAll, with_bias({2, 4, 7, 5}), "bias");  // seqlen dims swapped
  expect_rejected(base_case(), kAll, with_bias({2, 2, 5, 7}), "bias");  // heads 2 != 4, 1
  expect_rejected(base_case(), kAll, with_bias({4, 5, 7}), "bias");     // rank 3
  expect_rejected(base_case(), kAll, with_bias({2, 4, 5, 7}, DType::i32), "bias");
  expect_rejected(base_case(), kAll, with_bias({2, 4, 5, 7}, DType::u8), "bias");
  expect_rejected(base_case(), kAll, [](Call& c) {
    c.opts.bias = c.make(DType::f32, {2, 4, 5, 7});
    c.opts.bias->data = nullptr;
  }, "bias");
}

TEST(Errors, MaskNotBroadcastableOrNotU8) {
  auto with_mask = [](std::vector<int64_t> dims, DType t = DType::u8) {
    return [dims, t](Call& c) { c.opts.mask = c.make(t, dims); };
  };
  expect_rejected(base_case(), kAll, with_mask({2, 1, 1, 6}), "mask");
  expect_rejected(base_case(), kAll, with_mask({1, 1, 6, 7}), "mask");
  expect_rejected(base_case(), kAll, with_mask({2, 4, 5, 7}, DType::f32), "mask");
  expect_rejected(base_case(), kAll, with_mask({2, 4, 5, 7}, DType::i32), "mask");
}

TEST(Errors, AlibiWrongShapeOrDtype) {
  auto with_alibi = [](std::vector<int64_t> dims, DType t = DType::f32) {
    return [dims, t](Call& c) { c.opts.alibi_slopes = c.make(t, dims); };
  };
  expect_rejected(base_case(), kAll, with_alibi({5}), "alibi_slopes");
  expect_rejected(base_case(), kAll, with_alibi({4, 2}), "alibi_slopes");  // [heads, batch]
  expect_rejected(base_case(), kAll, with_alibi({3, 4}), "alibi_slopes");
  expect_rejected(base_case(), kAll, with_alibi({2, 4, 1}), "alibi_slopes");
  expect_rejected(base_case(), kAll, with_alibi({4}, DType::f64), "alibi_slopes");
}

TEST(Errors, SinksWrongShapeOrDtype) {
  auto with_sinks = [](std::vector<int64_t> dims, DType t = DType::f32) {
    return [dims, t](Call& c) { c.opts.sinks = c.make(t, dims); };
  };
  expect_rejected(base_case(), kAll, with_sinks({5}), "sinks");
  expect_rejected(base_case(), kAll, with_sinks({2}), "sinks");   // heads_kv, not heads_q
  expect_rejected(base_case(), kAll, with_sinks({1, 4}), "sinks");
  expect_rejected(base_case(), kAll, with_sinks({4}, DType::f64), "sinks");
  expect_rejected(base_case(), kAll, with_sinks({4}, DType::bf16), "sinks");
}

TEST(Errors, GradientOfAbsentInput) {
  expect_rejected(base_case(), kBwd, [](Call& c) { c.g.dsinks = c.make(DType::f32, {4}); }, "dsinks");
  expect_rejected(base_case(), kBwd, [](Call& c) { c.g.dbias = c.make(DType::f32, {2, 4, 5, 7}); }, "dbias");
}

TEST(Errors, SinkAndBiasGradientsWrong) {
  Case cs = base_case();
  cs.sinks = true;
  expect_rejected(cs, kBwd, [](Call& c) { c.g.dsinks = c.make(DType::f32, {5}); }, "dsinks");
  expect_rejected(cs, kBwd, [](Call& c) { c.g.dsinks = c.make(DType::f16, {4}); }, "dsinks");
  expect_rejected(cs, kBwd, [](Call& c) { c.g.dsinks->strides[0] = 0; }, "dsinks");
  expect_rejected(cs, kBwd, [](Call& c) { c.g.dsinks->data = c.opts.sinks->data; }, "dsinks", "'sinks'");
  cs = base_case();
  cs.bias = BiasKind::full;
  cs.dbias = true;
  expect_rejected(cs, kBwd, [](Call& c) { c.g.dbias = c.make(DType::f32, {1, 4, 5, 7}); }, "dbias");
  expect_rejected(cs, kBwd, [](Call& c) { c.g.dbias = c.make(DType::bf16, {2, 4, 5, 7}); }, "dbias");
  expect_rejected(cs, kBwd, [](Call& c) { c.g.dbias->data = c.opts.bias->data; }, "dbias", "'bias'");
}

// --- varlen --------------------------------------------------------------------

void set_offsets(TensorView& cu, std::vector<int32_t> offs) {
  ASSERT_EQ(cu.shape[0], static_cast<int64_t>(offs.size()));
  std::memcpy(cu.data, offs.data(), offs.size() * sizeof(int32_t));
}

TEST(Errors, CuSeqlensDecreasing) {
  expect_rejected(varlen_case(), kAll, [](Call& c) { set_offsets(*c.opts.cu_seqlens_q, {0, 4, 3}); },
                  "cu_seqlens_q");
  expect_rejected(varlen_case(), kAll, [](Call& c) { set_offsets(*c.opts.cu_seqlens_k, {-1, 4, 9}); },
                  "cu_seqlens_k");
}

TEST(Errors, CuSeqlensPastPackedTotal) {
  expect_rejected(varlen_case(), kAll, [](Call& c) { set_offsets(*c.opts.cu_seqlens_q, {0, 3, 6}); },
                  "cu_seqlens_q");
  expect_rejected(varlen_case(), kAll, [](Call& c) { set_offsets(*c.opts.cu_seqlens_k, {0, 4, 10}); },
                  "cu_seqlens_k");
}

TEST(Errors, OnlyOneCuSeqlens) {
  expect_rejected(varlen_case(), kAll, [](Call& c) { c.opts.cu_seqlens_k.reset(); }, "cu_seqlens_k");
  expect_rejected(varlen_case(), kAll, [](Call& c) { c.opts.cu_seqlens_q.reset(); }, "cu_seqlens_q");
}

TEST(Errors, CuSeqlensBatchSizesDiffer) {
  expect_rejected(varlen_case(), kAll, [](Call& c) {
    c.opts.cu_seqlens_k = c.make(DType::i32, {4});
    set_offsets(*c.opts.cu_seqlens_k, {0, 4, 5, 9});
  }, "cu_seqlens_k");
}

TEST(Errors, CuSeqlensWrongDtypeOrNull) {
  expect_rejected(varlen_case(), kAll, [](Call& c) { c.opts.cu_seqlens_q = c.make(DType::f32, {3}); },
                  "cu_seqlens_q");
  expect_rejected(varlen_case(), kAll, [](Call& c) { c.opts.cu_seqlens_k->data = nullptr; }, "cu_seqlens_k");
}

TEST(Errors, VarlenShapes) {
  // Varlen lse is [heads_q, total_q]; the padded [batch, heads_q, seqlen_q] is wrong.
  expect_rejected(varlen_case(), kBoth, [](Call& c) { c.lse = c.make(DType::f32, {2, 4, 3}); }, "lse");
  expect_rejected(varlen_case(), kAll, [](Call& c) { c.q = c.make(DType::f32, {1, 5, 4, 8}); }, "q");
}

// --- scalar options ------------------------------------------------------------

TEST(Errors, WindowBelowMinusOne) {
  for (int64_t w : {int64_t{-2}, std::numeric_limits<int64_t>::min()}) {
    expect_rejected(base_case(), kAll, [w](Call& c) { c.opts.window_left = w; }, "window_left");
    expect_rejected(base_case(), kAll, [w](Call& c) { c.opts.window_right = w; }, "window_right");
  }
}

// f32 results are for 16-bit storage only, and dq, dk, dv share one dtype.
TEST(Errors, F32ResultsOnlyWithHalfStorage) {
  Case f64 = base_case();
  f64.dtype = DType::f64;
  expect_rejected(f64, kBoth, [](Call& c) { c.out = c.make(DType::f32, {2, 5, 4, 8}); }, "out", "f64");
  Case half = base_case();
  half.dtype = DType::bf16;
  expect_rejected(half, kBwd, [](Call& c) { c.g.dq = c.make(DType::f32, {2, 5, 4, 8}); }, "dk", "f32");
  expect_rejected(half, kBwd, [](Call& c) { c.g.dk = c.make(DType::f32, {2, 7, 2, 8}); }, "dk", "bf16");
}

TEST(Errors, BlockOutOfRangeOrWithVarlen) {
  auto block = [](int64_t qo, int64_t ko, int64_t tq, int64_t tk) {
    return [=](Call& c) { c.opts.block = Options::Block{qo, ko, tq, tk}; };
  };
  expect_rejected(base_case(), kAll, block(-1, 0, 9, 9), "block", "q_offset = -1");
  expect_rejected(base_case(), kAll, block(5, 0, 9, 9), "block", "seqlen_q_total = 9");
  expect_rejected(base_case(), kAll, block(0, 3, 9, 9), "block", "k_offset = 3");
  expect_rejected(base_case(), kAll, block(0, 0, 9, 6), "block", "seqlen_k_total = 6");
  expect_rejected(varlen_case(), kAll, block(0, 0, 9, 9), "block", "cu_seqlens");
}

TEST(Errors, MergeArguments) {
  auto buf = [](DType t, std::vector<int64_t> d) { return contiguous(t, d); };
  Buffer oa = buf(DType::f32, {2, 5, 3, 8}), la = buf(DType::f32, {2, 3, 5});
  Buffer op = buf(DType::f32, {2, 5, 3, 8}), lp = buf(DType::f32, {2, 3, 5});
  Buffer op_bad = buf(DType::f32, {2, 5, 3, 7}), lp_half = buf(DType::bf16, {2, 3, 5});
  Buffer la_bad = buf(DType::f32, {2, 5, 3});
  auto expect_throw = [](const std::function<void()>& f, const std::string& arg, const std::string& also) {
    try {
      f();
      ADD_FAILURE() << "merge accepted a bad '" << arg << "'";
    } catch (const Error& e) {
      const std::string w = e.what();
      EXPECT_TRUE(contains(w, "flashgrad::merge: argument '" + arg + "'") && contains(w, also) &&
                  contains(w, "expected") && contains(w, "got"))
          << w;
    }
  };
  expect_throw([&] { merge(oa.view, la.view, op_bad.view, lp.view); }, "o_part", "[2, 5, 3, 7]");
  expect_throw([&] { merge(oa.view, la.view, op.view, lp_half.view); }, "lse_part", "bf16");
  expect_throw([&] { merge(oa.view, la_bad.view, op.view, lp.view); }, "lse_acc", "[batch, heads, seqlen]");
  expect_throw([&] { merge(oa.view, la.view, oa.view, lp.view); }, "o_acc", "overlap");
  expect_throw([&] { merge(oa.view, la.view, op.view, lp.view, -1); }, "num_threads", "-1");
}

TEST(Errors, DropoutOutOfRange) {
  for (double pr : {1.0, -0.1, kNaN, kInf})
    expect_rejected(base_case(), kAll, [pr](Call& c) { c.opts.dropout_p = pr; }, "dropout_p");
}

TEST(Errors, SoftmaxScaleInfinite) {
  expect_rejected(base_case(), kAll, [](Call& c) { c.opts.softmax_scale = kInf; }, "softmax_scale");
}

TEST(Errors, SoftcapNegativeOrNotFinite) {
  for (double s : {-1.0, kInf, kNaN})
    expect_rejected(base_case(), kAll, [s](Call& c) { c.opts.softcap = s; }, "softcap");
}

TEST(Errors, NumThreadsNegative) {
  expect_rejected(base_case(), kAll, [](Call& c) { c.opts.num_threads = -1; }, "num_threads");
}

// A broadcast q/k/v (stride 0) of any length is a valid input: the workspace
// it needs is reported, or refused with an Error, but never wrapped around.
// More query rows never need less workspace.
TEST(Errors, WorkspaceQueryDoesNotOverflow) {
  double storage[4] = {};
  for (DType t : {DType::f32, DType::f64}) {
    for (Fn f : {Fn::forward_ws, Fn::backward_ws}) {
      int64_t prev = 0;
      for (int lg : {40, 56, 59, 60, 61, 62}) {
        SCOPED_TRACE(std::string(fn_name(f)) + " " + dtype_name(t) + " seqlen 2^" + std::to_string(lg));
        TensorView q = TensorView::strided(storage, t, {1, 1, 1, 1}, {0, 0, 0, 0});
        q.shape[1] = int64_t{1} << lg;
        Options o;
        try {
          const int64_t n = f == Fn::forward_ws ? forward_workspace_bytes(o, q, q, q)
                                                : backward_workspace_bytes(o, q, q, q);
          EXPECT_GT(n, 0);
          EXPECT_GE(n, prev);
          prev = std::max(prev, n);
        } catch (const Error& e) {
          EXPECT_EQ(std::string(e.what()).rfind(std::string("flashgrad::") + fn_name(f), 0), 0u) << e.what();
          break;
        }
      }
    }
  }
}

// --- workspace limit -------------------------------------------------------------

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(Errors, WorkspaceLimitIsOutOfMemory) {
  for (Fn f : {Fn::forward, Fn::backward}) {
    Case cs = base_case();
    cs.bias = BiasKind::full;  // dbias is zeroed by the API itself: it must not be either
    cs.dbias = true;
    cs.sinks = true;
    Call c(cs);
    const int64_t need = f == Fn::forward ? forward_workspace_bytes(c.opts, c.q, c.k, c.v)
                                          : backward_workspace_bytes(c.opts, c.q, c.k, c.v);
    ASSERT_GT(need, 16);
    ScopedEnv env("FLASHGRAD_WORKSPACE_LIMIT", "16");
    EXPECT_TRUE(rejects(c, f, "", "workspace", Error::Code::out_of_memory)) << fn_name(f);
  }
  // The limit is read per call: without it the same call succeeds.
  Call c(base_case());
  EXPECT_NO_THROW(c.run(Fn::forward));
}

// --- valid edge inputs -------------------------------------------------------------

TEST(ValidEdges, NoKeys) {
  for (bool sinks : {false, true}) {
    SCOPED_TRACE(sinks ? "sinks" : "no sinks");
    Case cs = base_case();
    cs.seqlen_k = 0;
    cs.sinks = sinks;
    Call c(cs);
    c.k.data = nullptr;  // no elements: a null pointer is fine
    c.v.data = nullptr;
    ASSERT_NO_THROW(c.run(Fn::forward));
    ASSERT_NO_THROW(c.run(Fn::backward));
    for (double x : dense(c.o.out)) EXPECT_EQ(x, 0.0);
    const auto lse = dense(c.o.lse), sk = dense(c.p.sinks);
    for (size_t i = 0; i < lse.size(); ++i) {
      const size_t h = (i / 5) % 4;  // lse [2, 4, 5]
      EXPECT_EQ(lse[i], sinks ? sk[h] : -kInf) << i;
    }
    for (double x : dense(c.o.dq)) EXPECT_EQ(x, 0.0);
    if (sinks) {
      for (double x : dense(c.o.dsinks)) EXPECT_EQ(x, 0.0);
    }
  }
}

TEST(ValidEdges, NoQueries) {
  Case cs = base_case();
  cs.seqlen_q = 0;
  Call c(cs);
  ASSERT_NO_THROW(c.run(Fn::forward));
  ASSERT_NO_THROW(c.run(Fn::backward));
  // Gradients are overwritten, not accumulated: with no query they are 0.
  for (double x : dense(c.o.dk)) EXPECT_EQ(x, 0.0);
  for (double x : dense(c.o.dv)) EXPECT_EQ(x, 0.0);
}

TEST(ValidEdges, EmptyVarlenSequences) {
  Case cs = base_case();
  cs.seqlens_q = {3, 0, 4, 2};
  cs.seqlens_k = {5, 2, 0, 3};
  const Report r = check_case(cs);
  EXPECT_TRUE(r.pass()) << r.table();

  Call c(cs);
  ASSERT_NO_THROW(c.run(Fn::forward));
  ASSERT_NO_THROW(c.run(Fn::backward));
  // Sequence 2 (q rows 3..6) has no keys: out 0, lse -inf, dq 0.
  const auto out = dense(c.o.out), lse = dense(c.o.lse), dq = dense(c.o.dq), dk = dense(c.o.dk),
             dv = dense(c.o.dv);
  const int64_t H = 4, D = 8, total_q = 9;
  for (int64_t i = 3; i < 7; ++i)
    for (int64_t h = 0; h < H; ++h) {
      EXPECT_EQ(lse[h * total_q + i], -kInf) << i;
      for (int64_t d = 0; d < D; ++d) {
        EXPECT_EQ(out[(i * H + h) * D + d], 0.0);
        EXPECT_EQ(dq[(i * H + h) * D + d], 0.0);
      }
    }
  // Sequence 1 (k rows 5..6) has no queries: dk = dv = 0 there.
  for (int64_t j = 5; j < 7; ++j)
    for (int64_t x = 0; x < 2 * D; ++x) {
      EXPECT_EQ(dk[j * 2 * D + x], 0.0);
      EXPECT_EQ(dv[j * 2 * D + x], 0.0);
    }
  for (double x : out) EXPECT_TRUE(std::isfinite(x));
  for (double x : dq) EXPECT_TRUE(std::isfinite(x));
}

TEST(ValidEdges, NanSoftmaxScaleIsDefault) {
  const double dflt = 1.0 / std::sqrt(8.0);
  std::vector<std::vector<double>> outs, lses, dqs;
  for (double s : {dflt, kNaN, 0.0, -1.0}) {
    Case cs = base_case();
    cs.softmax_scale = s;
    Call c(cs);
    ASSERT_NO_THROW(c.run(Fn::forward)) << s;
    ASSERT_NO_THROW(c.run(Fn::backward)) << s;
    outs.push_back(dense(c.o.out));
    lses.push_back(dense(c.o.lse));
    dqs.push_back(dense(c.o.dq));
  }
  for (size_t i = 1; i < outs.size(); ++i) {
    EXPECT_EQ(outs[i], outs[0]) << i;
    EXPECT_EQ(lses[i], lses[0]) << i;
    EXPECT_EQ(dqs[i], dqs[0]) << i;
  }
  // And the default is not a no-op: another scale changes the result.
  Case cs = base_case();
  cs.softmax_scale = 2 * dflt;
  Call c(cs);
  c.run(Fn::forward);
  EXPECT_NE(dense(c.o.lse), lses[0]);
}

// A window wider than any sequence is the same as no window (bounds must not
// overflow): i' + window_right and i' - window_left with i' = i + Lk - Lq.
TEST(ValidEdges, HugeWindowsAreUnbounded) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  for (auto [lq, lk] : {std::pair<int64_t, int64_t>{5, 7}, std::pair<int64_t, int64_t>{9, 3}}) {
    SCOPED_TRACE("Lq " + std::to_string(lq) + " Lk " + std::to_string(lk));
    Case cs = base_case();
    cs.seqlen_q = lq;
    cs.seqlen_k = lk;
    Call ref(cs), wide(cs);
    wide.opts.window_left = big;
    wide.opts.window_right = big;
    ref.run(Fn::forward);
    ref.run(Fn::backward);
    ASSERT_NO_THROW(wide.run(Fn::forward));
    ASSERT_NO_THROW(wide.run(Fn::backward));
    EXPECT_EQ(dense(wide.o.out), dense(ref.o.out));
    EXPECT_EQ(dense(wide.o.lse), dense(ref.o.lse));
    EXPECT_EQ(dense(wide.o.dk), dense(ref.o.dk));
  }
}

TEST(ValidEdges, WorkspaceQueriesAcceptValidInputs) {
  Call c(base_case());
  EXPECT_GT(forward_workspace_bytes(c.opts, c.q, c.k, c.v), 0);
  EXPECT_GT(backward_workspace_bytes(c.opts, c.q, c.k, c.v), 0);
  Call v(varlen_case());
  EXPECT_GT(forward_workspace_bytes(v.opts, v.q, v.k, v.v), 0);
}

}  // namespace
}  // namespace flashgrad::testing
