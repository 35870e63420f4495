#!/usr/bin/env python3
"""A tiny transformer trained in JAX and in MLX on the CPU, with flashgrad's attention and with
the framework's own, side by side in one run.

    <venv>/bin/python bench/train_frameworks.py [--frameworks jax,mlx] [--curve-steps 300]
                                                [--curve-length 256] [--lengths 512,...,8192]
                                                [--steps 4] [--out DIR]

The model is the same in both frameworks and both implementations, built from one numpy seed:
2 decoder layers, d_model 256, 4 query heads over 2 K/V heads of dimension 64 (GQA), causal,
RMSNorm, a GELU MLP, learned positions, float32, batch 1, Adam (lr 1e-3). It learns a copy task
(the second half of each sequence repeats the first), so the loss falls. The attention call is
the only difference: flashgrad.jax.dot_product_attention against jax.nn.dot_product_attention,
flashgrad.mlx.scaled_dot_product_attention against mx.fast.scaled_dot_product_attention.

Two parts, each run in its own child process per (framework, implementation[, length]):
1. the loss curve: --curve-steps steps at --curve-length; the report gives the largest relative
   difference between the two implementations' losses at any step;
2. speed and memory against L: one warm-up step, then the median of --steps steps (tokens/s),
   and the child's peak resident memory. A length where the framework's attention would keep
   more than 80% of MemAvailable in scores is reported as not fitting instead of run.
Writes DIR/train_frameworks.json, .md and .png.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

from proc_stats import cpu_model, mem_available, run_json_child, vmhwm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPLS = ("flashgrad", "own")
MODEL = dict(vocab=256, d_model=256, heads=4, kv_heads=2, head_dim=64, layers=2, mlp=1024)


def _init_params(max_len: int) -> dict:
    """Every weight as a float32 numpy array, from one seed."""
    import numpy as np

    m, rng = MODEL, np.random.default_rng(0)
    d, hd = m["d_model"], m["head_dim"]

    def w(*shape):
        return (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32)

    params = {"embed": w(m["vocab"], d) * math.sqrt(m["vocab"] / d), "pos": w(max_len, d) * 0.1,
              "out_norm": np.ones(d, np.float32), "unembed": w(d, m["vocab"])}
    for i in range(m["layers"]):
        params[f"l{i}"] = {"norm1": np.ones(d, np.float32), "wq": w(d, m["heads"] * hd),
                           "wk": w(d, m["kv_heads"] * hd), "wv": w(d, m["kv_heads"] * hd),
                           "wo": w(m["heads"] * hd, d), "norm2": np.ones(d, np.float32),
                           "w1": w(d, m["mlp"]), "w2": w(m["mlp"], d)}
    return params


def _batches(length: int, steps: int):
    import numpy as np

    rng = np.random.default_rng(1)
    out = []
    for _ in range(steps):
        first = rng.integers(0, MODEL["vocab"], (1, length // 2), dtype=np.int32)
        out.append(np.concatenate([first, first], axis=1))
    return out


def _forward(np_, attend, params, ids, gelu, take):
    """The model's loss; np_ is the framework's numpy-like module and attend(q, k, v) its
    attention on [B, L, H, D] (query heads H, key/value heads fewer)."""
    m = MODEL
    b, length = ids.shape
    hd = m["head_dim"]

    def norm(x, g):
        return x * g / np_.sqrt(np_.mean(x * x, axis=-1, keepdims=True) + 1e-6)

    x = take(params["embed"], ids) + params["pos"][:length]
    for i in range(m["layers"]):
        p = params[f"l{i}"]
        h = norm(x, p["norm1"])
        q = (h @ p["wq"]).reshape(b, length, m["heads"], hd)
        k = (h @ p["wk"]).reshape(b, length, m["kv_heads"], hd)
        v = (h @ p["wv"]).reshape(b, length, m["kv_heads"], hd)
        x = x + attend(q, k, v).reshape(b, length, m["heads"] * hd) @ p["wo"]
        x = x + gelu(norm(x, p["norm2"]) @ p["w1"]) @ p["w2"]
    logits = norm(x, params["out_norm"]) @ params["unembed"]
    logits, targets = logits[:, :-1], ids[:, 1:]
    lse = np_.log(np_.sum(np_.exp(logits - np_.max(logits, axis=-1, keepdims=True)), axis=-1)) + \
        np_.max(logits, axis=-1)
    picked = np_.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return np_.mean(lse - picked)


def _jax_trainer(impl: str, threads: int, max_len: int):
    import jax
    import jax.numpy as jnp

    import flashgrad.jax as fgj

    fgj.set_num_threads(threads)
    fn = fgj.dot_product_attention if impl == "flashgrad" else jax.nn.dot_product_attention
    attend = lambda q, k, v: fn(q, k, v, is_causal=True)  # noqa: E731
    params = jax.tree_util.tree_map(jnp.asarray, _init_params(max_len))
    loss_fn = lambda p, ids: _forward(jnp, attend, p, ids, jax.nn.gelu, lambda t, i: t[i])  # noqa: E731
    zeros = lambda: jax.tree_util.tree_map(jnp.zeros_like, params)  # noqa: E731
    state = {"params": params, "m": zeros(), "v": zeros(), "t": 0}

    @jax.jit
    def step(params, m, v, t, ids):
        loss, g = jax.value_and_grad(loss_fn)(params, ids)
        m = jax.tree_util.tree_map(lambda a, b: 0.9 * a + 0.1 * b, m, g)
        v = jax.tree_util.tree_map(lambda a, b: 0.999 * a + 0.001 * b * b, v, g)
        c1, c2 = 1 - 0.9 ** t, 1 - 0.999 ** t
        params = jax.tree_util.tree_map(lambda p, a, b: p - 1e-3 * (a / c1) / (jnp.sqrt(b / c2) + 1e-8), params, m, v)
        return loss, params, m, v

    def run(ids):
        state["t"] += 1
        loss, state["params"], state["m"], state["v"] = step(state["params"], state["m"], state["v"],
                                                             float(state["t"]), jnp.asarray(ids))
        return float(jax.block_until_ready(loss))
    return run


def _mlx_trainer(impl: str, threads: int, max_len: int):
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    import flashgrad.mlx as fgm

    fgm.set_num_threads(threads)
    fn = fgm.scaled_dot_product_attention if impl == "flashgrad" else mx.fast.scaled_dot_product_attention
    scale = 1.0 / math.sqrt(MODEL["head_dim"])

    def attend(q, k, v):  # [B, L, H, D] in and out; MLX's attention takes [B, H, L, D]
        t = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
        return t(fn(t(q), t(k), t(v), scale=scale, mask="causal"))

    params = _to_mlx(mx, _init_params(max_len))
    loss_fn = lambda p, ids: _forward(mx, attend, p, ids, nn.gelu, lambda t, i: t[i])  # noqa: E731
    grad_fn = mx.value_and_grad(loss_fn)
    opt = optim.Adam(learning_rate=1e-3, bias_correction=True)
    state = {"params": params}

    def run(ids):
        loss, g = grad_fn(state["params"], mx.array(ids))
        state["params"] = opt.apply_gradients(g, state["params"])
        mx.eval(loss, state["params"], opt.state)
        return loss.item()
    return run


def _to_mlx(mx, tree):
    return {k: _to_mlx(mx, v) if isinstance(v, dict) else mx.array(v) for k, v in tree.items()}


def child(cfg: dict) -> dict:
    make = _jax_trainer if cfg["framework"] == "jax" else _mlx_trainer
    run = make(cfg["impl"], cfg["threads"], cfg["length"])
    losses, times = [], []
    for ids in _batches(cfg["length"], cfg["steps"] + 1):
        t0 = time.perf_counter()
        losses.append(run(ids))
        times.append(time.perf_counter() - t0)
    step = statistics.median(times[1:])
    return {"tokens_per_s": cfg["length"] / step, "step_s": step, "peak_bytes": vmhwm(), "losses": losses}


def _own_fits(length: int) -> bool:
    """The framework's attention keeps scores and probabilities per layer ([heads, L, L] f32),
    with a temporary or two beside them."""
    need = length ** 2 * MODEL["heads"] * 4 * 4 * MODEL["layers"]
    return need < 0.8 * mem_available()


def run(cfg: dict) -> dict:
    if cfg["impl"] == "own" and not _own_fits(cfg["length"]):
        return {"error": "does not fit in memory"}
    return run_json_child(os.path.abspath(__file__), cfg)


def _curve_gap(rows, framework):
    """Largest |loss(flashgrad) - loss(own)| / loss(own) over the curve's steps."""
    got = {r["impl"]: r["result"] for r in rows if r["part"] == "curve" and r["framework"] == framework}
    if any("error" in got.get(i, {"error": 1}) for i in IMPLS):
        return None
    a, b = got["flashgrad"]["losses"], got["own"]["losses"]
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def report(rows, meta, out_dir):
    lines = [f"# A tiny transformer trained in JAX and MLX on the CPU\n\n{meta['cpu']}, {meta['threads']} threads, "
             f"jax {meta.get('jax', '-')}, mlx {meta.get('mlx', '-')}. Command: `{meta['command']}`\n",
             "| framework | loss curve: steps at L | first / last loss (flashgrad) | first / last loss (own) "
             "| largest relative gap |", "|---|---|---|---|---:|"]
    for fw in meta["frameworks"]:
        got = {r["impl"]: r["result"] for r in rows if r["part"] == "curve" and r["framework"] == fw}
        gap = _curve_gap(rows, fw)
        cells = [f"{got[i]['losses'][0]:.4f} / {got[i]['losses'][-1]:.4f}" if "losses" in got.get(i, {})
                 else got.get(i, {}).get("error", "-") for i in IMPLS]
        lines.append(f"| {fw} | {meta['curve_steps']} at {meta['curve_length']} | {cells[0]} | {cells[1]} | "
                     + (f"{gap:.1e} |" if gap is not None else "- |"))
    lines += ["", "| framework | L | impl | tokens/s | over own | peak MiB |", "|---|---:|---|---:|---:|---:|"]
    for r in (x for x in rows if x["part"] == "speed"):
        res = r["result"]
        own = next((x["result"] for x in rows if x["part"] == "speed" and x["framework"] == r["framework"]
                    and x["length"] == r["length"] and x["impl"] == "own" and "error" not in x["result"]), None)
        if "error" in res:
            lines.append(f"| {r['framework']} | {r['length']} | {r['impl']} | {res['error']} | | |")
            continue
        rel = f"{res['tokens_per_s'] / own['tokens_per_s']:.2f}x" if own else "-"
        lines.append(f"| {r['framework']} | {r['length']} | {r['impl']} | {res['tokens_per_s']:.0f} | {rel} "
                     f"| {res['peak_bytes'] / 2**20:.0f} |")
    with open(os.path.join(out_dir, "train_frameworks.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    _plot(rows, meta, os.path.join(out_dir, "train_frameworks.png"))


def _plot(rows, meta, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for fw, style in (("jax", "-"), ("mlx", "--")):
        for impl in IMPLS:
            sel = sorted((r for r in rows if r["part"] == "speed" and r["framework"] == fw and r["impl"] == impl
                          and "error" not in r["result"]), key=lambda r: r["length"])
            if sel:
                xs = [r["length"] for r in sel]
                axes[0].plot(xs, [r["result"]["step_s"] for r in sel], style, marker="o", label=f"{fw} {impl}")
                axes[1].plot(xs, [r["result"]["peak_bytes"] / 2**20 for r in sel], style, marker="o",
                             label=f"{fw} {impl}")
            curve = next((r["result"] for r in rows if r["part"] == "curve" and r["framework"] == fw
                          and r["impl"] == impl and "error" not in r["result"]), None)
            if curve:
                axes[2].plot(curve["losses"], style, label=f"{fw} {impl}")
    axes[0].set_title("seconds per training step")
    axes[1].set_title("peak memory (MiB)")
    axes[2].set_title(f"loss per step, L = {meta['curve_length']}")
    for ax in axes[:2]:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{meta['cpu']}, {meta['threads']} threads", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _print_row(row):
    res = row["result"]
    tag = f"{row['framework']:>4} {row['part']:>5} L={row['length']:<6} {row['impl']:>9}: "
    if "error" in res:
        print(tag + res["error"], flush=True)
    else:
        print(tag + f"{res['tokens_per_s']:8.0f} tokens/s, {res['peak_bytes'] / 2**20:6.0f} MiB, "
              f"loss {res['losses'][0]:.4f} -> {res['losses'][-1]:.4f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--frameworks", default="jax,mlx")
    ap.add_argument("--curve-steps", type=int, default=300)
    ap.add_argument("--curve-length", type=int, default=256)
    ap.add_argument("--lengths", default="512,1024,2048,4096,8192")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per length after one warm-up step")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "train_frameworks"))
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return 0
    frameworks = a.frameworks.split(",")
    for fw in frameworks:
        if fw not in ("jax", "mlx"):
            ap.error(f"argument --frameworks: expected a list of jax and mlx, got {fw!r}")
    os.makedirs(a.out, exist_ok=True)
    meta = {"cpu": cpu_model(), "threads": a.threads, "command": " ".join(sys.argv), "frameworks": frameworks,
            "curve_steps": a.curve_steps, "curve_length": a.curve_length}
    for fw in frameworks:
        meta[fw] = __import__("jax" if fw == "jax" else "mlx.core", fromlist=["__version__"]).__version__
    plan = [("curve", fw, a.curve_length, a.curve_steps) for fw in frameworks]
    plan += [("speed", fw, int(n), a.steps) for fw in frameworks for n in a.lengths.split(",")]
    rows = []
    for part, fw, length, steps in plan:
        for impl in IMPLS:
            cfg = {"framework": fw, "impl": impl, "length": length, "steps": steps, "threads": a.threads}
            row = dict(cfg, part=part, result=run(cfg))
            rows.append(row)
            _print_row(row)
            with open(os.path.join(a.out, "train_frameworks.json"), "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
        if part == "curve":
            gap = _curve_gap(rows, fw)
            print(f"{fw:>4} curve: largest relative loss gap {gap:.1e}" if gap is not None else f"{fw} curve: failed",
                  flush=True)
    report(rows, meta, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
