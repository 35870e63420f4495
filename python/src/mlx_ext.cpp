// flashgrad._mlx_ext: flashgrad's attention as an MLX primitive (CPU streams).
//
// attention(q, k, v, ...) builds a FlashAttention node with two outputs:
//   out [B, N_q, T_q, Dv] in q's dtype, lse f32 [B, N_q, T_q]
// from q [B, N_q, T_q, D], k [B, N_kv, T_kv, D], v [B, N_kv, T_kv, Dv] and the
// optional bias [B|1, N_q|1, T_q, T_kv] (additive, float), mask (bool, same
// shape, true = attend), sinks f32 [N_q] and alibi f32 [N_q]. eval_cpu hands the
// arrays to flashgrad::forward as strided views (MLX's [B, N, T, D] strides
// permuted to the library's [B, T, N, D]; broadcast dims keep stride 0), on the
// stream's command encoder. vjp builds a FlashAttentionVJP node, whose eval_cpu
// runs flashgrad::backward from (q, k, v, out, lse, dout): the forward is never
// recomputed. The arguments are checked when the graph is built
// (std::invalid_argument, ValueError in Python) and again by the library in
// eval_cpu before anything is dispatched (its flashgrad::Error, RuntimeError).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashgrad/flashgrad.hpp"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;
namespace nb = nanobind;
using flashgrad::DType;
using flashgrad::TensorView;

namespace {

// The static part of a call; which optional inputs follow q, k, v (in this order).
struct Params {
  double scale = 0.0;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  double softcap = 0.0;
  bool bias = false, mask = false, sinks = false, alibi = false;
  int num_threads = 0;

  bool operator==(const Params& o) const {
    return scale == o.scale && causal == o.causal && window_left == o.window_left &&
           window_right == o.window_right && softcap == o.softcap && bias == o.bias && mask == o.mask &&
           sinks == o.sinks && alibi == o.alibi && num_threads == o.num_threads;
  }
  int count() const { return 3 + bias + mask + sinks + alibi; }
};

[[noreturn]] void fail(const std::string& arg, const std::string& expected, const std::string& got) {
  throw std::invalid_argument("flashgrad.mlx.scaled_dot_product_attention: argument '" + arg + "': expected " +
                              expected + ", got " + got);
}

std::string shape_str(const mx::array& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.shape().size(); ++i) s += (i ? ", " : "") + std::to_string(a.shape()[i]);
  return s + (a.ndim() == 1 ? ",)" : ")");
}

std::string dtype_str(mx::Dtype t) {
  std::ostringstream os;
  os << t;
  return "dtype " + os.str();
}

DType to_dtype(mx::Dtype t) {
  if (t == mx::float32) return DType::f32;
  if (t == mx::bfloat16) return DType::bf16;
  if (t == mx::float16) return DType::f16;
  if (t == mx::bool_ || t == mx::uint8) return DType::u8;
  throw std::invalid_argument("flashgrad.mlx: expected dtype float32, bfloat16, float16 or bool, got " +
                              dtype_str(t));
}

// A [B, N, T, D] MLX array as the library's [B, T, N, D] view (no copy).
TensorView bthd(const mx::array& a) {
  const auto& s = a.strides();
  return TensorView::strided(const_cast<void*>(a.data<void>()), to_dtype(a.dtype()),
                             {a.shape(0), a.shape(2), a.shape(1), a.shape(3)}, {s[0], s[2], s[1], s[3]});
}

// An array in its own layout (bias, mask, lse, sinks, alibi).
TensorView same(const mx::array& a) {
  void* p = const_cast<void*>(a.data<void>());
  const auto& s = a.strides();
  const DType t = to_dtype(a.dtype());
  if (a.ndim() == 1) return TensorView::strided(p, t, {a.shape(0)}, {s[0]});
  if (a.ndim() == 3) return TensorView::strided(p, t, {a.shape(0), a.shape(1), a.shape(2)}, {s[0], s[1], s[2]});
  return TensorView::strided(p, t, {a.shape(0), a.shape(1), a.shape(2), a.shape(3)}, {s[0], s[1], s[2], s[3]});
}

// Options with the optional inputs, which sit at inputs[first ...].
flashgrad::Options options(const Params& p, const std::vector<mx::array>& in, size_t first) {
  flashgrad::Options o;
  o.softmax_scale = p.scale;
  o.causal = p.causal;
  o.window_left = p.window_left;
  o.window_right = p.window_right;
  o.softcap = p.softcap;
  o.num_threads = p.num_threads;
  size_t i = first;
  if (p.bias) o.bias = same(in[i++]);
  if (p.mask) o.mask = same(in[i++]);
  if (p.sinks) o.sinks = same(in[i++]);
  if (p.alibi) o.alibi_slopes = same(in[i++]);
  return o;
}

