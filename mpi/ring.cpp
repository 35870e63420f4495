// Ring attention over MPI (flashgrad/ring.hpp): each step computes with
// flashgrad::forward/backward on the K/V block a rank holds while the next
// block travels, and merges with merge_row's arithmetic (through merge()).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "check.hpp"
#include "convert.hpp"
#include "flashgrad/ring.hpp"
#include "workspace.hpp"

namespace flashgrad {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A compact tensor the ring owns.
struct Owned {
  std::vector<unsigned char> bytes;
  TensorView view;
  Owned() = default;
  Owned(DType t, std::initializer_list<int64_t> dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    bytes.assign(static_cast<size_t>(std::max<int64_t>(n, 1) * dtype_size(t)), 0);
    view = TensorView::contiguous(bytes.data(), t, dims);
  }
  void fill(double x) {
    if (view.dtype == DType::f64)
      std::fill_n(reinterpret_cast<double*>(bytes.data()), view.numel(), x);
    else
      std::fill_n(reinterpret_cast<float*>(bytes.data()), view.numel(), static_cast<float>(x));
  }
};

TensorView rows(const TensorView& t, int dim, int64_t start, int64_t len) {
  TensorView s = t;
  s.data = static_cast<char*>(t.data) + start * t.strides[dim] * dtype_size(t.dtype);
  s.shape[dim] = len;
  return s;
}

// bias, mask, dbias: a dimension of size 1 broadcasts, so every block sees it whole.
TensorView bcast_rows(const TensorView& t, int dim, int64_t start, int64_t len) {
  return t.shape[dim] == 1 ? t : rows(t, dim, start, len);
}

// Every rank's view of the job, gathered once before any data moves.
struct Layout {
  int rank = 0, world = 1;
  int64_t total_q = 0, total_k = 0;
  std::vector<std::vector<RowRange>> q_rows, k_rows;  // [rank] -> global row runs, in local order
  std::vector<int64_t> k_len;                          // [rank] -> local key rows
  int64_t max_k = 0;
};

// What must agree across ranks, as integers: rank 0's is the reference.
enum Sig { kBatch, kHq, kHkv, kD, kDv, kDtype, kCausal, kWl, kWr, kSharding, kBias, kMask, kSinks, kDrop,
           kSeed, kSigLen };
constexpr int kLq = kSigLen, kLk = kSigLen + 1, kValid = kSigLen + 2, kMeta = kSigLen + 3;

const char* sig_arg(int i) {
  static const char* args[] = {"q", "q", "k", "q", "v", "q", "causal", "window_left", "window_right", "sharding",
                               "bias", "mask", "sinks", "dropout_p", "seed"};
  return args[i];
}

const char* sig_name(int i) {
  static const char* names[] = {"batch", "heads_q", "heads_kv", "head_dim", "head_dim_v", "dtype", "causal",
                                "window_left", "window_right", "sharding", "bias given", "mask given",
                                "sinks given", "dropout_p", "seed"};
  return names[i];
}

constexpr int kTagKv = 17, kTagAcc = 18;

class Ring {
 public:
  Ring(const char* fn, const Options& opts, const RingOptions& ring, const TensorView& q, const TensorView& k,
       const TensorView& v)
      : fn_(fn), opts_(opts), ring_(ring), q_(q), k_(k), v_(v) {}

  // Collective: every rank learns the first failing rank's message and throws it.
  void agree(const std::string& error, int code) {
    const int mine = error.empty() ? L_.world : L_.rank;
    int first = L_.world;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, ring_.comm);
    if (first == L_.world) return;
    int head[2] = {static_cast<int>(error.size()), code};
    MPI_Bcast(head, 2, MPI_INT, first, ring_.comm);
    std::string msg = error;
    msg.resize(static_cast<size_t>(head[0]));
    MPI_Bcast(msg.data(), head[0], MPI_CHAR, first, ring_.comm);
    throw Error(msg + " (on rank " + std::to_string(first) + " of " + std::to_string(L_.world) + ")",
                static_cast<Error::Code>(head[1]));
  }

