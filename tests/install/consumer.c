/* Installed-tree consumer in C99: one forward through the C ABI on DLPack
 * tensors, and one bad call that must come back as an error status. */
#include <flashgrad/flashgrad.h>
#include <stdio.h>

static DLTensor f32(float* data, int ndim, int64_t* shape) {
  DLTensor t = {0};
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

int main(void) {
  float q[4] = {1, 0, 0, 0}, k[4] = {2, 0, 0, 0}, v[4] = {3, 4, 5, 6}, out[4] = {0}, lse[1] = {0};
  int64_t s4[4] = {1, 1, 1, 4}, s3[3] = {1, 1, 1};
  DLTensor tq = f32(q, 4, s4), tk = f32(k, 4, s4), tv = f32(v, 4, s4), to = f32(out, 4, s4), tl = f32(lse, 3, s3);
  fg_params p = fg_params_default();
  if (fg_forward(&p, &tq, &tk, &tv, &to, &tl) != FG_OK) {
    printf("consumer_c: %s\n", fg_last_error());
    return 1;
  }
  for (int i = 0; i < 4; ++i)
    if (out[i] != v[i]) {
      printf("consumer_c: out[%d] = %g, expected %g\n", i, out[i], v[i]);
      return 1;
    }
  tk.ndim = 3; /* a bad rank: an error status and a message, never an abort */
  if (fg_forward(&p, &tq, &tk, &tv, &to, &tl) == FG_OK) {
    printf("consumer_c: a 3-D k was accepted\n");
    return 1;
  }
  printf("consumer_c: ok (%s; bad k: %s)\n", fg_version(), fg_last_error());
  return 0;
}
