#!/usr/bin/env python3
"""Writes deltaserve.json, the Grafana dashboard of a deltaserve cluster (importable: Dashboards ->
Import -> Upload JSON; pick the Prometheus data source in the `datasource` variable).

The JSON is generated so panels stay uniform; edit this file, run it, commit both:
    python3 monitoring/grafana/make_dashboard.py
tests/ops/prometheus_test.sh runs every `expr` of the JSON against a loaded cluster and
tests/ops/dashboard_test.sh checks the committed JSON is what this script writes.
"""
import json
import os

DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"

panels = []
next_id = [1]
cursor = {"x": 0, "y": 0, "row_h": 0}


def _place(w, h):
    if cursor["x"] + w > 24:
        cursor["x"] = 0
        cursor["y"] += cursor["row_h"]
        cursor["row_h"] = 0
    pos = {"x": cursor["x"], "y": cursor["y"], "w": w, "h": h}
    cursor["x"] += w
    cursor["row_h"] = max(cursor["row_h"], h)
    return pos


def row(title):
    cursor["x"] = 0
    cursor["y"] += cursor["row_h"]
    cursor["row_h"] = 0
    panels.append({"id": next_id[0], "type": "row", "title": title, "collapsed": False,
                   "gridPos": {"x": 0, "y": cursor["y"], "w": 24, "h": 1}, "panels": []})
    next_id[0] += 1
    cursor["y"] += 1


def panel(title, targets, unit="short", kind="timeseries", w=8, h=8, desc="", minv=None,
          maxv=None, stack=False):
    t = []
    for i, (expr, legend) in enumerate(targets):
        t.append({"datasource": DS, "expr": expr, "legendFormat": legend,
                  "refId": chr(ord("A") + i), "range": True})
    defaults = {"unit": unit}
    if minv is not None:
        defaults["min"] = minv
    if maxv is not None:
        defaults["max"] = maxv
    if kind == "timeseries":
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                              "showPoints": "never", "spanNulls": True,
                              "stacking": {"mode": "normal" if stack else "none", "group": "A"}}
    p = {"id": next_id[0], "type": kind, "title": title, "description": desc, "datasource": DS,
         "gridPos": _place(w, h), "targets": t,
         "fieldConfig": {"defaults": defaults, "overrides": []}}
    if kind == "timeseries":
        p["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "none"}}
    else:
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "orientation": "auto", "textMode": "auto", "colorMode": "value",
                        "graphMode": "area", "justifyMode": "auto"}
    panels.append(p)
    next_id[0] += 1


def quantiles(metric, by=""):
    """p50/p90/p99 targets of a histogram (summed over instances, optionally kept `by`)."""
    group = "le" + (", " + by if by else "")
    suffix = " {{" + by + "}}" if by else ""
    return [(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket[{RI}])))",
             f"p{int(q * 100)}{suffix}") for q in (0.5, 0.9, 0.99)]


SERVER_ERRORS = 'outcome=~"error|unavailable|deadline_exceeded"'

# ---------------------------------------------------------------------------------------------
row("Throughput")
panel("Gateways serving", [("sum(deltaserve_gateway_serving)", "serving")], kind="stat", w=4,
      h=4, desc="Gateways reporting SERVING (a warmed-up worker behind them).")
panel("Replicas up", [("sum(deltaserve_worker_up)", "up")], kind="stat", w=4, h=4,
      desc="Replicas attached to the scheduler: every worker (or TP group) is one, with its own "
           "slots; a lost one's requests continue on the others.")
panel("Requests in flight", [("sum(deltaserve_gateway_requests_inflight)", "in flight")],
      kind="stat", w=4, h=4, desc="Generate calls holding an admission permit.")
panel("Generated tokens/s", [(f"sum(rate(deltaserve_generation_tokens_total[{RI}]))", "tokens/s")],
      kind="stat", w=4, h=4, unit="short")
panel("Server error ratio", [("sum(deltaserve:requests_error:ratio_rate5m)", "errors")],
      kind="stat", w=4, h=4, unit="percentunit",
      desc="Share of requests failing server-side over 5 minutes (recording rule).")
panel("First tokens within 2.5 s",
      [(f'sum(rate(deltaserve_time_to_first_token_seconds_bucket{{le="2.5"}}[{RI}]))'
        f" / sum(rate(deltaserve_time_to_first_token_seconds_count[{RI}]))", "within objective")],
      kind="stat", w=4, h=4, unit="percentunit", minv=0, maxv=1,
      desc="The latency objective is 99% (monitoring/prometheus/rules/deltaserve-slo.yml).")
