"""flashgrad.jax.dot_product_attention against jax.nn.dot_product_attention and the float64
math reference (conftest.attention_math), under the rule
err(flashgrad) <= 2 * err(math path in the same precision) + rounding noise, where the math
paths are jax.nn's own attention and the conftest math in both summation orders.

Shapes: GQA (4 query heads on 2 kv heads), seqlen_q != seqlen_k across the 64-row tiles.
"""
import numpy as np
import pytest
import torch

from conftest import assert_rule, attention_math, cancellation_noise

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
import flashgrad.jax as fgj  # noqa: E402  (jax is there: the extension must be built)

B, LQ, LK, N, K, H = 2, 65, 129, 4, 2, 40
DTYPES = {"float32": (jnp.float32, torch.float32), "bfloat16": (jnp.bfloat16, torch.bfloat16),
          "float16": (jnp.float16, torch.float16), "float64": (jnp.float64, torch.float64)}
CASES = {
    "plain": {},
    "causal": {"is_causal": True},
    "causal_q_longer": {"is_causal": True, "seqlen_q": 129, "seqlen_k": 65},
    "window": {"local_window_size": (17, 5)},
    "bias": {"bias": (B, 1, LQ, LK)},
    "bias_broadcast": {"bias": (1, N, 1, LK), "is_causal": True},
    "mask": {"mask": (B, N, LQ, LK)},
    "bias_mask_causal": {"bias": (B, N, LQ, LK), "mask": (B, 1, LQ, LK), "is_causal": True},
    "seq_lengths": {"seq_lengths": True},
}


def to_torch(x):
    """float64 (exact) torch copy of a jax array."""
    return torch.from_numpy(np.asarray(x).astype(np.float64))


def make(case, jdtype, key=0):
    lq, lk = case.get("seqlen_q", LQ), case.get("seqlen_k", LK)
    ks = jax.random.split(jax.random.PRNGKey(key), 6)
    q = jax.random.normal(ks[0], (B, lq, N, H), jnp.float32).astype(jdtype)
    k = jax.random.normal(ks[1], (B, lk, K, H), jnp.float32).astype(jdtype)
    v = jax.random.normal(ks[2], (B, lk, K, H), jnp.float32).astype(jdtype)
    dout = jax.random.normal(ks[3], (B, lq, N, H), jnp.float32).astype(jdtype)
    kw = {n: case[n] for n in ("is_causal", "local_window_size") if n in case}
    if "bias" in case:
        kw["bias"] = jax.random.normal(ks[4], case["bias"], jnp.float32).astype(jdtype)
    if "mask" in case:
        kw["mask"] = jax.random.uniform(ks[5], case["mask"]) > 0.3
    if case.get("seq_lengths"):
        kw["query_seq_lengths"] = jnp.array([lq, lq - 20], jnp.int32)
        kw["key_value_seq_lengths"] = jnp.array([lk - 30, lk], jnp.int32)
    return (q, k, v), dout, kw


def allowed(kw, lq, lk):
    """The bool [B, N, T, S] mask the call means, with jax.nn's top-left causal and window."""
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    ok = np.ones((B, N, lq, lk), bool)
    if kw.get("is_causal"):
        ok &= j <= i
    w = kw.get("local_window_size")
    if w is not None:
        left, right = (w, w) if isinstance(w, int) else w
        ok &= (j >= i - left) & (j <= i + right)
    if "mask" in kw:
        ok &= np.asarray(kw["mask"])
    if "query_seq_lengths" in kw:
        ok &= (i < np.asarray(kw["query_seq_lengths"])[:, None, None, None])
        ok &= (j < np.asarray(kw["key_value_seq_lengths"])[:, None, None, None])
    return torch.from_numpy(ok)


