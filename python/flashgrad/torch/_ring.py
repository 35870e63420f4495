"""Ring attention over torch.distributed (context parallelism on CPU, gloo).

The same algorithm as the MPI ring (mpi/ring.cpp, docs/distributed.md), with the transfers
made by torch.distributed and the compute by the library's block calls:

    step t = 0 .. W-1: rank r holds the K/V block of rank (r - t) mod W
      post irecv(next block from r - 1), isend(this block to r + 1)
      for each (query run, key run) pair that causal/window does not mask entirely:
        (o_part, lse_part) = flashgrad.forward(..., block=global offsets)
        (o, lse) = flashgrad.merge((o, lse), (o_part, lse_part))       f32 (f64 for f64)
      wait for the transfers
    backward: the K/V blocks travel again; each block's dK/dV accumulator (f32) follows it
    one step behind, each rank adding its part, and reaches the block's owner after W steps.

Before any data moves the ranks exchange their shapes and options and agree on every rank's
errors, so a bad input on one rank raises the same error on every rank instead of a hang.
"""
from __future__ import annotations

import math
import re
import struct
from typing import List, Optional, Tuple

import torch
from torch.autograd.function import once_differentiable

from .. import _core
from ..ring import shard_rows
from ._autograd import get_num_threads

_FN = "ring_attn_func"
_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_TAG_KV, _TAG_ACC = 17, 18

# The meta each rank sends before any data moves: [valid, L_q, L_k] + signature.
_SIG = (("q", "batch"), ("q", "heads_q"), ("k", "heads_kv"), ("q", "head_dim"), ("v", "head_dim_v"),
        ("q", "dtype"), ("causal", "causal"), ("window_size", "window_left"),
        ("window_size", "window_right"), ("softcap", "softcap"), ("softmax_scale", "softmax_scale"),
        ("alibi_slopes", "alibi_slopes given"), ("sharding", "sharding"))
_VALID, _LQ, _LK, _SIG0 = 0, 1, 2, 3


def _dist():
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError(f"flashgrad.torch.{_FN}: this torch build has no torch.distributed")
    return dist


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


class _Failure(Exception):
    """A rank's own error, held until the ranks agree."""

    def __init__(self, cls: type, message: str):
        super().__init__(message)
        self.cls, self.message = cls, message


def _fail(arg: str, expected: str, got: str, cls: type = ValueError):
    raise _Failure(cls, f"flashgrad.torch.{_FN}: argument '{arg}': expected {expected}, got {got}")


