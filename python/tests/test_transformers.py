"""attn_implementation="FlashGrad" in Hugging Face transformers: tiny randomly initialised models
of each architecture, logits and every parameter's gradient under the tolerance rule. The
reference is the model in float64 with conftest's float64 attention math registered as its
attention ("fp64_math": transformers' eager attention takes its softmax in float32 even for
float64 models); the same-precision path is "eager" in float32. Skipped without transformers."""
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
import flashgrad.transformers  # noqa: E402,F401  (registers "FlashGrad")
from flashgrad.transformers import NAME  # noqa: E402
from conftest import assert_rule, attention_math  # noqa: E402

SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256)


def _configs():
    t = transformers
    return {
        "llama": lambda: t.LlamaConfig(**SMALL),
        "qwen2": lambda: t.Qwen2Config(**SMALL),
        "qwen3": lambda: t.Qwen3Config(**SMALL),
        "mistral_window": lambda: t.MistralConfig(**SMALL, sliding_window=7),
        "gemma2_softcap_window": lambda: t.Gemma2Config(**SMALL, sliding_window=6, attn_logit_softcapping=5.0,
                                                        final_logit_softcapping=None, query_pre_attn_scalar=16),
        "gemma3_window": lambda: t.Gemma3TextConfig(**SMALL, sliding_window=5),
        "gpt_oss_sinks": lambda: t.GptOssConfig(**dict(SMALL, intermediate_size=32), num_local_experts=4,
                                                num_experts_per_tok=2, sliding_window=6,
                                                layer_types=["sliding_attention", "full_attention"]),
    }


def _fp64_math(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
               softcap=None, is_causal=None, s_aux=None, **kwargs):
    """The float64 reference as a transformers attention function (its mask: sdpa's)."""
    is_causal = module.is_causal if is_causal is None else is_causal
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))
    kw = dict(scale=scaling, softcap=float(softcap or 0.0), sinks=s_aux)
    if attention_mask is not None:
        kw["mask"] = attention_mask
    else:
        kw["causal"] = bool(is_causal)
        if sliding_window and k.shape[1] > sliding_window:
            kw["window"] = (sliding_window - 1, 0 if is_causal else sliding_window - 1)
    out, _ = attention_math(q, k, v, **kw)
    return out.to(query.dtype), None


transformers.AttentionInterface.register("fp64_math", _fp64_math)
transformers.masking_utils.AttentionMaskInterface.register("fp64_math", transformers.masking_utils.sdpa_mask)


def _model(name, impl, dtype):
    torch.manual_seed(0)
    cfg = _configs()[name]()
    cfg._attn_implementation = impl
    extra = {"experts_implementation": "eager"} if name == "gpt_oss_sinks" else {}  # grouped_mm has no float64
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, **extra).to(dtype)
    if name == "gpt_oss_sinks":  # sinks start at 0: give them values, so a wrong sink term shows
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_()
    return model


def _run(model, ids, mask):
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask)
    logits = out.logits
    keep = mask.bool() if mask is not None else torch.ones(ids.shape, dtype=torch.bool)
    weight = torch.randn(logits.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    (logits.double() * weight * keep[..., None]).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach()[keep], grads


@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("name", list(_configs()))
def test_matches_eager_under_the_rule(name, padded):
    """Each tensor's rule is taken over two input draws at once (the tensors of both, stacked): a
    single draw's same-precision error can come out far below its typical size in one of the
    ~30 parameter tensors, which no summation order of the kernels would match."""
    mask = None
    if padded:  # one left-padded and one right-padded row
        mask = torch.ones(2, 19, dtype=torch.long)
        mask[0, :5] = 0
        mask[1, 15:] = 0
    models = {key: _model(name, impl, dt) for key, impl, dt in (("ref", "fp64_math", torch.float64),
                                                               ("same", "eager", torch.float32),
                                                               ("got", NAME, torch.float32))}
    runs = {key: [] for key in models}
    for seed in (1, 2):
        ids = torch.randint(0, SMALL["vocab_size"], (2, 19), generator=torch.Generator().manual_seed(seed))
        for key, model in models.items():
            runs[key].append(_run(model, ids, mask))
    stack = {key: (torch.cat([r[0] for r in rs]), {p: torch.stack([r[1][p] for r in rs]) for p in rs[0][1]})
             for key, rs in runs.items()}
    ref, same, got = stack["ref"], stack["same"], stack["got"]
    assert_rule(f"{name} logits", got[0], same[0], ref[0], torch.float32)
    assert set(got[1]) == set(ref[1])
    for param in ref[1]:
        assert_rule(f"{name} grad {param}", got[1][param], same[1][param], ref[1][param], torch.float32)


def test_padding_runs_varlen_not_a_dense_mask(monkeypatch):
    calls = []
    import flashgrad.transformers as backend

    real = backend.flash_attn_varlen_func
    monkeypatch.setattr(backend, "flash_attn_varlen_func", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    model = _model("llama", NAME, torch.float32)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :3] = 0
    model(input_ids=torch.randint(0, 97, (2, 9)), attention_mask=mask)
    assert len(calls) == 2 and calls[0].tolist() == [0, 6, 15]


def test_fallback_warns_once_and_gives_sdpa():
    ids = torch.randint(0, SMALL["vocab_size"], (1, 11), generator=torch.Generator().manual_seed(2))
    sdpa = _model("llama", "sdpa", torch.float32)
    fg = _model("llama", NAME, torch.float32)
    want = sdpa(input_ids=ids).logits
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = fg(input_ids=ids, output_attentions=True).logits
        fg(input_ids=ids, output_attentions=True)
    msgs = [str(w.message) for w in caught if "flashgrad attention backend" in str(w.message)]
    assert len(msgs) == 1 and "output_attentions=True" in msgs[0]
    assert torch.equal(got, want)


def test_fallback_refuses_what_sdpa_cannot_do():
    model = _model("gpt_oss_sinks", NAME, torch.float32)
    with pytest.raises(ValueError, match="sdpa cannot stand in for it: it has no attention sinks"):
        model(input_ids=torch.randint(0, 97, (1, 8)), output_attentions=True)
