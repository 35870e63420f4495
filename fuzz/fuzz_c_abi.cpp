// The harness both fuzz drivers call: decode a draw, run it through the C
// ABI, check it (see fuzz_c_abi.hpp).
#include "fuzz_c_abi.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <vector>

#include "c_abi_check.hpp"
#include "harness.hpp"

namespace flashgrad::fuzz {
namespace {

using namespace flashgrad::testing;

class Reader {
 public:
  Reader(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  uint8_t byte() { return i_ < n_ ? d_[i_++] : 0; }
  template <typename T>
  T pick(std::initializer_list<T> xs) { return *(xs.begin() + byte() % xs.size()); }
  bool coin(int percent) { return byte() % 100 < percent; }

 private:
  const uint8_t* d_;
  size_t n_, i_ = 0;
};

// Work of one reference pass, to keep a draw under a few ms without sanitizers.
double work(const Case& c) {
  return double(c.batch) * c.heads_q * c.seqlen_q * c.seqlen_k * double(c.head_dim + c.head_dim_v);
}

Case decode_case(Reader& r) {
  Case c;
  c.name = "fuzz";
  c.dtype = r.pick({DType::f32, DType::f64, DType::bf16, DType::f16});
  c.layout = r.pick({Layout::bshd, Layout::bhsd, Layout::padded});
  c.batch = r.pick<int64_t>({1, 2, 3});
  c.seqlen_q = r.pick<int64_t>({0, 1, 2, 7, 16, 17, 31, 33, 64, 65, 80});
  c.seqlen_k = r.pick<int64_t>({0, 1, 3, 8, 31, 63, 64, 65, 96, 129});
  c.heads_kv = r.pick<int64_t>({1, 2});
  c.heads_q = c.heads_kv * r.pick<int64_t>({1, 2, 3, 4});
  c.head_dim = r.pick<int64_t>({1, 3, 8, 16, 24, 40, 64, 72, 128});
  c.head_dim_v = r.coin(60) ? c.head_dim : r.pick<int64_t>({1, 8, 24, 64});
  c.causal = r.coin(35);
  if (r.coin(25)) {
    c.window_left = r.pick<int64_t>({-1, 0, 1, 3, 17, 64});
    c.window_right = r.pick<int64_t>({-1, 0, 2, 5});
  }
  if (r.coin(20)) {
    c.softcap = r.pick({0.5, 3.0, 30.0});
    c.input_scale = r.pick({1.0, 2.0, 4.0});
  }
  if (r.coin(15)) c.softmax_scale = r.pick({0.05, 0.5, 1.0});
  c.alibi = r.coin(15);
  if (r.coin(30)) {
    c.bias = r.pick({BiasKind::full, BiasKind::bcast_batch, BiasKind::bcast_heads, BiasKind::key_row});
    c.bias_dtype = r.pick({DType::f32, DType::bf16, DType::f16});
    c.dbias = c.bias != BiasKind::key_row && r.coin(50);  // dbias needs a bias over [seqlen_q, seqlen_k]
  }
  if (r.coin(30)) c.mask = r.pick({MaskKind::full, MaskKind::bcast_batch, MaskKind::key_padding});
  c.sinks = r.coin(20);
  if (r.coin(15)) c.dropout_p = r.pick({0.1, 0.5});
  c.num_threads = r.pick({0, 1, 2, 3});
  if (r.coin(20)) {
    for (int64_t b = 0; b < c.batch; ++b) {
      c.seqlens_q.push_back(r.pick({0, 1, 5, 16, 33, 64}));
      c.seqlens_k.push_back(r.pick({0, 1, 7, 31, 64, 70}));
    }
  }
  c.seed = r.byte() | (uint64_t{r.byte()} << 8);
  // Keep the four reference passes cheap: fewer batches, then fewer heads.
  while (!c.varlen() && work(c) > 1.5e6 && c.batch > 1) --c.batch;
  while (work(c) > 1.5e6 && c.heads_q > c.heads_kv) c.heads_q -= c.heads_kv;
  return c;
}

enum class Corruption {
  null_tensor, null_data, bad_device, bad_ndim, bad_dtype_code, wrong_dtype, shape_mismatch,
  negative_shape, misaligned_offset, huge_stride, output_overlaps, output_self_overlap,
  bad_scalar, bad_cu_seqlens, one_cu_seqlens, grad_without_input, heads_not_dividing,
  head_dim_range, out_of_memory, null_params, count
};

const char* corruption_name(Corruption k) {
  static const char* names[] = {
      "null_tensor", "null_data", "bad_device", "bad_ndim", "bad_dtype_code", "wrong_dtype", "shape_mismatch",
      "negative_shape", "misaligned_offset", "huge_stride", "output_overlaps", "output_self_overlap",
      "bad_scalar", "bad_cu_seqlens", "one_cu_seqlens", "grad_without_input", "heads_not_dividing",
      "head_dim_range", "out_of_memory", "null_params"};
  return names[static_cast<int>(k)];
}

// One tensor argument of a call: its DLTensor and the slot the call reads it from.
struct Arg {
  const char* name;
  DL* dl;
  DLTensor** slot;     ///< required arguments; null for optional ones
  const DLTensor** opt;  ///< optional arguments (in fg_params)
  bool output;
  DType want;          ///< the dtype the call requires
};

struct Call {
  Problem p;
  AbiOutputs o;
  fg_params prm{};
  const fg_params* prm_ptr = &prm;
  DL q, k, v, out, lse, dout, dq, dk, dv, dsinks, dbias, alibi, bias, mask, sinks, cuq, cuk;
  DLTensor *qp, *kp, *vp, *outp, *lsep, *doutp, *dqp, *dkp, *dvp, *dsinksp = nullptr, *dbiasp = nullptr;
  std::vector<int32_t> cu_copy_q, cu_copy_k;  // substitutes a corruption may edit
  Guarded extra_grad;                        // a gradient passed without its input
  bool use_bias_api = true;

