// `flashgrad-lab roofline`: the rates this machine's libraries reach, which the
// sweep divides flashgrad's rates by. All in this process:
//
//   SGEMM      OpenBLAS cblas_sgemm, n = 2048 square, T threads and 1 thread
//   bf16 GEMM  oneDNN matmul bf16 x bf16 -> f32, n = 2048, T threads (and
//              oneDNN's f32 matmul beside it); "n/a" when built without oneDNN
//   tiles      the kernels' tile products, 1 thread, on the same operands:
//              OpenBLAS, oneDNN (dnnl_sgemm), BLIS, libxsmm and flashgrad's
//              own tile product (bench/tile_ops.hpp), taking turns; and
//              on the amx and avx512bf16 paths, their bf16 pair products
//              beside oneDNN's bf16 matmul
//   memory     STREAM triad and memcpy (bandwidth.hpp), T threads
//
// Every rate is the median over repeated calls after a warm-up call.
#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#if FLASHGRAD_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "peak.hpp"
#include "tile_ops.hpp"

#include "bandwidth.hpp"
#include "cli.hpp"
#include "harness.hpp"
#include "dispatch.hpp"
#include "flashgrad/flashgrad.hpp"
#include "openblas.hpp"
#include "small_gemm.hpp"
#include "system.hpp"

namespace flashgrad::tools {
namespace {

struct Settings {
  int threads = 0;
  bool quick = false;
  bool json = false;
  int64_t gemm_n = 2048;
  int repeats = 5;
};

// The median of `repeats` timed calls after one warm-up, as work per second.
double median_rate(const std::function<void()>& fn, double work, int repeats) {
  return work / median(time_calls(fn, 1, repeats));
}

double sgemm_gflops(int64_t n, int threads, int repeats) {
  openblas_set_num_threads(threads);
  Sgemm gemm(n);
  const double rate = median_rate([&] { gemm.run(); }, gemm.flops(), repeats) / 1e9;
  settle();
  return rate;
}

#if FLASHGRAD_HAVE_DNNL
// oneDNN matmul c [n, n] f32 = a [n, n] * b [n, n], a and b of type `in`, plain
// row-major layouts (the matmul packs b itself, as cblas_sgemm does).
double dnnl_gflops(dnnl::memory::data_type in, int64_t n, int threads, int repeats, std::string* impl) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  omp_set_num_threads(threads);
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const dnnl::memory::desc a_md({n, n}, in, tag::ab), b_md({n, n}, in, tag::ab), c_md({n, n}, dt::f32, tag::ab);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), engine);
  } catch (const dnnl::error&) {
    // oneDNN has no matmul for this type on this CPU (bf16 without AVX-512):
    // the rate is missing, and the sweep divides bf16 by SGEMM instead.
    *impl = "none on this CPU";
    return NAN;
  }
  *impl = pd.impl_info_str();
  dnnl::memory a(a_md, engine), b(b_md, engine), c(c_md, engine);
  uint32_t seed = 3;
  for (dnnl::memory* m : {&a, &b}) {
    const std::vector<float> x = testing::uniform_floats(static_cast<size_t>(n * n), seed++);
    if (in == dt::bf16) {
      auto* dst = static_cast<uint16_t*>(m->get_data_handle());
      for (size_t i = 0; i < x.size(); ++i) {
        uint32_t bits;
        std::memcpy(&bits, &x[i], 4);
        dst[i] = static_cast<uint16_t>(bits >> 16);  // exact enough for timing: truncation
      }
    } else {
      std::memcpy(m->get_data_handle(), x.data(), x.size() * sizeof(float));
    }
  }
  const dnnl::matmul matmul(pd);
  auto call = [&] {
    matmul.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream.wait();
  };
  const double rate = median_rate(call, 2.0 * static_cast<double>(n * n * n), repeats) / 1e9;
  settle();
  return rate;
}
#endif

