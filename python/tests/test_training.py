"""A small attention module in real training steps: flashgrad and the math path move the
loss the same way under the same optimizer."""
import copy
import math

import torch
from torch import nn

from flashgrad.torch import flash_attn_func, scaled_dot_product_attention


def math_attention(q, k, v, causal):
    # (B, L, H, D) materialized attention, bottom-right causal (L_q == L_k here).
    s = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])
    if causal:
        L = q.shape[1]
        s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), -math.inf)
    return torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v)


class Block(nn.Module):
    def __init__(self, dim=32, heads=4, impl="flash"):
        super().__init__()
        self.heads, self.impl = heads, impl
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.sinks = nn.Parameter(torch.zeros(heads))

    def forward(self, x):
        B, L, C = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, C // self.heads).unbind(2)  # strided views
        if self.impl == "flash":
            o = flash_attn_func(q, k, v, causal=True, sinks=self.sinks)
        elif self.impl == "sdpa":
            o = scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True).transpose(1, 2)
        else:
            o = math_attention(q, k, v, causal=True)
        return x + self.proj(o.reshape(B, L, C))


def run(model, x, y, steps=3):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_optimizer_steps_match_math_path():
    x, y = torch.randn(4, 48, 32), torch.randn(4, 48, 32)
    base = Block(impl="math")
    with torch.no_grad():
        base.sinks.fill_(-30.0)  # exp(-30) ~ 1e-13: the sink is negligible, so the math path (no sink) matches
    for impl in ("flash", "sdpa"):
        model = copy.deepcopy(base)
        model.impl = impl
        got = run(model, x, y)
        want = run(copy.deepcopy(base), x, y)
        assert got[-1] < got[0] and want[-1] < want[0]
        for a, b in zip(got, want):
            assert abs(a - b) <= 1e-5 * abs(b)


def test_sinks_learn():
    x, y = torch.randn(2, 32, 32), torch.randn(2, 32, 32)
    model = Block()
    before = model.sinks.detach().clone()
    run(model, x, y, steps=2)
    assert not torch.equal(before, model.sinks.detach())