  explicit Call(const Case& c, Reader& r) : p(make_problem(c)) {
    o.make(make_outputs(p, false));
    auto in = [&](DL& d, const Buffer& b) {
      if (b.present()) d.set(b.view, r.coin(50), 0);
    };
    auto outv = [&](DL& d, const Guarded& g) {
      if (g.present()) d.set(g.buf.view, r.coin(50), dtype_size(g.buf.view.dtype) * r.pick<uint64_t>({0, 0, 1, 3}));
    };
    in(q, p.q); in(k, p.k); in(v, p.v); in(dout, p.dout);
    in(alibi, p.alibi); in(bias, p.bias); in(mask, p.mask); in(sinks, p.sinks); in(cuq, p.cu_q); in(cuk, p.cu_k);
    if (p.mask.present() && r.coin(30)) mask.t.dtype = {6, 8, 1};  // kDLBool
    outv(out, o.out); outv(lse, o.lse); outv(dq, o.dq); outv(dk, o.dk); outv(dv, o.dv);
    outv(dsinks, o.dsinks); outv(dbias, o.dbias);
    qp = &q.t; kp = &k.t; vp = &v.t; outp = &out.t; lsep = &lse.t; doutp = &dout.t;
    dqp = &dq.t; dkp = &dk.t; dvp = &dv.t;
    if (o.dsinks.present()) dsinksp = &dsinks.t;
    if (o.dbias.present()) dbiasp = &dbias.t;
    use_bias_api = dbiasp || r.coin(50);

    prm = fg_params_default();
    const Options& op = p.opts;
    prm.softmax_scale = op.softmax_scale != 0 ? op.softmax_scale : (r.coin(50) ? prm.softmax_scale : 0.0);
    prm.causal = op.causal;
    prm.window_left = op.window_left;
    prm.window_right = op.window_right;
    prm.softcap = op.softcap;
    prm.alibi_slopes = p.alibi.present() ? &alibi.t : nullptr;
    prm.bias = p.bias.present() ? &bias.t : nullptr;
    prm.mask = p.mask.present() ? &mask.t : nullptr;
    prm.sinks = p.sinks.present() ? &sinks.t : nullptr;
    prm.cu_seqlens_q = p.cu_q.present() ? &cuq.t : nullptr;
    prm.cu_seqlens_k = p.cu_k.present() ? &cuk.t : nullptr;
    prm.dropout_p = op.dropout_p;
    prm.seed = op.seed;
    prm.offset = op.offset;
    prm.num_threads = op.num_threads;
  }
  Call(const Call&) = delete;

