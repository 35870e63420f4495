// The exp of every ISA: Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2
// (ln2 in two parts), then e^r as 1 + r + c2 r^2 + ... + c6 r^6 by Horner,
// kExpPoly from c6 down. c2..c6 minimize the largest relative error over
// |r| <= ln2 / 2 (3.8e-9 with the coefficients rounded to f32;
// scripts/fit_exp.py): one FMA fewer than Taylor's degree 7 (5e-9).
// In namespace flashgrad, outside the per-ISA namespaces that include vec.inl
// and vec_<isa>.inl, so every copy of them reads the same constants.
#pragma once

namespace flashgrad {
constexpr float kExpLog2e = 1.44269504088896341f;
constexpr float kExpLn2Hi = 0.693145751953125f;
constexpr float kExpLn2Lo = 1.428606765330187045e-06f;
constexpr int kExpPolyTerms = 7;
constexpr float kExpPoly[kExpPolyTerms] = {1.3814613e-03f, 8.36871e-03f, 4.166839e-02f, 1.6666521e-01f,
                                          4.9999994e-01f, 1.0f, 1.0f};

// The softcap's tanh (vec.inl, tanh_f32; the vector layers lane-wise): in f64,
// tanh|x| = e / (e + 2) with e = expm1(2 |x|), 2 |x| = n ln2 + r, |r| <= ln2 / 2
// (ln2 in two parts, the first with trailing zeros so that n ln2_hi is
// exact), expm1(r) = r (1 + r / 2 + ... + r^8 / 9!) by Horner (kTanhPoly
// from 1 / 9! down; relative error below 2e-11) and e = 2^n expm1(r) + (2^n - 1),
// then rounded to f32 once: within 0.5 ulp but for ties closer than ~1e-3
// ulp. glibc's tanhf (about 1 ulp) made the kernels' softcapped logits less
// accurate than the naive path's, which the fuzzer saw as rule misses
// (f32, softcap 30, d = 1: 43 in 300 draws). |x| is clamped at 20, where the
// f32 result is 1.
constexpr double kTanhLog2e = 1.4426950408889634;
constexpr double kTanhLn2Hi = 6.93147180369123816490e-01;
constexpr double kTanhLn2Lo = 1.90821492927058770002e-10;
constexpr double kTanhClamp = 20.0;
constexpr int kTanhPolyTerms = 9;
constexpr double kTanhPoly[kTanhPolyTerms] = {1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120,
                                              1.0 / 24,     1.0 / 6,     1.0 / 2,    1.0};

// The f64 softcap's tanh (vec.inl, tanh_f64): tanh|x| = e / (e + 2) with
// e = expm1(2 |x|) carried as a double-double, 2 |x| = n ln2 + r (ln2 as
// above, r as rh + rl), expm1(r) = r + r^2 / 2 + r^3 / 6 + r^4 C(r), the
// first three terms with their rounding errors and C (kTanh64Poly, 1 / 14!
// down to 1 / 4!) in plain f64, where its part of expm1(r) (under 2e-3)
// leaves an error below 2^-61; e + 2 and the quotient as double-doubles,
// rounded once. glibc's tanh (up to 2.1 ulp, 41% of results not the
// nearest double on [0, 1)) made the capped scores of the f64 kernels less
// accurate than the naive path's tanh rounded once. |x| is clamped at 20,
// where the f64 result is 1.
constexpr int kTanh64PolyTerms = 11;
constexpr double kTanh64Poly[kTanh64PolyTerms] = {
    1.0 / 87178291200.0, 1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
    1.0 / 40320.0,       1.0 / 5040.0,       1.0 / 720.0,       1.0 / 120.0,      1.0 / 24.0};
}  // namespace flashgrad
