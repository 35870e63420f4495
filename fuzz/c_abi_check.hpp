// Pieces of the C ABI fuzzer that are not about decoding a draw: DLTensors
// made from the harness's views, output buffers fenced by canary bytes, and
// the harness's tolerance rule applied to results obtained through fg_*.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <string>
#include <vector>

#include "flashgrad/flashgrad.h"
#include "harness.hpp"

namespace flashgrad::fuzz {

// A DLTensor that owns its shape and strides (so it must not be copied).
struct DL {
  DLTensor t{};
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};

  DL() = default;
  DL(const DL&) = delete;
  DL& operator=(const DL&) = delete;
  // null_strides: pass strides = NULL when the view is compact row-major.
  // byte_offset: data = view.data - byte_offset (the caller keeps it in bounds).
  void set(const TensorView& v, bool null_strides, uint64_t byte_offset);
  int64_t numel() const;
};

bool is_compact(const TensorView& v);

// An output buffer laid out like `like` (same shape and strides) inside
// kGuard canary bytes on either side; gaps between strided elements hold the
// canary too, and the elements themselves hold NaN so that an unwritten
// element cannot pass the tolerance check.
struct Guarded {
  static constexpr size_t kGuard = 64;
  static constexpr unsigned char kCanary = 0xA5;
  std::vector<unsigned char> bytes;
  testing::Buffer buf;  ///< buf.view points inside bytes; buf.bytes stays empty

  void make(const testing::Buffer& like);
  bool present() const { return buf.present(); }
  // "" when every byte outside the view's elements still holds the canary.
  std::string check_canaries(const char* name) const;
};

// The outputs of one call through the C ABI, each fenced.
struct AbiOutputs {
  Guarded out, lse, dq, dk, dv, dsinks, dbias;
  void make(const testing::Outputs& like);
  testing::Outputs views() const;  // Buffers that view the fenced storage
};


}  // namespace flashgrad::fuzz
