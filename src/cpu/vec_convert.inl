// Storage types and their exact conversions to and from the accumulation
// type (bf16, f16), row loads and stores. Included by vec.inl, in order.

struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

inline float to_float(float x) { return x; }
inline double to_float(double x) { return x; }
inline float to_float(bf16_t x) {
  uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float to_float(f16_t x) {
#if FG_HAVE_FLOAT16 && !FG_PORTABLE_HALF
  _Float16 h;
  std::memcpy(&h, &x.bits, 2);
  return static_cast<float>(h);
#else
  const uint32_t sign = static_cast<uint32_t>(x.bits & 0x8000u) << 16;
  uint32_t exp = (x.bits >> 10) & 0x1fu, man = x.bits & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400u));
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else {
    u = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

template <typename T> T from_acc(double x);
template <> inline float from_acc<float>(double x) { return static_cast<float>(x); }
template <> inline double from_acc<double>(double x) { return x; }
inline bf16_t bf16_from(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}
inline f16_t f16_from(float f) {
#if FG_HAVE_FLOAT16 && !FG_PORTABLE_HALF
  _Float16 h = static_cast<_Float16>(f);
  f16_t out;
  std::memcpy(&out.bits, &h, 2);
  return out;
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return f16_t{static_cast<uint16_t>(sign | 0x7e00u)};
  if (u >= 0x477ff000u) return f16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (u < 0x38800000u) {  // subnormal or zero in f16: round via float addition
    float a;
    std::memcpy(&a, &u, 4);
    a += 0.5f;  // 2^-1 aligns f16's subnormal ulp (2^-24) to float's ulp at 0.5
    uint32_t r;
    std::memcpy(&r, &a, 4);
    return f16_t{static_cast<uint16_t>(sign | (r - 0x3f000000u))};
  }
  const uint32_t odd = (u >> 13) & 1u;
  u += 0xc8000fffu + odd;  // rebias exponent (-112 << 23) and round to nearest even
  return f16_t{static_cast<uint16_t>(sign | (u >> 13))};
#endif
}
#if FG_VEC_GEMM
inline VecF vload_as(const bf16_t* p) { return vload_bf16(&p->bits); }
inline VecF vload_as(const f16_t* p) { return vload_f16(&p->bits); }
// One element of f32, bf16 or f16 (converted exactly) in every lane.
template <typename TA>
inline VecF vbroadcast_as(const TA* p) { return vbroadcast(to_float(*p)); }
#endif
template <> inline bf16_t from_acc<bf16_t>(double x) { return bf16_from(static_cast<float>(x)); }
template <> inline f16_t from_acc<f16_t>(double x) { return f16_from(static_cast<float>(x)); }

// dst[0..n) = src[0, stride, ..., (n-1) * stride] converted to Acc, times
// mul; dst[n..pad) = 0.
template <typename T, typename Acc>
inline void load_row(const T* src, int64_t stride, int64_t n, int64_t pad, Acc* dst, Acc mul = Acc(1)) {
  if (stride == 1) {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<Acc>(to_float(src[i])) * mul;
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<Acc>(to_float(src[i * stride])) * mul;
  }
  for (int64_t i = n; i < pad; ++i) dst[i] = Acc(0);
}

// dst[0, stride, ..., (n-1) * stride] = src[0..n) times mul, converted to T;
// contiguous bf16 rows a vector at a time, with the same bits.
template <typename T, typename Acc>
inline void store_row(const Acc* src, int64_t n, T* dst, int64_t stride, Acc mul) {
  int64_t i = 0;
#if FG_VEC_STORE_BF16
  if constexpr (std::is_same<T, bf16_t>::value && std::is_same<Acc, float>::value) {
    const VecF m = vbroadcast(mul);
    for (; stride == 1 && i + kLanes <= n; i += kLanes) vstore_bf16(&dst[i].bits, vmul(vload(src + i), m));
  }
#endif
  for (; i < n; ++i) dst[i * stride] = from_acc<T>(src[i] * mul);
}
