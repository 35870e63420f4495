// flashgrad: exact, memory-efficient attention with a fused backward, on CPUs.
//
// For every batch b and query head h (key/value head h / (heads_q / heads_kv)):
//
//   S[i, j]  = scale * q[b, i, h, :] . k[b, j, hk, :]
//   S        = softcap * tanh(S / softcap)                    (if softcap > 0)
//   S[i, j] += -alibi[h] * |i + seqlen_k - seqlen_q - j|      (if alibi_slopes)
//   S[i, j] += bias[b, h, i, j]                               (if bias)
//   S[i, j]  = -inf where masked: causal, window, mask == 0
//   lse[i]   = log(sum_j exp(S[i, j]) + exp(sinks[h]))        (sink term only if sinks)
//   P[i, j]  = exp(S[i, j] - lse[i])
//   out[i]   = sum_j dropout(P[i, j]) * v[b, j, hk, :]
//
// Causal and window are aligned bottom-right, as in flash-attn >= 2.1: query i
// sits at key position i' = i + seqlen_k - seqlen_q and sees keys j with
//   i' - window_left <= j <= i' + window_right   (a bound of -1 is unbounded)
// and, if causal, j <= i'.
//
// Dropout keeps P[i, j] with probability 1 - p and scales it by 1 / (1 - p).
// The keep decision is a counter-based random function of
// (seed, offset, b, h, i, j), so backward regenerates it without storing it.
//
// Options::block makes the call one block of a longer attention (chunked
// prefill, ring attention): query i is row q_offset + i of seqlen_q_total rows
// and key j is key k_offset + j of seqlen_k_total, so causal, window, ALiBi and
// dropout act as on the whole; lse is that of the block's keys alone, and
// merge() combines blocks.
//
// Masked rows: a query row that sees no key (and seqlen_k == 0) gets out = 0,
// lse = -inf (lse = sinks[h] when sinks are given), and contributes zero to
// every gradient. No NaN is produced by masking. NaN or Inf in the inputs
// propagate by IEEE rules to the rows and heads that read them.
//
// Memory: the library allocates per-thread tiles and O(seqlen) vectors, never
// anything of size seqlen_q * seqlen_k (workspace_bytes() reports it exactly).
// The largest workspace of 1 MiB or more that a call frees, up to
// FLASHGRAD_WORKSPACE_CACHE_MIB (default 64; 0 keeps none), is kept for the
// next call of a similar size instead of going back to the system.
// Results are bitwise identical for any num_threads.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace flashgrad {

enum class DType : int { f32, f64, bf16, f16, u8, i32 };

const char* dtype_name(DType t);
int64_t dtype_size(DType t);

// A strided view of caller-owned memory. Strides are in elements.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};

  // Compact row-major view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape);
  static TensorView strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> strides);
  int64_t numel() const;
};

struct Options {
  double softmax_scale = 0.0;  // NaN or <= 0: 1 / sqrt(head_dim)
  bool causal = false;
  int64_t window_left = -1;    // -1: unbounded
  int64_t window_right = -1;   // -1: unbounded
  double softcap = 0.0;        // 0: off

  // Optional inputs. Leading dims of size 1 (or stride 0) broadcast.
  std::optional<TensorView> alibi_slopes;  ///< f32 [heads_q] or [batch, heads_q]
  std::optional<TensorView> bias;          ///< f32/f64/bf16/f16 [batch|1, heads_q|1, seqlen_q|1, seqlen_k|1]
  std::optional<TensorView> mask;          ///< u8 [batch|1, heads_q|1, seqlen_q, seqlen_k], nonzero = attend
  std::optional<TensorView> sinks;         ///< f32 [heads_q], one extra logit per head (denominator only)

  // Packed variable-length batches (both or neither). Then q is
  // [total_q, heads_q, head_dim], k/v [total_k, heads_kv, *], out likewise,
  // lse [heads_q, total_q], and bias/mask are indexed by positions inside
  // each sequence: [batch|1, heads_q|1, max_seqlen_q, max_seqlen_k].
  std::optional<TensorView> cu_seqlens_q;  ///< i32 [batch + 1], non-decreasing, from 0
  std::optional<TensorView> cu_seqlens_k;  ///< i32 [batch + 1]

  double dropout_p = 0.0;  // in [0, 1)
  uint64_t seed = 0;
  uint64_t offset = 0;
  int num_threads = 0;     // 0: all cores. Idle workers watch for the next call for
                           // FLASHGRAD_SPIN_US microseconds (default 100, 0: sleep at once)

