"""Argument checks and preparation shared by the flash-attn and SDPA entry points."""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch

from . import _autograd, _spec
from ._autograd import FlashAttention
from ._spec import spec_from_args

# torch >= 2.4 has flashgrad as custom ops, which torch.compile and torch.export trace.
_ops = None
if hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_autograd"):
    from . import _ops


def _traced(inputs) -> bool:
    """Whether this call is being traced (torch.compile, torch.export, fake or functional
    tensors): then it goes through the custom op. Eager calls take the autograd.Function, the
    same kernels without the op's Python dispatch (about 0.2 ms a call, python/README.md)."""
    if _ops is None:
        return False
    return torch.compiler.is_compiling() or any(type(x) not in (torch.Tensor, torch.nn.Parameter) for x in inputs)

_FLOAT = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def fail(fn: str, arg: str, expected: str, got: str, type_error: bool = False):
    cls = TypeError if type_error else ValueError
    raise cls(f"flashgrad.torch.{fn}: argument '{arg}': expected {expected}, got {got}")


def check_tensor(fn: str, arg: str, x, ndim: Optional[int] = None, layout: str = "") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        fail(fn, arg, "a torch.Tensor", type(x).__name__, type_error=True)
    if x.device.type != "cpu":
        fail(fn, arg, "a CPU tensor", f"device {x.device}")
    if ndim is not None and x.dim() != ndim:
        fail(fn, arg, f"{ndim} dimensions {layout}".rstrip(), f"shape {list(x.shape)}")
    return x


def check_packed(fn: str, arg: str, x: torch.Tensor, dim: int, n: int) -> None:
    if x.shape[dim] != n:
        fail(fn, arg, f"size {n} in dim {dim % x.dim()} (the stacked {'q, k, v' if n == 3 else 'k, v'})",
             f"shape {list(x.shape)}")


def _to_4d(fn: str, arg: str, t: torch.Tensor) -> torch.Tensor:
    if not 1 <= t.dim() <= 4:
        fail(fn, arg, "1 to 4 dimensions broadcastable to (batch, nheads, seqlen_q, seqlen_k)",
             f"shape {list(t.shape)}")
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t


def prepare_bias(fn: str, arg: str, bias, full: Sequence[int], varlen_max: Optional[Tuple[int, int]]):
    """bias -> a 4-D differentiable view of the caller's tensor (no copy)."""
    if bias is None:
        return None
    check_tensor(fn, arg, bias)
    if bias.dtype not in _FLOAT:
        fail(fn, arg, "a floating dtype (float32, float64, bfloat16, float16)", f"dtype {bias.dtype}",
             type_error=True)
    return _fit_varlen(_to_4d(fn, arg, bias), full, varlen_max)


def prepare_mask(fn: str, arg: str, mask, full: Sequence[int], varlen_max: Optional[Tuple[int, int]]):
    """bool/uint8 mask -> 4-D uint8 view of the caller's memory (no copy)."""
    if mask is None:
        return None
    check_tensor(fn, arg, mask)
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)
    elif mask.dtype != torch.uint8:
        fail(fn, arg, "dtype torch.bool or torch.uint8 (True/nonzero = attend)", f"dtype {mask.dtype}",
             type_error=True)
    return _fit_varlen(_to_4d(fn, arg, mask.detach()), full, varlen_max)


def _fit_varlen(t: torch.Tensor, full: Sequence[int], varlen_max: Optional[Tuple[int, int]]):
    # Varlen bias/mask may be sized by the caller's max_seqlen_q/k; the library indexes them up to
    # the longest actual sequence, so take that leading part (a view).
    if varlen_max is not None:
        for dim, (given, actual) in ((2, (varlen_max[0], full[2])), (3, (varlen_max[1], full[3]))):
            if t.shape[dim] == given and given != actual and t.shape[dim] != 1:
                t = t.narrow(dim, 0, actual)
    return t


def check_scale(fn: str, arg: str, scale) -> Optional[float]:
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        fail(fn, arg, "a float or None", type(scale).__name__, type_error=True)
    if not (scale > 0 and math.isfinite(scale)):
        fail(fn, arg, "a finite value > 0 or None", repr(scale))
    return float(scale)


def check_window(fn: str, window_size) -> Tuple[int, int]:
    try:
        left, right = window_size
        if isinstance(left, bool) or isinstance(right, bool):
            raise TypeError
        if int(left) != left or int(right) != right:
            raise TypeError
        return int(left), int(right)
    except (TypeError, ValueError):
        fail(fn, "window_size", "a pair of ints (left, right)", repr(window_size), type_error=True)


def check_float(fn: str, arg: str, x) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        fail(fn, arg, "a float", type(x).__name__, type_error=True)
    return float(x)


