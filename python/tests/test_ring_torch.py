"""flashgrad.torch.ring_attn_func over torch.distributed (gloo on 127.0.0.1), with 1 to 4 ranks.

One launch of 4 processes (ring_torch_worker.py, with torchrun's environment variables) runs
rings of 1, 2, 3 and 4 ranks, in process groups and the default group. The tests reassemble
each ring's shards and apply flash-attn's rule on the whole sequence: err(ring) <= 2 *
err(math path in the same precision) + rounding noise, against float64. One process's
flash_attn_func on the whole sequence is measured beside it (in the message).
"""
import os
import socket
import subprocess
import sys
import time

import pytest
import torch

from conftest import assert_rule, attention_math, cancellation_noise, max_err

dist = pytest.importorskip("torch.distributed")
if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from flashgrad.ring import unshard  # noqa: E402
from flashgrad.torch import flash_attn_func  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ring_torch_worker.py")
TIMEOUT_S = 90
B, H, HKV, D, DV = 2, 4, 2, 24, 16

# (dtype, causal, seqlen_q, seqlen_k, sharding, window): GQA everywhere; uneven zigzag chunks.
CASES = [
    (torch.float32, False, 45, 45, "zigzag", (-1, -1)),
    (torch.float32, True, 45, 45, "zigzag", (-1, -1)),
    (torch.bfloat16, False, 45, 45, "zigzag", (-1, -1)),
    (torch.bfloat16, True, 29, 45, "zigzag", (-1, -1)),
    (torch.float32, True, 45, 45, "contiguous", (7, 0)),
]


def launch(world: int, folder) -> None:
    """Runs world ranks of the worker; fails (after killing them) if any hangs or fails."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs, logs = [], []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        log = open(folder / f"log_{rank}.txt", "w+")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, WORKER, str(folder)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for p in procs:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        pass
    hung = [r for r, p in enumerate(procs) if p.poll() is None]
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = []
    for rank, log in enumerate(logs):
        log.seek(0)
        text.append(f"--- rank {rank} (exit {procs[rank].returncode}) ---\n{log.read()[-3000:]}")
        log.close()
    assert not hung, f"ranks {hung} of {world} still running after {TIMEOUT_S} s\n" + "\n".join(text)
    assert all(p.returncode == 0 for p in procs), "\n".join(text)


def make_cases():
    cases = []
    for dtype, causal, lq, lk, sharding, window in CASES:
        q = torch.randn(B, lq, H, D).to(dtype)
        k = torch.randn(B, lk, HKV, D).to(dtype)
        v = torch.randn(B, lk, HKV, DV).to(dtype)
        dout = torch.randn(B, lq, H, DV).to(dtype)
        cases.append(dict(q=q, k=k, v=v, dout=dout, causal=causal, sharding=sharding, window_size=window))
    return cases


def math_path(c, compute, round_to, parts=None, reverse=False):
    q, k, v = (c[n].detach().to(compute).requires_grad_() for n in ("q", "k", "v"))
    out, _ = attention_math(q, k, v, compute=compute, round_to=round_to, causal=c["causal"],
                            window=c["window_size"], parts=parts, reverse=reverse)
    out.backward(c["dout"].to(compute))
    return out.detach(), {"dq": q.grad, "dk": k.grad, "dv": v.grad}


def check_case(c, got):
    dtype = c["q"].dtype
    q, k, v = (c[n].clone().requires_grad_() for n in ("q", "k", "v"))
    one = flash_attn_func(q, k, v, causal=c["causal"], window_size=c["window_size"])
    one.backward(c["dout"])
    one_g = {"out": one.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    parts = {}
    ref_out, ref_g = math_path(c, torch.float64, None, parts)
    round_to = None if dtype == torch.float32 else dtype
    paths = [math_path(c, torch.float32, round_to, reverse=r) for r in (False, True)]
    cancel = cancellation_noise(c["q"], c["dout"], ref_out, parts, dtype)
    refs = dict(ref_g, out=ref_out)
    for n in ("out", "dq", "dk", "dv"):
        path = tuple(o for o, _ in paths) if n == "out" else tuple(g[n] for _, g in paths)
        name = f"{n} (one process's flash_attn_func: error {max_err(one_g[n], refs[n]):.3e})"
        assert_rule(name, got[n], path, refs[n], dtype, cancel.get(n, 0.0))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The cases and the folder the 4 processes wrote their results to."""
    folder = tmp_path_factory.mktemp("ring_torch")
    torch.manual_seed(0)
    cases = make_cases()
    torch.save(cases, folder / "cases.pt")
    launch(4, folder)
    return cases, folder


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ring_matches_the_rule(world, run):
    cases, folder = run
    shards = [torch.load(folder / f"result_{world}_{r}.pt") for r in range(world)]
    for i, c in enumerate(cases):
        got = {n: unshard([shards[r][i][n] for r in range(world)], world, c["sharding"])
               for n in ("out", "dq", "dk", "dv")}
        for n, like in (("out", "dout"), ("dq", "q"), ("dk", "k"), ("dv", "v")):
            assert got[n].shape == c[like].shape and got[n].dtype == c[like].dtype, n
        check_case(c, got)
    assert all(s[-1]["repeat_bitwise"] for s in shards), "a second identical call differs"


def test_bad_input_on_one_rank_raises_on_every_rank(run):
    world, folder = 3, run[1]
    errors = [torch.load(folder / f"errors_{r}.pt") for r in range(world)]
    where = f"(on rank {world - 1} of {world})"
    expect = {"head_dim": ("ValueError", "argument 'k'"),
              "heads_kv": ("ValueError", "expected the same heads_kv as rank 0 (2), got 4"),
              # The first rank whose length differs from the zigzag split of the sum is named.
              "seqlen": ("ValueError", "argument 'q': expected seqlen_local 9, this rank's zigzag shard of "
                                       "the 25 rows the ranks hold (seqlen_local by rank: [8, 8, 9]), got 8 "
                                       "(on rank 0 of 3)"),
              "type": ("TypeError", "argument 'q': expected a torch.Tensor, got list"),
              "softmax_scale": ("ValueError", "argument 'softmax_scale': expected a finite value > 0"),
              "causal": ("ValueError", "argument 'causal': expected the same causal as rank 0 (1), got 0")}
    for name, (cls, text) in expect.items():
        got = [e[name] for e in errors]
        assert all(g == got[0] for g in got), f"{name}: ranks disagree: {got}"
        assert got[0] is not None, f"{name}: no rank raised"
        assert got[0][0] == cls and text in got[0][1], got[0]
        assert name == "seqlen" or got[0][1].endswith(where), got[0]
        assert got[0][1].startswith("flashgrad.torch.ring_attn_func: "), got[0]
    assert all(e["after"] for e in errors)
