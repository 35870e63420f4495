#include "workspace.hpp"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "tiling.hpp"

namespace flashgrad {
namespace {

// The largest workspace of kCacheMinBytes to kCacheMaxMiB that a call
// released, kept for the next call that needs at most its size. glibc maps
// an allocation above its mmap threshold (at most 32 MiB) afresh and unmaps
// it when freed, so every call page-faulted such a workspace again: an MQA
// backward's 39 MB took 6,000 faults a call (tuning table: workspace
// cache). A call that needs more frees the kept one before it allocates,
// so that the process never holds both: a training step's peak stays its
// largest workspace, as without the cache.
constexpr int64_t kCacheMinBytes = int64_t{1} << 20;
constexpr int64_t kCacheMaxMiB = 64;

// FLASHGRAD_WORKSPACE_CACHE_MIB overrides kCacheMaxMiB; 0 keeps nothing.
int64_t cache_max_bytes() {
  const char* env = std::getenv("FLASHGRAD_WORKSPACE_CACHE_MIB");
  const int64_t mib = env && *env ? std::strtoll(env, nullptr, 10) : kCacheMaxMiB;
  return mib > 0 ? mib << 20 : 0;
}

struct Cache {
  std::mutex m;
  void* data = nullptr;
  int64_t bytes = 0;
};
Cache& cache() {
  static Cache c;
  return c;
}

void release(void* data) { ::operator delete(data, std::align_val_t(kAlign)); }

}  // namespace

Workspace::Workspace(const char* fn, int64_t bytes) {
  if (bytes <= 0) return;
  const char* limit = std::getenv("FLASHGRAD_WORKSPACE_LIMIT");
  const bool over = limit && *limit && bytes > std::strtoll(limit, nullptr, 10);
  if (!over && bytes >= kCacheMinBytes / 2 && cache_max_bytes() > 0) {
    Cache& c = cache();
    const std::lock_guard<std::mutex> lock(c.m);
    if (c.data && c.bytes >= bytes) {
      data_ = c.data, bytes_ = c.bytes;
      c.data = nullptr, c.bytes = 0;
      return;
    }
    if (c.data) {
      release(c.data);
      c.data = nullptr, c.bytes = 0;
    }
  }
  if (!over) data_ = ::operator new(static_cast<size_t>(bytes), std::align_val_t(kAlign), std::nothrow);
  bytes_ = bytes;
  if (!data_)
    throw Error(std::string("flashgrad::") + fn + ": out of memory: expected to allocate " +
                std::to_string(bytes) + " bytes of workspace, got " +
                (over ? "a limit of " + std::string(limit) + " bytes (FLASHGRAD_WORKSPACE_LIMIT)"
                      : std::string("an allocation failure")),
                Error::Code::out_of_memory);
}

Workspace::~Workspace() {
  if (!data_) return;
  const int64_t most = cache_max_bytes();
  if (bytes_ >= kCacheMinBytes || most == 0) {
    Cache& c = cache();
    const std::lock_guard<std::mutex> lock(c.m);
    if (most == 0) {  // keep nothing, and drop what was kept
      if (c.data) release(c.data);
      c.data = nullptr, c.bytes = 0;
    } else if (bytes_ <= most && bytes_ > c.bytes) {
      std::swap(c.data, data_);
      std::swap(c.bytes, bytes_);
    }
  }
  if (data_) release(data_);
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
