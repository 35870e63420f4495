"""Array-level API: flashgrad.forward / backward on any DLPack or buffer-protocol array.

Each array is handed to the C++ library as a strided view of its own memory
(no copy, strides passed through); outputs are allocated in the caller's array
library (torch in, torch out; numpy and everything else, numpy) unless given.
"""
from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple, Optional, Sequence, Tuple

try:
    from . import _flashgrad as _ext
except ImportError as e:  # pragma: no cover - depends on how the package was put on sys.path
    raise ImportError(
        "flashgrad: the compiled module flashgrad._flashgrad was not found next to "
        f"{__file__}. Build with CMake (BUILD_DIR=build bash scripts/build.sh) and put "
        "<build>/python on PYTHONPATH; the source tree python/flashgrad has no compiled module."
    ) from e

__all__ = [
    "Grads",
    "forward",
    "backward",
    "dropout_keep_mask",
    "forward_workspace_bytes",
    "backward_workspace_bytes",
    "merge",
    "isa",
    "max_threads",
]

# flashgrad dtype name -> numpy / torch dtype name.
_NUMPY = {"f32": "float32", "f64": "float64", "f16": "float16", "u8": "uint8", "i32": "int32"}
_TORCH = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16", "u8": "uint8",
          "i32": "int32"}


def _torch_module():
    return sys.modules.get("torch")


def _is_torch(x: Any) -> bool:
    t = _torch_module()
    return t is not None and isinstance(x, t.Tensor)


def _arr(x: Any) -> Any:
    """The exportable form of x: torch tensors lose their autograd history (a view, no copy)."""
    return x.detach() if _is_torch(x) else x


def _describe(x: Any) -> Tuple[Tuple[int, ...], str]:
    shape, _, dtype = _ext.describe(x)
    return shape, dtype


def _empty(like: Any, shape: Sequence[int], dtype: str, fn: str, arg: str) -> Any:
    """A new array in like's array library (torch or numpy)."""
    if _is_torch(like):
        t = _torch_module()
        return t.empty(tuple(shape), dtype=getattr(t, _TORCH[dtype]), device=like.device)
    if dtype in _NUMPY:
        import numpy as np

        return np.empty(tuple(shape), dtype=_NUMPY[dtype])
    raise TypeError(f"flashgrad.{fn}: argument '{arg}': expected a preallocated array for dtype "
                    f"{dtype} (numpy has no {dtype}), got None")


def _options(fn: str, softmax_scale, causal, window_size, softcap, alibi_slopes, bias, mask, sinks,
             cu_seqlens_q, cu_seqlens_k, dropout_p, seed, offset, num_threads, block=None) -> dict:
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
            raise TypeError(f"flashgrad.{fn}: argument 'softmax_scale': expected a float or None, "
                            f"got {type(softmax_scale).__name__}")
        # The library reads <= 0 as "use the default"; an explicit one is a mistake here.
        if not (softmax_scale > 0 and math.isfinite(softmax_scale)):
            raise ValueError(f"flashgrad.{fn}: argument 'softmax_scale': expected a finite value > 0 "
                             f"or None, got {softmax_scale}")
    try:
        left, right = window_size
        left, right = int(left), int(right)
        if left != window_size[0] or right != window_size[1]:
            raise TypeError
    except (TypeError, ValueError):
        raise TypeError(f"flashgrad.{fn}: argument 'window_size': expected a pair of ints "
                        f"(left, right), got {window_size!r}") from None
    for name, val in (("seed", seed), ("offset", offset)):
        if isinstance(val, bool) or not isinstance(val, int) or not 0 <= val < 2**64:
            raise ValueError(f"flashgrad.{fn}: argument '{name}': expected an int in [0, 2**64), got {val!r}")
    return {
        "softmax_scale": softmax_scale,
        "causal": bool(causal),
        "window_left": left,
        "window_right": right,
        "softcap": float(softcap),
        "alibi_slopes": None if alibi_slopes is None else _arr(alibi_slopes),
        "bias": None if bias is None else _arr(bias),
        "mask": None if mask is None else _arr(mask),
        "sinks": None if sinks is None else _arr(sinks),
        "cu_seqlens_q": None if cu_seqlens_q is None else _arr(cu_seqlens_q),
        "cu_seqlens_k": None if cu_seqlens_k is None else _arr(cu_seqlens_k),
        "dropout_p": float(dropout_p),
        "seed": seed,
        "offset": offset,
        "num_threads": int(num_threads),
        "block": _block(fn, block),
    }