// The products of one tile step of the kernels at d = 64 and 128, f32 (the
// shapes of bench/micro.cpp). The forward's keys-major tiles are 256 query
// rows by 64 keys, the backward's 64 query rows by 256 keys, so the
// forward's S^T and the backward's S share a shape, and so do the forward's
// P V and the backward's dV and dK (P and dS read transposed).
struct TileShape {
  const char* name;
  GemmShape shape;
};
const TileShape kTileShapes[] = {
    {"fwd S^T = K (scale Q)^T; bwd S = Q K^T, dP = dO V^T; d = 64", {64, 256, 64, false}},
    {"fwd S^T = K (scale Q)^T; bwd S = Q K^T, dP = dO V^T; d = 128", {64, 256, 128, false}},
    {"fwd O += P V; bwd dV += P^T dO, dK += dS^T Q; d = 64", {256, 64, 64, true}},
    {"fwd O += P V; bwd dV += P^T dO, dK += dS^T Q; d = 128", {256, 128, 64, true}},
    {"bwd dQ += dS K, d = 64", {64, 64, 256, false}},
    {"bwd dQ += dS K, d = 128", {64, 128, 256, false}},
};

// Who multiplies the tiles, in the order of TileRate::gflops.
constexpr const char* kTileLibraries[] = {"OpenBLAS", "oneDNN", "BLIS", "libxsmm", "flashgrad"};
constexpr int kTileContenders = 5;

struct TileRate {
  TileShape shape;
  double gflops[kTileContenders] = {NAN, NAN, NAN, NAN, NAN};  // NaN: not built in, or a wrong product
};

// Whether c holds A B to within f32 rounding: |c - AB| <= 2 k u sum |A||B| per element.
bool product_matches(const GemmShape& s, const std::vector<float>& a, const std::vector<float>& b,
                     const std::vector<float>& c) {
  for (int64_t r = 0; r < s.m; ++r)
    for (int64_t j = 0; j < s.n; ++j) {
      double sum = 0, mag = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        const double x = a[static_cast<size_t>(s.transposed_a ? p * s.m + r : r * s.k + p)];
        const double y = b[static_cast<size_t>(p * s.n + j)];
        sum += x * y;
        mag += std::fabs(x * y);
      }
      const double bound = 2.0 * static_cast<double>(s.k) * 0x1p-24 * mag;
      if (!(std::fabs(c[static_cast<size_t>(r * s.n + j)] - sum) <= bound)) return false;
    }
  return true;
}

// The contenders (null: none) take turns, one batch of calls (at least 20
// ms) each per round, so that the machine's drift over the rounds reaches
// them all alike; gflops[x] gets contender x's median round.
void round_robin(const std::function<void()>* calls, int count, double flops, int rounds, double* gflops) {
  std::vector<int64_t> per_batch(static_cast<size_t>(count), 0);
  std::vector<std::vector<double>> rates(static_cast<size_t>(count));
  for (int x = 0; x < count; ++x) {
    if (!calls[x]) continue;
    int64_t& nb = per_batch[static_cast<size_t>(x)];
    nb = 1;
    for (double secs = 0; secs < 0.02; nb *= 2) {
      const double t0 = now_seconds();
      for (int64_t i = 0; i < nb; ++i) calls[x]();
      secs = now_seconds() - t0;
    }
  }
  for (int round = 0; round < rounds; ++round)
    for (int x = 0; x < count; ++x) {
      if (!calls[x]) continue;
      const int64_t nb = per_batch[static_cast<size_t>(x)];
      const double t0 = now_seconds();
      for (int64_t i = 0; i < nb; ++i) calls[x]();
      rates[static_cast<size_t>(x)].push_back(flops * static_cast<double>(nb) / (now_seconds() - t0) / 1e9);
    }
  for (int x = 0; x < count; ++x)
    if (!rates[static_cast<size_t>(x)].empty()) gflops[x] = median(rates[static_cast<size_t>(x)]);
}

