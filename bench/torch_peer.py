#!/usr/bin/env python3
"""flashgrad beside torch 2.x's native CPU flash attention, in one run.

    <venv>/bin/python bench/torch_peer.py [--quick] [--threads T] [--out DIR]

Both run through F.scaled_dot_product_attention's signature on [B, H, L, d] tensors:
torch's own with SDPBackend.FLASH_ATTENTION forced, flashgrad's as flashgrad.torch.
scaled_dot_product_attention. For every configuration (dtype, d, causal, L, K/V heads):

1. a check child runs both on the full inputs and compares the first K/V head group's out,
   dq, dk and dv with a float64 reference under the project's rule, err <= 2 x the math
   path's error in the same dtype + noise, the noise being the largest of flash-attn's
   rounding noise, one ulp of the largest value and, for dq and dk, the rounding noise of
   dS = P (dP - delta) (docs/design.md); a failing row is marked FAIL;
2. a timing child runs both in rounds, alternating which goes first, after a warm-up call
   each: the median forward and forward + backward of each, and the median over rounds of
   torch's time over flashgrad's (the speedup: a ratio from the same round cancels this
   machine's drift between rounds);
3. one memory child per implementation: its peak resident memory above its floor over one
   call (the floor read after the inputs exist and one call on 16 rows, so both count only
   what this configuration allocates).

The same run measures the machine's arithmetic peak (`flashgrad-lab roofline --peak`) and writes
DIR/torch_peer.json, DIR/torch_peer.md and DIR/torch_peer.png.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

from proc_stats import cpu_model, reset_vmhwm, vmhwm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


# ---- children -------------------------------------------------------------------------------

def _setup(cfg):
    import torch
    import flashgrad.torch as fgt

    torch.set_num_threads(cfg["threads"])
    fgt.set_num_threads(cfg["threads"])
    return torch, fgt


def _inputs(torch, cfg):
    g = torch.Generator().manual_seed(cfg["seqlen"] * 131 + cfg["dim"])
    dt = getattr(torch, DTYPES[cfg["dtype"]])
    b, hq, hk, length, d = cfg["batch"], cfg["heads"], cfg["heads_kv"], cfg["seqlen"], cfg["dim"]
    q = torch.randn(b, hq, length, d, generator=g).to(dt)
    k, v = (torch.randn(b, hk, length, d, generator=g).to(dt) for _ in range(2))
    dout = torch.randn(b, hq, length, d, generator=g).to(dt)
    return [x.requires_grad_() for x in (q, k, v)], dout


def _call(torch, fgt, impl, cfg):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kw = {"is_causal": cfg["causal"]}
    if cfg["heads_kv"] != cfg["heads"]:
        kw["enable_gqa"] = True
    if impl == "flashgrad":
        return lambda q, k, v: fgt.scaled_dot_product_attention(q, k, v, **kw)

    def peer(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, **kw)
    return peer


def _warm(torch, fgt, fn, cfg):
    """One call on 16 rows: one-time costs (lazy imports, the custom op's first dispatch, thread
    pools) are the process's, not the configuration's."""
    (sq, sk, sv), sd = _inputs(torch, dict(cfg, seqlen=16))
    fn(sq, sk, sv).backward(sd)


def _timed_call(fn, q, k, v, dout) -> tuple:
    """(forward seconds, forward + backward seconds) of one call, gradients cleared first."""
    for x in (q, k, v):
        x.grad = None
    t0 = time.perf_counter()
    out = fn(q, k, v)
    t1 = time.perf_counter()
    out.backward(dout)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t0


def child_memory(cfg) -> dict:
    """One implementation's peak resident memory above its floor over one call (its first: every
    buffer it allocates is touched there)."""
    torch, fgt = _setup(cfg)
    (q, k, v), dout = _inputs(torch, cfg)
    fn = _call(torch, fgt, cfg["impl"], cfg)
    _warm(torch, fgt, fn, cfg)
    reset_vmhwm()
    floor = vmhwm()
    fn(q, k, v).backward(dout)
    return {"peak_bytes": vmhwm() - floor}


def child_pair(cfg) -> dict:
    """Both implementations timed in rounds in one process, alternating which goes first; each
    round gives torch's time over flashgrad's, and the medians of those ratios cancel the
    machine's drift between rounds."""
    torch, fgt = _setup(cfg)
    (q, k, v), dout = _inputs(torch, cfg)
    impls = ("flashgrad", "torch")
    fns = {impl: _call(torch, fgt, impl, cfg) for impl in impls}
    first = 0.0
    for impl in impls:
        try:
            _warm(torch, fgt, fns[impl], cfg)
            first += _timed_call(fns[impl], q, k, v, dout)[1]
        except RuntimeError as e:
            return {"error": f"{impl}: " + str(e).splitlines()[0]}
    rounds = max(1, min(cfg["max_reps"], math.ceil(cfg["min_time"] / max(first, 1e-6))))
    times = {impl: [] for impl in impls}
    for i in range(rounds):
        for impl in (impls if i % 2 == 0 else impls[::-1]):
            times[impl].append(_timed_call(fns[impl], q, k, v, dout))
    res = {"rounds": rounds}
    for impl in impls:
        res[impl] = {"fwd_ms": 1e3 * statistics.median(t[0] for t in times[impl]),
                     "fwd_bwd_ms": 1e3 * statistics.median(t[1] for t in times[impl])}
    for j, key in enumerate(("fwd", "fwd_bwd")):
        res[f"{key}_speedup"] = statistics.median(p[j] / f[j] for f, p in zip(times["flashgrad"], times["torch"]))
    return res