panel("Requests/s by outcome",
      [(f"sum by (outcome) (rate(deltaserve_requests_total[{RI}]))", "{{outcome}}")],
      unit="reqps", stack=True)
panel("Tokens/s",
      [(f"sum(rate(deltaserve_generation_tokens_total[{RI}]))", "generated"),
       (f"sum(rate(deltaserve_prompt_tokens_total[{RI}]))", "prompt"),
       (f"sum(rate(deltaserve_step_tokens_total[{RI}]))", "through the model (prefill + decode)")],
      desc="Generated tokens streamed to clients, prompt tokens admitted, tokens processed by steps.")
panel("Steps/s and tokens per step",
      [(f"sum(rate(deltaserve_steps_total[{RI}]))", "steps/s"),
       (f"sum(rate(deltaserve_steps_ahead_total[{RI}]))", "of which sent ahead (lookahead)"),
       (f"sum(rate(deltaserve_step_batch_tokens_sum[{RI}])) / sum(rate(deltaserve_step_batch_tokens_count[{RI}]))",
        "tokens per step"),
       (f"sum(rate(deltaserve_step_batch_sequences_sum[{RI}])) / sum(rate(deltaserve_step_batch_sequences_count[{RI}]))",
        "sequences per step")])

# ---------------------------------------------------------------------------------------------
row("Latency")
panel("Time to first token", quantiles("deltaserve_time_to_first_token_seconds"), unit="s",
      desc="Arrival at the gateway to the first generated token.")
panel("Inter-token latency", quantiles("deltaserve_inter_token_latency_seconds"), unit="s")
panel("End-to-end latency", quantiles("deltaserve_request_duration_seconds"), unit="s",
      desc="Successful requests, arrival to last token.")
panel("Queue wait", quantiles("deltaserve_queue_wait_seconds"), unit="s",
      desc="Arrival at the scheduler to slot assignment.")
panel("Latency objective burn rate",
      [("sum(deltaserve:ttft_slo_miss:ratio_rate5m) / 0.01", "5m"),
       ("sum(deltaserve:ttft_slo_miss:ratio_rate1h) / 0.01", "1h"),
       ("sum(deltaserve:ttft_slo_miss:ratio_rate6h) / 0.01", "6h"),
       ("sum(deltaserve:ttft_slo_miss:ratio_rate3d) / 0.01", "3d")],
      desc="1 = spending the error budget exactly over 30 days; pages at 14.4 (1h) and 6 (6h).")
panel("Step time", quantiles("deltaserve_step_duration_seconds") +
      [(f"histogram_quantile(0.5, sum by (le) (rate(deltaserve_step_worker_seconds_bucket[{RI}])))",
        "p50 worker share")], unit="s",
      desc="Scheduler step (schedule + worker forward/sample + apply) and the worker's share.")

# ---------------------------------------------------------------------------------------------
row("Slots, context and queue")
panel("Waiting and running requests",
      [("sum(deltaserve_requests_waiting)", "waiting"),
       ("sum(deltaserve_requests_running)", "running"),
       ("sum(deltaserve_requests_waiting_capacity)", "queue capacity")],
      desc="The two load signals routers use, with the queue bound.")
panel("Slots", [("sum(deltaserve_slots_busy)", "busy"), ("sum(deltaserve_slots)", "total")])
panel("Context usage (routing signal)",
      [("max(deltaserve_context_usage_ratio)", "reserved / capacity")], kind="gauge",
      unit="percentunit", minv=0, maxv=1)
panel("Context pool (tokens)",
      [("sum(deltaserve_context_used_tokens)", "used"),
       ("sum(deltaserve_context_reserved_tokens)", "reserved"),
       ("sum(deltaserve_context_capacity_tokens)", "capacity")])
panel("Context per slot (tokens)",
      [("sum by (slot) (deltaserve_slot_context_used_tokens)", "used slot {{slot}}"),
       ("max(deltaserve_slot_context_capacity_tokens)", "slot cap")], w=8)
panel("Reserved context per slot (tokens)",
      [("sum by (slot) (deltaserve_slot_context_reserved_tokens)", "slot {{slot}}")], w=8)
panel("Batch size",
      quantiles("deltaserve_step_batch_tokens") +
      [(f"histogram_quantile(0.5, sum by (le) (rate(deltaserve_step_batch_sequences_bucket[{RI}])))",
        "p50 sequences")], desc="Tokens (and sequences) per step.")
panel("Admission in flight vs limit",
      [("sum(deltaserve_gateway_requests_inflight)", "in flight"),
       ("sum(deltaserve_gateway_requests_inflight_limit)", "limit")])

