#!/usr/bin/python3
"""Associative recall at long context: a small transformer learns it with flashgrad attention.

Each sequence is a haystack of random filler tokens with NUM_PAIRS (key, value) tokens hidden
at random positions; the last NUM_QUERIES tokens ask for keys that occur in it, and the model
must output the value stored with each. Nothing but attention can carry a value from a random
position thousands of tokens back to the query, so the task is solved only if attention (and the
gradients that train it) are right at that length. Chance accuracy is 1 / NUM_VALUES.

The same model (same initial weights, same batches) is trained twice while the sequences are
short enough for materialized ("naive") PyTorch attention; at long context only flashgrad runs.
A sweep then times one training step and measures its peak memory against sequence length for
both implementations. Everything is written to --out: a PNG plot and a JSON log.

    PYTHONPATH=build/python /usr/bin/python3 examples/long_context_recall.py
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time

import torch
from torch import nn

NUM_FILLERS = 32     # haystack symbols
NUM_KEYS = 64        # key vocabulary; each sequence uses NUM_PAIRS distinct keys
NUM_VALUES = 16      # answers (chance = 1/16)
NUM_PAIRS = 16       # (key, value) tokens hidden in each sequence
NUM_QUERIES = 16     # the last positions ask for keys


# ----------------------------------------------------------------------------- data

def make_batch(batch: int, seqlen: int, gen: torch.Generator):
    """Token fields (type, filler, key, value), each (batch, seqlen) int64, and the targets
    (batch, NUM_QUERIES). type: 0 filler, 1 pair (key + value), 2 query (key)."""
    typ = torch.zeros(batch, seqlen, dtype=torch.long)
    filler = torch.randint(1, NUM_FILLERS + 1, (batch, seqlen), generator=gen)
    key = torch.zeros(batch, seqlen, dtype=torch.long)
    val = torch.zeros(batch, seqlen, dtype=torch.long)
    targets = torch.empty(batch, NUM_QUERIES, dtype=torch.long)
    body = seqlen - NUM_QUERIES
    for b in range(batch):
        keys = torch.randperm(NUM_KEYS, generator=gen)[:NUM_PAIRS] + 1
        vals = torch.randint(1, NUM_VALUES + 1, (NUM_PAIRS,), generator=gen)
        pos = torch.randperm(body, generator=gen)[:NUM_PAIRS]
        typ[b, pos], key[b, pos], val[b, pos] = 1, keys, vals
        ask = torch.randint(0, NUM_PAIRS, (NUM_QUERIES,), generator=gen)
        typ[b, body:], key[b, body:] = 2, keys[ask]
        targets[b] = vals[ask] - 1
    filler[typ != 0] = 0
    return (typ, filler, key, val), targets


# ----------------------------------------------------------------------------- model

def flashgrad_attention(q, k, v):
    """q, k, v: (batch, seqlen, heads, head_dim) strided views of the qkv projection."""
    from flashgrad.torch import flash_attn_func

    return flash_attn_func(q, k, v, causal=True)


def local_attention(q, k, v, window=256):
    """The control: each query sees only the previous `window` tokens."""
    from flashgrad.torch import flash_attn_func

    return flash_attn_func(q, k, v, causal=True, window_size=(window, 0))


def naive_attention(q, k, v):
    """Materialized causal attention: the (batch, heads, seqlen, seqlen) scores are stored."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    seqlen = q.shape[2]
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    s = s.masked_fill(torch.ones(seqlen, seqlen, dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2)


ATTENTION = {"flashgrad": flashgrad_attention, "naive": naive_attention, "local": local_attention}


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, attention):
        B, L, C = x.shape
        # (B, L, 3, H, D) -> three (B, L, H, D) views, no copies: flashgrad reads the strides.
        q, k, v = self.qkv(self.ln1(x)).view(B, L, 3, self.heads, C // self.heads).unbind(2)
        x = x + self.proj(attention(q, k, v).reshape(B, L, C))
        return x + self.mlp(self.ln2(x))


class RecallModel(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 2, layers: int = 2):
        super().__init__()
        self.typ = nn.Embedding(3, dim)
        self.filler = nn.Embedding(NUM_FILLERS + 1, dim, padding_idx=0)
        self.key = nn.Embedding(NUM_KEYS + 1, dim, padding_idx=0)
        self.val = nn.Embedding(NUM_VALUES + 1, dim, padding_idx=0)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, NUM_VALUES)
        self.impl = "flashgrad"

    def forward(self, fields):
        typ, filler, key, val = fields
        x = self.typ(typ) + self.filler(filler) + self.key(key) + self.val(val)
        for block in self.blocks:
            x = block(x, ATTENTION[self.impl])
        return self.head(self.ln(x[:, -NUM_QUERIES:]))  # logits at the query positions


