"""Outputs and gradients in bf16 / f16 / f32 against the float64 math reference, with
flash-attn's rule: err(flashgrad) <= 2 * err(math path in the same precision) + rounding noise.

Shapes cross the library's 64 x 64 tiles (seqlen_q 65, seqlen_k 129) with unequal head dims.
"""
import pytest
import torch

from conftest import assert_rule, attention_math, cancellation_noise
from flashgrad.torch import flash_attn_func, flash_attn_varlen_func

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
B, LQ, LK, H, HKV, D, DV = 2, 65, 129, 4, 2, 40, 24

CASES = {
    "plain": {},
    "causal": {"causal": True},
    "causal_q_longer": {"causal": True, "seqlen_q": 129, "seqlen_k": 65},
    "window": {"window_size": (17, 5)},
    "softcap": {"softcap": 2.0, "input_scale": 3.0},
    "alibi": {"causal": True, "alibi": True},
    "bias": {"bias": (B, 1, LQ, LK)},
    "bias_key_padding": {"bias": (B, 1, 1, LK)},
    "mask": {"mask": True},
    "sinks": {"sinks": True, "causal": True},
    "dropout": {"dropout_p": 0.2},
}


def make(case, dtype):
    lq, lk = case.get("seqlen_q", LQ), case.get("seqlen_k", LK)
    scale = case.get("input_scale", 1.0)
    q = (torch.randn(B, lq, H, D) * scale).to(dtype).requires_grad_()
    k = (torch.randn(B, lk, HKV, D) * scale).to(dtype).requires_grad_()
    v = torch.randn(B, lk, HKV, DV).to(dtype).requires_grad_()
    dout = torch.randn(B, lq, H, DV).to(dtype)
    extra = {}
    if case.get("alibi"):
        extra["alibi_slopes"] = torch.rand(H) * 0.3
    if "bias" in case:
        bias_dtype = torch.float32 if dtype == torch.float32 else dtype
        extra["attn_bias"] = torch.randn(*case["bias"]).to(bias_dtype).requires_grad_()
    if case.get("mask"):
        m = torch.rand(B, H, lq, lk) > 0.3
        m[:, :, 3] = False  # fully masked rows
        extra["attn_mask"] = m
    if case.get("sinks"):
        extra["sinks"] = torch.randn(H).requires_grad_()
    return q, k, v, dout, extra


def leaves(q, k, v, extra):
    out = [("dq", q), ("dk", k), ("dv", v)]
    if "attn_bias" in extra:
        out.append(("dbias", extra["attn_bias"]))
    if "sinks" in extra:
        out.append(("dsinks", extra["sinks"]))
    return out


def run_math(q, k, v, dout, extra, kw, keep, compute, round_to, parts=None, reverse=False):
    """Math path on detached copies of the leaves: returns (out, {name: grad}); parts and
    reverse as in attention_math."""
    ls = [(n, t.detach().to(compute).requires_grad_()) for n, t in leaves(q, k, v, extra)]
    d = dict(ls)
    out, _ = attention_math(d["dq"], d["dk"], d["dv"], compute=compute, round_to=round_to,
                            causal=kw.get("causal", False), window=kw.get("window_size", (-1, -1)),
                            softcap=kw.get("softcap", 0.0), alibi=extra.get("alibi_slopes"),
                            bias=d.get("dbias"), mask=extra.get("attn_mask"), sinks=d.get("dsinks"),
                            keep=keep, dropout_p=kw.get("dropout_p", 0.0), parts=parts,
                            reverse=reverse)
    out.backward(dout.to(compute))
    return out.detach(), {n: t.grad for n, t in ls}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t).split(".")[-1])
@pytest.mark.parametrize("name", CASES)
def test_flash_attn_func_rule(name, dtype):
    case = CASES[name]
    q, k, v, dout, extra = make(case, dtype)
    kw = {key: case[key] for key in ("causal", "window_size", "softcap", "dropout_p") if key in case}
    keep = None
    if kw.get("dropout_p"):
        out, _, s_dmask = flash_attn_func(q, k, v, **kw, **extra, return_attn_probs=True)
        keep = ~torch.signbit(s_dmask)  # flash-attn's encoding: negative = dropped
    else:
        out = flash_attn_func(q, k, v, **kw, **extra)
    out.backward(dout)
    parts = {}
    ref_out, ref_g = run_math(q, k, v, dout, extra, kw, keep, torch.float64, None, parts)
    round_to = None if dtype == torch.float32 else dtype
    paths = [run_math(q, k, v, dout, extra, kw, keep, torch.float32, round_to, reverse=r) for r in (False, True)]
    assert_rule("out", out, tuple(o for o, _ in paths), ref_out, dtype)
    bias = extra.get("attn_bias")
    cancel = cancellation_noise(q, dout, ref_out, parts, dtype, None if bias is None else bias.shape)
    for n, leaf in leaves(q, k, v, extra):
        extra_noise = sinks_noise(q, k, v, dout, extra, kw, ref_out, dtype) if n == "dsinks" else 0.0
        extra_noise = max(extra_noise, cancel.get(n, 0.0))
        # dsinks and float32 bias gradients are float32 values: their rounding noise is float32's.
        assert_rule(n, leaf.grad, tuple(g[n] for _, g in paths), ref_g[n], leaf.dtype, extra_noise)


