#!/usr/bin/env python3
# Generates deploy/grafana/loom-cluster.json (run from the repository root after
# changing a panel; unit.ops_dashboard_metrics checks every query against loomd).
import json
DS = {"type": "prometheus", "uid": "${datasource}"}
panels = []
y = 0
def row(title):
    global y
    panels.append({"type": "row", "title": title, "collapsed": False,
                   "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
    y += 1
def panel(kind, title, targets, x, w, h=8, unit=None, desc=None, extra=None, stack=False):
    p = {"type": kind, "title": title, "datasource": DS,
         "gridPos": {"h": h, "w": w, "x": x, "y": y},
         "targets": [dict(datasource=DS, refId=chr(65 + i), expr=e, legendFormat=l)
                     for i, (e, l) in enumerate(targets)],
         "fieldConfig": {"defaults": {}, "overrides": []}, "options": {}}
    if desc: p["description"] = desc
    if unit: p["fieldConfig"]["defaults"]["unit"] = unit
    if kind == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {"lineWidth": 1, "fillOpacity": 10 if stack else 0,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"}, "showPoints": "never"}
        p["options"] = {"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}
    if kind == "stat":
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "value", "graphMode": "area", "textMode": "value_and_name"}
    if extra: p.update(extra)
    panels.append(p)
N = 'node=~"$node"'
row("Cluster")
panel("stat", "GPUs used / free", [('sum by (use) (loom_devices{%s})' % N, "{{use}}")], 0, 6,
      desc="Devices on ready nodes, by use (loom_devices).")
panel("stat", "Nodes by state", [("sum by (state) (loom_nodes)", "{{state}}")], 6, 6,
      desc="ready | drained | lost | unknown (loom_nodes).")
panel("stat", "Jobs queued", [('sum(loom_jobs{state="queued"})', "queued")], 12, 4)
panel("stat", "Jobs running", [('sum(loom_jobs{state=~"starting|running"})', "running")], 16, 4)
panel("stat", "GPU utilization (mean)", [('avg(loom_device_utilization_percent{%s})' % N, "mean")],
      20, 4, unit="percent")
y += 8
panel("timeseries", "GPUs used and free over time", [('sum by (use) (loom_devices{%s})' % N, "{{use}}")],
      0, 12, stack=True)
panel("timeseries", "Jobs by state", [("sum by (state) (loom_jobs)", "{{state}}")], 12, 12, stack=True,
      desc="All tenants (loom_jobs{tenant,state}).")
y += 8
row("GPUs per node")
panel("timeseries", "GPU utilization per node and device",
      [('loom_device_utilization_percent{%s}' % N, "{{node}} gpu{{device}}")], 0, 12, unit="percent",
      extra={"fieldConfig": {"defaults": {"unit": "percent", "min": 0, "max": 100,
             "custom": {"lineWidth": 1, "showPoints": "never"}}, "overrides": []}})
panel("timeseries", "GPU memory used per node and device",
      [('loom_device_memory_used_bytes{%s}' % N, "{{node}} gpu{{device}}")], 12, 12, unit="bytes")
y += 8
panel("bargauge", "Utilization now", [('avg by (node) (loom_device_utilization_percent{%s})' % N,
      "{{node}}")], 0, 24, h=6, unit="percent",
      extra={"options": {"orientation": "horizontal", "displayMode": "gradient",
             "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}})
y += 6
row("Node checks")
panel("stat", "Degraded nodes", [("sum(loom_node_degraded)", "degraded")], 0, 6,
      desc="Nodes a node check marked degraded; the scheduler avoids them (docs/operations.md).")
panel("timeseries", "Node check bus bandwidth vs expected",
      [('loom_nodecheck_busbw_gbps{%s}' % N, "{{node}} {{kind}} {{peer}}"),
       ('loom_nodecheck_expected_gbps{%s}' % N, "expected {{node}} {{kind}}")], 6, 18, unit="GBs",
      desc="Peak all-reduce busbw of the newest check per node (kind node) and node pair (kind pair).")
y += 8
row("Queue and scheduler")
panel("timeseries", "Queue length", [('sum(loom_jobs{state="queued"})', "queued"),
      ('sum by (tenant) (loom_jobs{state="queued"})', "{{tenant}}")], 0, 8)
panel("timeseries", "Queue wait (submit or retry to placement)",
      [("histogram_quantile(0.5, sum by (le) (rate(loom_queue_wait_seconds_bucket[$__rate_interval])))", "p50"),
       ("histogram_quantile(0.95, sum by (le) (rate(loom_queue_wait_seconds_bucket[$__rate_interval])))", "p95"),
       ("rate(loom_queue_wait_seconds_sum[$__rate_interval]) / rate(loom_queue_wait_seconds_count[$__rate_interval])", "mean")],
      8, 8, unit="s")
panel("timeseries", "Scheduling pass and start latency",
      [("histogram_quantile(0.95, sum by (le) (rate(loom_scheduling_pass_seconds_bucket[$__rate_interval])))", "scheduler pass p95"),
       ("histogram_quantile(0.95, sum by (le) (rate(loom_start_latency_seconds_bucket[$__rate_interval])))", "placement to running p95")],
      16, 8, unit="s")
y += 8
row("Running jobs")
panel("timeseries", "Tokens per second per running job",
      [("loom_job_tokens_per_second", "{{job}}")], 0, 12, unit="short",
      desc="Rank 0's latest step. The series label is job=<job id>: the scrape config sets honor_labels so it is not renamed exported_job.")
panel("timeseries", "MFU per running job", [("loom_job_mfu", "{{job}}")], 12, 12, unit="percentunit")
y += 8
row("loomd")
panel("timeseries", "API requests by status",
      [("sum by (status) (rate(loom_http_requests_total[$__rate_interval]))", "{{status}}")], 0, 8, unit="reqps")
panel("timeseries", "API latency p95 by route",
      [("histogram_quantile(0.95, sum by (le, route) (rate(loom_http_request_duration_seconds_bucket[$__rate_interval])))", "{{route}}")],
      8, 8, unit="s")
panel("timeseries", "Store commits",
      [("histogram_quantile(0.95, sum by (le) (rate(loom_store_commit_seconds_bucket[$__rate_interval])))", "commit p95"),
       ("loom_store_write_queue", "write queue"),
       ("rate(loom_store_commit_failures_total[$__rate_interval])", "failures/s")], 16, 8)
y += 8
for i, p in enumerate(panels): p["id"] = i + 1
dash = {
    "title": "Loom cluster", "uid": "loom-cluster", "description":
    "Loom: GPUs used/free, per-GPU utilization and memory per node, queue length and wait, jobs by state, tokens/s and MFU per running job. Source: loomd /metrics (deploy/prometheus.yml).",
    "tags": ["loom"], "editable": True, "schemaVersion": 39, "version": 1, "refresh": "30s",
    "time": {"from": "now-6h", "to": "now"}, "timezone": "utc", "graphTooltip": 1,
    "templating": {"list": [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1},
        {"name": "node", "label": "node", "type": "query", "datasource": DS,
         "query": {"query": "label_values(loom_devices, node)", "refId": "node"},
         "definition": "label_values(loom_devices, node)", "includeAll": True, "multi": True,
         "allValue": ".*", "current": {"text": "All", "value": "$__all"}, "refresh": 2, "sort": 1, "hide": 0}]},
    "annotations": {"list": []},
    "panels": panels,
}
json.dump(dash, open("deploy/grafana/loom-cluster.json", "w"), indent=2)
open("deploy/grafana/loom-cluster.json", "a").write("\n")
print(len(panels), "panels")
