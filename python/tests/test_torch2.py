"""torch >= 2.4: the custom ops (opcheck), torch.compile(fullgraph=True) and torch.export, and
route_sdpa against torch's own scaled_dot_product_attention. Skipped on older torch."""
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import flashgrad.torch as fgt
from conftest import assert_rule

if not hasattr(torch.library, "custom_op"):
    pytest.skip("torch < 2.4: no custom ops", allow_module_level=True)

from flashgrad.torch import _ops  # noqa: E402


def rand(*shape, dtype=torch.float32, grad=True):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


def op_args(inputs, layout="bshd", *, bias=None, sinks=None, mask=None, cu=None, dropout_p=0.0, causal=False,
            key_limit=-1, window=(-1, -1), softcap=0.0, scale=None):
    rng = torch.tensor([5, 9], dtype=torch.int64) if dropout_p else None
    cu_q, cu_k = cu if cu is not None else (None, None)
    return [list(inputs), bias, sinks, None, mask, cu_q, cu_k, rng, layout, key_limit, scale, causal,
            window[0], window[1], softcap, dropout_p, 0]


CU = torch.tensor([0, 5, 5, 12], dtype=torch.int32)
OP_CASES = {
    "plain": lambda: op_args([rand(2, 9, 4, 16), rand(2, 11, 4, 16), rand(2, 11, 4, 16)]),
    "gqa_causal_window_softcap": lambda: op_args([rand(1, 12, 6, 8), rand(1, 12, 2, 8), rand(1, 12, 2, 4)],
                                                 causal=True, window=(5, 0), softcap=20.0),
    "bias_sinks_f64": lambda: op_args([rand(1, 6, 2, 8, dtype=torch.float64) for _ in range(3)],
                                      bias=rand(1, 2, 6, 1), sinks=rand(2)),
    "mask_bf16": lambda: op_args([rand(2, 7, 2, 16, dtype=torch.bfloat16) for _ in range(3)],
                                 mask=(torch.rand(2, 1, 7, 7) > 0.3).view(torch.uint8)),
    "bhsd_key_limit": lambda: op_args([rand(2, 3, 5, 8), rand(2, 3, 9, 8), rand(2, 3, 9, 8)], "bhsd",
                                      causal=True, key_limit=5),
    "qkv_packed_dropout": lambda: op_args([rand(2, 8, 3, 2, 16)], "qkv", dropout_p=0.25),
    "varlen_f16": lambda: op_args([rand(12, 4, 8, dtype=torch.float16), rand(12, 2, 8, dtype=torch.float16),
                                   rand(12, 2, 8, dtype=torch.float16)], cu=(CU, CU), causal=True),
}


@pytest.mark.parametrize("case", list(OP_CASES))
def test_opcheck_forward(case):
    torch.library.opcheck(torch.ops.flashgrad.attention_forward.default, OP_CASES[case]())


@pytest.mark.parametrize("case", ["plain", "bias_sinks_f64", "qkv_packed_dropout", "bhsd_key_limit"])
def test_opcheck_backward(case):
    args = OP_CASES[case]()
    inputs, bias, sinks, rest = args[0], args[1], args[2], args[3:]
    out, lse = _ops.attention_forward(*args)
    dout = torch.randn_like(out)
    # What the forward's gradient passes: saved tensors, no autograd history (no double backward).
    bias, sinks = (None if t is None else t.detach() for t in (bias, sinks))
    bwd = [[x.detach() for x in inputs], out.detach(), lse.detach(), dout, bias, sinks, *rest,
           bias is not None, sinks is not None]
    torch.library.opcheck(torch.ops.flashgrad.attention_backward.default, bwd)


def _grads(fn, xs):
    out = fn(*xs)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    return (out, *torch.autograd.grad((out * weight).sum(), xs))


def _assert_same(eager, compiled):
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compile_fullgraph_matches_eager(dtype):
    def attn(q, k, v, bias, sinks):
        return fgt.flash_attn_func(q, k, v, causal=True, window_size=(6, 0), softcap=30.0,
                                   attn_bias=bias, sinks=sinks)

    xs = (rand(2, 16, 4, 32, dtype=dtype), rand(2, 20, 2, 32, dtype=dtype), rand(2, 20, 2, 32, dtype=dtype),
          rand(1, 4, 1, 20), rand(4))
    torch._dynamo.reset()
    _assert_same(_grads(attn, xs), _grads(torch.compile(attn, fullgraph=True), xs))


def test_compile_fullgraph_sdpa_drop_in_and_packed():
    def sdpa(q, k, v):
        return fgt.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def packed(qkv):
        return fgt.flash_attn_qkvpacked_func(qkv, causal=True)

    torch._dynamo.reset()
    xs = (rand(2, 4, 9, 16), rand(2, 2, 13, 16), rand(2, 2, 13, 16))
    _assert_same(_grads(sdpa, xs), _grads(torch.compile(sdpa, fullgraph=True), xs))
    xs = (rand(2, 10, 3, 2, 16),)
    _assert_same(_grads(packed, xs), _grads(torch.compile(packed, fullgraph=True), xs))