def _reference_group(torch, cfg, q, k, v, dout, dtype, noise_of=None):
    """out, dq, dk, dv of the first K/V head and its query heads, computed in `dtype` by the
    materialized math (query blocks of 1024 rows; products accumulate in float32 or float64,
    results rounded to dtype): the float64 reference, or the same-precision math path.

    noise_of: a storage dtype; then also returns the first-order rounding noise of
    dS = P (dP - delta) for dq and dk that any method forming dP and delta = rowsum(dO * O)
    as separate sums carries (the project's rule adds it: docs/design.md, and
    cancellation_noise in python/tests/conftest.py)."""
    g = cfg["heads"] // cfg["heads_kv"]
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    qs, ks, vs, ds = (x[:1, :n].detach().to(dtype) for x, n in ((q, g), (k, 1), (v, 1), (dout, g)))
    length, d = qs.shape[2], qs.shape[3]
    scale = 1.0 / math.sqrt(d)
    out = torch.empty(qs.shape, dtype=acc)
    dq = torch.empty(qs.shape, dtype=acc)
    dk = torch.zeros(ks.shape, dtype=acc)
    dv = torch.zeros(vs.shape, dtype=acc)
    rnd = (lambda x: x.to(dtype).to(acc)) if dtype != acc else (lambda x: x)
    kt, vt = ks[0, 0].to(acc), vs[0, 0].to(acc)
    noise = {"dq": 0.0, "dk": torch.zeros(kt.shape, dtype=acc)} if noise_of is not None else None
    for h in range(g):
        for r0 in range(0, length, 1024):
            r1 = min(length, r0 + 1024)
            qb, db = qs[0, h, r0:r1].to(acc), ds[0, h, r0:r1].to(acc)
            s = rnd(qb @ kt.T * scale)
            if cfg["causal"]:
                rows = torch.arange(r0, r1)[:, None]
                s = s.masked_fill(torch.arange(length)[None, :] > rows, -math.inf)
            p = rnd(torch.softmax(s, dim=-1))
            o = rnd(p @ vt)
            out[0, h, r0:r1] = o
            dp = rnd(db @ vt.T)
            dsm = rnd(p * (dp - (dp * p).sum(-1, keepdim=True)))
            dq[0, h, r0:r1] = dsm @ kt * scale
            dk[0, 0] += dsm.T @ qb * scale
            dv[0, 0] += p.T @ db
            if noise is not None:
                u_acc, u_out = 2.0 ** -24, torch.finfo(noise_of).eps / 2
                delta = (db * o).abs().sum(-1, keepdim=True)
                gb = p * (u_acc * (db.abs() @ vt.abs().T) + u_out * delta)
                noise["dq"] = max(noise["dq"], (scale * gb @ kt.abs()).max().item())
                noise["dk"] += scale * gb.T @ qb.abs()
    res = [rnd(x) for x in (out, dq, dk, dv)]
    if noise is None:
        return res
    return res, {"out": 0.0, "dq": noise["dq"], "dk": noise["dk"].max().item(), "dv": 0.0}