class _Ring:
    """One call's view of the job on this rank: the group, every rank's rows, the options."""

    def __init__(self, group, sharding: str, opts: dict):
        self.dist = _dist()
        self.group, self.sharding, self.opts = group, sharding, opts
        self.rank = self.dist.get_rank(group)
        self.world = self.dist.get_world_size(group)
        self.error: Optional[_Failure] = None

    # --- agreement -----------------------------------------------------------------------------

    def agree(self) -> None:
        """Collective: if any rank holds an error, every rank raises the first failing rank's."""
        dist = self.dist
        first = torch.tensor([self.rank if self.error else self.world], dtype=torch.int64)
        dist.all_reduce(first, op=dist.ReduceOp.MIN, group=self.group)
        src = int(first.item())
        if src == self.world:
            return
        box = [(self.error.cls.__name__, self.error.message) if self.error else None]
        dist.broadcast_object_list(box, src=self.peer(src), group=self.group)
        name, message = box[0]
        cls = {"TypeError": TypeError, "MemoryError": MemoryError, "RuntimeError": RuntimeError}
        cls = cls.get(name, ValueError)
        raise cls(f"{message} (on rank {src} of {self.world})")

    def guarded(self, f) -> None:
        """Runs f unless an error is held; an error it raises is held for agree()."""
        if self.error is not None:
            return
        try:
            f()
        except _Failure as e:
            self.error = e
        except (TypeError, ValueError, MemoryError, RuntimeError) as e:
            self.error = _Failure(type(e), str(e))

    def peer(self, r: int) -> int:
        """The global rank of group rank r (what send/recv take)."""
        if self.group is None:
            return r
        get = getattr(self.dist, "get_global_rank", None) or self.dist.distributed_c10d._get_global_rank
        return get(self.group, r)

    # --- layout ----------------------------------------------------------------------------------

    def check_local(self, q, k, v, alibi) -> List[int]:
        """This rank's checks, the core's included; returns its meta."""
        for arg, x in (("q", q), ("k", k), ("v", v)):
            if not isinstance(x, torch.Tensor):
                _fail(arg, "a torch.Tensor", type(x).__name__, TypeError)
            if x.device.type != "cpu":
                _fail(arg, "a CPU tensor", f"device {x.device}")
            if x.dim() != 4:
                _fail(arg, "4 dimensions (batch, seqlen_local, nheads, headdim)", f"shape {list(x.shape)}")
            if x.dtype not in _DTYPES:
                _fail(arg, "dtype float32, float64, bfloat16 or float16", f"dtype {x.dtype}", TypeError)
        if self.sharding not in ("zigzag", "contiguous"):
            _fail("sharding", "'zigzag' or 'contiguous'", repr(self.sharding))
        o = self.opts
        try:
            left, right = o["window_size"]
            o["window_size"] = (int(left), int(right))
        except (TypeError, ValueError):
            _fail("window_size", "a pair of ints (left, right)", repr(o["window_size"]), TypeError)
        o["softcap"] = float(o["softcap"])
        try:  # the library's own validation of this rank's call (shapes, dtypes, head dims, alibi)
            _core.forward_workspace_bytes(q, k, v, **o)
        except (TypeError, ValueError) as e:
            message = re.sub(r"^flashgrad(::|\.)forward_workspace_bytes:", f"flashgrad.torch.{_FN}:", str(e))
            raise _Failure(type(e), message) from None
        scale = o["softmax_scale"] or 1.0 / math.sqrt(q.shape[3])
        sig = [q.shape[0], q.shape[2], k.shape[2], q.shape[3], v.shape[3], _DTYPES.index(q.dtype),
               int(o["causal"]), o["window_size"][0], o["window_size"][1], _bits(o["softcap"]), _bits(scale),
               int(alibi is not None), int(self.sharding == "zigzag")]
        return [1, q.shape[1], k.shape[1]] + sig

    def gather_layout(self, q, k, v, alibi) -> None:
        """Collective: every rank's meta, the agreement on local errors, then the layout."""
        meta = [0] * (_SIG0 + len(_SIG))

        def local():
            meta[:] = self.check_local(q, k, v, alibi)
        self.guarded(local)
        mine = torch.tensor(meta, dtype=torch.int64)
        every = [torch.empty_like(mine) for _ in range(self.world)]
        self.dist.all_gather(every, mine, group=self.group)
        self.agree()
        self.meta = [t.tolist() for t in every]
        self.check_agreement()
        self.total_q = sum(m[_LQ] for m in self.meta)
        self.total_k = sum(m[_LK] for m in self.meta)
        self.q_rows = self.rows(_LQ, self.total_q)
        self.k_rows = self.rows(_LK, self.total_k)
        self.k_len = [m[_LK] for m in self.meta]
        self.batch, self.heads_kv, self.d, self.dv = q.shape[0], k.shape[2], k.shape[3], v.shape[3]
        self.dtype = q.dtype

    def check_agreement(self) -> None:
        """Every rank's signature against rank 0's, then the zigzag row counts: the same data on
        every rank, so every rank raises the same error."""
        for r, m in enumerate(self.meta):
            for i, (arg, name) in enumerate(_SIG):
                mine, ref = m[_SIG0 + i], self.meta[0][_SIG0 + i]
                if mine != ref:
                    show = (lambda x: str(_DTYPES[x])) if name == "dtype" else str
                    raise ValueError(f"flashgrad.torch.{_FN}: argument '{arg}': expected the same {name} as "
                                     f"rank 0 ({show(ref)}), got {show(mine)} (on rank {r} of {self.world})")
        if self.sharding != "zigzag":
            return
        for which, arg in ((_LQ, "q"), (_LK, "k")):
            lengths = [m[which] for m in self.meta]
            for r, n in enumerate(lengths):
                want = sum(length for _, length in shard_rows(sum(lengths), r, self.world, "zigzag"))
                if n != want:
                    raise ValueError(
                        f"flashgrad.torch.{_FN}: argument '{arg}': expected seqlen_local {want}, this rank's "
                        f"zigzag shard of the {sum(lengths)} rows the ranks hold (seqlen_local by rank: "
                        f"{lengths}), got {n} (on rank {r} of {self.world})")

    def rows(self, which: int, total: int) -> List[List[Tuple[int, int]]]:
        """[rank] -> the global row runs it holds, in local order."""
        if self.sharding == "zigzag":
            return [shard_rows(total, r, self.world, "zigzag") for r in range(self.world)]
        out, at = [], 0
        for m in self.meta:
            out.append([(at, m[which])])
            at += m[which]
        return out

    # --- pairs of query and key runs -------------------------------------------------------------

    def masked(self, gq0: int, nq: int, gk0: int, nk: int) -> bool:
        """Whether causal/window (at global positions, bottom-right) hides every key of the pair."""
        if nq == 0 or nk == 0:
            return True
        shift = self.total_k - self.total_q
        first, last = gq0 + shift, gq0 + nq - 1 + shift
        k_first, k_last = gk0, gk0 + nk - 1
        left, right = self.opts["window_size"]
        if last < k_first and (self.opts["causal"] or (right >= 0 and k_first - last > right)):
            return True
        return left >= 0 and first > k_last and first - k_last > left

    def pairs(self, src: int):
        """(local q row, global q row, rows, row in the block, global key, keys) to compute."""
        out, lq = [], 0
        for gq0, nq in self.q_rows[self.rank]:
            lk = 0
            for gk0, nk in self.k_rows[src]:
                if not self.masked(gq0, nq, gk0, nk):
                    out.append((lq, gq0, nq, lk, gk0, nk))
                lk += nk
            lq += nq
        return out

    def block(self, p) -> Tuple[int, int, int, int]:
        return (p[1], p[4], self.total_q, self.total_k)

    # --- transfers -------------------------------------------------------------------------------

    def kv_elems(self, src: int) -> Tuple[int, int]:
        n = self.batch * self.k_len[src] * self.heads_kv
        return n * self.d, n * self.dv

    def split(self, flat: torch.Tensor, src: int):
        """The K-shaped and V-shaped parts of a flat buffer that holds rank src's block."""
        nk, nv = self.kv_elems(src)
        shape = (self.batch, self.k_len[src], self.heads_kv)
        return flat[:nk].view(shape + (self.d,)), flat[nk:nk + nv].view(shape + (self.dv,))

    def kv_views(self, buf: torch.Tensor, src: int):
        """The K and V blocks of rank src in a travelling byte buffer."""
        return self.split(buf.view(self.dtype), src)

    def own_kv(self, k, v) -> List[torch.Tensor]:
        """The two travelling byte buffers, this rank's own block in the first."""
        most = max(self.elems(r) for r in range(self.world)) * _esize(self.dtype)
        kv = [torch.empty(most, dtype=torch.uint8) for _ in range(2)]
        kb, vb = self.kv_views(kv[0], self.rank)
        kb.copy_(k)
        vb.copy_(v)
        return kv

    def allocate(self, make):
        """Collective: make()'s buffers on every rank, or every rank raises the first failure."""
        box = [None]

        def run():
            box[0] = make()
        self.guarded(run)
        self.agree()
        return box[0]

    def elems(self, src: int) -> int:
        """Elements of rank src's K/V block (or dK/dV accumulator); 1 for an empty one, so that
        every transfer carries a message."""
        return max(sum(self.kv_elems(src)), 1)

    def exchange(self, send: torch.Tensor, recv: torch.Tensor, tag: int) -> list:
        """Nonblocking: send to the next rank, receive from the previous one."""
        dist, nxt, prv = self.dist, (self.rank + 1) % self.world, (self.rank - 1) % self.world
        return [dist.irecv(recv, src=self.peer(prv), group=self.group, tag=tag),
                dist.isend(send, dst=self.peer(nxt), group=self.group, tag=tag)]

    def pass_kv(self, step: int, kv: List[torch.Tensor], cur: int, src: int) -> list:
        """Block src (bytes in kv[cur]) goes to the next rank while kv[1 - cur] receives the
        previous rank's, block src - 1; nothing after the last step."""
        if step + 1 >= self.world:
            return []
        size = _esize(self.dtype)
        return self.exchange(kv[cur][:self.elems(src) * size],
                             kv[1 - cur][:self.elems((src - 1) % self.world) * size], _TAG_KV)


