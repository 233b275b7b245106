#!/usr/bin/env bash
# Monitoring files without a cluster: promtool accepts the Prometheus config and the rules, the
# alert unit tests pass (tests/ops/alerts_test.yml: each alert fires on its failure and stays quiet
# on a healthy cluster), and the committed dashboard is what make_dashboard.py writes and is
# well formed. Usage: rules_test.sh <source dir>
set -euo pipefail
SRC=${1:?usage: rules_test.sh SOURCE_DIR}
command -v promtool >/dev/null || { echo "promtool missing (tools/setup.sh installs prometheus)"; exit 1; }
M=$SRC/monitoring
promtool check config "$M/prometheus/prometheus.yml"
promtool check rules "$M"/prometheus/rules/*.yml
(cd "$SRC/tests/ops" && promtool test rules alerts_test.yml)
# Every alert of the rules has a unit test.
for a in $(grep -E '^\s+- alert:' "$M"/prometheus/rules/*.yml | sed -E 's/.*alert: *//' | sort -u); do
  grep -q "alertname: $a" "$SRC/tests/ops/alerts_test.yml" || { echo "FAIL: alert $a has no promtool test"; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$M/grafana/make_dashboard.py" "$work/"
python3 "$work/make_dashboard.py" >/dev/null
if ! cmp -s "$work/deltaserve.json" "$M/grafana/deltaserve.json"; then
  echo "FAIL: monitoring/grafana/deltaserve.json is stale: run python3 monitoring/grafana/make_dashboard.py"
  exit 1
fi
python3 - "$M/grafana/deltaserve.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ids, n, bad = set(), 0, []
assert d["uid"] and d["title"], "dashboard needs uid and title"
assert any(v["type"] == "datasource" for v in d["templating"]["list"]), "datasource variable"
for p in d["panels"]:
    if p["id"] in ids: bad.append(f"duplicate panel id {p['id']}")
    ids.add(p["id"])
    g = p["gridPos"]
    if g["x"] + g["w"] > 24: bad.append(f"{p['title']}: wider than the grid")
    if p["type"] == "row": continue
    n += 1
    if p["datasource"]["uid"] != "${datasource}": bad.append(f"{p['title']}: fixed datasource")
    if not p.get("targets"): bad.append(f"{p['title']}: no query")
    for t in p.get("targets", []):
        if not t.get("expr") or not t.get("refId"): bad.append(f"{p['title']}: target without expr/refId")
if bad: sys.exit("FAIL dashboard: " + "; ".join(bad))
print(f"dashboard OK: {n} panels")
PY
echo "monitoring OK"