// Each contender's result is checked first, then they take turns (round_robin).
std::vector<TileRate> tile_rates(int rounds) {
  openblas_set_num_threads(1);
#if FLASHGRAD_HAVE_DNNL
  const int omp_threads = omp_get_max_threads();
  omp_set_num_threads(1);  // oneDNN's sgemm runs on OpenMP
#endif
  std::vector<TileRate> out;
  for (const TileShape& t : kTileShapes) {
    const GemmShape& s = t.shape;
    const std::vector<float> a = testing::uniform_floats(static_cast<size_t>(s.m * s.k), 4),
                             b = testing::uniform_floats(static_cast<size_t>(s.k * s.n), 5);
    std::vector<float> c(static_cast<size_t>(s.m * s.n));
    const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
    const int lda = s.transposed_a ? m : k;  // A stored [m, k], or [k, m] and read transposed
    std::function<void()> calls[kTileContenders];
    calls[0] = [&] {
      cblas_sgemm(CblasRowMajor, s.transposed_a ? CblasTrans : CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(),
                  lda, b.data(), n, 0.0f, c.data(), n);
    };
#if FLASHGRAD_HAVE_DNNL
    calls[1] = [&] {
      dnnl_sgemm(s.transposed_a ? 'T' : 'N', 'N', s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), s.n, 0.0f, c.data(),
                 s.n);
    };
#endif
    calls[2] = blis_product(s, a.data(), b.data(), c.data());
    calls[3] = libxsmm_product(s, a.data(), b.data(), c.data());
    const bench::TileOps& ops = bench::tile_ops(kernels().isa);
    const int64_t a_rs = s.transposed_a ? 1 : s.k, a_cs = s.transposed_a ? s.m : 1;
    calls[4] = [&] { ops.gemm_nn(s.m, s.n, s.k, a.data(), a_rs, a_cs, b.data(), s.n, c.data(), s.n); };
    for (int x = 0; x < kTileContenders; ++x) {
      if (!calls[x]) continue;
      std::fill(c.begin(), c.end(), NAN);
      calls[x]();
      if (!product_matches(s, a, b, c)) {
        std::fprintf(stderr, "flashgrad-lab roofline: %s's product %s is wrong; it is not timed\n", kTileLibraries[x],
                     t.name);
        calls[x] = nullptr;
      }
    }
    TileRate r{t};
    round_robin(calls, kTileContenders, 2.0 * static_cast<double>(s.m * s.n * s.k), rounds, r.gflops);
    out.push_back(r);
  }
#if FLASHGRAD_HAVE_DNNL
  omp_set_num_threads(omp_threads);
#endif
  return out;
}

// The bf16 pair products of the ISA in use (bench::pair_engine: AMX tiles or
// AVX512_BF16 dot products; docs/design.md, "bf16 on AMX"): the
// forward's 256-row by 256-key tiles, the backward's 64 by 256 (dV^T and
// dK^T: d by 256 keys over 64 query rows; dQ: 64 by d over 256 keys), d =
// 64 and 128. oneDNN's matmul (a primitive made once per shape, bf16 rows
// in, f32 out) against flashgrad's product, whose operands are already in
// its pair layouts (the kernels lay them out as they load the tiles).
struct PairShape {
  const char* name;
  int64_t m, n, k;
};
const PairShape kPairShapes[] = {
    {"fwd S = Q K^T, d = 64", 256, 256, 64},
    {"fwd S = Q K^T, d = 128", 256, 256, 128},
    {"fwd O += P V, d = 64", 256, 64, 256},
    {"fwd O += P V, d = 128", 256, 128, 256},
    {"bwd S, dP, d = 64; dV^T, dK^T, d = 64", 64, 256, 64},
    {"bwd S = Q K^T, dP = dO V^T, d = 128", 64, 256, 128},
    {"bwd dV^T += dO^T P, dK^T += Q^T dS, d = 128", 128, 256, 64},
    {"bwd dQ += dS K, d = 64", 64, 64, 256},
    {"bwd dQ += dS K, d = 128", 64, 128, 256},
};
constexpr const char* kPairContenders[] = {"oneDNN", "flashgrad"};

struct PairRate {
  PairShape shape;
  double gflops[2] = {NAN, NAN};
};

