"""scaled_dot_product_attention against torch 2.x's documented math (written out here)."""
import math

import pytest
import torch

from flashgrad.torch import scaled_dot_product_attention as sdpa


def torch2_sdpa(query, key, value, attn_mask=None, dropout_mask=None, dropout_p=0.0, is_causal=False,
                scale=None, enable_gqa=False):
    """torch 2's reference implementation (its docs), in float64, dropout by a given keep mask."""
    query, key, value = (x.double() for x in (query, key, value))
    L, S = query.size(-2), key.size(-2)
    scale_factor = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    attn_bias = torch.zeros(L, S, dtype=torch.float64)
    if is_causal:
        temp_mask = torch.ones(L, S, dtype=torch.bool).tril(diagonal=0)
        attn_bias = attn_bias.masked_fill(temp_mask.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_bias = attn_bias.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            attn_bias = attn_mask.double() + attn_bias
    if enable_gqa:
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    attn_weight = query @ key.transpose(-2, -1) * scale_factor
    attn_weight = attn_weight + attn_bias
    attn_weight = torch.softmax(attn_weight, dim=-1)
    if dropout_mask is not None:
        attn_weight = attn_weight * dropout_mask / (1 - dropout_p)
    return attn_weight @ value


def rand(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


def check(kwargs, q, k, v, ref_kwargs=None, leaves=()):
    out = sdpa(q, k, v, **kwargs)
    ref = torch2_sdpa(q, k, v, **(ref_kwargs or kwargs))
    assert out.shape == ref.shape
    assert torch.allclose(out, ref, atol=1e-12, rtol=1e-10)
    g = torch.randn(ref.shape, dtype=torch.float64)
    xs = (q, k, v) + tuple(leaves)
    got = torch.autograd.grad(out, xs, g)
    want = torch.autograd.grad(ref, xs, g)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-11, rtol=1e-9)


@pytest.mark.parametrize("L,S", [(5, 9), (9, 5), (7, 7), (1, 70), (70, 1)])
def test_is_causal_is_top_left(L, S):
    check({"is_causal": True}, rand(2, 3, L, 8), rand(2, 3, S, 8), rand(2, 3, S, 6))


def test_bool_mask_true_means_attend():
    mask = torch.rand(2, 1, 6, 9) > 0.5
    mask[..., 0] = True  # no fully masked row here: torch's math would give NaN there
    check({"attn_mask": mask}, rand(2, 3, 6, 8), rand(2, 3, 9, 8), rand(2, 3, 9, 8))


def test_float_mask_is_additive_and_differentiable():
    m = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)  # 2-D, broadcast to (N, H, L, S)
    q, k, v = rand(2, 3, 6, 8), rand(2, 3, 9, 8), rand(2, 3, 9, 8)
    # float64 masks are read as float32: compare against the rounded mask.
    m32 = m.float().double()
    out = sdpa(q, k, v, attn_mask=m)
    ref = torch2_sdpa(q, k, v, attn_mask=m32)
    assert torch.allclose(out, ref, atol=1e-12)
    (gm,) = torch.autograd.grad(out.sum(), (m,))
    (gr,) = torch.autograd.grad(torch2_sdpa(q, k, v, attn_mask=m).sum(), (m,))
    assert torch.allclose(gm, gr, atol=1e-6)


def test_scale_and_gqa():
    check({"scale": 0.3, "enable_gqa": True}, rand(2, 6, 5, 8), rand(2, 2, 7, 8), rand(2, 2, 7, 4))


def test_three_dim_inputs():
    mask = torch.rand(5, 7) > 0.3
    mask[:, 0] = True
    check({"attn_mask": mask}, rand(3, 5, 8), rand(3, 7, 8), rand(3, 7, 8))


def test_dropout_follows_torch_generator():
    q, k, v = rand(2, 3, 6, 8), rand(2, 3, 9, 8), rand(2, 3, 9, 8)
    torch.manual_seed(7)
    a = sdpa(q, k, v, dropout_p=0.4)
    torch.manual_seed(7)
    b = sdpa(q, k, v, dropout_p=0.4)
    c = sdpa(q, k, v, dropout_p=0.4)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_fully_masked_row_is_zero():
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2] = False
    out = sdpa(rand(1, 2, 4, 8), rand(1, 2, 6, 8), rand(1, 2, 6, 8), attn_mask=mask)
    assert torch.all(out[:, :, 2] == 0) and torch.isfinite(out).all()


def test_float_mask_with_minus_inf():
    # torch users often build additive masks with -inf; a partly -inf row is plain masking.
    m = torch.zeros(6, 9, dtype=torch.float32)
    m[1, :4] = -math.inf
    m[3, 5:] = -math.inf
    check({"attn_mask": m}, rand(2, 3, 6, 8), rand(2, 3, 9, 8), rand(2, 3, 9, 8))
    m[2] = -math.inf  # a fully masked row: 0, no NaN, no gradient
    q = rand(1, 2, 6, 8)
    out = sdpa(q, rand(1, 2, 9, 8), rand(1, 2, 9, 8), attn_mask=m)
    out.sum().backward()
    assert torch.all(out[:, :, 2] == 0) and torch.isfinite(q.grad).all() and torch.all(q.grad[:, :, 2] == 0)
