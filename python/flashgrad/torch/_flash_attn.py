"""flash-attn 2.x's functions (flash_attn_interface), on CPU, with flashgrad's fused backward."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from ._prepare import attend, check_packed, check_tensor

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
]


_COMMON_ARGS = """\
        dropout_p: float. Dropout probability. The keep pattern is drawn from torch's default
            CPU generator (torch.manual_seed makes it reproducible) and stored for backward.
        softmax_scale: float. The scaling of QK^T before applying softmax.
            Default to 1 / sqrt(headdim).
        causal: bool. Whether to apply causal attention mask (e.g., for auto-regressive modeling).
        window_size: (left, right). If not (-1, -1), implements sliding window local attention.
        softcap: float. Anything > 0 activates softcapping attention.
        alibi_slopes: (nheads,) or (batch_size, nheads), fp32. A bias of
            (-alibi_slope * |i + seqlen_k - seqlen_q - j|) is added to the attention score of
            query i and key j.
        deterministic: bool. Accepted for compatibility: flashgrad's backward is always
            deterministic (bitwise identical results for any number of threads).
        return_attn_probs: bool. Whether to return the attention probabilities. This option is for
           testing only (it costs about seqlen_k / headdim forward passes).
    Keyword-only arguments (flashgrad extensions, not in flash-attn):
        sinks: (nheads,) tensor, fp32 preferred. One learnable logit per head that joins the softmax
            denominator only (attention sinks); its .grad is filled by backward.
        attn_bias: additive bias broadcastable to (batch_size|1, nheads|1, seqlen_q, seqlen_k)
            (sizes 1 broadcast; with varlen, indexed by positions inside each sequence). fp32, fp16
            or bf16 (fp64 is read as fp32). Gets a gradient if it requires grad.
        attn_mask: bool or uint8 mask of the same broadcast shape; True/nonzero = attend.
    Semantics: causal and window_size are aligned to the bottom-right corner of the attention
    matrix (flash-attn >= 2.1): query i sits at key position i + seqlen_k - seqlen_q. A query row
    that sees no key outputs 0 (its softmax_lse is -inf). Tensors may have any strides (they are
    read in place, never copied); fp32, fp64, bf16 and fp16 are supported."""

_RETURN = """\
    Return:
        out: {out_shape}.
        softmax_lse [optional, if return_attn_probs=True]: {lse_shape}, fp32. The
            logsumexp of each row of the matrix QK^T * scaling (e.g., log of the softmax
            normalization factor); with sinks, the sink's exp term is included.
        S_dmask [optional, if return_attn_probs=True]: (batch_size, nheads, seqlen_q, seqlen_k)
            in q's dtype when dropout_p > 0, else None (as flash-attn). The output of softmax,
            computed by flashgrad's own kernels; it also encodes the dropout pattern (negative
            means that location was dropped, nonnegative means it was kept). Not rounded up to a
            block size: its last two dims are exactly seqlen_q and seqlen_k (max_seqlen_q and
            max_seqlen_k for varlen, zero past each sequence's end).
    Raises:
        TypeError (wrong type or dtype) or ValueError (any other bad argument), with the message
        of flashgrad's library naming the argument, what was expected and what was given."""


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: Optional[float] = None, causal: bool = False,
                    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[torch.Tensor] = None, deterministic: bool = False,
                    return_attn_probs: bool = False, *, sinks: Optional[torch.Tensor] = None,
                    attn_bias: Optional[torch.Tensor] = None,
                    attn_mask: Optional[torch.Tensor] = None) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
    fn = "flash_attn_func"
    layout = "(batch_size, seqlen, nheads, headdim)"
    for arg, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(fn, arg, x, 4, layout)
    return attend(fn, (q, k, v), "bshd", dropout_p=dropout_p,
                  softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                  alibi_slopes=alibi_slopes, attn_bias=attn_bias, attn_mask=attn_mask, sinks=sinks,
                  return_attn_probs=return_attn_probs)


flash_attn_func.__doc__ = f"""dropout_p should be set to 0.0 during evaluation
    Supports multi-query and grouped-query attention (MQA/GQA) by passing in KV with fewer heads
    than Q. Note that the number of heads in Q must be divisible by the number of heads in KV.
    For example, if Q has 6 heads and K, V have 2 heads, head 0, 1, 2 of Q will attention to head
    0 of K, V, and head 3, 4, 5 of Q will attention to head 1 of K, V.

    If causal=True, the causal mask is aligned to the bottom right corner of the attention matrix.
    For example, if seqlen_q = 2 and seqlen_k = 5, the causal mask (1 = keep, 0 = masked out) is:
        1 1 1 1 0
        1 1 1 1 1
    If seqlen_q = 5 and seqlen_k = 2, the causal mask is:
        0 0
        0 0
        0 0
        1 0
        1 1
    If the row of the mask is all zero, the output will be zero.

    If window_size != (-1, -1), implements sliding window local attention. Query at position i
    will only attend to keys between
    [i + seqlen_k - seqlen_q - window_size[0], i + seqlen_k - seqlen_q + window_size[1]] inclusive.

    Arguments:
        q: (batch_size, seqlen, nheads, headdim)
        k: (batch_size, seqlen, nheads_k, headdim)
        v: (batch_size, seqlen, nheads_k, headdim)
{_COMMON_ARGS}
{_RETURN.format(out_shape="(batch_size, seqlen, nheads, headdim)", lse_shape="(batch_size, nheads, seqlen)")}
    """