def child_check(cfg) -> dict:
    torch, fgt = _setup(cfg)
    (q, k, v), dout = _inputs(torch, cfg)
    dt = q.dtype
    ref, cancel = _reference_group(torch, cfg, q, k, v, dout, torch.float64, noise_of=dt)
    naive = _reference_group(torch, cfg, q, k, v, dout, dt)
    g = cfg["heads"] // cfg["heads_kv"]
    res = {}
    for impl in ("flashgrad", "torch"):
        try:
            out = _call(torch, fgt, impl, cfg)(q, k, v)
        except RuntimeError as e:
            res[impl] = {"error": str(e).splitlines()[0]}
            continue
        out.backward(dout)
        got = [out.detach(), q.grad, k.grad, v.grad]
        for x in (q, k, v):
            x.grad = None
        rows = {}
        for name, x, r, n in zip(("out", "dq", "dk", "dv"), got, ref, naive):
            x = x[:1, :g if name in ("out", "dq") else 1].double()
            err, path = (x - r).abs().max().item(), (n.double() - r).abs().max().item()
            rr = r.to(dt)
            ulp = torch.finfo(dt).eps * r.abs().max().item()
            noise = max(2 * ((rr + 0.3) - 0.3 - rr).abs().max().item(), ulp, cancel[name])
            rows[name] = {"err": err, "bound": 2 * path + noise}
        res[impl] = {"ok": all(v["err"] <= v["bound"] for v in rows.values()), "rows": rows}
    return res


# ---- the parent ---------------------------------------------------------------------------

def _timings(cfg) -> dict:
    """The row's "flashgrad" and "torch" entries (median ms and peak bytes) and the paired
    speedups, or an "error" entry for the implementation that failed."""
    pair = run_child("pair", cfg)
    res = {}
    for impl in ("flashgrad", "torch"):
        mem = run_child("memory", dict(cfg, impl=impl))
        res[impl] = dict(pair.get(impl, {}), **mem) if "error" not in pair else {"error": pair["error"]}
    if "error" not in pair:
        res["speedup"] = {"fwd": pair["fwd_speedup"], "fwd_bwd": pair["fwd_bwd_speedup"], "rounds": pair["rounds"]}
    return res