def vjp(fn, args, dout, kw):
    """out and the gradients of sum(out * dout) for q, k, v (and bias)."""
    diff = list(args) + ([kw["bias"]] if "bias" in kw else [])
    rest = {n: x for n, x in kw.items() if n != "bias"}

    def call(*xs):
        extra = {"bias": xs[3]} if len(xs) > 3 else {}
        return fn(*xs[:3], **extra, **rest)
    out, pullback = jax.vjp(call, *diff)
    return out, pullback(dout)


def jax_nn_vjp(args, dout, kw):
    """jax.nn's vjp, jitted (one compile per case, not one per eager op); eagerly for float16,
    whose jitted dot precision (F16_F16_F32) XLA's CPU backend refuses."""
    if args[0].dtype == jnp.float16:
        return vjp(jax.nn.dot_product_attention, args, dout, kw)
    arrays = {n: x for n, x in kw.items() if isinstance(x, jax.Array)}
    static = {n: x for n, x in kw.items() if n not in arrays}
    return jax.jit(lambda a, d, arr: vjp(jax.nn.dot_product_attention, a, d, {**arr, **static}))(args, dout, arrays)


def math_path(args, dout, kw, compute, round_to, parts=None, reverse=False):
    names = ["dq", "dk", "dv"] + (["dbias"] if "bias" in kw else [])
    leaves = [to_torch(x).to(compute).requires_grad_() for x in list(args) + ([kw["bias"]] if "bias" in kw else [])]
    lq, lk = args[0].shape[1], args[1].shape[1]
    out, _ = attention_math(*leaves[:3], compute=compute, round_to=round_to,
                            bias=leaves[3] if len(leaves) > 3 else None, mask=allowed(kw, lq, lk),
                            parts=parts, reverse=reverse)
    out.backward(to_torch(dout).to(compute))
    return out.detach(), {n: t.grad for n, t in zip(names, leaves)}


# Every case in float32; bfloat16 in two that use every feature between them (seqlen_q >
# seqlen_k; causal with a bias and a mask), float16 and float64 in the second.
RUNS = ([(n, "float32") for n in CASES] + [(n, "bfloat16") for n in ("causal_q_longer", "bias_mask_causal")]
        + [("bias_mask_causal", d) for d in ("float16", "float64")])


@pytest.mark.parametrize("name, dtype", RUNS)
def test_rule_against_jax_and_float64(name, dtype):
    jdtype, tdtype = DTYPES[dtype]
    with jax.enable_x64(dtype == "float64"):
        args, dout, kw = make(CASES[name], jdtype)
        out, grads = vjp(fgj.dot_product_attention, args, dout, kw)
        jout, jgrads = jax_nn_vjp(args, dout, kw)
    assert out.dtype == jdtype and all(g.dtype == a.dtype for g, a in zip(grads, args))
    parts = {}
    ref_out, ref_g = math_path(args, dout, kw, torch.float64, None, parts)
    compute = torch.float64 if dtype == "float64" else torch.float32
    round_to = tdtype if tdtype in (torch.bfloat16, torch.float16) else None
    paths = [math_path(args, dout, kw, compute, round_to, reverse=r) for r in (False, True)]
    names = ["dq", "dk", "dv", "dbias"]
    assert_rule("out", to_torch(out), (to_torch(jout),) + tuple(o for o, _ in paths), ref_out, tdtype)
    q_t = to_torch(args[0])
    bias_shape = kw["bias"].shape if "bias" in kw else None
    cancel = cancellation_noise(q_t, to_torch(dout), ref_out, parts, tdtype, bias_shape)
    for n, g, jg in zip(names, grads, jgrads):
        assert_rule(n, to_torch(g), (to_torch(jg),) + tuple(p[n] for _, p in paths), ref_g[n], tdtype,
                    cancel.get(n, 0.0))


