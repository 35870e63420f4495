#!/usr/bin/python3
"""Plots `flashgrad demo`'s results: time and peak memory against sequence length.

usage: plot_demo.py demo.json demo.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt


def series(rows, causal, impl, key):
    points = [(r["seqlen"], r[impl][key]) for r in rows if r["causal"] == causal and r[impl]]
    return [p[0] for p in points], [p[1] for p in points]


def main(json_path, png_path):
    with open(json_path) as f:
        demo = json.load(f)
    rows = demo["rows"]
    baseline = bool(demo.get("openblas"))  # empty when flashgrad-baseline was not there
    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(12, 4.5))
    style = {"flashgrad": "-o", "naive": "--s"}
    for impl in ("flashgrad", "naive") if baseline else ("flashgrad",):
        for causal in (False, True):
            label = f"{impl} ({'causal' if causal else 'full'})"
            xs, ms = series(rows, causal, impl, "ms")
            ax_time.plot(xs, [m / 1e3 for m in ms], style[impl], label=label)
            xs, peak = series(rows, causal, impl, "peak_bytes")
            ax_mem.plot(xs, [p / 2**20 for p in peak], style[impl], label=label)
    missing = sorted({r["seqlen"]: r["naive_predicted_bytes"] / 2**20 for r in rows if not r["naive"]}.items())
    if baseline and missing:
        ax_mem.plot([m[0] for m in missing], [m[1] for m in missing], "s", markerfacecolor="none",
                    color="gray", label="naive, predicted (does not fit)")
    available = demo["mem_available_bytes"] / 2**20
    ax_mem.axhline(available, color="gray", linestyle=":", label="MemAvailable")
    lengths = sorted({r["seqlen"] for r in rows})
    shape = demo["shape"]
    title = (f"B={shape['batch']} H={shape['heads_q']} d={shape['head_dim']} {shape['dtype']}, "
             f"{demo['threads']} threads, {demo['isa']}")
    for ax, ylabel in ((ax_time, "forward+backward time (s)"), (ax_mem, "peak resident memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(x) for x in lengths])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(("flashgrad vs materialized attention (OpenBLAS): " if baseline else
                  "flashgrad (no baseline: flashgrad-baseline was not there): ") + title)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
