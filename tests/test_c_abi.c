/* The C ABI, from C99: the header compiles as C, the shared library links,
 * DLTensors (compact, strided, with byte_offset) give the results of a naive
 * fp64 attention, and errors come back as a status and a message with no
 * output written. Exits nonzero on any failure. */
#include <flashgrad/flashgrad.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, LQ = 5, LK = 7, HQ = 4, HKV = 2, D = 8, DV = 6 };
enum { NQ = B * LQ * HQ * D, NK = B * LK * HKV * D, NV = B * LK * HKV * DV, NO = B * LQ * HQ * DV,
       NL = B * HQ * LQ };

static int g_failures = 0;

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);       \
      ++g_failures;                                                                  \
    }                                                                                \
  } while (0)

/* A DLTensor with its own shape and stride storage; not to be moved after init. */
typedef struct {
  DLTensor t;
  int64_t shape[4];
  int64_t strides[4];
} Tensor;

static void tensor_init(Tensor* x, void* data, uint8_t code, int ndim, const int64_t* shape,
                        const int64_t* strides) {
  int i;
  memset(x, 0, sizeof(*x));
  x->t.data = data;
  x->t.device.device_type = kDLCPU;
  x->t.device.device_id = 0;
  x->t.ndim = ndim;
  x->t.dtype.code = code;
  x->t.dtype.bits = 32;
  x->t.dtype.lanes = 1;
  for (i = 0; i < ndim; ++i) {
    x->shape[i] = shape[i];
    if (strides) x->strides[i] = strides[i];
  }
  x->t.shape = x->shape;
  x->t.strides = strides ? x->strides : NULL;
  x->t.byte_offset = 0;
}

