#!/usr/bin/env python3
"""End-to-end training with transformers on the CPU: attn_implementation "FlashGrad", "sdpa"
and "eager" side by side, in one run.

    <venv>/bin/python bench/train_e2e.py [--contexts 1024,2048,4096,8192,16384] [--steps 6]
                                         [--models llama,mistral_window] [--impls FlashGrad,sdpa,eager]
                                         [--dtype f32|bf16] [--rounds R] [--out DIR]

Models are built from configs written here and randomly initialised (no downloads): a
Llama-style model (6 layers, d_model 512, 8 query heads over 2 K/V heads, head dim 64) and the
same with Mistral's sliding window (1024 keys). Each (model, context, implementation) trains in
its own process from the same seed on the same batches (a copy task: the second half of each
sequence repeats the first, so the loss falls), with AdamW, batch 1, float32 (--dtype bf16:
weights, activations and attention in bfloat16, as a model cast with .to(torch.bfloat16)
trains). After one warm-up step it reports tokens per second (the median step), the process's
peak resident memory, every step's loss, and the time the median step spent in attention,
forward and backward (the model's attention function timed between two autograd nodes): the
rest of the step is the same for every implementation, so it bounds what any attention can
gain (the "with attention free" column). A configuration whose attention would not fit in
memory (eager's scores grow as L^2) is reported as such instead of run. Writes
DIR/train_e2e.json, .md and .png.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from proc_stats import cpu_model, mem_available, run_json_child, vmhwm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPLS = ("FlashGrad", "sdpa", "eager")


def _config(name: str, context: int):
    import transformers

    common = dict(vocab_size=512, hidden_size=512, intermediate_size=1376, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                  max_position_embeddings=max(context, 2048))
    if name == "llama":
        return transformers.LlamaConfig(**common)
    if name == "mistral_window":
        return transformers.MistralConfig(**common, sliding_window=1024)
    raise ValueError(f"train_e2e: argument '--models': expected llama or mistral_window, got {name!r}")


def _batches(context: int, steps: int, vocab: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    half = context // 2
    out = []
    for _ in range(steps):
        first = torch.randint(0, vocab, (1, half), generator=g)
        out.append(torch.cat([first, first], dim=1))
    return out


def child(cfg: dict) -> dict:
    import torch
    import transformers

    import flashgrad.torch
    import flashgrad.transformers  # noqa: F401  (registers "FlashGrad")

    torch.set_num_threads(cfg["threads"])
    flashgrad.torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    clock = _time_attention(torch, transformers)
    config = _config(cfg["model"], cfg["context"])
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=cfg["impl"])
    model.to({"f32": torch.float32, "bf16": torch.bfloat16}[cfg["dtype"]])
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, times, attn = [], [], []
    for ids in _batches(cfg["context"], cfg["steps"] + 1, config.vocab_size, seed=1):
        clock.seconds = 0.0
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        attn.append(clock.seconds)
        losses.append(loss.item())
    i = times.index(statistics.median_low(times[1:]), 1)
    return {"tokens_per_s": cfg["context"] / times[i], "step_s": times[i], "attention_s": attn[i],
            "peak_bytes": vmhwm(), "losses": losses}


def _time_attention(torch, transformers):
    """Adds the wall time of every attention call, forward and backward, to clock.seconds.

    The model's attention function (whichever attn_implementation picks) is wrapped between two
    autograd nodes: the backward reaches the one after it first and the one before it last, so
    the time between them is the attention's backward (its GQA expansion included)."""

    class Clock:
        seconds = 0.0
        began = 0.0

    clock = Clock()

    class Before(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            return q.view_as(q), k.view_as(k), v.view_as(v)

        @staticmethod
        def backward(ctx, dq, dk, dv):
            clock.seconds += time.perf_counter() - clock.began
            return dq, dk, dv

    class After(torch.autograd.Function):
        @staticmethod
        def forward(ctx, out):
            return out.view_as(out)

        @staticmethod
        def backward(ctx, dout):
            clock.began = time.perf_counter()
            return dout

    interface = transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS
    get = interface.get_interface

    def timed_interface(name, default):
        fn = get(name, default)

        def timed(module, q, k, v, *args, **kwargs):
            q, k, v = Before.apply(q, k, v)
            t0 = time.perf_counter()
            out, weights = fn(module, q, k, v, *args, **kwargs)
            clock.seconds += time.perf_counter() - t0
            return After.apply(out), weights

        return timed

    interface.get_interface = timed_interface
    return clock


def _eager_fits(cfg: dict) -> bool:
    """eager keeps each layer's scores and probabilities ([heads, L, L]) for backward: 12 bytes an
    element in float32, and as many in bfloat16, whose softmax runs in float32 before the cast."""
    need = cfg["context"] ** 2 * 8 * 12 * 6
    return need < 0.8 * mem_available()


def run(cfg: dict) -> dict:
    if cfg["impl"] == "eager" and not _eager_fits(cfg):
        return {"error": "does not fit in memory"}
    return run_json_child(os.path.abspath(__file__), cfg)


def report(rows, meta, out_dir):
    lines = [f"# End-to-end training on the CPU\n\n{meta['cpu']}, {meta['threads']} threads, {meta['dtype']}, "
             f"torch {meta['torch']}, "
             f"transformers {meta['transformers']}. Command: `{meta['command']}`\n",
             "| model | context | impl | tokens/s | over sdpa | attention's share of the step | "
             "over sdpa with attention free | peak MiB | first / last loss |",
             "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        sdpa = _sdpa_of(rows, r)
        res = r["result"]
        if "error" in res:
            lines.append(f"| {r['model']} | {r['context']} | {r['impl']} | {res['error']} | | | |")
            continue
        rel = f"{res['tokens_per_s'] / sdpa['result']['tokens_per_s']:.2f}x" if sdpa else "-"
        # Amdahl: the step's other work stays, so even attention in no time gains at most this.
        free = f"{sdpa['result']['step_s'] / (res['step_s'] - res['attention_s']):.2f}x" if sdpa else "-"
        lines.append(f"| {r['model']} | {r['context']} | {r['impl']} | {res['tokens_per_s']:.0f} | {rel} "
                     f"| {res['attention_s'] / res['step_s']:.2f} | {free} "
                     f"| {res['peak_bytes'] / 2**20:.0f} | {res['losses'][0]:.3f} / {res['losses'][-1]:.3f} |")
    lines += _round_medians(rows)
    with open(os.path.join(out_dir, "train_e2e.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    _plot([r for r in rows if r.get("round", 0) == 0], meta, os.path.join(out_dir, "train_e2e.png"))


def _sdpa_of(rows, r):
    """The sdpa row of r's model, context and round, if it ran."""
    return next((x for x in rows if x["model"] == r["model"] and x["context"] == r["context"]
                 and x.get("round", 0) == r.get("round", 0) and x["impl"] == "sdpa"
                 and "error" not in x["result"]), None)


def _round_medians(rows) -> list:
    """With several rounds, each implementation's tokens/s over sdpa's, round by round, and their median."""
    if max(r.get("round", 0) for r in rows) == 0:
        return []
    out, seen = ["", "Over sdpa, round by round, and the median:", ""], set()
    for r in rows:
        key = (r["model"], r["context"], r["impl"])
        if r["impl"] == "sdpa" or key in seen:
            continue
        seen.add(key)
        ratios = []
        for x in rows:
            sdpa = _sdpa_of(rows, x)
            if (x["model"], x["context"], x["impl"]) == key and "error" not in x["result"] and sdpa:
                ratios.append(x["result"]["tokens_per_s"] / sdpa["result"]["tokens_per_s"])
        if ratios:
            out.append(f"- {key[0]} {key[1]} {key[2]}: " + ", ".join(f"{v:.2f}x" for v in ratios)
                       + f"; median {statistics.median(ratios):.2f}x")
    return out


def _plot(rows, meta, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for model, style in (("llama", "-"), ("mistral_window", "--")):
        for impl in IMPLS:
            sel = sorted((r for r in rows if r["model"] == model and r["impl"] == impl and "error" not in r["result"]),
                         key=lambda r: r["context"])
            if not sel:
                continue
            xs = [r["context"] for r in sel]
            axes[0].plot(xs, [r["result"]["tokens_per_s"] for r in sel], style, marker="o", label=f"{model} {impl}")
            axes[1].plot(xs, [r["result"]["peak_bytes"] / 2**20 for r in sel], style, marker="o",
                         label=f"{model} {impl}")
            longest = sel[-1]
            axes[2].plot(longest["result"]["losses"], style, label=f"{model} {impl} L={longest['context']}")
    axes[0].set_title("tokens/s")
    axes[1].set_title("peak memory (MiB)")
    axes[2].set_title("loss per step, longest context run")
    for ax in axes[:2]:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{meta['cpu']}, {meta['threads']} threads, {meta['dtype']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--contexts", default="1024,2048,4096,8192,16384")
    ap.add_argument("--models", default="llama,mistral_window")
    ap.add_argument("--steps", type=int, default=6, help="timed steps after one warm-up step")
    ap.add_argument("--impls", default=",".join(IMPLS), help="attn_implementation values to run")
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of every implementation per model and context, the order reversed each round; "
                         "the report gives the median of each round's ratio over sdpa")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "train_e2e"))
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return 0
    import torch
    import transformers

    os.makedirs(a.out, exist_ok=True)
    meta = {"cpu": cpu_model(), "threads": a.threads, "dtype": a.dtype, "torch": torch.__version__,
            "transformers": transformers.__version__,
            "command": " ".join(sys.argv)}
    rows = []
    impls = a.impls.split(",")
    for impl in impls:
        if impl not in IMPLS:
            ap.error(f"argument --impls: expected a list of {', '.join(IMPLS)}, got {impl!r}")
    for model in a.models.split(","):
        for context in (int(x) for x in a.contexts.split(",")):
            for rnd, impl in ((r, i) for r in range(a.rounds) for i in (impls if r % 2 == 0 else impls[::-1])):
                cfg = {"model": model, "context": context, "impl": impl, "steps": a.steps, "threads": a.threads,
                       "dtype": a.dtype}
                row = dict(cfg, round=rnd, result=run(cfg))
                rows.append(row)
                res = row["result"]
                print(f"{model:>15} L={context:<6} {impl:>9}: " + (res["error"] if "error" in res else
                      f"{res['tokens_per_s']:8.0f} tokens/s, attention {res['attention_s'] / res['step_s']:.2f} "
                      f"of the step, {res['peak_bytes'] / 2**20:6.0f} MiB, "
                      f"loss {res['losses'][0]:.3f} -> {res['losses'][-1]:.3f}"), flush=True)
                with open(os.path.join(a.out, "train_e2e.json"), "w") as f:
                    json.dump({"meta": meta, "rows": rows}, f, indent=1)
    report(rows, meta, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