def flash_attn_qkvpacked_func(qkv: torch.Tensor, dropout_p: float = 0.0,
                              softmax_scale: Optional[float] = None, causal: bool = False,
                              window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                              alibi_slopes: Optional[torch.Tensor] = None, deterministic: bool = False,
                              return_attn_probs: bool = False, *, sinks: Optional[torch.Tensor] = None,
                              attn_bias: Optional[torch.Tensor] = None,
                              attn_mask: Optional[torch.Tensor] = None) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
    fn = "flash_attn_qkvpacked_func"
    check_tensor(fn, "qkv", qkv, 5, "(batch_size, seqlen, 3, nheads, headdim)")
    check_packed(fn, "qkv", qkv, -3, 3)
    return attend(fn, (qkv,), "qkv", dropout_p=dropout_p,
                  softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                  alibi_slopes=alibi_slopes, attn_bias=attn_bias, attn_mask=attn_mask, sinks=sinks,
                  return_attn_probs=return_attn_probs)


flash_attn_qkvpacked_func.__doc__ = f"""dropout_p should be set to 0.0 during evaluation
    If Q, K, V are already stacked into 1 tensor, this function will be faster than
    calling flash_attn_func on Q, K, V since the backward pass avoids explicit concatenation
    of the gradients of Q, K, V (the gradient is one (3, ...) buffer whose blocks the fused
    backward writes directly).
    For multi-query and grouped-query attention (MQA/GQA), please see
    flash_attn_kvpacked_func and flash_attn_func.

    Arguments:
        qkv: (batch_size, seqlen, 3, nheads, headdim)
{_COMMON_ARGS}
{_RETURN.format(out_shape="(batch_size, seqlen, nheads, headdim)", lse_shape="(batch_size, nheads, seqlen)")}
    """


def flash_attn_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, dropout_p: float = 0.0,
                             softmax_scale: Optional[float] = None, causal: bool = False,
                             window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: Optional[torch.Tensor] = None, deterministic: bool = False,
                             return_attn_probs: bool = False, *, sinks: Optional[torch.Tensor] = None,
                             attn_bias: Optional[torch.Tensor] = None,
                             attn_mask: Optional[torch.Tensor] = None) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
    fn = "flash_attn_kvpacked_func"
    check_tensor(fn, "q", q, 4, "(batch_size, seqlen, nheads, headdim)")
    check_tensor(fn, "kv", kv, 5, "(batch_size, seqlen, 2, nheads_k, headdim)")
    check_packed(fn, "kv", kv, -3, 2)
    return attend(fn, (q, kv), "kv", dropout_p=dropout_p,
                  softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                  alibi_slopes=alibi_slopes, attn_bias=attn_bias, attn_mask=attn_mask, sinks=sinks,
                  return_attn_probs=return_attn_probs)


flash_attn_kvpacked_func.__doc__ = f"""dropout_p should be set to 0.0 during evaluation
    If K, V are already stacked into 1 tensor, this function will be faster than
    calling flash_attn_func on Q, K, V since the backward pass avoids explicit concatenation
    of the gradients of K, V.
    Supports multi-query and grouped-query attention (MQA/GQA) by passing in KV with fewer heads
    than Q. Note that the number of heads in Q must be divisible by the number of heads in KV.
    For example, if Q has 6 heads and K, V have 2 heads, head 0, 1, 2 of Q will attention to head
    0 of K, V, and head 3, 4, 5 of Q will attention to head 1 of K, V.
    causal and window_size are aligned bottom-right, as in flash_attn_func.

    Arguments:
        q: (batch_size, seqlen, nheads, headdim)
        kv: (batch_size, seqlen, 2, nheads_k, headdim)
{_COMMON_ARGS}
{_RETURN.format(out_shape="(batch_size, seqlen, nheads, headdim)", lse_shape="(batch_size, nheads, seqlen)")}
    """


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                           max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Optional[torch.Tensor] = None, deterministic: bool = False,
                           return_attn_probs: bool = False, *, sinks: Optional[torch.Tensor] = None,
                           attn_bias: Optional[torch.Tensor] = None,
                           attn_mask: Optional[torch.Tensor] = None) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
    fn = "flash_attn_varlen_func"
    for arg, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(fn, arg, x, 3, "(total, nheads, headdim)")
    return attend(fn, (q, k, v), "bshd", dropout_p=dropout_p,
                  softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                  alibi_slopes=alibi_slopes, attn_bias=attn_bias, attn_mask=attn_mask, sinks=sinks,
                  varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                  return_attn_probs=return_attn_probs)


