"""Options::block and flashgrad.merge from Python: one attention computed as blocks of query and
key rows at their global offsets, merged, matches the whole under flash-attn's rule (err <= 2 *
err(math path in the same precision) + noise, against float64). The ring layers are built on it."""
import math

import pytest
import torch

import flashgrad
from conftest import assert_rule, attention_math, cancellation_noise

B, LQ, LK, H, HKV, D, DV = 2, 40, 70, 4, 2, 24, 16
Q_CUTS, K_CUTS = (0, 17, 40), (0, 30, 31, 70)  # uneven blocks, one of a single key


def blocks(cuts):
    return [(a, b - a) for a, b in zip(cuts, cuts[1:])]


def math_path(q, k, v, dout, compute, causal, parts=None, reverse=False):
    q, k, v = (x.detach().to(compute).requires_grad_() for x in (q, k, v))
    out, lse = attention_math(q, k, v, compute=compute, causal=causal, window=(5, 9), parts=parts,
                              reverse=reverse)
    out.backward(dout.to(compute))
    return out.detach(), lse.detach(), {"dq": q.grad, "dk": k.grad, "dv": v.grad}


@pytest.mark.parametrize("causal", [False, True])
def test_blocks_merged_match_the_whole(causal):
    q, k, v = torch.randn(B, LQ, H, D), torch.randn(B, LK, HKV, D), torch.randn(B, LK, HKV, DV)
    dout = torch.randn(B, LQ, H, DV)
    kw = dict(causal=causal, window_size=(5, 9))
    out = torch.zeros(B, LQ, H, DV)
    lse = torch.full((B, H, LQ), -math.inf)
    for q0, nq in blocks(Q_CUTS):
        for k0, nk in blocks(K_CUTS):
            o_part, lse_part = flashgrad.forward(q[:, q0:q0 + nq], k[:, k0:k0 + nk], v[:, k0:k0 + nk],
                                                 block=(q0, k0, LQ, LK), **kw)
            flashgrad.merge(out[:, q0:q0 + nq], lse[:, :, q0:q0 + nq], o_part, lse_part)
    grads = {"dq": torch.zeros_like(q), "dk": torch.zeros_like(k), "dv": torch.zeros_like(v)}
    for q0, nq in blocks(Q_CUTS):
        for k0, nk in blocks(K_CUTS):
            g = flashgrad.backward(q[:, q0:q0 + nq], k[:, k0:k0 + nk], v[:, k0:k0 + nk], out[:, q0:q0 + nq],
                                   lse[:, :, q0:q0 + nq], dout[:, q0:q0 + nq], block=(q0, k0, LQ, LK), **kw)
            grads["dq"][:, q0:q0 + nq] += g.dq
            grads["dk"][:, k0:k0 + nk] += g.dk
            grads["dv"][:, k0:k0 + nk] += g.dv
    parts = {}
    ref_out, ref_lse, ref_g = math_path(q, k, v, dout, torch.float64, causal, parts)
    paths = [math_path(q, k, v, dout, torch.float32, causal, reverse=r) for r in (False, True)]
    assert_rule("out", out, tuple(p[0] for p in paths), ref_out, torch.float32)
    seen = torch.isfinite(ref_lse)  # rows that see no key: -inf in both
    assert torch.equal(torch.isfinite(lse), seen)
    assert_rule("lse", lse[seen], tuple(p[1][seen] for p in paths), ref_lse[seen], torch.float32)
    cancel = cancellation_noise(q, dout, ref_out, parts, torch.float32)
    for n in ("dq", "dk", "dv"):
        assert_rule(n, grads[n], tuple(p[2][n] for p in paths), ref_g[n], torch.float32, cancel.get(n, 0.0))


def test_merge_rows_that_saw_no_key():
    o_acc, lse_acc = torch.randn(1, 3, 2, 4), torch.tensor([[[-math.inf, 0.5, 1.0]] * 2])
    o_part, lse_part = torch.randn(1, 3, 2, 4), torch.tensor([[[0.25, -math.inf, 1.0]] * 2])
    before = o_acc.clone()
    flashgrad.merge(o_acc, lse_acc, o_part, lse_part)
    assert torch.equal(o_acc[:, 0], o_part[:, 0]) and torch.equal(o_acc[:, 1], before[:, 1])
    assert torch.equal(lse_acc[..., :2], torch.tensor([[[0.25, 0.5]] * 2]))
    torch.testing.assert_close(o_acc[:, 2], (before[:, 2] + o_part[:, 2]) / 2)
    torch.testing.assert_close(lse_acc[..., 2], torch.full((1, 2), 1.0 + math.log(2)))


def test_block_and_merge_errors():
    q, k = torch.randn(1, 8, 2, 16), torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match=r"flashgrad::forward: argument 'block': expected 0 <= q_offset"):
        flashgrad.forward(q, k, k, block=(4, 0, 8, 8))
    with pytest.raises(TypeError, match=r"argument 'block': expected 4 ints"):
        flashgrad.forward(q, k, k, block=(0, 0, 8))
    o, lse = flashgrad.forward(q, k, k)
    with pytest.raises(ValueError, match=r"flashgrad::merge: argument"):
        flashgrad.merge(o, lse, o[:, :4], lse)
    with pytest.raises(TypeError, match=r"flashgrad::merge: argument .*dtype"):
        flashgrad.merge(o, lse, o.double(), lse.double())
