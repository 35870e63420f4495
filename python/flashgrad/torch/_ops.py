"""torch >= 2.4: flashgrad's forward and backward as torch.library custom ops.

    torch.ops.flashgrad.attention_forward(...)  -> (out, lse)
    torch.ops.flashgrad.attention_backward(...) -> [*grads, dsinks, dbias]

Each has a fake implementation (shapes, dtypes and strides only), and the forward's gradient is
the backward op (register_autograd), so torch.compile(fullgraph=True) and torch.export trace a
model through them, and torch.library.opcheck checks them. The schema is flat (an op takes no
Python objects): attend() in _prepare.py fills it, and spec_from_args rebuilds the call's Spec.
dsinks and dbias come back as empty tensors when they are not computed.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ._spec import OP_SCALARS, OP_TENSORS, new_grads, new_outputs, run_backward, run_forward, spec_from_args

_FN = "custom op"


def _spec(values):
    return spec_from_args(_FN, dict(zip(OP_TENSORS + OP_SCALARS, values)))


def _fake_spec(values):
    """The Spec of a call on fake tensors: its layout and shapes, no tensor is read."""
    args = dict(zip(OP_TENSORS + OP_SCALARS, values))
    args.update(rng=None, dropout_p=0.0)
    return spec_from_args(_FN, args)


@torch.library.custom_op("flashgrad::attention_forward", mutates_args=())
def attention_forward(inputs: List[Tensor], bias: Optional[Tensor], sinks: Optional[Tensor],
                      alibi_slopes: Optional[Tensor], mask: Optional[Tensor],
                      cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                      rng: Optional[Tensor], layout: str, key_limit: int,
                      softmax_scale: Optional[float], causal: bool, window_left: int,
                      window_right: int, softcap: float, dropout_p: float, num_threads: int) -> Tuple[Tensor, Tensor]:
    spec = _spec((alibi_slopes, mask, cu_seqlens_q, cu_seqlens_k, rng, layout, key_limit, softmax_scale,
                  causal, window_left, window_right, softcap, dropout_p, num_threads))
    return run_forward(spec, inputs, bias, sinks)


@attention_forward.register_fake
def _(inputs, bias, sinks, *args):
    return new_outputs(_fake_spec(args), inputs)


@torch.library.custom_op("flashgrad::attention_backward", mutates_args=())
def attention_backward(inputs: List[Tensor], out: Tensor, lse: Tensor, dout: Tensor,
                       bias: Optional[Tensor], sinks: Optional[Tensor],
                       alibi_slopes: Optional[Tensor], mask: Optional[Tensor],
                       cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                       rng: Optional[Tensor], layout: str, key_limit: int,
                       softmax_scale: Optional[float], causal: bool, window_left: int,
                       window_right: int, softcap: float, dropout_p: float, num_threads: int,
                       need_dbias: bool, need_dsinks: bool) -> List[Tensor]:
    spec = _spec((alibi_slopes, mask, cu_seqlens_q, cu_seqlens_k, rng, layout, key_limit, softmax_scale,
                  causal, window_left, window_right, softcap, dropout_p, num_threads))
    grads, dsinks, dbias = run_backward(spec, inputs, out, lse, dout, bias, sinks, need_dbias, need_dsinks)
    return [*grads, _or_empty(dsinks, out), _or_empty(dbias, out)]


@attention_backward.register_fake
def _(inputs, out, lse, dout, bias, sinks, *args):
    *args, need_dbias, need_dsinks = args
    grads = new_grads(_fake_spec(args), inputs)
    dsinks = torch.empty_like(sinks) if sinks is not None and need_dsinks else None
    dbias = None
    if bias is not None and need_dbias:
        dbias = torch.empty_like(bias, memory_format=torch.contiguous_format)
    return [*grads, _or_empty(dsinks, out), _or_empty(dbias, out)]


def _or_empty(x: Optional[Tensor], like: Tensor) -> Tensor:
    return like.new_empty((0,)) if x is None else x


def _setup_context(ctx, inputs, output):
    tensors, bias, sinks, *rest = inputs
    ctx.num_inputs = len(tensors)
    ctx.scalars = rest[len(OP_TENSORS):]
    ctx.need_dbias = bias is not None and bias.requires_grad
    ctx.need_dsinks = sinks is not None and sinks.requires_grad
    ctx.save_for_backward(*tensors, *output, bias, sinks, *rest[:len(OP_TENSORS)])


def _backward(ctx, dout, _dlse):
    n = ctx.num_inputs
    saved = ctx.saved_tensors
    tensors, (out, lse), side = saved[:n], saved[n:n + 2], saved[n + 2:]
    res = torch.ops.flashgrad.attention_backward(list(tensors), out, lse, dout, *side, *ctx.scalars,
                                                 ctx.need_dbias, ctx.need_dsinks)
    grads = list(res[:n])
    dsinks = res[n] if ctx.need_dsinks else None
    dbias = res[n + 1] if ctx.need_dbias else None
    return (grads, dbias, dsinks) + (None,) * (len(OP_TENSORS) + len(OP_SCALARS))


attention_forward.register_autograd(_backward, setup_context=_setup_context)


def call(args: dict, inputs: Sequence[Tensor], bias, sinks) -> Tuple[Tensor, Tensor]:
    """attention_forward with its OP_TENSORS and OP_SCALARS taken from a dict."""
    return torch.ops.flashgrad.attention_forward(list(inputs), bias, sinks,
                                                 *(args[name] for name in OP_TENSORS + OP_SCALARS))
