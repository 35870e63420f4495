"""flashgrad for PyTorch: flash-attn 2.x's API and torch 2's scaled_dot_product_attention on CPU.

Every function has flashgrad's fused backward as its gradient
(recomputing P tile by tile from q, k and the saved softmax_lse); nothing of size
seqlen_q * seqlen_k is stored.

    from flashgrad.torch import flash_attn_func
    out = flash_attn_func(q, k, v, causal=True)           # q: (batch, seqlen, nheads, headdim)

    from flashgrad.torch import scaled_dot_product_attention as sdpa
    out = sdpa(query, key, value, is_causal=True)         # query: (N, H, L, E), torch 2 semantics

    with route_sdpa():                                    # torch 2.x: models that call
        loss = model(x).sum()                             # F.scaled_dot_product_attention

Across ranks (torch.distributed, gloo): ring_attn_func(q_local, k_local, v_local, group,
causal=True) runs ring attention over one sequence sharded along its length (docs/distributed.md).

Beyond flash-attn: sinks= (learnable per-head logits), attn_bias= (additive, differentiable) and
attn_mask= (bool, True = attend) keywords; float64 inputs; any strides.

On torch >= 2.4 the kernels run as the custom ops torch.ops.flashgrad.attention_forward and
attention_backward, which torch.compile(fullgraph=True) and torch.export trace; on torch 1.13
to 2.3 as a torch.autograd.Function. Older torch is refused at import.

The kernels' tasks run on torch's OpenMP threads (flashgrad.thread_runner() says where;
FLASHGRAD_TORCH_OPENMP=0 keeps flashgrad's own pool).
"""
import torch as _torch


def _version(v: str):
    return tuple(int(p) for p in v.split("+")[0].split(".")[:2] if p.isdigit())


if _version(_torch.__version__) < (1, 13):
    raise ImportError(f"flashgrad.torch: needs torch >= 1.13, found torch {_torch.__version__} "
                      f"at {_torch.__file__}")

from ._autograd import FlashAttention, get_num_threads, set_num_threads  # noqa: E402
from ._threads import use_torch_openmp as _use_torch_openmp  # noqa: E402
from ._flash_attn import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from ._ring import ring_attn_func  # noqa: E402
from ._sdpa import scaled_dot_product_attention  # noqa: E402

_use_torch_openmp(_torch)

if hasattr(_torch.nn.functional, "scaled_dot_product_attention"):
    from ._route import route_sdpa, unsupported_reason  # noqa: E402, F401

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "scaled_dot_product_attention",
    "ring_attn_func",
    "set_num_threads",
    "get_num_threads",
    "FlashAttention",
]
if "route_sdpa" in globals():
    __all__ += ["route_sdpa"]
