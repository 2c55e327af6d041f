#!/usr/bin/env python3
"""Checks that the Grafana dashboard (deploy/grafana/loom-cluster.json) queries
only metrics and labels that loomd really exports.

Starts a real loomd on a free port (--listen 127.0.0.1:0, URL read from
<data-dir>/loomd.addr), one loom-agent with 2 CPU devices running
tests/fake_worker, and a job that keeps running, so that every family has
samples (per-node devices, per-device utilization and memory, per-job tokens/s
and MFU, queue wait). Then GET /metrics and compare:
  - (a node check runs first so the node-check families have samples)
  - every loom_* name in every query is an exported family (histograms: also
    _bucket/_sum/_count);
  - every label in a selector {label=...}, a `by (...)` clause and a
    legendFormat {{label}} is a label loomd puts on those series;
  - the dashboard covers the cluster views the operator guide promises;
  - deploy/prometheus.yml scrapes /metrics with honor_labels (loomd's `job`
    label names the Loom job and must not be renamed to exported_job).
Usage: ops_dashboard_metrics.py BIN_DIR SOURCE_DIR
Exit 0 pass, 1 fail."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

from loomtest import http, wait_for  # noqa: E402

BIN = os.path.abspath(sys.argv[1])
SRC = os.path.abspath(sys.argv[2])
DASH = os.path.join(SRC, "deploy/grafana/loom-cluster.json")
PROM = os.path.join(SRC, "deploy/prometheus.yml")
ADMIN = "ops-test-admin"
JOIN = "ops-test-join"
REQUIRED = {"loom_devices", "loom_device_utilization_percent", "loom_device_memory_used_bytes",
            "loom_jobs", "loom_queue_wait_seconds", "loom_job_tokens_per_second", "loom_job_mfu",
            "loom_nodes", "loom_node_degraded", "loom_nodecheck_busbw_gbps"}
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def call(url, method="GET", body=None, token=ADMIN):
    return http(url, method, body, token, timeout=10, by_type=True, error_json=False)


def wait(fn, secs, what):
    return wait_for(fn, secs, what, errors=(OSError, ValueError, KeyError), exc=RuntimeError)


def parse_metrics(text):
    """families {name: type}, labels {series name: set(label names)}."""
    fams, labels = {}, {}
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            fams[m.group(1)] = m.group(2)
            continue
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s", line)
        if m:
            names = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""))
            labels.setdefault(m.group(1), set()).update(names)
    return fams, labels


def exprs_of(dash):
    out = []
    for p in dash.get("panels", []):
        for t in p.get("targets", []):
            out.append((p.get("title", "?"), t.get("expr", ""), t.get("legendFormat", "")))
        if p.get("type") not in ("row",) and not p.get("targets"):
            fail("panel '%s' has no query" % p.get("title"))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query", "")
        if v.get("type") == "query":
            out.append(("variable " + v["name"], q or "", ""))
    return out


def check_dashboard(fams, labels):
    dash = json.load(open(DASH))
    used = set()
    hist_suffix = re.compile(r"^(.*)_(bucket|sum|count)$")
    for title, expr, legend in exprs_of(dash):
        if not expr.strip():
            fail("'%s': empty query" % title)
            continue
        names = set(re.findall(r"\b(loom_[a-zA-Z0-9_]+)\b", expr))
        if not names:
            fail("'%s': query names no loom_ metric: %s" % (title, expr))
        series_labels = set()
        for n in names:
            fam = n
            m = hist_suffix.match(n)
            if n not in fams and m and fams.get(m.group(1)) == "histogram":
                fam = m.group(1)
            if fam not in fams:
                fail("'%s': %s is not exported by loomd" % (title, n))
                continue
            used.add(fam)
            have = labels.get(n, set())
            series_labels |= have
            for sel in re.findall(re.escape(n) + r"\{([^}]*)\}", expr):
                for lab in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", sel):
                    if lab not in have:
                        fail("'%s': %s has no label '%s' (has %s)" % (title, n, lab,
                                                                      sorted(have)))
        for group in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            for lab in [x.strip() for x in group.split(",") if x.strip()]:
                if lab != "le" and lab not in series_labels:
                    fail("'%s': by (%s) but no series has it (%s)" % (title, lab,
                                                                      sorted(series_labels)))
        for lab in re.findall(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", legend):
            if lab not in series_labels:
                fail("'%s': legend {{%s}} is not a label of %s" % (title, lab, sorted(names)))
    missing = REQUIRED - used
    if missing:
        fail("dashboard does not show: %s" % sorted(missing))
    return len(used)


def check_prometheus_yml():
    text = open(PROM).read()
    if "metrics_path: /metrics" not in text:
        fail("prometheus.yml does not scrape /metrics")
    if not re.search(r"honor_labels:\s*true", text):
        fail("prometheus.yml must set honor_labels: true (loomd's job label)")
    if not re.search(r"authorization:\s*\n\s*type: Bearer\s*\n\s*credentials_file: \S+", text):
        fail("prometheus.yml must send a bearer token (the per-job series need one)")


def main():
    for b in ("loomd", "loom-agent", "fake_worker"):
        if not os.path.exists(os.path.join(BIN, b)):
            print("SKIP: %s not built" % b)
            return 77
    tmp = tempfile.mkdtemp(prefix="loom-ops-")
    env = dict(os.environ, LOOM_ADMIN_TOKEN=ADMIN, LOOM_JOIN_TOKEN=JOIN)
    for k in ("LOOM_URL", "LOOM_TOKEN", "LOOM_CONFIG"):
        env.pop(k, None)
    procs = []
    log = open(os.path.join(tmp, "log"), "ab")
    try:
        dd = os.path.join(tmp, "loomd")
        procs.append(subprocess.Popen(
            [os.path.join(BIN, "loomd"), "--auto-approve", "--listen", "127.0.0.1:0", "--data-dir", dd,
             "--heartbeat", "1", "--store-sync-full", "false"], env=env, stdout=log,
            stderr=subprocess.STDOUT))
        addr = os.path.join(dd, "loomd.addr")
        url = wait(lambda: open(addr).read().strip(), 10, "loomd.addr")
        procs.append(subprocess.Popen(
            [os.path.join(BIN, "loom-agent"), "--coordinator", url, "--name", "node-a",
             "--work-dir", os.path.join(tmp, "agent"), "--cpu-devices", "2", "--worker",
             os.path.join(BIN, "fake_worker"), "--heartbeat-ms", "300", "--stop-grace-ms", "500"],
            env=env, stdout=log, stderr=subprocess.STDOUT))
        wait(lambda: call(url + "/v1/nodes")[1]["nodes"], 10, "agent registered")
        # A node check (when loom-nodecheck is built) gives the node-check families samples.
        if os.path.exists(os.path.join(BIN, "loom-nodecheck")):
            st, ck = call(url + "/v1/nodes/node-a/check", "POST",
                          {"expect_busbw_gbps": 0.0001, "max_bytes": 65536})
            if st != 202:
                fail("node check: %s %s" % (st, ck))
            else:
                wait(lambda: call(url + "/v1/nodechecks/" + ck["id"])[1]["state"] == "passed",
                     20, "node check passed")
        st, t = call(url + "/v1/tenants", "POST", {"name": "acme"})
        st, k = call(url + "/v1/tenants/%s/tokens" % t["id"], "POST", {})
        data = os.path.join(tmp, "train.bin")
        with open(data, "wb") as f:
            f.write(b"\0" * 4096)
        spec = {"name": "dash", "labels": {"fake_step_ms": "100"},
                "model": {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 64,
                          "d_ff": 256, "vocab_size": 256, "seq_len": 32},
                "data": {"train": data}, "parallel": {"dp": 2, "tp": 1, "pp": 1},
                "train": {"steps": 600, "global_batch_tokens": 256, "micro_batch": 4,
                          "precision": "fp32"},
                "resources": {"device": "cpu", "gpus_per_node": 2}}
        st, job = call(url + "/v1/jobs", "POST", spec, token=k["token"])
        if st != 201:
            fail("submit: %s %s" % (st, job))
            return 1
        text = wait(lambda: (lambda s: s if "loom_job_tokens_per_second{" in s and
                             "loom_device_utilization_percent{" in s else None)(
                                 call(url + "/metrics")[1]), 15,
                    "per-job and per-device samples in /metrics")
        fams, labels = parse_metrics(text)
        n = check_dashboard(fams, labels)
        check_prometheus_yml()
        call(url + "/v1/jobs/%s/cancel" % job["id"], "POST", {}, token=k["token"])
        print("dashboard: %d loomd families used, %d exported, %d problems" % (
            n, len(fams), len(failures)))
        return 1 if failures else 0
    except RuntimeError as e:
        fail(str(e))
        log.flush()
        print(open(os.path.join(tmp, "log"), errors="replace").read()[-3000:])
        return 1
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
