"""flashgrad.mlx.scaled_dot_product_attention against mx.fast.scaled_dot_product_attention and the
float64 math reference (conftest.attention_math), under the rule
err(flashgrad) <= 2 * err(math path in the same precision) + rounding noise, where the math
paths are MLX's own attention (where it has the feature) and the conftest math in both
summation orders.

Shapes: GQA (4 query heads on 2 kv heads), T_q != T_kv across the 64-row tiles.
"""
import math

import numpy as np
import pytest
import torch

from conftest import assert_rule, attention_math, cancellation_noise
from test_accuracy import sinks_noise

mx = pytest.importorskip("mlx.core")
import flashgrad.mlx as fgm  # noqa: E402  (mlx is there: the extension must be built)

B, LQ, LK, N, K, D = 2, 65, 129, 4, 2, 40
SCALE = 1.0 / math.sqrt(D)
DTYPES = {"float32": (mx.float32, torch.float32), "bfloat16": (mx.bfloat16, torch.bfloat16),
          "float16": (mx.float16, torch.float16)}
CASES = {
    "plain": {},
    "causal": {"causal": True},
    "causal_q_longer": {"causal": True, "seqlen_q": 129, "seqlen_k": 65},
    "window": {"window_size": (17, 5)},
    "bool_mask": {"mask": (B, 1, LQ, LK)},
    "additive_mask": {"bias": (1, N, LQ, LK)},
    "additive_key_padding": {"bias": (B, 1, 1, LK)},
    "sinks_causal": {"sinks": True, "causal": True},
    "softcap_alibi": {"softcap": 2.0, "alibi": True, "causal": True},
}


def to_torch(x, bthd=True):
    """float64 torch copy of an mx.array; q, k, v, out in [B, T, N, D] order (the reference's)."""
    a = torch.from_numpy(np.array(x.astype(mx.float32) if x.dtype != mx.bool_ else x)).double()
    return a.transpose(1, 2) if bthd and x.ndim == 4 and x.dtype != mx.bool_ else a


def make(case, dtype, seed=0):
    mx.random.seed(seed)
    lq, lk = case.get("seqlen_q", LQ), case.get("seqlen_k", LK)
    cap = 3.0 if "softcap" in case else 1.0
    q = (mx.random.normal((B, N, lq, D)) * cap).astype(dtype)
    k = (mx.random.normal((B, K, lk, D)) * cap).astype(dtype)
    v = mx.random.normal((B, K, lk, D)).astype(dtype)
    dout = mx.random.normal((B, N, lq, D)).astype(dtype)
    kw = {n: case[n] for n in ("window_size", "softcap") if n in case}
    if case.get("causal"):
        kw["mask"] = "causal"
    if "mask" in case:
        kw["mask"] = mx.random.uniform(shape=case["mask"]) > 0.3
    if "bias" in case:
        kw["mask"] = mx.random.normal(case["bias"]).astype(dtype)
    if case.get("sinks"):
        kw["sinks"] = mx.random.normal((N,))
    if case.get("alibi"):
        kw["alibi_slopes"] = mx.random.uniform(shape=(N,)) * 0.3
    return [q, k, v], dout, kw


def diff_names(kw):
    """The differentiated inputs: q, k, v, an additive mask, sinks."""
    names = ["dq", "dk", "dv"]
    if isinstance(kw.get("mask"), mx.array) and kw["mask"].dtype != mx.bool_:
        names.append("dbias")
    if "sinks" in kw:
        names.append("dsinks")
    return names


def vjp(fn, args, dout, kw):
    names = diff_names(kw)
    extra = ([kw["mask"]] if "dbias" in names else []) + ([kw["sinks"]] if "dsinks" in names else [])
    rest = {n: x for n, x in kw.items() if not ("dbias" in names and n == "mask") and n != "sinks"}

    def call(*xs):
        more = dict(rest)
        if "dbias" in names:
            more["mask"] = xs[3]
        if "dsinks" in names:
            more["sinks"] = xs[-1]
        return fn(*xs[:3], scale=SCALE, **more)
    outs, grads = mx.vjp(call, args + extra, [dout])
    mx.eval(outs, grads)
    return outs[0], dict(zip(names, grads))