class _Block(torch.nn.Module):
    """Calls torch's own SDPA, as models written for torch 2 do."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, -1)


def test_export_and_compiled_routing():
    torch.manual_seed(1)
    block, x = _Block(), torch.randn(2, 24, 32)
    with fgt.route_sdpa() as route:
        eager = block(x)
        compiled = torch.compile(block, fullgraph=True)(x)
        exported = torch.export.export(block, (x,))
    assert route.served >= 3 and not route.fallbacks
    assert torch.equal(eager, compiled)
    targets = [str(n.target) for n in exported.graph.nodes]
    assert any("flashgrad.attention_forward" in t for t in targets)
    assert torch.equal(exported.module()(x), eager)


SDPA_CASES = {
    "causal_square": dict(shape=((2, 4, 33, 64), (2, 4, 33, 64)), kw=dict(is_causal=True)),
    "causal_lq_lt_lk": dict(shape=((1, 2, 17, 32), (1, 2, 40, 32)), kw=dict(is_causal=True)),
    "causal_lq_gt_lk": dict(shape=((1, 2, 40, 32), (1, 2, 17, 32)), kw=dict(is_causal=True)),
    "bool_mask": dict(shape=((2, 2, 20, 16), (2, 2, 30, 16)), mask="bool"),
    "float_mask_scale": dict(shape=((2, 2, 20, 16), (2, 2, 30, 16)), mask="float", kw=dict(scale=0.2)),
    "gqa": dict(shape=((1, 8, 24, 64), (1, 2, 24, 64)), kw=dict(enable_gqa=True, is_causal=True)),
    "three_dim": dict(shape=((3, 21, 16), (3, 21, 16)), kw=dict(is_causal=True)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_route_sdpa_matches_torch(case, dtype):
    """Both torch's SDPA and the routed call against torch's SDPA in float64, under the rule
    err(flashgrad) <= 2 * err(torch in the same dtype) + noise, out and every gradient."""
    c = SDPA_CASES[case]
    (qs, ks), kw = c["shape"], dict(c.get("kw", {}))
    x64 = [torch.randn(s, dtype=torch.float64) for s in (qs, ks, ks)]
    if "mask" in c:
        m = torch.rand(qs[-2], ks[-2]) > 0.3
        m[:, 0] = True
        kw["attn_mask"] = m if c["mask"] == "bool" else torch.where(m, 0.0, -1e4).to(dtype)
    ref = _grads(lambda *xs: F.scaled_dot_product_attention(*xs, **_kw64(kw)), [x.requires_grad_() for x in x64])
    xs = [x.detach().to(dtype).requires_grad_() for x in x64]
    same = _grads(lambda *t: F.scaled_dot_product_attention(*t, **kw), xs)
    with fgt.route_sdpa() as route:
        got = _grads(lambda *t: F.scaled_dot_product_attention(*t, **kw), xs)
    assert route.served == 1 and not route.fallbacks
    for name, g, s, r in zip(("out", "dq", "dk", "dv"), got, same, ref):
        assert_rule(f"{case} {name}", g, s, r, dtype)


def _kw64(kw):
    m = kw.get("attn_mask")
    return dict(kw, attn_mask=m.double()) if m is not None and m.is_floating_point() else kw


def test_route_sdpa_hands_back_what_it_cannot_serve():
    q = torch.randn(2, 2, 8, 16)
    five_d = torch.randn(2, 1, 2, 8, 16)
    cases = [
        ((q, q, q), dict(scale=-0.5), "scale"),                        # flashgrad needs scale > 0
        ((five_d, five_d, five_d), {}, "5-D"),                         # batch dims beyond one
        ((q, q, q), dict(attn_mask=torch.ones(8, 8, dtype=torch.int64)), "attn_mask dtype"),
        ((q.to(torch.float64), q, q), {}, "dtypes"),                  # torch's own error, its words
        ((torch.empty(2, 2, 8, 16, device="meta"),) * 3, {}, "dense CPU"),
    ]
    for args, kw, reason in cases:
        try:
            want = F.scaled_dot_product_attention(*args, **kw)
        except RuntimeError as e:
            want = e
        with fgt.route_sdpa() as route:
            try:
                got = F.scaled_dot_product_attention(*args, **kw)
            except RuntimeError as e:
                got = e
        assert route.served == 0 and any(reason in r for r in route.fallbacks), (reason, route.fallbacks)
        if isinstance(want, Exception):
            assert type(got) is type(want) and str(got) == str(want)
        elif want.device.type == "cpu":
            assert torch.equal(got, want)
        else:
            assert got.shape == want.shape and got.device == want.device


def test_flash_attn_rejects_other_devices_and_grad_masks():
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(ValueError, match="argument 'q': expected a CPU tensor, got device meta"):
        fgt.flash_attn_func(q.to("meta"), q, q)
    with pytest.raises(TypeError, match="argument 'attn_mask': expected dtype torch.bool or torch.uint8"):
        fgt.flash_attn_func(q, q, q, attn_mask=torch.zeros(4, 4, requires_grad=True))


def test_import_refuses_old_torch():
    code = ("import torch; torch.__version__ = '1.12.1+cpu'\n"
            "try:\n    import flashgrad.torch\nexcept ImportError as e:\n    print(e)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "flashgrad.torch: needs torch >= 1.13, found torch 1.12.1+cpu" in res.stdout
