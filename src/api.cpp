// The C++ API: validate, plan, allocate the workspace, run the kernels.
// This layer is the only one that throws.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "check.hpp"
#include "dispatch.hpp"
#include "flashgrad/flashgrad.hpp"
#include "parallel.hpp"
#include "tiling.hpp"
#include "workspace.hpp"

namespace flashgrad {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
  }
  return "?";
}

int64_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::bf16:
    case DType::f16: return 2;
    case DType::u8: return 1;
  }
  return 1;
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int>(shape.size());
  if (t.ndim > 4) throw Error("flashgrad::TensorView::contiguous: argument 'shape': expected at most 4 dimensions, got " + std::to_string(t.ndim));
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t st = 1;
  for (i = t.ndim - 1; i >= 0; --i) {
    t.strides[i] = st;
    st *= t.shape[i];
  }
  return t;
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> strides) {
  if (shape.size() != strides.size() || shape.size() > 4)
    throw Error("flashgrad::TensorView::strided: argument 'strides': expected one stride per dimension (at most 4), got " +
                std::to_string(strides.size()) + " strides for " + std::to_string(shape.size()) + " dimensions");
  TensorView t = contiguous(data, dtype, shape);
  int i = 0;
  for (int64_t s : strides) t.strides[i++] = s;
  return t;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

namespace {

// Threads: never more than there are independent tasks of the larger pass.
// FLASHGRAD_SPIN_US is checked here, at the boundary, before the pool reads it.
void resolve(AttnParams& p) {
  spin_microseconds();
  p.num_threads = resolve_threads(p.num_threads);
}

}  // namespace

void forward(const Options& opts, const TensorView& q, const TensorView& k, const TensorView& v,
             const TensorView& out, const TensorView& lse) {
  CallTensors t{&q, &k, &v, &out, &lse};
  AttnParams p = make_params("forward", CallKind::forward, opts, t);
  resolve(p);
  const KernelTable& kt = kernels();
  const TilePlan plan = plan_forward(p, pair_engine(kt.isa, p));
  Workspace ws("forward", plan.total_bytes());
  kt.forward(p, plan, ws.data());
}

void backward(const Options& opts, const TensorView& q, const TensorView& k, const TensorView& v,
              const TensorView& out, const TensorView& lse, const TensorView& dout,
              const Grads& grads) {
  CallTensors t{&q, &k, &v, &out, &lse, &dout, &grads};
  AttnParams p = make_params("backward", CallKind::backward, opts, t);
  resolve(p);
  const KernelTable& kt = kernels();
  const TilePlan plan = plan_backward(p, pair_engine(kt.isa, p));
  Workspace ws("backward", plan.total_bytes());
  if (p.dbias.data) zero_strided(*grads.dbias);
  kt.backward(p, plan, ws.data());
}

int64_t forward_workspace_bytes(const Options& opts, const TensorView& q, const TensorView& k,
                                const TensorView& v) {
  CallTensors t{&q, &k, &v};
  AttnParams p = make_params("forward_workspace_bytes", CallKind::workspace, opts, t);
  resolve(p);
  return plan_forward(p, pair_engine(kernels().isa, p)).total_bytes();
}

int64_t backward_workspace_bytes(const Options& opts, const TensorView& q, const TensorView& k,
                                 const TensorView& v) {
  CallTensors t{&q, &k, &v};
  AttnParams p = make_params("backward_workspace_bytes", CallKind::workspace, opts, t);
  resolve(p);
  return plan_backward(p, pair_engine(kernels().isa, p)).total_bytes();
}

void dropout_keep_mask(const Options& opts, int64_t batch, int64_t heads_q, int64_t seqlen_q,
                       int64_t seqlen_k, const TensorView& keep) {
  const std::string fn = "flashgrad::dropout_keep_mask: argument ";
  if (batch < 0 || heads_q < 1 || seqlen_q < 0 || seqlen_k < 0)
    throw Error(fn + "'batch/heads_q/seqlen_q/seqlen_k': expected batch >= 0, heads_q >= 1, seqlens >= 0, got " +
                std::to_string(batch) + ", " + std::to_string(heads_q) + ", " + std::to_string(seqlen_q) + ", " +
                std::to_string(seqlen_k));
  if (keep.dtype != DType::u8 || keep.ndim != 4 || keep.shape[0] != batch || keep.shape[1] != heads_q ||
      keep.shape[2] != seqlen_q || keep.shape[3] != seqlen_k || !keep.data ||
      keep.strides[3] != 1 || keep.strides[2] != seqlen_k || keep.strides[1] != seqlen_q * seqlen_k ||
      keep.strides[0] != heads_q * seqlen_q * seqlen_k)
    throw Error(fn + "'keep': expected a contiguous u8 tensor [" + std::to_string(batch) + ", " +
                std::to_string(heads_q) + ", " + std::to_string(seqlen_q) + ", " + std::to_string(seqlen_k) +
                "], got dtype " + dtype_name(keep.dtype) + " with " + std::to_string(keep.ndim) + " dims");
  if (!(opts.dropout_p >= 0 && opts.dropout_p < 1))
    throw Error(fn + "'dropout_p': expected a value in [0, 1), got " + std::to_string(opts.dropout_p));
  AttnParams p;
  p.batch = batch;
  p.heads_q = heads_q;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.dropout_p = opts.dropout_p;
  p.seed = opts.seed;
  p.offset = opts.offset;
  if (opts.block) {  // only the offsets matter to the bits
    p.in_block = true;
    p.block_q_offset = opts.block->q_offset;
    p.block_k_offset = opts.block->k_offset;
  }
  kernels_for(Isa::scalar).dropout_mask(p, static_cast<uint8_t*>(keep.data));
}

const char* version() { return FLASHGRAD_VERSION; }

const char* isa_name() { return kernels().name; }

int max_threads() { return resolve_threads(0); }

}  // namespace flashgrad