def _esize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _wait(works: list) -> None:
    for w in works:
        w.wait()


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rows(x: torch.Tensor, dim: int, start: int, n: int) -> torch.Tensor:
    return x.narrow(dim, start, n)


def _ring_forward(R: _Ring, q, k, v):
    """This rank's (out in q's dtype, lse in f32/f64) of the global attention."""
    B, Lq, Hq, dv = q.shape[0], q.shape[1], q.shape[2], v.shape[3]
    acc = _acc_dtype(q.dtype)
    o, lse, o_part, lse_part, kv = R.allocate(lambda: (
        torch.zeros(B, Lq, Hq, dv, dtype=acc), torch.full((B, Hq, Lq), -math.inf, dtype=acc),
        torch.empty(B, Lq, Hq, dv, dtype=acc), torch.empty(B, Hq, Lq, dtype=acc), R.own_kv(k, v)))
    cur = 0
    for step in range(R.world):
        src = (R.rank - step) % R.world
        works = R.pass_kv(step, kv, cur, src)

        def compute():
            kb, vb = R.kv_views(kv[cur], src)
            for p in R.pairs(src):
                lq0, nq, lk0, nk = p[0], p[2], p[3], p[5]
                op, lp = _rows(o_part, 1, lq0, nq), _rows(lse_part, 2, lq0, nq)
                _core.forward(_rows(q, 1, lq0, nq), _rows(kb, 1, lk0, nk), _rows(vb, 1, lk0, nk), out=op,
                              lse=lp, block=R.block(p), **R.opts)
                _core.merge(_rows(o, 1, lq0, nq), _rows(lse, 2, lq0, nq), op, lp,
                            num_threads=R.opts["num_threads"])
        R.guarded(compute)
        _wait(works)
        cur = 1 - cur
    R.agree()
    return o.to(q.dtype), lse