def _block(fn: str, block):
    """None, or block's four ints (q_offset, k_offset, seqlen_q_total, seqlen_k_total)."""
    if block is None:
        return None
    try:
        vals = tuple(int(x) for x in block)
        if len(vals) != 4 or any(isinstance(x, bool) or int(x) != x for x in block):
            raise TypeError
    except (TypeError, ValueError):
        raise TypeError(f"flashgrad.{fn}: argument 'block': expected 4 ints (q_offset, k_offset, "
                        f"seqlen_q_total, seqlen_k_total) or None, got {block!r}") from None
    return vals


def _shapes(fn: str, q, v, varlen: bool):
    """(out shape, lse shape, dtype of q, accumulator dtype) from q and v."""
    qs, qdt = _describe(q)
    vs, _ = _describe(v)
    rank = 3 if varlen else 4
    if len(qs) != rank or len(vs) != rank:
        layout = "[total, heads, head_dim]" if varlen else "[batch, seqlen, heads, head_dim]"
        bad, shape = ("q", qs) if len(qs) != rank else ("v", vs)
        raise ValueError(f"flashgrad.{fn}: argument '{bad}': expected {rank} dimensions {layout}, "
                         f"got shape {list(shape)}")
    out_shape = tuple(qs[:-1]) + (vs[-1],)
    lse_shape = (qs[1], qs[0]) if varlen else (qs[0], qs[2], qs[1])
    acc = "f64" if qdt == "f64" else "f32"
    return out_shape, lse_shape, qdt, acc


def forward(q, k, v, *, out=None, lse=None, softmax_scale: Optional[float] = None,
            causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
            alibi_slopes=None, bias=None, mask=None, sinks=None, cu_seqlens_q=None,
            cu_seqlens_k=None, dropout_p: float = 0.0, seed: int = 0, offset: int = 0,
            num_threads: int = 0, block=None):
    """Exact attention forward: returns (out, lse).

    For every batch b and query head h (key/value head h // (heads_q // heads_kv))::

        S[i, j] = softmax_scale * q[b, i, h] . k[b, j, hk]
        S       = softcap * tanh(S / softcap)                 (softcap > 0)
        S      += -alibi_slopes[h] * |i + seqlen_k - seqlen_q - j|
        S      += bias[b, h, i, j];  S = -inf where masked (causal, window, mask == 0)
        lse[i]  = log(sum_j exp(S[i, j]) + exp(sinks[h]))    (sink term only with sinks)
        out[i]  = sum_j dropout(exp(S[i, j] - lse[i])) * v[b, j, hk]

    Arguments:
        q: (batch, seqlen_q, heads_q, head_dim), or (total_q, heads_q, head_dim) with cu_seqlens.
        k: (batch, seqlen_k, heads_kv, head_dim); heads_kv divides heads_q (MQA/GQA).
        v: (batch, seqlen_k, heads_kv, head_dim_v). q, k, v: one dtype of float32, float64,
            float16 or bfloat16 (bfloat16 through DLPack, e.g. torch). Any strides.
        out: optional output (batch, seqlen_q, heads_q, head_dim_v), q's dtype; written.
        lse: optional output (batch, heads_q, seqlen_q) (or (heads_q, total_q)), float32
            (float32 or float64 for float64 inputs); written. New arrays are float32, or
            float64 for float64 inputs.
        softmax_scale: > 0, default 1 / sqrt(head_dim).
        causal: mask aligned bottom-right (query i sees keys j <= i + seqlen_k - seqlen_q).
        window_size: (left, right) local attention around the same diagonal; -1 is unbounded.
        softcap: > 0 activates S = softcap * tanh(S / softcap).
        alibi_slopes: float32 (heads_q,) or (batch, heads_q).
        bias: additive, float32/float16/bfloat16, broadcastable (batch|1, heads_q|1, seqlen_q|1, seqlen_k|1).
        mask: uint8/bool of the same broadcast shape, nonzero = attend.
        sinks: float32 (heads_q,), one extra logit per head in the softmax denominator.
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) offsets of packed variable-length sequences.
        dropout_p, seed, offset: dropout probability and its counter-based RNG key.
        num_threads: 0 = all cores. Results are bitwise identical for any value.
        block: (q_offset, k_offset, seqlen_q_total, seqlen_k_total) makes the call one block of a
            longer attention (ring attention, chunked prefill): query i is global row q_offset + i
            of seqlen_q_total and key j is global key k_offset + j of seqlen_k_total, so causal,
            window, ALiBi and dropout act as on the whole; lse is that of the block's keys alone,
            and merge() combines blocks. Not with cu_seqlens.
    Return:
        (out, lse). A masked row (no visible key) has out = 0 and lse = -inf (sinks[h] with sinks).
    Raises:
        TypeError for a wrong dtype or a non-array, ValueError for any other invalid argument,
        with the library's message ("flashgrad::forward: argument 'k': expected ..., got ...").
    """
    fn = "forward"
    opts = _options(fn, softmax_scale, causal, window_size, softcap, alibi_slopes, bias, mask, sinks,
                    cu_seqlens_q, cu_seqlens_k, dropout_p, seed, offset, num_threads, block)
    q, k, v = _arr(q), _arr(k), _arr(v)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    out_shape, lse_shape, qdt, acc = _shapes(fn, q, v, varlen)
    out = _empty(q, out_shape, qdt, fn, "out") if out is None else _arr(out)
    lse = _empty(q, lse_shape, acc, fn, "lse") if lse is None else _arr(lse)
    _ext.forward(opts, q, k, v, out, lse)
    return out, lse


