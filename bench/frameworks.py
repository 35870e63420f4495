#!/usr/bin/env python3
"""flashgrad.jax and flashgrad.mlx beside each framework's own CPU attention.

    <venv>/bin/python bench/frameworks.py [--frameworks jax,mlx] [--max-length L] [--own-max-length L]
                                 [--out DIR]

JAX: flashgrad.jax.dot_product_attention against jax.nn.dot_product_attention (XLA), both
jitted, on [B, L, H, d]. MLX: flashgrad.mlx.scaled_dot_product_attention against
mx.fast.scaled_dot_product_attention, on [B, H, L, d]. For every configuration (framework,
dtype, d, causal, L doubling from 512 up to --max-length):

1. a check child runs both implementations on the full inputs and compares the first
   head's out, dq, dk and dv with a float64 reference under the project's rule
   (bench/torch_peer.py's _reference_group and bound); a failing row is marked FAIL;
2. one timing child per implementation: warm-up, then the median forward and
   forward + VJP (out and dq, dk, dv from one dout) over repeats, and the child's peak
   resident memory above its floor (read after the inputs exist and one call on 16 rows).

The framework's own attention materializes B * H * L * L scores; a configuration whose
estimate (4 such f32 arrays) exceeds 80% of MemAvailable is not run for it ("does not
fit"), and a framework's lengths stop there. Writes DIR/frameworks.json and .md.
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
IMPLS = ("flashgrad", "own")


# ---- the two frameworks: inputs in numpy, one fwd and one fwd+vjp callable each ---------------

def _numpy_inputs(cfg):
    import numpy as np

    rng = np.random.default_rng(cfg["seqlen"] * 131 + cfg["dim"])
    b, h, length, d = cfg["batch"], cfg["heads"], cfg["seqlen"], cfg["dim"]
    return [rng.standard_normal((b, h, length, d), dtype=np.float32) for _ in range(4)]  # q, k, v, dout [B,H,L,d]


def _jax_fns(cfg, impl, arrays):
    import jax
    import jax.numpy as jnp

    import flashgrad.jax as fgj

    fgj.set_num_threads(cfg["threads"])
    dt = {"f32": jnp.float32, "bf16": jnp.bfloat16}[cfg["dtype"]]
    q, k, v, dout = (jnp.asarray(a.transpose(0, 2, 1, 3)).astype(dt) for a in arrays)  # [B, L, H, d]
    attn = fgj.dot_product_attention if impl == "flashgrad" else jax.nn.dot_product_attention
    call = lambda q, k, v: attn(q, k, v, is_causal=cfg["causal"])  # noqa: E731

    def both(q, k, v, dout):
        out, pull = jax.vjp(call, q, k, v)
        return (out,) + pull(dout)
    fwd, fb = jax.jit(call), jax.jit(both)
    return lambda: jax.block_until_ready(fwd(q, k, v)), lambda: jax.block_until_ready(fb(q, k, v, dout))


def _mlx_fns(cfg, impl, arrays):
    import mlx.core as mx

    import flashgrad.mlx as fgm

    fgm.set_num_threads(cfg["threads"])
    dt = {"f32": mx.float32, "bf16": mx.bfloat16}[cfg["dtype"]]
    q, k, v, dout = (mx.array(a).astype(dt) for a in arrays)
    attn = fgm.scaled_dot_product_attention if impl == "flashgrad" else mx.fast.scaled_dot_product_attention
    scale = 1.0 / math.sqrt(cfg["dim"])
    mask = "causal" if cfg["causal"] else None
    call = lambda q, k, v: attn(q, k, v, scale=scale, mask=mask)  # noqa: E731

    def both():
        outs, grads = mx.vjp(call, [q, k, v], [dout])
        mx.eval(outs, grads)
        return [outs[0], *grads]
    return (lambda: mx.eval(call(q, k, v))), both


def _fns(cfg, impl, arrays):
    return (_jax_fns if cfg["framework"] == "jax" else _mlx_fns)(cfg, impl, arrays)


def _to_numpy(cfg, results):
    """out, dq, dk, dv as float32 numpy arrays in [B, H, L, d]."""
    import numpy as np

    if cfg["framework"] == "jax":
        import jax.numpy as jnp
        return [np.asarray(x.astype(jnp.float32)).transpose(0, 2, 1, 3) for x in results]
    import mlx.core as mx
    return [np.array(x.astype(mx.float32)) for x in results]


# ---- children -------------------------------------------------------------------------------

def child_time(cfg) -> dict:
    small = dict(cfg, seqlen=16)
    fwd, both = _fns(small, cfg["impl"], _numpy_inputs(small))
    both()  # one-time costs (imports, thread pools, compiles of the small shape) are the process's
    arrays = _numpy_inputs(cfg)
    fwd, both = _fns(cfg, cfg["impl"], arrays)
    del arrays
    reset_vmhwm()
    floor = vmhwm()
    t0 = time.perf_counter()
    fwd()
    both()  # warm-up: compiles and the first touch of every buffer
    first = time.perf_counter() - t0
    reps = max(1, min(cfg["max_reps"], math.ceil(cfg["min_time"] / max(first, 1e-6))))
    tf, tb = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        fwd()
        t1 = time.perf_counter()
        both()
        t2 = time.perf_counter()
        tf.append(t1 - t0)
        tb.append(t2 - t1)
    return {"fwd_ms": 1e3 * statistics.median(tf), "fwd_bwd_ms": 1e3 * statistics.median(tb), "reps": reps,
            "peak_bytes": vmhwm() - floor}


def child_check(cfg) -> dict:
    import torch

    from torch_peer import _reference_group

    arrays = _numpy_inputs(cfg)
    tdt = {"f32": torch.float32, "bf16": torch.bfloat16}[cfg["dtype"]]
    q, k, v, dout = (torch.from_numpy(a).to(tdt) for a in arrays)
    tcfg = dict(cfg, heads_kv=cfg["heads"])
    ref, cancel = _reference_group(torch, tcfg, q, k, v, dout, torch.float64, noise_of=tdt)
    naive = _reference_group(torch, tcfg, q, k, v, dout, tdt)
    res = {}
    for impl in IMPLS:
        try:
            got = _to_numpy(cfg, _fns(cfg, impl, arrays)[1]())
        except Exception as e:  # noqa: BLE001  (the framework's own may refuse or run out of memory)
            res[impl] = {"error": str(e).splitlines()[0][:200]}
            continue
        rows = {}
        for name, x, r, n in zip(("out", "dq", "dk", "dv"), got, ref, naive):
            x = torch.from_numpy(x[:1, :1]).double()
            err, path = (x - r).abs().max().item(), (n.double() - r).abs().max().item()
            rr = r.to(tdt)
            ulp = torch.finfo(tdt).eps * r.abs().max().item()
            noise = max(2 * ((rr + 0.3) - 0.3 - rr).abs().max().item(), ulp, cancel[name])
            rows[name] = {"err": err, "bound": 2 * path + noise}
        res[impl] = {"ok": all(r["err"] <= r["bound"] for r in rows.values()), "rows": rows}
    return res


# ---- the parent ---------------------------------------------------------------------------

def run_child(kind, cfg) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(cfg["threads"]), OPENBLAS_NUM_THREADS=str(cfg["threads"]))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, json.dumps(cfg)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()
        return {"error": tail[-1][:200] if tail else f"exit {p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def own_fits(cfg) -> tuple:
    need = 4 * cfg["batch"] * cfg["heads"] * cfg["seqlen"] ** 2 * 4
    return need <= 0.8 * mem_available(), need


def versions(frameworks) -> dict:
    out = {}
    for fw in frameworks:
        mod = __import__("jax" if fw == "jax" else "mlx.core", fromlist=["__version__"])
        out[fw] = mod.__version__
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--frameworks", default="jax,mlx")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--causal", default="0,1", help="0, 1 or both")
    ap.add_argument("--min-length", type=int, default=512)
    ap.add_argument("--max-length", type=int, default=16384)
    ap.add_argument("--own-max-length", type=int, default=1 << 62,
                    help="longest L at which the framework's own attention runs (flashgrad goes on)")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--min-time", type=float, default=2.0, help="seconds of timed runs per child")
    ap.add_argument("--max-reps", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "frameworks"))
    a = ap.parse_args()
    if a.child:
        fn = child_time if a.child[0] == "time" else child_check
        print(json.dumps(fn(json.loads(a.child[1]))))
        return 0
    import flashgrad

    frameworks = a.frameworks.split(",")
    meta = {"flashgrad": flashgrad.__version__, "isa": flashgrad.isa(), "threads": a.threads, "cpu": cpu_model(),
            "versions": versions(frameworks), "command": " ".join(sys.argv)}
    print(f"frameworks: {meta['versions']}, flashgrad on {meta['isa']}, {a.threads} threads, {meta['cpu']}",
          flush=True)
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for fw in frameworks:
        for dtype in a.dtypes.split(","):
            for dim in (int(x) for x in a.dims.split(",")):
                for causal in (bool(int(x)) for x in a.causal.split(",")):
                    length, own_ok = a.min_length, True
                    while length <= a.max_length:
                        cfg = {"framework": fw, "dtype": dtype, "dim": dim, "causal": causal, "seqlen": length,
                               "batch": 1, "heads": a.heads, "threads": a.threads, "min_time": a.min_time,
                               "max_reps": a.max_reps}
                        rows.append(measure(cfg, own_ok, length > a.own_max_length))
                        own_ok = own_ok and (length > a.own_max_length or "error" not in rows[-1]["own"])
                        print(line(rows[-1]), flush=True)
                        with open(os.path.join(a.out, "frameworks.json"), "w") as f:
                            json.dump({"meta": meta, "rows": rows}, f, indent=1)
                        length *= 2
    with open(os.path.join(a.out, "frameworks.md"), "w") as f:
        f.write(report(meta, rows))
    print(f"frameworks: wrote {a.out}/frameworks.json and frameworks.md")
    return 0


def measure(cfg, own_ok, past_max=False) -> dict:
    row = dict(cfg)
    fits, need = own_fits(cfg)
    if not own_ok or not fits or past_max:
        row["own"] = {"error": f"does not fit (needs about {need / 2**30:.1f} GiB)" if not fits else
                      "not run (past --own-max-length)" if past_max else "not run"}
        row["check"] = {}
        row["flashgrad"] = run_child("time", dict(cfg, impl="flashgrad"))
        return row
    row["check"] = run_child("check", cfg)
    for impl in IMPLS:
        row[impl] = run_child("time", dict(cfg, impl=impl))
    return row


def _name(r) -> str:
    return f"{r['framework']:<3} {r['dtype']:>4} d={r['dim']:<3} {'causal' if r['causal'] else 'full  '} L={r['seqlen']:<5}"


def _ok(r, impl) -> str:
    c = r["check"].get(impl)
    return "-" if c is None else ("error" if "error" in c else ("ok" if c["ok"] else "FAIL"))


def line(r) -> str:
    fg, own = r["flashgrad"], r["own"]
    if "error" in fg:
        return f"{_name(r)}  flashgrad {fg['error']}"
    s = (f"{_name(r)}  flashgrad fwd {fg['fwd_ms']:8.1f} ms  fwd+vjp {fg['fwd_bwd_ms']:8.1f} ms  "
         f"mem {fg['peak_bytes'] / 2**20:6.0f} MiB  check {_ok(r, 'flashgrad')}")
    if "error" in own:
        return s + f"  | own: {own['error']}"
    return s + (f"  | own fwd {own['fwd_ms']:8.1f} ({own['fwd_ms'] / fg['fwd_ms']:.2f}x)  "
                f"fwd+vjp {own['fwd_bwd_ms']:8.1f} ({own['fwd_bwd_ms'] / fg['fwd_bwd_ms']:.2f}x)  "
                f"mem {own['peak_bytes'] / 2**20:6.0f} MiB  check {_ok(r, 'own')}")


def report(meta, rows) -> str:
    out = [f"# flashgrad beside JAX's and MLX's CPU attention\n",
           f"{meta['cpu']}, {meta['threads']} threads, flashgrad on {meta['isa']}, {meta['versions']}.",
           f"Command: `{meta['command']}`. B = 1, 8 heads; median ms per call; memory is the peak "
           "resident memory above the child's floor; speedup = own / flashgrad.\n",
           "| framework | dtype | d | mask | L | fwd ms (fg / own) | fwd+vjp ms (fg / own) | fwd+vjp speedup "
           "| peak MiB (fg / own) | check (fg / own) |",
           "|---|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        fg, own = r["flashgrad"], r["own"]
        if "error" in fg:
            out.append(f"| {r['framework']} | {r['dtype']} | {r['dim']} | {'causal' if r['causal'] else 'full'} "
                       f"| {r['seqlen']} | flashgrad: {fg['error']} | | | | |")
            continue
        has = "error" not in own
        pair = lambda key, f=1.0: f"{fg[key] * f:.1f} / " + (f"{own[key] * f:.1f}" if has else "–")  # noqa: E731
        speed = f"{own['fwd_bwd_ms'] / fg['fwd_bwd_ms']:.2f}x" if has else own["error"]
        out.append(f"| {r['framework']} | {r['dtype']} | {r['dim']} | {'causal' if r['causal'] else 'full'} "
                   f"| {r['seqlen']} | {pair('fwd_ms')} | {pair('fwd_bwd_ms')} | {speed} "
                   f"| {pair('peak_bytes', 2.0 ** -20)} | {_ok(r, 'flashgrad')} / {_ok(r, 'own')} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
