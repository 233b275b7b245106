#!/usr/bin/env python3
"""Lists the kernels of an `ncu --metrics gpu__time_duration.sum --csv --print-units base` log:
one line per launch (index, short name, grid, block, ns), then ns summed by name over the
listed range. Used on the demo model's decode / verify / draft phases
(tools/device/demo_mtp_profile.sh). Usage: ncu_kernels.py LOG.csv [FIRST [LAST]]"""
import csv
import re
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"\(.*", "", name)  # parameters
    name = re.sub(r"<.*", "", name)  # template arguments
    return name.split("::")[-1]


def main():
    path = sys.argv[1]
    with open(path) as f:
        rows = list(csv.DictReader(l for l in f if l.startswith('"')))
    first = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    last = int(sys.argv[3]) if len(sys.argv) > 3 else len(rows) - 1
    sums, counts = defaultdict(int), defaultdict(int)
    for i in range(max(first, 0), min(last, len(rows) - 1) + 1):
        r = rows[i]
        n = short(r["Kernel Name"])
        ns = int(r["Metric Value"].replace(",", ""))
        print(i, n, r["Grid Size"], r["Block Size"], ns)
        sums[n] += ns
        counts[n] += 1
    print(f"-- {sum(counts.values())} launches, {sum(sums.values()) / 1e3:.1f} us alone")
    for n in sorted(sums, key=sums.get, reverse=True):
        print(f"{n:32s} {counts[n]:4d} x  {sums[n] / 1e3:8.1f} us")


if __name__ == "__main__":
    main()