  // Runs f, turning what it throws into (message, code) for agree().
  template <typename F>
  void guarded(F&& f) {
    if (!error_.empty() || peer_failed_) return;
    try {
      f();
    } catch (const Error& e) {
      error_ = e.what();
      code_ = static_cast<int>(e.code());
    } catch (const std::bad_alloc&) {
      error_ = std::string("flashgrad::") + fn_ + ": out of memory: expected to allocate the ring's buffers, got "
               "std::bad_alloc";
      code_ = static_cast<int>(Error::Code::out_of_memory);
    }
  }
  void settle() {
    agree(error_, code_);
  }

  [[noreturn]] void fail(const char* arg, const std::string& expected, const std::string& got) const {
    throw Error(std::string("flashgrad::") + fn_ + ": argument '" + arg + "': expected " + expected + ", got " + got);
  }

  // Collective: lengths and the signature of every rank, then the local checks.
  void gather_layout() {
    if (ring_.comm == MPI_COMM_NULL)
      throw Error(std::string("flashgrad::") + fn_ + ": argument 'comm': expected a communicator, got MPI_COMM_NULL");
    MPI_Comm_rank(ring_.comm, &L_.rank);
    MPI_Comm_size(ring_.comm, &L_.world);
    int64_t meta[kMeta] = {};
    guarded([&] {
      if (opts_.cu_seqlens_q || opts_.cu_seqlens_k)
        throw Error(std::string("flashgrad::") + fn_ + ": argument 'cu_seqlens_q': expected no varlen batch "
                    "(the ring shards one sequence), got cu_seqlens", Error::Code::unsupported);
      if (opts_.block) fail("block", "no block (the ring sets the positions)", "a block");
      if (q_.ndim != 4 || k_.ndim != 4 || v_.ndim != 4)
        fail(q_.ndim != 4 ? "q" : (k_.ndim != 4 ? "k" : "v"), "4 dimensions [batch, seqlen, heads, head_dim]",
             std::to_string(q_.ndim) + "-D q, " + std::to_string(k_.ndim) + "-D k, " + std::to_string(v_.ndim) + "-D v");
    });
    if (error_.empty()) {
      const int64_t sig[kSigLen] = {q_.shape[0], q_.shape[2], k_.shape[2], q_.shape[3], v_.shape[3],
                                    static_cast<int64_t>(q_.dtype), opts_.causal, opts_.window_left,
                                    opts_.window_right, static_cast<int64_t>(ring_.sharding), opts_.bias.has_value(),
                                    opts_.mask.has_value(), opts_.sinks.has_value(),
                                    static_cast<int64_t>(opts_.dropout_p * 1e9), static_cast<int64_t>(opts_.seed)};
      std::copy(sig, sig + kSigLen, meta);
      meta[kLq] = q_.shape[1];
      meta[kLk] = k_.shape[1];
      meta[kValid] = 1;
    }
    std::vector<int64_t> all(static_cast<size_t>(kMeta) * static_cast<size_t>(L_.world));
    MPI_Allgather(meta, kMeta, MPI_INT64_T, all.data(), kMeta, MPI_INT64_T, ring_.comm);
    meta_ = all;
    // A rank that failed its own checks reports at the next agreement; until
    // then the others skip their work (the layout is unknown).
    for (int r = 0; r < L_.world; ++r) peer_failed_ = peer_failed_ || !meta_at(r, kValid);
    if (peer_failed_ || !error_.empty()) return;
    L_.q_rows.resize(static_cast<size_t>(L_.world));
    L_.k_rows.resize(static_cast<size_t>(L_.world));
    L_.k_len.resize(static_cast<size_t>(L_.world));
    for (int r = 0; r < L_.world; ++r) {
      L_.total_q += all[static_cast<size_t>(r * kMeta + kLq)];
      L_.total_k += all[static_cast<size_t>(r * kMeta + kLk)];
    }
    int64_t at_q = 0, at_k = 0;
    for (int r = 0; r < L_.world; ++r) {
      const int64_t lq = all[static_cast<size_t>(r * kMeta + kLq)], lk = all[static_cast<size_t>(r * kMeta + kLk)];
      L_.k_len[static_cast<size_t>(r)] = lk;
      L_.max_k = std::max(L_.max_k, lk);
      if (ring_.sharding == Sharding::contiguous) {
        L_.q_rows[static_cast<size_t>(r)] = {{at_q, lq}};
        L_.k_rows[static_cast<size_t>(r)] = {{at_k, lk}};
      } else {
        L_.q_rows[static_cast<size_t>(r)] = shard_rows(Sharding::zigzag, L_.total_q, r, L_.world);
        L_.k_rows[static_cast<size_t>(r)] = shard_rows(Sharding::zigzag, L_.total_k, r, L_.world);
      }
      at_q += lq;
      at_k += lk;
    }
    guarded([&] {
      if (ring_.sharding != Sharding::zigzag) return;
      auto count = [](const std::vector<RowRange>& rs) {
        int64_t n = 0;
        for (const auto& r : rs) n += r.length;
        return n;
      };
      const int64_t wq = count(L_.q_rows[static_cast<size_t>(L_.rank)]);
      const int64_t wk = count(L_.k_rows[static_cast<size_t>(L_.rank)]);
      if (q_.shape[1] != wq)
        fail("q", "the zigzag shard of " + std::to_string(L_.total_q) + " query rows: " + std::to_string(wq) + " rows",
             std::to_string(q_.shape[1]));
      if (k_.shape[1] != wk)
        fail("k", "the zigzag shard of " + std::to_string(L_.total_k) + " key rows: " + std::to_string(wk) + " rows",
             std::to_string(k_.shape[1]));
    });
  }

