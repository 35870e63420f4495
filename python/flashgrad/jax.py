"""flashgrad.jax: jax.nn.dot_product_attention on flashgrad's kernels, for JAX on the CPU.

    from flashgrad.jax import dot_product_attention
    out = dot_product_attention(q, k, v, is_causal=True)   # [B, T, N, H], as jax.nn's

The forward and the fused backward are XLA FFI custom calls (python/src/jax_ffi.cpp),
registered for platform "cpu" and tied together by jax.custom_vjp, so the function works
under jax.jit, jax.grad and jax.vmap. The kernels run on flashgrad's own thread pool
(python/README.md, "JAX" says how it shares the cores with XLA's).
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

try:
    from . import _jax_ffi
except ImportError as e:  # built only when jax was importable when flashgrad was built
    raise ImportError(
        "flashgrad.jax: the extension flashgrad._jax_ffi is not built; reinstall flashgrad with jax "
        "importable by the building Python (pip install jax, then pip install --no-build-isolation "
        "'.[jax]' from the repository root)") from e

__all__ = ["dot_product_attention", "set_num_threads"]

_FN = "flashgrad.jax.dot_product_attention"
_DTYPES = (jnp.float32, jnp.float64, jnp.bfloat16, jnp.float16)

for _name, _capsule in _jax_ffi.registrations().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")

_threads = {"n": 0}


def set_num_threads(n: int) -> None:
    """Threads for the calls traced from now on (0: all cores; jitted functions keep theirs)."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"flashgrad.jax.set_num_threads: argument 'n': expected an int >= 0, got {n!r}")
    _threads["n"] = n


class _Flags(NamedTuple):
    """The static part of a call: the FFI attributes, hashable for custom_vjp."""
    scale: float
    causal: bool
    window: tuple[int, int]  # (left, right), -1 unbounded
    top_left: bool
    num_threads: int

    def attrs(self, bias, mask) -> dict:
        return dict(scale=np.float64(self.scale), causal=np.int64(self.causal),
                    window_left=np.int64(self.window[0]), window_right=np.int64(self.window[1]),
                    top_left=np.int64(self.top_left), has_bias=np.int64(bias is not None),
                    has_mask=np.int64(mask is not None), num_threads=np.int64(self.num_threads))


def _fail(arg: str, expected: str, got, exc=ValueError):
    raise exc(f"{_FN}: argument '{arg}': expected {expected}, got {got}")


def _lse_dtype(dtype):
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def _ffi_forward(flags: _Flags, q, k, v, bias, mask):
    batch, seqlen_q, heads_q, _ = q.shape
    shapes = (jax.ShapeDtypeStruct(q.shape[:-1] + v.shape[-1:], q.dtype),
              jax.ShapeDtypeStruct((batch, heads_q, seqlen_q), _lse_dtype(q.dtype)))
    call = jax.ffi.ffi_call("flashgrad_attention_fwd", shapes, vmap_method="broadcast_all")
    extra = [x for x in (bias, mask) if x is not None]
    return call(q, k, v, *extra, **flags.attrs(bias, mask))


def _ffi_backward(flags: _Flags, q, k, v, bias, mask, out, lse, dout):
    shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)]
    if bias is not None:  # dbias in the accumulation dtype, cast back to bias's below
        shapes.append(jax.ShapeDtypeStruct(bias.shape, _lse_dtype(q.dtype)))
    call = jax.ffi.ffi_call("flashgrad_attention_bwd", tuple(shapes), vmap_method="broadcast_all")
    extra = [x for x in (bias, mask) if x is not None]
    return call(q, k, v, out, lse, dout.astype(q.dtype), *extra, **flags.attrs(bias, mask))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(flags, q, k, v, bias, mask):
    return _ffi_forward(flags, q, k, v, bias, mask)


def _attention_fwd(flags, q, k, v, bias, mask):
    out, lse = _ffi_forward(flags, q, k, v, bias, mask)
    return (out, lse), (q, k, v, bias, mask, out, lse)


