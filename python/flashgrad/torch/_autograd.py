"""The one torch.autograd.Function behind every flashgrad.torch entry point.

forward runs flashgrad's forward; backward runs flashgrad's fused backward
(compute_delta, dK/dV, dQ in the library), never a decomposed one. Tensors
reach the library as strided views of their own memory: layouts (BHSD, packed
qkv, non-contiguous) are expressed as views, never as copies.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import torch
from torch.autograd.function import once_differentiable

from .._core import _ext

_BIAS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what the library reads

_num_threads = 0


def set_num_threads(n: int) -> None:
    """Threads flashgrad.torch uses (0, the default: all cores). Results do not depend on it."""
    global _num_threads
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"flashgrad.torch.set_num_threads: argument 'n': expected an int >= 0, got {n!r}")
    _num_threads = n


def get_num_threads() -> int:
    """The value set by set_num_threads (0: all cores)."""
    return _num_threads


def _d(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """What the library reads: the same memory without autograd history."""
    return None if x is None else x.detach()


class Spec:
    """Everything about one call that is not a differentiable tensor.

    unpack(inputs) -> (q, k, v) in the caller's layout, as views;
    to_lib(x) -> the view of a caller-layout q/k/v/out tensor in the library's
        (batch, seqlen, heads, dim) or (total, heads, dim) layout;
    pack_dims[i] -> the dim of inputs[i] that stacks q/k/v (packed inputs) or None;
    key_limit -> only the first key_limit keys take part (torch's top-left causal).
    opts -> the library's options (window, causal, mask, alibi, cu_seqlens, dropout RNG, ...).
    bias_grad_shape -> the shape of dbias in the library (bias's, with seqlen dims full).
    """

    def __init__(self, fn: str, opts: dict, unpack: Callable, to_lib: Callable,
                 pack_dims: Sequence[Optional[int]], key_limit: Optional[int] = None,
                 bias_grad_shape: Optional[Tuple[int, ...]] = None):
        self.fn = fn
        self.opts = opts
        self.unpack = unpack
        self.to_lib = to_lib
        self.pack_dims = tuple(pack_dims)
        self.key_limit = key_limit
        self.varlen = opts.get("cu_seqlens_q") is not None
        self.bias_grad_shape = bias_grad_shape

    def lib_qkv(self, tensors) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = (self.to_lib(x) for x in self.unpack(tensors))
        if self.key_limit is not None:
            k, v = k.narrow(1, 0, self.key_limit), v.narrow(1, 0, self.key_limit)
        return q, k, v

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


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    # float64 inputs keep a float64 lse (and dsinks/dbias), so that gradients keep float64 accuracy.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _lse_shape(q: torch.Tensor, varlen: bool) -> Tuple[int, ...]:
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def _side_inputs(spec: Spec, bias, sinks) -> dict:
    opts = dict(spec.opts)
    if bias is not None:
        opts["bias"] = _d(bias) if bias.dtype in _BIAS_DTYPES else _d(bias).float()
    if sinks is not None:
        opts["sinks"] = _d(sinks) if sinks.dtype == torch.float32 else _d(sinks).float()
    return opts


def _sum_to(grad: torch.Tensor, shape) -> torch.Tensor:
    """grad summed over the dims where shape is 1 (a bias broadcast over seqlen), in float64.
    Autograd's float32 sum of an expanded view runs down each column in order; summed in
    float64, a float32 dbias of a (2, 1, 1, 129) bias over 4 heads x 65 rows came out with a
    largest error of at most 2.69x the float32 math path's over 60 seeds, against 3.18x."""
    dims = [d for d in range(grad.dim()) if shape[d] == 1 and grad.shape[d] != 1]
    return grad.sum(dims, keepdim=True, dtype=torch.float64) if dims else grad


class FlashAttention(torch.autograd.Function):
    """forward(ctx, spec, bias, sinks, *inputs) -> (out, lse); gradients for bias, sinks, inputs."""

    @staticmethod
    def forward(ctx, spec: Spec, bias, sinks, *inputs):
        det = [_d(x) for x in inputs]
        q, k, v = spec.lib_qkv(det)
        q_user, _, v_user = spec.unpack(det)
        out_user = torch.empty(q_user.shape[:-1] + v_user.shape[-1:], dtype=q.dtype, device=q.device)
        lse = torch.empty(_lse_shape(q, spec.varlen), dtype=_lse_dtype(q.dtype), device=q.device)
        _ext.forward(_side_inputs(spec, bias, sinks), q, k, v, spec.to_lib(out_user), lse)
        ctx.spec = spec
        ctx.num_inputs = len(inputs)
        ctx.save_for_backward(*inputs, out_user, lse, bias, sinks)
        ctx.mark_non_differentiable(lse)
        return out_user, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout_user, _dlse):
        spec: Spec = ctx.spec
        saved = ctx.saved_tensors
        n = ctx.num_inputs
        inputs = [_d(x) for x in saved[:n]]
        out_user, lse, bias, sinks = saved[n:]
        q, k, v = spec.lib_qkv(inputs)
        grads = [spec.new_grad(x, pd) for x, pd in zip(inputs, spec.pack_dims)]
        dq, dk, dv = spec.lib_qkv(grads)
        acc = _lse_dtype(q.dtype)
        dsinks = None
        if sinks is not None:
            dsinks = torch.empty(sinks.shape, dtype=acc, device=q.device)
        dbias, bias_lib = None, bias
        if bias is not None and ctx.needs_input_grad[1]:
            bias_lib = bias.expand(spec.bias_grad_shape)
            dbias = torch.empty(bias_lib.shape, dtype=acc, device=q.device)
        _ext.backward(_side_inputs(spec, bias_lib, sinks), q, k, v, spec.to_lib(_d(out_user)), lse,
                      spec.to_lib(dout_user.detach()), dq, dk, dv, dsinks, dbias)
        if dbias is not None:
            dbias = _sum_to(dbias, bias.shape).to(bias.dtype)
        if dsinks is not None:
            dsinks = dsinks.to(sinks.dtype) if ctx.needs_input_grad[2] else None
        return (None, dbias, dsinks, *grads)


def attention_probs(spec: Spec, inputs, bias, sinks, batch: int, max_q: int, max_k: int) -> torch.Tensor:
    """P[b, h, i, j] (q's dtype) as the library computes it, every score modifier included.

    The library itself evaluates out = P @ V with V = identity columns (512 at a time), so the
    probabilities match the kernels exactly; it costs seqlen_k / head_dim forwards (testing only).
    """
    det = [_d(x) for x in inputs]
    q, k, _ = spec.lib_qkv(det)
    opts = _side_inputs(spec, bias, sinks)
    opts.update(dropout_p=0.0, seed=0, offset=0)
    heads_q, heads_kv = q.shape[-2], k.shape[-2]
    dt, dev = q.dtype, q.device
    probs = torch.zeros(batch, heads_q, max_q, max_k, dtype=dt, device=dev)
    if spec.varlen:
        cu_q = spec.opts["cu_seqlens_q"].long()
        cu_k = spec.opts["cu_seqlens_k"].long()
        total_k = k.shape[0]
        local = torch.full((total_k,), -1, dtype=torch.long)
        for b in range(batch):
            s, e = int(cu_k[b]), int(cu_k[b + 1])
            local[s:e] = torch.arange(e - s)
    seqlen_k = k.shape[0] if spec.varlen else k.shape[1]
    step = 512
    for c0 in range(0, max_k if spec.varlen else seqlen_k, step):
        n = min(step, (max_k if spec.varlen else seqlen_k) - c0)
        cols = torch.arange(c0, c0 + n)
        if spec.varlen:
            eye = (local[:, None] == cols[None, :]).to(dt)  # [total_k, n]
            v_eye = eye[:, None, :].expand(total_k, heads_kv, n)
        else:
            eye = (torch.arange(seqlen_k)[:, None] == cols[None, :]).to(dt)  # [seqlen_k, n]
            v_eye = eye[None, :, None, :].expand(q.shape[0], seqlen_k, heads_kv, n)
        out = torch.empty(q.shape[:-1] + (n,), dtype=dt, device=dev)
        lse = torch.empty(_lse_shape(q, spec.varlen), dtype=_lse_dtype(dt), device=dev)
        _ext.forward(opts, q, k, v_eye, out, lse)
        if spec.varlen:
            for b in range(batch):
                s, e = int(cu_q[b]), int(cu_q[b + 1])
                probs[b, :, : e - s, c0:c0 + n] = out[s:e].permute(1, 0, 2)
        else:
            probs[..., c0:c0 + n] = out.permute(0, 2, 1, 3)
    return probs


def dropout_seed_offset() -> Tuple[int, int]:
    """A (seed, offset) pair drawn from torch's default CPU generator, so torch.manual_seed
    makes dropout reproducible."""
    r = torch.randint(0, 2**62, (2,), dtype=torch.int64)
    return int(r[0]), int(r[1])
