#!/usr/bin/python3
"""PyTorch's decomposed attention, timed for `flashgrad-lab sweep`.

    out = softmax(q k^T * scale + mask) v,  then out.backward(dout)

as an unfused model computes it: q, k, v [batch, heads, seqlen, head_dim]
(PyTorch's matmul layout), every step in the storage dtype, the causal mask
additive (0 or -inf) and aligned bottom-right as flashgrad's. The sweep runs
each configuration in a fresh process and reads its peak memory (ru_maxrss).

Before timing, the same code runs on a small problem against a float64
computation of it, so that a wrong mask or scale is caught rather than timed.

Prints one line:
    fwd_ms=<median> bwd_ms=<median> fwd_bwd_ms=<median of each run's sum> runs=<n> check_err=<e> vmhwm=<bytes>
With --floor it only imports torch and prints torch=<version> vmhwm=<bytes>:
the process's memory floor.

usage: torch_attention.py --seqlen L [--heads H] [--head-dim D] [--dtype f32|bf16]
                          [--causal] [--threads T] [--min-time S] [--floor]
"""
import argparse
import sys
import time


def attention(torch, q, k, v, mask, scale):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        s = s + mask
    return torch.matmul(torch.softmax(s, dim=-1), v)


def causal_mask(torch, lq, lk, dtype):
    # Query i sees keys j <= i + lk - lq.
    return torch.full((lq, lk), float("-inf"), dtype=dtype).triu(lk - lq + 1)


def tensors(torch, batch, heads, seqlen, head_dim, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (batch, heads, seqlen, head_dim)
    q, k, v, dout = (torch.randn(shape, generator=g).to(dtype) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_(True)
    return q, k, v, dout


def check(torch, dtype, causal):
    """Largest error of out, dq, dk, dv against float64, relative to each one's largest value."""
    lq = lk = 96
    q, k, v, dout = tensors(torch, 1, 2, lq, 32, dtype, 7)
    scale = 32 ** -0.5
    mask = causal_mask(torch, lq, lk, dtype) if causal else None
    out = attention(torch, q, k, v, mask, scale)
    out.backward(dout)
    q64, k64, v64 = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    mask64 = causal_mask(torch, lq, lk, torch.float64) if causal else None
    out64 = attention(torch, q64, k64, v64, mask64, scale)
    out64.backward(dout.double())
    worst = 0.0
    for got, want in ((out, out64), (q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        err = (got.double() - want).abs().max().item() / want.abs().max().item()
        worst = max(worst, err)
    return worst


def vm_hwm_bytes():
    """This program's peak resident memory (VmHWM: since exec, unlike ru_maxrss)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlen", type=int, default=0)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--floor", action="store_true")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if args.floor:
        print(f"torch={torch.__version__} vmhwm={vm_hwm_bytes()}")
        return 0
    if args.seqlen < 1:
        ap.error("--seqlen is required")
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]

    # A wrong computation must not be timed: bf16 keeps 8 bits, so 2^-5
    # relative is far above its rounding but far below a wrong mask's error.
    err = check(torch, dtype, args.causal)
    if not err <= (2 ** -5 if dtype == torch.bfloat16 else 1e-4):
        print(f"check_err={err:.3g} error=the_torch_attention_disagrees_with_float64")
        return 1

    q, k, v, dout = tensors(torch, args.batch, args.heads, args.seqlen, args.head_dim, dtype, 1)
    mask = causal_mask(torch, args.seqlen, args.seqlen, dtype) if args.causal else None
    scale = args.head_dim ** -0.5

    def run():
        t0 = time.perf_counter()
        out = attention(torch, q, k, v, mask, scale)
        t1 = time.perf_counter()
        out.backward(dout)
        t2 = time.perf_counter()
        q.grad = k.grad = v.grad = None
        return t1 - t0, t2 - t1

    run()  # warm-up: first-touch of the score matrices, thread pool start
    fwd, bwd = [], []
    while len(fwd) < 20 and (len(fwd) < 3 or sum(fwd) + sum(bwd) < args.min_time):
        f, b = run()
        fwd.append(f)
        bwd.append(b)

    def median(xs):
        xs = sorted(xs)
        n = len(xs)
        return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])

    both = [f + b for f, b in zip(fwd, bwd)]
    print(f"fwd_ms={1e3 * median(fwd):.4f} bwd_ms={1e3 * median(bwd):.4f} fwd_bwd_ms={1e3 * median(both):.4f} "
          f"runs={len(fwd)} check_err={err:.3g} vmhwm={vm_hwm_bytes()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