class _Accumulators:
    """The dK/dV accumulators (f32, f64 for f64) of the K/V blocks: each follows its block one
    step behind, every rank adds its part, and after W steps it reaches the block's owner."""

    def __init__(self, R: _Ring, size: int, dtype: torch.dtype):
        self.R, self.cur, self.recv, self.send = R, 0, [], []
        self.bufs = [torch.zeros(size, dtype=dtype) for _ in range(2)]

    def add_and_pass(self, step: int, src: int, part: torch.Tensor) -> None:
        """Block src's accumulator arrives from the rank that held it last step (none at step
        0); this rank adds its part and sends it to the next rank."""
        R, n = self.R, self.R.elems(src)
        travelling = self.bufs[self.cur][:n]
        _wait(self.recv)
        if step == 0:
            travelling.copy_(part[:n])
        else:
            travelling.add_(part[:n])
        if R.world > 1:
            _wait(self.send)  # the other buffer is free again
            other = 1 - self.cur
            works = R.exchange(travelling, self.bufs[other][:R.elems((src - 1) % R.world)], _TAG_ACC)
            self.recv, self.send, self.cur = works[:1], works[1:], other

    def home(self) -> torch.Tensor:
        """After the last step: this rank's own block's accumulator."""
        _wait(self.recv)
        _wait(self.send)
        return self.bufs[self.cur]