  int64_t meta_at(int r, int i) const { return meta_[static_cast<size_t>(r * kMeta + i)]; }

  // After the local checks: every rank's shapes and options against rank 0's.
  // Only the rank that differs reports it, so the message names that rank.
  void check_agreement() const {
    for (int i = 0; i < kSigLen; ++i)
      if (meta_at(L_.rank, i) != meta_at(0, i))
        fail(sig_arg(i), std::string("the same ") + sig_name(i) + " as rank 0 (" + std::to_string(meta_at(0, i)) + ")",
             std::to_string(meta_at(L_.rank, i)));
  }

  // bias/mask: [batch|1, heads_q|1, L_q|1, seqlen_k_global|1].
  void check_key_width(const char* arg, const std::optional<TensorView>& t) const {
    if (!t) return;
    if (t->ndim != 4 || (t->shape[3] != L_.total_k && t->shape[3] != 1))
      fail(arg, "4 dimensions with seqlen_k_global = " + std::to_string(L_.total_k) + " (or 1) last",
           t->ndim == 4 ? "last dimension " + std::to_string(t->shape[3]) : std::to_string(t->ndim) + "-D");
  }

  // The core's own validation of this rank's call, with bias/mask cut to the
  // first local key rows so that their widths match a local call.
  Options local_options() const {
    Options o = opts_;
    if (o.bias) o.bias = bcast_rows(*o.bias, 3, 0, k_.shape[1]);
    if (o.mask) o.mask = bcast_rows(*o.mask, 3, 0, k_.shape[1]);
    return o;
  }

  // Query rows of this rank's segment qs against key segment ks of block owner src.
  struct Pair {
    int64_t lq0, gq0, nq;  // local and global first query row, count
    int64_t lk0, gk0, nk;  // row in the block, global first key, count
    bool sinks;            // the one pair per query row that adds the sink logit
  };

  // Fully masked by causal/window (global positions), so the kernels can skip it.
  bool masked(const Pair& p) const {
    if (p.nq == 0 || p.nk == 0) return true;
    const int64_t shift = L_.total_k - L_.total_q;
    const int64_t first = p.gq0 + shift, last = p.gq0 + p.nq - 1 + shift;  // the rows' key indices
    const int64_t k_first = p.gk0, k_last = p.gk0 + p.nk - 1;
    if (last < k_first && (opts_.causal || (opts_.window_right >= 0 && k_first - last > opts_.window_right)))
      return true;
    return opts_.window_left >= 0 && first > k_last && first - k_last > opts_.window_left;
  }

