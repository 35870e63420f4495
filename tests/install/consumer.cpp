// Installed-tree consumer: one forward through the C++ API. With a single key
// the output must be that key's value row exactly and lse the scaled score.
#include <flashgrad/flashgrad.hpp>

#include <cmath>
#include <cstdio>

int main() {
  float q[4] = {1, 0, 0, 0}, k[4] = {2, 0, 0, 0}, v[4] = {3, 4, 5, 6}, out[4] = {}, lse[1] = {};
  using flashgrad::DType;
  using flashgrad::TensorView;
  const auto qv = TensorView::contiguous(q, DType::f32, {1, 1, 1, 4});
  const auto kv = TensorView::contiguous(k, DType::f32, {1, 1, 1, 4});
  const auto vv = TensorView::contiguous(v, DType::f32, {1, 1, 1, 4});
  const auto ov = TensorView::contiguous(out, DType::f32, {1, 1, 1, 4});
  const auto lv = TensorView::contiguous(lse, DType::f32, {1, 1, 1});
  flashgrad::forward(flashgrad::Options{}, qv, kv, vv, ov, lv);
  for (int i = 0; i < 4; ++i)
    if (out[i] != v[i]) return std::printf("consumer_cpp: out[%d] = %g, expected %g\n", i, out[i], v[i]), 1;
  if (std::fabs(lse[0] - 1.0f) > 1e-6f) return std::printf("consumer_cpp: lse = %g, expected 1\n", lse[0]), 1;
  std::printf("consumer_cpp: ok (%s)\n", flashgrad::version());
  return 0;
}
