#!/usr/bin/env python3
"""End to end with the real Prometheus: a local cluster (`deltaserve serve`, tiny synthesized
model) under load from `deltactl load`, scraped every second by Debian's prometheus with the
repository's rules. Every PromQL expression of the Grafana dashboard, every recording rule and
every term of every alert (without its threshold, see monitoring/README.md) must return data: at
least one sample that is a number. promtool check config / check rules pass on the shipped files.

GPU panels: where libnvidia-ml.so.1 exists the worker samples the real GPU 0; elsewhere the test
puts tests/ops/fake_nvml.c's library first on LD_LIBRARY_PATH, so the same dlopen path runs.

usage: prometheus_test.py --deltaserve BIN --deltactl BIN --src DIR --fake-nvml-dir DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops_cluster as oc  # noqa: E402

TOKEN = "ops-test-token-0123456789abcdef"
BAD_TOKEN = "ops-test-token-wrong-0000000000"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deltaserve", required=True)
    ap.add_argument("--deltactl", required=True)
    ap.add_argument("--src", required=True)
    ap.add_argument("--fake-nvml-dir", required=True)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    for tool in ("prometheus", "promtool"):
        if not shutil.which(tool):
            sys.exit(f"FAIL: {tool} not installed (tools/setup.sh installs Debian's prometheus)")
    mon = os.path.join(a.src, "monitoring")
    rules_dir = os.path.join(mon, "prometheus", "rules")
    rules = sorted(os.path.join(rules_dir, f) for f in os.listdir(rules_dir) if f.endswith(".yml"))

    subprocess.run(["promtool", "check", "config", os.path.join(mon, "prometheus", "prometheus.yml")],
                   check=True)
    subprocess.run(["promtool", "check", "rules", *rules], check=True)

    work = tempfile.mkdtemp(prefix="ds-prom-")
    env = dict(os.environ)
    if oc.real_nvml_present():
        oc.log("NVML: the real libnvidia-ml.so.1 (GPU 0)")
    else:
        env["LD_LIBRARY_PATH"] = a.fake_nvml_dir + ":" + env.get("LD_LIBRARY_PATH", "")
        oc.log(f"NVML: no driver here; fake library from {a.fake_nvml_dir}")
    keys = os.path.join(work, "api-keys")
    with open(keys, "w") as f:
        f.write(f"# test\n{TOKEN}\n")
    os.chmod(keys, 0o600)

    cluster = oc.Cluster(a.deltaserve, work, env=env,
                         extra_args=["--api-key-file", keys, "--nvml-device", "0",
                                     "--mtp", "1"])  # MTP metrics for their panels
    prom = load = None
    failures = []
    try:
        cluster.wait_serving()
        # The shipped config's job names with the cluster's ports; scrape and evaluate every second.
        targets = {"deltaserve-gateway": cluster.metrics["gateway"],
                   "deltaserve-scheduler": cluster.metrics["scheduler"],
                   "deltaserve-worker": cluster.metrics["worker"]}
        shipped = open(os.path.join(mon, "prometheus", "prometheus.yml")).read()
        for job in targets:
            assert f"job_name: {job}" in shipped, f"{job} missing from prometheus.yml"
        cfg = ["global:", "  scrape_interval: 1s", "  scrape_timeout: 1s",
               "  evaluation_interval: 1s", "rule_files:"]
        cfg += [f"  - {r}" for r in rules]
        cfg += ["scrape_configs:"]
        for job, t in targets.items():
            cfg += [f"  - job_name: {job}", "    static_configs:", f"      - targets: ['{t}']"]
        prom = oc.Prometheus(work, "\n".join(cfg) + "\n")
        oc.log(f"prometheus on {prom.url}")

        load = oc.LoadLoop(a.deltactl, cluster.addr, api_key=TOKEN, bad_key=BAD_TOKEN)
        # Wait for: all targets up, one round of load finished, every histogram seen over the
        # dashboard's windows, and rule evaluation of the recorded series.
        deadline = time.time() + 150
        ready_exprs = [
            'count(up{job=~"deltaserve-.*"} == 1) == 3',
            "sum(rate(deltaserve_time_to_first_token_seconds_count[1m])) > 0",
            "sum(rate(deltaserve_inter_token_latency_seconds_count[1m])) > 0",
            "sum(rate(deltaserve_worker_forward_seconds_count[1m])) > 0",
            'sum(deltaserve_requests_total{outcome="unauthenticated"}) > 0',
            "deltaserve:ttft_slo_miss:ratio_rate5m >= 0",
        ]
        while True:
            missing = [e for e in ready_exprs if not prom.query(e)["data"]["result"]]
            if not missing and load.rounds >= 1:
                break
            if time.time() > deadline:
                raise RuntimeError(f"cluster metrics never became ready: {missing}; "
                                   f"load rounds {load.rounds}, failures {load.failures[:1]}")
            time.sleep(1)
        time.sleep(5)  # a few more scrapes under load
        oc.log(f"ready after {load.rounds} load rounds")

        checks = []  # (source, expr)
        dash = json.load(open(os.path.join(mon, "grafana", "deltaserve.json")))
        for p in dash["panels"]:
            for t in p.get("targets", []):
                e = t["expr"].replace("$__rate_interval", "1m").replace("$__interval", "15s")
                assert "$" not in e, f"unsubstituted variable in {e}"
                checks.append((f"dashboard: {p['title']} [{t['refId']}]", e))
        rules_api = prom.api("rules")["data"]["groups"]
        n_alerts = n_records = 0
        for g in rules_api:
            for r in g["rules"]:
                if r.get("health") != "ok":
                    failures.append(f"rule {r['name']}: health {r.get('health')} {r.get('lastError')}")
                if r["type"] == "recording":
                    n_records += 1
                    checks.append((f"record: {r['name']}", r["name"]))
                    checks.append((f"record expr: {r['name']}", r["query"]))
                else:
                    n_alerts += 1
                    for term in oc.alert_terms(r["query"]):
                        checks.append((f"alert: {r['name']} ({r['labels'].get('window', '')})", term))
        if n_alerts < 10 or n_records < 6:
            failures.append(f"prometheus loaded {n_alerts} alerts and {n_records} recording rules")

        # The routing signals carry plausible values.
        for e, lo, hi in [("sum(deltaserve_requests_waiting)", 0, 1e6),
                          ("sum(deltaserve_requests_running)", 0, 64),
                          ("max(deltaserve_context_usage_ratio)", 0, 1),
                          ('sum(deltaserve_gateway_serving)', 1, 1),
                          ('sum(deltaserve_worker_up)', 1, 1)]:
            r = prom.query(e)["data"]["result"]
            v = float(r[0]["value"][1]) if r else None
            if v is None or not (lo <= v <= hi):
                failures.append(f"{e} = {v}, expected within [{lo}, {hi}]")

        width = max(len(s) for s, _ in checks)
        for source, e in checks:
            ok, why = oc.has_data(prom.query(e))
            print(f"{'ok  ' if ok else 'FAIL'} {source:<{width}}  {why}  <- {e}")
            if not ok:
                failures.append(f"{source}: {why}: {e}")
        oc.log(f"{len(checks)} expressions checked, {len(failures)} failures")
    finally:
        if load:
            load.stop()
        if prom:
            prom.stop()
        rc = cluster.stop()
        if failures or a.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("FAILURES:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("prometheus_test: every dashboard and rule expression returned data")


if __name__ == "__main__":
    main()
