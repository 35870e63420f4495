"""flashgrad.mlx: mx.fast.scaled_dot_product_attention on flashgrad's kernels, for MLX on the CPU.

    from flashgrad.mlx import scaled_dot_product_attention
    out = scaled_dot_product_attention(q, k, v, scale=q.shape[-1] ** -0.5, mask="causal")

The call is one custom MLX primitive (python/src/mlx_ext.cpp): its eval_cpu runs flashgrad's
forward and keeps the row log-sum-exp as a second output, its vjp runs flashgrad's fused
backward from it, so mx.grad, mx.value_and_grad and mx.compile work as with MLX's own op.
"""
from __future__ import annotations

import mlx.core as mx

try:
    from . import _mlx_ext
except ImportError as e:  # built only when mlx was importable when flashgrad was built
    raise ImportError(
        "flashgrad.mlx: the extension flashgrad._mlx_ext is not built; reinstall flashgrad with mlx "
        "importable by the building Python (pip install 'mlx[cpu]' nanobind, then pip install "
        "--no-build-isolation '.[mlx]' from the repository root)") from e

__all__ = ["scaled_dot_product_attention", "set_num_threads"]

_FN = "flashgrad.mlx.scaled_dot_product_attention"
_DTYPES = (mx.float32, mx.bfloat16, mx.float16)
_threads = {"n": 0}


def set_num_threads(n: int) -> None:
    """Threads of flashgrad's pool for later calls (0: all cores)."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"flashgrad.mlx.set_num_threads: argument 'n': expected an int >= 0, got {n!r}")
    _threads["n"] = n


def _fail(arg, expected, got, exc=ValueError):
    raise exc(f"{_FN}: argument '{arg}': expected {expected}, got {got}")


def _array(arg, x, dims, dtypes=None):
    if not isinstance(x, mx.array):
        _fail(arg, "an mx.array", type(x).__name__, TypeError)
    if dims is not None and x.ndim != dims:
        _fail(arg, f"{dims} dims", f"shape {tuple(x.shape)}")
    if dtypes is not None and x.dtype not in dtypes:
        _fail(arg, "dtype " + " or ".join(str(d).split(".")[-1] for d in dtypes), f"dtype {x.dtype}", TypeError)
    return x


def _mask_or_bias(mask, q, k):
    """(causal, bias, mask) from MLX's mask argument: "causal", a bool mask or an additive one."""
    if mask is None:
        return False, None, None
    if isinstance(mask, str):
        if mask != "causal":
            _fail("mask", "'causal', a bool array or an additive array", repr(mask))
        return True, None, None
    _array("mask", mask, None)
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if mask.ndim > 4 or any(d not in (1, f) for d, f in zip(mask.shape[::-1], full[::-1])):
        _fail("mask", f"at most 4 dims broadcastable to {full} [B, N_q, T_q, T_kv]", f"shape {tuple(mask.shape)}")
    mask = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
    if mask.dtype == mx.bool_:
        return False, None, mask
    if mask.dtype not in _DTYPES:
        _fail("mask", "dtype bool, or an additive float32, bfloat16 or float16", f"dtype {mask.dtype}", TypeError)
    return False, mask, None


def scaled_dot_product_attention(q, k, v, *, scale, mask=None, sinks=None, window_size=(-1, -1),
                                 softcap=0.0, alibi_slopes=None, stream=None):
    r"""mx.fast.scaled_dot_product_attention with flashgrad's forward and fused backward (CPU).

    For batch b, query head n (key/value head n // (N_q // N_kv)), query i and key j:

        S[i, j] = scale * q[b, n, i, :] . k[b, n // G, j, :]
        S       = softcap * tanh(S / softcap)                        (softcap > 0)
        S[i, j] += -alibi_slopes[n] * |i + T_kv - T_q - j| + bias[b, n, i, j]
        S[i, j] = -inf where masked: mask false, "causal" (j > i + T_kv - T_q), or
                  outside window_size = (left, right) around i + T_kv - T_q
        out[b, n, i, :] = sum_j exp(S[i, j] - lse[i]) v[b, n // G, j, :],
        lse[i] = log(sum_j exp(S[i, j]) + exp(sinks[n]))             (sink term with sinks)

    Args:
      q: [B, N_q, T_q, D]; float32, bfloat16 or float16.
      k: [B, N_kv, T_kv, D], q's dtype; N_kv divides N_q (GQA / MQA).
      v: [B, N_kv, T_kv, Dv], q's dtype.
      scale: the scores' scale (required, as in MLX).
      mask: None, "causal" (aligned lower-right: the last query sees the last key), a bool
        array (True = attend) or an additive float array, at most 4 dims broadcastable to
        [B, N_q, T_q, T_kv]. An additive mask is differentiated; size-1 T dims of either
        kind are broadcast (a view) before the call.
      sinks: optional [N_q] logits, one per head, in the softmax's denominator only;
        differentiated.
      window_size: (left, right), -1 unbounded, aligned like "causal" (flash-attn's).
      softcap: > 0 caps the scores with softcap * tanh(S / softcap).
      alibi_slopes: optional [N_q] float32 slopes (not differentiated).
      stream: a CPU stream or device; a GPU (Metal) one raises RuntimeError.

    Returns out [B, N_q, T_q, Dv] in q's dtype. A query row that sees no key gets out = 0
    and passes no gradient. Bad arguments raise TypeError (types, dtypes) or ValueError
    naming the argument when the graph is built.
    """
    q = _array("q", q, 4, _DTYPES)
    k = _array("k", k, 4, (q.dtype,))
    v = _array("v", v, 4, (q.dtype,))
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        _fail("k", f"shape (B={q.shape[0]}, N_kv, T_kv, D={q.shape[3]})", f"shape {tuple(k.shape)}")
    if tuple(v.shape[:3]) != tuple(k.shape[:3]):
        _fail("v", f"k's (B, N_kv, T_kv) = {tuple(k.shape[:3])}, then Dv", f"shape {tuple(v.shape)}")
    if q.shape[1] % k.shape[1] != 0:
        _fail("k", f"a head count N_kv that divides q's N_q = {q.shape[1]}", f"N_kv = {k.shape[1]}")
    if not isinstance(scale, (int, float)) or not scale > 0:
        _fail("scale", "a float > 0", repr(scale))
    causal, bias, bool_mask = _mask_or_bias(mask, q, k)
    for arg, x in (("sinks", sinks), ("alibi_slopes", alibi_slopes)):
        if x is not None and tuple(_array(arg, x, 1, _DTYPES).shape) != (q.shape[1],):
            _fail(arg, f"shape ({q.shape[1]},)", f"shape {tuple(x.shape)}")
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(w, int) and w >= -1 for w in window_size)):
        _fail("window_size", "a pair (left, right) of ints >= -1", repr(window_size))
    if not isinstance(softcap, (int, float)) or softcap < 0:
        _fail("softcap", "a float >= 0", repr(softcap))
    out, _ = _mlx_ext.attention(q, k, v, float(scale), causal, window_size[0], window_size[1], float(softcap),
                                bias, bool_mask, sinks, alibi_slopes, _threads["n"], stream)
    return out
