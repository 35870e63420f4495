#include "c_abi_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "reference.hpp"

namespace flashgrad::fuzz {

using testing::Buffer;
using testing::Outputs;
using testing::Problem;
using testing::Report;
using testing::TensorError;

DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::f32: return {kDLFloat, 32, 1};
    case DType::f64: return {kDLFloat, 64, 1};
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::f16: return {kDLFloat, 16, 1};
    case DType::u8: return {kDLUInt, 8, 1};
    case DType::i32: return {kDLInt, 32, 1};
  }
  return {kDLFloat, 32, 1};
}

bool is_compact(const TensorView& v) {
  int64_t st = 1;
  for (int i = v.ndim - 1; i >= 0; --i) {
    if (v.shape[i] != 1 && v.strides[i] != st) return false;
    st *= v.shape[i];
  }
  return true;
}

void DL::set(const TensorView& v, bool null_strides, uint64_t byte_offset) {
  t = DLTensor{};
  t.data = v.data ? static_cast<char*>(v.data) - byte_offset : nullptr;
  t.byte_offset = byte_offset;
  t.device = {kDLCPU, 0};
  t.ndim = v.ndim;
  t.dtype = dl_dtype(v.dtype);
  for (int i = 0; i < v.ndim; ++i) {
    shape[i] = v.shape[i];
    strides[i] = v.strides[i];
  }
  t.shape = shape;
  t.strides = null_strides && is_compact(v) ? nullptr : strides;
}

int64_t DL::numel() const {
  int64_t n = 1;
  for (int i = 0; i < t.ndim && i < 4; ++i) n *= shape[i];
  return n;
}

void Guarded::make(const Buffer& like) {
  bytes.clear();
  buf = Buffer{};
  if (!like.present()) return;
  bytes.assign(like.bytes.size() + 2 * kGuard, kCanary);
  buf.view = like.view;
  const auto base = static_cast<const unsigned char*>(like.view.data) - like.bytes.data();
  buf.view.data = bytes.data() + kGuard + base;
  for (int64_t off : testing::offsets(buf.view)) testing::write(buf.view, off, std::nan(""));
}

std::string Guarded::check_canaries(const char* name) const {
  if (!present()) return "";
  std::vector<char> inside(bytes.size(), 0);
  const int64_t es = dtype_size(buf.view.dtype);
  const auto base = static_cast<const unsigned char*>(buf.view.data) - bytes.data();
  for (int64_t off : testing::offsets(buf.view))
    for (int64_t x = 0; x < es; ++x) inside[static_cast<size_t>(base + off * es + x)] = 1;
  for (size_t i = 0; i < bytes.size(); ++i)
    if (!inside[i] && bytes[i] != kCanary)
      return std::string(name) + ": byte " + std::to_string(i) + " of " + std::to_string(bytes.size()) +
             " outside the view's elements was overwritten (guard " + std::to_string(kGuard) + " bytes each side)";
  return "";
}

void AbiOutputs::make(const Outputs& like) {
  out.make(like.out);
  lse.make(like.lse);
  dq.make(like.dq);
  dk.make(like.dk);
  dv.make(like.dv);
  dsinks.make(like.dsinks);
  dbias.make(like.dbias);
}

Outputs AbiOutputs::views() const {
  Outputs o;
  o.out = out.buf;
  o.lse = lse.buf;
  o.dq = dq.buf;
  o.dk = dk.buf;
  o.dv = dv.buf;
  o.dsinks = dsinks.buf;
  o.dbias = dbias.buf;
  return o;
}

namespace {

// As in testing/harness.cpp (where these are internal).
double round_to(DType t, double x) {
  if (t == DType::f64) return x;
  double r = 0;
  Buffer b;
  unsigned char storage[8];
  b.view = TensorView::contiguous(storage, t, {1});
  testing::write(b.view, 0, x);
  r = testing::read(b.view, 0);
  return r;
}

double rounding_noise(DType t, const std::vector<double>& ref) {
  double noise = 0, top = 0;
  for (double r : ref) {
    if (!std::isfinite(r)) continue;
    const double x = round_to(t, r);
    noise = std::max(noise, std::fabs(round_to(t, round_to(t, x + 0.3) - 0.3) - x));
    top = std::max(top, std::fabs(x));
  }
  const int mant = t == DType::f64 ? 52 : t == DType::f32 ? 23 : t == DType::bf16 ? 7 : 10;
  const double ulp = top > 0 ? std::ldexp(1.0, std::ilogb(top) - mant) : 0.0;
  return std::max(2 * noise, ulp);
}

double max_err(const std::vector<double>& x, const std::vector<double>& ref) {
  double e = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i]) || std::isinf(x[i])) {
      if (x[i] != ref[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    const double d = std::fabs(x[i] - ref[i]);
    if (!(d <= e)) e = d;
  }
  return e;
}

Grads grads_of(const Outputs& o) {
  Grads g{o.dq.view, o.dk.view, o.dv.view, std::nullopt, std::nullopt};
  if (o.dsinks.present()) g.dsinks = o.dsinks.view;
  if (o.dbias.present()) g.dbias = o.dbias.view;
  return g;
}

}  // namespace

Report compare_with_reference(const Problem& p, const Outputs& ker, bool backward) {
  using reference::Precision;
  Outputs ref = testing::make_outputs(p, true), nai = testing::make_outputs(p, true);
  Outputs rev = testing::make_outputs(p, true), noise = testing::make_outputs(p, true);
  testing::run_reference(p, ref, Precision::f64, backward);
  testing::run_reference(p, nai, Precision::storage, backward);
  testing::run_reference(p, rev, Precision::storage_reversed, backward);
  if (backward)
    reference::backward(p.opts, p.q.view, p.k.view, p.v.view, p.dout.view, grads_of(noise), Precision::noise);
  Report r;
  auto add = [&](const char* name, const Buffer& k, const Buffer& e, const Buffer& n, const Buffer& nr,
                 DType storage, const Buffer* cancellation = nullptr) {
    if (!k.present()) return;
    TensorError t;
    t.name = name;
    const auto kd = testing::dense(k), ed = testing::dense(e);
    for (double x : ed)
      if (std::isfinite(x)) t.max_ref = std::max(t.max_ref, std::fabs(x));
    t.err_kernel = max_err(kd, ed);
    t.err_naive = std::max(max_err(testing::dense(n), ed), max_err(testing::dense(nr), ed));
    t.noise = rounding_noise(storage, ed);
    if (cancellation)
      for (double x : testing::dense(*cancellation)) t.noise = std::max(t.noise, x);
    t.pass = t.err_kernel <= t.bound();
    r.tensors.push_back(t);
  };
  const DType st = p.c.dtype, acc = st == DType::f64 ? DType::f64 : DType::f32;
  add("out", ker.out, ref.out, nai.out, rev.out, st);
  add("lse", ker.lse, ref.lse, nai.lse, rev.lse, acc);
  if (backward) {
    add("dq", ker.dq, ref.dq, nai.dq, rev.dq, st, &noise.dq);
    add("dk", ker.dk, ref.dk, nai.dk, rev.dk, st, &noise.dk);
    add("dv", ker.dv, ref.dv, nai.dv, rev.dv, st);
    add("dsinks", ker.dsinks, ref.dsinks, nai.dsinks, rev.dsinks, acc, &noise.dsinks);
    add("dbias", ker.dbias, ref.dbias, nai.dbias, rev.dbias, acc, &noise.dbias);
  }
  return r;
}

}  // namespace flashgrad::fuzz
