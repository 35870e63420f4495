#include "workspace.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "tiling.hpp"

namespace flashgrad {

Workspace::Workspace(const char* fn, int64_t bytes) {
  if (bytes <= 0) return;
  const char* limit = std::getenv("FLASHGRAD_WORKSPACE_LIMIT");
  const bool over = limit && *limit && bytes > std::strtoll(limit, nullptr, 10);
  if (!over) data_ = ::operator new(static_cast<size_t>(bytes), std::align_val_t(kAlign), std::nothrow);
  if (!data_)
    throw Error(std::string("flashgrad::") + fn + ": out of memory: expected to allocate " +
                std::to_string(bytes) + " bytes of workspace, got " +
                (over ? "a limit of " + std::string(limit) + " bytes (FLASHGRAD_WORKSPACE_LIMIT)"
                      : std::string("an allocation failure")),
                Error::Code::out_of_memory);
}

Workspace::~Workspace() {
  if (data_) ::operator delete(data_, std::align_val_t(kAlign));
}

void zero_strided(const TensorView& t) {
  const int64_t es = dtype_size(t.dtype);
  for (int64_t a = 0; a < t.shape[0]; ++a)
    for (int64_t b = 0; b < t.shape[1]; ++b)
      for (int64_t c = 0; c < t.shape[2]; ++c) {
        char* row = static_cast<char*>(t.data) + (a * t.strides[0] + b * t.strides[1] + c * t.strides[2]) * es;
        for (int64_t d = 0; d < t.shape[3]; ++d) std::memset(row + d * t.strides[3] * es, 0, static_cast<size_t>(es));
      }
}

}  // namespace flashgrad
