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
}  // namespace flashgrad
