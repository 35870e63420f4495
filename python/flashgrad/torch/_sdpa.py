"""torch 2.x's scaled_dot_product_attention, for torch 1.13, on flashgrad."""
from __future__ import annotations

from typing import Optional

import torch

from ._prepare import attend, check_tensor, fail

__all__ = ["scaled_dot_product_attention"]


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    r"""Computes scaled dot product attention on query, key and value tensors, using an optional
    attention mask if passed, and applying dropout if a probability greater than 0.0 is specified.
    The semantics are those of PyTorch 2.x's torch.nn.functional.scaled_dot_product_attention, so
    code written for torch 2 runs on torch 1.13; forward and backward are flashgrad's fused
    kernels (no (L, S) matrix is stored)::

        # Efficient implementation equivalent to the following:
        def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                is_causal=False, scale=None, enable_gqa=False) -> torch.Tensor:
            L, S = query.size(-2), key.size(-2)
            scale_factor = 1 / math.sqrt(query.size(-1)) if scale is None else scale
            attn_bias = torch.zeros(L, S, dtype=query.dtype)
            if is_causal:
                assert attn_mask is None
                temp_mask = torch.ones(L, S, dtype=torch.bool).tril(diagonal=0)
                attn_bias.masked_fill_(temp_mask.logical_not(), float("-inf"))
            if attn_mask is not None:
                if attn_mask.dtype == torch.bool:
                    attn_bias.masked_fill_(attn_mask.logical_not(), float("-inf"))
                else:
                    attn_bias = attn_mask + attn_bias
            if enable_gqa:
                key = key.repeat_interleave(query.size(-3)//key.size(-3), -3)
                value = value.repeat_interleave(query.size(-3)//value.size(-3), -3)
            attn_weight = query @ key.transpose(-2, -1) * scale_factor
            attn_weight += attn_bias
            attn_weight = torch.softmax(attn_weight, dim=-1)
            attn_weight = torch.dropout(attn_weight, dropout_p, train=True)
            return attn_weight @ value

    Args:
        query (Tensor): Query tensor; shape (N, Hq, L, E) or (N, L, E).
        key (Tensor): Key tensor; shape (N, H, S, E) or (N, S, E).
        value (Tensor): Value tensor; shape (N, H, S, Ev) or (N, S, Ev).
        attn_mask (optional Tensor): Attention mask; shape must be broadcastable to the shape of
            attention weights, (N, Hq, L, S) (or (N, L, S)). Two types of masks are supported: a
            boolean mask where a value of True indicates that the element *should* take part in
            attention (uint8 is read the same way, nonzero = attend), and a float mask of the same
            type as query, key, value that is added to the attention score (it gets a gradient if
            it requires grad).
        dropout_p (float): Dropout probability; if greater than 0.0, dropout is applied (as in
            torch, also in eval mode). The pattern is drawn from torch's default CPU generator.
        is_causal (bool): If set to true, the attention masking is a lower triangular matrix when
            the mask is a square matrix. The attention masking has the form of the upper left
            causal bias due to the alignment (see torch.nn.attention.bias.CausalBias) when the mask
            is a non-square matrix (torch's semantics; flashgrad.torch.flash_attn_func aligns
            bottom-right instead). An error is thrown if both attn_mask and is_causal are set.
        scale (optional float): Scaling factor applied prior to softmax. If None, the default
            value is set to 1/sqrt(E). Must be > 0.
        enable_gqa (bool): If set to True, Grouped Query Attention (GQA) is enabled; Hq must be a
            multiple of H, and query head h reads key/value head h // (Hq // H).

    Returns:
        output (Tensor): Attention output; shape (N, Hq, L, Ev) (or (N, L, Ev)), contiguous.

    Differences from torch: a query row whose keys are all masked out yields 0 (torch's math path
    yields NaN); inputs are read in place whatever their strides (BHSD views of BSHD memory
    included), in float32, float64, bfloat16 or float16; a float64 float mask is read as float32.

    Raises:
        TypeError or ValueError naming the bad argument (messages from flashgrad's library).
    """
    fn = "scaled_dot_product_attention"
    check_tensor(fn, "query", query)
    if query.dim() not in (3, 4):
        fail(fn, "query", "shape (N, Hq, L, E) or (N, L, E)", f"shape {list(query.shape)}")
    layout = "(N, H, S, E)" if query.dim() == 4 else "(N, S, E)"
    check_tensor(fn, "key", key, query.dim(), layout)
    check_tensor(fn, "value", value, query.dim(), layout)
    if query.dim() == 4 and query.shape[1] != key.shape[1] and not enable_gqa:
        fail(fn, "key", f"{query.shape[1]} heads like query (or enable_gqa=True)",
             f"shape {list(key.shape)}")
    layout_name = "bhsd" if query.dim() == 4 else "nse"
    seqlen_q, seqlen_k = query.shape[-2], key.shape[-2]
    causal, window, key_limit = False, (-1, -1), None
    if is_causal:
        if attn_mask is not None:
            fail(fn, "attn_mask", "None when is_causal=True", "a tensor")
        # torch aligns is_causal top-left (query i sees keys j <= i); flashgrad aligns bottom-right.
        if seqlen_q <= seqlen_k:
            # Keys past seqlen_q are seen by no query: attend to the first seqlen_q keys only
            # (a view), where both alignments coincide; the rest get zero gradient.
            causal = True
            key_limit = seqlen_q if seqlen_q < seqlen_k else None
        else:
            # j <= i is the window right bound seqlen_q - seqlen_k around the bottom-right diagonal.
            window = (-1, seqlen_q - seqlen_k)
    bias = mask = None
    if attn_mask is not None:
        check_tensor(fn, "attn_mask", attn_mask)
        m = attn_mask
        if query.dim() == 3:  # (N|1, L|1, S|1) -> (N|1, 1, L|1, S|1)
            if m.dim() > 3:
                fail(fn, "attn_mask", "a shape broadcastable to (N, L, S)", f"shape {list(m.shape)}")
            while m.dim() < 3:
                m = m.unsqueeze(0)
            m = m.unsqueeze(1)
        if m.dtype in (torch.bool, torch.uint8):
            mask = m
        elif m.is_floating_point():
            bias = m
        else:
            fail(fn, "attn_mask", "dtype torch.bool or a floating dtype", f"dtype {m.dtype}", type_error=True)
    return attend(fn, (query, key, value), layout_name, dropout_p=dropout_p,
                  softmax_scale=scale, causal=causal, window_size=window, softcap=0.0, alibi_slopes=None,
                  attn_bias=bias, attn_mask=mask, sinks=None, key_limit=key_limit)
