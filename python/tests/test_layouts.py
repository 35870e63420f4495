"""Strides pass through: BHSD views of BSHD memory, sliced / strided / expanded inputs,
packed tensors. Results must be bitwise those of contiguous inputs (the library is
deterministic and reads exactly the elements the views name), and no copy may be made."""
import pytest
import torch

import flashgrad
from flashgrad.torch import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    scaled_dot_product_attention,
)

B, L, H, D = 2, 70, 4, 16


def grads_of(fn, *xs):
    xs = [x.detach().clone().requires_grad_() if x.is_contiguous() else x for x in xs]
    out = fn(*xs)
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype))
    return out.detach(), [x.grad for x in xs]


@pytest.fixture
def no_copies(monkeypatch):
    """Makes .contiguous(), .clone() and .copy_() on tensors an error inside the call."""
    def boom(*_a, **_k):
        raise AssertionError("a copy was made")

    def arm():
        for name in ("contiguous", "clone", "copy_"):
            monkeypatch.setattr(torch.Tensor, name, boom)
    return arm


def test_dlpack_passes_strides():
    x = torch.randn(B, H, L, D).transpose(1, 2)[:, ::2, :, 1::3]
    shape, strides, dtype = flashgrad._core._ext.describe(x)
    assert list(shape) == list(x.shape) and list(strides) == list(x.stride()) and dtype == "f32"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_bhsd_view_of_bshd_memory_sdpa(dtype, no_copies):
    # A transformer's usual path: x @ W -> (B, L, H*D) -> view (B, L, H, D) -> transpose to BHSD.
    mem = [torch.randn(B, L, H * D).to(dtype).requires_grad_() for _ in range(3)]
    views = [m.view(B, L, H, D).transpose(1, 2) for m in mem]
    dense = [v.detach().contiguous().requires_grad_() for v in views]
    ref_out = scaled_dot_product_attention(*dense, is_causal=True)
    ref_out.sum().backward()
    no_copies()
    out = scaled_dot_product_attention(*views, is_causal=True)
    out.sum().backward()
    assert torch.equal(out, ref_out)
    assert out.shape == (B, H, L, D) and out.is_contiguous()
    for m, d in zip(mem, dense):
        assert torch.equal(m.grad.view(B, L, H, D).transpose(1, 2), d.grad)


def test_noncontiguous_inputs_bitwise(no_copies):
    big_q = torch.randn(B, 2 * L, H, 3 * D)
    big_k = torch.randn(B, L, 2 * H, D).transpose(0, 1)  # batch stride smaller than seq stride
    q = big_q[:, ::2, :, ::3]                            # strided seqlen and head_dim
    k = big_k.transpose(0, 1)[:, :, 1::2]                # every other head
    v = torch.randn(D, B, L, H).permute(1, 2, 3, 0)      # head_dim outermost in memory
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    dense = [x.detach().contiguous().requires_grad_() for x in (q, k, v)]
    ref_out = flash_attn_func(*dense, causal=True)
    ref_out.sum().backward()
    no_copies()
    out = flash_attn_func(q, k, v, causal=True)
    out.sum().backward()
    assert torch.equal(out, ref_out)
    for x, d in zip((q, k, v), dense):
        assert torch.equal(x.grad, d.grad)


def test_noncontiguous_leaf_gradients_keep_layout():
    q = torch.randn(B, H, L, D).transpose(1, 2).requires_grad_()  # BSHD view, BHSD memory
    k = torch.randn(B, H, L, D).transpose(1, 2).requires_grad_()
    v = torch.randn(B, H, L, D).transpose(1, 2).requires_grad_()
    dense = [x.detach().contiguous().requires_grad_() for x in (q, k, v)]
    flash_attn_func(q, k, v).sum().backward()
    flash_attn_func(*dense).sum().backward()
    for x, d in zip((q, k, v), dense):
        assert torch.equal(x.grad, d.grad)
        assert x.grad.stride() == x.stride()  # written in place in the input's own layout


def test_expanded_kv_stride_zero():
    # MQA emulated by expanding one kv head: stride 0 over heads, gradient summed by autograd.
    q = torch.randn(B, L, H, D, requires_grad=True)
    k1 = torch.randn(B, L, 1, D, requires_grad=True)
    v1 = torch.randn(B, L, 1, D, requires_grad=True)
    out = flash_attn_func(q, k1.expand(B, L, H, D), v1.expand(B, L, H, D), causal=True)
    out.sum().backward()
    k2, v2 = k1.detach().clone().requires_grad_(), v1.detach().clone().requires_grad_()
    out2 = flash_attn_func(q.detach(), k2, v2, causal=True)  # native MQA
    out2.sum().backward()
    assert torch.allclose(out, out2, atol=1e-6)
    assert torch.allclose(k1.grad, k2.grad, atol=1e-5) and torch.allclose(v1.grad, v2.grad, atol=1e-5)


def test_packed_equals_unpacked():
    qkv = torch.randn(B, L, 3, H, D, requires_grad=True)
    out, qkv_g = grads_of(lambda x: flash_attn_qkvpacked_func(x, causal=True), qkv)
    q, k, v = (qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3))
    out2, g = grads_of(lambda a, b, c: flash_attn_func(a, b, c, causal=True), q, k, v)
    assert torch.equal(out, out2)
    assert torch.equal(qkv_g[0], torch.stack(g, dim=2))
    q = torch.randn(B, L, H, D)
    kv = torch.randn(B, L, 2, 2, D)
    out, (gq, gkv) = grads_of(lambda a, b: flash_attn_kvpacked_func(a, b), q, kv)
    k, v = (kv[:, :, i].clone() for i in range(2))
    out2, (gq2, gk, gv) = grads_of(flash_attn_func, q, k, v)
    assert torch.equal(out, out2) and torch.equal(gq, gq2) and torch.equal(gkv, torch.stack((gk, gv), 2))


def test_numpy_views():
    np = pytest.importorskip("numpy")
    x = np.random.default_rng(0).standard_normal((B, H, L, D)).astype(np.float32)
    q = x.transpose(0, 2, 1, 3)  # BSHD view of BHSD memory, no copy
    out, lse = flashgrad.forward(q, q, q, causal=True)
    out2, lse2 = flashgrad.forward(np.ascontiguousarray(q), np.ascontiguousarray(q),
                                   np.ascontiguousarray(q), causal=True)
    assert np.array_equal(out, out2) and np.array_equal(lse, lse2)