# ---------------------------------------------------------------------------------------------
row("Workers and GPUs")
panel("Replica up (scheduler view)", [("deltaserve_worker_up", "{{worker}}")], minv=0, maxv=1)
panel("Worker heartbeat age", [("deltaserve_worker_heartbeat_age_seconds", "{{worker}}")],
      unit="s")
panel("Scrape targets up", [('up{job=~"deltaserve-.*"}', "{{job}} {{instance}}")], minv=0,
      maxv=1)
panel("Worker memory by kind",
      [("sum by (worker, kind) (deltaserve_worker_memory_bytes)", "{{worker}} {{kind}}")],
      unit="bytes", stack=True)
panel("Forward time per worker", quantiles("deltaserve_worker_forward_seconds", by="worker"),
      unit="s", desc="The backend's forward pass of one step, measured on the worker.")
panel("Worker tokens/s",
      [(f"sum by (worker) (rate(deltaserve_worker_tokens_total[{RI}]))", "{{worker}}")])
panel("GPU utilisation",
      [("deltaserve_gpu_utilization_ratio", "{{worker}} gpu {{gpu}}")], unit="percentunit",
      minv=0, maxv=1, desc="From NVML; absent where no NVIDIA driver is installed.")
panel("GPU memory",
      [("deltaserve_gpu_memory_used_bytes", "used {{worker}} gpu {{gpu}}"),
       ("deltaserve_gpu_memory_total_bytes", "total {{worker}} gpu {{gpu}}")], unit="bytes")
panel("MTP draft acceptance by position",
      [(f"sum by (position) (rate(deltaserve_worker_mtp_drafts_accepted_total[{RI}])) / "
        f"sum by (position) (rate(deltaserve_worker_mtp_drafts_total[{RI}]))", "draft {{position}}")],
      unit="percentunit", minv=0, maxv=1,
      desc="Workers with --mtp: the share of the MTP head's drafts the main model accepted, by "
           "draft position (1 = the first draft).")
panel("MTP tokens per verify step", quantiles("deltaserve_worker_mtp_verify_tokens"),
      desc="1 + accepted drafts per sequence and verify step (the mean accepted length).")
panel("Warmup speed",
      [("deltaserve_worker_warmup_tokens_per_second", "{{worker}} {{phase}}")],
      desc="Measured by each worker's warmup generation at start.")
panel("Restarts (1h)", [("changes(deltaserve_start_time_seconds[1h])", "{{job}} {{instance}}")],
      desc="Process restarts seen through their start time.")

# ---------------------------------------------------------------------------------------------
row("Errors")
panel("Server error ratio",
      [(f"sum(rate(deltaserve_requests_total{{{SERVER_ERRORS}}}[{RI}])) / sum(rate(deltaserve_requests_total[{RI}]))",
        "server errors"),
       ("sum(deltaserve:requests_error:ratio_rate5m)", "5m (alert input)")], unit="percentunit",
      desc="error, unavailable and deadline_exceeded; alert at 5% for 5 minutes.")
panel("Failed requests/s by outcome",
      [(f'sum by (outcome) (rate(deltaserve_requests_total{{outcome!="success"}}[{RI}]))',
        "{{outcome}}")], unit="reqps", stack=True)
panel("Overload rejections/s",
      [(f'sum(rate(deltaserve_requests_total{{outcome="rejected"}}[{RI}]))', "rejected")],
      unit="reqps", desc="RESOURCE_EXHAUSTED: admission permits or the queue ran out.")
panel("Worker step errors/s",
      [(f"sum by (worker) (rate(deltaserve_worker_step_errors_total[{RI}]))", "{{worker}}")])
panel("Draining", [("max(deltaserve_scheduler_draining)", "scheduler"),
                   ("max(deltaserve_gateway_draining)", "gateway")], minv=0, maxv=1)

dashboard = {
    "uid": "deltaserve-overview",
    "title": "deltaserve",
    "description": "deltaserve cluster: throughput, latency, slots and context, workers and GPUs, errors",
    "tags": ["deltaserve", "llm", "inference"],
    "timezone": "browser",
    "editable": True,
    "graphTooltip": 1,
    "schemaVersion": 37,
    "version": 1,
    "refresh": "30s",
    "time": {"from": "now-1h", "to": "now"},
    "templating": {"list": [{
        "name": "datasource", "label": "Data source", "type": "datasource",
        "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "regex": "",
        "options": []}]},
    "annotations": {"list": [{
        "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts", "type": "dashboard"}]},
    "panels": panels,
}

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "deltaserve.json")
with open(out, "w") as f:
    json.dump(dashboard, f, indent=2)
    f.write("\n")
print(f"wrote {out}: {sum(1 for p in panels if p['type'] != 'row')} panels")