  std::vector<Pair> pairs(int step, int src) const {
    std::vector<Pair> out;
    int64_t lq = 0;
    for (const auto& qs : L_.q_rows[static_cast<size_t>(L_.rank)]) {
      int64_t lk = 0;
      bool first_key_run = true;
      for (const auto& ks : L_.k_rows[static_cast<size_t>(src)]) {
        Pair p{lq, qs.start, qs.length, lk, ks.start, ks.length, step == 0 && first_key_run && opts_.sinks};
        if (p.nq > 0 && (p.sinks || !masked(p))) out.push_back(p);
        lk += ks.length;
        first_key_run = false;
      }
      lq += qs.length;
    }
    return out;
  }

  Options pair_options(const Pair& p) const {
    Options o = opts_;
    o.block = Options::Block{p.gq0, p.gk0, L_.total_q, L_.total_k};
    if (o.bias) o.bias = bcast_rows(bcast_rows(*o.bias, 2, p.lq0, p.nq), 3, p.gk0, p.nk);
    if (o.mask) o.mask = bcast_rows(bcast_rows(*o.mask, 2, p.lq0, p.nq), 3, p.gk0, p.nk);
    if (!p.sinks) o.sinks.reset();
    return o;
  }

  // The K/V block of rank src, packed [batch, L_k(src), heads_kv, d] then the same with dv.
  TensorView block_k(const std::vector<unsigned char>& buf, int src) const {
    return TensorView::contiguous(const_cast<unsigned char*>(buf.data()), q_.dtype,
                                  {q_.shape[0], L_.k_len[static_cast<size_t>(src)], k_.shape[2], k_.shape[3]});
  }
  TensorView block_v(const std::vector<unsigned char>& buf, int src) const {
    const TensorView kv = block_k(buf, src);
    return TensorView::contiguous(const_cast<unsigned char*>(buf.data()) + kv.numel() * dtype_size(q_.dtype),
                                  q_.dtype, {q_.shape[0], L_.k_len[static_cast<size_t>(src)], v_.shape[2], v_.shape[3]});
  }
  size_t kv_bytes() const {
    return static_cast<size_t>(q_.shape[0] * L_.max_k * k_.shape[2] * (k_.shape[3] + v_.shape[3]) *
                               dtype_size(q_.dtype));
  }
  void pack_own(std::vector<unsigned char>& buf) const {
    convert_values(k_, block_k(buf, L_.rank));
    convert_values(v_, block_v(buf, L_.rank));
  }

  // Nonblocking transfers of byte buffers, cut below INT_MAX bytes per message.
  void isend(const void* data, size_t bytes, int to, int tag, std::vector<MPI_Request>& reqs) {
    constexpr size_t kChunk = size_t{1} << 30;
    const char* p = static_cast<const char*>(data);
    for (size_t at = 0; at < bytes || at == 0; at += kChunk) {
      reqs.emplace_back();
      MPI_Isend(p + at, static_cast<int>(std::min(kChunk, bytes - at)), MPI_BYTE, to, tag, ring_.comm, &reqs.back());
      if (stats_) stats_->bytes_sent += static_cast<int64_t>(std::min(kChunk, bytes - at));
      if (bytes == 0) break;
    }
  }
  void irecv(void* data, size_t bytes, int from, int tag, std::vector<MPI_Request>& reqs) {
    constexpr size_t kChunk = size_t{1} << 30;
    char* p = static_cast<char*>(data);
    for (size_t at = 0; at < bytes || at == 0; at += kChunk) {
      reqs.emplace_back();
      MPI_Irecv(p + at, static_cast<int>(std::min(kChunk, bytes - at)), MPI_BYTE, from, tag, ring_.comm,
                &reqs.back());
      if (bytes == 0) break;
    }
  }
  void wait(std::vector<MPI_Request>& reqs) {
    const auto t0 = Clock::now();
    if (!reqs.empty()) MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
    reqs.clear();
    if (stats_) stats_->wait_seconds += since(t0);
  }
  // Lets MPI progress transfers between two kernel calls.
  void poke(std::vector<MPI_Request>& reqs) {
    int done = 0;
    if (!reqs.empty()) MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) reqs.clear();
  }

  // Before a step's compute: the block in use goes to the next rank while the
  // next step's block arrives from the previous one (none after the last step).
  void pass_kv(int step, std::vector<unsigned char>* kv, int cur, std::vector<MPI_Request>& reqs) {
    if (step + 1 >= L_.world) return;
    irecv(kv[1 - cur].data(), kv_bytes(), prev(), kTagKv, reqs);
    isend(kv[cur].data(), kv_bytes(), next(), kTagKv, reqs);
  }

  int next() const { return (L_.rank + 1) % L_.world; }
  int prev() const { return (L_.rank + L_.world - 1) % L_.world; }
  DType acc_dtype() const { return q_.dtype == DType::f64 ? DType::f64 : DType::f32; }

  const char* fn_;
  const Options& opts_;
  const RingOptions& ring_;
  const TensorView &q_, &k_, &v_;
  Layout L_;
  std::string error_;
  int code_ = 0;
  bool peer_failed_ = false;
  std::vector<int64_t> meta_;
  RingStats* stats_ = nullptr;
};

}  // namespace

