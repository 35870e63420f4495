#!/usr/bin/env python3
"""Per-cell median of several `flashgrad bench --features` outputs.

On a VM whose neighbours come and go, a cell of one run can move by 0.1;
the median over runs of each rate and each ratio is steadier. Prints the
same layout as the command:

    for i in 1 2 3; do build/tools/flashgrad bench --features --repeats 7 > f$i.txt; done
    python3 bench/features_median.py f1.txt f2.txt f3.txt
"""
import re
import statistics
import sys

PLAIN = re.compile(r"(f32|bf16) d (\d+): plain (\d+) / (\d+) GFLOP/s, causal (\d+) / (\d+)(.*)")
NAME_WIDTH = 18  # the feature column of the table


def median_line(lines):
    head = PLAIN.match(lines[0])
    if head:
        rates = [[int(x) for x in PLAIN.match(line).groups()[2:6]] for line in lines]
        med = [int(statistics.median(r[i] for r in rates)) for i in range(4)]
        return (f"{head.group(1)} d {head.group(2)}: plain {med[0]} / {med[1]} GFLOP/s, "
                f"causal {med[2]} / {med[3]}{head.group(7)}")
    name = lines[0][:NAME_WIDTH]
    try:
        cells = [[float(x) for x in line[NAME_WIDTH:].split()] for line in lines]
    except ValueError:
        return lines[0]
    if not name.strip() or any(len(c) != 6 for c in cells):
        return lines[0]
    med = [statistics.median(c[i] for c in cells) for i in range(6)]
    pairs = [f"{med[i]:.2f}     {med[i + 1]:.2f}" for i in (0, 2, 4)]
    return f"{name:<{NAME_WIDTH}}     " + "       ".join(pairs)


def main(paths):
    if len(paths) < 2:
        sys.exit("usage: features_median.py RUN1 RUN2 [RUN3 ...]")
    runs = [open(path).read().rstrip("\n").split("\n") for path in paths]
    if len({len(r) for r in runs}) != 1:
        sys.exit("features_median.py: the runs have different layouts")
    print("\n".join(median_line(lines) for lines in zip(*runs)))


if __name__ == "__main__":
    main(sys.argv[1:])