// The upper half of f's bits: f truncated to bf16.
uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
float bf16_value(uint16_t x) {
  const uint32_t u = uint32_t{x} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<PairRate> pair_tile_rates(int rounds, std::string* engine_name, std::string* dnnl_impl) {
  std::vector<PairRate> out;
  const bench::PairEngine pe = bench::pair_engine();
  if (!pe.gemm) return out;
  *engine_name = format("%s (%s)", pe.kernel, pe.isa);
#if FLASHGRAD_HAVE_DNNL
  const int omp_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
#endif
  for (const PairShape& sh : kPairShapes) {
    const int64_t m = sh.m, n = sh.n, k = sh.k;
    std::vector<uint16_t> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n));
    const std::vector<float> ua = testing::uniform_floats(a.size(), 6), ub = testing::uniform_floats(b.size(), 7);
    for (size_t i = 0; i < a.size(); ++i) a[i] = bf16_bits(ua[i]);
    for (size_t i = 0; i < b.size(); ++i) b[i] = bf16_bits(ub[i]);
    // B as pairs of its rows 2x and 2x + 1, the lower-indexed element low, as A's rows hold theirs.
    std::vector<uint32_t> bp(static_cast<size_t>(k / 2 * n));
    for (int64_t x = 0; x < k / 2; ++x)
      for (int64_t j = 0; j < n; ++j)
        bp[static_cast<size_t>(x * n + j)] =
            uint32_t{b[static_cast<size_t>(2 * x * n + j)]} | uint32_t{b[static_cast<size_t>((2 * x + 1) * n + j)]} << 16;
    std::vector<float> c(static_cast<size_t>(m * n));
    std::function<void()> calls[2];
#if FLASHGRAD_HAVE_DNNL
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::desc a_md({m, k}, dt::bf16, tag::ab), b_md({k, n}, dt::bf16, tag::ab),
        c_md({m, n}, dt::f32, tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), engine);
    *dnnl_impl = pd.impl_info_str();
    dnnl::memory am(a_md, engine, a.data()), bm(b_md, engine, b.data()), cm(c_md, engine, c.data());
    const dnnl::matmul mm(pd);
    calls[0] = [&] {
      mm.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      stream.wait();
    };
#endif
    calls[1] = [&] {
      pe.gemm(m, n, k / 2, reinterpret_cast<const uint32_t*>(a.data()), k / 2, bp.data(), n, c.data(), n);
    };
    for (int x = 0; x < 2; ++x) {
      if (!calls[x]) continue;
      std::fill(c.begin(), c.end(), NAN);
      calls[x]();
      bool ok = true;  // |c - AB| <= 2 k u sum |A||B| (bf16 products are exact in f32)
      for (int64_t r = 0; r < m && ok; ++r)
        for (int64_t j = 0; j < n && ok; ++j) {
          double sum = 0, mag = 0;
          for (int64_t p = 0; p < k; ++p) {
            const double t = static_cast<double>(bf16_value(a[static_cast<size_t>(r * k + p)])) *
                             bf16_value(b[static_cast<size_t>(p * n + j)]);
            sum += t;
            mag += std::fabs(t);
          }
          ok = std::fabs(c[static_cast<size_t>(r * n + j)] - sum) <= 2.0 * static_cast<double>(k) * 0x1p-24 * mag;
        }
      if (!ok) {
        std::fprintf(stderr, "flashgrad-lab roofline: %s's bf16 product %s is wrong; it is not timed\n",
                     kPairContenders[x], sh.name);
        calls[x] = nullptr;
      }
    }
    PairRate r{sh};
    round_robin(calls, 2, 2.0 * static_cast<double>(m * n * k), rounds, r.gflops);
    out.push_back(r);
  }
#if FLASHGRAD_HAVE_DNNL
  omp_set_num_threads(omp_threads);
#endif
  return out;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// "L3 260 MiB": the highest cache level sysfs describes for CPU 0.
std::string last_level_cache() {
  int best_level = 0;
  std::string best;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level_in(dir + "level"), size_in(dir + "size");
    int level = 0;
    std::string size;
    if (!(level_in >> level) || !(size_in >> size)) continue;
    if (level > best_level) {
      best_level = level;
      const long long kib = std::atoll(size.c_str());  // "266240K"
      best = "L" + std::to_string(level) + " " + (kib >= 1024 ? std::to_string(kib / 1024) + " MiB" : size);
    }
  }
  return best.empty() ? "unknown" : best;
}

struct Rates {
  double sgemm = 0, sgemm_1t = 0, bf16 = NAN, dnnl_f32 = NAN, triad = 0, copy = 0;
  int64_t triad_n = 0;  // doubles in each of the triad's three arrays
  std::string dnnl_impl_bf16 = "n/a", dnnl_impl_f32 = "n/a";
  std::vector<TileRate> tiles;
  std::vector<PairRate> pair_tiles;  // empty on paths without bf16 pair products
  std::string pair_engine = "n/a", dnnl_impl_pair_tiles = "n/a";
};