def mlx_own(kw, dtype, lq, lk):
    """MLX's attention with the same meaning, or None where it lacks a feature (a window
    becomes a mask; softcap and ALiBi have no counterpart, and it wants sinks in q's dtype)."""
    if "softcap" in kw or "alibi_slopes" in kw or ("sinks" in kw and dtype != mx.float32):
        return None
    own = {n: x for n, x in kw.items() if n != "window_size"}
    if "window_size" in kw:
        left, right = kw["window_size"]
        i = np.arange(lq)[:, None] + lk - lq
        j = np.arange(lk)[None, :]
        own["mask"] = mx.array((j >= i - left) & (j <= i + right))
    return own


def math_path(args, dout, kw, compute, round_to, parts=None, reverse=False):
    names = diff_names(kw)
    leaves = [to_torch(x).to(compute).requires_grad_() for x in args]
    extra = {}
    mask = kw.get("mask")
    if "dbias" in names:
        extra["bias"] = to_torch(mask, bthd=False).to(compute).requires_grad_()
    elif isinstance(mask, mx.array):
        extra["mask"] = to_torch(mask).bool()
    if "dsinks" in names:
        extra["sinks"] = to_torch(kw["sinks"]).to(compute).requires_grad_()
    if "alibi_slopes" in kw:
        extra["alibi"] = to_torch(kw["alibi_slopes"])
    out, _ = attention_math(*leaves, compute=compute, round_to=round_to, scale=SCALE,
                            causal=mask == "causal" if isinstance(mask, str) else False,
                            window=kw.get("window_size", (-1, -1)), softcap=kw.get("softcap", 0.0),
                            parts=parts, reverse=reverse, **extra)
    out.backward(to_torch(dout).to(compute))
    grads = dict(zip(["dq", "dk", "dv"], (t.grad for t in leaves)))
    if "dbias" in names:
        grads["dbias"] = extra["bias"].grad
    if "dsinks" in names:
        grads["dsinks"] = extra["sinks"].grad
    return out.detach(), grads


def as_reference_layout(name, g):
    return to_torch(g, bthd=name not in ("dbias", "dsinks"))


def delta_noise(q, k, v, dout, sinks, causal, ref_out) -> float:
    """The float32 rounding of delta = rowsum(dout * out) inside dsinks = -sum P_sink * delta,
    to first order u * max_h sum_{b,i} P_sink * sum_d |dout * out|: the fused backward forms
    delta as a sum, the math path backpropagates through P and never does (conftest's
    cancellation_noise adds the same term to dq and dk)."""
    _, lse = attention_math(q, k, v, scale=SCALE, causal=causal, sinks=sinks)
    p_sink = torch.exp(sinks.view(1, -1, 1) - lse)
    terms = (dout.abs() * ref_out.abs()).sum(-1).transpose(1, 2)
    return 2.0 ** -24 * (p_sink * terms).sum((0, 2)).max().item()


RUNS = [(n, "float32") for n in CASES] + [(n, d) for d in ("bfloat16", "float16")
                                         for n in ("causal_q_longer", "additive_mask", "sinks_causal")]


@pytest.mark.parametrize("name, dtype", RUNS)
def test_rule_against_mlx_and_float64(name, dtype):
    mdtype, tdtype = DTYPES[dtype]
    args, dout, kw = make(CASES[name], mdtype)
    out, grads = vjp(fgm.scaled_dot_product_attention, args, dout, kw)
    assert out.dtype == mdtype and all(grads[n].dtype == a.dtype for n, a in zip(("dq", "dk", "dv"), args))
    parts = {}
    ref_out, ref_g = math_path(args, dout, kw, torch.float64, None, parts)
    round_to = None if dtype == "float32" else tdtype
    paths = [math_path(args, dout, kw, torch.float32, round_to, reverse=r) for r in (False, True)]
    own = mlx_own(kw, mdtype, args[0].shape[2], args[1].shape[2])
    if own is not None:
        o, g = vjp(mx.fast.scaled_dot_product_attention, args, dout, own)
        paths.append((to_torch(o), {n: as_reference_layout(n, x) for n, x in g.items()}))
    assert_rule("out", to_torch(out), tuple(o for o, _ in paths), ref_out, tdtype)
    bias = kw.get("mask") if "dbias" in grads else None
    cancel = cancellation_noise(to_torch(args[0]), to_torch(dout), ref_out, parts, tdtype,
                                None if bias is None else tuple(bias.shape))
    for n, g in grads.items():
        # dsinks is a float32 value: its rounding noise is float32's, plus what storing out in
        # q's dtype puts into delta (test_accuracy.sinks_noise says why).
        noise_dtype, extra = tdtype, cancel.get(n, 0.0)
        if n == "dsinks":
            noise_dtype = torch.float32
            tq, tk, tv = (to_torch(a) for a in args)
            sinks, causal = to_torch(kw["sinks"]), kw.get("mask") == "causal"
            extra = sinks_noise(tq, tk, tv, to_torch(dout), {"sinks": sinks}, {"causal": causal}, ref_out, tdtype)
            extra += delta_noise(tq, tk, tv, to_torch(dout), sinks, causal, ref_out)
        assert_rule(n, as_reference_layout(n, g), tuple(p[n] for _, p in paths), ref_g[n], noise_dtype, extra)