  fg_status forward() { return fg_forward(prm_ptr, qp, kp, vp, outp, lsep); }
  fg_status backward() {
    if (!use_bias_api) return fg_backward(prm_ptr, qp, kp, vp, outp, lsep, doutp, dqp, dkp, dvp, dsinksp);
    return fg_backward_with_bias_grad(prm_ptr, qp, kp, vp, outp, lsep, doutp, dqp, dkp, dvp, dsinksp, dbiasp);
  }

  std::vector<Arg> args(bool bwd) {
    const DType st = p.c.dtype, acc = st == DType::f64 ? DType::f64 : DType::f32;
    std::vector<Arg> a = {{"q", &q, &qp, nullptr, false, st}, {"k", &k, &kp, nullptr, false, st},
                          {"v", &v, &vp, nullptr, false, st}, {"out", &out, &outp, nullptr, !bwd, st},
                          {"lse", &lse, &lsep, nullptr, !bwd, acc}};
    if (bwd) {
      a.push_back({"dout", &dout, &doutp, nullptr, false, st});
      a.push_back({"dq", &dq, &dqp, nullptr, true, st});
      a.push_back({"dk", &dk, &dkp, nullptr, true, st});
      a.push_back({"dv", &dv, &dvp, nullptr, true, st});
      if (dsinksp) a.push_back({"dsinks", &dsinks, nullptr, nullptr, true, acc});
      if (dbiasp && use_bias_api) a.push_back({"dbias", &dbias, nullptr, nullptr, true, acc});
    }
    if (prm.alibi_slopes) a.push_back({"alibi_slopes", &alibi, nullptr, &prm.alibi_slopes, false, DType::f32});
    if (prm.bias) a.push_back({"bias", &bias, nullptr, &prm.bias, false, p.c.bias_dtype});
    if (prm.mask) a.push_back({"mask", &mask, nullptr, &prm.mask, false, DType::u8});
    if (prm.sinks) a.push_back({"sinks", &sinks, nullptr, &prm.sinks, false, DType::f32});
    if (prm.cu_seqlens_q) a.push_back({"cu_seqlens_q", &cuq, nullptr, &prm.cu_seqlens_q, false, DType::i32});
    if (prm.cu_seqlens_k) a.push_back({"cu_seqlens_k", &cuk, nullptr, &prm.cu_seqlens_k, false, DType::i32});
    return a;
  }