void ring_forward(const Options& opts, const RingOptions& ring, const TensorView& q, const TensorView& k,
                  const TensorView& v, const TensorView& out, const TensorView& lse) {
  Ring R("ring_forward", opts, ring, q, k, v);
  if (ring.stats) *ring.stats = RingStats{};
  R.stats_ = ring.stats;
  R.gather_layout();
  const int64_t B = q.ndim == 4 ? q.shape[0] : 0, Lq = q.ndim == 4 ? q.shape[1] : 0;
  const int64_t Hq = q.ndim == 4 ? q.shape[2] : 0, dv = v.ndim == 4 ? v.shape[3] : 0;
  const DType acc = R.acc_dtype();
  std::vector<unsigned char> kv[2];
  Owned o_acc, lse_acc, o_part, lse_part;
  R.guarded([&] {
    R.check_key_width("bias", opts.bias);
    R.check_key_width("mask", opts.mask);
    CallTensors t{&q, &k, &v, &out, &lse};
    make_params(R.fn_, CallKind::forward, R.local_options(), t);
    R.check_agreement();
    kv[0].resize(R.kv_bytes());
    kv[1].resize(R.kv_bytes());
    o_acc = Owned(acc, {B, Lq, Hq, dv});
    o_part = Owned(acc, {B, Lq, Hq, dv});
    lse_acc = Owned(acc, {B, Hq, Lq});
    lse_part = Owned(acc, {B, Hq, Lq});
    lse_acc.fill(-std::numeric_limits<double>::infinity());
    R.pack_own(kv[0]);
  });
  R.settle();

  const int W = R.L_.world;
  int cur = 0;
  std::vector<MPI_Request> reqs;
  for (int step = 0; step < W; ++step) {
    const int src = (R.L_.rank - step + W) % W;
    R.pass_kv(step, kv, cur, reqs);
    const auto t0 = Clock::now();
    R.guarded([&] {
      const TensorView kb = R.block_k(kv[cur], src), vb = R.block_v(kv[cur], src);
      for (const auto& p : R.pairs(step, src)) {
        const TensorView op = rows(o_part.view, 1, p.lq0, p.nq), lp = rows(lse_part.view, 2, p.lq0, p.nq);
        forward(R.pair_options(p), rows(q, 1, p.lq0, p.nq), rows(kb, 1, p.lk0, p.nk), rows(vb, 1, p.lk0, p.nk), op,
                lp);
        merge(rows(o_acc.view, 1, p.lq0, p.nq), rows(lse_acc.view, 2, p.lq0, p.nq), op, lp, opts.num_threads);
        R.poke(reqs);
      }
    });
    if (ring.stats) ring.stats->compute_seconds += since(t0);
    R.wait(reqs);
    cur = 1 - cur;
  }
  R.guarded([&] {
    convert_values(o_acc.view, out);
    convert_values(lse_acc.view, lse);
  });
  if (ring.stats) ring.stats->steps = W;
  R.settle();
}