def varlen_info(fn: str, cu_q, cu_k, max_q, max_k):
    """(batch, longest actual q, longest actual k) from int32 cu_seqlens; checks max_seqlen_*."""
    for arg, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        check_tensor(fn, arg, cu)
        if cu.dtype != torch.int32:
            fail(fn, arg, "dtype torch.int32", f"dtype {cu.dtype}", type_error=True)
        if cu.dim() != 1 or cu.numel() < 1:
            fail(fn, arg, "shape (batch_size + 1,)", f"shape {list(cu.shape)}")
    for arg, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            fail(fn, arg, "an int >= 0", repr(m), type_error=not isinstance(m, int))
    if cu_q.numel() != cu_k.numel():
        fail(fn, "cu_seqlens_k", f"shape ({cu_q.numel()},) like cu_seqlens_q", f"shape {list(cu_k.shape)}")
    # Offsets that decrease are the library's to report (with its message); skip our checks then.
    lq = int((cu_q[1:] - cu_q[:-1]).clamp(min=0).max()) if cu_q.numel() > 1 else 0
    lk = int((cu_k[1:] - cu_k[:-1]).clamp(min=0).max()) if cu_k.numel() > 1 else 0
    if bool((cu_q[1:] < cu_q[:-1]).any()) or bool((cu_k[1:] < cu_k[:-1]).any()):
        return cu_q.numel() - 1, lq, lk
    if lq > max_q:
        fail(fn, "max_seqlen_q", f"at least the longest query sequence, {lq}", str(max_q))
    if lk > max_k:
        fail(fn, "max_seqlen_k", f"at least the longest key sequence, {lk}", str(max_k))
    return cu_q.numel() - 1, lq, lk


def attend(fn: str, inputs, layout: str, *, dropout_p, softmax_scale, causal, window_size, softcap,
           alibi_slopes, attn_bias, attn_mask, sinks, varlen=None, return_attn_probs=False,
           key_limit=None):
    """Checks the options, prepares bias/mask/sinks, runs the forward with flashgrad's backward
    as its gradient: the custom op when traced (_traced), else FlashAttention.

    layout: a layout name of _spec.py. varlen: None or (cu_seqlens_q, cu_seqlens_k,
    max_seqlen_q, max_seqlen_k). Returns out, or (out, softmax_lse float32, S_dmask or None)
    when return_attn_probs.
    """
    dropout_p = check_float(fn, "dropout_p", dropout_p)
    softcap = check_float(fn, "softcap", softcap)
    scale = check_scale(fn, "softmax_scale", softmax_scale)
    left, right = check_window(fn, window_size)
    unpack, to_lib = _spec.LAYOUTS[layout][:2]
    q, k, _ = (to_lib(x) for x in unpack(inputs))
    for arg, x in (("q", q), ("k", k)):
        if x.dtype not in _FLOAT:
            fail(fn, arg, "dtype float32, float64, bfloat16 or float16", f"dtype {x.dtype}", type_error=True)
    if varlen is not None:
        cu_q, cu_k, max_q, max_k = varlen
        batch, lq, lk = varlen_info(fn, cu_q, cu_k, max_q, max_k)
        full, vmax = (batch, q.shape[1], lq, lk), (max_q, max_k)
    else:
        batch, lq = q.shape[0], q.shape[1]
        lk = k.shape[1] if key_limit is None else key_limit
        full, vmax = (batch, q.shape[2], lq, lk), None
        max_q, max_k = lq, lk
    if alibi_slopes is not None:
        check_tensor(fn, "alibi_slopes", alibi_slopes)
    if sinks is not None:
        check_tensor(fn, "sinks", sinks)
        if sinks.dtype not in _FLOAT:
            fail(fn, "sinks", "a floating dtype (float32 preferred)", f"dtype {sinks.dtype}", type_error=True)
    bias = prepare_bias(fn, "attn_bias", attn_bias, full, vmax)
    mask = prepare_mask(fn, "attn_mask", attn_mask, full, vmax)
    args = {
        "alibi_slopes": None if alibi_slopes is None else alibi_slopes.detach(), "mask": mask,
        "cu_seqlens_q": None if varlen is None else varlen[0],
        "cu_seqlens_k": None if varlen is None else varlen[1],
        "rng": _autograd.dropout_rng() if dropout_p > 0 else None,
        "layout": layout, "key_limit": -1 if key_limit is None else key_limit,
        "softmax_scale": scale, "causal": bool(causal), "window_left": left, "window_right": right,
        "softcap": softcap, "dropout_p": dropout_p, "num_threads": _autograd.get_num_threads(),
    }
    if _traced(inputs):
        out, lse = _ops.call(args, inputs, bias, sinks)
    else:
        out, lse = FlashAttention.apply(spec_from_args(fn, args), bias, sinks, *inputs)
    if not return_attn_probs:
        return out
    s_dmask = None
    if dropout_p > 0:
        spec = spec_from_args(fn, args)
        probs = _autograd.attention_probs(spec, inputs, bias, sinks, batch, max_q, max_k)
        keep = torch.empty(probs.shape, dtype=torch.uint8)
        _autograd._ext.dropout_keep_mask({name: spec.opts[name] for name in ("dropout_p", "seed", "offset")},
                                         batch, probs.shape[1], max_q, max_k, keep)
        s_dmask = torch.where(keep.bool(), probs, -probs)
    return out, lse.float(), s_dmask

