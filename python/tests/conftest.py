"""Shared pieces of the Python tests: the math reference and flash-attn's tolerance rule.

The reference is written here, in plain PyTorch, from the equation in
include/flashgrad/flashgrad.hpp; it is the spec the package is tested against.
"""
from __future__ import annotations

import math

import pytest
import torch

import flashgrad  # noqa: F401  (fails early, with a clear message, if the module is not built)

# The tests are small; two threads exercise the parallel path on the 2-core CI machine.
torch.set_num_threads(2)


def attention_math(q, k, v, *, compute=torch.float64, round_to=None, scale=None, causal=False,
                   window=(-1, -1), softcap=0.0, alibi=None, bias=None, mask=None, sinks=None,
                   keep=None, dropout_p=0.0, parts=None, reverse=False):
    """Materialized attention on (batch, seqlen, heads, dim) tensors: returns (out, lse).

    compute: the dtype the math runs in. round_to: a low precision that every intermediate
    (scores, probabilities, output, and through autograd their gradients) is rounded to, which
    emulates a math path in that precision (torch 1.13 has no float16 matmul on CPU).
    Causal/window are aligned bottom-right; keep is a (B, H, Lq, Lk) dropout keep mask.
    parts: a dict that receives, detached, p (B, H, Lq, Lk, before dropout), z (the dropout
    factor), cap (d softcap / d score), scale and k, v repeated to q's heads.
    reverse: the same math with every sum in the opposite order (queries, keys and both head
    dims flipped going in, the results flipped back), as the C++ harness's storage_reversed
    reference: a path's error depends on its summation order, so the rule takes the worse.
    """
    def rnd(x):
        return x if round_to is None else x.to(round_to).to(compute)

    q, k, v = (x.to(compute) for x in (q, k, v))
    batch, seqlen_q, heads, dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    i = torch.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q  # query i's key position
    j = torch.arange(seqlen_k)[None, :]
    if reverse:
        assert parts is None
        q, k, v = q.flip(1, 3), k.flip(1, 3), v.flip(1, 3)
        i, j = i.flip(0), j.flip(1)
        bias, mask, keep = (None if t is None else t.flip(-2, -1) for t in (bias, mask, keep))
    k = k.repeat_interleave(heads // heads_kv, dim=2)
    v = v.repeat_interleave(heads // heads_kv, dim=2)
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    s = s0 = rnd(torch.einsum("bihd,bjhd->bhij", q, k) * scale)
    if softcap > 0:
        s = rnd(softcap * torch.tanh(s / softcap))
    if alibi is not None:
        slopes = alibi.to(compute).reshape(-1, heads, 1, 1)
        s = s - slopes * (i - j).abs().to(compute)
    if bias is not None:
        s = rnd(s + bias.to(compute))
    allowed = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    if causal:
        allowed &= j <= i
    if window[0] >= 0:
        allowed &= j >= i - window[0]
    if window[1] >= 0:
        allowed &= j <= i + window[1]
    allowed = allowed.expand(batch, heads, seqlen_q, seqlen_k)
    if mask is not None:
        allowed = allowed & mask.bool()
    s = s.masked_fill(~allowed, -math.inf)
    m = s.amax(-1, keepdim=True)
    if sinks is not None:
        m = torch.maximum(m, sinks.to(compute).view(1, heads, 1, 1))
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m).detach()
    e = torch.exp(s - m)
    denom = e.sum(-1, keepdim=True)
    if sinks is not None:
        denom = denom + torch.exp(sinks.to(compute).view(1, heads, 1, 1) - m)
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    p = rnd(e / safe)
    if parts is not None:
        z = keep.to(compute) / (1.0 - dropout_p) if keep is not None else torch.ones_like(p)
        cap = 1 - torch.tanh(s0 / softcap) ** 2 if softcap > 0 else torch.ones_like(p)
        parts.update(p=p.detach(), z=z, cap=cap.detach(), scale=scale, k=k.detach(), v=v.detach(),
                     heads_kv=heads_kv)
    if keep is not None:
        p = p * keep.to(compute) / (1.0 - dropout_p)
    out = rnd(torch.einsum("bhij,bjhd->bihd", p, v))
    lse = (torch.log(denom) + m).squeeze(-1)
    if reverse:
        out, lse = out.flip(1, 3), lse.flip(-1)
    return out, lse


def noise(ref64: torch.Tensor, dtype: torch.dtype) -> float:
    """flash-attn's rounding noise: 2 * max|((ref + 0.3) - 0.3) - ref|, evaluated in dtype."""
    r = ref64.to(dtype)
    return 2 * ((r + 0.3) - 0.3 - r).abs().max().item()


def max_err(x: torch.Tensor, ref64: torch.Tensor) -> float:
    return (x.double() - ref64).abs().max().item() if x.numel() else 0.0


def cancellation_noise(q, dout, out64, parts: dict, dtype, bias_shape=None) -> dict:
    """The rounding noise of dS = P * (dP - delta) for dq, dk and dbias, as the C++ harness
    adds it (src/reference.cpp, Precision::noise): a fused backward forms dP = dO V^T and
    delta = rowsum(dO * out) as separate sums (delta from out as stored in dtype), and their
    difference cancels, so its error scales with the terms, not with dS. The math path
    backpropagates through P and never forms delta. First order, per element:
      P * (u_acc * sum |dO| |V| * z + u_out * sum |dO * out|),
    times the softcap factor for dq and dk, then through |K| and |Q| like dS itself.
    Returns the largest element of each gradient's noise."""
    u_acc = 2.0 ** (-53 if dtype == torch.float64 else -24)
    u_out = torch.finfo(dtype).eps / 2
    d64, q64 = dout.detach().double(), q.detach().double()
    p, z, cap, scale, k, v, heads_kv = (parts[n] for n in
                                        ("p", "z", "cap", "scale", "k", "v", "heads_kv"))
    dpd = torch.einsum("bihd,bjhd->bhij", d64.abs(), v.abs())
    delta = (d64 * out64.double()).abs().sum(-1).transpose(1, 2)[..., None]
    gb = p * (u_acc * dpd * z + u_out * delta)
    ds = gb * cap
    dq = scale * torch.einsum("bhij,bjhd->bihd", ds, k.abs())
    dk = scale * torch.einsum("bhij,bihd->bjhd", ds, q64.abs())
    dk = dk.reshape(dk.shape[0], dk.shape[1], heads_kv, -1, dk.shape[3]).sum(3)
    out = {"dq": dq.max().item(), "dk": dk.max().item()}
    if bias_shape is not None:
        dims = [d for d in range(4) if bias_shape[d] == 1]
        out["dbias"] = (gb.sum(dims) if dims else gb).max().item()
    return out


def assert_rule(name: str, got, path, ref64, dtype, extra_noise: float = 0.0):
    """flash-attn's rule: err(flashgrad) <= 2 * err(math path in the same precision) + noise,
    both errors measured against the float64 reference. path: one math path's result, or a
    tuple of them (summation orders), whose largest error counts."""
    paths = path if isinstance(path, tuple) else (path,)
    err, path_err = max_err(got, ref64), max(max_err(p, ref64) for p in paths)
    bound = 2 * path_err + noise(ref64, dtype) + extra_noise
    assert err <= bound, (f"{name}: max error {err:.3e} > 2 * math-path error {path_err:.3e} + noise "
                          f"{noise(ref64, dtype):.3e} + {extra_noise:.3e}")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
