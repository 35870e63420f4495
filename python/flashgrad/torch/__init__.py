"""flashgrad for PyTorch: flash-attn 2.x's API and torch 2's scaled_dot_product_attention on CPU.

Every function is a torch.autograd.Function whose backward is flashgrad's fused backward
(recomputing P tile by tile from q, k and the saved softmax_lse); nothing of size
seqlen_q * seqlen_k is stored.

    from flashgrad.torch import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)           # q: (batch, seqlen, nheads, headdim)

    from flashgrad.torch import scaled_dot_product_attention as sdpa
    out = sdpa(query, key, value, is_causal=True)         # query: (N, H, L, E), torch 2 semantics

Beyond flash-attn: sinks= (learnable per-head logits), attn_bias= (additive, differentiable) and
attn_mask= (bool, True = attend) keywords; float64 inputs; any strides.
"""
from ._autograd import FlashAttention, get_num_threads, set_num_threads
from ._flash_attn import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from ._sdpa import scaled_dot_product_attention

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "scaled_dot_product_attention",
    "set_num_threads",
    "get_num_threads",
    "FlashAttention",
]