class Grads(NamedTuple):
    """Gradients of sum(out * dout): dq, dk, dv like q, k, v; dsinks (heads_q,) when sinks were
    given, else None; dbias (the shape of bias) when requested, else None."""

    dq: Any
    dk: Any
    dv: Any
    dsinks: Any = None
    dbias: Any = None


def backward(q, k, v, out, lse, dout, *, dq=None, dk=None, dv=None, dsinks=None, dbias=None,
             return_dbias: bool = False, softmax_scale: Optional[float] = None, causal: bool = False,
             window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
             bias=None, mask=None, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None,
             dropout_p: float = 0.0, seed: int = 0, offset: int = 0, num_threads: int = 0,
             block=None) -> Grads:
    """Fused attention backward: gradients of sum(out * dout), returned as Grads(dq, dk, dv, dsinks, dbias).

    The options must be those of the forward() that produced out and lse (same dropout seed and
    offset). The backward recomputes P tile by tile from q, k and lse; nothing of size
    seqlen_q * seqlen_k is stored, except dbias when it is asked for.

    Arguments:
        q, k, v, out, lse: as in forward(); out and lse from that forward.
        dout: gradient of the loss w.r.t. out, out's shape and dtype, any strides.
        dq, dk, dv: optional outputs shaped like q, k, v (their dtype); overwritten.
        dsinks: optional output (heads_q,) float32 (float64 allowed for float64 inputs); computed
            whenever sinks are given.
        dbias: optional output with bias's shape, float32 (float64 allowed for float64 inputs),
            summed over bias's broadcast batch/head dims; bias must not broadcast over seqlen.
        return_dbias: allocate and compute dbias when it is not given.
        block: as in forward(); out and lse are then the whole attention's (merged over every
            block), so the gradients are this block's parts of the whole's, to be summed.
        Other arguments: as in forward().
    Raises:
        TypeError / ValueError with the library's message, as forward().
    """
    fn = "backward"
    opts = _options(fn, softmax_scale, causal, window_size, softcap, alibi_slopes, bias, mask, sinks,
                    cu_seqlens_q, cu_seqlens_k, dropout_p, seed, offset, num_threads, block)
    q, k, v, out, lse, dout = (_arr(x) for x in (q, k, v, out, lse, dout))
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    _, _, qdt, acc = _shapes(fn, q, v, varlen)
    g = _grad_outputs(fn, opts, q, k, v, qdt, acc, Grads(dq, dk, dv, dsinks, dbias), return_dbias)
    _ext.backward(opts, q, k, v, out, lse, dout, *g)
    return g


def _grad_outputs(fn: str, opts: dict, q, k, v, qdt: str, acc: str, given: "Grads", return_dbias: bool) -> "Grads":
    """The gradients' arrays: those given, else new ones like q, k, v (dsinks with sinks, dbias on request)."""
    dq = _empty(q, _describe(q)[0], qdt, fn, "dq") if given.dq is None else _arr(given.dq)
    dk = _empty(q, _describe(k)[0], qdt, fn, "dk") if given.dk is None else _arr(given.dk)
    dv = _empty(q, _describe(v)[0], qdt, fn, "dv") if given.dv is None else _arr(given.dv)
    dsinks, dbias = given.dsinks, given.dbias
    if dsinks is None and opts["sinks"] is not None:
        dsinks = _empty(q, _describe(opts["sinks"])[0], acc, fn, "dsinks")
    elif dsinks is not None:
        dsinks = _arr(dsinks)
    if dbias is None and return_dbias:
        if opts["bias"] is None:
            raise ValueError(f"flashgrad.{fn}: argument 'return_dbias': expected a bias when dbias is "
                             "requested, got bias=None")
        dbias = _empty(q, _describe(opts["bias"])[0], acc, fn, "dbias")
    elif dbias is not None:
        dbias = _arr(dbias)
    return Grads(dq, dk, dv, dsinks, dbias)


