#!/usr/bin/env python3
"""What a Python call of flashgrad costs beyond the kernels, at small sizes.

    <venv>/bin/python bench/binding_overhead.py [--seqlen 128] [--threads T]

Times, as medians of many calls on the same [1, L, 8, 64] bf16 / f32 tensors:
  kernel     `flashgrad bench` (C++ API, no Python) forward and backward;
  binding    flashgrad._flashgrad.forward / backward (the pybind11 module, options dict,
             DLPack export of every tensor, GIL released);
  torch op   flashgrad.torch.flash_attn_func forward, and forward + backward (the custom ops
             on torch >= 2.4, autograd included).
binding - kernel bounds what a leaner binding (nanobind) could save per call.
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import torch

import flashgrad
import flashgrad.torch as fgt
from flashgrad._core import _ext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def median_us(fn, n=2000):
    for _ in range(50):
        fn()
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return 1e6 * statistics.median(samples)


def kernel_us(args, dtype):
    exe = os.path.join(ROOT, "build", "tools", "flashgrad")
    out = subprocess.run([exe, "bench", "--seqlen", str(args.seqlen), "--dtype", dtype, "--repeats", "200",
                          "--warmup", "50", "--threads", str(args.threads), "--json"],
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out)
    return 1e3 * r["forward"]["median_ms"], 1e3 * r["backward"]["median_ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fgt.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, flashgrad {flashgrad.__version__} on {flashgrad.isa()}, "
          f"L = {args.seqlen}, 8 heads, d = 64, {args.threads} threads; microseconds per call (medians)")
    print(f"{'dtype':>5} {'kernel fwd':>11} {'binding fwd':>12} {'kernel bwd':>11} {'binding bwd':>12} "
          f"{'torch op fwd':>13} {'torch op fwd+bwd':>17}")
    for name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        q, k, v, do = (torch.randn(1, args.seqlen, 8, 64).to(dt) for _ in range(4))
        out, lse = flashgrad.forward(q, k, v)
        dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
        opts = {"num_threads": args.threads}
        fwd = median_us(lambda: _ext.forward(opts, q, k, v, out, lse))
        bwd = median_us(lambda: _ext.backward(opts, q, k, v, out, lse, do, dq, dk, dv, None, None))
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        op_fwd = median_us(lambda: fgt.flash_attn_func(qg, kg, vg), n=500)
        op_both = median_us(lambda: fgt.flash_attn_func(qg, kg, vg).backward(do), n=500)
        kf, kb = kernel_us(args, name)
        print(f"{name:>5} {kf:11.1f} {fwd:12.1f} {kb:11.1f} {bwd:12.1f} {op_fwd:13.1f} {op_both:17.1f}")


if __name__ == "__main__":
    main()