_VARLEN_ARGS = """\
        cu_seqlens_q: (batch_size + 1,), dtype torch.int32. The cumulative sequence lengths
           of the sequences in the batch, used to index into q.
        cu_seqlens_k: (batch_size + 1,), dtype torch.int32. The cumulative sequence lengths
           of the sequences in the batch, used to index into kv.
        max_seqlen_q: int. Maximum query sequence length in the batch.
        max_seqlen_k: int. Maximum key sequence length in the batch."""

flash_attn_varlen_func.__doc__ = f"""dropout_p should be set to 0.0 during evaluation
    Supports multi-query and grouped-query attention (MQA/GQA) by passing in K, V with fewer heads
    than Q. Note that the number of heads in Q must be divisible by the number of heads in KV.
    For example, if Q has 6 heads and K, V have 2 heads, head 0, 1, 2 of Q will attention to head
    0 of K, V, and head 3, 4, 5 of Q will attention to head 1 of K, V.
    causal and window_size are aligned bottom-right within each sequence, as in flash_attn_func.

    Arguments:
        q: (total_q, nheads, headdim), where total_q = total number of query tokens in the batch.
        k: (total_k, nheads_k, headdim), where total_k = total number of key tokens in the batch.
        v: (total_k, nheads_k, headdim), where total_k = total number of key tokens in the batch.
{_VARLEN_ARGS}
{_COMMON_ARGS}
{_RETURN.format(out_shape="(total, nheads, headdim)", lse_shape="(nheads, total_q_seqlen)")}
    """


def flash_attn_varlen_qkvpacked_func(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                                     dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                     causal: bool = False, window_size: Tuple[int, int] = (-1, -1),
                                     softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
                                     deterministic: bool = False, return_attn_probs: bool = False, *,
                                     sinks: Optional[torch.Tensor] = None,
                                     attn_bias: Optional[torch.Tensor] = None,
                                     attn_mask: Optional[torch.Tensor] = None) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
    fn = "flash_attn_varlen_qkvpacked_func"
    check_tensor(fn, "qkv", qkv, 4, "(total, 3, nheads, headdim)")
    check_packed(fn, "qkv", qkv, -3, 3)
    return attend(fn, (qkv,), "qkv", dropout_p=dropout_p,
                  softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                  alibi_slopes=alibi_slopes, attn_bias=attn_bias, attn_mask=attn_mask, sinks=sinks,
                  varlen=(cu_seqlens, cu_seqlens, max_seqlen, max_seqlen),
                  return_attn_probs=return_attn_probs)


flash_attn_varlen_qkvpacked_func.__doc__ = f"""dropout_p should be set to 0.0 during evaluation
    If Q, K, V are already stacked into 1 tensor, this function will be faster than
    calling flash_attn_varlen_func on Q, K, V since the backward pass avoids explicit concatenation
    of the gradients of Q, K, V.

    Arguments:
        qkv: (total, 3, nheads, headdim), where total = total number of tokens in the batch.
        cu_seqlens: (batch_size + 1,), dtype torch.int32. The cumulative sequence lengths
           of the sequences in the batch, used to index into qkv.
        max_seqlen: int. Maximum sequence length in the batch.
{_COMMON_ARGS}
{_RETURN.format(out_shape="(total, nheads, headdim)", lse_shape="(nheads, total_q_seqlen)")}
    """


def flash_attn_varlen_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                                    dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                    causal: bool = False, window_size: Tuple[int, int] = (-1, -1),
                                    softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
                                    deterministic: bool = False, return_attn_probs: bool = False, *,
                                    sinks: Optional[torch.Tensor] = None,
                                    attn_bias: Optional[torch.Tensor] = None,
                                    attn_mask: Optional[torch.Tensor] = None) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]]:
    fn = "flash_attn_varlen_kvpacked_func"
    check_tensor(fn, "q", q, 3, "(total_q, nheads, headdim)")
    check_tensor(fn, "kv", kv, 4, "(total_k, 2, nheads_k, headdim)")
    check_packed(fn, "kv", kv, -3, 2)
    return attend(fn, (q, kv), "kv", dropout_p=dropout_p,
                  softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                  alibi_slopes=alibi_slopes, attn_bias=attn_bias, attn_mask=attn_mask, sinks=sinks,
                  varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                  return_attn_probs=return_attn_probs)


flash_attn_varlen_kvpacked_func.__doc__ = f"""dropout_p should be set to 0.0 during evaluation
    If K, V are already stacked into 1 tensor, this function will be faster than
    calling flash_attn_varlen_func on Q, K, V since the backward pass avoids explicit concatenation
    of the gradients of K, V. Supports MQA/GQA as flash_attn_varlen_func.

    Arguments:
        q: (total_q, nheads, headdim), where total_q = total number of query tokens in the batch.
        kv: (total_k, 2, nheads_k, headdim), where total_k = total number of key tokens in the batch.
{_VARLEN_ARGS}
{_COMMON_ARGS}
{_RETURN.format(out_shape="(total, nheads, headdim)", lse_shape="(nheads, total_q_seqlen)")}
    """