def test_jit_equals_eager_and_vmap_equals_batched():
    args, dout, kw = make({"bias": (B, 1, LQ, LK), "is_causal": True}, jnp.float32)
    eager = vjp(fgj.dot_product_attention, args, dout, kw)
    jitted = jax.jit(lambda a, d, b: vjp(fgj.dot_product_attention, a, d, {**kw, "bias": b}))(args, dout, kw["bias"])
    for x, y in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

    # vmap over the batch of per-example [T, N, H] calls equals the one batched call, gradients too.
    def per_example(q, k, v, b, d):
        return vjp(fgj.dot_product_attention, (q, k, v), d, {"bias": b, "is_causal": True})
    mapped = jax.vmap(per_example)(*args, kw["bias"], dout)
    for x, y in zip(jax.tree.leaves(eager), jax.tree.leaves(mapped)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_vmap_of_grad_sums_an_unbatched_bias():
    args, dout, kw = make({"bias": (1, N, LQ, LK)}, jnp.float32)
    loss = lambda q, k, v, b: (fgj.dot_product_attention(q, k, v, b) ** 2).sum()  # noqa: E731
    per = jax.vmap(jax.grad(loss, argnums=3), in_axes=(0, 0, 0, None))(*[a[:, None] for a in args], kw["bias"])
    whole = jax.grad(loss, argnums=3)(*args, kw["bias"])
    np.testing.assert_allclose(np.asarray(per.sum(0)), np.asarray(whole), rtol=1e-5, atol=1e-5)


def test_three_dim_inputs_and_residual():
    args, _, _ = make({}, jnp.float32)
    q, k, v = (a[0] for a in args)
    out, lse = fgj.dot_product_attention(q, k, v, is_causal=True, return_residual=True)
    jout, jlse = jax.nn.dot_product_attention(q, k, v, is_causal=True, return_residual=True)
    assert out.shape == jout.shape and lse.shape == jlse.shape
    np.testing.assert_allclose(np.asarray(out), np.asarray(jout), atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(jlse), atol=1e-5)


@pytest.mark.parametrize("change, exc, arg", [
    (lambda a, kw: (a[0][0, 0], a[1], a[2]), ValueError, "query"),            # rank 2
    (lambda a, kw: (a[0], a[1][0], a[2]), ValueError, "key"),                 # ranks differ
    (lambda a, kw: (a[0].astype(jnp.int32), a[1], a[2]), TypeError, "query"),
    (lambda a, kw: (a[0], a[1].astype(jnp.float16), a[2]), TypeError, "key"),
    (lambda a, kw: (a[0][:, :, :3], a[1], a[2]), ValueError, "key"),         # 3 heads on 2
    (lambda a, kw: kw.update(mask=jnp.ones((B, N, LQ, 7), bool)), ValueError, "mask"),
    (lambda a, kw: kw.update(mask=jnp.ones((B, N, LQ, LK))), TypeError, "mask"),
    (lambda a, kw: kw.update(bias=jnp.ones((3, N, LQ, LK))), ValueError, "bias"),
    (lambda a, kw: kw.update(local_window_size=(-2, 1)), ValueError, "local_window_size"),
    (lambda a, kw: kw.update(query_seq_lengths=jnp.ones((B,), jnp.float32)), TypeError, "query_seq_lengths"),
    (lambda a, kw: kw.update(implementation="cudnn"), ValueError, "implementation"),
])
def test_bad_arguments_name_the_argument(change, exc, arg):
    args, _, kw = make({}, jnp.float32)
    changed = change(args, kw)
    with pytest.raises(exc, match=f"argument '{arg}'"):
        fgj.dot_product_attention(*(changed or args), **kw)


def test_library_errors_come_back_as_ffi_errors():
    """A head dim the library refuses (> 512) fails in the FFI handler, jitted or not."""
    q = jnp.ones((1, 4, 2, 600), jnp.float32)
    for fn in (fgj.dot_product_attention, jax.jit(fgj.dot_product_attention)):
        with pytest.raises(Exception, match="flashgrad::forward: argument 'q': expected head_dim"):
            jax.block_until_ready(fn(q, q, q))
