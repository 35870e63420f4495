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
using testing::dl_dtype;

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

}  // namespace flashgrad::fuzz
