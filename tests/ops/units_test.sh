#!/usr/bin/env bash
# The systemd units of deploy/: `systemd-analyze verify` accepts them (syntax, directives,
# ExecStart binary present; run on the build-tree copies whose ExecStart is the built binary),
# and each carries what the deployment promises: Type=notify, a watchdog, a dedicated user and
# the sandbox. Usage: units_test.sh <dir with the generated units>
set -euo pipefail
UNITS=${1:?usage: units_test.sh UNIT_DIR}
command -v systemd-analyze >/dev/null || { echo "systemd-analyze missing (tools/setup.sh installs systemd)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$UNITS"/deltaserve* "$work"/
# A template is verified through an instance.
ln -s "deltaserve-worker@.service" "$work/deltaserve-worker@0.service"
ln -s "deltaserve-tp-rank@.service" "$work/deltaserve-tp-rank@1.service"
fail=0
check() {  # unit, pattern (grep -E, whole line), what
  if ! grep -qE "^$2\$" "$work/$1"; then echo "FAIL $1: missing $3 ($2)"; fail=1; fi
}
for u in deltaserve-scheduler.service deltaserve-gateway.service "deltaserve-worker@0.service" \
         "deltaserve-tp-rank@1.service"; do
  out=$(cd "$work" && SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no "$u" 2>&1) || {
    echo "FAIL systemd-analyze verify $u:"; echo "$out"; fail=1; }
  # verify prints warnings without failing; any line naming our unit file is a finding.
  if echo "$out" | grep -q "deltaserve"; then echo "FAIL $u: $out"; fail=1; fi
  check "$u" "Type=notify" "sd_notify readiness"
  check "$u" "WatchdogSec=[0-9]+s" "a watchdog"
  check "$u" "User=deltaserve" "the dedicated user"
  check "$u" "ProtectSystem=strict" "a read-only system"
  check "$u" "ProtectHome=yes" "no home directories"
  check "$u" "PrivateTmp=yes" "a private /tmp"
  check "$u" "NoNewPrivileges=yes" "no privilege gain"
  check "$u" "CapabilityBoundingSet=" "an empty capability set"
  check "$u" "Restart=on-failure" "restart after a crash or watchdog kill"
  check "$u" "PartOf=deltaserve.target" "membership of deltaserve.target"
  check "$u" "ExecStart=.* --config /etc/deltaserve/[a-z]+\.conf.*" "the config file"
done
check "deltaserve-worker@0.service" "DevicePolicy=closed" "a closed device policy"
check "deltaserve-worker@0.service" "DeviceAllow=/dev/nvidia%i rw" "its own GPU only"
check "deltaserve-tp-rank@1.service" "DeviceAllow=/dev/nvidia%i rw" "its own GPU"
check "deltaserve-tp-rank@1.service" "ConditionPathExists=/etc/deltaserve/tp/gpu%i.conf" "its rank file"
check "deltaserve-tp-rank@1.service" "ExecStart=.* --config /etc/deltaserve/tp/gpu%i.conf .*" "its group, rank and world"
check "deltaserve-gateway.service" "TimeoutStopSec=[0-9]+s" "a stop timeout above the drain timeout"
for t in deltaserve.target deltaserve-workers.target; do
  out=$(cd "$work" && systemd-analyze verify --man=no $t 2>&1) || { echo "FAIL $t: $out"; fail=1; }
done
# Stop order: the gateway drains while the workers still serve (it is ordered after them).
check "deltaserve-gateway.service" "After=.*deltaserve-workers\.target.*" "ordering after the workers"
check "deltaserve-worker@0.service" "Before=deltaserve-workers\.target" "ordering before the gateway"
check "deltaserve-tp-rank@1.service" "Before=deltaserve-workers\.target" "ordering before the gateway"
if [ $fail -ne 0 ]; then exit 1; fi
echo "units OK: $(ls "$work" | tr '\n' ' ')"
