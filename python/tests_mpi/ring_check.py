"""flashgrad.ring under mpirun: each rank's shard of out, lse and the gradients
(through torch autograd) matches single-process flashgrad on the whole
sequence, and a bad input on one rank raises on every rank.

    mpirun -n 3 /usr/bin/python3 python/tests_mpi/ring_check.py   (PYTHONPATH=build/python)
Exits non-zero on any rank's failure.
"""
import sys

import torch
from mpi4py import MPI

import flashgrad
from flashgrad.ring import has_ring, ring_attn_func, ring_forward, shard, unshard
from flashgrad.torch import flash_attn_func

comm = MPI.COMM_WORLD
rank, world = comm.rank, comm.size
failures = []


def check(name, got, want, tol):
    err = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    scale = max(want.double().abs().max().item(), 1.0) if want.numel() else 1.0
    if not err <= tol * scale:
        failures.append(f"rank {rank}: {name}: max error {err:.3e} > {tol:.1e} * {scale:.3g}")


def case(dtype, causal, sharding, tol, sinks=False, window=(-1, -1), lq=37):
    g = torch.Generator().manual_seed(7)
    B, H, Hk, d = 2, 4, 2, 16
    q = torch.randn(B, lq, H, d, generator=g, dtype=dtype)
    k = torch.randn(B, lq, Hk, d, generator=g, dtype=dtype)
    v = torch.randn(B, lq, Hk, d, generator=g, dtype=dtype)
    dout = torch.randn(B, lq, H, d, generator=g, dtype=dtype)
    s = torch.randn(H, generator=g, dtype=torch.float32) if sinks else None
    # The whole sequence in one process.
    qw, kw, vw = (x.clone().requires_grad_() for x in (q, k, v))
    sw = s.clone().requires_grad_() if sinks else None
    ow = flash_attn_func(qw, kw, vw, causal=causal, window_size=window, sinks=sw) if sinks else \
        flash_attn_func(qw, kw, vw, causal=causal, window_size=window)
    ow.backward(dout)
    # This rank's shard through the ring.
    ql, kl, vl = (shard(x, rank, world, sharding).requires_grad_() for x in (q, k, v))
    sl = s.clone().requires_grad_() if sinks else None
    ol = ring_attn_func(ql, kl, vl, comm, sharding=sharding, causal=causal, window_size=window, sinks=sl)
    ol.backward(shard(dout, rank, world, sharding))
    name = f"{dtype} causal={causal} {sharding} sinks={sinks} window={window}"
    check(name + " out", ol.detach(), shard(ow.detach(), rank, world, sharding), tol)
    check(name + " dq", ql.grad, shard(qw.grad, rank, world, sharding), tol)
    check(name + " dk", kl.grad, shard(kw.grad, rank, world, sharding), tol)
    check(name + " dv", vl.grad, shard(vw.grad, rank, world, sharding), tol)
    if sinks:
        check(name + " dsinks", sl.grad, sw.grad, tol)
    # The shards put back together are the whole.
    parts = comm.allgather(ol.detach())
    check(name + " unshard(out)", unshard(parts, world, sharding), ow.detach(), tol)


if not has_ring():
    print("flashgrad.ring: this build has no ring layer", file=sys.stderr)
    sys.exit(1)
# f64: blocks merged in a different order than one pass, so not bitwise, but
# within a few f64 roundings; f32 likewise within f32 roundings.
for sharding in ("zigzag", "contiguous"):
    for causal in (False, True):
        case(torch.float64, causal, sharding, 1e-12)
case(torch.float32, True, "zigzag", 2e-6, sinks=True, window=(9, 0))
case(torch.float64, True, "zigzag", 1e-12, sinks=True, lq=5)

# A bad input on the last rank: every rank gets the same error, naming it.
bad = world - 1
q = torch.randn(1, 8, 2, 16, dtype=torch.float64)
k = torch.randn(1, 8, 2, 8 if rank == bad else 16, dtype=torch.float64)
try:
    ring_forward(q, k, k, comm, sharding="contiguous")
    failures.append(f"rank {rank}: ring_forward accepted a bad k on rank {bad}")
except ValueError as e:
    if f"on rank {bad} of {world}" not in str(e) or "argument 'k'" not in str(e):
        failures.append(f"rank {rank}: unexpected message: {e}")

all_failures = comm.allgather(failures)
if rank == 0:
    flat = [f for fs in all_failures for f in fs]
    print("\n".join(flat) if flat else f"flashgrad.ring: all checks passed on {world} ranks")
sys.exit(1 if any(all_failures) else 0)
