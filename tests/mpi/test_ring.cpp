// Ring attention under mpirun (1 to 4 ranks): every rank builds the same
// global problem, runs the ring on its shard, and rank 0 reassembles the
// shards and applies the core's tolerance rule against the f64 reference of
// the whole (harness.hpp). Also: determinism for a fixed number of ranks,
// shard/unshard, and a bad input on one rank failing on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "flashgrad/ring.h"
#include "flashgrad/ring.hpp"
#include "harness.hpp"

namespace flashgrad::testing {
namespace {

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world() {
  int w = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}

// Row runs of every rank: zigzag from shard_rows, or explicit contiguous
// lengths (which may differ between q and k and between ranks).
struct Split {
  Sharding sharding = Sharding::contiguous;
  std::vector<int64_t> q_len, k_len;  // contiguous only; empty: the even split

  std::vector<RowRange> rows(int r, int64_t total, bool keys) const {
    const auto& len = keys ? k_len : q_len;
    if (sharding == Sharding::zigzag || len.empty()) return shard_rows(sharding, total, r, world());
    int64_t at = 0;
    for (int i = 0; i < r; ++i) at += len[static_cast<size_t>(i)];
    return {{at, len[static_cast<size_t>(r)]}};
  }
};

int64_t count(const std::vector<RowRange>& rs) {
  int64_t n = 0;
  for (const auto& r : rs) n += r.length;
  return n;
}

std::vector<int64_t> dims_with(const TensorView& v, int dim, int64_t n) {
  std::vector<int64_t> d(v.shape, v.shape + v.ndim);
  d[static_cast<size_t>(dim)] = n;
  return d;
}

// local <- the rows of global (dimension dim), or global <- local.
void gather_rows(const std::vector<RowRange>& rs, const TensorView& global, const TensorView& local, int dim,
                 bool to_local) {
  int64_t at = 0;
  for (const auto& r : rs) {
    const TensorView g = slice(global, dim, r.start, r.length), l = slice(local, dim, at, r.length);
    to_local ? copy_values(g, l) : copy_values(l, g);
    at += r.length;
  }
}

// A DLTensor over a view (f32 only here).
struct Dl {
  std::vector<int64_t> shape, strides;
  DLTensor t{};
  explicit Dl(const TensorView& v) : shape(v.shape, v.shape + v.ndim), strides(v.strides, v.strides + v.ndim) {
    t.data = v.data;
    t.device = {kDLCPU, 0};
    t.ndim = v.ndim;
    t.dtype = {kDLFloat, 32, 1};
    t.shape = shape.data();
    t.strides = strides.data();
  }
};

// This rank's part of the problem.
struct Local {
  Buffer q, k, v, dout, bias, mask, out, lse, dq, dk, dv, dsinks, dbias;
  Options opts;
};

Local make_local(const Problem& p, const Split& s, int r) {
  const auto qr = s.rows(r, p.c.seqlen_q, false), kr = s.rows(r, p.c.seqlen_k, true);
  const int64_t lq = count(qr), lk = count(kr);
  Local l;
  auto take = [&](const Buffer& g, const std::vector<RowRange>& rs, int64_t n, int dim = 1) {
    Buffer b = contiguous(g.view.dtype, dims_with(g.view, dim, n));
    gather_rows(rs, g.view, b.view, dim, true);
    return b;
  };
  l.q = take(p.q, qr, lq);
  l.k = take(p.k, kr, lk);
  l.v = take(p.v, kr, lk);
  l.dout = take(p.dout, qr, lq);
  l.opts = p.opts;
  // bias/mask: this rank's query rows against every global key (a
  // broadcast row dimension stays in p's buffer).
  if (p.bias.present() && p.bias.view.shape[2] != 1) {
    l.bias = take(p.bias, qr, lq, 2);
    l.opts.bias = l.bias.view;
  }
  if (p.mask.present() && p.mask.view.shape[2] != 1) {
    l.mask = take(p.mask, qr, lq, 2);
    l.opts.mask = l.mask.view;
  }
  const DType t = p.c.dtype, acc = t == DType::f64 ? DType::f64 : DType::f32;
  const int64_t B = p.c.batch, H = p.c.heads_q, Hk = p.c.heads_kv, d = p.c.head_dim, dv = p.c.head_dim_v;
  l.out = contiguous(t, {B, lq, H, dv});
  l.lse = contiguous(acc, {B, H, lq});
  l.dq = contiguous(t, {B, lq, H, d});
  l.dk = contiguous(t, {B, lk, Hk, d});
  l.dv = contiguous(t, {B, lk, Hk, dv});
  if (p.c.sinks) l.dsinks = contiguous(acc, {H});
  if (p.c.dbias) l.dbias = contiguous(acc, dims_with(p.bias.view, 2, p.bias.view.shape[2] == 1 ? 1 : lq));
  return l;
}

void run_ring(Local& l, Sharding sharding) {
  RingOptions ro;
  ro.sharding = sharding;
  ring_forward(l.opts, ro, l.q.view, l.k.view, l.v.view, l.out.view, l.lse.view);
  Grads g{l.dq.view, l.dk.view, l.dv.view, std::nullopt, std::nullopt};
  if (l.dsinks.present()) g.dsinks = l.dsinks.view;
  if (l.dbias.present()) g.dbias = l.dbias.view;
  ring_backward(l.opts, ro, l.q.view, l.k.view, l.v.view, l.out.view, l.lse.view, l.dout.view, g);
}

// Rank 0 receives every rank's bytes of one local tensor.
std::vector<std::vector<unsigned char>> gather_bytes(const Buffer& b) {
  const int W = world();
  int n = static_cast<int>(b.bytes.size());
  std::vector<int> sizes(static_cast<size_t>(W)), displs(static_cast<size_t>(W));
  MPI_Gather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < W; ++r) {
    displs[static_cast<size_t>(r)] = total;
    total += sizes[static_cast<size_t>(r)];
  }
  std::vector<unsigned char> all(static_cast<size_t>(rank() == 0 ? total : 0));
  MPI_Gatherv(b.bytes.data(), n, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE, 0, MPI_COMM_WORLD);
  std::vector<std::vector<unsigned char>> per;
  if (rank() == 0)
    for (int r = 0; r < W; ++r)
      per.emplace_back(all.begin() + displs[static_cast<size_t>(r)],
                       all.begin() + displs[static_cast<size_t>(r)] + sizes[static_cast<size_t>(r)]);
  return per;
}

// Rank 0 writes every rank's rows of one output into the global one.
void assemble(const Problem& p, const Split& s, const Buffer& local, Buffer& global, int dim, bool keys) {
  const auto parts = gather_bytes(local);
  if (rank() != 0) return;
  const int64_t total = keys ? p.c.seqlen_k : p.c.seqlen_q;
  for (int r = 0; r < world(); ++r) {
    const auto rs = s.rows(r, total, keys);
    Buffer b = contiguous(local.view.dtype, dims_with(local.view, dim, count(rs)));
    std::memcpy(b.bytes.data(), parts[static_cast<size_t>(r)].data(), parts[static_cast<size_t>(r)].size());
    gather_rows(rs, global.view, b.view, dim, false);
  }
}

// Runs the ring on every rank; rank 0 checks the whole and tells the others.
void expect_ring_matches(const Case& c, const Split& s) {
  const Problem p = make_problem(c);
  Local l = make_local(p, s, rank());
  run_ring(l, s.sharding);
  Outputs o = make_outputs(p, false);
  assemble(p, s, l.out, o.out, 1, false);
  assemble(p, s, l.lse, o.lse, 2, false);
  assemble(p, s, l.dq, o.dq, 1, false);
  assemble(p, s, l.dk, o.dk, 1, true);
  assemble(p, s, l.dv, o.dv, 1, true);
  if (c.dbias) assemble(p, s, l.dbias, o.dbias, 2, false);
  int pass = 1;
  std::string table;
  if (rank() == 0) {
    if (c.sinks) copy_values(l.dsinks.view, o.dsinks.view);
    const Report r = compare_with_reference(p, o);
    pass = r.pass();
    table = r.table();
  }
  MPI_Bcast(&pass, 1, MPI_INT, 0, MPI_COMM_WORLD);
  EXPECT_TRUE(pass) << c.describe() << (s.sharding == Sharding::zigzag ? " zigzag" : " contiguous") << " on "
                    << world() << " ranks (" << isa_name() << ")\n"
                    << table;
}

Case base(DType t) {
  Case c;
  c.name = "ring";
  c.dtype = t;
  c.batch = 2;
  c.seqlen_q = 72;
  c.seqlen_k = 72;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 24;
  c.head_dim_v = 16;
  c.num_threads = 1;  // several ranks share two cores
  return c;
}

const Split kContiguous{Sharding::contiguous, {}, {}};
const Split kZigzag{Sharding::zigzag, {}, {}};

TEST(Ring, FullAndCausalBothShardings) {
  for (DType t : {DType::f32, DType::bf16})
    for (bool causal : {false, true})
      for (const Split& s : {kContiguous, kZigzag}) {
        Case c = base(t);
        c.causal = causal;
        expect_ring_matches(c, s);
      }
}

TEST(Ring, WindowAlibiSoftcapSinks) {
  for (DType t : {DType::f32, DType::bf16, DType::f64}) {
    Case c = base(t);
    c.causal = true;
    c.window_left = 20;
    c.alibi = true;
    c.softcap = 4;
    c.sinks = true;
    expect_ring_matches(c, kZigzag);
  }
}

TEST(Ring, DropoutMasksBiasAndItsGradient) {
  Case c = base(DType::f32);
  c.causal = true;
  c.dropout_p = 0.15;
  c.mask = MaskKind::key_padding;
  c.bias = BiasKind::full;
  c.dbias = true;
  expect_ring_matches(c, kZigzag);
  c.dtype = DType::f16;
  expect_ring_matches(c, kContiguous);
}

// Uneven rows per rank, Lq != Lk globally, and a rank with no rows at all.
TEST(Ring, UnevenContiguousShards) {
  const std::vector<int64_t> q_all = {5, 20, 0, 13}, k_all = {17, 3, 30, 9};
  Split s{Sharding::contiguous, {}, {}};
  Case c = base(DType::f32);
  c.seqlen_q = c.seqlen_k = 0;
  for (int r = 0; r < world(); ++r) {
    s.q_len.push_back(q_all[static_cast<size_t>(r % 4)]);
    s.k_len.push_back(k_all[static_cast<size_t>(r % 4)]);
    c.seqlen_q += s.q_len.back();
    c.seqlen_k += s.k_len.back();
  }
  for (bool causal : {false, true}) {
    c.causal = causal;
    expect_ring_matches(c, s);
  }
}

TEST(Ring, ZigzagWithFewerRowsThanChunks) {
  Case c = base(DType::f32);
  c.seqlen_q = 5;
  c.seqlen_k = 7;
  c.causal = true;
  expect_ring_matches(c, kZigzag);
}

TEST(Ring, BitwiseDeterministicForAFixedNumberOfRanks) {
  Case c = base(DType::f32);
  c.causal = true;
  c.sinks = true;
  const Problem p = make_problem(c);
  Local a = make_local(p, kZigzag, rank()), b = make_local(p, kZigzag, rank());
  run_ring(a, Sharding::zigzag);
  run_ring(b, Sharding::zigzag);
  EXPECT_EQ(a.out.bytes, b.out.bytes);
  EXPECT_EQ(a.lse.bytes, b.lse.bytes);
  EXPECT_EQ(a.dq.bytes, b.dq.bytes);
  EXPECT_EQ(a.dk.bytes, b.dk.bytes);
  EXPECT_EQ(a.dv.bytes, b.dv.bytes);
  EXPECT_EQ(a.dsinks.bytes, b.dsinks.bytes);
}

TEST(Ring, ShardAndUnshardRoundTrip) {
  Case c = base(DType::bf16);
  c.seqlen_q = 37;
  const Problem p = make_problem(c);
  for (Sharding s : {Sharding::contiguous, Sharding::zigzag}) {
    const auto rs = shard_rows(s, 37, rank(), world());
    Buffer local = contiguous(DType::bf16, dims_with(p.q.view, 1, count(rs)));
    shard(s, rank(), world(), p.q.view, local.view);
    Buffer expect = contiguous(DType::bf16, dims_with(p.q.view, 1, count(rs)));
    gather_rows(rs, p.q.view, expect.view, 1, true);
    EXPECT_EQ(local.bytes, expect.bytes);
    Buffer back = contiguous(DType::bf16, dims_with(p.q.view, 1, 37));
    unshard(s, rank(), world(), local.view, back.view);
    Buffer want = contiguous(DType::bf16, dims_with(p.q.view, 1, 37));
    gather_rows(rs, want.view, expect.view, 1, false);  // this rank's rows in place, the rest zero
    EXPECT_EQ(back.bytes, want.bytes);
  }
  // Every row belongs to exactly one rank.
  for (Sharding s : {Sharding::contiguous, Sharding::zigzag})
    for (int64_t L : {0, 1, 7, 64, 1001}) {
      std::vector<int> owner(static_cast<size_t>(L), 0);
      for (int r = 0; r < world(); ++r)
        for (const auto& run : shard_rows(s, L, r, world()))
          for (int64_t i = run.start; i < run.start + run.length; ++i) ++owner[static_cast<size_t>(i)];
      for (int64_t i = 0; i < L; ++i) EXPECT_EQ(owner[static_cast<size_t>(i)], 1) << "row " << i << " of " << L;
    }
}

// One rank's bad input: every rank throws the same message naming that rank,
// and nobody waits forever.
TEST(Ring, BadInputOnOneRankFailsEverywhere) {
  const int bad = world() - 1;
  Case c = base(DType::f32);
  const Problem p = make_problem(c);
  Local l = make_local(p, kContiguous, rank());
  if (rank() == bad) l.out = contiguous(DType::f32, {2, l.q.view.shape[1] + 1, 4, 16});
  RingOptions ro;
  try {
    ring_forward(l.opts, ro, l.q.view, l.k.view, l.v.view, l.out.view, l.lse.view);
    ADD_FAILURE() << "ring_forward accepted a bad out on rank " << bad;
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("flashgrad::ring_forward: argument 'out'"), std::string::npos) << w;
    EXPECT_NE(w.find("(on rank " + std::to_string(bad) + " of " + std::to_string(world()) + ")"), std::string::npos)
        << w;
  }
  // Ranks that disagree on the head dim.
  Case c2 = base(DType::f32);
  if (rank() == bad && world() > 1) c2.head_dim = 8;
  const Problem p2 = make_problem(c2);
  Local l2 = make_local(p2, kZigzag, rank());
  if (world() > 1) {
    ro.sharding = Sharding::zigzag;
    try {
      ring_forward(l2.opts, ro, l2.q.view, l2.k.view, l2.v.view, l2.out.view, l2.lse.view);
      ADD_FAILURE() << "ring_forward accepted ranks with different head dims";
    } catch (const Error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("argument 'q': expected the same head_dim as rank 0 (24), got 8"), std::string::npos) << w;
      EXPECT_NE(w.find("(on rank " + std::to_string(bad) + " of "), std::string::npos) << w;
    }
  }
  // Through the C ABI: a 3-D q on one rank; the same status on every rank.
  Local l3 = make_local(p, kContiguous, rank());
  Dl q(l3.q.view), k(l3.k.view), v(l3.v.view), out(l3.out.view), lse(l3.lse.view);
  if (rank() == bad) q.t.ndim = 3;
  fg_params prm = fg_params_default();
  prm.num_threads = 1;
  const fg_status st = fg_ring_forward(&prm, MPI_COMM_WORLD, FG_SHARDING_CONTIGUOUS, &q.t, &k.t, &v.t, &out.t, &lse.t);
  EXPECT_EQ(st, FG_ERR_INVALID_ARGUMENT);
  const std::string msg = fg_last_error();
  EXPECT_NE(msg.find("flashgrad::ring_forward: argument 'q'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("on rank " + std::to_string(bad)), std::string::npos) << msg;
  // And a valid call after the failed one works on every rank.
  q.t.ndim = 4;
  EXPECT_EQ(fg_ring_forward(&prm, MPI_COMM_WORLD, FG_SHARDING_CONTIGUOUS, &q.t, &k.t, &v.t, &out.t, &lse.t), FG_OK)
      << fg_last_error();
}

TEST(Ring, VarlenIsUnsupported) {
  Case c = base(DType::f32);
  c.seqlens_q = {3, 5};
  c.seqlens_k = {4, 4};
  const Problem p = make_problem(c);
  Outputs o = make_outputs(p, false);
  RingOptions ro;
  try {
    ring_forward(p.opts, ro, p.q.view, p.k.view, p.v.view, o.out.view, o.lse.view);
    ADD_FAILURE() << "ring_forward accepted a varlen batch";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Error::Code::unsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("cu_seqlens"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flashgrad::testing

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  if (r != 0) {  // one rank reports; failures on others still set the exit code
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int result = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