  // Not with cu_seqlens. 0 <= q_offset, q_offset + seqlen_q <= seqlen_q_total; keys likewise.
  struct Block {
    int64_t q_offset = 0, k_offset = 0;
    int64_t seqlen_q_total = 0, seqlen_k_total = 0;
  };
  std::optional<Block> block;
};

// An invalid argument reads "flashgrad::<function>: argument '<name>': expected
// <...>, got <...>"; out of memory reads "flashgrad::<function>: out of memory:
// expected to allocate <n> bytes ..., got <...>". Nothing has been written to
// any output when it is thrown.
class Error : public std::runtime_error {
 public:
  enum class Code { invalid_argument, out_of_memory, unsupported };
  explicit Error(const std::string& what, Code code = Code::invalid_argument)
      : std::runtime_error(what), code_(code) {}
  Code code() const { return code_; }

 private:
  Code code_;
};

// q    [batch, seqlen_q, heads_q,  head_dim]
// k    [batch, seqlen_k, heads_kv, head_dim]
// v    [batch, seqlen_k, heads_kv, head_dim_v]
// out  [batch, seqlen_q, heads_q,  head_dim_v]   written
// lse  f32 [batch, heads_q, seqlen_q]             written
// q, k, v share one dtype: f32, f64, bf16 or f16; out has it too, or is f32
// when it is bf16/f16 (accumulation precision kept). head dims in [1, 512].
void forward(const Options& opts, const TensorView& q, const TensorView& k, const TensorView& v,
             const TensorView& out, const TensorView& lse);

// Gradients of sum(out * dout). out and lse may come from elsewhere (for
// example merged across ranks); they must be those of the same attention.
// dq, dk, dv have the shapes of q, k, v, and q's dtype or (with bf16/f16) all
// three f32, as may out; dsinks f32 [heads_q] (only with sinks);
// dbias f32 with the shape of bias, summed over its broadcast dims.
// All outputs are overwritten, not accumulated into.
struct Grads {
  TensorView dq, dk, dv;
  std::optional<TensorView> dsinks;
  std::optional<TensorView> dbias;
};
void backward(const Options& opts, const TensorView& q, const TensorView& k, const TensorView& v,
              const TensorView& out, const TensorView& lse, const TensorView& dout,
              const Grads& grads);

// Merges the attention of the same queries over a second, disjoint set of
// keys (o_part, lse_part) into (o_acc, lse_acc), in f32 (or all four f64):
//   lse = log(exp(lse_acc) + exp(lse_part))
//   o_acc = exp(lse_acc - lse) * o_acc + exp(lse_part - lse) * o_part
// o_acc [batch, seqlen, heads, dv] and lse_acc [batch, heads, seqlen]; o_part
// and lse_part of the same shapes. Rows
// with lse_part = -inf (no visible key) leave the accumulator as it is; an
// accumulator row that starts at lse = -inf takes the part as it is.
void merge(const TensorView& o_acc, const TensorView& lse_acc, const TensorView& o_part,
           const TensorView& lse_part, int num_threads = 0);

// Bytes of workspace forward()/backward() would allocate for these inputs.
int64_t forward_workspace_bytes(const Options& opts, const TensorView& q, const TensorView& k,
                                const TensorView& v);
int64_t backward_workspace_bytes(const Options& opts, const TensorView& q, const TensorView& k,
                                 const TensorView& v);

// The plan of a call: what forward()/backward() with these arguments run,
// chosen as the call chooses it (docs/design.md, "The plan").
//
// Forward paths, the tile routine of the call's first task:
//   rows          Q K^T and P V on row tiles, K^T and V staged
//   whole_rows    the same with K and V read in place (decode, 1 to 4 rows)
//   heads_across  decode on several K/V heads per product call
//   keys_major    S^T = K Q^T tiles, the softmax down their columns
//   narrow        keys-major tiles of 8 to 64 rows keeping O^T
//   dot_rows      bf16 row tiles on AVX512_BF16 dot products
//   narrow_dot    narrow tiles on AVX512_BF16 dot products
//   amx           bf16 tiles on AMX
//   amx_narrow    AMX tiles of 3 to 32 rows keeping O^T
// Backward paths: two_pass (a dK/dV pass, then a dQ pass) or single_pass
// (dQ accumulated per thread beside dK/dV, key_chunks runs per K/V head).
enum class ForwardPath { rows, whole_rows, heads_across, keys_major, narrow, dot_rows, narrow_dot, amx, amx_narrow };
enum class BackwardPath { two_pass, single_pass };
const char* path_name(ForwardPath p);
const char* path_name(BackwardPath p);

