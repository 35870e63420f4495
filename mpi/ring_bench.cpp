// flashgrad_ring_bench: ring attention's time per step, the fraction of its
// communication hidden behind compute, and memory per rank, for the number of
// ranks it is launched with (a benchmark, not a test: it asserts nothing).
//
//   mpirun -n 4 build/mpi/flashgrad_ring_bench --seqlen 8192 --head-dim 128 [--dtype bf16]
//
// The hidden fraction compares the time a rank waited in MPI after computing
// with the time the same ring exchange takes alone, measured in the same run:
//   hidden = 1 - wait / exchange_alone   (clamped to [0, 1])
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "flashgrad/ring.hpp"

namespace {

using flashgrad::DType;
using flashgrad::TensorView;

struct Flags {
  int64_t seqlen = 8192, heads_q = 8, heads_kv = 8, head_dim = 128, batch = 1;
  int repeats = 3, threads = 0;
  bool causal = true;
  DType dtype = DType::f32;
  flashgrad::Sharding sharding = flashgrad::Sharding::zigzag;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "flashgrad_ring_bench: flag %s: expected a value, got none\n", a.c_str());
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
      return argv[++i];
    };
    if (a == "--seqlen") f.seqlen = std::stoll(value());
    else if (a == "--heads-q") f.heads_q = std::stoll(value());
    else if (a == "--heads-kv") f.heads_kv = std::stoll(value());
    else if (a == "--head-dim") f.head_dim = std::stoll(value());
    else if (a == "--batch") f.batch = std::stoll(value());
    else if (a == "--repeats") f.repeats = std::stoi(value());
    else if (a == "--threads") f.threads = std::stoi(value());
    else if (a == "--no-causal") f.causal = false;
    else if (a == "--contiguous") f.sharding = flashgrad::Sharding::contiguous;
    else if (a == "--dtype") {
      const std::string t = value();
      if (t != "f32" && t != "bf16") {
        std::fprintf(stderr, "flashgrad_ring_bench: flag --dtype: expected f32 or bf16, got '%s'\n", t.c_str());
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
      f.dtype = t == "bf16" ? DType::bf16 : DType::f32;
    } else {
      std::fprintf(stderr, "flashgrad_ring_bench: unknown flag '%s'\n", a.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  return f;
}

struct Tensor {
  std::vector<unsigned char> bytes;
  TensorView view;
  Tensor(DType t, std::initializer_list<int64_t> dims, std::mt19937& rng, bool random) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    bytes.assign(static_cast<size_t>(n * flashgrad::dtype_size(t)), 0);
    view = TensorView::contiguous(bytes.data(), t, dims);
    if (!random) return;
    std::normal_distribution<float> nd;
    for (int64_t i = 0; i < n; ++i) {
      const float x = nd(rng);
      if (t == DType::f32) {
        std::memcpy(bytes.data() + 4 * i, &x, 4);
      } else {  // bf16: the high half of the f32 (truncation is fine for random inputs)
        uint32_t u;
        std::memcpy(&u, &x, 4);
        const uint16_t h = static_cast<uint16_t>(u >> 16);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
  }
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The ring's K/V exchange alone: world - 1 steps of sending `bytes` to the next rank.
double exchange_alone(size_t bytes, int rank, int world) {
  if (world == 1) return 0;
  std::vector<unsigned char> a(bytes), b(bytes);
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now();
  for (int s = 0; s + 1 < world; ++s) {
    MPI_Request r[2];
    MPI_Irecv(b.data(), static_cast<int>(bytes), MPI_BYTE, (rank + world - 1) % world, 5, MPI_COMM_WORLD, &r[0]);
    MPI_Isend(a.data(), static_cast<int>(bytes), MPI_BYTE, (rank + 1) % world, 5, MPI_COMM_WORLD, &r[1]);
    MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
    std::swap(a, b);
  }
  return now() - t0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const Flags f = parse(argc, argv);
  const auto rows = flashgrad::shard_rows(f.sharding, f.seqlen, rank, world);
  int64_t L = 0;
  for (const auto& r : rows) L += r.length;

  std::mt19937 rng(1234 + rank);
  const DType t = f.dtype;
  const int64_t B = f.batch, H = f.heads_q, Hk = f.heads_kv, d = f.head_dim;
  Tensor q(t, {B, L, H, d}, rng, true), k(t, {B, L, Hk, d}, rng, true), v(t, {B, L, Hk, d}, rng, true);
  Tensor dout(t, {B, L, H, d}, rng, true), out(t, {B, L, H, d}, rng, false);
  Tensor lse(DType::f32, {B, H, L}, rng, false), dq(t, {B, L, H, d}, rng, false);
  Tensor dk(t, {B, L, Hk, d}, rng, false), dv(t, {B, L, Hk, d}, rng, false);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const double rss_inputs_mib = static_cast<double>(ru.ru_maxrss) / 1024.0;

  flashgrad::Options opts;
  opts.causal = f.causal;
  opts.num_threads = f.threads;
  flashgrad::RingStats fs, bs;
  flashgrad::RingOptions ro;
  ro.sharding = f.sharding;
  std::vector<double> tf, tb, cf, wf, cb, wb;
  for (int rep = 0; rep <= f.repeats; ++rep) {  // rep 0 warms up
    MPI_Barrier(MPI_COMM_WORLD);
    ro.stats = &fs;
    double t0 = now();
    flashgrad::ring_forward(opts, ro, q.view, k.view, v.view, out.view, lse.view);
    const double t1 = now();
    ro.stats = &bs;
    flashgrad::ring_backward(opts, ro, q.view, k.view, v.view, out.view, lse.view, dout.view,
                             flashgrad::Grads{dq.view, dk.view, dv.view, std::nullopt, std::nullopt});
    const double t2 = now();
    if (rep == 0) continue;
    tf.push_back(t1 - t0);
    tb.push_back(t2 - t1);
    cf.push_back(fs.compute_seconds);
    wf.push_back(fs.wait_seconds);
    cb.push_back(bs.compute_seconds);
    wb.push_back(bs.wait_seconds);
  }
  const size_t kv_bytes = static_cast<size_t>(B * L * Hk * 2 * d * flashgrad::dtype_size(t));
  std::vector<double> ex;
  for (int rep = 0; rep < f.repeats; ++rep) ex.push_back(exchange_alone(kv_bytes, rank, world));
  const size_t acc_bytes = static_cast<size_t>(B * L * Hk * 2 * d * 4);
  std::vector<double> exb;
  for (int rep = 0; rep < f.repeats; ++rep) exb.push_back(exchange_alone(acc_bytes, rank, world));
  getrusage(RUSAGE_SELF, &ru);
  const double rss_peak_mib = static_cast<double>(ru.ru_maxrss) / 1024.0;

  // Every rank's medians, reported by rank 0; the slowest rank sets the pace.
  double mine[9] = {median(tf), median(tb), median(cf), median(wf), median(cb), median(wb), median(ex),
                    median(exb), rss_peak_mib - rss_inputs_mib};
  std::vector<double> all(static_cast<size_t>(9 * world));
  MPI_Gather(mine, 9, MPI_DOUBLE, all.data(), 9, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    const double fwd_flops = 4.0 * B * H * static_cast<double>(f.seqlen) * f.seqlen * d * (f.causal ? 0.5 : 1.0);
    std::printf("ring attention: %d rank(s), %s, B=%lld Hq=%lld Hkv=%lld d=%lld, L=%lld (%lld per rank), %s, %s\n",
                world, flashgrad::dtype_name(t), static_cast<long long>(B), static_cast<long long>(H),
                static_cast<long long>(Hk), static_cast<long long>(d), static_cast<long long>(f.seqlen),
                static_cast<long long>(f.seqlen / world), f.causal ? "causal" : "full",
                f.sharding == flashgrad::Sharding::zigzag ? "zigzag" : "contiguous");
    std::printf("| rank | fwd ms | fwd ms/step | fwd hidden | bwd ms | bwd ms/step | bwd hidden | extra MiB |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    double slow_f = 0, slow_b = 0;
    for (int r = 0; r < world; ++r) {
      const double* m = &all[static_cast<size_t>(9 * r)];
      auto hidden = [](double wait, double alone) {
        return alone > 0 ? std::clamp(1.0 - wait / alone, 0.0, 1.0) : 1.0;
      };
      std::printf("| %d | %.1f | %.2f | %.0f%% | %.1f | %.2f | %.0f%% | %.0f |\n", r, 1e3 * m[0], 1e3 * m[0] / world,
                  100 * hidden(m[3], m[6]), 1e3 * m[1], 1e3 * m[1] / world, 100 * hidden(m[5], m[6] + m[7]), m[8]);
      slow_f = std::max(slow_f, m[0]);
      slow_b = std::max(slow_b, m[1]);
    }
    std::printf("K/V exchange alone: %.2f ms per ring (%.1f MiB per step); forward %.1f GFLOP/s, backward %.1f "
                "GFLOP/s over all ranks\n",
                1e3 * all[6], static_cast<double>(kv_bytes) / (1 << 20), fwd_flops / slow_f / 1e9,
                2.5 * fwd_flops / slow_b / 1e9);
  }
  MPI_Finalize();
  return 0;
}
