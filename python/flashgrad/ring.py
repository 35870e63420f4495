"""Ring attention over MPI (context parallelism), from Python with mpi4py.

Every rank of ``comm`` holds its rows of one global sequence (``shard_rows``
says which) and calls the same function; K/V blocks travel around the ring
while each rank computes, and each rank gets its rows of out, lse and the
gradients back (docs/distributed.md)::

    from mpi4py import MPI
    from flashgrad.ring import ring_attn_func, shard
    comm = MPI.COMM_WORLD
    q_local = shard(q, comm.rank, comm.size)          # zigzag by default
    out_local = ring_attn_func(q_local, k_local, v_local, comm, causal=True)
    out_local.backward(dout_local)                     # collective: every rank calls it

The ring functions need the package built with the MPI layer and mpi4py
(``has_ring()``); shard_rows, shard and unshard work in every build, and
flashgrad.torch.ring_attn_func runs the same ring over torch.distributed.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

from . import _core
from ._core import Grads, _arr, _empty, _grad_outputs, _options, _shapes

_ext = _core._ext

__all__ = ["has_ring", "shard_rows", "shard", "unshard", "ring_forward", "ring_backward", "ring_attn_func"]


def has_ring() -> bool:
    """Whether this build has the ring layer (MPI found at build time, mpi4py installed)."""
    return bool(getattr(_ext, "has_ring", False))


def _need_ring(fn: str) -> None:
    if not has_ring():
        raise RuntimeError(f"flashgrad.{fn}: this build has no ring layer: it needs MPI "
                           "(libopenmpi-dev) and mpi4py (python3-mpi4py) when CMake runs")


def shard_rows(seqlen: int, rank: int, world: int, sharding: str = "zigzag") -> List[Tuple[int, int]]:
    """The (start, length) runs of global rows rank holds, in the order of its local tensor.

    zigzag: the sequence is cut into 2 * world chunks and rank holds chunks rank and
    2 * world - 1 - rank (causal work balanced); contiguous: one run, the even split."""
    return [tuple(r) for r in _ext.shard_rows(sharding, int(seqlen), int(rank), int(world))]


def shard(x, rank: int, world: int, sharding: str = "zigzag", dim: int = 1):
    """This rank's rows of a global tensor (a new tensor in x's library)."""
    runs = shard_rows(x.shape[dim], rank, world, sharding)
    if _core._is_torch(x):
        t = _core._torch_module()
        return t.cat([x.narrow(dim, s, n) for s, n in runs], dim=dim)
    import numpy as np

    return np.concatenate([np.take(x, range(s, s + n), axis=dim) for s, n in runs], axis=dim)


def unshard(parts, world: int, sharding: str = "zigzag", dim: int = 1):
    """The global tensor from every rank's shard (parts[r] from rank r), e.g. after an allgather."""
    seqlen = sum(p.shape[dim] for p in parts)
    pieces = []
    for r, p in enumerate(parts):
        at = 0
        for s, n in shard_rows(seqlen, r, world, sharding):
            pieces.append((s, p.narrow(dim, at, n) if _core._is_torch(p) else
                           p.take(range(at, at + n), axis=dim)))
            at += n
    pieces.sort(key=lambda sp: sp[0])
    if parts and _core._is_torch(parts[0]):
        return _core._torch_module().cat([x for _, x in pieces], dim=dim)
    import numpy as np

    return np.concatenate([x for _, x in pieces], axis=dim)


def ring_forward(q, k, v, comm, *, sharding: str = "zigzag", out=None, lse=None,
                 softmax_scale: Optional[float] = None, causal: bool = False,
                 window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
                 bias=None, mask=None, sinks=None, dropout_p: float = 0.0, seed: int = 0,
                 offset: int = 0, num_threads: int = 0):
    """This rank's (out, lse) of the global attention; arguments as flashgrad.forward, for this
    rank's rows (bias/mask: this rank's query rows against every global key). Collective."""
    fn = "ring_forward"
    _need_ring(fn)
    opts = _options(fn, softmax_scale, causal, window_size, softcap, alibi_slopes, bias, mask, sinks,
                    None, None, dropout_p, seed, offset, num_threads)
    q, k, v = _arr(q), _arr(k), _arr(v)
    out_shape, lse_shape, qdt, acc = _shapes(fn, q, v, False)
    out = _empty(q, out_shape, qdt, fn, "out") if out is None else _arr(out)
    lse = _empty(q, lse_shape, acc, fn, "lse") if lse is None else _arr(lse)
    _ext.ring_forward(opts, comm, sharding, q, k, v, out, lse)
    return out, lse


def ring_backward(q, k, v, out, lse, dout, comm, *, sharding: str = "zigzag", dq=None, dk=None,
                  dv=None, dsinks=None, dbias=None, return_dbias: bool = False,
                  softmax_scale: Optional[float] = None, causal: bool = False,
                  window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
                  bias=None, mask=None, sinks=None, dropout_p: float = 0.0, seed: int = 0,
                  offset: int = 0, num_threads: int = 0) -> Grads:
    """This rank's gradients; out and lse are those ring_forward returned here. dsinks is the
    whole sequence's gradient (the same on every rank). Collective."""
    fn = "ring_backward"
    _need_ring(fn)
    opts = _options(fn, softmax_scale, causal, window_size, softcap, alibi_slopes, bias, mask, sinks,
                    None, None, dropout_p, seed, offset, num_threads)
    q, k, v, out, lse, dout = (_arr(x) for x in (q, k, v, out, lse, dout))
    _, _, qdt, acc = _shapes(fn, q, v, False)
    g = _grad_outputs(fn, opts, q, k, v, qdt, acc, Grads(dq, dk, dv, dsinks, dbias), return_dbias)
    _ext.ring_backward(opts, comm, sharding, q, k, v, out, lse, dout, *g)
    return g


def _ring_function():
    import torch

    class RingAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q, k, v, sinks, comm, sharding, kw):
            out, lse = ring_forward(q, k, v, comm, sharding=sharding, sinks=sinks, **kw)
            ctx.save_for_backward(q, k, v, out, lse, sinks)
            ctx.comm, ctx.sharding, ctx.kw = comm, sharding, kw
            return out

        @staticmethod
        def backward(ctx: Any, dout):
            q, k, v, out, lse, sinks = ctx.saved_tensors
            g = ring_backward(q, k, v, out, lse, dout.contiguous(), ctx.comm, sharding=ctx.sharding,
                              sinks=sinks, **ctx.kw)
            return g.dq, g.dk, g.dv, g.dsinks, None, None, None

    return RingAttention


_RING = None


def ring_attn_func(q, k, v, comm, *, sharding: str = "zigzag", dropout_p: float = 0.0,
                   softmax_scale: Optional[float] = None, causal: bool = False,
                   window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
                   sinks=None, seed: int = 0, num_threads: int = 0):
    """flash_attn_func on this rank's rows of a sequence sharded over comm, with autograd.
    (batch, seqlen_local, nheads, headdim) torch tensors; sinks (nheads,) float32 is trainable.
    Every rank must run the forward and the backward (they communicate)."""
    global _RING
    _need_ring("ring_attn_func")
    if _RING is None:
        _RING = _ring_function()
    kw = dict(dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
              softcap=softcap, alibi_slopes=alibi_slopes, seed=seed, num_threads=num_threads)
    return _RING.apply(q, k, v, sinks, comm, sharding, kw)