static void tensor4(Tensor* x, float* data, int64_t a, int64_t b, int64_t c, int64_t d) {
  const int64_t shape[4] = {a, b, c, d};
  tensor_init(x, data, kDLFloat, 4, shape, NULL);
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float uniform(void) { /* in [-1, 1) */
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static void fill(float* x, int n) {
  int i;
  for (i = 0; i < n; ++i) x[i] = uniform();
}

/* Element (b, s, h, d) of a [B, S, H, Dx] tensor with the given element strides. */
static double at(const float* base, const int64_t* st, int b, int s, int h, int d) {
  return base[b * st[0] + s * st[1] + h * st[2] + d * st[3]];
}

/* Naive fp64 attention on compact BSHD q/k/v/dout: out, lse, and (dout != NULL) grads. */
typedef struct {
  double out[NO], lse[NL], dq[NQ], dk[NK], dv[NV], dsinks[HQ];
} Reference;

static void naive(const float* q, const float* k, const float* v, const float* sinks,
                  const float* dout, Reference* r) {
  const double scale = 1.0 / sqrt((double)D);
  int b, h, i, j, d;
  memset(r, 0, sizeof(*r));
  for (b = 0; b < B; ++b)
    for (h = 0; h < HQ; ++h) {
      const int hk = h / (HQ / HKV);
      for (i = 0; i < LQ; ++i) {
        double s[LK], p[LK], m = -INFINITY, sum = 0, lse, delta = 0, psink = 0;
        const float* qi = q + ((b * LQ + i) * HQ + h) * D;
        double* oi = r->out + ((b * LQ + i) * HQ + h) * DV;
        for (j = 0; j < LK; ++j) {
          const float* kj = k + ((b * LK + j) * HKV + hk) * D;
          s[j] = 0;
          for (d = 0; d < D; ++d) s[j] += (double)qi[d] * kj[d];
          s[j] *= scale;
          if (s[j] > m) m = s[j];
        }
        if (sinks && sinks[h] > m) m = sinks[h];
        for (j = 0; j < LK; ++j) sum += exp(s[j] - m);
        if (sinks) sum += exp(sinks[h] - m);
        lse = m + log(sum);
        r->lse[(b * HQ + h) * LQ + i] = lse;
        for (j = 0; j < LK; ++j) {
          const float* vj = v + ((b * LK + j) * HKV + hk) * DV;
          p[j] = exp(s[j] - lse);
          for (d = 0; d < DV; ++d) oi[d] += p[j] * vj[d];
        }
        if (!dout) continue;
        /* delta = dout . out;  dS = P * (dout . v - delta) */
        {
          const float* gi = dout + ((b * LQ + i) * HQ + h) * DV;
          double* dqi = r->dq + ((b * LQ + i) * HQ + h) * D;
          for (d = 0; d < DV; ++d) delta += gi[d] * oi[d];
          if (sinks) psink = exp(sinks[h] - lse);
          r->dsinks[h] -= psink * delta;
          for (j = 0; j < LK; ++j) {
            const float* kj = k + ((b * LK + j) * HKV + hk) * D;
            const float* vj = v + ((b * LK + j) * HKV + hk) * DV;
            double* dkj = r->dk + ((b * LK + j) * HKV + hk) * D;
            double* dvj = r->dv + ((b * LK + j) * HKV + hk) * DV;
            double dp = 0, ds;
            for (d = 0; d < DV; ++d) dp += gi[d] * (double)vj[d];
            ds = p[j] * (dp - delta);
            for (d = 0; d < D; ++d) {
              dqi[d] += scale * ds * kj[d];
              dkj[d] += scale * ds * qi[d];
            }
            for (d = 0; d < DV; ++d) dvj[d] += p[j] * gi[d];
          }
        }
      }
    }
}

/* Compares a [n0, n1, n2, n3] strided float tensor with a compact double one. */
static int close4(const char* what, const float* got, const int64_t* st, const double* want,
                  int n0, int n1, int n2, int n3, double tol) {
  int a, b, c, d, bad = 0;
  for (a = 0; a < n0; ++a)
    for (b = 0; b < n1; ++b)
      for (c = 0; c < n2; ++c)
        for (d = 0; d < n3; ++d) {
          const double x = at(got, st, a, b, c, d), y = want[((a * n1 + b) * n2 + c) * n3 + d];
          if (!(fabs(x - y) <= tol * (1 + fabs(y)))) {
            if (bad < 5) fprintf(stderr, "%s[%d,%d,%d,%d]: got %.9g, want %.9g\n", what, a, b, c, d, x, y);
            ++bad;
          }
        }
  return bad == 0;
}

static const int64_t* compact_strides(int64_t* st, int n1, int n2, int n3) {
  st[3] = 1;
  st[2] = n3;
  st[1] = (int64_t)n2 * n3;
  st[0] = (int64_t)n1 * n2 * n3;
  return st;
}

static int all_finite(const float* x, int n) {
  int i;
  for (i = 0; i < n; ++i)
    if (!isfinite(x[i])) return 0;
  return 1;
}

static int bytes_equal(const void* a, unsigned char value, size_t n) {
  const unsigned char* p = (const unsigned char*)a;
  size_t i;
  for (i = 0; i < n; ++i)
    if (p[i] != value) return 0;
  return 1;
}

static float q[NQ], k[NK], v[NV], dout[NO], sinks[HQ];
static float out[NO], lse[NL], dq[NQ], dk[NK], dv[NV], dsinks[HQ];
static Reference ref, ref_sinks;

static void test_params_default(void) {
  const fg_params p = fg_params_default();
  CHECK(isnan(p.softmax_scale));
  CHECK(p.causal == 0);
  CHECK(p.window_left == -1 && p.window_right == -1);
  CHECK(p.softcap == 0.0 && p.dropout_p == 0.0);
  CHECK(p.seed == 0 && p.offset == 0);
  CHECK(p.num_threads == 0);
  CHECK(p.alibi_slopes == NULL && p.bias == NULL && p.mask == NULL && p.sinks == NULL);
  CHECK(p.cu_seqlens_q == NULL && p.cu_seqlens_k == NULL);
}

static void test_compact(void) {
  const fg_params p = fg_params_default();
  Tensor tq, tk, tv, to, tl, tg, tdq, tdk, tdv;
  int64_t st[4];
  const int64_t lse_shape[3] = {B, HQ, LQ};
  tensor4(&tq, q, B, LQ, HQ, D);
  tensor4(&tk, k, B, LK, HKV, D);
  tensor4(&tv, v, B, LK, HKV, DV);
  tensor4(&to, out, B, LQ, HQ, DV);
  tensor_init(&tl, lse, kDLFloat, 3, lse_shape, NULL);
  tensor4(&tg, dout, B, LQ, HQ, DV);
  tensor4(&tdq, dq, B, LQ, HQ, D);
  tensor4(&tdk, dk, B, LK, HKV, D);
  tensor4(&tdv, dv, B, LK, HKV, DV);

  CHECK(fg_forward(&p, &tq.t, &tk.t, &tv.t, &to.t, &tl.t) == FG_OK);
  CHECK(strcmp(fg_last_error(), "") == 0);
  CHECK(all_finite(out, NO) && all_finite(lse, NL));
  CHECK(close4("out", out, compact_strides(st, LQ, HQ, DV), ref.out, B, LQ, HQ, DV, 1e-5));
  CHECK(close4("lse", lse, compact_strides(st, B, HQ, LQ), ref.lse, 1, B, HQ, LQ, 1e-5));

  CHECK(fg_backward(&p, &tq.t, &tk.t, &tv.t, &to.t, &tl.t, &tg.t, &tdq.t, &tdk.t, &tdv.t, NULL) == FG_OK);
  CHECK(all_finite(dq, NQ) && all_finite(dk, NK) && all_finite(dv, NV));
  CHECK(close4("dq", dq, compact_strides(st, LQ, HQ, D), ref.dq, B, LQ, HQ, D, 1e-4));
  CHECK(close4("dk", dk, compact_strides(st, LK, HKV, D), ref.dk, B, LK, HKV, D, 1e-4));
  CHECK(close4("dv", dv, compact_strides(st, LK, HKV, DV), ref.dv, B, LK, HKV, DV, 1e-4));

  CHECK(fg_forward_workspace_bytes(&p, &tq.t, &tk.t, &tv.t) > 0);
  CHECK(fg_backward_workspace_bytes(&p, &tq.t, &tk.t, &tv.t) > 0);
}

/* q/k/v/out/dq/dk/dv stored [B, H, S, D] but described as [B, S, H, D] by strides. */
static void to_bhsd(float* dst, const float* src, int S, int H, int Dx) {
  int b, s, h, d;
  for (b = 0; b < B; ++b)
    for (s = 0; s < S; ++s)
      for (h = 0; h < H; ++h)
        for (d = 0; d < Dx; ++d) dst[((b * H + h) * S + s) * Dx + d] = src[((b * S + s) * H + h) * Dx + d];
}

static void bhsd(Tensor* x, float* data, int S, int H, int Dx) {
  const int64_t shape[4] = {B, S, H, Dx};
  const int64_t st[4] = {(int64_t)H * S * Dx, Dx, (int64_t)S * Dx, 1};
  tensor_init(x, data, kDLFloat, 4, shape, st);
}

static void test_bhsd_strides(void) {
  static float sq[NQ], sk[NK], sv[NV], sg[NO], so[NO], sdq[NQ], sdk[NK], sdv[NV];
  const fg_params p = fg_params_default();
  Tensor tq, tk, tv, to, tl, tg, tdq, tdk, tdv;
  const int64_t lse_shape[3] = {B, HQ, LQ};
  int64_t st[4];
  to_bhsd(sq, q, LQ, HQ, D);
  to_bhsd(sk, k, LK, HKV, D);
  to_bhsd(sv, v, LK, HKV, DV);
  to_bhsd(sg, dout, LQ, HQ, DV);
  bhsd(&tq, sq, LQ, HQ, D);
  bhsd(&tk, sk, LK, HKV, D);
  bhsd(&tv, sv, LK, HKV, DV);
  bhsd(&tg, sg, LQ, HQ, DV);
  bhsd(&to, so, LQ, HQ, DV);
  bhsd(&tdq, sdq, LQ, HQ, D);
  bhsd(&tdk, sdk, LK, HKV, D);
  bhsd(&tdv, sdv, LK, HKV, DV);
  tensor_init(&tl, lse, kDLFloat, 3, lse_shape, NULL);

  CHECK(fg_forward(&p, &tq.t, &tk.t, &tv.t, &to.t, &tl.t) == FG_OK);
  CHECK(close4("bhsd out", so, to.strides, ref.out, B, LQ, HQ, DV, 1e-5));
  CHECK(close4("bhsd lse", lse, compact_strides(st, B, HQ, LQ), ref.lse, 1, B, HQ, LQ, 1e-5));
  CHECK(fg_backward(&p, &tq.t, &tk.t, &tv.t, &to.t, &tl.t, &tg.t, &tdq.t, &tdk.t, &tdv.t, NULL) == FG_OK);
  CHECK(close4("bhsd dq", sdq, tdq.strides, ref.dq, B, LQ, HQ, D, 1e-4));
  CHECK(close4("bhsd dk", sdk, tdk.strides, ref.dk, B, LK, HKV, D, 1e-4));
  CHECK(close4("bhsd dv", sdv, tdv.strides, ref.dv, B, LK, HKV, DV, 1e-4));
}

static void test_byte_offset(void) {
  enum { PAD = 3 };
  static float qpad[PAD + NQ], opad[PAD + NO];
  const fg_params p = fg_params_default();
  Tensor tq, tk, tv, to, tl;
  const int64_t lse_shape[3] = {B, HQ, LQ};
  int64_t st[4];
  memset(qpad, 0x7F, sizeof(qpad)); /* garbage (huge values) before q */
  memcpy(qpad + PAD, q, sizeof(q));
  memset(opad, 0x5A, sizeof(opad));
  tensor4(&tq, qpad, B, LQ, HQ, D);
  tq.t.byte_offset = PAD * sizeof(float);
  tensor4(&tk, k, B, LK, HKV, D);
  tensor4(&tv, v, B, LK, HKV, DV);
  tensor4(&to, opad, B, LQ, HQ, DV);
  to.t.byte_offset = PAD * sizeof(float);
  tensor_init(&tl, lse, kDLFloat, 3, lse_shape, NULL);

  CHECK(fg_forward(&p, &tq.t, &tk.t, &tv.t, &to.t, &tl.t) == FG_OK);
  CHECK(bytes_equal(opad, 0x5A, PAD * sizeof(float)));
  CHECK(close4("offset out", opad + PAD, compact_strides(st, LQ, HQ, DV), ref.out, B, LQ, HQ, DV, 1e-5));
  CHECK(close4("offset lse", lse, compact_strides(st, B, HQ, LQ), ref.lse, 1, B, HQ, LQ, 1e-5));

  /* An offset that is not a whole element is an error. */
  to.t.byte_offset = 2;
  CHECK(fg_forward(&p, &tq.t, &tk.t, &tv.t, &to.t, &tl.t) == FG_ERR_INVALID_ARGUMENT);
  CHECK(strstr(fg_last_error(), "'out'") != NULL);
}

static void test_sinks(void) {
  fg_params p = fg_params_default();
  Tensor tq, tk, tv, to, tl, tg, tdq, tdk, tdv, ts, tds;
  const int64_t lse_shape[3] = {B, HQ, LQ}, hq[1] = {HQ};
  int64_t st[4];
  tensor4(&tq, q, B, LQ, HQ, D);
  tensor4(&tk, k, B, LK, HKV, D);
  tensor4(&tv, v, B, LK, HKV, DV);
  tensor4(&to, out, B, LQ, HQ, DV);
  tensor_init(&tl, lse, kDLFloat, 3, lse_shape, NULL);
  tensor4(&tg, dout, B, LQ, HQ, DV);
  tensor4(&tdq, dq, B, LQ, HQ, D);
  tensor4(&tdk, dk, B, LK, HKV, D);
  tensor4(&tdv, dv, B, LK, HKV, DV);
  tensor_init(&ts, sinks, kDLFloat, 1, hq, NULL);
  tensor_init(&tds, dsinks, kDLFloat, 1, hq, NULL);

  /* dsinks without sinks is an error. */
  CHECK(fg_backward(&p, &tq.t, &tk.t, &tv.t, &to.t, &tl.t, &tg.t, &tdq.t, &tdk.t, &tdv.t, &tds.t) ==
        FG_ERR_INVALID_ARGUMENT);
  CHECK(strstr(fg_last_error(), "'dsinks'") != NULL);

  p.sinks = &ts.t;
  CHECK(fg_forward(&p, &tq.t, &tk.t, &tv.t, &to.t, &tl.t) == FG_OK);
  CHECK(close4("sinks out", out, compact_strides(st, LQ, HQ, DV), ref_sinks.out, B, LQ, HQ, DV, 1e-5));
  CHECK(close4("sinks lse", lse, compact_strides(st, B, HQ, LQ), ref_sinks.lse, 1, B, HQ, LQ, 1e-5));
  CHECK(fg_backward(&p, &tq.t, &tk.t, &tv.t, &to.t, &tl.t, &tg.t, &tdq.t, &tdk.t, &tdv.t, &tds.t) == FG_OK);
  CHECK(all_finite(dsinks, HQ));
  CHECK(close4("dsinks", dsinks, compact_strides(st, 1, 1, HQ), ref_sinks.dsinks, 1, 1, 1, HQ, 1e-4));
  CHECK(close4("sinks dq", dq, compact_strides(st, LQ, HQ, D), ref_sinks.dq, B, LQ, HQ, D, 1e-4));

  /* dbias without bias is an error. */
  CHECK(fg_backward_with_bias_grad(&p, &tq.t, &tk.t, &tv.t, &to.t, &tl.t, &tg.t, &tdq.t, &tdk.t, &tdv.t, NULL,
                                   &tq.t) == FG_ERR_INVALID_ARGUMENT);
  CHECK(strstr(fg_last_error(), "'dbias'") != NULL);
}

static void test_errors(void) {
  static float k3[B * LK * 3 * D], v3[B * LK * 3 * DV];
  const fg_params p = fg_params_default();
  Tensor tq, tk, tv, to, tl, tk3, tv3, huge;
  const int64_t lse_shape[3] = {B, HQ, LQ}, huge_shape[4] = {(int64_t)1 << 40, (int64_t)1 << 40, 1, 1};
  const char* msg;
  tensor4(&tq, q, B, LQ, HQ, D);
  tensor4(&tk, k, B, LK, HKV, D);
  tensor4(&tv, v, B, LK, HKV, DV);
  tensor4(&to, out, B, LQ, HQ, DV);
  tensor_init(&tl, lse, kDLFloat, 3, lse_shape, NULL);
  tensor4(&tk3, k3, B, LK, 3, D);
  tensor4(&tv3, v3, B, LK, 3, DV);

  /* heads_kv = 3 does not divide heads_q = 4. */
  memset(out, 0x5A, sizeof(out));
  memset(lse, 0x5A, sizeof(lse));
  CHECK(fg_forward(&p, &tq.t, &tk3.t, &tv3.t, &to.t, &tl.t) == FG_ERR_INVALID_ARGUMENT);
  msg = fg_last_error();
  CHECK(msg != NULL && msg[0] != '\0');
  CHECK(strstr(msg, "flashgrad::forward") != NULL);
  CHECK(strstr(msg, "'k'") != NULL);
  CHECK(strstr(msg, "expected") != NULL && strstr(msg, "got") != NULL);
  CHECK(bytes_equal(out, 0x5A, sizeof(out)) && bytes_equal(lse, 0x5A, sizeof(lse)));
  CHECK(fg_forward_workspace_bytes(&p, &tq.t, &tk3.t, &tv3.t) == -1);
  CHECK(strstr(fg_last_error(), "'k'") != NULL);
  CHECK(fg_backward_workspace_bytes(&p, &tq.t, &tk3.t, &tv3.t) == -1);

  /* A later successful call clears the message. */
  CHECK(fg_forward(&p, &tq.t, &tk.t, &tv.t, &to.t, &tl.t) == FG_OK);
  CHECK(strcmp(fg_last_error(), "") == 0);

  /* NULL tensors and params are errors, not crashes. */
  memset(out, 0x5A, sizeof(out));
  CHECK(fg_forward(&p, NULL, &tk.t, &tv.t, &to.t, &tl.t) == FG_ERR_INVALID_ARGUMENT);
  CHECK(strstr(fg_last_error(), "'q'") != NULL);
  CHECK(fg_forward(&p, &tq.t, &tk.t, &tv.t, NULL, &tl.t) == FG_ERR_INVALID_ARGUMENT);
  CHECK(strstr(fg_last_error(), "'out'") != NULL);
  CHECK(fg_forward(NULL, &tq.t, &tk.t, &tv.t, &to.t, &tl.t) == FG_ERR_INVALID_ARGUMENT);
  CHECK(strstr(fg_last_error(), "'p'") != NULL);
  CHECK(fg_forward_workspace_bytes(&p, NULL, &tk.t, &tv.t) == -1);
  CHECK(bytes_equal(out, 0x5A, sizeof(out)));

  /* A device other than the CPU, a vector dtype, an element count past int64. */
  tq.t.device.device_type = kDLCUDA;
  CHECK(fg_forward(&p, &tq.t, &tk.t, &tv.t, &to.t, &tl.t) == FG_ERR_INVALID_ARGUMENT);
  tq.t.device.device_type = kDLCPU;
  tq.t.dtype.lanes = 2;
  CHECK(fg_forward(&p, &tq.t, &tk.t, &tv.t, &to.t, &tl.t) == FG_ERR_INVALID_ARGUMENT);
  CHECK(strstr(fg_last_error(), "'q'") != NULL);
  tq.t.dtype.lanes = 1;
  tensor_init(&huge, q, kDLFloat, 4, huge_shape, NULL);
  CHECK(fg_forward(&p, &huge.t, &tk.t, &tv.t, &to.t, &tl.t) == FG_ERR_INVALID_ARGUMENT);
  CHECK(strstr(fg_last_error(), "'q'") != NULL);
  CHECK(bytes_equal(out, 0x5A, sizeof(out)));
}

static void test_isa(void) {
  const char* isa = fg_isa();
  CHECK(isa != NULL);
  if (isa) {
    CHECK(strcmp(isa, "scalar") == 0 || strcmp(isa, "avx2") == 0 || strcmp(isa, "avx512") == 0 ||
          strcmp(isa, "avx512bf16") == 0 || strcmp(isa, "amx") == 0);
    printf("isa: %s\n", isa);
  }
}

/* A host runner that runs the tasks last to first on the caller, as thread
 * num_threads - 1: the results are the own pool's. */
static int g_runner_calls = 0;
static void serial_backwards(void* ctx, int64_t num_tasks, int num_threads, fg_task_fn task, void* task_ctx) {
  (void)ctx;
  ++g_runner_calls;
  for (int64_t t = num_tasks - 1; t >= 0; --t) task(task_ctx, t, num_threads - 1);
}

static void test_thread_runner(void) {
  Tensor tq, tk, tv, to, tl;
  float out2[NO], lse2[NL];
  int64_t st[4];
  fg_params p = fg_params_default();
  p.num_threads = 2;
  tensor4(&tq, q, B, LQ, HQ, D);
  tensor4(&tk, k, B, LK, HKV, D);
  tensor4(&tv, v, B, LK, HKV, DV);
  tensor4(&to, out2, B, LQ, HQ, DV);
  tensor_init(&tl, lse2, kDLFloat, 3, (int64_t[]){B, HQ, LQ}, NULL);
  CHECK(fg_set_thread_runner(serial_backwards, NULL, "serial") == FG_OK);
  CHECK(fg_forward(&p, &tq.t, &tk.t, &tv.t, &to.t, &tl.t) == FG_OK);
  CHECK(g_runner_calls > 0);
  const char* plan = fg_explain(&p, &tq.t, &tk.t, &tv.t, 0);
  CHECK(plan != NULL && strstr(plan, "threads on serial") != NULL);
  CHECK(fg_set_thread_runner(NULL, NULL, NULL) == FG_OK);
  CHECK(close4("out", out2, compact_strides(st, LQ, HQ, DV), ref.out, B, LQ, HQ, DV, 1e-5));
  CHECK(fg_use_openmp_runtime("/nonexistent/libgomp.so.1") == FG_ERR_INVALID_ARGUMENT);
  CHECK(strstr(fg_last_error(), "use_openmp_runtime") != NULL && strstr(fg_last_error(), "'library'") != NULL);
  CHECK(fg_use_openmp_runtime(NULL) == FG_OK);
}

int main(void) {
  fill(q, NQ);
  fill(k, NK);
  fill(v, NV);
  fill(dout, NO);
  fill(sinks, HQ);
  naive(q, k, v, NULL, dout, &ref);
  naive(q, k, v, sinks, dout, &ref_sinks);

  test_params_default();
  test_compact();
  test_bhsd_strides();
  test_byte_offset();
  test_sinks();
  test_errors();
  test_isa();
  test_thread_runner();

  if (g_failures) {
    fprintf(stderr, "test_c_abi: %d check(s) failed\n", g_failures);
    return 1;
  }
  printf("test_c_abi: all checks passed\n");
  return 0;
}