std::string rates_json(const Settings& s, const Rates& r, const std::string& core, const std::string& core_origin) {
  std::vector<std::string> tiles;
  for (const TileRate& t : r.tiles)
    tiles.push_back(Json()
                        .add("product", t.shape.name)
                        .add("m", t.shape.shape.m)
                        .add("n", t.shape.shape.n)
                        .add("k", t.shape.shape.k)
                        .add("transposed_a", t.shape.shape.transposed_a)
                        .add("openblas_gflops", t.gflops[0])
                        .add("onednn_gflops", t.gflops[1])
                        .add("blis_gflops", t.gflops[2])
                        .add("libxsmm_gflops", t.gflops[3])
                        .add("flashgrad_gflops", t.gflops[4])
                        .str());
  std::vector<std::string> pair_tiles;
  for (const PairRate& t : r.pair_tiles)
    pair_tiles.push_back(Json()  // keys of their own: the sweep reads each key across the whole object
                             .add("pair_product", t.shape.name)
                             .add("pair_m", t.shape.m)
                             .add("pair_n", t.shape.n)
                             .add("pair_k", t.shape.k)
                             .add("pair_onednn_gflops", t.gflops[0])
                             .add("pair_flashgrad_gflops", t.gflops[1])
                             .str());
  return Json()
      .add("cpu", cpu_model())
      .add("isa", isa_name())
      .add("threads", s.threads)
      .add("openblas", openblas_version())
      .add("openblas_core", core)
      .add("openblas_core_origin", core_origin)
      .add("blis", blis_version())
      .add("libxsmm", libxsmm_version())
      .add("gemm_n", s.gemm_n)
      .add("sgemm_gflops", r.sgemm)
      .add("sgemm_1thread_gflops", r.sgemm_1t)
      .add("bf16_gemm_gflops", r.bf16)
      .add("bf16_gemm_impl", r.dnnl_impl_bf16)
      .add("dnnl_f32_gemm_gflops", r.dnnl_f32)
      .add("dnnl_f32_gemm_impl", r.dnnl_impl_f32)
      .add("last_level_cache", last_level_cache())
      .add("triad_gbs", r.triad)
      .add("triad_array_bytes", r.triad_n * 8)
      .add("memcpy_gbs", r.copy)
      .add_raw("tiles", Json::array(tiles))
      .add("pair_tiles_engine", r.pair_engine)
      .add("pair_tiles_onednn_impl", r.dnnl_impl_pair_tiles)
      .add_raw("pair_tiles", Json::array(pair_tiles))
      .str();
}

std::string rate_text(double x) { return std::isfinite(x) ? format("%.1f", x) : "n/a"; }

void print_rates(const Settings& s, const Rates& r, const std::string& core) {
  std::printf("flashgrad-lab %s roofline: %s, %d threads, isa %s\n\n", version().c_str(), cpu_model().c_str(),
              s.threads, isa_name());
  const long long n = static_cast<long long>(s.gemm_n);
  std::printf("  SGEMM (%s, core %s) n=%lld:  %s GFLOP/s, %s with 1 thread\n", openblas_version().c_str(),
              core.c_str(), n, rate_text(r.sgemm).c_str(), rate_text(r.sgemm_1t).c_str());
  std::printf("  bf16 GEMM (oneDNN %s) n=%lld: %s GFLOP/s\n", r.dnnl_impl_bf16.c_str(), n, rate_text(r.bf16).c_str());
  std::printf("  f32 GEMM (oneDNN %s) n=%lld:  %s GFLOP/s\n", r.dnnl_impl_f32.c_str(), n, rate_text(r.dnnl_f32).c_str());
  std::printf("  memory: triad %.1f GB/s, memcpy %.1f GB/s (last-level cache %s)\n\n", r.triad, r.copy,
              last_level_cache().c_str());
  std::printf("  tile products, 1 thread, GFLOP/s (BLIS %s, libxsmm %s):\n", blis_version().c_str(),
              libxsmm_version().c_str());
  std::printf("  %-62s %15s", "", "m x n x k");
  for (const char* name : kTileLibraries) std::printf(" %9s", name);
  std::printf("\n");
  for (const TileRate& t : r.tiles) {
    const GemmShape& g = t.shape.shape;
    std::printf("  %-62s %15s", t.shape.name,
                format("%lld x %lld x %lld", static_cast<long long>(g.m), static_cast<long long>(g.n),
                       static_cast<long long>(g.k))
                    .c_str());
    for (double x : t.gflops) std::printf(" %9s", rate_text(x).c_str());
    std::printf("\n");
  }
  if (r.pair_tiles.empty()) return;
  std::printf("\n  bf16 tile products, 1 thread, GFLOP/s (oneDNN matmul %s; flashgrad's %s,\n"
              "  its operands already in its pair layouts):\n", r.dnnl_impl_pair_tiles.c_str(), r.pair_engine.c_str());
  std::printf("  %-62s %15s %9s %9s\n", "", "m x n x k", kPairContenders[0], kPairContenders[1]);
  for (const PairRate& t : r.pair_tiles)
    std::printf("  %-62s %15s %9s %9s\n", t.shape.name,
                format("%lld x %lld x %lld", static_cast<long long>(t.shape.m), static_cast<long long>(t.shape.n),
                       static_cast<long long>(t.shape.k))
                    .c_str(),
                rate_text(t.gflops[0]).c_str(), rate_text(t.gflops[1]).c_str());
}

}  // namespace