def _attention_bwd(flags, res, cotangents):
    q, k, v, bias, mask, out, lse = res
    dout, _ = cotangents  # lse is a residual: no gradient flows through it, as in jax.nn
    grads = _ffi_backward(flags, q, k, v, bias, mask, out, lse, dout)
    dbias = None if bias is None else grads[3].astype(bias.dtype)
    return grads[0], grads[1], grads[2], dbias, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def _as_4d(arg: str, x, dims: str):
    x = jnp.asarray(x)
    if x.ndim not in (3, 4):
        _fail(arg, f"3 or 4 dims {dims}", f"shape {tuple(x.shape)}")
    return x[None] if x.ndim == 3 else x


def _broadcast_4d(arg: str, x, full: tuple, kind: str):
    """bias / mask: up to 4 dims broadcastable to [B, N, T, S]; returned as [B|1, N|1, T, S]."""
    x = jnp.asarray(x)
    if kind == "mask" and x.dtype != jnp.bool_:
        _fail(arg, "dtype bool (True = attend)", f"dtype {x.dtype}", TypeError)
    if kind == "bias" and not jnp.issubdtype(x.dtype, jnp.floating):
        _fail(arg, "a floating dtype", f"dtype {x.dtype}", TypeError)
    if x.ndim > 4 or any(d not in (1, f) for d, f in zip(x.shape[::-1], full[::-1])):
        _fail(arg, f"a shape broadcastable to {full} [batch, heads_q, seqlen_q, seqlen_k]",
              f"shape {tuple(x.shape)}")
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    # The library needs the seqlen dims in full (dbias is per score); batch and head dims
    # of 1 stay broadcast.
    return jnp.broadcast_to(x, x.shape[:2] + full[2:])


def _window(local_window_size) -> tuple[int, int]:
    if local_window_size is None:
        return (-1, -1)
    w = (local_window_size,) * 2 if isinstance(local_window_size, int) else tuple(local_window_size)
    if len(w) != 2 or not all(isinstance(x, (int, np.integer)) and x >= 0 for x in w):
        _fail("local_window_size", "an int >= 0 or a pair (left, right) of them", repr(local_window_size))
    return int(w[0]), int(w[1])


def _padding_mask(batch, seqlen_q, seqlen_k, query_seq_lengths, key_value_seq_lengths):
    """[B, 1, T, S]: query i < query_seq_lengths[b] and key j < key_value_seq_lengths[b]."""
    keep = jnp.ones((batch, 1, seqlen_q, seqlen_k), dtype=jnp.bool_)
    for arg, lengths, axis, n in (("query_seq_lengths", query_seq_lengths, 2, seqlen_q),
                                  ("key_value_seq_lengths", key_value_seq_lengths, 3, seqlen_k)):
        if lengths is None:
            continue
        lengths = jnp.asarray(lengths)
        if lengths.dtype != jnp.int32:
            _fail(arg, "dtype int32", f"dtype {lengths.dtype}", TypeError)
        if lengths.shape != (batch,):
            _fail(arg, f"shape ({batch},)", f"shape {tuple(lengths.shape)}")
        pos = jnp.arange(n).reshape([n if a == axis else 1 for a in range(4)])
        keep = keep & (pos < lengths.reshape(batch, 1, 1, 1))
    return keep