void allocate(std::vector<mx::array>& outputs) {
  for (auto& a : outputs) a.set_data(mx::allocator::malloc(a.nbytes()));
}

[[noreturn]] void no_gpu() {
  throw std::runtime_error(
      "flashgrad.mlx.scaled_dot_product_attention: runs on the CPU only (flashgrad has no Metal kernels); "
      "pass stream=mx.cpu or use mx.fast.scaled_dot_product_attention on the GPU");
}

class FlashAttentionVJP : public mx::Primitive {
 public:
  FlashAttentionVJP(mx::Stream s, Params p) : mx::Primitive(s), p_(p) {}

  // inputs: q, k, v, out, lse, dout, optional...; outputs: dq, dk, dv, [dbias], [dsinks].
  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outputs) override {
    allocate(outputs);
    flashgrad::Options o = options(p_, in, 6);
    flashgrad::Grads g{bthd(outputs[0]), bthd(outputs[1]), bthd(outputs[2]), std::nullopt, std::nullopt};
    size_t next = 3;
    if (p_.bias) g.dbias = same(outputs[next++]);
    if (p_.sinks) g.dsinks = same(outputs[next++]);
    TensorView q = bthd(in[0]), k = bthd(in[1]), v = bthd(in[2]), out = bthd(in[3]), lse = same(in[4]),
               dout = bthd(in[5]);
    flashgrad::backward_workspace_bytes(o, q, k, v);  // throws here, on the caller's thread
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& a : in) enc.set_input_array(a);
    for (auto& a : outputs) enc.set_output_array(a);
    enc.dispatch([o, q, k, v, out, lse, dout, g, keep = in]() {
      flashgrad::backward(o, q, k, v, out, lse, dout, g);
    });
  }
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override { no_gpu(); }
  const char* name() const override { return "FlashgradAttentionVJP"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const FlashAttentionVJP*>(&other);
    return o && p_ == o->p_;
  }

 private:
  Params p_;
};

class FlashAttention : public mx::Primitive {
 public:
  FlashAttention(mx::Stream s, Params p) : mx::Primitive(s), p_(p) {}

  void eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& outputs) override {
    allocate(outputs);
    flashgrad::Options o = options(p_, in, 3);
    TensorView q = bthd(in[0]), k = bthd(in[1]), v = bthd(in[2]), out = bthd(outputs[0]), lse = same(outputs[1]);
    flashgrad::forward_workspace_bytes(o, q, k, v);  // throws here, on the caller's thread
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (const auto& a : in) enc.set_input_array(a);
    for (auto& a : outputs) enc.set_output_array(a);
    enc.dispatch([o, q, k, v, out, lse, keep = in]() { flashgrad::forward(o, q, k, v, out, lse); });
  }
  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override { no_gpu(); }

  // The lse output's cotangent is ignored: lse is not returned to Python.
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>& outputs) override {
    const auto& q = primals[0];
    std::vector<mx::array> in = {q, primals[1], primals[2], outputs[0], outputs[1],
                                 mx::astype(cotangents[0], q.dtype(), stream())};
    for (int i = 3; i < p_.count(); ++i) in.push_back(primals[i]);
    std::vector<mx::Shape> shapes = {q.shape(), primals[1].shape(), primals[2].shape()};
    std::vector<mx::Dtype> dtypes = {q.dtype(), q.dtype(), q.dtype()};
    const int bias_at = p_.bias ? 3 : -1, mask_at = p_.bias + 3, sinks_at = p_.sinks ? 3 + p_.bias + p_.mask : -1;
    if (p_.bias) shapes.push_back(primals[bias_at].shape()), dtypes.push_back(mx::float32);
    if (p_.sinks) shapes.push_back(primals[sinks_at].shape()), dtypes.push_back(mx::float32);
    auto grads = mx::array::make_arrays(shapes, dtypes, std::make_shared<FlashAttentionVJP>(stream(), p_), in);
    std::vector<mx::array> result;
    for (int a : argnums) {
      if (a < 3) result.push_back(grads[a]);
      else if (a == bias_at) result.push_back(mx::astype(grads[3], primals[a].dtype(), stream()));
      else if (a == sinks_at) result.push_back(mx::astype(grads[3 + p_.bias], primals[a].dtype(), stream()));
      else if (p_.mask && a == mask_at) result.push_back(mx::zeros_like(primals[a], stream()));
      else throw std::invalid_argument("flashgrad.mlx.scaled_dot_product_attention: argument 'alibi_slopes': "
                                       "expected not to be differentiated, got a gradient request");
    }
    return result;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override {
    const auto& q = in[0];
    return {{q.shape(0), q.shape(1), q.shape(2), in[2].shape(3)}, {q.shape(0), q.shape(1), q.shape(2)}};
  }
  const char* name() const override { return "FlashgradAttention"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const FlashAttention*>(&other);
    return o && p_ == o->p_;
  }

 private:
  Params p_;
};

