/* flashgrad C ABI (C99), on DLPack tensors. See flashgrad.hpp for the
 * equation, the masks' alignment and what happens to masked rows.
 *
 * Tensors (strides in elements; NULL strides mean compact row-major):
 *   q    [batch, seqlen_q, heads_q,  head_dim]     f32, f64, bf16 or f16
 *   k    [batch, seqlen_k, heads_kv, head_dim]     same dtype as q
 *   v    [batch, seqlen_k, heads_kv, head_dim_v]   same dtype as q
 *   out  [batch, seqlen_q, heads_q,  head_dim_v]   same dtype as q
 *   lse  [batch, heads_q, seqlen_q]                f32, natural log
 * With cu_seqlens_q/k (int32 [batch + 1]) the batch dim is dropped: q is
 * [total_q, heads_q, head_dim], ..., and lse is [heads_q, total_q].
 *
 * Every function returns FG_OK or an error status; on error no output has
 * been written and fg_last_error() (per thread) says which argument was
 * wrong, what was expected and what was got. No function throws or aborts. */
#ifndef FLASHGRAD_H_
#define FLASHGRAD_H_

#include <dlpack/dlpack.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  FG_OK = 0,
  FG_ERR_INVALID_ARGUMENT = 1,
  FG_ERR_OUT_OF_MEMORY = 2,
  FG_ERR_UNSUPPORTED = 3,
  FG_ERR_INTERNAL = 4
} fg_status;

typedef struct {
  double softmax_scale;          /* NaN or <= 0: 1 / sqrt(head_dim) */
  int causal;                    /* bottom-right aligned */
  int64_t window_left;           /* -1: unbounded */
  int64_t window_right;          /* -1: unbounded */
  double softcap;                /* 0: off; else S = softcap * tanh(S / softcap) */
  const DLTensor* alibi_slopes;  /* f32 [heads_q] or [batch, heads_q], or NULL */
  const DLTensor* bias;          /* f32/f64/bf16/f16 [batch|1, heads_q|1, seqlen_q|1, seqlen_k|1], or NULL */
  const DLTensor* mask;          /* u8 (or bool), same shape rules; nonzero = attend; or NULL */
  const DLTensor* sinks;         /* f32 [heads_q], or NULL */
  const DLTensor* cu_seqlens_q;  /* i32 [batch + 1], or NULL (with cu_seqlens_k) */
  const DLTensor* cu_seqlens_k;  /* i32 [batch + 1], or NULL */
  double dropout_p;              /* in [0, 1) */
  uint64_t seed;                 /* dropout RNG key */
  uint64_t offset;               /* dropout RNG stream offset */
  int num_threads;               /* 0: all cores */
  /* Nonzero: this call is a block of a longer attention (see Options::block in
   * flashgrad.hpp): query i is row block_q_offset + i of block_seqlen_q_total,
   * key j is key block_k_offset + j of block_seqlen_k_total. */
  int block;
  int64_t block_q_offset;
  int64_t block_k_offset;
  int64_t block_seqlen_q_total;
  int64_t block_seqlen_k_total;
} fg_params;

/* Defaults: default scale, no mask, no dropout, windows -1, all cores. */
fg_params fg_params_default(void);

fg_status fg_forward(const fg_params* p, const DLTensor* q, const DLTensor* k, const DLTensor* v,
                     DLTensor* out, DLTensor* lse);

/* dq, dk, dv have the shapes and dtype of q, k, v and are overwritten.
 * dsinks (f32 [heads_q]) may be NULL; it requires p->sinks. */
fg_status fg_backward(const fg_params* p, const DLTensor* q, const DLTensor* k, const DLTensor* v,
                      const DLTensor* out, const DLTensor* lse, const DLTensor* dout, DLTensor* dq,
                      DLTensor* dk, DLTensor* dv, DLTensor* dsinks);

/* As fg_backward, and dbias (f32, the shape of p->bias, summed over its
 * broadcast batch/head dims) when non-NULL. */
fg_status fg_backward_with_bias_grad(const fg_params* p, const DLTensor* q, const DLTensor* k,
                                     const DLTensor* v, const DLTensor* out, const DLTensor* lse,
                                     const DLTensor* dout, DLTensor* dq, DLTensor* dk, DLTensor* dv,
                                     DLTensor* dsinks, DLTensor* dbias);

/* Workspace bytes forward/backward would allocate for these inputs; -1 on error. */
int64_t fg_forward_workspace_bytes(const fg_params* p, const DLTensor* q, const DLTensor* k,
                                   const DLTensor* v);
int64_t fg_backward_workspace_bytes(const fg_params* p, const DLTensor* q, const DLTensor* k,
                                    const DLTensor* v);

/* The plan of fg_forward (backward = 0) or fg_backward (backward = 1) with
 * these inputs, one line as flashgrad::Plan::describe() writes it: kernel
 * name, path, tiles, threads, workspace. Valid until this thread's next
 * call of fg_explain; NULL on error. */
const char* fg_explain(const fg_params* p, const DLTensor* q, const DLTensor* k, const DLTensor* v,
                       int backward);

/* Merges partial attention over disjoint keys into (o_acc, lse_acc), in f32
 * (flashgrad::merge): o_acc/o_part f32 [batch, seqlen, heads, dv],
 * lse_acc/lse_part f32 [batch, heads, seqlen]. */
fg_status fg_merge(DLTensor* o_acc, DLTensor* lse_acc, const DLTensor* o_part, const DLTensor* lse_part,
                   int num_threads);

/* Where every later call's tasks run (flashgrad::set_thread_runner in
 * flashgrad.hpp): run(ctx, num_tasks, num_threads, task, task_ctx) calls
 * task(task_ctx, i, t) once for every i in [0, num_tasks), with t in
 * [0, num_threads) and no two overlapping calls sharing a t, and returns when
 * all have returned. run NULL: flashgrad's own pool. name (may be NULL) is
 * what plans print. Set it between calls, not during one. */
typedef void (*fg_task_fn)(void* task_ctx, int64_t task, int thread);
typedef void (*fg_thread_runner_fn)(void* ctx, int64_t num_tasks, int num_threads, fg_task_fn task,
                                    void* task_ctx);
fg_status fg_set_thread_runner(fg_thread_runner_fn run, void* ctx, const char* name);

/* Every later call's tasks on the threads of the OpenMP runtime in the shared
 * library at `library` (flashgrad::use_openmp_runtime); NULL or "": the own
 * pool. */
fg_status fg_use_openmp_runtime(const char* library);

/* The last error message of this thread ("" if none). Valid until the next call. */
const char* fg_last_error(void);

/* The library's version, "major.minor.patch". */
const char* fg_version(void);

/* The kernel path: "amx", "avx512bf16", "avx512", "avx2" or "scalar"
   (FLASHGRAD_ISA forces one); NULL on error. */
const char* fg_isa(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHGRAD_H_ */