def run_child(kind, cfg) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(cfg["threads"]))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, json.dumps(cfg)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()
        return {"error": tail[-1] if tail else f"exit {p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def flops(cfg) -> tuple:
    """Useful FLOPs of the forward and of forward + backward (causal: the visible half)."""
    n = cfg["batch"] * cfg["heads"] * cfg["seqlen"] ** 2 * cfg["dim"] * (0.5 if cfg["causal"] else 1.0)
    return 4 * n, 14 * n


def peaks(threads: int) -> dict:
    exe = os.environ.get("FLASHGRAD_LAB", os.path.join(ROOT, "build", "bench", "flashgrad-lab"))
    try:
        p = subprocess.run([exe, "roofline", "--peak", "--json", "--threads", str(threads)],
                           capture_output=True, text=True, check=True)
        return json.loads(p.stdout)
    except (OSError, subprocess.CalledProcessError, ValueError) as e:
        print(f"torch_peer: no arithmetic peak ({exe}: {e}); build flashgrad-lab first (it needs OpenBLAS)", file=sys.stderr)
        return {}


def configs(a) -> list:
    out = []
    for dtype in a.dtypes.split(","):
        for dim in (int(x) for x in a.dims.split(",")):
            for causal in (False, True):
                for hk in sorted({a.heads, a.gqa_heads_kv}, reverse=True):
                    for length in (int(x) for x in a.lengths.split(",")):
                        if hk != a.heads and (dtype == "f16" or (dim != 128 and not a.memory)):
                            continue  # GQA: one row per dtype at d = 128 (every d with --memory)
                        if length > min(a.max_length.get(dtype, 1 << 62), a.max_length.get(f"d{dim}", 1 << 62)):
                            continue
                        out.append({"dtype": dtype, "dim": dim, "causal": causal, "seqlen": length, "batch": 1,
                                    "heads": a.heads, "heads_kv": hk, "threads": a.threads,
                                    "min_time": a.min_time, "max_reps": a.max_reps})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="L 512 and 2048, d 128 only")
    ap.add_argument("--memory", action="store_true",
                    help="only each configuration's peak memory, GQA at every d; prints one line each")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--dtypes", default="f32,bf16,f16")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--lengths", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--gqa-heads-kv", type=int, default=2)
    ap.add_argument("--max-lengths", default="",
                    help="caps per dtype or head dim, e.g. f16=4096,d64=8192")
    ap.add_argument("--min-time", type=float, default=2.0, help="seconds of timed runs per child")
    ap.add_argument("--max-reps", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "torch_peer"))
    ap.add_argument("--recheck", action="store_true",
                    help="run the check children again on the rows of DIR/torch_peer.json whose check "
                         "did not pass, keeping every timing")
    a = ap.parse_args()
    if a.child:
        fn = {"pair": child_pair, "memory": child_memory, "check": child_check}[a.child[0]]
        print(json.dumps(fn(json.loads(a.child[1]))))
        return 0
    if a.recheck:
        return recheck(a.out)
    if a.quick:
        a.lengths, a.dims = "512,2048", "128"
    a.max_length = {k: int(v) for k, v in (item.split("=") for item in a.max_lengths.split(",") if item)}
    if a.memory:
        return memory_only(a)
    os.makedirs(a.out, exist_ok=True)
    import torch
    import flashgrad

    meta = {"torch": torch.__version__, "flashgrad": flashgrad.__version__, "isa": flashgrad.isa(),
            "threads": a.threads, "cpu": cpu_model(), "peak": peaks(a.threads), "command": " ".join(sys.argv)}
    print(f"torch_peer: torch {meta['torch']}, flashgrad on {meta['isa']}, {a.threads} threads, {meta['cpu']}; "
          f"peak {meta['peak']}", flush=True)
    rows = []
    for cfg in configs(a):
        row = dict(cfg)
        row["check"] = run_child("check", cfg)
        row.update(_timings(cfg))
        rows.append(row)
        print(_line(row), flush=True)
        with open(os.path.join(a.out, "torch_peer.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    from torch_peer_report import write_report

    write_report(meta, rows, a.out)
    return 0


def memory_only(a) -> int:
    for cfg in configs(a):
        mib = {}
        for impl in ("flashgrad", "torch"):
            res = run_child("memory", dict(cfg, impl=impl))
            mib[impl] = f"{res['peak_bytes'] / 2**20:7.2f}" if "peak_bytes" in res else res.get("error", "failed")
        print(f"{cfg['dtype']:>4} d={cfg['dim']:<3} {'causal' if cfg['causal'] else 'full  '} L={cfg['seqlen']:<5} "
              f"kv={cfg['heads_kv']}  peak MiB flashgrad {mib['flashgrad']} / torch {mib['torch']}", flush=True)
    return 0


def recheck(out_dir) -> int:
    path = os.path.join(out_dir, "torch_peer.json")
    with open(path) as f:
        data = json.load(f)
    for row in data["rows"]:
        if row["check"].get("flashgrad", {}).get("ok"):
            continue
        cfg = {key: row[key] for key in ("dtype", "dim", "causal", "seqlen", "batch", "heads", "heads_kv", "threads",
                                         "min_time", "max_reps")}
        row["check"] = run_child("check", cfg)
        print(_line(row), flush=True)
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
    from torch_peer_report import write_report

    write_report(data["meta"], data["rows"], out_dir)
    return 0


def _line(r) -> str:
    fg, pt, ck = r["flashgrad"], r["torch"], r["check"]
    name = (f"{r['dtype']:>4} d={r['dim']:<3} {'causal' if r['causal'] else 'full  '} "
            f"L={r['seqlen']:<5} kv={r['heads_kv']}")
    if "error" in fg or "error" in pt:
        return f"{name}  flashgrad {fg.get('error', 'ok')} | torch {pt.get('error', 'ok')}"
    ok = "ok" if ck.get("flashgrad", {}).get("ok") else "FAIL"
    sp = r["speedup"]
    return (f"{name}  fwd {fg['fwd_ms']:8.1f} / {pt['fwd_ms']:8.1f} ms ({sp['fwd']:.2f}x)  "
            f"fwd+bwd {fg['fwd_bwd_ms']:8.1f} / {pt['fwd_bwd_ms']:8.1f} ms ({sp['fwd_bwd']:.2f}x)  "
            f"mem {fg['peak_bytes'] / 2**20:6.0f} / {pt['peak_bytes'] / 2**20:6.0f} MiB  check {ok}")


if __name__ == "__main__":
    sys.exit(main())
