"""The autograd route for torch < 2.4 (a torch.autograd.Function), the thread setting, dropout's
RNG draw and the testing-only attention probabilities.

forward runs flashgrad's forward; backward runs flashgrad's fused backward (compute_delta,
dK/dV, dQ in the library), never a decomposed one. On torch >= 2.4 the same two calls run as
custom ops instead (_ops.py), which torch.compile and torch.export can trace.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch.autograd.function import once_differentiable

from .._core import _ext
from ._spec import Spec, _d, _lse_shape, _side_inputs, acc_dtype, run_backward, run_forward

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


class FlashAttention(torch.autograd.Function):
    """forward(ctx, spec, bias, sinks, *inputs) -> (out, lse); gradients for bias, sinks, inputs."""

    @staticmethod
    def forward(ctx, spec: Spec, bias, sinks, *inputs):
        out, lse = run_forward(spec, inputs, bias, sinks)
        ctx.spec = spec
        ctx.num_inputs = len(inputs)
        ctx.save_for_backward(*inputs, out, lse, bias, sinks)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, _dlse):
        n = ctx.num_inputs
        saved = ctx.saved_tensors
        out, lse, bias, sinks = saved[n:]
        need_dbias = bias is not None and ctx.needs_input_grad[1]
        grads, dsinks, dbias = run_backward(ctx.spec, saved[:n], out, lse, dout, bias, sinks,
                                            need_dbias, ctx.needs_input_grad[2])
        return (None, dbias, dsinks, *grads)


def dropout_rng() -> torch.Tensor:
    """A (seed, offset) pair, int64, drawn from torch's default CPU generator, so that
    torch.manual_seed makes dropout reproducible (a tensor, so torch.compile can trace it)."""
    return torch.randint(0, 2**62, (2,), dtype=torch.int64)


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
        lse = torch.empty(_lse_shape(q, spec.varlen), dtype=acc_dtype(dt), device=dev)
        _ext.forward(opts, q, k, v_eye, out, lse)
        if spec.varlen:
            for b in range(batch):
                s, e = int(cu_q[b]), int(cu_q[b + 1])
                probs[b, :, : e - s, c0:c0 + n] = out[s:e].permute(1, 0, 2)
        else:
            probs[..., c0:c0 + n] = out.permute(0, 2, 1, 3)
    return probs


def seed_offset(rng: torch.Tensor) -> Tuple[int, int]:
    seed, offset = rng.tolist()
    return int(seed), int(offset)