def dropout_keep_mask(batch: int, heads_q: int, seqlen_q: int, seqlen_k: int, *, dropout_p: float,
                      seed: int = 0, offset: int = 0, out=None):
    """The dropout keep mask the kernels use: uint8 (batch, heads_q, seqlen_q, seqlen_k), 1 = kept.

    Keep decisions are a counter-based function of (seed, offset, b, h, i, j); with
    cu_seqlens, i and j are positions inside each sequence (pad to the longest).
    out: optional contiguous uint8 array of that shape (numpy or torch); else a new numpy array.
    """
    fn = "dropout_keep_mask"
    opts = _options(fn, None, False, (-1, -1), 0.0, None, None, None, None, None, None, dropout_p,
                    seed, offset, 0)
    opts = {key: opts[key] for key in ("dropout_p", "seed", "offset")}
    if out is None:
        import numpy as np

        out = np.empty((batch, heads_q, seqlen_q, seqlen_k), dtype=np.uint8)
    _ext.dropout_keep_mask(opts, int(batch), int(heads_q), int(seqlen_q), int(seqlen_k), _arr(out))
    return out


def _workspace(fn: str, ext_fn, q, k, v, kw) -> int:
    opts = _options(fn, kw.pop("softmax_scale", None), kw.pop("causal", False),
                    kw.pop("window_size", (-1, -1)), kw.pop("softcap", 0.0),
                    kw.pop("alibi_slopes", None), kw.pop("bias", None), kw.pop("mask", None),
                    kw.pop("sinks", None), kw.pop("cu_seqlens_q", None), kw.pop("cu_seqlens_k", None),
                    kw.pop("dropout_p", 0.0), kw.pop("seed", 0), kw.pop("offset", 0),
                    kw.pop("num_threads", 0))
    if kw:
        raise TypeError(f"flashgrad.{fn}: unexpected keyword argument '{next(iter(kw))}'")
    return ext_fn(opts, _arr(q), _arr(k), _arr(v))


def forward_workspace_bytes(q, k, v, **options) -> int:
    """Bytes of workspace forward() allocates for these inputs and options (as forward())."""
    return _workspace("forward_workspace_bytes", _ext.forward_workspace_bytes, q, k, v, options)


def backward_workspace_bytes(q, k, v, **options) -> int:
    """Bytes of workspace backward() allocates for these inputs and options (as forward())."""
    return _workspace("backward_workspace_bytes", _ext.backward_workspace_bytes, q, k, v, options)


def merge(o_acc, lse_acc, o_part, lse_part, *, num_threads: int = 0) -> None:
    """Merges the attention of the same queries over a second, disjoint set of keys into an
    accumulator, in place::

        lse     = log(exp(lse_acc) + exp(lse_part))
        o_acc   = exp(lse_acc - lse) * o_acc + exp(lse_part - lse) * o_part;  lse_acc = lse

    o_acc (batch, seqlen, heads, head_dim_v) and lse_acc (batch, heads, seqlen) are written;
    o_part and lse_part have the same shapes. All four float32, or all four float64; any strides.
    A part row with lse_part = -inf (it saw no key) leaves the accumulator row as it is; an
    accumulator row at lse_acc = -inf takes the part as it is. The same rounding as the ring
    layer and the core's split-key path (one merge function in the library).
    """
    _ext.merge(_arr(o_acc), _arr(lse_acc), _arr(o_part), _arr(lse_part), int(num_threads))


def isa() -> str:
    """The kernel path in use: "amx", "avx512bf16", "avx512", "avx2" or "scalar" (FLASHGRAD_ISA forces one)."""
    return _ext.isa()


def max_threads() -> int:
    """Threads the library uses when num_threads = 0."""
    return _ext.max_threads()


def use_openmp_runtime(library: str) -> None:
    """Runs every later call's tasks on the threads of the OpenMP runtime in the shared library at
    `library` (the host framework's libgomp; "" goes back to flashgrad's own pool), so that
    flashgrad's workers do not compete with the host's idle OpenMP threads for the cores.
    flashgrad.torch does this with PyTorch's runtime at import."""
    _ext.use_openmp_runtime(str(library))


def thread_runner() -> str:
    """Where calls' tasks run: "flashgrad" (its own pool) or "openmp <library>"."""
    return _ext.thread_runner()
