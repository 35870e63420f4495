// exp and tanh as the kernels compute them (exp_poly.hpp), the same
// operations on every ISA. Included by vec.inl, in order.

// exp(x) for x <= ~88 in f32 (exp_poly.hpp): within 2 ulp over the range
// the softmax uses (x <= 0). Results below e^-87.3 flush to 0, exactly 0 for
// x = -inf. NaN propagates.
inline float exp_f32(float x) {
  // Written so that NaN clamps to -87.3 too: the integer steps below then
  // stay defined, and the NaN is restored at the end.
  const float xc = x > -87.3f ? (x < 88.3f ? x : 88.3f) : -87.3f;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float nf = (xc * kExpLog2e + magic) - magic;
  float r = xc - nf * kExpLn2Hi;
  r = r - nf * kExpLn2Lo;
  float p = kExpPoly[0];
  for (int i = 1; i < kExpPolyTerms; ++i) p = p * r + kExpPoly[i];
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(nf) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  float y = p * scale;
  y = x < -87.3f ? 0.0f : y;
  return x != x ? x : y;
}
#if FG_SCALAR_VEXP
inline VecF vexp(VecF x) { return exp_f32(x); }
#endif

// tanh(s * inv) rounded to f32 (exp_poly.hpp): the vector layers' vtanh lane
// by lane, the same operations in the same order. NaN propagates.
inline float tanh_f32(float s, double inv) {
  const double a = std::fmin(std::fabs(static_cast<double>(s) * inv), kTanhClamp) * 2.0;
  const double n = std::nearbyint(a * kTanhLog2e);
  double r = std::fma(-n, kTanhLn2Hi, a);
  r = std::fma(-n, kTanhLn2Lo, r);
  double p = kTanhPoly[0];
  for (int i = 1; i < kTanhPolyTerms; ++i) p = std::fma(p, r, kTanhPoly[i]);
  p = p * r;
  const uint64_t bits = static_cast<uint64_t>(static_cast<int64_t>(n) + 1023) << 52;
  double scale;
  std::memcpy(&scale, &bits, 8);
  const double e = std::fma(scale, p, scale - 1.0);
  // e / (e + 2) through f32's reciprocal (correctly rounded on every ISA)
  // and one Newton step: within 2^-46, where a division cost the vector
  // layers more than the rest of the tanh (tuning table: vtanh).
  const double d = e + 2.0, r0 = static_cast<double>(1.0f / static_cast<float>(d));
  const float t = static_cast<float>(e * std::fma(r0, std::fma(-d, r0, 1.0), r0));
  return s != s ? s : std::copysign(t, s);
}
#if FG_SCALAR_VEXP
inline VecF vtanh(VecF s, double inv) { return tanh_f32(s, inv); }
#endif

// tanh(x) in f64 (exp_poly.hpp): within 0.51 ulp, by the same operations on
// every ISA (std::fma is exact wherever it runs). NaN propagates.
inline double tanh_f64(double x) {
  const double a = std::fmin(std::fabs(x), kTanhClamp) * 2.0;
  const double n = std::nearbyint(a * kTanhLog2e);
  // r = a - n ln2 = rh + rl: a - n ln2_hi is exact (n ln2_hi is, and they lie within 2x).
  const double t = a - n * kTanhLn2Hi, p = n * kTanhLn2Lo, pe = std::fma(n, kTanhLn2Lo, -p);
  const double rh = t - p, rl = ((t - rh) - p) - pe;
  const double sq = rh * rh, sqe = std::fma(rh, rh, -sq);
  const double p3 = sq * rh, p3e = std::fma(sq, rh, -p3) + sqe * rh;
  const double c3 = p3 / 6.0, c3e = (std::fma(-c3, 6.0, p3) + p3e) * (1.0 / 6.0);
  double c = kTanh64Poly[0];
  for (int i = 1; i < kTanh64PolyTerms; ++i) c = c * rh + kTanh64Poly[i];
  // expm1(r) = mh + ml: rh + (rh^2 / 2 + rh^3 / 6) by Fast2Sum (each term the larger), the rest in ml.
  const double uh = sq * 0.5 + c3, ue = (sq * 0.5 - uh) + c3;
  const double m0 = rh + uh, me = (rh - m0) + uh;
  const double m1 = me + ue + rl + sqe * 0.5 + rh * rl + sq * rl * 0.5 + c3e + sq * sq * c;
  const double mh = m0 + m1, ml = (m0 - mh) + m1;  // renormalized: |ml| <= ulp(mh) / 2
  // e = (2^n - 1) + 2^n mh + 2^n ml, as eh + el.
  const uint64_t bits = static_cast<uint64_t>(static_cast<int64_t>(n) + 1023) << 52;
  double s;
  std::memcpy(&s, &bits, 8);
  const double ah = s - 1.0, al = (s - ah) - 1.0, b = s * mh;
  const double e0 = ah + b, bb = e0 - ah, ee = (ah - (e0 - bb)) + (b - bb);
  const double e1 = ee + al + s * ml;
  const double eh = e0 + e1, el = (e0 - eh) + e1;
  // tanh = e / (e + 2): q0 + (e - q0 (e + 2)) / (e + 2).
  const double dh = eh + 2.0, db = dh - eh, de = (eh - (dh - db)) + (2.0 - db) + el;
  const double inv = 1.0 / dh, q0 = eh * inv;
  const double rem = std::fma(-q0, dh, eh) + (el - q0 * de);
  const double th = q0 + rem * inv;
  return x != x ? x : std::copysign(th, x);
}
inline double exp_acc(double x) { return std::exp(x); }
inline float exp_acc(float x) { return exp_f32(x); }
