"""torch.autograd.gradcheck in float64 on small shapes, one test per feature.

Shapes cross no tile boundary on purpose (speed); tile boundaries are covered by
test_accuracy.py and by the C++ suite.
"""
import pytest
import torch
from torch.autograd import gradcheck

from flashgrad.torch import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    scaled_dot_product_attention,
)

F64 = torch.float64


def rand(*shape, grad=True):
    return torch.randn(*shape, dtype=F64).requires_grad_(grad)


def qkv(batch=2, seqlen_q=5, seqlen_k=7, heads=2, heads_kv=2, dim=4, dim_v=None):
    return (rand(batch, seqlen_q, heads, dim), rand(batch, seqlen_k, heads_kv, dim),
            rand(batch, seqlen_k, heads_kv, dim_v or dim))


CASES = {
    "plain": ({}, {}),
    "causal_q_shorter": ({}, {"causal": True}),
    "causal_q_longer": ({"seqlen_q": 7, "seqlen_k": 4}, {"causal": True}),
    "window": ({}, {"window_size": (2, 1)}),
    "causal_window": ({"seqlen_q": 6, "seqlen_k": 6}, {"causal": True, "window_size": (2, 0)}),
    "gqa": ({"heads": 4, "heads_kv": 2}, {"causal": True}),
    "mqa_head_dim_v": ({"heads": 3, "heads_kv": 1, "dim_v": 3}, {}),
    "softcap": ({}, {"softcap": 1.5, "softmax_scale": 1.3}),
    "alibi": ({}, {"causal": True, "alibi_slopes": torch.tensor([0.5, 0.25])}),
    "alibi_batch": ({}, {"alibi_slopes": torch.tensor([[0.5, 0.25], [0.125, 1.0]])}),
}


@pytest.mark.parametrize("name", CASES)
def test_flash_attn_func(name):
    shape, kw = CASES[name]
    assert gradcheck(lambda q, k, v: flash_attn_func(q, k, v, **kw), qkv(**shape))


def test_mask_with_fully_masked_row():
    q, k, v = qkv()
    mask = torch.rand(2, 1, 5, 7) > 0.4
    mask[0, 0, 2] = False  # a row that sees no key: out = 0 and zero gradient
    assert gradcheck(lambda q, k, v: flash_attn_func(q, k, v, attn_mask=mask), (q, k, v))
    out = flash_attn_func(q, k, v, attn_mask=mask)
    assert torch.all(out[0, 2] == 0)


# Bias and sinks reach the library in float32 (it reads bias as f32/bf16/f16 and sinks as f32).
# gradcheck perturbs them by eps; with the default eps = 1e-6 the perturbed float64 values would
# be rounded to float32 and the finite differences would measure rounding, not the derivative.
# So their values are multiples of 2**-8 below 8 in magnitude and eps = 2**-12: every perturbed
# value is exact in float32. The central-difference truncation error, eps**2 / 6 * |f'''| ~ 1e-8,
# stays far below gradcheck's atol = 1e-5 (q, k, v are float64 and perturbed with the same eps).
EPS = 2.0**-12


def exact(*shape):
    return (torch.randint(-256, 256, shape, dtype=F64) / 256).requires_grad_()


def test_bias_full_and_broadcast():
    q, k, v = qkv()
    full = exact(2, 2, 5, 7)
    assert gradcheck(lambda q, k, v, b: flash_attn_func(q, k, v, attn_bias=b), (q, k, v, full), eps=EPS)
    key_padding = exact(2, 1, 1, 7)  # broadcast over heads and queries: summed gradient
    assert gradcheck(lambda q, k, v, b: flash_attn_func(q, k, v, attn_bias=b, causal=True),
                     (q, k, v, key_padding), eps=EPS)


def test_sinks():
    q, k, v = qkv(heads=4, heads_kv=2)
    sinks = exact(4)
    assert gradcheck(lambda q, k, v, s: flash_attn_func(q, k, v, sinks=s, causal=True),
                     (q, k, v, sinks), eps=EPS)


def test_sinks_float32_grad_is_filled():
    q, k, v = qkv()
    sinks = torch.zeros(2, dtype=torch.float32, requires_grad=True)
    flash_attn_func(q, k, v, sinks=sinks).sum().backward()
    assert sinks.grad is not None and sinks.grad.dtype == torch.float32 and torch.all(sinks.grad != 0)


def test_dropout_fixed_seed():
    # Each call reseeds torch's generator, so every evaluation draws the same keep mask.
    def f(q, k, v):
        torch.manual_seed(1234)
        return flash_attn_func(q, k, v, dropout_p=0.3, causal=True)

    assert gradcheck(f, qkv())


def test_varlen():
    cu_q = torch.tensor([0, 3, 3, 8], dtype=torch.int32)  # an empty sequence in the middle
    cu_k = torch.tensor([0, 4, 6, 11], dtype=torch.int32)
    q, k, v = rand(8, 2, 4), rand(11, 1, 4), rand(11, 1, 4)
    assert gradcheck(lambda q, k, v: flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 5, causal=True),
                     (q, k, v))


def test_packed():
    qkv_ = rand(2, 5, 3, 2, 4)
    assert gradcheck(lambda x: flash_attn_qkvpacked_func(x, causal=True), (qkv_,))
    q, kv = rand(2, 5, 4, 4), rand(2, 6, 2, 2, 4)
    assert gradcheck(lambda q, kv: flash_attn_kvpacked_func(q, kv, window_size=(1, 1)), (q, kv))


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(4, 6), (6, 4), (5, 5)])
def test_sdpa_causal_top_left(seqlen_q, seqlen_k):
    q, k, v = rand(2, 2, seqlen_q, 4), rand(2, 2, seqlen_k, 4), rand(2, 2, seqlen_k, 4)
    assert gradcheck(lambda q, k, v: scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v))


def test_sdpa_float_mask_gqa():
    q, k, v = rand(1, 4, 3, 4), rand(1, 2, 5, 4), rand(1, 2, 5, 4)
    m = exact(1, 1, 3, 5)
    assert gradcheck(lambda q, k, v, m: scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
                     (q, k, v, m), eps=EPS)