struct Plan {
  const char* isa = "";               ///< the kernel table (isa_name())
  bool backward = false;              ///< which pass this plan is of
  ForwardPath forward_path = ForwardPath::rows;
  BackwardPath backward_path = BackwardPath::two_pass;
  bool pair_products = false;         ///< bf16 products on pairs (AVX512_BF16 or AMX)
  bool heads_outer = false;           ///< forward: a task takes its K/V heads one after another
  int64_t block_q = 0, block_k = 0;   ///< query rows and keys per tile
  int64_t splits = 1;                 ///< forward: key runs merged at the end (split keys)
  int64_t key_chunks = 1;             ///< single-pass backward: key runs per (batch, K/V head)
  int64_t key_group = 1;              ///< single-pass backward: key blocks each query block meets in turn
  // Single-pass backward with one key run: where its f32 dQ sums are kept,
  // "workspace", "dq" (in dq itself, f32 and f64) or "split dq" (bf16: dq
  // holds each sum's upper half, the workspace its lower); the same bits
  // in each, less workspace in the last two.
  const char* dq_sums = "";
  int64_t threads = 1;
  std::string thread_runner;          ///< where the tasks run (thread_runner_name())
  int64_t workspace_bytes = 0;
  std::string kernel;                 ///< e.g. fwd_bf16_avx512bf16_narrow_dot_q16k64
  std::string describe() const;       ///< one line: kernel, path, tiles, threads (and their runner), workspace
};
// The plans of forward() and backward() with these inputs (throws as they would).
Plan explain_forward(const Options& opts, const TensorView& q, const TensorView& k, const TensorView& v);
Plan explain_backward(const Options& opts, const TensorView& q, const TensorView& k, const TensorView& v);

// The dropout keep mask the kernels use, for tests and references:
// keep u8 [batch, heads_q, seqlen_q, seqlen_k] (padded to the longest sequence
// when varlen), 1 = kept.
void dropout_keep_mask(const Options& opts, int64_t batch, int64_t heads_q, int64_t seqlen_q,
                       int64_t seqlen_k, const TensorView& keep);

// The library's version, "major.minor.patch".
const char* version();

// The kernel path in use: "amx" (avx512 with bf16's products on AMX tiles),
// "avx512bf16" (avx512 with bf16's products on AVX512_BF16 dot products),
// "avx512", "avx2" or "scalar". FLASHGRAD_ISA forces one of them (an ISA the
// CPU lacks is an error at first use).
const char* isa_name();
int max_threads();

// Where a call's tasks run. By default on flashgrad's own pool: the calling
// thread and persistent workers. A host with threads of its own can take the
// tasks instead, so that flashgrad's workers never compete with its idle
// ones for the cores (PyTorch's OpenMP threads spin for milliseconds after
// each parallel operator).
//
// run(ctx, num_tasks, num_threads, task, task_ctx) must call
// task(task_ctx, i, t) once for every i in [0, num_tasks) and return when all
// have returned; t is in [0, num_threads), and two calls of task with the same
// t must not overlap (t indexes per-thread scratch). Results do not depend on
// which thread runs which task.
struct ThreadRunner {
  using Task = void (*)(void* task_ctx, int64_t task, int thread);
  void (*run)(void* ctx, int64_t num_tasks, int num_threads, Task task, void* task_ctx) = nullptr;
  void* ctx = nullptr;
  std::string name;  // what thread_runner_name() reports
};
// Runs every later call's tasks on runner (run == nullptr: on flashgrad's own
// pool again). Set it between calls, not during one.
void set_thread_runner(const ThreadRunner& runner);
// Runs every later call's tasks on the threads of the OpenMP runtime in the
// shared library at `library` (libgomp, or a runtime with its GOMP_parallel
// entry point, as libiomp5), loading it unless the process already has: pass
// the runtime the host framework uses. An empty path: flashgrad's own pool.
// Throws Error if the library or its entry points are missing.
void use_openmp_runtime(const std::string& library);
// "flashgrad" for the own pool, else the runner's name ("openmp <path>").
std::string thread_runner_name();

}  // namespace flashgrad