def attention_bytes_naive(batch, heads, layers, seqlen):
    # Per layer the autograd graph keeps the scores, the masked scores and the softmax output
    # (3 x B*H*L*L float32); backward adds about as much again, transiently.
    return layers * 3 * batch * heads * seqlen * seqlen * 4


# ----------------------------------------------------------------------------- progress

class Progress:
    """A one-line progress bar on stderr (no dependency)."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.start, self.n = total, label, time.time(), 0

    def update(self, **stats):
        self.n += 1
        frac = self.n / self.total
        bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
        elapsed = time.time() - self.start
        eta = elapsed / self.n * (self.total - self.n)
        info = " ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items())
        sys.stderr.write(f"\r{self.label} [{bar}] {self.n}/{self.total} {elapsed:5.0f}s eta {eta:4.0f}s {info}  ")
        sys.stderr.flush()
        if self.n == self.total:
            sys.stderr.write("\n")


# ----------------------------------------------------------------------------- training

def parse_stages(text):
    stages = []
    for s in text.split(","):
        seqlen, steps, batch, lr = s.split(":")
        stages.append((int(seqlen), int(steps), int(batch), float(lr)))
    return stages


def accuracy(model, impl, seqlen, batch, batches, seed):
    """Held-out recall accuracy on fresh sequences."""
    model.impl, gen = impl, torch.Generator().manual_seed(seed)
    correct = total = 0
    with torch.no_grad():
        for _ in range(batches):
            fields, targets = make_batch(batch, seqlen, gen)
            correct += (model(fields).argmax(-1) == targets).sum().item()
            total += targets.numel()
    model.impl = "flashgrad"
    return correct / total, total


def gradient_agreement(model, seqlen):
    """max |grad_flashgrad - grad_naive| / max |grad_naive| over all parameters, one batch."""
    fields, targets = make_batch(1, seqlen, torch.Generator().manual_seed(7))
    grads = {}
    for impl in ("flashgrad", "naive"):
        model.impl = impl
        model.zero_grad()
        loss = nn.functional.cross_entropy(model(fields).reshape(-1, NUM_VALUES), targets.reshape(-1))
        loss.backward()
        grads[impl] = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    model.impl = "flashgrad"
    model.zero_grad()
    return ((grads["flashgrad"] - grads["naive"]).abs().max() / grads["naive"].abs().max()).item()


def train(args, log):
    stages = parse_stages(args.stages)
    torch.manual_seed(args.seed)
    base = RecallModel(args.dim, args.heads, args.layers)
    models = {"flashgrad": base}
    naive = RecallModel(args.dim, args.heads, args.layers)
    naive.load_state_dict(base.state_dict())
    naive.impl = "naive"
    models["naive"] = naive
    opts = {name: torch.optim.Adam(m.parameters()) for name, m in models.items()}
    history = {name: [] for name in models}
    step = 0
    for seqlen, steps, batch, lr in stages:
        for opt in opts.values():
            for group in opt.param_groups:
                group["lr"] = lr
        need = attention_bytes_naive(batch, args.heads, args.layers, seqlen)
        active = ["flashgrad"] + (["naive"] if need <= args.naive_budget_gib * 2**30 else [])
        if "naive" not in active:
            print(f"  naive attention skipped at L={seqlen}: its scores would take {need / 2**30:.1f} GiB "
                  f"> --naive-budget-gib {args.naive_budget_gib}")
        gen = torch.Generator().manual_seed(args.seed * 1000 + seqlen)
        bar = Progress(steps, f"L={seqlen:5d} B={batch} {'+'.join(active):15s}")
        for _ in range(steps):
            fields, targets = make_batch(batch, seqlen, gen)
            stats = {}
            for name in active:
                t0 = time.time()
                logits = models[name](fields)
                loss = nn.functional.cross_entropy(logits.reshape(-1, NUM_VALUES), targets.reshape(-1))
                opts[name].zero_grad()
                loss.backward()
                opts[name].step()
                acc = (logits.argmax(-1) == targets).float().mean().item()
                history[name].append({"step": step, "seqlen": seqlen, "loss": loss.item(), "acc": acc,
                                      "seconds": time.time() - t0})
                stats[f"{name[:5]}_loss"], stats[f"{name[:5]}_acc"] = loss.item(), acc
            bar.update(**stats)
            step += 1
        for name in active:
            tail = history[name][-min(10, steps):]
            summary = (f"  {name:9s} L={seqlen:5d}: loss {sum(r['loss'] for r in tail) / len(tail):.3f}, "
                       f"accuracy {sum(r['acc'] for r in tail) / len(tail):.3f} (last {len(tail)} steps), "
                       f"{sum(r['seconds'] for r in tail) / len(tail):.2f} s/step")
            print(summary)
            log["summary"].append(summary.strip())
    log["history"] = history
    evaluate(args, base, stages[-1][0], log)


def evaluate(args, model, seqlen, log):
    """Held-out accuracy at the last training length and at twice it, the local-attention
    control, and the gradient agreement with naive attention at the last training length."""
    ev = log["final_eval"] = {"seqlen": seqlen}
    for name, impl, length, batches in (("accuracy", "flashgrad", seqlen, args.eval_batches),
                                        ("accuracy_2x", "flashgrad", 2 * seqlen, max(1, args.eval_batches // 2)),
                                        ("accuracy_local256", "local", seqlen, args.eval_batches)):
        acc, n = accuracy(model, impl, length, 2 if length == seqlen else 1, batches, args.seed + 999)
        ev[name] = acc
        what = {"flashgrad": "full attention", "local": "control: attention limited to the last 256 tokens"}[impl]
        line = f"held-out accuracy at L={length}, {what}: {acc:.3f} over {n} queries (chance {1 / NUM_VALUES:.3f})"
        print(line)
        log["summary"].append(line)
    if attention_bytes_naive(1, args.heads, args.layers, seqlen) <= 2 * args.naive_budget_gib * 2**30:
        ev["grad_rel_diff"] = gradient_agreement(model, seqlen)
        line = (f"gradients at L={seqlen}, flashgrad vs naive attention (float32, one batch): "
                f"max |difference| / max |gradient| = {ev['grad_rel_diff']:.2e}")
        print(line)
        log["summary"].append(line)


# ----------------------------------------------------------------------------- sweep

def _status_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _measure(impl, seqlen, args_dict, queue):
    """In a fresh process: time one training step and measure its peak resident memory growth
    (Linux: writing 5 to /proc/self/clear_refs resets the VmHWM high-water mark)."""
    torch.set_num_threads(args_dict["threads"])
    torch.manual_seed(0)
    model = RecallModel(args_dict["dim"], args_dict["heads"], args_dict["layers"])
    model.impl = impl

    def step(fields, targets):
        nn.functional.cross_entropy(model(fields).reshape(-1, NUM_VALUES), targets.reshape(-1)).backward()

    step(*make_batch(1, 64, torch.Generator().manual_seed(0)))  # warm-up: thread pools, lazy init
    batch = make_batch(1, seqlen, torch.Generator().manual_seed(0))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _status_bytes("VmRSS")
    t0 = time.time()
    step(*batch)
    seconds = time.time() - t0
    queue.put({"seconds": seconds, "peak_bytes": max(0, _status_bytes("VmHWM") - base)})


def sweep(args, log):
    lengths = [int(x) for x in args.sweep.split(",") if x]
    ctx = mp.get_context("spawn")
    rows = []
    bar = Progress(len(lengths) * 2, "sweep (1 step, B=1)      ")
    for seqlen in lengths:
        row = {"seqlen": seqlen}
        for impl in ("flashgrad", "naive"):
            need = attention_bytes_naive(1, args.heads, args.layers, seqlen)
            if impl == "naive" and need > args.sweep_budget_gib * 2**30:
                row[impl] = None
                row["naive_predicted_bytes"] = need
            else:
                q = ctx.Queue()
                p = ctx.Process(target=_measure, args=(impl, seqlen, vars(args), q))
                p.start()
                row[impl] = q.get()
                p.join()
            bar.update(L=seqlen, impl=impl)
        rows.append(row)
    for r in rows:
        f, n = r["flashgrad"], r["naive"]
        naive_txt = (f"naive {n['seconds']:6.2f} s {n['peak_bytes'] / 2**20:8.1f} MiB" if n else
                     f"naive skipped (needs ~{r['naive_predicted_bytes'] / 2**30:.1f} GiB)")
        line = (f"  L={r['seqlen']:6d}: flashgrad {f['seconds']:6.2f} s {f['peak_bytes'] / 2**20:8.1f} MiB | "
                + naive_txt)
        print(line)
        log["summary"].append(line.strip())
    log["sweep"] = rows


# ----------------------------------------------------------------------------- plot

def plot(log, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    (ax_loss, ax_acc), (ax_time, ax_mem) = axes
    style = {"flashgrad": dict(color="C0", lw=1.4), "naive": dict(color="C3", lw=1.2, ls="--")}
    hist = log.get("history", {})
    for name, rows in hist.items():
        if not rows:
            continue
        steps = [r["step"] for r in rows]
        ax_loss.plot(steps, [r["loss"] for r in rows], label=f"{name} attention", **style[name])
        ax_acc.plot(steps, [r["acc"] for r in rows], label=f"{name} attention", **style[name])
    boundaries = []
    if hist.get("flashgrad"):
        rows = hist["flashgrad"]
        for a, b in zip(rows, rows[1:]):
            if a["seqlen"] != b["seqlen"]:
                boundaries.append((b["step"], b["seqlen"]))
        boundaries.insert(0, (rows[0]["step"], rows[0]["seqlen"]))
    for ax in (ax_loss, ax_acc):
        for x, L in boundaries:
            ax.axvline(x, color="gray", lw=0.8, ls=":")
            ax.text(x, 1.0, f" L={L}", transform=ax.get_xaxis_transform(), va="top", fontsize=8, color="gray")
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="center right")
    ax_loss.set_ylabel("cross-entropy loss")
    ax_acc.set_ylabel("recall accuracy (batch, before its update)")
    ax_acc.axhline(1 / NUM_VALUES, color="k", lw=0.8, ls="-.", label="chance")
    ax_acc.set_ylim(0, 1.05)
    rows = log.get("sweep", [])
    for impl in ("flashgrad", "naive"):
        pts = [(r["seqlen"], r[impl]) for r in rows if r.get(impl)]
        if pts:
            xs = [p[0] for p in pts]
            ax_time.plot(xs, [p[1]["seconds"] for p in pts], marker="o", label=impl, **style[impl])
            ax_mem.plot(xs, [p[1]["peak_bytes"] / 2**20 for p in pts], marker="o", label=impl, **style[impl])
    skipped = [(r["seqlen"], r["naive_predicted_bytes"] / 2**20) for r in rows if not r.get("naive")]
    if skipped:
        ax_mem.plot([s[0] for s in skipped], [s[1] for s in skipped], "s", mfc="none", color="C3",
                    label="naive, predicted (over budget, not run)")
    for ax, label in ((ax_time, "one training step (s), batch 1"), (ax_mem, "peak memory growth in the step (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fe = log.get("final_eval")
    title = "Associative recall with flashgrad attention"
    if fe:
        title += (f"\nheld-out accuracy {fe['accuracy']:.1%} at L={fe['seqlen']}, "
                  f"{fe['accuracy_2x']:.1%} at L={2 * fe['seqlen']}; "
                  f"{fe['accuracy_local256']:.1%} with attention limited to 256 tokens (chance {1 / NUM_VALUES:.1%})")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ----------------------------------------------------------------------------- main

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stages", default="128:150:16:1e-2,1024:30:4:1e-3,4096:20:2:3e-4",
                   help="curriculum: seqlen:steps:batch:lr,... (default %(default)s)")
    p.add_argument("--naive-budget-gib", type=float, default=1.0,
                   help="train the naive model only where its stored scores fit this budget (default %(default)s)")
    p.add_argument("--sweep", default="512,1024,2048,4096,8192,16384",
                   help="sequence lengths for the time/memory sweep ('' to skip)")
    p.add_argument("--sweep-budget-gib", type=float, default=4.0,
                   help="run naive in the sweep only below this predicted memory (default %(default)s)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--threads", type=int, default=1,
                   help="threads for torch's own (small) ops; flashgrad uses all cores (default %(default)s)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    import flashgrad

    os.makedirs(args.out, exist_ok=True)
    print(f"flashgrad {flashgrad.__version__}, ISA {flashgrad.isa()}, {flashgrad.max_threads()} threads; "
          f"torch {torch.__version__} with {torch.get_num_threads()} threads")
    print(f"task: {NUM_PAIRS} (key, value) pairs hidden among filler, {NUM_QUERIES} queries per sequence, "
          f"{NUM_VALUES} values (chance {1 / NUM_VALUES:.3f})")
    log = {"args": vars(args), "summary": []}
    t0 = time.time()
    train(args, log)
    if args.sweep:
        sweep(args, log)
    log["total_seconds"] = time.time() - t0
    with open(os.path.join(args.out, "recall.json"), "w") as f:
        json.dump(log, f, indent=1)
    plot(log, os.path.join(args.out, "recall.png"))
    print(f"wrote {os.path.join(args.out, 'recall.png')} and recall.json in {log['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()
