"""route_sdpa(): torch.nn.functional.scaled_dot_product_attention calls on CPU run on flashgrad.

Inside the context, every call of torch's SDPA (through torch.nn.functional or an alias of it)
is looked at once. A call flashgrad serves runs flashgrad's scaled_dot_product_attention (same semantics,
fused backward); any other call runs torch's own SDPA unchanged, and the reason is counted in
route.fallbacks, so nothing is ever served half-way.
"""
from __future__ import annotations

import collections
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ._sdpa import scaled_dot_product_attention

_FLOAT = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_KNOWN = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _plain_cpu(x) -> bool:
    return (isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.layout == torch.strided
            and not x.is_nested)


def unsupported_reason(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                       enable_gqa=False, **extra) -> Optional[str]:
    """Why flashgrad does not serve this SDPA call (None: it does)."""
    if extra:
        return f"argument {sorted(extra)[0]!r}"
    if not all(_plain_cpu(x) for x in (query, key, value)):
        return "a tensor that is not a dense CPU tensor"
    if query.dtype not in _FLOAT or key.dtype != query.dtype or value.dtype != query.dtype:
        return f"dtypes {query.dtype}, {key.dtype}, {value.dtype}"
    if query.dim() not in (3, 4) or key.dim() != query.dim() or value.dim() != query.dim():
        return f"{query.dim()}-D query"
    if any(x.numel() == 0 for x in (query, key, value)):
        return "an empty tensor"
    if not 1 <= query.shape[-1] <= 512 or not 1 <= value.shape[-1] <= 512:
        return "head_dim outside [1, 512]"
    if attn_mask is not None:
        if not _plain_cpu(attn_mask):
            return "an attn_mask that is not a dense CPU tensor"
        if attn_mask.dtype != torch.bool and attn_mask.dtype not in _FLOAT:
            return f"attn_mask dtype {attn_mask.dtype}"
        if is_causal:
            return "attn_mask with is_causal"
    if scale is not None and not (isinstance(scale, (int, float)) and scale > 0 and math.isfinite(scale)):
        return f"scale {scale!r}"
    if not isinstance(dropout_p, (int, float)) or not 0 <= dropout_p < 1:
        return f"dropout_p {dropout_p!r}"
    if query.dim() == 4:
        hq, hk, hv = query.shape[1], key.shape[1], value.shape[1]
        if hk != hv or (hq != hk and not (enable_gqa and hq % hk == 0)):
            return f"heads {hq}, {hk}, {hv}"
    return None


class route_sdpa(TorchFunctionMode):
    """Context manager: CPU calls of torch's scaled_dot_product_attention run on flashgrad.

        with flashgrad.torch.route_sdpa() as route:
            loss = model(x).sum()
            loss.backward()                 # flashgrad's fused backward
        print(route.served, route.fallbacks)  # calls served; Counter of reasons handed to torch

    Differences from torch's own SDPA where flashgrad serves the call: a query row whose keys
    are all masked out yields 0 (torch's math path yields NaN), and dropout draws its pattern
    from flashgrad's counter-based RNG (seeded from torch's default generator).
    """

    def __init__(self):
        super().__init__()
        self.served = 0
        self.fallbacks: collections.Counter = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            try:
                reason = unsupported_reason(*args, **kwargs)
            except TypeError as e:  # arguments torch itself will reject, in its own words
                reason = f"arguments ({e})"
            if reason is None:
                self.served += 1
                return scaled_dot_product_attention(*args, **kwargs)
            self.fallbacks[reason] += 1
        return func(*args, **kwargs)


__all__ = ["route_sdpa", "unsupported_reason"]
