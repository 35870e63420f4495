"""Dropout: the keep pattern follows torch's default generator, backward replays it, and
S_dmask (return_attn_probs) encodes it the flash-attn way."""
import torch

import flashgrad
from conftest import attention_math
from flashgrad.torch import flash_attn_func, flash_attn_varlen_func

F64 = torch.float64


def rand(*shape):
    return torch.randn(*shape, dtype=F64, requires_grad=True)


def test_manual_seed_reproduces_forward_and_backward():
    q, k, v = rand(2, 33, 4, 8), rand(2, 40, 2, 8), rand(2, 40, 2, 8)
    results = []
    for _ in range(2):
        torch.manual_seed(3)
        out = flash_attn_func(q, k, v, dropout_p=0.25, causal=True)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        results.append((out, grads))
    assert torch.equal(results[0][0], results[1][0])
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))
    other = flash_attn_func(q, k, v, dropout_p=0.25, causal=True)  # generator moved on
    assert not torch.equal(other, results[0][0])


def test_s_dmask_encodes_probabilities_and_pattern():
    q, k, v = rand(2, 20, 4, 8), rand(2, 30, 2, 8), rand(2, 30, 2, 8)
    p = 0.3
    torch.manual_seed(11)
    out, lse, s_dmask = flash_attn_func(q, k, v, dropout_p=p, causal=True, return_attn_probs=True)
    assert s_dmask.shape == (2, 4, 20, 30) and lse.shape == (2, 4, 20) and lse.dtype == torch.float32
    keep = ~torch.signbit(s_dmask)
    dropped = 1 - keep[s_dmask != 0].double().mean().item()
    assert abs(dropped - p) < 0.05
    ref_out, ref_lse = attention_math(q, k, v, causal=True, keep=keep, dropout_p=p)
    assert torch.allclose(out, ref_out, atol=1e-12)
    assert torch.allclose(lse.double(), ref_lse, atol=1e-5)
    probs, _ = attention_math(q, k, torch.eye(30, dtype=F64)[None, :, None].expand(2, 30, 2, 30),
                              causal=True)  # P itself: V = identity
    assert torch.allclose(s_dmask.abs(), probs.permute(0, 2, 1, 3), atol=1e-12)
    # The backward replays the stored pattern: gradients match the math path with that mask.
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(ref_out, (q, k, v), g)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(got, want))


def test_keep_mask_binding_matches_kernels():
    # flashgrad.dropout_keep_mask is what the kernels draw: with v = identity, out is P * keep / (1-p).
    q, k = torch.randn(1, 6, 2, 4, dtype=F64), torch.randn(1, 9, 2, 4, dtype=F64)
    v = torch.eye(9, dtype=F64)[None, :, None].expand(1, 9, 2, 9)
    out, _ = flashgrad.forward(q, k, v, dropout_p=0.5, seed=5, offset=77)
    keep = torch.from_numpy(flashgrad.dropout_keep_mask(1, 2, 6, 9, dropout_p=0.5, seed=5, offset=77))
    assert torch.equal(out.permute(0, 2, 1, 3) != 0, keep.bool())


def test_no_dropout_returns_none_mask():
    q = rand(1, 5, 2, 4)
    out, lse, s_dmask = flash_attn_func(q, q, q, return_attn_probs=True)
    assert s_dmask is None and lse.shape == (1, 2, 5)


def test_varlen_s_dmask():
    cu = torch.tensor([0, 4, 11], dtype=torch.int32)
    q, k, v = rand(11, 2, 4), rand(11, 2, 4), rand(11, 2, 4)
    torch.manual_seed(5)
    out, lse, s_dmask = flash_attn_varlen_func(q, k, v, cu, cu, 8, 8, dropout_p=0.5,
                                               return_attn_probs=True)
    assert s_dmask.shape == (2, 2, 8, 8) and lse.shape == (2, 11)
    assert torch.all(s_dmask[0, :, 4:] == 0) and torch.all(s_dmask[1, :, 7:] == 0)
    keep = ~torch.signbit(s_dmask)
    for b, (s, e) in enumerate(((0, 4), (4, 11))):
        n = e - s
        ref, _ = attention_math(q[None, s:e], k[None, s:e], v[None, s:e], keep=keep[b:b + 1, :, :n, :n],
                                dropout_p=0.5)
        assert torch.allclose(out[s:e], ref[0], atol=1e-12)