void check_inputs(const mx::array& q, const mx::array& k, const mx::array& v) {
  for (auto [name, a] : {std::pair{"q", &q}, std::pair{"k", &k}, std::pair{"v", &v}}) {
    if (a->ndim() != 4) fail(name, "4 dims [B, N, T, D]", "shape " + shape_str(*a));
    if (a->dtype() != mx::float32 && a->dtype() != mx::bfloat16 && a->dtype() != mx::float16)
      fail(name, "dtype float32, bfloat16 or float16", dtype_str(a->dtype()));
    if (a->dtype() != q.dtype()) fail(name, "q's " + dtype_str(q.dtype()), dtype_str(a->dtype()));
  }
  if (k.shape(0) != q.shape(0) || k.shape(3) != q.shape(3))
    fail("k", "shape (B, N_kv, T_kv, D) with q's B and D", "shape " + shape_str(k));
  if (v.shape(0) != k.shape(0) || v.shape(1) != k.shape(1) || v.shape(2) != k.shape(2))
    fail("v", "k's (B, N_kv, T_kv) and then Dv", "shape " + shape_str(v));
  if (q.shape(1) % k.shape(1) != 0)
    fail("k", "a head count N_kv that divides q's N_q = " + std::to_string(q.shape(1)),
         "N_kv = " + std::to_string(k.shape(1)));
}

// out, lse = attention(...); the Python layer (flashgrad/mlx.py) documents the arguments.
std::vector<mx::array> attention(const mx::array& q, const mx::array& k, const mx::array& v, double scale,
                                 bool causal, int64_t window_left, int64_t window_right, double softcap,
                                 std::optional<mx::array> bias, std::optional<mx::array> mask,
                                 std::optional<mx::array> sinks, std::optional<mx::array> alibi,
                                 int num_threads, mx::StreamOrDevice s) {
  const mx::Stream stream = mx::to_stream(s);
  if (stream.device.type != mx::Device::DeviceType::cpu) no_gpu();
  check_inputs(q, k, v);
  const mx::Shape full = {q.shape(0), q.shape(1), q.shape(2), k.shape(2)};
  Params p{scale, causal, window_left, window_right, softcap, bool(bias), bool(mask), bool(sinks), bool(alibi),
           num_threads};
  std::vector<mx::array> in = {q, k, v};
  for (auto [name, a] : {std::pair{"bias", &bias}, std::pair{"mask", &mask}}) {
    if (!*a) continue;
    const mx::array& t = **a;
    bool ok = t.ndim() == 4;
    for (int i = 0; ok && i < 4; ++i) ok = t.shape(i) == full[i] || t.shape(i) == 1;
    if (!ok) fail(name, "4 dims broadcastable to [B, N_q, T_q, T_kv]", "shape " + shape_str(t));
    // The library reads [B|1, N|1, T_q, T_kv]; dbias needs the full score grid.
    in.push_back(mx::broadcast_to(t, {t.shape(0), t.shape(1), full[2], full[3]}, stream));
  }
  for (auto [name, a] : {std::pair{"sinks", &sinks}, std::pair{"alibi_slopes", &alibi}}) {
    if (!*a) continue;
    if ((*a)->ndim() != 1 || (*a)->shape(0) != q.shape(1))
      fail(name, "shape (" + std::to_string(q.shape(1)) + ",)", "shape " + shape_str(**a));
    in.push_back(mx::astype(**a, mx::float32, stream));
  }
  const mx::Shape out_shape = {q.shape(0), q.shape(1), q.shape(2), v.shape(3)};
  return mx::array::make_arrays({out_shape, {q.shape(0), q.shape(1), q.shape(2)}}, {q.dtype(), mx::float32},
                                std::make_shared<FlashAttention>(stream, p), in);
}

}  // namespace

NB_MODULE(_mlx_ext, m) {
  m.doc() = "flashgrad's attention as an MLX primitive (flashgrad.mlx)";
  m.def("attention", &attention, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("scale"), nb::arg("causal"),
        nb::arg("window_left"), nb::arg("window_right"), nb::arg("softcap"), nb::arg("bias").none(),
        nb::arg("mask").none(), nb::arg("sinks").none(), nb::arg("alibi").none(), nb::arg("num_threads"),
        nb::arg("stream").none());
  m.def("isa", [] { return std::string(flashgrad::isa_name()); });
}