def _check_qkv(query, key, value):
    ranks = {jnp.ndim(x) for x in (query, key, value)}
    q = _as_4d("query", query, "[B, T, N, H] or [T, N, H]")
    k = _as_4d("key", key, "[B, S, K, H] or [S, K, H]")
    v = _as_4d("value", value, "[B, S, K, H] or [S, K, H]")
    if len(ranks) != 1:
        _fail("key", f"as many dims as query ({jnp.ndim(query)})", f"{jnp.ndim(key)} (value {jnp.ndim(value)})")
    for arg, x in (("query", q), ("key", k), ("value", v)):
        if x.dtype not in _DTYPES:
            _fail(arg, "dtype float32, float64, bfloat16 or float16", f"dtype {x.dtype}", TypeError)
    for arg, x in (("key", k), ("value", v)):
        if x.dtype != q.dtype:
            _fail(arg, f"query's dtype {q.dtype}", f"dtype {x.dtype}", TypeError)
    batch, _, heads_q, head_dim = q.shape
    if k.shape[0] != batch or k.shape[3] != head_dim:
        _fail("key", f"shape [B={batch}, S, K, H={head_dim}]", f"shape {tuple(k.shape)}")
    if v.shape[:3] != k.shape[:3]:
        _fail("value", f"shape [B, S, K] = {tuple(k.shape[:3])} as key's, then H", f"shape {tuple(v.shape)}")
    if heads_q % k.shape[2] != 0:
        _fail("key", f"a head count K that divides query's N = {heads_q}", f"K = {k.shape[2]}")
    return q, k, v


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                          query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None,
                          implementation=None, return_residual=False):
    r"""jax.nn.dot_product_attention with flashgrad's forward and fused backward (CPU).

    For each batch b, query head n (key/value head n // (N // K)), query i and key j:

        S[i, j] = scale * query[b, i, n, :] . key[b, j, n // G, :] + bias[b, n, i, j]
        S[i, j] = -inf where masked: mask false, causal (j > i), outside the window
                  (j < i - left or j > i + right), i >= query_seq_lengths[b],
                  j >= key_value_seq_lengths[b]
        out[b, i, n, :] = sum_j softmax_j(S[i, :]) value[b, j, n // G, :]

    Causal and window are aligned top-left (query i at key position i), as in jax.nn.

    Args:
      query: [B, T, N, H] or [T, N, H]; float32, float64, bfloat16 or float16.
      key: [B, S, K, H] (or [S, K, H]), query's dtype; K divides N (GQA / MQA).
      value: [B, S, K, Hv], query's dtype (Hv may differ from H).
      bias: optional float array broadcastable to [B, N, T, S], added to the scores; it is
        differentiated (its gradient is summed over its broadcast dims). Size-1 T or S dims
        are broadcast to full size before the call.
      mask: optional bool array broadcastable to [B, N, T, S], True = attend. Size-1 T or
        S dims are broadcast to full size.
      scale: the scores' scale; None is 1 / sqrt(H).
      is_causal: mask keys after the query (top-left).
      query_seq_lengths, key_value_seq_lengths: optional int32 [B]; they become a bool
        [B, 1, T, S] mask.
      local_window_size: int or (left, right): query i sees keys i - left .. i + right.
      implementation: must be None (flashgrad is the implementation).
      return_residual: also return the log-sum-exp of each row, [B, T, N] (or [T, N]) in
        query's dtype, with no gradient through it.

    Returns:
      out, [B, T, N, Hv] (or [T, N, Hv]) in query's dtype; (out, lse) with return_residual.

    Masked rows: a query that sees no key gets out = 0 and lse = -inf, and passes no
    gradient (jax.nn's XLA path gives it the mean of all values instead). Bad arguments
    raise TypeError (dtypes) or ValueError naming the argument; what only the library
    checks (head dims above 512) fails at run time with the library's message.
    """
    if implementation is not None:
        _fail("implementation", "None (flashgrad is the implementation)", repr(implementation))
    squeeze = jnp.ndim(query) == 3
    q, k, v = _check_qkv(query, key, value)
    batch, seqlen_q, heads_q, head_dim = q.shape
    full = (batch, heads_q, seqlen_q, k.shape[1])
    bias4 = None if bias is None else _broadcast_4d("bias", bias, full, "bias")
    mask4 = None if mask is None else _broadcast_4d("mask", mask, full, "mask")
    if query_seq_lengths is not None or key_value_seq_lengths is not None:
        pad = _padding_mask(batch, seqlen_q, k.shape[1], query_seq_lengths, key_value_seq_lengths)
        mask4 = pad if mask4 is None else mask4 & pad
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    if not isinstance(scale, (int, float, np.floating)) or not scale > 0:
        _fail("scale", "a float > 0 or None", repr(scale))
    window = _window(local_window_size)
    flags = _Flags(float(scale), bool(is_causal), window, bool(is_causal) or window != (-1, -1),
                   _threads["n"])
    out, lse = _attention(flags, q, k, v, bias4, mask4)
    if squeeze:
        out, lse = out[0], lse[0]
    if not return_residual:
        return out
    return out, jax.lax.stop_gradient(jnp.swapaxes(lse, -1, -2).astype(q.dtype))
