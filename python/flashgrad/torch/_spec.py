"""One call's description (Spec) and the only code that runs flashgrad's kernels on torch tensors.

Both autograd routes use it: torch.autograd.Function on torch < 2.4 (_autograd.py) and the
torch.library custom ops on torch >= 2.4 (_ops.py). Tensors reach the library as strided views
of their own memory: layouts (BHSD, packed qkv, non-contiguous) are views, never copies.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

from .._core import _ext

_BIAS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what the library reads


def _separate(t):
    return tuple(t)


def _qkv_packed(t):
    (qkv,) = t
    return qkv.select(-3, 0), qkv.select(-3, 1), qkv.select(-3, 2)


def _kv_packed(t):
    q, kv = t
    return q, kv.select(-3, 0), kv.select(-3, 1)


def _identity(x):
    return x


def _bhsd_to_lib(x):
    return x.transpose(1, 2)  # (N, H, L, E) -> (N, L, H, E), a view


def _nse_to_lib(x):
    return x.unsqueeze(2)  # (N, L, E) -> (N, L, 1, E), a view


# layout -> (unpack: the caller's inputs -> q, k, v views; to_lib: a q/k/v/out view in the
# library's (batch, seqlen, heads, dim) or (total, heads, dim) order; pack_dims[i]: the dim of
# inputs[i] that stacks q/k/v, or None).
LAYOUTS: Dict[str, Tuple[Callable, Callable, Tuple[Optional[int], ...]]] = {
    "bshd": (_separate, _identity, (None, None, None)),   # flash-attn; varlen (total, H, D) too
    "bhsd": (_separate, _bhsd_to_lib, (None, None, None)),  # torch SDPA (N, H, L, E)
    "nse": (_separate, _nse_to_lib, (None, None, None)),    # torch SDPA (N, L, E)
    "qkv": (_qkv_packed, _identity, (-3,)),                 # (..., 3, H, D)
    "kv": (_kv_packed, _identity, (None, -3)),              # q, (..., 2, H, D)
}


class Spec:
    """Everything about one call that is not a differentiable tensor.

    layout: a key of LAYOUTS. opts: the library's options (scale, causal, window, softcap,
    alibi, mask, cu_seqlens, dropout_p, seed, offset, num_threads). key_limit: only the first
    key_limit keys take part (torch's top-left causal with seqlen_q < seqlen_k), or None.
    """

    def __init__(self, fn: str, layout: str, opts: dict, key_limit: Optional[int] = None):
        self.fn = fn
        self.layout = layout
        self.unpack, self.to_lib, self.pack_dims = LAYOUTS[layout]
        self.opts = opts
        self.key_limit = key_limit
        self.varlen = opts.get("cu_seqlens_q") is not None

    def lib_qkv(self, tensors) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = (self.to_lib(x) for x in self.unpack(tensors))
        if self.key_limit is not None:
            k, v = k.narrow(1, 0, self.key_limit), v.narrow(1, 0, self.key_limit)
        return q, k, v

    def bias_grad_shape(self, bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> Tuple[int, ...]:
        """dbias's shape in the library: bias's (4-D), with its seqlen dims full, since the
        library's dbias does not broadcast over seqlen (run_backward sums them back). q, k: the
        library's views; with varlen, full means the longest sequence."""
        if self.varlen:
            lengths = [int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0
                       for cu in (self.opts["cu_seqlens_q"], self.opts["cu_seqlens_k"])]
        else:
            lengths = [q.shape[1], k.shape[1]]
        return (bias.shape[0], bias.shape[1], lengths[0] if bias.shape[2] == 1 else bias.shape[2],
                lengths[1] if bias.shape[3] == 1 else bias.shape[3])

    def new_grad(self, x: torch.Tensor, pack_dim: Optional[int]) -> torch.Tensor:
        """A gradient buffer for input x, in a layout the library can write directly."""
        if pack_dim is None:
            # Keeps x's strides when x is dense (BHSD views stay views). With a key limit the
            # keys past it are not written, and their gradient is zero.
            return torch.zeros_like(x) if self.key_limit is not None else torch.empty_like(x)
        # Packed q/k/v: stack them outermost, so that each slice is one block of memory (the
        # library rejects outputs whose address ranges overlap, even if no element is shared).
        d = pack_dim % x.dim()
        shape = (x.shape[d],) + x.shape[:d] + x.shape[d + 1:]
        return torch.empty(shape, dtype=x.dtype, device=x.device).movedim(0, d)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 inputs keep a float64 lse (and dsinks/dbias), so gradients keep float64 accuracy."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _lse_shape(q: torch.Tensor, varlen: bool) -> Tuple[int, ...]:
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def _d(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """What the library reads: the same memory without autograd history."""
    return None if x is None else x.detach()


def _side_inputs(spec: Spec, bias, sinks) -> dict:
    opts = dict(spec.opts)
    if bias is not None:
        opts["bias"] = _d(bias) if bias.dtype in _BIAS_DTYPES else _d(bias).float()
    if sinks is not None:
        opts["sinks"] = _d(sinks) if sinks.dtype == torch.float32 else _d(sinks).float()
    return opts


def _sum_to(grad: torch.Tensor, shape) -> torch.Tensor:
    """grad summed over the dims where shape is 1 (a bias broadcast over seqlen), in float64:
    closer to the exact sum than float32 summed down each column, as autograd would."""
    dims = [d for d in range(grad.dim()) if shape[d] == 1 and grad.shape[d] != 1]
    return grad.sum(dims, keepdim=True, dtype=torch.float64) if dims else grad


def new_outputs(spec: Spec, inputs: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out in the caller's layout, lse), allocated and not written."""
    q_user, _, v_user = spec.unpack(inputs)
    q, _, _ = spec.lib_qkv(inputs)
    out = torch.empty(q_user.shape[:-1] + v_user.shape[-1:], dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, spec.varlen), dtype=acc_dtype(q.dtype), device=q.device)
    return out, lse


def run_forward(spec: Spec, inputs: Sequence[torch.Tensor], bias, sinks):
    """flashgrad's forward: returns (out in the caller's layout, lse)."""
    det = [_d(x) for x in inputs]
    out, lse = new_outputs(spec, det)
    q, k, v = spec.lib_qkv(det)
    _ext.forward(_side_inputs(spec, bias, sinks), q, k, v, spec.to_lib(out), lse)
    return out, lse


def new_grads(spec: Spec, inputs: Sequence[torch.Tensor]):
    """Gradient buffers like inputs, allocated and not written."""
    return [spec.new_grad(x, pd) for x, pd in zip(inputs, spec.pack_dims)]


def run_backward(spec: Spec, inputs: Sequence[torch.Tensor], out, lse, dout, bias, sinks,
                 need_dbias: bool, need_dsinks: bool):
    """flashgrad's fused backward: returns (grads like inputs, dsinks or None, dbias or None),
    dsinks and dbias in the dtype and shape of sinks and bias."""
    det = [_d(x) for x in inputs]
    q, k, v = spec.lib_qkv(det)
    grads = new_grads(spec, det)
    dq, dk, dv = spec.lib_qkv(grads)
    acc = acc_dtype(q.dtype)
    dsinks = None if sinks is None else torch.empty(sinks.shape, dtype=acc, device=q.device)
    dbias, bias_lib = None, _d(bias)
    if bias is not None and need_dbias:
        bias_lib = bias_lib.expand(spec.bias_grad_shape(bias, q, k))
        dbias = torch.empty(bias_lib.shape, dtype=acc, device=q.device)
    _ext.backward(_side_inputs(spec, bias_lib, sinks), q, k, v, spec.to_lib(_d(out)), _d(lse),
                  spec.to_lib(_d(dout)), dq, dk, dv, dsinks, dbias)
    if dbias is not None:
        dbias = _sum_to(dbias, bias.shape).to(bias.dtype)
    if dsinks is not None:
        dsinks = dsinks.to(sinks.dtype) if need_dsinks else None
    return grads, dsinks, dbias


# The arguments of a call besides its inputs, bias and sinks, in the custom ops' schema order.
OP_TENSORS = ("alibi_slopes", "mask", "cu_seqlens_q", "cu_seqlens_k", "rng")
OP_SCALARS = ("layout", "key_limit", "softmax_scale", "causal", "window_left", "window_right", "softcap",
              "dropout_p", "num_threads")


def spec_from_args(fn: str, args: dict) -> Spec:
    """The Spec of a call's OP_TENSORS and OP_SCALARS (key_limit -1: none; rng: an int64
    (seed, offset) pair or None)."""
    rng = args["rng"]
    seed, offset = (0, 0) if rng is None or args["dropout_p"] == 0 else (int(x) for x in rng.tolist())
    opts = {name: args[name] for name in OP_TENSORS[:-1] + OP_SCALARS[2:]}
    opts.update(seed=seed, offset=offset)
    return Spec(fn, args["layout"], opts, None if args["key_limit"] < 0 else args["key_limit"])
