#!/usr/bin/env python3
"""Short sequences against each implementation's own long-sequence rate.

    <venv>/bin/python bench/peer_short.py [--dtypes f32,bf16] [--dims 64,128] [--rounds 3]

`flashgrad bench --features` holds B * L = 2048 and divides the rate at L = 256 and
128 by the rate at L = 2048. This prints the same ratios for torch 2.x's native CPU
flash attention (F.scaled_dot_product_attention with SDPBackend.FLASH_ATTENTION) and
for flashgrad.torch.scaled_dot_product_attention, both on [B, 8, L, d] tensors, full
and causal: how much of its own long-sequence rate each keeps when the work comes as
many short sequences. Rounds alternate which implementation goes first; each ratio is
the median over rounds of a rate over the same round's L = 2048 rate. Rates count the
visible pairs, the backward 2.5x the forward's FLOPs, as the features table does.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashgrad.torch as fgt

SHAPES = [(1, 2048), (8, 256), (16, 128)]  # (B, L), B * L = 2048
HEADS = 8
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def implementations(causal: bool) -> dict:
    def peer(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def flashgrad(q, k, v):
        return fgt.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return {"torch": peer, "flashgrad": flashgrad}


def inputs(dtype, d: int) -> dict:
    g = torch.Generator().manual_seed(0)
    out = {}
    for b, l in SHAPES:
        qkv = [torch.randn(b, HEADS, l, d, generator=g).to(dtype).requires_grad_(True) for _ in range(3)]
        out[(b, l)] = (*qkv, torch.randn(b, HEADS, l, d, generator=g).to(dtype))
    return out


def timed(fn, q, k, v, dout, reps: int) -> tuple:
    """Median forward and backward seconds over reps calls."""
    fwd, bwd = [], []
    for _ in range(reps):
        q.grad = k.grad = v.grad = None
        t0 = time.perf_counter()
        o = fn(q, k, v)
        t1 = time.perf_counter()
        o.backward(dout)
        fwd.append(t1 - t0)
        bwd.append(time.perf_counter() - t1)
    return statistics.median(fwd), statistics.median(bwd)


def flops(b: int, l: int, d: int, causal: bool) -> float:
    pairs = b * HEADS * (l * (l + 1) / 2 if causal else l * l)
    return 4.0 * d * pairs


def run(dtype_name: str, d: int, causal: bool, rounds: int) -> None:
    impls = implementations(causal)
    data = inputs(DTYPES[dtype_name], d)
    for fn in impls.values():  # warm-up
        for shape in SHAPES:
            timed(fn, *data[shape], 1)
    times = {}
    for r in range(rounds):
        names = list(impls) if r % 2 == 0 else list(impls)[::-1]
        for name in names:
            for shape in SHAPES:
                reps = 3 if shape[1] == 2048 else 15
                times.setdefault((name, shape), []).append(timed(impls[name], *data[shape], reps))
    for name in impls:
        for p, pass_name in enumerate(("forward", "backward")):
            mul = 1.0 if p == 0 else 2.5
            rate = {s: [mul * flops(*s, d, causal) / t[p] / 1e9 for t in times[(name, s)]] for s in SHAPES}
            long = rate[SHAPES[0]]
            cells = [f"L {l} {statistics.median(a / c for a, c in zip(rate[(b, l)], long)):.2f}" for b, l in SHAPES[1:]]
            print(f"{dtype_name:4s} d {d:3d} {'causal' if causal else 'full  '} {name:9s} {pass_name:8s} "
                  f"L 2048 {statistics.median(long):4.0f} GFLOP/s; " + ", ".join(cells), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="default: torch's")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {HEADS} heads, B * L = 2048, median of {a.rounds} rounds")
    for dtype_name in a.dtypes.split(","):
        for d in (int(x) for x in a.dims.split(",")):
            for causal in (False, True):
                run(dtype_name, d, causal, a.rounds)


if __name__ == "__main__":
    main()
