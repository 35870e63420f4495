"""One rank of flashgrad.torch.ring_attn_func's tests (test_ring_torch.py starts the ranks).

It reads torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so it also runs as
    torchrun --nproc-per-node 4 python/tests/ring_torch_worker.py DIR
with DIR/cases.pt written by the test. Four processes make rings of 1 to 4 ranks at once: the
groups [3], [0, 2], [1, 2, 3] and the default group (group=None).
  - For each case in DIR/cases.pt, each rank of each ring saves its shard of out, dq, dk, dv
    to DIR/result_<W>_<group rank>.pt.
  - In the ring [1, 2, 3], calls in which one rank's input is bad: every rank records the
    error it got in DIR/errors_<group rank>.pt, then a good call shows the group still works.
"""
import os
import sys

import torch
import torch.distributed as dist

import flashgrad.torch as ft
from flashgrad.ring import shard


RINGS = {1: [3], 2: [0, 2], 3: [1, 2, 3], 4: None}


def ring_call(c: dict, group, rank: int, world: int) -> dict:
    """This rank's shard of out and of the gradients for case c."""
    sh = c["sharding"]
    q, k, v = (shard(c[n], rank, world, sh).requires_grad_() for n in ("q", "k", "v"))
    out = ft.ring_attn_func(q, k, v, group, causal=c["causal"], window_size=c["window_size"], sharding=sh)
    out.backward(shard(c["dout"], rank, world, sh))
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def run_cases(group, folder: str) -> None:
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    cases = torch.load(os.path.join(folder, "cases.pt"))
    results = [ring_call(c, group, rank, world) for c in cases]
    again = ring_call(cases[-1], group, rank, world)  # bitwise the same: a fixed summation order
    results.append({"repeat_bitwise": all(torch.equal(again[n], results[-1][n]) for n in again)})
    torch.save(results, os.path.join(folder, f"result_{world}_{rank}.pt"))


def run_bad(group, folder: str) -> None:
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    bad = world - 1
    B, L, H, HKV, D = 1, 8 * world, 4, 2, 16
    q, k, v = (torch.randn(B, L, h, D) for h in (H, HKV, HKV))
    ql, kl, vl = (shard(x, rank, world) for x in (q, k, v))
    mine = rank == bad
    calls = {
        # The core refuses this rank's call: head_dim of k differs from q's.
        "head_dim": ((ql, kl[..., :8] if mine else kl, vl), {}),
        # Each rank is fine alone, but the ranks disagree on heads_kv.
        "heads_kv": ((ql, torch.cat([kl, kl], 2) if mine else kl, torch.cat([vl, vl], 2) if mine else vl), {}),
        # One row too many for this rank's zigzag shard.
        "seqlen": ((torch.cat([ql, ql[:, :1]], 1) if mine else ql, kl, vl), {}),
        # Not a tensor at all.
        "type": ((ql.tolist() if mine else ql, kl, vl), {}),
        # Options: one refused by the Python layer, one that differs between ranks.
        "softmax_scale": ((ql, kl, vl), {"softmax_scale": -1.0 if mine else None}),
        "causal": ((ql, kl, vl), {"causal": not mine}),
    }
    errors = {}
    for name, (args, kw) in calls.items():
        try:
            ft.ring_attn_func(*args, group, **dict({"causal": True}, **kw))
            errors[name] = None
        except (TypeError, ValueError) as e:
            errors[name] = (type(e).__name__, str(e))
    out = ft.ring_attn_func(ql, kl, vl, group, causal=True)  # the group is still in step
    errors["after"] = out.shape == ql.shape
    torch.save(errors, os.path.join(folder, f"errors_{rank}.pt"))


def main() -> None:
    folder = sys.argv[1]
    torch.set_num_threads(1)
    ft.set_num_threads(1)  # ranks share the machine's cores
    dist.init_process_group("gloo", init_method="env://")
    assert dist.get_world_size() == 4, "ring_torch_worker.py runs on 4 processes"
    torch.manual_seed(0)
    try:
        # Every process creates every group, in the same order (new_group is collective).
        groups = {w: None if ranks is None else dist.new_group(ranks) for w, ranks in RINGS.items()}
        me = dist.get_rank()
        for w, ranks in RINGS.items():
            if ranks is None or me in ranks:
                run_cases(groups[w], folder)
        if me in RINGS[3]:
            run_bad(groups[3], folder)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
