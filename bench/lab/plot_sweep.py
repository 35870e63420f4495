#!/usr/bin/python3
"""Plots `flashgrad-lab sweep`'s results from its sweep.json into OUT_DIR:

  sweep_time.png    forward+backward time against L: flashgrad, naive, torch
  sweep_memory.png  peak resident memory against L, the same three
  sweep_ratio.png   flashgrad's rate over the GEMM rate (SGEMM for f32, bf16
                    GEMM for bf16) against L, for forward, backward and both

usage: plot_sweep.py sweep.json OUT_DIR
"""
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt

IMPLS = (("flashgrad", "C0", "o"), ("naive", "C1", "s"), ("torch", "C2", "^"))
MASKS = ((False, "-", "full"), (True, "--", "causal"))


def shapes(grid):
    """(dtype, head_dim) pairs in the order they appear."""
    seen = []
    for r in grid:
        key = (r["dtype"], r["head_dim"])
        if key not in seen:
            seen.append(key)
    return seen


def series(grid, dtype, head_dim, causal, impl, value):
    points = [(r["seqlen"], value(r, r[impl])) for r in grid
              if r["dtype"] == dtype and r["head_dim"] == head_dim and r["causal"] == causal
              and "fwd_ms" in r[impl]]
    return [p[0] for p in points], [p[1] for p in points]


def log_axes(ax, lengths, ylabel):
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(x) for x in lengths])
    ax.minorticks_off()
    ax.set_xlabel("sequence length L")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


def log_y(ax, base):
    """A log y axis with plain-number ticks at powers of base."""
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    k = math.floor(math.log(lo, base))
    ticks = []
    while base ** k <= hi * 1.0001:
        if base ** k >= lo * 0.9999:
            ticks.append(base ** k)
        k += 1
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_ylim(lo, hi)


def title(sweep):
    shape = sweep["shape"]
    machine = sweep["machine"]
    quick = ", --quick" if sweep["quick"] else ""
    others = [p["others"] for p in sweep.get("cpu_used_by_others", []) if p["part"] == "whole run"]
    busy = f", other processes {100 * others[0]:.0f}% of the CPUs" if others else ""
    return (f"B={shape['batch']} H={shape['heads_q']}, {sweep['threads']} threads, {sweep['isa']}{busy}{quick}; "
            f"{machine['cpu']}, source {sweep.get('source', '?')}")


def panels(sweep, value, ylabel, name, out_dir, base):
    grid = sweep["grid"]
    pairs = shapes(grid)
    lengths = sorted({r["seqlen"] for r in grid})
    cols = min(2, len(pairs))
    rows = (len(pairs) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.2 * rows), squeeze=False)
    for ax, (dtype, head_dim) in zip(axes.flat, pairs):
        for impl, color, marker in IMPLS:
            for causal, style, mask in MASKS:
                xs, ys = series(grid, dtype, head_dim, causal, impl, value)
                if xs:
                    ax.plot(xs, ys, style, color=color, marker=marker, label=f"{impl} ({mask})")
        log_axes(ax, lengths, ylabel)
        ax.set_yscale("log")
        log_y(ax, base)
        ax.set_title(f"{dtype}, d = {head_dim}")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(pairs):]:
        ax.set_visible(False)
    fig.suptitle(title(sweep), fontsize=9)
    fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ratio_plot(sweep, out_dir):
    grid = sweep["grid"]
    lengths = sorted({r["seqlen"] for r in grid})
    passes = (("fwd", "forward"), ("bwd", "backward"), ("fwd_bwd", "forward+backward"))
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.4), sharey=True)
    colors = {}
    for ax, (key, label) in zip(axes, passes):
        for dtype, head_dim in shapes(grid):
            color = colors.setdefault((dtype, head_dim), f"C{len(colors)}")
            for causal, style, mask in MASKS:
                xs, ys = series(grid, dtype, head_dim, causal, "flashgrad",
                                lambda r, t: t[f"{key}_ratio_to_gemm"])
                if xs:
                    ax.plot(xs, ys, style, color=color, marker="o", label=f"flashgrad {dtype} d={head_dim} {mask}")
        # The peers on the same scale, for the f32 d=64 full-mask shape.
        for impl, style in (("naive", ":"), ("torch", "-.")):
            xs, ys = series(grid, "f32", 64, False, impl, lambda r, t: t[f"{key}_ratio_to_gemm"])
            if xs:
                ax.plot(xs, ys, style, color="gray", marker=".", label=f"{impl} f32 d=64 full")
        ax.axhline(1.0, color="black", linewidth=0.8)
        log_axes(ax, lengths, "rate / GEMM rate" if key == "fwd" else "")
        ax.set_title(label)
    top = max(max(line.get_ydata(), default=0) for ax in axes for line in ax.get_lines())
    axes[0].set_ylim(0, 1.08 * max(top, 1.0))  # the axes share y
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8)
    sgemm = sweep.get("sgemm_gflops_used")
    bf16 = sweep.get("bf16_gemm_gflops_used")
    bf16_text = f"{bf16:.0f}" if isinstance(bf16, (int, float)) else "n/a"
    fig.suptitle(f"flashgrad's GFLOP/s over GEMM's (SGEMM {sgemm:.0f} GFLOP/s for f32, bf16 GEMM {bf16_text} "
                 f"for bf16), same run\n" + title(sweep), fontsize=9)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    path = os.path.join(out_dir, "sweep_ratio.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(json_path, out_dir):
    with open(json_path) as f:
        sweep = json.load(f)
    written = [
        panels(sweep, lambda r, t: t["fwd_bwd_ms"] / 1e3, "forward+backward time (s)", "sweep_time.png", out_dir,
               10),
        panels(sweep, lambda r, t: t["peak_bytes"] / 2**20, "peak resident memory (MiB)", "sweep_memory.png",
               out_dir, 4),
        ratio_plot(sweep, out_dir),
    ]
    for path in written:
        print(f"  wrote {path}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