// --peak: the register-only loops alone (bench/peak.hpp), as text or one JSON line.
int print_peaks(const Settings& s) {
  const bench::PeakRates p = bench::measure_peaks(s.threads, s.quick ? 3 : 5);
  if (s.json) {
    std::printf("{\"threads\": %d, \"f32_isa\": \"%s\", \"f32_peak_gflops\": %.6g, \"bf16_isa\": \"%s\", "
                "\"bf16_peak_gflops\": %.6g}\n",
                s.threads, p.f32_isa.c_str(), p.f32_gflops, p.bf16_isa.c_str(), p.bf16_gflops);
  } else {
    std::printf("arithmetic peak, %d threads, register-only loops:\n  f32 FMA (%s): %.1f GFLOP/s\n", s.threads,
                p.f32_isa.c_str(), p.f32_gflops);
    if (!p.bf16_isa.empty()) std::printf("  bf16 pairs (%s): %.1f GFLOP/s\n", p.bf16_isa.c_str(), p.bf16_gflops);
  }
  return 0;
}

int run_roofline(Args& args) {
  Settings s;
  s.threads = static_cast<int>(args.integer("--threads", max_threads(), 1, 4096));
  s.quick = args.has("--quick");
  s.json = args.has("--json");
  const bool probe = args.has("--probe");
  const bool peak = args.has("--peak");
  args.finish();
  if (peak) return print_peaks(s);
  s.repeats = s.quick ? 3 : 7;
  use_chosen_openblas_core(args.prefix());
  const auto [core, core_origin] = choose_openblas_core();

  if (probe) {  // SGEMM alone, briefly: how fast the machine is right now
    std::printf("{\"sgemm_gflops\": %.6g}\n", sgemm_gflops(s.gemm_n, s.threads, 3));
    return 0;
  }
  Rates r;
#if FLASHGRAD_HAVE_DNNL
  r.bf16 = dnnl_gflops(dnnl::memory::data_type::bf16, s.gemm_n, s.threads, s.repeats, &r.dnnl_impl_bf16);
  r.dnnl_f32 = dnnl_gflops(dnnl::memory::data_type::f32, s.gemm_n, s.threads, s.repeats, &r.dnnl_impl_f32);
#endif
  r.sgemm = sgemm_gflops(s.gemm_n, s.threads, s.repeats);
  r.sgemm_1t = sgemm_gflops(s.gemm_n, 1, s.repeats);
  r.tiles = tile_rates(s.quick ? 3 : 7);
  r.pair_tiles = pair_tile_rates(s.quick ? 3 : 7, &r.pair_engine, &r.dnnl_impl_pair_tiles);
  // Three 256 MiB arrays (64 MiB quick), far past any cache; memcpy of 512 MiB (128 MiB).
  r.triad_n = s.quick ? (int64_t{1} << 23) : (int64_t{1} << 25);
  r.triad = Triad(r.triad_n, s.threads).gbs(s.quick ? 3 : 10);
  r.copy = memcpy_gbs(s.quick ? (int64_t{128} << 20) : (int64_t{512} << 20), s.threads, s.quick ? 3 : 10);
  if (s.json)
    std::printf("%s\n", rates_json(s, r, core, core_origin).c_str());
  else
    print_rates(s, r, core);
  return 0;
}

}  // namespace flashgrad::tools