  std::vector<const std::vector<unsigned char>*> watched() const {
    return {&o.out.bytes, &o.lse.bytes, &o.dq.bytes, &o.dk.bytes, &o.dv.bytes, &o.dsinks.bytes,
            &o.dbias.bytes, &extra_grad.bytes, &p.q.bytes, &p.k.bytes, &p.v.bytes, &p.dout.bytes};
  }
};

// Applies a corruption that makes the call invalid; returns its name. Kinds
// that do not apply to this draw fall back to a null q.
std::string corrupt(Call& call, bool bwd, Corruption kind, Reader& r, bool& expect_oom) {
  std::vector<Arg> args = call.args(bwd);
  auto choose = [&](auto pred) -> Arg* {
    std::vector<Arg*> ok;
    for (Arg& a : args)
      if (pred(a)) ok.push_back(&a);
    return ok.empty() ? nullptr : ok[r.byte() % ok.size()];
  };
  auto fallback = [&] {
    call.qp = nullptr;
    return std::string("null_tensor(q, fallback from ") + corruption_name(kind) + ")";
  };
  auto named = [&](const Arg& a) { return std::string(corruption_name(kind)) + "(" + a.name + ")"; };
  auto ensure_strides = [](DL& d) { d.t.strides = d.strides; };
  const bool varlen = call.p.c.varlen();
  const int o = varlen ? 0 : 1;  // seqlen dim of q/k/v
  switch (kind) {
    case Corruption::null_tensor: {
      Arg* a = choose([](const Arg& x) { return x.slot || std::strncmp(x.name, "cu_", 3) == 0; });
      if (a->slot) *a->slot = nullptr; else *a->opt = nullptr;
      return named(*a);
    }
    case Corruption::null_data: {
      Arg* a = choose([](const Arg& x) { return x.dl->numel() > 0; });
      if (!a) return fallback();
      a->dl->t.data = nullptr;
      a->dl->t.byte_offset = 0;
      return named(*a);
    }
    case Corruption::bad_device: {
      Arg* a = choose([](const Arg&) { return true; });
      a->dl->t.device.device_type = r.pick({kDLCUDA, kDLCUDAHost, kDLOpenCL, kDLVulkan});
      return named(*a);
    }
    case Corruption::bad_ndim: {
      Arg* a = choose([](const Arg&) { return true; });
      a->dl->t.ndim = r.pick({0, 5, -1, 64});
      return named(*a);
    }
    case Corruption::bad_dtype_code: {
      Arg* a = choose([](const Arg&) { return true; });
      a->dl->t.dtype = r.pick<DLDataType>({{kDLInt, 16, 1}, {kDLFloat, 8, 1}, {kDLFloat, 32, 2},
                                           {kDLComplex, 64, 1}, {kDLUInt, 32, 1}, {kDLBfloat, 32, 1}});
      return named(*a);
    }
    case Corruption::wrong_dtype: {
      Arg* a = choose([](const Arg&) { return true; });
      DType t = DType::f16;  // never valid for lse, dsinks, dbias, alibi or sinks
      if (a->want == DType::u8) t = DType::f32;
      if (a->want == DType::i32) t = DType::f32;
      if (std::string(a->name) == "bias") t = DType::i32;
      if (a->slot && a->want == call.p.c.dtype && std::string(a->name) != "lse") {
        // out and dq may be f32 for bf16 / f16 storage (then a valid call whose
        // buffer is too small, the caller's error), so f32 is no corruption there.
        const bool half = a->want == DType::bf16 || a->want == DType::f16;
        const bool f32_ok = half && (std::string(a->name) == "out" || std::string(a->name) == "dq");
        std::vector<DType> wrong;
        for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16})
          if (d != a->want && !(f32_ok && d == DType::f32)) wrong.push_back(d);
        t = wrong[r.byte() % wrong.size()];
      }
      a->dl->t.dtype = testing::dl_dtype(t);
      a->dl->t.byte_offset = 0;  // keep only the dtype wrong
      return named(*a);
    }
    case Corruption::shape_mismatch: {
      // +2 on the last dim: never equal to the old size nor a broadcast 1.
      // cu_seqlens shrink instead (growing them would make the library read
      // past the caller's buffer, the caller's error, not the library's).
      Arg* a = choose([](const Arg&) { return true; });
      if (std::strncmp(a->name, "cu_", 3) == 0) a->dl->shape[0] -= 1;
      else a->dl->shape[a->dl->t.ndim - 1] += 2;
      ensure_strides(*a->dl);
      return named(*a);
    }
    case Corruption::negative_shape: {
      Arg* a = choose([](const Arg&) { return true; });
      a->dl->shape[r.byte() % a->dl->t.ndim] = r.pick<int64_t>({-1, std::numeric_limits<int64_t>::min()});
      ensure_strides(*a->dl);
      return named(*a);
    }
    case Corruption::misaligned_offset: {
      Arg* a = choose([](const Arg& x) { return x.dl->t.dtype.bits > 8; });
      if (!a) return fallback();
      a->dl->t.byte_offset += 1;
      a->dl->t.data = static_cast<char*>(a->dl->t.data) - 1;
      return named(*a);
    }
    case Corruption::huge_stride: {
      Arg* a = choose([](const Arg& x) {  // an empty tensor may have any strides
        for (int i = 0; i < x.dl->t.ndim; ++i)
          if (x.dl->shape[i] >= 2) return x.dl->t.dtype.bits > 8 && x.dl->numel() > 0;
        return false;
      });
      if (!a) return fallback();
      ensure_strides(*a->dl);
      for (int i = 0; i < a->dl->t.ndim; ++i)
        if (a->dl->shape[i] >= 2) {
          a->dl->strides[i] = r.pick<int64_t>({std::numeric_limits<int64_t>::max() / 2,
                                               std::numeric_limits<int64_t>::min() / 2 + 1});
          break;
        }
      return named(*a);
    }
    case Corruption::output_overlaps: {
      Arg* a = choose([](const Arg& x) { return x.output && x.dl->numel() > 0; });
      Arg* b = choose([&](const Arg& x) { return &x != a && x.dl->numel() > 0 && x.slot; });
      if (!a || !b) return fallback();
      a->dl->t.data = static_cast<char*>(b->dl->t.data) + b->dl->t.byte_offset;
      a->dl->t.byte_offset = 0;
      return named(*a) + "->" + b->name;
    }
    case Corruption::output_self_overlap: {
      Arg* a = choose([](const Arg& x) {
        for (int i = 0; i < x.dl->t.ndim; ++i)
          if (x.output && x.dl->shape[i] >= 2) return x.dl->numel() > 0;
        return false;
      });
      if (!a) return fallback();
      ensure_strides(*a->dl);
      for (int i = a->dl->t.ndim - 1; i >= 0; --i)
        if (a->dl->shape[i] >= 2) { a->dl->strides[i] = 0; break; }
      return named(*a);
    }
    case Corruption::bad_scalar: {
      const double nan = std::nan(""), inf = INFINITY;
      switch (r.byte() % 10) {
        case 0: call.prm.window_left = r.pick<int64_t>({-2, std::numeric_limits<int64_t>::min()}); return "bad_scalar(window_left)";
        case 1: call.prm.window_right = -3; return "bad_scalar(window_right)";
        case 2: call.prm.dropout_p = r.pick({1.0, -0.25, nan, inf}); return "bad_scalar(dropout_p)";
        case 3: call.prm.softcap = r.pick({-1.0, inf, nan}); return "bad_scalar(softcap)";
        case 4: call.prm.softmax_scale = r.pick({inf, -inf}); return "bad_scalar(softmax_scale)";
        default: call.prm.num_threads = r.pick({-1, std::numeric_limits<int>::min()}); return "bad_scalar(num_threads)";
      }
    }
    case Corruption::bad_cu_seqlens: {
      if (!varlen) {  // offsets with 4-d q/k/v
        call.cu_copy_q.assign(static_cast<size_t>(call.p.c.batch + 1), 0);
        call.cu_copy_k = call.cu_copy_q;
        const TensorView cq = TensorView::contiguous(call.cu_copy_q.data(), DType::i32, {call.p.c.batch + 1});
        const TensorView ck = TensorView::contiguous(call.cu_copy_k.data(), DType::i32, {call.p.c.batch + 1});
        call.cuq.set(cq, false, 0);
        call.cuk.set(ck, false, 0);
        call.prm.cu_seqlens_q = &call.cuq.t;
        call.prm.cu_seqlens_k = &call.cuk.t;
        return "bad_cu_seqlens(with 4-d q)";
      }
      const bool on_q = r.coin(50);
      const Buffer& src = on_q ? call.p.cu_q : call.p.cu_k;
      std::vector<int32_t>& cu = on_q ? call.cu_copy_q : call.cu_copy_k;
      const auto* d = static_cast<const int32_t*>(src.view.data);
      cu.assign(d, d + src.view.shape[0]);
      const int64_t total = on_q ? call.p.q.view.shape[0] : call.p.k.view.shape[0];
      const size_t n = cu.size();
      std::string what;
      switch (r.byte() % 3) {
        case 0: cu[0] = -1; what = "negative first"; break;
        case 1: cu[n - 1] = static_cast<int32_t>(total + 1); what = "past the packed length"; break;
        default:
          if (n >= 3) { cu[1] = cu[2] + 1; what = "decreasing"; }
          else { cu[n - 1] = static_cast<int32_t>(total + 5); what = "past the packed length"; }
      }
      DL& dl = on_q ? call.cuq : call.cuk;
      dl.t.data = cu.data();
      dl.t.byte_offset = 0;
      return std::string("bad_cu_seqlens(") + (on_q ? "q, " : "k, ") + what + ")";
    }
    case Corruption::one_cu_seqlens: {
      if (!varlen) {
        call.cu_copy_q.assign(static_cast<size_t>(call.p.c.batch + 1), 0);
        call.cuq.set(TensorView::contiguous(call.cu_copy_q.data(), DType::i32, {call.p.c.batch + 1}), false, 0);
        call.prm.cu_seqlens_q = &call.cuq.t;
        return "one_cu_seqlens(only q, 4-d q)";
      }
      if (r.coin(50)) call.prm.cu_seqlens_q = nullptr; else call.prm.cu_seqlens_k = nullptr;
      return "one_cu_seqlens";
    }
    case Corruption::grad_without_input: {
      if (!bwd) return fallback();
      const int64_t H = call.p.c.heads_q;
      if (!call.prm.sinks) {
        Buffer like;
        like.bytes.assign(static_cast<size_t>(H) * 4, 0);
        like.view = TensorView::contiguous(like.bytes.data(), DType::f32, {H});
        call.extra_grad.make(like);
        call.dsinks.set(call.extra_grad.buf.view, false, 0);
        call.dsinksp = &call.dsinks.t;
        return "grad_without_input(dsinks)";
      }
      if (!call.prm.bias) {
        const Case& c = call.p.c;
        Buffer like;
        like.bytes.assign(static_cast<size_t>(c.batch * H * c.seqlen_q * c.seqlen_k + 1) * 4, 0);
        like.view = TensorView::contiguous(like.bytes.data(), DType::f32, {c.batch, H, c.seqlen_q, c.seqlen_k});
        call.extra_grad.make(like);
        call.dbias.set(call.extra_grad.buf.view, false, 0);
        call.dbiasp = &call.dbias.t;
        call.use_bias_api = true;
        return "grad_without_input(dbias)";
      }
      return fallback();
    }
    case Corruption::heads_not_dividing: {
      const int64_t h = call.p.c.heads_q + 1;  // > heads_q, so never a divisor
      call.k.shape[o + 1] = h;
      call.v.shape[o + 1] = h;
      ensure_strides(call.k);
      ensure_strides(call.v);
      return "heads_not_dividing";
    }
    case Corruption::head_dim_range: {
      const int64_t d = r.pick<int64_t>({0, 513, int64_t{1} << 40});
      call.q.shape[o + 2] = d;
      call.k.shape[o + 2] = d;
      ensure_strides(call.q);
      ensure_strides(call.k);
      return "head_dim_range(" + std::to_string(d) + ")";
    }
    case Corruption::out_of_memory: {
      const int64_t need = bwd ? fg_backward_workspace_bytes(&call.prm, call.qp, call.kp, call.vp)
                               : fg_forward_workspace_bytes(&call.prm, call.qp, call.kp, call.vp);
      if (need <= 1) return fallback();
      expect_oom = true;
      return "out_of_memory(limit 1 byte, need " + std::to_string(need) + ")";
    }
    case Corruption::null_params:
      call.prm_ptr = nullptr;
      return "null_params";
    case Corruption::count: break;
  }
  return fallback();
}

std::string check_valid(Call& call) {
  const fg_status fs = call.forward();
  if (fs != FG_OK) return "forward returned " + std::to_string(fs) + ": " + fg_last_error();
  if (*fg_last_error()) return "forward returned FG_OK but fg_last_error() is \"" + std::string(fg_last_error()) + "\"";
  for (auto [name, g] : {std::pair{"out", &call.o.out}, std::pair{"lse", &call.o.lse}}) {
    const std::string e = g->check_canaries(name);
    if (!e.empty()) return "forward: " + e;
  }
  const auto out_bytes = call.o.out.bytes, lse_bytes = call.o.lse.bytes;
  const auto inputs = std::vector<std::vector<unsigned char>>{call.p.q.bytes, call.p.k.bytes, call.p.v.bytes,
                                                              call.p.dout.bytes};
  const fg_status bs = call.backward();
  if (bs != FG_OK) return "backward returned " + std::to_string(bs) + ": " + fg_last_error();
  if (call.o.out.bytes != out_bytes || call.o.lse.bytes != lse_bytes) return "backward wrote into out or lse";
  if (inputs != std::vector<std::vector<unsigned char>>{call.p.q.bytes, call.p.k.bytes, call.p.v.bytes,
                                                        call.p.dout.bytes})
    return "an input (q, k, v or dout) changed";
  for (auto [name, g] : {std::pair{"dq", &call.o.dq}, std::pair{"dk", &call.o.dk}, std::pair{"dv", &call.o.dv},
                         std::pair{"dsinks", &call.o.dsinks}, std::pair{"dbias", &call.o.dbias}}) {
    const std::string e = g->check_canaries(name);
    if (!e.empty()) return "backward: " + e;
  }
  if (fg_forward_workspace_bytes(&call.prm, call.qp, call.kp, call.vp) < 0 ||
      fg_backward_workspace_bytes(&call.prm, call.qp, call.kp, call.vp) < 0)
    return std::string("workspace_bytes returned -1: ") + fg_last_error();
  const Report rep = testing::compare_with_reference(call.p, call.o.views(), true);
  if (rep.pass()) return "";
  return "tolerance rule failed:\n" + rep.table();
}

std::string check_invalid(Call& call, Reader& r, std::string& kind_name) {
  const bool bwd = r.coin(50);
  if (bwd) {  // backward needs a real out and lse
    const fg_status fs = call.forward();
    if (fs != FG_OK) return "setup forward returned " + std::to_string(fs) + ": " + fg_last_error();
  }
  const auto kind = static_cast<Corruption>(r.byte() % static_cast<int>(Corruption::count));
  bool expect_oom = false;
  kind_name = std::string(bwd ? "backward:" : "forward:") + corrupt(call, bwd, kind, r, expect_oom);
  std::vector<std::vector<unsigned char>> before;
  for (const auto* b : call.watched()) before.push_back(*b);
  if (expect_oom) setenv("FLASHGRAD_WORKSPACE_LIMIT", "1", 1);
  const fg_status s = bwd ? call.backward() : call.forward();
  if (expect_oom) unsetenv("FLASHGRAD_WORKSPACE_LIMIT");
  const std::string msg = fg_last_error();
  const fg_status want = expect_oom ? FG_ERR_OUT_OF_MEMORY : FG_ERR_INVALID_ARGUMENT;
  if (s != want)
    return "expected status " + std::to_string(want) + ", got " + std::to_string(s) + " (message \"" + msg + "\")";
  if (msg.empty()) return "error status with an empty fg_last_error()";
  if (msg.rfind("flashgrad", 0) != 0 || msg.find("expected") == std::string::npos ||
      msg.find("got") == std::string::npos)
    return "message does not name flashgrad, expected and got: \"" + msg + "\"";
  const auto watched = call.watched();
  for (size_t i = 0; i < watched.size(); ++i)
    if (*watched[i] != before[i]) return "a rejected call changed buffer " + std::to_string(i) + " (" + msg + ")";
  return "";
}

}  // namespace

Outcome run_one(const uint8_t* data, size_t size) {
  Outcome res;
  try {
    Reader r(data, size);
    const Case c = decode_case(r);
    res.describe = c.describe();
    res.valid = r.byte() % 4 != 0;
    Call call(c, r);
    std::string failure;
    if (res.valid) {
      res.kind = "valid";
      failure = check_valid(call);
    } else {
      failure = check_invalid(call, r, res.kind);
    }
    res.ok = failure.empty();
    res.failure = failure;
  } catch (const std::exception& e) {
    res.ok = false;
    res.failure = std::string("exception escaped: ") + e.what();
  }
  return res;
}

}  // namespace flashgrad::fuzz
