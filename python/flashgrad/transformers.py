"""flashgrad as a Hugging Face transformers attention backend: attn_implementation="FlashGrad".

    import flashgrad.transformers  # registers "FlashGrad" (or call flashgrad.transformers.register())
    model = AutoModelForCausalLM.from_config(config, attn_implementation="FlashGrad")

(The name is capitalised because transformers reads any name containing "flash" as a request
for a flash-attention kernel.)

What a model's attention layer asks for maps onto one flashgrad call on [B, L, H, D] views of its
[B, H, L, D] tensors (no copies), with flashgrad's fused backward:

- causal (bottom-right aligned, as transformers' cache positions are) or bidirectional layers;
- sliding-window layers (sliding_window=W: each query sees its last W keys), Gemma 2's logit
  softcapping (softcap=), gpt-oss's attention sinks (s_aux=, learnable), GQA/MQA, dropout;
- a padded batch: the mask interface registered with the backend hands over the 2-D padding mask
  (as for flash-attention), and the call runs on the unpadded tokens as a varlen batch, never on a
  materialised [L, L] mask. Padded query rows come back as zeros.
- masks that are not a plain padding mask (packed sequences given by position_ids, models that
  add mask functions such as bidirectional image tokens): transformers' boolean 4-D mask, which
  flashgrad applies as is.

What flashgrad does not do (tensors off the CPU, dtypes other than float32/float64/bfloat16/
float16, head dims past 512, output_attentions, T5-style position_bias, float 4-D masks) warns
once and runs transformers' "sdpa" on the same inputs; a call sdpa cannot serve either (sinks,
softcap) raises an error instead of returning a different computation.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch

from .torch import flash_attn_func, flash_attn_varlen_func

# transformers takes every implementation name with "flash" in it for a flash-attention kernel
# (is_flash_attention_requested is a substring test) and tries to load one, so the backend's
# name keeps the capital letters.
NAME = "FlashGrad"

_FLOAT = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_warned = set()


def _unsupported(query, key, value, attention_mask, kwargs) -> Optional[str]:
    if any(x.device.type != "cpu" for x in (query, key, value)):
        return f"tensors on {query.device.type}"
    if query.dtype not in _FLOAT or key.dtype != query.dtype or value.dtype != query.dtype:
        return f"dtypes {query.dtype}, {key.dtype}, {value.dtype}"
    if not 1 <= query.shape[-1] <= 512 or not 1 <= value.shape[-1] <= 512:
        return "a head dim outside [1, 512]"
    if kwargs.get("output_attentions"):
        return "output_attentions=True"
    if kwargs.get("position_bias") is not None:
        return "position_bias"
    if attention_mask is not None and attention_mask.dim() == 4 and attention_mask.dtype != torch.bool:
        return "a float 4-D attention mask"
    if attention_mask is not None and attention_mask.dim() not in (2, 4):
        return f"a {attention_mask.dim()}-D attention mask"
    return None


def _window(sliding_window, is_causal: bool, kv_length: int):
    """transformers' sliding_window=W (keys kv_idx > q_idx - W) as flashgrad's window_size."""
    if sliding_window is None or sliding_window <= 0 or kv_length <= sliding_window:
        return (-1, -1)
    return (sliding_window - 1, 0 if is_causal else sliding_window - 1)


def _varlen(q, k, v, padding, **kw):
    """Attention over the tokens that padding [B, kv_length] (True = a token) keeps, as a varlen
    batch; q, k, v in [B, L, H, D]. Queries are the last q_length positions of the mask."""
    batch, q_len = q.shape[0], q.shape[1]
    keep_k = padding.reshape(-1)
    keep_q = padding[:, -q_len:].reshape(-1)
    idx_k = keep_k.nonzero().squeeze(1)
    idx_q = keep_q.nonzero().squeeze(1)
    cu = [torch.nn.functional.pad(m.sum(1).cumsum(0), (1, 0)).to(torch.int32)
          for m in (padding[:, -q_len:], padding)]
    lens = [int((c[1:] - c[:-1]).max()) if batch else 0 for c in cu]
    out = flash_attn_varlen_func(q.reshape(-1, *q.shape[2:])[idx_q], k.reshape(-1, *k.shape[2:])[idx_k],
                                 v.reshape(-1, *v.shape[2:])[idx_k], cu[0], cu[1], lens[0], lens[1], **kw)
    full = out.new_zeros((batch * q_len,) + out.shape[1:])
    return full.index_copy(0, idx_q, out).reshape(batch, q_len, *out.shape[1:])


def flashgrad_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                                dropout: float = 0.0, scaling: Optional[float] = None,
                                sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                                is_causal: Optional[bool] = None, s_aux: Optional[torch.Tensor] = None,
                                **kwargs):
    """transformers' attention function signature: query [B, Hq, Lq, D], key and value
    [B, Hkv, Lk, D]; returns (out [B, Lq, Hq, Dv], None)."""
    reason = _unsupported(query, key, value, attention_mask, kwargs)
    if reason is not None:
        return _fallback(reason, module, query, key, value, attention_mask, dropout, scaling, sliding_window,
                         softcap, is_causal, s_aux, kwargs)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    kw = dict(dropout_p=dropout, softmax_scale=scaling, softcap=float(softcap or 0.0), sinks=s_aux)
    if attention_mask is not None and attention_mask.dim() == 4:
        # transformers' own boolean mask, with causality and windows in it.
        return flash_attn_func(q, k, v, attn_mask=attention_mask, **kw), None
    kw.update(causal=bool(is_causal), window_size=_window(sliding_window, bool(is_causal), k.shape[1]))
    if attention_mask is None:
        return flash_attn_func(q, k, v, **kw), None
    return _varlen(q, k, v, attention_mask.to(torch.bool), **kw), None


def _fallback(reason, module, query, key, value, attention_mask, dropout, scaling, sliding_window, softcap,
              is_causal, s_aux, kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if s_aux is not None or softcap:
        raise ValueError(f"flashgrad attention backend: argument 'query': expected a call flashgrad can run "
                         f"(it got {reason}), and sdpa cannot stand in for it: it has no "
                         f"{'attention sinks' if s_aux is not None else 'softcap'}")
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"flashgrad attention backend: {reason}; these calls run transformers' sdpa attention",
                      stacklevel=3)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if attention_mask is not None and attention_mask.dim() == 2:
        attention_mask = _dense_mask(attention_mask.to(torch.bool), query.shape[2], bool(is_causal),
                                     _window(sliding_window, bool(is_causal), key.shape[2]))
        is_causal = False
    elif sliding_window and attention_mask is None and key.shape[2] > sliding_window:
        attention_mask = _dense_mask(torch.ones(query.shape[0], key.shape[2], dtype=torch.bool, device=key.device),
                                     query.shape[2], bool(is_causal),
                                     _window(sliding_window, bool(is_causal), key.shape[2]))
        is_causal = False
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def _dense_mask(padding, q_len: int, causal: bool, window) -> torch.Tensor:
    """The [B, 1, Lq, Lk] boolean mask of a padding mask, causality and a window (bottom-right)."""
    k_len = padding.shape[1]
    i = torch.arange(q_len, device=padding.device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=padding.device)[None, :]
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=padding.device)
    if causal:
        allowed &= j <= i
    if window[0] >= 0:
        allowed &= j >= i - window[0]
    if window[1] >= 0:
        allowed &= j <= i + window[1]
    return allowed[None, None] & padding[:, None, None, :]


def flashgrad_mask(*args, **kwargs):
    """The mask transformers builds for "flashgrad": the 2-D padding mask (or None) as for
    flash-attention, unless the pattern is more than causal + window + padding (packed sequences,
    added mask functions), where it is transformers' 4-D boolean mask."""
    from transformers.masking_utils import flash_attention_mask, sdpa_mask

    if kwargs.get("use_vmap") or not kwargs.get("allow_is_causal_skip", True):
        return sdpa_mask(*args, **kwargs)
    return flash_attention_mask(*args, **kwargs)


def register(name: str = NAME) -> None:
    """Registers the backend under `name` (done on import, as NAME)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, flashgrad_attention_forward)
    AttentionMaskInterface.register(name, flashgrad_mask)


register()

__all__ = ["flashgrad_attention_forward", "flashgrad_mask", "register"]
