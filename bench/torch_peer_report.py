"""The report of bench/torch_peer.py: a markdown table and a plot from its rows."""
from __future__ import annotations

import os


def _rate(r, impl, key):
    fwd = 4 * r["batch"] * r["heads"] * r["seqlen"] ** 2 * r["dim"] * (0.5 if r["causal"] else 1.0)
    work = fwd if key == "fwd_ms" else 3.5 * fwd
    return work / (r[impl][key] * 1e-3) * 1e-9


def _peak_for(meta, dtype):
    p = meta.get("peak", {})
    if dtype == "bf16" and p.get("bf16_peak_gflops"):
        return p["bf16_peak_gflops"]
    return p.get("f32_peak_gflops")


def _speedup(r, key):
    """torch's time over flashgrad's: the median of the paired rounds' ratios where the row has
    them, else the ratio of the medians."""
    if "speedup" in r:
        return r["speedup"][key]
    ms = "fwd_ms" if key == "fwd" else "fwd_bwd_ms"
    return r["torch"][ms] / r["flashgrad"][ms]


def _ok(r):
    return "error" not in r["flashgrad"] and "error" not in r["torch"]


def table(meta, rows) -> str:
    lines = [
        "| dtype | d | mask | L | K/V heads | fwd ms flashgrad / torch | speedup | fwd+bwd ms flashgrad / torch "
        "| speedup | flashgrad fwd+bwd GFLOP/s (of peak) | peak MiB flashgrad / torch | check |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        head = (f"| {r['dtype']} | {r['dim']} | {'causal' if r['causal'] else 'full'} | {r['seqlen']} "
                f"| {r['heads_kv']} |")
        if not _ok(r):
            err = r["torch"].get("error") or r["flashgrad"].get("error")
            lines.append(head + f" {err} | | | | | | |")
            continue
        fg, pt = r["flashgrad"], r["torch"]
        ck = r["check"].get("flashgrad", {})
        peak = _peak_for(meta, r["dtype"])
        rate = _rate(r, "flashgrad", "fwd_bwd_ms")
        of_peak = f" ({rate / peak:.2f})" if peak else ""
        lines.append(
            head + f" {fg['fwd_ms']:.1f} / {pt['fwd_ms']:.1f} | {_speedup(r, 'fwd'):.2f}x "
            f"| {fg['fwd_bwd_ms']:.1f} / {pt['fwd_bwd_ms']:.1f} | **{_speedup(r, 'fwd_bwd'):.2f}x** "
            f"| {rate:.0f}{of_peak} | {fg['peak_bytes'] / 2**20:.0f} / {pt['peak_bytes'] / 2**20:.0f} "
            f"| {'ok' if ck.get('ok') else 'FAIL'} |")
    return "\n".join(lines)


def summary(rows) -> str:
    ok = [r for r in rows if _ok(r)]
    if not ok:
        return "No configuration ran on both."

    def ratios(sel):
        xs = [_speedup(r, "fwd_bwd") for r in sel]
        return f"{min(xs):.2f}x-{max(xs):.2f}x" if xs else "-"

    full = [r for r in ok if not r["causal"]]
    causal = [r for r in ok if r["causal"]]
    mem = sum(r["flashgrad"]["peak_bytes"] <= r["torch"]["peak_bytes"] for r in ok)
    failed = [r for r in rows if not r["check"].get("flashgrad", {}).get("ok")]
    return (f"forward+backward speedup over torch: {ratios(full)} without a mask, {ratios(causal)} causal; "
            f"flashgrad's peak memory at or below torch's in {mem} of {len(ok)} configurations; "
            f"{len(failed)} configurations failed the accuracy check.")


def plot(meta, rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {}
    for r in rows:
        if _ok(r) and r["heads_kv"] == r["heads"]:
            groups.setdefault((r["dtype"], r["dim"]), []).append(r)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = iter(plt.cm.tab10.colors)
    for (dtype, dim), rs in sorted(groups.items()):
        color = next(colors)
        for causal, style in ((False, "-"), (True, "--")):
            sel = sorted((r for r in rs if r["causal"] == causal), key=lambda r: r["seqlen"])
            if not sel:
                continue
            xs = [r["seqlen"] for r in sel]
            label = f"{dtype} d={dim}{' causal' if causal else ''}"
            axes[0].plot(xs, [_speedup(r, "fwd_bwd") for r in sel], style,
                         color=color, marker="o", label=label)
            axes[1].plot(xs, [r["flashgrad"]["peak_bytes"] / max(r["torch"]["peak_bytes"], 1) for r in sel], style,
                         color=color, marker="o", label=label)
    axes[0].set_title("forward+backward speedup over torch's CPU flash SDPA")
    axes[1].set_title("peak memory: flashgrad / torch")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("L")
        ax.grid(alpha=0.3)
    axes[0].axhline(1.5, color="gray", lw=0.8)
    axes[0].axhline(2.0, color="gray", lw=0.8, ls="--")
    axes[1].axhline(1.0, color="gray", lw=0.8)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{meta['cpu']}, {meta['threads']} threads, torch {meta['torch']}, flashgrad on {meta['isa']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_report(meta, rows, out_dir):
    md = os.path.join(out_dir, "torch_peer.md")
    with open(md, "w") as f:
        f.write(f"# flashgrad beside torch's CPU flash SDPA\n\n{meta['cpu']}, {meta['threads']} threads; torch "
                f"{meta['torch']}; flashgrad {meta['flashgrad']} on {meta['isa']}; arithmetic peak "
                f"{meta.get('peak', {})}.\nCommand: `{meta['command']}`\n\n{summary(rows)}\n\n{table(meta, rows)}\n")
    plot(meta, rows, os.path.join(out_dir, "torch_peer.png"))
    print(f"torch_peer: wrote {md} and torch_peer.png")
