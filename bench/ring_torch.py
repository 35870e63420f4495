#!/usr/bin/env python3
"""flashgrad.torch.ring_attn_func's time per call over torch.distributed (gloo), for the number of
ranks torchrun starts (a benchmark, not a test: it asserts nothing).

    torchrun --nproc-per-node W bench/ring_torch.py --seqlen 8192 --head-dim 128 [--threads T]
             [--dtype bf16] [--no-causal] [--single]

Every rank holds its zigzag shard of one [1, L, H, d] sequence. Reported on rank 0, medians of
--repeats calls after a warm-up, each the slowest rank's: forward, and forward + backward
(autograd). --single also times one process's flash_attn_func on the whole sequence on rank 0
alone, with T threads (meant for W = 1).
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import flashgrad.torch as ft
from flashgrad.ring import shard


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--seqlen", type=int, default=8192)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--heads-kv", type=int, default=0, help="0: as --heads")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--threads", type=int, default=0, help="flashgrad threads per rank (0: all cores)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--single", action="store_true")
    return p.parse_args()


def slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def timed(fn, repeats: int, collective: bool = True):
    fn()
    samples = []
    for _ in range(repeats):
        if collective:
            dist.barrier()
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        samples.append(slowest(dt) if collective else dt)
    return statistics.median(samples)


def main():
    a = parse()
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(a.threads, 1))
    ft.set_num_threads(a.threads)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    hkv = a.heads_kv or a.heads
    causal = not a.no_causal
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, a.seqlen, h, a.head_dim, generator=g).to(dtype)
                     for h in (a.heads, hkv, hkv, a.heads))
    ql, kl, vl = (shard(x, rank, world).requires_grad_() for x in (q, k, v))
    dl = shard(dout, rank, world)

    def fwd():
        with torch.no_grad():
            ft.ring_attn_func(ql, kl, vl, causal=causal)

    def fwd_bwd():
        ft.ring_attn_func(ql, kl, vl, causal=causal).backward(dl)

    load = os.getloadavg()[0]
    t_f, t_fb = timed(fwd, a.repeats), timed(fwd_bwd, a.repeats)
    flops = 4 * a.seqlen * a.seqlen * a.heads * a.head_dim / (2 if causal else 1)
    if rank == 0:
        print(f"ring_attn_func W={world} threads={a.threads} L={a.seqlen} H={a.heads}/{hkv} d={a.head_dim} "
              f"{a.dtype} causal={causal}: forward {1e3 * t_f:.0f} ms ({flops / t_f / 1e9:.0f} GFLOP/s), "
              f"forward+backward {1e3 * t_fb:.0f} ms ({3.5 * flops / t_fb / 1e9:.0f} GFLOP/s), all ranks; "
              f"1-minute load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")
        if a.single:
            qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))

            def one_fwd():
                with torch.no_grad():
                    ft.flash_attn_func(qs, ks, vs, causal=causal)

            def one_fwd_bwd():
                ft.flash_attn_func(qs, ks, vs, causal=causal).backward(dout)

            s_f, s_fb = timed(one_fwd, a.repeats, False), timed(one_fwd_bwd, a.repeats, False)
            print(f"flash_attn_func one process, whole sequence: forward {1e3 * s_f:.0f} ms "
                  f"({flops / s_f / 1e9:.0f} GFLOP/s), forward+backward {1e3 * s_fb:.0f} ms "
                  f"({3.5 * flops / s_fb / 1e9:.0f} GFLOP/s)")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