def _ring_backward(R: _Ring, q, k, v, out, lse, dout):
    """This rank's (dq, dk, dv) in q's dtype; out and lse are those _ring_forward returned."""
    B, Lq, Hq, d = q.shape
    acc = _acc_dtype(q.dtype)
    most, k_max = max(R.elems(r) for r in range(R.world)), max(R.k_len)
    dq, dq_part, dk_part, dv_part, part, kv, travel = R.allocate(lambda: (
        torch.zeros(B, Lq, Hq, d, dtype=acc), torch.empty(B, Lq, Hq, d, dtype=acc),
        torch.empty(B, k_max, R.heads_kv, d, dtype=acc), torch.empty(B, k_max, R.heads_kv, R.dv, dtype=acc),
        torch.empty(most, dtype=acc), R.own_kv(k, v), _Accumulators(R, most, acc)))
    cur = 0
    for step in range(R.world):
        src = (R.rank - step) % R.world
        works = R.pass_kv(step, kv, cur, src)

        def compute():
            part.zero_()
            kb, vb = R.kv_views(kv[cur], src)
            ck, cv = R.split(part, src)
            for p in R.pairs(src):
                lq0, nq, lk0, nk = p[0], p[2], p[3], p[5]
                pq, pk, pv = _rows(dq_part, 1, lq0, nq), _rows(dk_part, 1, 0, nk), _rows(dv_part, 1, 0, nk)
                _core.backward(_rows(q, 1, lq0, nq), _rows(kb, 1, lk0, nk), _rows(vb, 1, lk0, nk),
                               _rows(out, 1, lq0, nq), _rows(lse, 2, lq0, nq), _rows(dout, 1, lq0, nq),
                               dq=pq, dk=pk, dv=pv, block=R.block(p), **R.opts)
                _rows(dq, 1, lq0, nq).add_(pq)
                _rows(ck, 1, lk0, nk).add_(pk)
                _rows(cv, 1, lk0, nk).add_(pv)
        R.guarded(compute)
        travel.add_and_pass(step, src, part)
        _wait(works)
        cur = 1 - cur
    dk, dv = R.split(travel.home(), R.rank)
    R.agree()
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, alibi, R: _Ring):
        with torch.no_grad():
            out, lse = _ring_forward(R, q.detach(), k.detach(), v.detach())
        ctx.ring = R
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(ctx.ring, q.detach(), k.detach(), v.detach(), out, lse, dout)
        return dq, dk, dv, None, None


def ring_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None, *, causal: bool = False,
                   softmax_scale: Optional[float] = None, sharding: str = "zigzag",
                   window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                   alibi_slopes: Optional[torch.Tensor] = None) -> torch.Tensor:
    """flash_attn_func over one sequence sharded across the ranks of a torch.distributed group.

    Every rank of group (None: the default group) calls it with its own rows; K/V blocks travel
    around the ring (send/recv, gloo on CPU) while each rank computes on the block it holds with
    flashgrad's block kernels, and merges the partial (out, lse) in float32 (float64 for float64).
    Collective: every rank must run the forward and, if it runs one, the backward.

    Arguments:
        q: (batch, seqlen_local, nheads, headdim), this rank's query rows of the global sequence.
        k, v: (batch, seqlen_local_k, nheads_k, headdim[_v]), its key rows; nheads_k divides nheads
            (GQA/MQA). One dtype for q, k, v: float32, float64, bfloat16 or float16.
        group: a torch.distributed process group (gloo); None for the default group.
        causal, softmax_scale, window_size, softcap, alibi_slopes: as flash_attn_func, on the
            global positions (causal and window aligned bottom-right on the global lengths).
        sharding: "zigzag" (the sequence cut into 2W chunks; rank r holds chunks r and 2W-1-r,
            which balances causal work) or "contiguous" (rank r holds one run of rows after those
            of ranks < r; any lengths). flashgrad.ring.shard / unshard / shard_rows make and
            reassemble the shards.
    Return:
        out: (batch, seqlen_local, nheads, headdim_v), this rank's rows of the global output, with
        gradients for q, k, v through flashgrad's fused backward (dK/dV summed around the ring).
    Raises:
        TypeError / ValueError on every rank when any rank's input is bad (shapes or options that
        differ between ranks, a zigzag shard of the wrong length, what flash_attn_func refuses),
        naming the argument and the rank ("... (on rank 2 of 4)"); no rank is left waiting.
    """
    opts = {"softmax_scale": softmax_scale, "causal": bool(causal), "window_size": window_size,
            "softcap": softcap, "alibi_slopes": alibi_slopes, "num_threads": get_num_threads()}
    R = _Ring(group, sharding, opts)
    R.gather_layout(q, k, v, alibi_slopes)
    return _RingAttention.apply(q, k, v, alibi_slopes, R)
