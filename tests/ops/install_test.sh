#!/usr/bin/env bash
# `cmake --install` lays out a package: binaries, systemd units pointing at the installed binary,
# sysusers, example configs, monitoring files, docs; the installed units pass systemd-analyze
# verify. Usage: install_test.sh BUILD_DIR
set -euo pipefail
BUILD=${1:?usage: install_test.sh BUILD_DIR}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$BUILD" --prefix "$prefix" >/dev/null
fail=0
need() { [ -e "$prefix/$1" ] || { echo "FAIL: $1 not installed"; fail=1; }; }
need bin/deltaserve
need bin/deltactl
for u in deltaserve-scheduler.service deltaserve-gateway.service deltaserve-worker@.service deltaserve.target deltaserve-workers.target; do
  need "lib/systemd/system/$u"
done
need lib/sysusers.d/deltaserve.conf
for c in gateway scheduler worker; do need "share/deltaserve/config/$c.conf"; done
need share/deltaserve/config/tp-gpu.conf.example
need "lib/systemd/system/deltaserve-tp-rank@.service"
need share/deltaserve/monitoring/grafana/deltaserve.json
need share/deltaserve/monitoring/prometheus/prometheus.yml
need share/deltaserve/monitoring/prometheus/rules/deltaserve-alerts.yml
need share/deltaserve/monitoring/prometheus/rules/deltaserve-slo.yml
need share/doc/deltaserve/deploy/README.md
need share/doc/deltaserve/monitoring/README.md
[ -e "$prefix/share/deltaserve/monitoring/grafana/make_dashboard.py" ] && { echo "FAIL: generator installed"; fail=1; }
for u in "$prefix"/lib/systemd/system/*.service; do
  grep -q "^ExecStart=$prefix/bin/deltaserve " "$u" || { echo "FAIL: $u does not start $prefix/bin/deltaserve"; fail=1; }
  grep -q "@DS_" "$u" && { echo "FAIL: unsubstituted @DS_ in $u"; fail=1; }
done
# The installed config files parse with the (installed) config check of each role.
if command -v promtool >/dev/null; then
  promtool check config "$prefix/share/deltaserve/monitoring/prometheus/prometheus.yml" >/dev/null || fail=1
fi
if command -v systemd-analyze >/dev/null; then
  bash "$(dirname "$0")/units_test.sh" "$prefix/lib/systemd/system" || fail=1
fi
[ $fail -eq 0 ] && echo "install layout OK under $prefix"
exit $fail
