#!/usr/bin/env python3
"""Where a traced run's time went outside graph replays (tools/kernel_timeline's DS_TIMELINE_CSV):
host runtime calls by name (count, total ms, largest), kernels launched outside graphs by name
(count, device ms), graph kernels in all, and the span from the first to the last record.
Usage: timeline_calls.py records.csv [TOP]"""
import csv
import sys
from collections import defaultdict

rows = list(csv.DictReader(open(sys.argv[1])))
top = int(sys.argv[2]) if len(sys.argv) > 2 else 12
calls = defaultdict(lambda: [0, 0.0, 0.0])
eager = defaultdict(lambda: [0, 0.0])
graph_kernels = 0
t0, t1 = min(int(r["start_ns"]) for r in rows), max(int(r["end_ns"]) for r in rows)
for r in rows:
    kind, name = int(r["kind"]), r["name"]
    ms = (int(r["end_ns"]) - int(r["start_ns"])) / 1e6
    if kind == 3:
        c = calls[name]
        c[0] += 1
        c[1] += ms
        c[2] = max(c[2], ms)
    elif kind == 0:
        if int(r["graph_id"]) == 0:
            eager[name][0] += 1
            eager[name][1] += ms
        else:
            graph_kernels += 1
print("span %.2f ms, %d records, %d graph kernels, %d kernels outside graphs"
      % ((t1 - t0) / 1e6, len(rows), graph_kernels, sum(v[0] for v in eager.values())))
print("host runtime calls (count, total ms, largest ms):")
for name, (n, tot, mx) in sorted(calls.items(), key=lambda kv: -kv[1][1])[:top]:
    print("  %-40s %6d %9.3f %8.3f" % (name[:40], n, tot, mx))
print("kernels outside graphs (count, device ms):")
for name, (n, tot) in sorted(eager.items(), key=lambda kv: -kv[1][1])[:top]:
    print("  %-40s %6d %9.3f" % (name[:40], n, tot))