@pytest.mark.parametrize("name", CASES)
def test_reversed_math_path_is_the_same_math(name):
    """The reversed summation order changes rounding only: in float64 both orders agree."""
    case = CASES[name]
    q, k, v, dout, extra = make(case, torch.float32)
    kw = {key: case[key] for key in ("causal", "window_size", "softcap", "dropout_p") if key in case}
    keep = torch.rand(B, H, q.shape[1], k.shape[1]) > kw["dropout_p"] if kw.get("dropout_p") else None
    (out, g), (rout, rg) = (run_math(q, k, v, dout, extra, kw, keep, torch.float64, None, reverse=r)
                            for r in (False, True))
    torch.testing.assert_close(rout, out, rtol=0, atol=1e-12)
    for n in g:
        torch.testing.assert_close(rg[n], g[n], rtol=0, atol=1e-12)


def sinks_noise(q, k, v, dout, extra, kw, ref_out, dtype) -> float:
    """The error that storing out in dtype puts into dsinks, twice.

    dsinks[h] = -sum_{b,i} P_sink[b,h,i] * delta[b,h,i], delta = rowsum(dout * out). A fused
    backward only has out as stored, rounded to dtype (flash-attn's delta is computed the same
    way), so delta carries e[b,h,i] = sum_d dout * (round(out) - out), and the sum over all
    b * seqlen_q rows adds these up. The math path never forms delta (it backpropagates through
    P and dP) and does not see this term, so it is added here: 2 * max_h |sum P_sink * e|,
    computed from the float64 reference. Nothing else about dsinks is loosened.
    """
    sinks = extra["sinks"].detach().double()
    _, lse = attention_math(q.detach(), k.detach(), v.detach(), causal=kw.get("causal", False),
                            window=kw.get("window_size", (-1, -1)), sinks=sinks)
    p_sink = torch.exp(sinks.view(1, -1, 1) - lse)  # (B, H, Lq)
    e = (dout.double() * (ref_out.to(dtype).double() - ref_out)).sum(-1).transpose(1, 2)
    return 2 * (p_sink * e).sum((0, 2)).abs().max().item()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t).split(".")[-1])
def test_varlen_rule(dtype):
    cu_q = torch.tensor([0, 70, 70, 103], dtype=torch.int32)  # lengths 70, 0, 33
    cu_k = torch.tensor([0, 5, 45, 174], dtype=torch.int32)   # lengths 5, 40, 129
    q = torch.randn(103, H, D).to(dtype).requires_grad_()
    k = torch.randn(174, HKV, D).to(dtype).requires_grad_()
    v = torch.randn(174, HKV, DV).to(dtype).requires_grad_()
    dout = torch.randn(103, H, DV).to(dtype)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 70, 129, causal=True)
    out.backward(dout)

    def spans(b):
        return slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))

    def path(compute, round_to, parts=None):
        qq, kk, vv = (t.detach().to(compute).requires_grad_() for t in (q, k, v))
        outs = []
        for b in range(3):
            sq, sk = spans(b)
            o, _ = attention_math(qq[None, sq], kk[None, sk], vv[None, sk], compute=compute,
                                  round_to=round_to, causal=True,
                                  parts=None if parts is None else parts.setdefault(b, {}))
            outs.append(o[0])
        o = torch.cat(outs)
        o.backward(dout.to(compute))
        return o.detach(), qq.grad, kk.grad, vv.grad

    parts = {}
    ref = path(torch.float64, None, parts)
    mp = path(torch.float32, None if dtype == torch.float32 else dtype)
    # dS's cancellation noise (conftest.cancellation_noise), per sequence; the empty one has none.
    cancel = {"dq": 0.0, "dk": 0.0}
    for b in range(3):
        sq, sk = spans(b)
        if sq.stop > sq.start:
            noise_b = cancellation_noise(q[None, sq], dout[None, sq], ref[0][None, sq], parts[b], dtype)
            cancel = {n: max(cancel[n], noise_b[n]) for n in cancel}
    for name, got, p, r in zip(("out", "dq", "dk", "dv"), (out, q.grad, k.grad, v.grad), mp, ref):
        assert_rule(name, got, p, r, dtype, cancel.get(name, 0.0))
