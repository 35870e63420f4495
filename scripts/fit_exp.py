#!/usr/bin/python3
"""Coefficients of the kernels' exp polynomial (src/cpu/exp_poly.hpp).

e^r on |r| <= ln2 / 2 as 1 + r + c2 r^2 + ... + c6 r^6: c2..c6 minimize the
largest relative error |p(r) e^-r - 1| over a dense grid, a linear program.
Prints c6..c2 rounded to f32 and the error with the rounded coefficients.
"""
import numpy as np
from scipy.optimize import linprog

DEGREE = 6
half = np.log(2) / 2
r = np.linspace(-half, half, 20001)
powers = range(2, DEGREE + 1)
# Scaled so that the solver's tolerances sit far below the error sought.
scale = 1e7
a = np.array([r**k * np.exp(-r) for k in powers]).T * scale
b = (1 - (1 + r) * np.exp(-r)) * scale
n = a.shape[1]
ones = np.ones((len(r), 1))
res = linprog(np.r_[np.zeros(n), 1.0],
              A_ub=np.vstack([np.hstack([a, -ones]), np.hstack([-a, -ones])]),
              b_ub=np.r_[b, -b], bounds=[(None, None)] * (n + 1), method="highs")
assert res.success, res.message
coef = np.float32(res.x[:n])
p = np.polyval(np.r_[coef[::-1].astype(np.float64), 1.0, 1.0], r)
print("c6..c2:", ", ".join(np.format_float_scientific(c, unique=True) + "f" for c in coef[::-1]))
print("largest relative error: %.2e" % np.max(np.abs(p * np.exp(-r) - 1)))
