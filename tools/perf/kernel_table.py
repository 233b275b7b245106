#!/usr/bin/env python3
"""Per-kernel times of one forward step from an ncu CSV (tools/device/decode_kernels_check.sh).

Usage: kernel_table.py kernels.csv [--step N] [--marker REGEX]
Steps start at each kernel matching --marker (default: the embedding lookup); --step picks one
(default: the last complete one, i.e. the second to last start when the run ends mid-step is not
detectable, so the last). Prints the kernels grouped by name with count and total microseconds.
"""
import argparse
import collections
import csv
import re
import sys


def short(name):
    name = re.sub(r"\(.*", "", name)          # drop the argument list
    name = re.sub(r"^.*::", "", name)          # drop namespaces
    return name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--step", type=int, default=-1)
    ap.add_argument("--marker", default="EmbedKernel|Embed")
    ap.add_argument("--list", action="store_true", help="print every kernel of the step in order")
    args = ap.parse_args()
    rows = []
    with open(args.csv) as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r["Metric Name"] != "gpu__time_duration.sum":
            continue
        full = r["Kernel Name"]
        rows.append((short(full), full, r["Grid Size"], r["Block Size"],
                     float(r["Metric Value"].replace(",", "")) / 1000.0))
    marker = re.compile(args.marker)
    starts = [i for i, r in enumerate(rows) if marker.search(r[0])]
    if not starts:
        sys.exit("no step marker found")
    s = starts[args.step]
    nxt = [i for i in starts if i > s]
    e = nxt[0] if nxt else len(rows)
    step = rows[s:e]
    print(f"{len(rows)} kernels, {len(starts)} steps; step {args.step}: kernels {s}..{e - 1}, "
          f"{len(step)} kernels, {sum(r[4] for r in step):.1f} us")
    if args.list:
        for r in step:
            print(f"{r[4]:9.2f}  {r[0]}  grid {r[2]} block {r[3]}")
        return
    groups = collections.defaultdict(lambda: [0, 0.0, ""])
    for r in step:
        key = r[0] + (" " + r[1][r[1].find("<"):r[1].find(">") + 1] if "<" in r[1] else "")
        g = groups[key[:110]]
        g[0] += 1
        g[1] += r[4]
    for k, (n, t, _) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"{t:10.1f} us {n:5d} x {t / n:7.2f}  {k}")


if __name__ == "__main__":
    main()