@pytest.mark.parametrize("name", ["additive_mask", "sinks_causal"])
def test_compile_equals_eager(name):
    args, dout, kw = make(CASES[name], mx.float32)
    loss = lambda q, k, v: (fgm.scaled_dot_product_attention(q, k, v, scale=SCALE, **kw) * dout).sum()  # noqa: E731
    eager = mx.value_and_grad(loss, argnums=(0, 1, 2))(*args)
    compiled = mx.compile(mx.value_and_grad(loss, argnums=(0, 1, 2)))(*args)
    mx.eval(eager, compiled)
    for x, y in zip([eager[0], *eager[1]], [compiled[0], *compiled[1]]):
        np.testing.assert_array_equal(np.array(x), np.array(y))


def test_strided_inputs_equal_contiguous():
    """q, k, v as [B, T, N, D] memory seen as [B, N, T, D] (the usual projection layout)."""
    args, _, _ = make({}, mx.float32)
    strided = [mx.swapaxes(mx.array(np.ascontiguousarray(np.array(mx.swapaxes(a, 1, 2)))), 1, 2) for a in args]
    a = fgm.scaled_dot_product_attention(*args, scale=SCALE, mask="causal")
    b = fgm.scaled_dot_product_attention(*strided, scale=SCALE, mask="causal")
    np.testing.assert_array_equal(np.array(a), np.array(b))


@pytest.mark.parametrize("change, exc, arg", [
    (lambda a, kw: (a[0][0], a[1], a[2]), ValueError, "q"),                    # rank 3
    (lambda a, kw: (a[0].astype(mx.int32), a[1], a[2]), TypeError, "q"),
    (lambda a, kw: (a[0], a[1].astype(mx.float16), a[2]), TypeError, "k"),
    (lambda a, kw: (a[0][:, :3], a[1], a[2]), ValueError, "k"),                # 3 heads on 2
    (lambda a, kw: (a[0], a[1], a[2][:, :, :7]), ValueError, "v"),
    (lambda a, kw: kw.update(mask=mx.ones((B, N, LQ, 7), mx.bool_)), ValueError, "mask"),
    (lambda a, kw: kw.update(mask=mx.ones((B, N, LQ, LK), mx.int32)), TypeError, "mask"),
    (lambda a, kw: kw.update(mask="top_left"), ValueError, "mask"),
    (lambda a, kw: kw.update(sinks=mx.ones((3,))), ValueError, "sinks"),
    (lambda a, kw: kw.update(window_size=(3,)), ValueError, "window_size"),
])
def test_bad_arguments_name_the_argument(change, exc, arg):
    args, _, kw = make({}, mx.float32)
    changed = change(args, kw)
    with pytest.raises(exc, match=f"argument '{arg}'"):
        fgm.scaled_dot_product_attention(*(changed or args), scale=SCALE, **kw)


def test_library_errors_raise_at_eval():
    """A head dim the library refuses (> 512) raises the library's message when evaluated."""
    q = mx.ones((1, 2, 4, 600))
    out = fgm.scaled_dot_product_attention(q, q, q, scale=0.1)
    with pytest.raises(RuntimeError, match=r"flashgrad::forward\w*: argument 'q': expected head_dim"):
        mx.eval(out)