void ring_backward(const Options& opts, const RingOptions& ring, const TensorView& q, const TensorView& k,
                   const TensorView& v, const TensorView& out, const TensorView& lse, const TensorView& dout,
                   const Grads& grads) {
  Ring R("ring_backward", opts, ring, q, k, v);
  if (ring.stats) *ring.stats = RingStats{};
  R.stats_ = ring.stats;
  R.gather_layout();
  const bool ok4 = q.ndim == 4 && k.ndim == 4 && v.ndim == 4;
  const int64_t B = ok4 ? q.shape[0] : 0, Lq = ok4 ? q.shape[1] : 0, Hq = ok4 ? q.shape[2] : 0;
  const int64_t Hkv = ok4 ? k.shape[2] : 0, d = ok4 ? q.shape[3] : 0, dv = ok4 ? v.shape[3] : 0;
  const DType acc = R.acc_dtype();
  const int64_t Kmax = R.L_.max_k;
  std::vector<unsigned char> kv[2];
  Owned dq_acc, dq_part, dk_part, dv_part, dsinks_part, dsinks_local;
  Owned dkv[3];  // [0]: this step's contribution; [1], [2]: the travelling accumulators
  R.guarded([&] {
    R.check_key_width("bias", opts.bias);
    R.check_key_width("mask", opts.mask);
    Grads local = grads;
    if (local.dbias) {
      if (!opts.bias) R.fail("dbias", "bias in the options when dbias is given", "no bias");
      R.check_key_width("dbias", local.dbias);
      local.dbias = bcast_rows(*local.dbias, 3, 0, k.shape[1]);
    }
    CallTensors t{&q, &k, &v, &out, &lse, &dout, &local};
    make_params(R.fn_, CallKind::backward, R.local_options(), t);
    R.check_agreement();
    kv[0].resize(R.kv_bytes());
    kv[1].resize(R.kv_bytes());
    dq_acc = Owned(acc, {B, Lq, Hq, d});
    dq_part = Owned(acc, {B, Lq, Hq, d});
    dk_part = Owned(acc, {B, Kmax, Hkv, d});
    dv_part = Owned(acc, {B, Kmax, Hkv, dv});
    dsinks_part = Owned(acc, {Hq});
    dsinks_local = Owned(acc, {Hq});
    for (auto& b : dkv) b = Owned(acc, {B * Kmax * Hkv * (d + dv)});
    if (grads.dbias) zero_strided(*grads.dbias);
    R.pack_own(kv[0]);
  });
  R.settle();

  // The dK and dV parts of an accumulator buffer, for the block of rank src.
  auto acc_k = [&](const Owned& b, int src) {
    return TensorView::contiguous(const_cast<unsigned char*>(b.bytes.data()), acc,
                                  {B, R.L_.k_len[static_cast<size_t>(src)], Hkv, d});
  };
  auto acc_v = [&](const Owned& b, int src) {
    const int64_t nk = R.L_.k_len[static_cast<size_t>(src)];
    return TensorView::contiguous(const_cast<unsigned char*>(b.bytes.data()) + B * nk * Hkv * d * dtype_size(acc),
                                  acc, {B, nk, Hkv, dv});
  };
  const size_t acc_bytes = dkv[0].bytes.size();

  const int W = R.L_.world;
  int cur = 0, a_cur = 1;
  std::vector<MPI_Request> kv_reqs, acc_recv, acc_send;
  for (int step = 0; step < W; ++step) {
    const int src = (R.L_.rank - step + W) % W;
    R.pass_kv(step, kv, cur, kv_reqs);
    const auto t0 = Clock::now();
    R.guarded([&] {
      dkv[0].fill(0);
      const TensorView kb = R.block_k(kv[cur], src), vb = R.block_v(kv[cur], src);
      const TensorView ck = acc_k(dkv[0], src), cv = acc_v(dkv[0], src);
      for (const auto& p : R.pairs(step, src)) {
        const TensorView pq = rows(dq_part.view, 1, p.lq0, p.nq);
        const TensorView pk = rows(dk_part.view, 1, 0, p.nk), pv = rows(dv_part.view, 1, 0, p.nk);
        Grads g{pq, pk, pv, std::nullopt, std::nullopt};
        if (p.sinks && grads.dsinks) g.dsinks = dsinks_part.view;
        if (grads.dbias) g.dbias = bcast_rows(bcast_rows(*grads.dbias, 2, p.lq0, p.nq), 3, p.gk0, p.nk);
        backward(R.pair_options(p), rows(q, 1, p.lq0, p.nq), rows(kb, 1, p.lk0, p.nk), rows(vb, 1, p.lk0, p.nk),
                 rows(out, 1, p.lq0, p.nq), rows(lse, 2, p.lq0, p.nq), rows(dout, 1, p.lq0, p.nq), g);
        accumulate_values(pq, rows(dq_acc.view, 1, p.lq0, p.nq));
        accumulate_values(pk, rows(ck, 1, p.lk0, p.nk));
        accumulate_values(pv, rows(cv, 1, p.lk0, p.nk));
        if (g.dsinks) accumulate_values(dsinks_part.view, dsinks_local.view);
        R.poke(kv_reqs);
      }
    });
    if (ring.stats) ring.stats->compute_seconds += since(t0);
    // The block's accumulator arrives from the rank that held it last step
    // (none at step 0); add this rank's part and pass it on. After the last
    // step the next rank is the block's owner.
    Owned& travelling = dkv[a_cur];
    if (step == 0) {
      std::memcpy(travelling.bytes.data(), dkv[0].bytes.data(), acc_bytes);
    } else {
      R.wait(acc_recv);
      const auto t1 = Clock::now();
      R.guarded([&] {
        accumulate_values(acc_k(dkv[0], src), acc_k(travelling, src));
        accumulate_values(acc_v(dkv[0], src), acc_v(travelling, src));
      });
      if (ring.stats) ring.stats->compute_seconds += since(t1);
    }
    if (W > 1) {
      R.wait(acc_send);  // the other buffer is free again
      R.isend(travelling.bytes.data(), acc_bytes, R.next(), kTagAcc, acc_send);
      R.irecv(dkv[3 - a_cur].bytes.data(), acc_bytes, R.prev(), kTagAcc, acc_recv);
      a_cur = 3 - a_cur;
    }
    R.wait(kv_reqs);
    cur = 1 - cur;
  }
  R.wait(acc_recv);
  R.wait(acc_send);

  // This rank's own block came home in dkv[a_cur] (in dkv[1] without a ring).
  std::vector<double> sinks_all;
  if (grads.dsinks) {
    std::vector<double> mine(static_cast<size_t>(Hq));
    for (int64_t h = 0; h < Hq; ++h)
      mine[static_cast<size_t>(h)] = acc == DType::f64 ? reinterpret_cast<const double*>(dsinks_local.bytes.data())[h]
                                                       : reinterpret_cast<const float*>(dsinks_local.bytes.data())[h];
    sinks_all.resize(static_cast<size_t>(Hq * W));
    MPI_Allgather(mine.data(), static_cast<int>(Hq), MPI_DOUBLE, sinks_all.data(), static_cast<int>(Hq), MPI_DOUBLE,
                  ring.comm);
  }
  R.guarded([&] {
    convert_values(dq_acc.view, grads.dq);
    convert_values(acc_k(dkv[a_cur], R.L_.rank), grads.dk);
    convert_values(acc_v(dkv[a_cur], R.L_.rank), grads.dv);
    if (grads.dsinks) {
      Owned total(DType::f64, {Hq});
      auto* t = reinterpret_cast<double*>(total.bytes.data());
      for (int r = 0; r < W; ++r)  // rank order: the same sum on every rank
        for (int64_t h = 0; h < Hq; ++h) t[h] += sinks_all[static_cast<size_t>(r * Hq + h)];
      convert_values(total.view, *grads.dsinks);
    }
  });
  if (ring.stats) ring.stats->steps = W;
  R.settle();
}

}  // namespace flashgrad
