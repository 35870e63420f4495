"""Every bad input raises ValueError or TypeError naming the argument; where the library
validates, its own message ("flashgrad::forward: argument 'k': expected ..., got ...") is kept."""
import numpy as np
import pytest
import torch

import flashgrad
from flashgrad.torch import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    scaled_dot_product_attention as sdpa,
)


def t(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


Q, K, V = t(2, 5, 4, 8), t(2, 7, 2, 8), t(2, 7, 2, 8)
CU = torch.tensor([0, 3, 5], dtype=torch.int32)

FLASH_CASES = [
    # (name, kwargs overriding q/k/v or options, exception, message fragment)
    ("q_not_tensor", {"q": [[1.0]]}, TypeError, "argument 'q': expected a torch.Tensor"),
    ("q_int", {"q": torch.ones(2, 5, 4, 8, dtype=torch.int32)}, TypeError, "argument 'q'"),
    ("k_dtype", {"k": t(2, 7, 2, 8, dtype=torch.float64)}, TypeError,
     "flashgrad::forward: argument 'k': expected dtype f32, got dtype f64"),
    ("q_ndim", {"q": t(5, 4, 8)}, ValueError, "argument 'q': expected 4 dimensions"),
    ("heads_not_dividing", {"k": t(2, 7, 3, 8), "v": t(2, 7, 3, 8)}, ValueError,
     "flashgrad::forward: argument 'k': expected heads_kv >= 1 dividing heads_q"),
    ("head_dim_mismatch", {"k": t(2, 7, 2, 6)}, ValueError, "flashgrad::forward: argument 'k': expected shape"),
    ("seqlen_mismatch", {"v": t(2, 6, 2, 8)}, ValueError, "flashgrad::forward: argument 'v': expected shape"),
    ("head_dim_too_big", {"q": t(1, 2, 1, 513), "k": t(1, 2, 1, 513), "v": t(1, 2, 1, 8)}, ValueError,
     "head_dim in [1, 512]"),
    ("dropout_one", {"dropout_p": 1.0}, ValueError, "argument 'dropout_p': expected a value in [0, 1)"),
    ("dropout_negative", {"dropout_p": -0.1}, ValueError, "dropout_p"),
    ("dropout_str", {"dropout_p": "0.1"}, TypeError, "dropout_p"),
    ("scale_zero", {"softmax_scale": 0.0}, ValueError, "argument 'softmax_scale': expected a finite value > 0"),
    ("scale_negative", {"softmax_scale": -1.0}, ValueError, "softmax_scale"),
    ("scale_inf", {"softmax_scale": float("inf")}, ValueError, "softmax_scale"),
    ("scale_str", {"softmax_scale": "x"}, TypeError, "softmax_scale"),
    ("window_below_minus_one", {"window_size": (-2, 0)}, ValueError,
     "flashgrad::forward: argument 'window_left': expected a value >= -1"),
    ("window_not_pair", {"window_size": (1, 2, 3)}, TypeError, "window_size"),
    ("window_float", {"window_size": (1.5, 2)}, TypeError, "window_size"),
    ("softcap_negative", {"softcap": -1.0}, ValueError, "flashgrad::forward: argument 'softcap'"),
    ("alibi_shape", {"alibi_slopes": torch.ones(3)}, ValueError,
     "flashgrad::forward: argument 'alibi_slopes': expected shape [4] or [2, 4]"),
    ("alibi_dtype", {"alibi_slopes": torch.ones(4, dtype=torch.float64)}, TypeError,
     "flashgrad::forward: argument 'alibi_slopes': expected dtype f32"),
    ("sinks_shape", {"sinks": torch.zeros(3)}, ValueError, "flashgrad::forward: argument 'sinks': expected shape [4]"),
    ("sinks_int", {"sinks": torch.zeros(4, dtype=torch.int64)}, TypeError, "sinks"),
    ("bias_shape", {"attn_bias": torch.zeros(2, 4, 5, 6)}, ValueError,
     "flashgrad::forward: argument 'bias': expected shape broadcastable to [2, 4, 5, 7]"),
    ("bias_int", {"attn_bias": torch.zeros(5, 7, dtype=torch.int32)}, TypeError, "attn_bias"),
    ("bias_5d", {"attn_bias": torch.zeros(1, 2, 4, 5, 7)}, ValueError, "attn_bias"),
    ("mask_float", {"attn_mask": torch.ones(5, 7)}, TypeError, "argument 'attn_mask': expected dtype torch.bool"),
    ("mask_shape", {"attn_mask": torch.ones(3, 5, 7, dtype=torch.bool)}, ValueError,
     "flashgrad::forward: argument 'mask': expected shape broadcastable"),
    ("meta_device", {"q": torch.empty(2, 5, 4, 8, device="meta")}, ValueError, "expected a CPU tensor"),
]


@pytest.mark.parametrize("name,over,exc,msg", FLASH_CASES, ids=[c[0] for c in FLASH_CASES])
def test_flash_attn_func_errors(name, over, exc, msg):
    args = {"q": Q, "k": K, "v": V}
    args.update(over)
    with pytest.raises(exc) as info:
        flash_attn_func(**args)
    assert msg in str(info.value)


VARLEN_CASES = [
    ("cu_int64", {"cu_seqlens_q": CU.long()}, TypeError, "argument 'cu_seqlens_q': expected dtype torch.int32"),
    ("cu_decreasing", {"cu_seqlens_k": torch.tensor([0, 4, 3], dtype=torch.int32)}, ValueError,
     "flashgrad::forward: argument 'cu_seqlens_k': expected non-decreasing offsets"),
    ("cu_past_end", {"cu_seqlens_q": torch.tensor([0, 3, 9], dtype=torch.int32), "max_seqlen_q": 6},
     ValueError, "flashgrad::forward: argument 'cu_seqlens_q': expected offsets within the packed length 5"),
    ("cu_batch_mismatch", {"cu_seqlens_k": torch.tensor([0, 5], dtype=torch.int32)}, ValueError, "cu_seqlens_k"),
    ("max_too_small", {"max_seqlen_q": 2}, ValueError, "argument 'max_seqlen_q': expected at least"),
    ("max_not_int", {"max_seqlen_k": 3.0}, TypeError, "max_seqlen_k"),
    ("q_4d", {"q": t(1, 5, 4, 8)}, ValueError, "argument 'q': expected 3 dimensions"),
]


@pytest.mark.parametrize("name,over,exc,msg", VARLEN_CASES, ids=[c[0] for c in VARLEN_CASES])
def test_varlen_errors(name, over, exc, msg):
    args = {"q": t(5, 4, 8), "k": t(5, 2, 8), "v": t(5, 2, 8), "cu_seqlens_q": CU, "cu_seqlens_k": CU,
            "max_seqlen_q": 3, "max_seqlen_k": 3}
    args.update(over)
    with pytest.raises(exc) as info:
        flash_attn_varlen_func(**args)
    assert msg in str(info.value)


def test_packed_errors():
    with pytest.raises(ValueError, match="size 3 in dim 2"):
        flash_attn_qkvpacked_func(t(2, 5, 2, 4, 8))
    with pytest.raises(ValueError, match="argument 'qkv': expected 5 dimensions"):
        flash_attn_qkvpacked_func(t(2, 5, 3, 4))
    with pytest.raises(ValueError, match="size 2 in dim 2"):
        flash_attn_kvpacked_func(Q, t(2, 7, 3, 2, 8))


SDPA_CASES = [
    ("mask_and_causal", {"attn_mask": torch.ones(5, 7, dtype=torch.bool), "is_causal": True}, ValueError,
     "argument 'attn_mask': expected None when is_causal=True"),
    ("gqa_not_enabled", {"key": t(2, 2, 7, 8), "value": t(2, 2, 7, 8)}, ValueError, "enable_gqa=True"),
    ("gqa_not_dividing", {"key": t(2, 3, 7, 8), "value": t(2, 3, 7, 8), "enable_gqa": True}, ValueError,
     "flashgrad::forward: argument 'k': expected heads_kv >= 1 dividing heads_q"),
    ("mask_int", {"attn_mask": torch.ones(5, 7, dtype=torch.int64)}, TypeError, "attn_mask"),
    ("query_2d", {"query": t(5, 8)}, ValueError, "argument 'query'"),
    ("key_ndim", {"key": t(4, 7, 8)}, ValueError, "argument 'key': expected 4 dimensions"),
    ("scale_zero", {"scale": 0.0}, ValueError, "softmax_scale"),
    ("value_dtype", {"value": t(2, 4, 7, 8, dtype=torch.bfloat16)}, TypeError,
     "flashgrad::forward: argument 'v': expected dtype f32, got dtype bf16"),
]


@pytest.mark.parametrize("name,over,exc,msg", SDPA_CASES, ids=[c[0] for c in SDPA_CASES])
def test_sdpa_errors(name, over, exc, msg):
    args = {"query": t(2, 4, 5, 8), "key": t(2, 4, 7, 8), "value": t(2, 4, 7, 8)}
    args.update(over)
    with pytest.raises(exc) as info:
        sdpa(**args)
    assert msg in str(info.value)


def test_array_api_errors():
    q = np.zeros((1, 3, 2, 4), np.float32)
    with pytest.raises(TypeError, match="expected an array exporting DLPack"):
        flashgrad.forward(q, "k", q)
    with pytest.raises(TypeError, match="float32, float64, float16, uint8/bool or int32"):
        flashgrad.forward(q.astype(np.complex64), q, q)
    ro = np.zeros((1, 3, 2, 4), np.float32)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="argument 'out': expected a writable array"):
        flashgrad.forward(q, q, q, out=ro)
    with pytest.raises(ValueError, match="flashgrad::forward: argument 'out': expected memory that does not overlap 'q'"):
        flashgrad.forward(q, q, q, out=q)
    with pytest.raises(ValueError, match="flashgrad::forward: argument 'lse': expected shape"):
        flashgrad.forward(q, q, q, lse=np.zeros((1, 3, 2), np.float32))
    with pytest.raises(ValueError, match="seed"):
        flashgrad.forward(q, q, q, seed=-1)
    with pytest.raises(ValueError, match="argument 'return_dbias'"):
        flashgrad.backward(q, q, q, q, np.zeros((1, 2, 3), np.float32), q, return_dbias=True)
    with pytest.raises(ValueError, match="flashgrad::dropout_keep_mask"):
        flashgrad.dropout_keep_mask(1, 1, 2, 2, dropout_p=0.5, out=np.zeros((1, 1, 2, 3), np.uint8))


def test_nothing_written_on_error():
    q = np.ones((1, 3, 2, 4), np.float32)
    out = np.full((1, 3, 2, 4), 7.0, np.float32)
    with pytest.raises(ValueError):
        flashgrad.forward(q, q, q, out=out, window_size=(-5, 0))
    assert np.all(out == 7.0)
