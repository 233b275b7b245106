#!/usr/bin/env python3
"""Summary of an ncu per-SASS export (`ncu -i REP --page source --csv --print-source sass`):
warp instructions executed by opcode (and per mma, the count of HMMA / HGMMA / IMMA), the stall
samples by opcode, and the stall samples by reason. Used by tools/device/f16_profile.sh; runs on
any exported CSV.

Usage: sass_summary.py FILE.csv [TOP] [HOT]
HOT > 0 also lists the HOT instructions with the most stall samples, in address order (where a
latency-bound kernel waits), each with its two main stall reasons.
"""
import collections
import csv
import sys


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    hot_n = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    rows = list(csv.reader(open(sys.argv[1], newline="")))
    head = next((i for i, r in enumerate(rows) if "Source" in r), None)
    if head is None:
        print("no 'Source' column: not an ncu source export")
        return 1
    h = rows[head]
    src, executed = h.index("Source"), h.index("Instructions Executed")
    samples = h.index("Warp Stall Sampling (All Samples)")
    reasons = [i for i, c in enumerate(h) if c.startswith("stall_") and "Not Issued" not in c]
    address = h.index("Address") if "Address" in h else None
    ops, stalls, by_reason = collections.Counter(), collections.Counter(), collections.Counter()
    hot = []  # (samples, index, address, source, {reason: samples})
    for r in rows[head + 1:]:
        try:
            n, s = int(r[executed]), int(r[samples])
        except (ValueError, IndexError):
            continue
        words = r[src].split()
        if not words:
            continue
        op = (words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0]
        ops[op] += n
        stalls[op] += s
        mine = {}
        for i in reasons:
            try:
                by_reason[h[i][6:]] += int(r[i])
                mine[h[i][6:]] = int(r[i])
            except ValueError:
                pass
        if hot_n > 0 and s > 0:
            hot.append((s, len(hot), r[address] if address is not None else "", r[src], mine))
    total, total_stalls = sum(ops.values()), max(1, sum(stalls.values()))
    mma = ops["HMMA"] + ops["HGMMA"] + ops["IMMA"]
    print(f"warp instructions {total:,}; mma {mma:,}" +
          (f" ({total / mma:.1f} instructions per mma)" if mma else ""))
    for op, n in ops.most_common(top):
        print(f"  {op:<10} {n:>12,} {100 * n / total:5.1f}%   stall samples "
              f"{100 * stalls[op] / total_stalls:5.1f}%")
    all_reasons = max(1, sum(by_reason.values()))
    print("stall reasons: " + ", ".join(
        f"{k} {100 * v / all_reasons:.1f}%" for k, v in by_reason.most_common() if v / all_reasons >= 0.01))
    if hot_n > 0:
        print(f"the {hot_n} instructions with the most stall samples, in address order:")
        for s, _, addr, text, mine in sorted(sorted(hot, reverse=True)[:hot_n], key=lambda x: x[1]):
            why = ", ".join(f"{k} {v}" for k, v in collections.Counter(mine).most_common(2) if v)
            print(f"  {addr:>6} {100 * s / total_stalls:5.1f}%  {text[:60]:<60} {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
