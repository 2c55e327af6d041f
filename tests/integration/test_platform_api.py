#!/usr/bin/env python3
"""Platform API integration tests: the event stream (pages, cursors, long-poll,
SSE), webhooks (signatures checked with Python's hmac, a 500 answered once and
retried, kill -9 of loomd between an event and its delivery), artifacts
(listing, whole and ranged downloads checked against hashlib, confinement,
deletes, loomctl) and tenant isolation of every new route.

Runs a real loomd and loom-agents on loopback with tests/fake_worker, reusing
the Cluster helper of test_cluster.py.
Usage: test_platform_api.py BIN_DIR SCENARIO. Exit 0 pass, 1 fail, 77 skip."""
import hashlib
import hmac
import http.client
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_cluster as tc  # noqa: E402  (reads BIN and SCENARIO from argv)
from test_cluster import ADMIN, BIN, Fail, check  # noqa: E402
from test_cluster import JOIN as JOIN_TOKEN  # noqa: E402

SECRET = "test-secret-0123456789"


class Cluster(tc.Cluster):
    """test_cluster's cluster with loomd flags of this area."""

    extra = ["--webhook-allow-private", "--webhook-retry-base-ms", "200",
             "--events-heartbeat", "1"]

    def start_loomd(self):
        os.makedirs(os.path.join(self.tmp, "loomd"), exist_ok=True)
        self.loomd = subprocess.Popen(
            [os.path.join(BIN, "loomd"), "--auto-approve", "--listen", "127.0.0.1:%d" % self.port, "--data-dir",
             os.path.join(self.tmp, "loomd"), "--node-timeout", str(self.node_timeout),
             "--hang-timeout", str(self.hang_timeout), "--heartbeat", "1",
             "--store-sync-full", "false"] + self.extra,
            env=self.env, stdout=self.log("loomd"), stderr=subprocess.STDOUT)
        self.wait(lambda: self.get("/healthz", token=None)[0] == 200, 10, "loomd up")

    def raw(self, method, path, token="tenant", headers=None):
        """(status, headers, body bytes) without any URL normalisation."""
        if token == "tenant":
            token = self.token
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        h = dict(headers or {})
        if token:
            h["Authorization"] = "Bearer " + token
        conn.request(method, path, headers=h)
        r = conn.getresponse()
        body = r.read()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        conn.close()
        return r.status, hdrs, body

    def all_events(self, token="tenant", query=""):
        items, since = [], 0
        while True:
            st, r = self.get("/v1/events?since=%d&limit=3%s" % (since, query), token=token)
            check(st == 200, "events page: %s %s" % (st, r))
            if not r["items"]:
                check(r["next"] == since, "empty page keeps the cursor: %s" % r)
                return items
            items += r["items"]
            since = r["next"]
            check(since == r["items"][-1]["seq"], "next is the last seq")


def event_types(c, jid, token="tenant"):
    return [e["type"] for e in c.all_events(token, "&job=" + jid)]


def code_of(r):
    return r.get("error", {}).get("code") if isinstance(r, dict) else None


# ---------------- a webhook receiver ----------------

class Receiver:
    """Loopback HTTP server recording every POST; verifies signatures."""

    def __init__(self, port=0, fail_first=0, delay=0.0):
        self.got = []  # (event id, body dict, signature ok)
        self.fail_left = fail_first
        self.delay = delay  # seconds before each answer
        self.answered = 0
        self.active = self.max_active = 0  # requests not yet answered, at once
        self.lock = threading.Lock()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sig = self.headers.get("Loom-Signature", "")
                parts = dict(p.split("=", 1) for p in sig.split(",") if "=" in p)
                want = hmac.new(SECRET.encode(), parts.get("t", "").encode() + b"." + body,
                                hashlib.sha256).hexdigest()
                ok = hmac.compare_digest(want, parts.get("v1", "")) and \
                    abs(time.time() - int(parts.get("t", "0"))) < 300
                with outer.lock:
                    outer.got.append((self.headers.get("Loom-Event-Id"), json.loads(body), ok))
                    fail = outer.fail_left > 0
                    if fail:
                        outer.fail_left -= 1
                    outer.active += 1
                    outer.max_active = max(outer.max_active, outer.active)
                if outer.delay:
                    time.sleep(outer.delay)
                # Counted as answered before the answer goes out: once loomd
                # has it, it may open the next request at once, before this
                # thread could run again, and `active` must count only the
                # requests loomd still waits on.
                with outer.lock:
                    outer.active -= 1
                    outer.answered += 1
                self.send_response(500 if fail else 204)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
        self.port = self.srv.server_address[1]
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()

    def ids(self):
        with self.lock:
            return [g[0] for g in self.got]

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def make_hook(c, url, events=("*",), token="tenant", secret=SECRET):
    body = {"url": url, "events": list(events)}
    if secret:
        body["secret"] = secret
    st, w = c.request("POST", "/v1/webhooks", body, token=token)
    check(st == 201, "create webhook: %s %s" % (st, w))
    return w


# ---------------- scenarios ----------------

def sc_events(c):
    """Typed events for a job's life, paging and replay from any cursor, the
    future cursor, long-poll wake-up, filters, errors, isolation."""
    jid = c.submit(world=2, steps=6, step_ms=50, ckpt=2, name="ev")
    c.wait_state(jid, "succeeded", 30)
    c.wait(lambda: "job.succeeded" in event_types(c, jid), 10, "job.succeeded event")
    types = event_types(c, jid)
    check(types[0] == "job.queued" and types[1] == "job.started" and types[-1] == "job.succeeded",
          "job event order: %s" % types)
    c.wait(lambda: event_types(c, jid).count("checkpoint.saved") == 3, 10, "3 checkpoint events")
    ck = [e for e in c.all_events(query="&type=checkpoint.saved") if e["job_id"] == jid]
    check([e["data"]["step"] for e in ck] == [2, 4, 6], "checkpoint steps: %s" % ck)
    # A retry and a cancel.
    jr = c.submit(world=1, steps=6, step_ms=50, ckpt=2, max_retries=2,
                  labels={"fake_crash_step": "3", "fake_crash_attempt": "0"})
    c.wait_state(jr, "succeeded", 30)
    c.wait(lambda: "job.succeeded" in event_types(c, jr), 10, "retried job succeeded event")
    t = event_types(c, jr)
    check("job.retrying" in t and t.count("job.started") == 2, "retry events: %s" % t)
    jc = c.submit(world=1, steps=1000, step_ms=100)
    c.wait_state(jc, "running", 20)
    c.request("POST", "/v1/jobs/%s/cancel" % jc)
    c.wait(lambda: event_types(c, jc)[-1] == "job.cancelled", 20, "job.cancelled")
    # Every item has the contract's fields; seqs strictly increase.
    allv = c.all_events()
    for e in allv:
        check(set(e) == {"seq", "type", "job_id", "created_at", "data"}, "fields: %s" % e)
        check(e["data"]["job_id"] == e["job_id"], "data.job_id")
    seqs = [e["seq"] for e in allv]
    check(seqs == sorted(set(seqs)), "seqs increase")
    # Replay from every cursor gives exactly the rest.
    for k in range(0, len(allv), 3):
        st, r = c.get("/v1/events?since=%d&limit=1000" % seqs[k])
        check([e["seq"] for e in r["items"]] == seqs[k + 1:], "replay after seq %d" % seqs[k])
    st, r = c.get("/v1/events?since=%d" % (seqs[-1] + 1000))
    check(st == 200 and r["items"] == [] and r["next"] == seqs[-1] + 1000, "future since: %s" % r)
    # Long-poll: wakes on a commit, well before the wait ends.
    out = {}

    def poll():
        t0 = time.time()
        out["r"] = c.get("/v1/events?since=%d&wait=20" % seqs[-1])
        out["s"] = time.time() - t0

    th = threading.Thread(target=poll)
    th.start()
    time.sleep(0.5)
    jl = c.submit(world=1, steps=1, step_ms=10)
    th.join(25)
    st, r = out["r"]
    check(st == 200 and r["items"] and r["items"][0]["job_id"] == jl, "long-poll: %s" % (r,))
    check(out["s"] < 5, "long-poll woke in %.2f s" % out["s"])
    t0 = time.time()
    st, r = c.get("/v1/events?since=%d&wait=1&job=%s" % (r["next"] + 100000, jid))
    check(st == 200 and r["items"] == [] and 0.9 < time.time() - t0 < 5, "long-poll timeout")
    # Errors.
    for q, code in (("since=-1", "INVALID_CURSOR"), ("since=x", "INVALID_CURSOR"),
                    ("limit=0", "INVALID_QUERY"), ("limit=1001", "INVALID_QUERY"),
                    ("wait=9999", "INVALID_QUERY"), ("type=job.nope", "UNKNOWN_EVENT_TYPE"),
                    ("job=j-000000000000", "JOB_NOT_FOUND")):
        st, r = c.get("/v1/events?" + q)
        check(st in (400, 404) and code_of(r) == code, "%s: %s %s" % (q, st, r))
    # Isolation: another tenant sees none of it; the admin sees all.
    _, tok_b = c.new_tenant("other")
    st, r = c.get("/v1/events", token=tok_b)
    check(st == 200 and r["items"] == [], "tenant B sees no events: %s" % r)
    st, r = c.get("/v1/events?job=" + jid, token=tok_b)
    check(st == 404 and code_of(r) == "JOB_NOT_FOUND", "B asks for A's job: %s" % r)
    b_job = c.submit(world=1, steps=1, step_ms=10, token=tok_b)
    st, r = c.get("/v1/events?limit=1000")
    check(b_job not in [e["job_id"] for e in r["items"]], "A does not see B's job")
    st, r = c.get("/v1/events?limit=1000", token=ADMIN)
    check(b_job in [e["job_id"] for e in r["items"]] and
          jid in [e["job_id"] for e in r["items"]], "admin sees both tenants")


def read_sse(c, headers, want, timeout=15):
    """Reads an SSE stream until `want` events arrived; returns (events,
    comments, raw text)."""
    s = socket.create_connection(("127.0.0.1", c.port), timeout=timeout)
    h = "".join("%s: %s\r\n" % kv for kv in headers.items())
    s.sendall(("GET /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
               "Accept: text/event-stream\r\n%s\r\n" % (c.token, h)).encode())
    buf, end = b"", time.time() + timeout
    events, comments = [], 0
    while time.time() < end:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
        # chunked encoding framing is irrelevant to the SSE lines we parse
        text = buf.decode(errors="replace")
        frames = [f for f in text.split("\n\n")]
        events = []
        comments = 0
        for f in frames[:-1]:
            lines = [ln for ln in f.split("\n") if ln and not all(ch in "0123456789abcdefABCDEF\r"
                                                                  for ch in ln)]
            lines = [ln.rstrip("\r") for ln in lines]
            if any(ln.startswith(": heartbeat") for ln in lines):
                comments += 1
            ev = dict(ln.split(": ", 1) for ln in lines if ln.split(": ", 1)[0] in
                      ("id", "event", "data"))
            if "id" in ev:
                events.append(ev)
        if len(events) >= want and comments >= 1:
            break
    s.close()
    return events, comments, buf.decode(errors="replace")


def sc_sse(c):
    """SSE framing (id/event/data, blank line), the same events as the pages,
    resume with Last-Event-ID, heartbeat comments."""
    jid = c.submit(world=1, steps=4, step_ms=50, ckpt=2)
    c.wait_state(jid, "succeeded", 30)
    c.wait(lambda: len(c.all_events()) >= 5, 10, "5 events")
    pages = c.all_events()
    events, comments, raw = read_sse(c, {}, len(pages))
    check("HTTP/1.1 200" in raw and "text/event-stream" in raw, "SSE reply: %s" % raw[:300])
    check(len(events) >= len(pages), "SSE got %d of %d events" % (len(events), len(pages)))
    for ev, p in zip(events, pages):
        check(int(ev["id"]) == p["seq"] and ev["event"] == p["type"] and
              json.loads(ev["data"]) == p, "frame matches the page item: %s vs %s" % (ev, p))
    check(comments >= 1, "heartbeat comment seen (--events-heartbeat 1)")
    mid = pages[1]["seq"]
    events, _, _ = read_sse(c, {"Last-Event-ID": str(mid)}, len(pages) - 2)
    check([int(e["id"]) for e in events] == [p["seq"] for p in pages[2:]],
          "Last-Event-ID resumes after %d: %s" % (mid, [e["id"] for e in events]))
    # A live event arrives on an open stream.
    out = {}
    th = threading.Thread(target=lambda: out.setdefault(
        "r", read_sse(c, {"Last-Event-ID": str(pages[-1]["seq"])}, 1)))
    th.start()
    time.sleep(0.5)
    jl = c.submit(world=1, steps=1, step_ms=10)
    th.join(20)
    check(out["r"][0] and json.loads(out["r"][0][0]["data"])["job_id"] == jl, "live SSE event")
    st, hd, body = c.raw("GET", "/v1/events", headers={"Accept": "text/event-stream",
                                                        "Last-Event-ID": "abc"})
    check(st == 400 and b"INVALID_LAST_EVENT_ID" in body, "bad Last-Event-ID: %s" % body)


def sc_event_ring(c):
    """loomd keeps the newest events in memory (--events-ring 16 here) and
    reads older cursors from the store: pages, filters and SSE give exactly
    the same items on both sides of the ring's floor and across it, also
    after a restart (the ring is refilled from the store)."""
    _, tok_b = c.new_tenant("ring-b")
    jobs = []
    for k in range(30):
        jobs.append((c.submit(world=1, steps=1, step_ms=10, token=tok_b if k % 3 == 2 else
                              "tenant"), k % 3 == 2))
    own = [j for j, b in jobs if not b]

    def check_all(label):
        # Ground truth: one page per event with limit=1 walks every cursor.
        truth = c.all_events()
        check([e["job_id"] for e in truth if e["type"] == "job.queued"] == own,
              "%s: own job.queued events in order" % label)
        seqs = [e["seq"] for e in truth]
        for k in range(len(seqs)):
            st, r = c.get("/v1/events?since=%d&limit=1000" % seqs[k])
            check(st == 200 and r["items"] == truth[k + 1:],
                  "%s: replay after seq %d (%d items)" % (label, seqs[k], len(r["items"])))
        st, r = c.get("/v1/events?since=0&limit=1000")
        check(r["items"] == truth, "%s: since=0 gives every event" % label)
        # A filter and a limit that ends inside the ring.
        j = own[-3]
        st, r = c.get("/v1/events?since=0&job=%s" % j)
        check([e["job_id"] for e in r["items"]] == [j], "%s: job filter" % label)
        st, r = c.get("/v1/events?since=%d&limit=2" % seqs[-6])
        check(r["items"] == truth[-5:-3] and r["next"] == truth[-4]["seq"],
              "%s: limit inside the ring: %s" % (label, r))
        # The admin sees the other tenant's events too, in seq order.
        st, r = c.get("/v1/events?since=0&limit=1000", token=ADMIN)
        check(len(r["items"]) == 30 and [e["seq"] for e in r["items"]] ==
              sorted(e["seq"] for e in r["items"]), "%s: admin sees all 30" % label)
        # SSE from the start crosses from the store into the ring.
        events, _, _ = read_sse(c, {"Last-Event-ID": "0"}, len(truth))
        check([json.loads(e["data"]) for e in events[:len(truth)]] == truth,
              "%s: SSE from 0 gives the pages' items (%d of %d)" % (label, len(events),
                                                                    len(truth)))
        return truth

    truth = check_all("live")
    c.loomd.send_signal(signal.SIGTERM)
    c.loomd.wait()
    c.start_loomd()
    again = check_all("after restart")
    check(again == truth, "the same events after the restart")
    # A live event still reaches a stream and a long-poll after the restart.
    out = {}
    th = threading.Thread(target=lambda: out.setdefault(
        "r", read_sse(c, {"Last-Event-ID": str(truth[-1]["seq"])}, 1)))
    th.start()
    time.sleep(0.5)
    jl = c.submit(world=1, steps=1, step_ms=10)
    th.join(20)
    check(out["r"][0] and json.loads(out["r"][0][0]["data"])["job_id"] == jl,
          "live SSE event after the restart")


def spec_file(c, name, steps, step_ms, labels=None, max_retries=1):
    """A job spec like Cluster.submit's, written to a file for loomctl."""
    lab = {"fake_step_ms": str(step_ms)}
    lab.update(labels or {})
    spec = {
        "name": name,
        "model": {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 64, "d_ff": 256,
                  "vocab_size": 256, "seq_len": 32},
        "data": {"train": os.path.join(c.data, "train_000.bin")},
        "parallel": {"dp": 1, "tp": 1, "pp": 1},
        "train": {"steps": steps, "global_batch_tokens": 128, "micro_batch": 4,
                  "precision": "fp32"},
        "resources": {"device": "cpu", "gpus_per_node": 2},
        "labels": lab, "max_retries": max_retries,
    }
    path = os.path.join(c.tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


def sc_cli_wait(c):
    """loomctl submit --wait / --follow and loomctl wait: they return when the
    job ends, with the exit code of its outcome (api/exit_codes.h: 0
    succeeded, 4 failed, 5 cancelled, 6 timeout, 1 API error), --follow
    prints the events and step records."""
    env = dict(c.env, LOOM_URL=c.url, LOOM_TOKEN=c.token)
    ctl = os.path.join(BIN, "loomctl")

    def run(*args, timeout=90):
        return subprocess.run([ctl] + list(args), env=env, capture_output=True, text=True,
                              timeout=timeout)

    r = run("submit", spec_file(c, "ok", 4, 50), "--wait")
    jid = r.stdout.split()[1] if r.stdout.startswith("submitted ") else "?"
    check(r.returncode == 0 and ("job %s succeeded" % jid) in r.stdout,
          "submit --wait: rc %d %s %s" % (r.returncode, r.stdout, r.stderr))
    check(c.job(jid)["state"] == "succeeded", "the job did succeed")
    r = run("submit", spec_file(c, "follow", 5, 100, {"fake_step_ms": "100"}), "--follow")
    out = r.stdout
    check(r.returncode == 0, "submit --follow rc %d: %s %s" % (r.returncode, out, r.stderr))
    for want in ("job.queued", "job.started", "step 5/5 loss", "job.succeeded", "succeeded"):
        check(want in out, "--follow prints %r: %s" % (want, out))
    check(out.index("job.queued") < out.index("job.started") < out.index("job.succeeded"),
          "--follow prints events in order: %s" % out)
    steps = [ln.split()[1] for ln in out.splitlines() if ln.startswith("step ")]
    check(steps == ["%d/5" % k for k in range(1, 6)], "each step record once, in order: %s"
          % steps)
    # A job that fails: exit 4 (the fake worker crashes at step 2, no retries left).
    r = run("submit", spec_file(c, "bad", 4, 50, {"fake_crash_step": "2"}, max_retries=0),
            "--wait")
    check(r.returncode == 4 and "failed" in r.stdout, "failed job: rc %d %s %s" %
          (r.returncode, r.stdout, r.stderr))
    # A cancelled job: exit 5, seen by `loomctl wait` on a job submitted over HTTP.
    jl = c.submit(world=1, steps=1000, step_ms=100)
    c.wait_state(jl, "running", 20)
    r = run("wait", jl, "--timeout", "1")
    check(r.returncode == 6 and "--timeout" in r.stderr, "wait --timeout: rc %d %s" %
          (r.returncode, r.stderr))
    threading.Timer(1.0, lambda: c.request("POST", "/v1/jobs/%s/cancel" % jl)).start()
    t0 = time.time()
    r = run("wait", jl)
    check(r.returncode == 5 and "cancelled" in r.stdout, "cancelled job: rc %d %s %s" %
          (r.returncode, r.stdout, r.stderr))
    check(time.time() - t0 < 15, "wait returned %.1f s after the cancel" % (time.time() - t0))
    # JSON: the final job object.
    r = run("--json", "wait", jid)
    check(r.returncode == 0 and json.loads(r.stdout)["state"] == "succeeded", "--json wait: %s"
          % r.stdout)
    # Errors: an unknown job, another tenant's job (404, exit 1), bad usage (exit 2).
    r = run("wait", "j-000000000000")
    check(r.returncode == 1 and "JOB_NOT_FOUND" in r.stderr, "unknown job: %d %s" %
          (r.returncode, r.stderr))
    _, tok_b = c.new_tenant("cli-b")
    r = subprocess.run([ctl, "wait", jid], env=dict(env, LOOM_TOKEN=tok_b), capture_output=True,
                       text=True, timeout=30)
    check(r.returncode == 1 and "JOB_NOT_FOUND" in r.stderr, "other tenant's job: %d %s" %
          (r.returncode, r.stderr))
    for args in (("wait",), ("wait", jid, "--timeout", "x"), ("submit", "f.json", "--timeout",
                                                              "5"), ("submit", "f.json", "--bogus")):
        r = run(*args)
        check(r.returncode == 2, "usage %s: rc %d %s" % (args, r.returncode, r.stderr))
    # loomd unreachable: exit 3.
    r = subprocess.run([ctl, "wait", jid], env=dict(env, LOOM_URL="http://127.0.0.1:1"),
                       capture_output=True, text=True, timeout=30)
    check(r.returncode == 3, "unreachable: %d %s" % (r.returncode, r.stderr))


def sc_webhooks(c):
    """Signed deliveries, 500 once then retried, deliveries log, validation,
    isolation, delete."""
    rx = Receiver(fail_first=1)
    try:
        w = make_hook(c, "http://127.0.0.1:%d/hook" % rx.port, ["job.queued", "job.succeeded"])
        check(w["secret"] == SECRET and w["id"].startswith("wh-"), "create: %s" % w)
        jid = c.submit(world=1, steps=2, step_ms=20)
        c.wait_state(jid, "succeeded", 20)
        ev = {e["type"]: e for e in c.all_events(query="&job=" + jid)}
        q, s = str(ev["job.queued"]["seq"]), str(ev["job.succeeded"]["seq"])
        c.wait(lambda: rx.ids().count(q) == 2 and s in rx.ids(), 20, "queued retried, succeeded")
        time.sleep(1)
        got = list(rx.got)
        check(all(g[2] for g in got), "every signature verifies: %s" % got)
        check(sorted(rx.ids()) == sorted([q, q, s]), "exactly: queued twice, succeeded once: %s"
              % rx.ids())
        for eid, body, _ in got:
            e = ev["job.queued"] if eid == q else ev["job.succeeded"]
            check(body == {"id": e["seq"], "type": e["type"], "created_at": e["created_at"],
                           "data": e["data"]}, "body: %s" % body)
        st, d = c.get("/v1/webhooks/%s/deliveries" % w["id"])
        by = {x["event_seq"]: x for x in d["items"]}
        check(by[int(q)]["attempts"] == 2 and by[int(q)]["state"] == "delivered" and
              by[int(s)]["attempts"] == 1, "deliveries: %s" % d)
        check(len(d["items"]) == 2, "only subscribed types are delivered: %s" % d)
        st, m = c.get("/metrics", token=None)
        vals = dict(ln.rsplit(" ", 1) for ln in m.splitlines() if ln.startswith("loom_"))
        check(float(vals['loom_webhook_attempts_total{result="failed"}']) >= 1 and
              float(vals['loom_webhook_attempts_total{result="ok"}']) >= 2 and
              float(vals['loom_webhook_deliveries{state="delivered"}']) >= 2 and
              float(vals["loom_events_last_seq"]) >= int(s), "metrics: %s" %
              {k: v for k, v in vals.items() if "webhook" in k or "events" in k})
        # Generated secret, listing without secrets.
        w2 = make_hook(c, "http://127.0.0.1:%d/two" % rx.port, secret=None)
        check(w2["secret"].startswith("whsec_") and len(w2["secret"]) == 70, "generated secret")
        st, ls = c.get("/v1/webhooks")
        check(st == 200 and len(ls["items"]) == 2 and
              all("secret" not in x for x in ls["items"]), "list: %s" % ls)
        st, g = c.get("/v1/webhooks/" + w["id"])
        check(st == 200 and "secret" not in g and g["url"] == w["url"], "get: %s" % g)
        # Validation.
        for body, code in (({"url": "ftp://127.0.0.1/x", "events": ["*"]}, "INVALID_WEBHOOK_URL"),
                           ({"url": "not a url", "events": ["*"]}, "INVALID_WEBHOOK_URL"),
                           ({"events": ["*"]}, "INVALID_WEBHOOK_URL"),
                           ({"url": "http://127.0.0.1/", "events": []}, "INVALID_WEBHOOK_EVENTS"),
                           ({"url": "http://127.0.0.1/", "events": ["job.x"]},
                            "UNKNOWN_EVENT_TYPE"),
                           ({"url": "http://127.0.0.1/", "events": ["*"], "secret": "short"},
                            "INVALID_WEBHOOK_SECRET"),

                           ({"url": "http://no-such-host.invalid/", "events": ["*"]},
                            "WEBHOOK_HOST_UNRESOLVED")):
            st, r = c.request("POST", "/v1/webhooks", body)
            check(st == 400 and code_of(r) == code, "%s: %s %s" % (body, st, r))
        st, r = c.request("POST", "/v1/webhooks",
                          {"url": "http://127.0.0.1/", "events": ["*"], "x": 1})
        check(st == 422 and code_of(r) == "UNKNOWN_FIELD" and r["error"]["field"] == "x",
              "unknown field: %s %s" % (st, r))
        # Isolation: B sees none of A's webhooks; every route answers 404.
        _, tok_b = c.new_tenant("other")
        st, r = c.get("/v1/webhooks", token=tok_b)
        check(st == 200 and r["items"] == [], "B lists nothing")
        for m, p in (("GET", "/v1/webhooks/" + w["id"]),
                     ("GET", "/v1/webhooks/%s/deliveries" % w["id"]),
                     ("DELETE", "/v1/webhooks/" + w["id"])):
            st, r = c.request(m, p, token=tok_b)
            check(st == 404 and code_of(r) == "WEBHOOK_NOT_FOUND", "B %s %s: %s" % (m, p, r))
        st, r = c.request("POST", "/v1/webhooks", {"url": "http://127.0.0.1/", "events": ["*"]},
                          token=ADMIN)
        check(st == 403, "admin token cannot own webhooks: %s" % st)
        # B's own webhook does not get A's events.
        make_hook(c, "http://127.0.0.1:%d/b" % rx.port, token=tok_b)
        # Delete: gone, and no more deliveries.
        st, r = c.request("DELETE", "/v1/webhooks/" + w["id"])
        check(st == 200 and r["deleted"], "delete: %s" % r)
        st, r = c.get("/v1/webhooks/" + w["id"])
        check(st == 404, "deleted webhook is 404")
        n = len(rx.got)
        jid2 = c.submit(world=1, steps=1, step_ms=10)
        c.wait_state(jid2, "succeeded", 20)
        time.sleep(1.5)
        check(all(g[1]["data"]["job_id"] == jid2 for g in rx.got[n:]), "only w2 receives")
        types = sorted(g[1]["type"] for g in rx.got[n:])
        check(types == ["job.queued", "job.started", "job.succeeded"],
              "w2 ('*') got every event of the job once: %s" % types)
    finally:
        rx.close()


def sc_webhook_private(c):
    """Without --webhook-allow-private loopback and private targets are refused."""
    for url in ("http://127.0.0.1:9/", "http://localhost:9/", "http://10.1.2.3/",
                "http://[::1]:9/", "http://169.254.169.254/latest", "http://192.168.0.1/",
                "http://[::ffff:127.0.0.1]/"):
        st, r = c.request("POST", "/v1/webhooks", {"url": url, "events": ["*"]})
        check(st == 400 and code_of(r) == "WEBHOOK_PRIVATE_ADDRESS", "%s: %s %s" % (url, st, r))
    st, r = c.request("POST", "/v1/webhooks", {"url": "https://93.184.216.34/h", "events": ["*"]})
    check(st == 201, "a public address literal is accepted: %s %s" % (st, r))


def sc_webhook_connect_check(c):
    """The address check at delivery is made on the address curl connects to:
    a webhook to a loopback receiver, created while loomd allowed private
    targets, gets no request once loomd runs without --webhook-allow-private;
    its delivery records the refused address and stays pending (retried)."""
    rx = Receiver()
    try:
        w = make_hook(c, "http://127.0.0.1:%d/hook" % rx.port, ["job.queued"])
        c.loomd.send_signal(signal.SIGTERM)
        c.loomd.wait()
        c.extra = [x for x in c.extra if x != "--webhook-allow-private"]
        c.start_loomd()
        jid = c.submit(world=1, steps=1, step_ms=10)
        c.wait(lambda: c.get("/v1/webhooks/%s/deliveries" % w["id"])[1]["items"]
               and c.get("/v1/webhooks/%s/deliveries" % w["id"])[1]["items"][0]["attempts"] >= 2,
               15, "two refused attempts")
        st, d = c.get("/v1/webhooks/%s/deliveries" % w["id"])
        item = d["items"][0]
        check(item["state"] == "pending", "still pending (retried): %s" % item)
        check("127.0.0.1" in item["last_error"] and "private" in item["last_error"],
              "the refused address is named: %s" % item["last_error"])
        check(rx.ids() == [], "no request reached the loopback receiver: %s" % rx.ids())
        check(any(e["type"] == "job.queued" for e in c.all_events(query="&job=" + jid)),
              "the event itself is there")
    finally:
        rx.close()


def sc_webhook_crash(c):
    """kill -9 of loomd after the event committed and before it was delivered:
    after the restart the delivery arrives once, with the same event id."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens yet: deliveries fail (connection refused)
    w = make_hook(c, "http://127.0.0.1:%d/hook" % port, ["job.queued"])
    jid = c.submit(world=1, steps=1, step_ms=10)
    seq = [e for e in c.all_events(query="&job=" + jid) if e["type"] == "job.queued"][0]["seq"]
    c.wait(lambda: c.get("/v1/webhooks/%s/deliveries" % w["id"])[1]["items"][0]["attempts"] >= 1,
           10, "a failed attempt")
    st, d = c.get("/v1/webhooks/%s/deliveries" % w["id"])
    check(d["items"][0]["state"] == "pending", "pending before the crash: %s" % d)
    c.loomd.send_signal(signal.SIGKILL)
    c.loomd.wait()
    rx = Receiver(port=port)
    try:
        c.start_loomd()
        c.wait(lambda: str(seq) in rx.ids(), 20, "delivery after the restart")
        time.sleep(2)
        check(rx.ids().count(str(seq)) == 1, "exactly one delivery: %s" % rx.ids())
        check(all(g[2] for g in rx.got), "signature")
        st, d = c.get("/v1/webhooks/%s/deliveries" % w["id"])
        check(d["items"][0]["state"] == "delivered" and d["items"][0]["event_seq"] == seq,
              "delivered: %s" % d)
    finally:
        rx.close()


def sc_webhook_slow(c):
    """A slow target does not hold up the others: with one receiver that
    answers after 3 s and one that answers at once, every delivery to the fast
    one arrives while the slow one has not answered any; the slow one gets at
    most --webhook-inflight-hook (here 2) requests at once, and all of its
    deliveries arrive later, once each."""
    slow, fast = Receiver(delay=3.0), Receiver()
    try:
        ws = make_hook(c, "http://127.0.0.1:%d/slow" % slow.port, ["job.queued"])
        wf = make_hook(c, "http://127.0.0.1:%d/fast" % fast.port, ["job.queued"])
        jobs = [c.submit(world=1, steps=1, step_ms=10) for _ in range(5)]
        seqs = sorted(str(e["seq"]) for e in c.all_events(query="&type=job.queued")
                      if e["job_id"] in jobs)
        check(len(seqs) == 5, "5 job.queued events: %s" % seqs)
        c.wait(lambda: sorted(fast.ids()) == seqs, 2.5, "fast receiver has every event")
        with slow.lock:
            answered, pending = slow.answered, len(slow.got)
        check(answered == 0, "the fast deliveries did not wait for the slow target (it answered "
              "%d first)" % answered)
        check(1 <= pending <= 2, "slow target holds 1..2 requests (per-hook cap): %d" % pending)
        st, d = c.get("/v1/webhooks/%s/deliveries" % ws["id"])
        check(st == 200 and all(x["state"] == "pending" for x in d["items"]),
              "slow deliveries still pending: %s" % d)
        c.wait(lambda: all(x["state"] == "delivered" for x in
                           c.get("/v1/webhooks/%s/deliveries" % wf["id"])[1]["items"]), 5,
               "fast deliveries recorded")
        c.wait(lambda: sorted(slow.ids()) == seqs, 15, "slow receiver gets every event")
        time.sleep(1)
        check(sorted(slow.ids()) == seqs and sorted(fast.ids()) == seqs,
              "each once: slow %s fast %s" % (slow.ids(), fast.ids()))
        check(slow.max_active <= 2, "at most 2 at once to the slow target: %d" % slow.max_active)
        check(all(g[2] for g in slow.got + fast.got), "signatures")
        c.wait(lambda: all(x["state"] == "delivered" and x["attempts"] == 1 for x in
                           c.get("/v1/webhooks/%s/deliveries" % ws["id"])[1]["items"]), 5,
               "slow deliveries recorded, one attempt each")
    finally:
        slow.close()
        fast.close()


def sc_webhook_stop(c):
    """SIGTERM while an attempt hangs on its target: loomd stops at once
    (the attempt is abandoned, not recorded), and after the restart the
    delivery goes out again with the same event id and is recorded as one
    attempt."""
    rx = Receiver(delay=8.0)
    try:
        w = make_hook(c, "http://127.0.0.1:%d/hang" % rx.port, ["job.queued"])
        jid = c.submit(world=1, steps=1, step_ms=10)
        seq = [e for e in c.all_events(query="&job=" + jid) if e["type"] == "job.queued"][0]["seq"]
        c.wait(lambda: rx.ids() == [str(seq)], 5, "the attempt reached the target")
        t0 = time.time()
        c.loomd.send_signal(signal.SIGTERM)
        c.loomd.wait(timeout=20)
        took = time.time() - t0
        check(took < 4, "loomd stopped %.1f s after SIGTERM with an attempt in flight" % took)
        rx.delay = 0
        c.start_loomd()
        c.wait(lambda: rx.answered >= 1, 10, "delivered after the restart")
        c.wait(lambda: c.get("/v1/webhooks/%s/deliveries" % w["id"])[1]["items"][0]["state"] ==
               "delivered", 5, "recorded")
        st, d = c.get("/v1/webhooks/%s/deliveries" % w["id"])
        check(d["items"][0]["attempts"] == 1 and d["items"][0]["event_seq"] == seq,
              "the abandoned attempt is not counted: %s" % d)
        check(rx.ids() == [str(seq), str(seq)] and all(g[2] for g in rx.got),
              "sent again with the same id, signed: %s" % rx.got)
    finally:
        rx.close()


def sc_webhook_timeout(c):
    """A target slower than --webhook-timeout (1 s here): the attempt times
    out and is retried with backoff and the same Loom-Event-Id, while another
    webhook's deliveries go on; once the target answers in time, the
    delivery is recorded with every attempt counted."""
    rx, fast = Receiver(delay=2.5), Receiver()
    try:
        w = make_hook(c, "http://127.0.0.1:%d/late" % rx.port, ["job.queued"])
        make_hook(c, "http://127.0.0.1:%d/fast" % fast.port, ["job.queued"])
        jid = c.submit(world=1, steps=1, step_ms=10)
        seq = str([e for e in c.all_events(query="&job=" + jid)
                   if e["type"] == "job.queued"][0]["seq"])
        c.wait(lambda: fast.ids() == [seq], 2, "the other webhook is served at once")

        def item():
            return c.get("/v1/webhooks/%s/deliveries" % w["id"])[1]["items"][0]
        c.wait(lambda: item()["attempts"] >= 2, 10, "two timed-out attempts")
        it = item()
        check(it["state"] == "pending" and it["last_status"] == 0 and
              "imeout" in (it["last_error"] or ""), "timed out, pending: %s" % it)
        check(set(rx.ids()) == {seq} and len(rx.ids()) >= 2, "retried with the same id: %s"
              % rx.ids())
        rx.delay = 0
        c.wait(lambda: item()["state"] == "delivered", 15, "delivered once the target is quick")
        it = item()
        check(it["attempts"] == len(rx.ids()) and it["last_status"] == 204,
              "every attempt counted: %s, %d requests" % (it, len(rx.ids())))
        check(all(g[2] for g in rx.got), "signatures")
    finally:
        rx.close()
        fast.close()


def sha(b):
    return hashlib.sha256(b).hexdigest()


def art_path(jid, rel):
    return "/v1/jobs/%s/artifacts/%s" % (jid, "/".join(urllib.parse.quote(p) for p in
                                                        rel.split("/")))


def sc_artifacts(c):
    """Listing vs the files on disk, whole and ranged downloads (sha256 against
    hashlib), ETag, 416s, confinement, deletes, loomctl, isolation."""
    jid = c.submit(world=1, steps=6, step_ms=30, ckpt=2, labels={"fake_artifacts": "1"})
    j = c.wait_state(jid, "succeeded", 30)
    out = j["out_dir"]
    c.wait(lambda: event_types(c, jid).count("export.ready") == 2, 10, "export.ready events")
    ex = [e["data"] for e in c.all_events(query="&job=%s&type=export.ready" % jid)]
    check(sorted((e["kind"], e["path"]) for e in ex) ==
          [("hf", "export/hf"), ("lora", "export/lora")], "export events: %s" % ex)
    ck = [e["data"]["path"] for e in c.all_events(query="&job=%s&type=checkpoint.saved" % jid)]
    check(ck == ["checkpoints/step_%08d" % s for s in (2, 4, 6)], "checkpoint paths: %s" % ck)
    # A symlink out of the job's directory is neither listed nor served.
    os.symlink("/etc/passwd", os.path.join(out, "export", "hf", "evil"))
    st, r = c.get("/v1/jobs/%s/artifacts" % jid)
    check(st == 200, "list: %s %s" % (st, r))
    items = {i["path"]: i for i in r["items"]}
    want = {"checkpoints/step_%08d/%s" % (s, f) for s in (2, 4, 6)
            for f in ("manifest.json", "rank_00000.bin")}
    want |= {"export/hf/config.json", "export/hf/model.safetensors",
             "export/lora/adapter_config.json", "export/lora/adapter_model.safetensors"}
    check(want <= set(items), "listed: %s" % sorted(items))
    check("export/hf/evil" not in items, "symlink not listed")
    logs = [p for p in items if p.startswith("logs/")]
    check(logs and all(items[p]["kind"] == "log" for p in logs), "log artifacts: %s" % logs)
    kinds = {"checkpoints": "checkpoint", "export/hf": "model", "export/lora": "adapter"}
    for p, it in items.items():
        if p.startswith("logs/"):
            disk = os.path.join(c.tmp, "loomd", "logs", jid, p[5:])
        else:
            disk = os.path.join(out, p)
            check(it["kind"] == [v for k, v in kinds.items() if p.startswith(k)][0],
                  "kind of %s" % p)
        data = open(disk, "rb").read()
        check(it["size"] == len(data) and it["sha256"] == sha(data), "size/sha of %s" % p)
        if p.startswith("checkpoints/"):
            check(it["step"] == int(p.split("/")[1][5:]), "step of %s" % p)
        st, hd, body = c.raw("GET", art_path(jid, p))
        check(st == 200 and sha(body) == sha(data) and hd.get("etag") == '"%s"' % sha(data),
              "download %s: %s %s" % (p, st, hd))
    big = "export/hf/model.safetensors"
    data = open(os.path.join(out, big), "rb").read()
    n = len(data)
    for rng, a, b in (("bytes=0-99", 0, 99), ("bytes=100-", 100, n - 1), ("bytes=-50", n - 50,
                                                                          n - 1),
                      ("bytes=1000-2000", 1000, 2000), ("bytes=%d-%d" % (n - 10, n + 99), n - 10,
                                                        n - 1)):
        st, hd, body = c.raw("GET", art_path(jid, big), headers={"Range": rng})
        check(st == 206 and sha(body) == sha(data[a:b + 1]) and
              hd.get("content-range") == "bytes %d-%d/%d" % (a, b, n), "%s: %s %s" % (rng, st,
                                                                                       hd))
    for rng in ("bytes=%d-" % n, "bytes=5-2", "bytes=0-1,5-6", "items=0-1", "bytes=-0", "bytes=x-"):
        st, hd, body = c.raw("GET", art_path(jid, big), headers={"Range": rng})
        check(st == 416 and hd.get("content-range") == "bytes */%d" % n and
              b"RANGE_NOT_SATISFIABLE" in body, "%s: %s %s" % (rng, st, body))
    st, hd, body = c.raw("GET", art_path(jid, big), headers={"If-None-Match": '"%s"' % sha(data)})
    check(st == 304, "If-None-Match: %s" % st)
    # Confinement: escapes and non-artifacts are 404.
    for p in ("export/hf/evil", "export/hf/../../../../../etc/passwd", "spec.json",
              "checkpoints/step_00000002/../../fake-ckpt.0", "export/hf/%2e%2e/%2e%2e/x",
              "logs/../../loom.db", "checkpoints/.tmp.step_1/x"):
        st, hd, body = c.raw("GET", "/v1/jobs/%s/artifacts/%s" % (jid, p))
        check(st == 404 and b"ARTIFACT_NOT_FOUND" in body, "%s: %s %s" % (p, st, body))
    # loomctl.
    env = dict(c.env, LOOM_URL=c.url, LOOM_TOKEN=c.token)
    r = subprocess.run([os.path.join(BIN, "loomctl"), "artifacts", jid], env=env,
                       capture_output=True, text=True, timeout=20)
    check(r.returncode == 0 and big in r.stdout and "checkpoint" in r.stdout, "loomctl artifacts")
    dest = os.path.join(c.tmp, "dl.bin")
    r = subprocess.run([os.path.join(BIN, "loomctl"), "download", jid, big, "-o", dest], env=env,
                       capture_output=True, text=True, timeout=20)
    check(r.returncode == 0 and sha(open(dest, "rb").read()) == sha(data),
          "loomctl download: %s" % r.stderr)
    r = subprocess.run([os.path.join(BIN, "loomctl"), "download", jid, "export/hf/nope", "-o",
                        dest + ".x"], env=env, capture_output=True, text=True, timeout=20)
    check(r.returncode == 1 and "ARTIFACT_NOT_FOUND" in r.stderr and
          not os.path.exists(dest + ".x") and not os.path.exists(dest + ".x.part"),
          "loomctl download of a missing file: %s" % r.stderr)
    # Isolation.
    _, tok_b = c.new_tenant("other")
    for m, p in (("GET", "/v1/jobs/%s/artifacts" % jid), ("GET", art_path(jid, big)),
                 ("DELETE", art_path(jid, big))):
        st, hd, body = c.raw(m, p, token=tok_b)
        check(st == 404 and b"JOB_NOT_FOUND" in body, "B %s %s: %s" % (m, p, body))
    st, hd, body = c.raw("GET", "/v1/jobs/%s/artifacts" % jid, token=ADMIN)
    check(st == 200, "admin lists any job's artifacts")
    # Deletes.
    st, hd, body = c.raw("DELETE", art_path(jid, "checkpoints/step_00000002/rank_00000.bin"))
    check(st == 409 and b"ARTIFACT_IN_CHECKPOINT" in body, "delete one shard: %s" % body)
    st, hd, body = c.raw("DELETE", art_path(jid, "checkpoints/step_00000002"))
    check(st == 200 and not os.path.exists(os.path.join(out, "checkpoints/step_00000002")),
          "delete a checkpoint: %s" % body)
    st, hd, body = c.raw("DELETE", art_path(jid, "export/lora/adapter_config.json"))
    check(st == 200 and not os.path.exists(os.path.join(out, "export/lora/adapter_config.json")),
          "delete an export file")
    st, r = c.get("/v1/jobs/%s/artifacts" % jid)
    left = {i["path"] for i in r["items"]}
    check(not [p for p in left if p.startswith("checkpoints/step_00000002")] and
          "export/lora/adapter_config.json" not in left and big in left, "listing after deletes")
    st, hd, body = c.raw("DELETE", art_path(jid, "checkpoints/step_00000002"))
    check(st == 404, "delete twice: %s" % st)
    # The newest checkpoint of a running job stays.
    jr = c.submit(world=1, steps=1000, step_ms=50, ckpt=2, labels={"fake_artifacts": "1"})
    c.wait(lambda: "checkpoint.saved" in event_types(c, jr), 20, "a checkpoint of a running job")
    c.wait_state(jr, "running", 10)
    st, r = c.get("/v1/jobs/%s/artifacts" % jr)
    steps = sorted({i["step"] for i in r["items"] if i["kind"] == "checkpoint"})
    newest = "checkpoints/step_%08d" % steps[-1]
    # The job may save another one meanwhile; then the one we name is not the
    # newest any more and may go: retry until the answer is about the newest.
    st, hd, body = c.raw("DELETE", art_path(jr, newest))
    check(st in (200, 409), "delete newest: %s" % body)
    if st == 409:
        check(b"CHECKPOINT_IN_USE" in body, "newest checkpoint refused: %s" % body)
    c.request("POST", "/v1/jobs/%s/cancel" % jr)


class NodeLocalCluster(Cluster):
    """Agents keep job directories on their own disks (--job-root) and serve
    them to loomd (--artifact-listen): nothing of a job's out_dir is where
    loomd looks, so every artifact byte comes through the agent."""

    def start_agent(self, name, devices, extra=()):
        root = os.path.join(self.tmp, name + "-jobs")
        return super().start_agent(name, devices, list(extra) + [
            "--job-root", root, "--artifact-listen", "127.0.0.1:0"])


def sc_artifacts_node(c):
    """Artifacts served from the agent that holds them (no shared storage):
    listing and downloads (whole, Range, ETag/304, 416) checked with hashlib
    against the agent-side files, confinement through loomd and at the
    agent's own route, its token, tenant isolation, a bad registration."""
    import sqlite3
    jid = c.submit(world=1, steps=6, step_ms=30, ckpt=2, labels={"fake_artifacts": "1"})
    j = c.wait_state(jid, "succeeded", 30)
    local = os.path.join(c.tmp, "node-1-jobs", jid)
    check(os.path.isdir(os.path.join(local, "export", "hf")), "the export is on the node's disk")
    check(not os.path.exists(os.path.join(j["out_dir"], "export")),
          "nothing under loomd's out_dir %s" % j["out_dir"])
    os.symlink("/etc/passwd", os.path.join(local, "export", "hf", "evil"))
    os.makedirs(os.path.join(local, "checkpoints", ".tmp.step_00000099"))
    with open(os.path.join(local, "checkpoints", ".tmp.step_00000099", "rank_00000.bin"),
              "wb") as f:
        f.write(b"partial")
    st, r = c.get("/v1/jobs/%s/artifacts" % jid)
    check(st == 200, "list: %s %s" % (st, r))
    items = {i["path"]: i for i in r["items"]}
    want = {"checkpoints/step_%08d/%s" % (s, f) for s in (2, 4, 6)
            for f in ("manifest.json", "rank_00000.bin")}
    want |= {"export/hf/config.json", "export/hf/model.safetensors",
             "export/lora/adapter_config.json", "export/lora/adapter_model.safetensors"}
    check(want == {p for p in items if not p.startswith("logs/")},
          "listed from the node: %s" % sorted(items))
    check([p for p in items if p.startswith("logs/")], "logs (loomd's copies) listed too")
    check([i["path"] for i in r["items"]] == sorted(items), "sorted by path")
    kinds = {"checkpoints": "checkpoint", "export/hf": "model", "export/lora": "adapter"}
    for p in want:
        it = items[p]
        data = open(os.path.join(local, p), "rb").read()
        check(it["kind"] == [v for k, v in kinds.items() if p.startswith(k)][0], "kind of " + p)
        check(it["size"] == len(data) and it["sha256"] == sha(data), "size/sha of %s" % p)
        st, hd, body = c.raw("GET", art_path(jid, p))
        check(st == 200 and body == data and hd.get("etag") == '"%s"' % sha(data),
              "download %s through loomd: %s %s" % (p, st, hd))
    big = "export/hf/model.safetensors"
    data = open(os.path.join(local, big), "rb").read()
    n = len(data)
    for rng, a, b in (("bytes=0-99", 0, 99), ("bytes=100-", 100, n - 1),
                      ("bytes=-50", n - 50, n - 1), ("bytes=1000-2000", 1000, 2000)):
        st, hd, body = c.raw("GET", art_path(jid, big), headers={"Range": rng})
        check(st == 206 and sha(body) == sha(data[a:b + 1]) and
              hd.get("content-range") == "bytes %d-%d/%d" % (a, b, n),
              "Range %s: %s %s" % (rng, st, hd))
    st, hd, body = c.raw("GET", art_path(jid, big), headers={"Range": "bytes=%d-" % (n + 5)})
    check(st == 416 and b"RANGE_NOT_SATISFIABLE" in body and
          hd.get("content-range") == "bytes */%d" % n, "416: %s %s" % (st, hd))
    st, hd, body = c.raw("GET", art_path(jid, big), headers={"If-None-Match": '"%s"' % sha(data)})
    check(st == 304 and body == b"", "If-None-Match: %s" % st)
    for p in ("export/hf/evil", "export/hf/../../../../../etc/passwd", "spec.json",
              "checkpoints/.tmp.step_00000099/rank_00000.bin", "export/hf/%2e%2e/%2e%2e/x",
              "export/hf/nope"):
        st, hd, body = c.raw("GET", "/v1/jobs/%s/artifacts/%s" % (jid, p))
        check(st == 404 and b"ARTIFACT_NOT_FOUND" in body, "%s: %s %s" % (p, st, body))
    # Isolation.
    _, tok_b = c.new_tenant("node-b")
    for p in ("/v1/jobs/%s/artifacts" % jid, art_path(jid, big)):
        st, hd, body = c.raw("GET", p, token=tok_b)
        check(st == 404 and b"JOB_NOT_FOUND" in body, "tenant B %s: %s" % (p, st))
    # The agent's own route: its token only, confined to the job directory.
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(c.tmp, "loomd", "loom.db"), uri=True)
    url, tok = db.execute("SELECT artifact_url, artifact_token FROM nodes WHERE name = "
                          "'node-1'").fetchone()
    db.close()
    check(url.startswith("http://127.0.0.1:") and len(tok) == 64, "registered: %s" % url)
    port = int(url.rsplit(":", 1)[1])

    def agent_get(path, token):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", path, headers={"Authorization": "Bearer " + token} if token else {})
        r = conn.getresponse()
        body = r.read()
        conn.close()
        return r.status, body

    st, body = agent_get("/v1/node/artifacts/%s/%s" % (jid, big), tok)
    check(st == 200 and body == data, "the agent serves its token's bearer: %s" % st)
    for token in (None, JOIN_TOKEN, tok[:-1] + ("0" if tok[-1] != "0" else "1")):
        st, body = agent_get("/v1/node/artifacts/%s/%s" % (jid, big), token)
        check(st == 401, "agent refuses token %r: %s" % (token, st))
    for p in ("%s/../../node-1/x" % jid, "%s/export/hf/evil" % jid, "..", "../%s" % jid,
              "%s/export/hf/%%2e%%2e/%%2e%%2e/%%2e%%2e/etc/passwd" % jid, "j-nope/x", "%s//x" % jid):
        st, body = agent_get("/v1/node/artifacts/" + p, tok)
        check(st == 404, "agent confines %s: %s %s" % (p, st, body[:100]))
    # Deletes of node-local artifacts: loomd tells the agent, which deletes
    # inside the job directory only.
    for p in ("export/hf/../../../x", "spec.json", "export/hf/nope", "export/hf/evil",
              "checkpoints/.tmp.step_00000099"):
        st, hd, body = c.raw("DELETE", "/v1/jobs/%s/artifacts/%s" % (jid, p))
        check(st == 404, "node delete confined %s: %s %s" % (p, st, body[:200]))
    check(os.path.exists("/etc/passwd") and os.path.islink(os.path.join(local, "export/hf/evil")),
          "nothing outside (or not an artifact) was deleted")
    st, hd, body = c.raw("DELETE", art_path(jid, "checkpoints/step_00000002"), token=tok_b)
    check(st == 404 and b"JOB_NOT_FOUND" in body, "tenant B's node delete: %s" % st)
    check(os.path.isdir(os.path.join(local, "checkpoints/step_00000002")), "B deleted nothing")
    st, hd, body = c.raw("DELETE", art_path(jid, "checkpoints/step_00000002/rank_00000.bin"))
    check(st == 409 and b"ARTIFACT_IN_CHECKPOINT" in body, "node delete of one shard: %s" % body)
    st, hd, body = c.raw("DELETE", art_path(jid, "checkpoints/step_00000002"))
    check(st == 200 and not os.path.exists(os.path.join(local, "checkpoints/step_00000002")) and
          os.path.isdir(os.path.join(local, "checkpoints/step_00000004")),
          "node delete of a checkpoint step: %s %s" % (st, body))
    st, hd, body = c.raw("DELETE", art_path(jid, "export/lora/adapter_config.json"))
    check(st == 200 and not os.path.exists(os.path.join(local, "export/lora/adapter_config.json"))
          and os.path.exists(os.path.join(local, "export/lora/adapter_model.safetensors")),
          "node delete of an export file: %s" % st)
    st, r = c.get("/v1/jobs/%s/artifacts" % jid)
    left = {i["path"] for i in r["items"]}
    check(not [p for p in left if p.startswith("checkpoints/step_00000002/")] and
          "export/lora/adapter_config.json" not in left and big in left,
          "listing after node deletes: %s" % sorted(left))
    st, hd, body = c.raw("DELETE", art_path(jid, "checkpoints/step_00000002"))
    check(st == 404, "node delete twice: %s" % st)
    st, r = c.get("/v1/audit?limit=1000", token=ADMIN)
    dels = [e for e in r["items"] if e.get("method") == "DELETE" and jid in e.get("path", "")]
    check(len(dels) >= 3 and any(e.get("status") == 200 for e in dels),
          "node deletes are audited: %s" % dels[:3])
    # The agent's DELETE is confined too (its own token).
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("DELETE", "/v1/node/artifacts/%s/../x" % jid,
                 headers={"Authorization": "Bearer " + tok})
    r2 = conn.getresponse()
    r2.read()
    conn.close()
    check(r2.status == 404, "agent DELETE with '..': %s" % r2.status)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("DELETE", "/v1/node/artifacts/%s/%s" % (jid, big))
    r2 = conn.getresponse()
    r2.read()
    conn.close()
    check(r2.status == 401 and os.path.exists(os.path.join(local, big)),
          "agent DELETE without the token: %s" % r2.status)
    # A registration with a bad artifact server is refused.
    st, r = c.request("POST", "/v1/agent/register",
                      {"node": "node-x", "kind": "cpu", "devices": [],
                       "artifacts": {"url": "ftp://x", "token": "t" * 40}}, token=JOIN_TOKEN)
    check(st == 400 and code_of(r) == "INVALID_ARTIFACT_SERVER", "bad register: %s %s" % (st, r))


class StrictStream:
    """One SSE stream read the way a client library reads it: HTTP/1.1 through
    http.client (which decodes the chunked framing strictly and fails on a
    bad chunk), or HTTP/1.0 over a plain socket (the raw body)."""

    def __init__(self, c, token, query="", http10=False):
        self.events, self.http10, self.buf = [], http10, b""
        path = "/v1/events" + query
        if http10:
            self.s = socket.create_connection(("127.0.0.1", c.port), timeout=15)
            self.s.sendall(("GET %s HTTP/1.0\r\nAuthorization: Bearer %s\r\n"
                            "Accept: text/event-stream\r\n\r\n" % (path, token)).encode())
            while b"\r\n\r\n" not in self.buf:
                chunk = self.s.recv(65536)
                check(chunk, "HTTP/1.0 stream: reply head")
                self.buf += chunk
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            check(head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200"),
                  "HTTP/1.0 stream: %s" % head[:100])
            check(b"chunked" not in head.lower(), "no chunked framing to HTTP/1.0: %s" % head)
        else:
            self.conn = http.client.HTTPConnection("127.0.0.1", c.port, timeout=15)
            self.conn.request("GET", path, headers={"Authorization": "Bearer " + token,
                                                    "Accept": "text/event-stream"})
            self.r = self.conn.getresponse()
            check(self.r.status == 200 and self.r.chunked, "HTTP/1.1 stream: %s chunked=%s" %
                  (self.r.status, self.r.chunked))

    def line(self):
        if not self.http10:
            return self.r.readline()
        while b"\n" not in self.buf:
            chunk = self.s.recv(65536)
            if not chunk:
                return b""
            self.buf += chunk
        ln, self.buf = self.buf.split(b"\n", 1)
        return ln + b"\n"

    def read_until(self, n):
        """Reads frames until n events arrived; every line must be SSE."""
        cur = {}
        while len(self.events) < n:
            ln = self.line()
            check(ln, "stream ended after %d of %d events" % (len(self.events), n))
            ln = ln.decode().rstrip("\n")
            if ln == "":
                if "id" in cur:
                    self.events.append(cur)
                cur = {}
            elif ln.startswith(":"):
                continue
            else:
                k, _, v = ln.partition(": ")
                check(k in ("id", "event", "data", "retry"), "an SSE line: %r" % ln)
                cur[k] = v
        return self.events

    def close(self):
        (self.s if self.http10 else self.conn).close()


def sc_sse_fanout(c):
    """Streams written by the fan-out thread (daemon/api_events.c): many at
    once, HTTP/1.1 (chunked, decoded strictly) and HTTP/1.0 (raw), with tenant
    and type scoping; each gets exactly its events in order; closed streams
    are released at once (GET /v1/system/connections)."""
    _, tok_b = c.new_tenant("fan-b")
    plan = ([("a", "", False)] * 12 + [("a", "?type=job.succeeded", False)] * 4 +
            [("b", "", False)] * 4 + [("a", "", True)] * 3 + [("b", "?type=job.queued", True)] * 2)
    streams = [StrictStream(c, c.token if who == "a" else tok_b, q, h10) for who, q, h10 in plan]

    def held():
        st, r = c.get("/v1/system/connections", token=ADMIN)
        check(st == 200, "connections: %s %s" % (st, r))
        return r["streams"]["fanout"], r["streams"]["open"]
    c.wait(lambda: held()[0] == len(plan), 10, "all %d streams held by the fan-out" % len(plan))
    ja = [c.submit(world=1, steps=2, step_ms=20) for _ in range(2)]
    jb = c.submit(world=1, steps=2, step_ms=20, token=tok_b)
    for j in ja:
        c.wait_state(j, "succeeded", 30)
    c.wait_state(jb, "succeeded", 30, token=tok_b)
    truth = {"a": c.all_events(), "b": c.all_events(tok_b)}
    check({e["job_id"] for e in truth["a"]} == set(ja) and
          {e["job_id"] for e in truth["b"]} == {jb}, "pages scoped by tenant")
    for (who, q, h10), s in zip(plan, streams):
        want = [e for e in truth[who] if "type=" not in q or e["type"] == q.split("=")[1]]
        got = s.read_until(len(want))
        check([int(e["id"]) for e in got] == [e["seq"] for e in want] and
              [json.loads(e["data"]) for e in got] == want and
              [e["event"] for e in got] == [e["type"] for e in want],
              "stream %s%s (%s): %s vs %s" % (who, q, "1.0" if h10 else "1.1",
                                              [e["id"] for e in got], [e["seq"] for e in want]))
    # A live event after the backlog, on every tenant-a stream without a filter.
    jl = c.submit(world=1, steps=1, step_ms=10)
    for (who, q, h10), s in zip(plan, streams):
        if who == "a" and not q:
            n = len(s.events)
            got = s.read_until(n + 1)[n]
            check(json.loads(got["data"])["job_id"] == jl, "live event: %s" % got)
    for s in streams:
        s.close()
    c.wait(lambda: held() == (0, 0), 5, "closed streams released (fanout, open): %s" % (held(),))


def sc_agent_foreign(c):
    """A node may post logs and metric records only for a task placed on it
    (daemon/agent_api.c): two approved agents, a job on one of them; the
    other's posts are refused with 403 TASK_NOT_ON_NODE and change nothing,
    while the job runs (live placement) and after it ended (the attempts
    row); the holder's own posts are accepted."""
    jid = c.submit(world=1, steps=30, step_ms=100)
    j = c.wait_state(jid, "running", 30)
    holder = j["placement"][0]["node"]
    other = "node-2" if holder == "node-1" else "node-1"
    att = j["attempt"]

    def cred(name):
        path = os.path.join(c.tmp, name, "node.credential")
        c.wait(lambda: os.path.exists(path), 10, "%s's node.credential" % name)
        with open(path) as f:
            return f.read().strip()
    creds = {holder: cred(holder), other: cred(other)}
    marker = "FOREIGN-LOG-LINE-%s\n" % jid

    def post_log(name, attempt=None, rank=0, offset=0, data=marker, node=None):
        attempt = att if attempt is None else attempt
        return c.request("POST", "/v1/agent/logs",
                         {"node": node or name, "job": jid, "attempt": attempt, "rank": rank,
                          "stream": "stdout", "offset": offset, "data": data}, token=creds[name])

    def post_metric(name, attempt=None, rank=0, step=999999):
        attempt = att if attempt is None else attempt
        return c.request("POST", "/v1/agent/metrics",
                         {"node": name, "items": [{"job": jid, "attempt": attempt, "rank": rank,
                                                   "record": {"type": "step", "step": step,
                                                              "loss": 0.0}}]},
                         token=creds[name])

    def logs_text():
        st, hd, body = c.raw("GET", "/v1/jobs/%s/logs?rank=0" % jid)
        check(st == 200, "logs: %s %s" % (st, body[:200]))
        return body.decode(errors="replace")

    def metric_steps():
        st, r = c.get("/v1/jobs/%s/metrics" % jid)
        check(st == 200 and isinstance(r.get("series"), list), "metrics: %s %s" % (st, r))
        return [m.get("step") for m in r["series"]]

    def refused(label):
        for what, (st, r) in (("log", post_log(other)), ("metric", post_metric(other)),
                              ("log, other attempt", post_log(other, attempt=7)),
                              ("log, other rank", post_log(other, rank=3))):
            check(st == 403 and code_of(r) == "TASK_NOT_ON_NODE" and jid in
                  r["error"]["message"], "%s: %s from %s: %s %s" % (label, what, other, st, r))
        check(marker not in logs_text(), "%s: the foreign log line is not stored" % label)
        check(999999 not in metric_steps(), "%s: the foreign step record is not stored" % label)
        # The holder's own posts pass the check (an offset past loomd's copy
        # writes nothing, so the agent's own shipping is left intact).
        st, r = post_log(holder, offset=1 << 40)
        check(st == 200 and "size" in r, "%s: the holder's log post: %s %s" % (label, st, r))
        st, r = c.request("POST", "/v1/agent/metrics", {"node": holder, "items": []},
                          token=creds[holder])
        check(st == 200, "%s: the holder's metrics post: %s %s" % (label, st, r))
        # A credential still speaks only for its own node.
        st, r = post_log(other, node=holder)
        check(st == 403 and code_of(r) == "NODE_MISMATCH", "%s: mismatch: %s %s" % (label, st, r))

    refused("running")
    c.wait_state(jid, "succeeded", 60)
    refused("after the end")
    steps = metric_steps()
    check(steps and max(steps) == 30, "the holder's own step records are stored: %s" % steps[-3:])


def sc_metrics_auth(c):
    """GET /metrics: no token gets the aggregate view (no job or tenant
    label, no job id anywhere), a tenant token 403, an unknown token 401,
    the admin token and a 'metrics' token of the admin tenant everything;
    a 'metrics' token can do nothing else and only the admin tenant may
    hold one."""
    jid = c.submit(world=1, steps=40, step_ms=100)
    c.wait_state(jid, "running", 30)
    per_job = 'loom_job_tokens_per_second{job="%s"}' % jid

    def scrape(token):
        st, hd, body = c.raw("GET", "/metrics", token=token)
        return st, body.decode(errors="replace")
    c.wait(lambda: per_job in scrape(ADMIN)[1], 15, "the per-job series for the admin token")
    st, full = scrape(ADMIN)
    check(st == 200 and 'loom_jobs{tenant="' in full, "admin: full view")
    st, anon = scrape(None)
    check(st == 200, "no token: %s" % st)
    check(jid not in anon and c.tenant not in anon, "no token: no job or tenant id")
    check(not re.search(r'[{,](job|job_id|tenant|tenant_id)="', anon),
          "no token: no job/tenant labels: %s" %
          [ln for ln in anon.splitlines() if "job" in ln or "tenant" in ln][:5])
    for fam in ("loom_http_requests_total{", 'loom_jobs_by_state{state="running"} 1',
                "loom_store_commit_seconds_bucket", 'loom_nodes{state="ready"} 1'):
        check(fam in anon, "no token: the aggregate %s stays" % fam)
    kept = [ln for ln in full.splitlines()
            if not re.search(r'[{,](job|job_id|tenant|tenant_id)="', ln)]
    check(len(kept) > 20 and len(anon.splitlines()) > 20, "aggregate is not empty")
    st, body = scrape(c.token)
    check(st == 403 and '"FORBIDDEN"' in body and jid not in body, "tenant token: %s %s" %
          (st, body[:200]))
    st, body = scrape("loom_" + "0" * 64)
    check(st == 401 and "UNAUTHORIZED" in body, "unknown token: %s %s" % (st, body[:200]))
    # A metrics-only token of the admin tenant.
    st, t = c.request("POST", "/v1/tenants", {"name": "admin"}, token=ADMIN)
    check(st in (200, 201), "admin tenant: %s %s" % (st, t))
    st, k = c.request("POST", "/v1/tenants/%s/tokens" % t["id"],
                      {"name": "prometheus", "scopes": ["metrics"]}, token=ADMIN)
    check(st in (200, 201) and k["scopes"] == ["metrics"], "metrics token: %s %s" % (st, k))
    st, body = scrape(k["token"])
    check(st == 200 and per_job in body, "metrics token: full view (%s)" % st)
    for method, path in (("GET", "/v1/jobs"), ("GET", "/v1/nodes"), ("GET", "/v1/audit")):
        st, r = c.request(method, path, token=k["token"])
        check(st == 403, "metrics token on %s %s: %s %s" % (method, path, st, r))
    tb, _ = c.new_tenant("metrics-b")
    st, r = c.request("POST", "/v1/tenants/%s/tokens" % tb, {"scopes": ["metrics"]}, token=ADMIN)
    check(st == 422 and code_of(r) == "INVALID_FIELD" and "metrics" in r["error"]["message"],
          "metrics scope on a tenant other than admin: %s %s" % (st, r))
    st, r = c.request("POST", "/v1/tenants/%s/tokens" % tb, {"scopes": ["metric"]}, token=ADMIN)
    check(st in (400, 422), "an unknown scope name: %s %s" % (st, r))


class PrivateMetricsCluster(Cluster):
    extra = Cluster.extra + ["--metrics-anonymous", "false"]


def sc_metrics_private(c):
    """--metrics-anonymous false: no token gets 401, the admin token 200."""
    st, hd, body = c.raw("GET", "/metrics", token=None)
    check(st == 401 and b"UNAUTHORIZED" in body and hd.get("www-authenticate") == "Bearer",
          "no token: %s %s %s" % (st, hd, body[:200]))
    st, hd, body = c.raw("GET", "/metrics", token=ADMIN)
    check(st == 200 and b"loom_http_requests_total" in body, "admin: %s" % st)
    st, hd, body = c.raw("GET", "/healthz", token=None)
    check(st == 200, "healthz still needs no token: %s" % st)


def sc_artifact_ttl(c, node_local):
    """Retention: a tenant with artifact_ttl_s 2 loses a finished job's
    checkpoints and exports (on the node's disk through the agent, or on
    shared storage) with an artifacts.expired event; logs stay; a tenant on
    the cluster default (--artifact-ttl 3600 here) and one with 0 keep
    theirs; bad values are refused and change nothing."""
    _, tok_b = c.new_tenant("ttl-default")
    tc_id, tok_c = c.new_tenant("ttl-never")
    st, r = c.request("PATCH", "/v1/tenants/%s" % c.tenant, {"artifact_ttl_s": 2}, token=ADMIN)
    check(st == 200 and r["artifact_ttl_s"] == 2, "set a tenant TTL: %s %s" % (st, r))
    st, r = c.request("PATCH", "/v1/tenants/%s" % tc_id, {"artifact_ttl_s": 0}, token=ADMIN)
    check(st == 200 and r["artifact_ttl_s"] == 0, "TTL 0: %s %s" % (st, r))
    for bad in (-1, "2", 1.5, 10 ** 10):
        st, r = c.request("PATCH", "/v1/tenants/%s" % c.tenant, {"artifact_ttl_s": bad},
                          token=ADMIN)
        check(st == 422 and code_of(r) == "INVALID_FIELD" and "artifact_ttl_s" in
              r["error"]["message"], "bad TTL %r: %s %s" % (bad, st, r))
    st, r = c.request("PATCH", "/v1/tenants/%s" % c.tenant, {"artifact_ttl_s": 2}, token=c.token)
    check(st in (401, 403), "a tenant cannot set its own TTL: %s" % st)
    st, r = c.get("/v1/tenants/%s" % c.tenant, token=ADMIN)
    check(r["artifact_ttl_s"] == 2, "unchanged by the refusals: %s" % r)
    jobs = {}
    for who, tok in (("a", "tenant"), ("b", tok_b), ("c", tok_c)):
        jobs[who] = (c.submit(world=1, steps=4, step_ms=20, ckpt=2, labels={"fake_artifacts": "1"},
                              token=tok), tok)
    for j, tok in jobs.values():
        c.wait_state(j, "succeeded", 30, token=tok)

    def where(j, tok):
        if node_local:
            return os.path.join(c.tmp, "node-1-jobs", j)
        return c.get("/v1/jobs/%s" % j, token=tok)[1]["out_dir"]

    def kinds(j, tok):
        st, r = c.get("/v1/jobs/%s/artifacts" % j, token=tok)
        check(st == 200, "list: %s %s" % (st, r))
        return {i["kind"] for i in r["items"]}
    ja, _ = jobs["a"]
    check({"checkpoint", "model", "adapter"} <= kinds(ja, "tenant"), "artifacts before the TTL")
    c.wait(lambda: "artifacts.expired" in event_types(c, ja), 15, "artifacts.expired for A")
    ev = [e for e in c.all_events(query="&job=" + ja) if e["type"] == "artifacts.expired"]
    check(len(ev) == 1 and ev[0]["data"]["ttl_s"] == 2 and
          sorted(ev[0]["data"]["paths"]) == ["checkpoints", "export"], "the event: %s" % ev)
    d = where(ja, "tenant")
    check(not os.path.exists(os.path.join(d, "checkpoints")) and
          not os.path.exists(os.path.join(d, "export")), "A's files are gone from %s" % d)
    check(kinds(ja, "tenant") <= {"log"}, "A lists only logs now: %s" % kinds(ja, "tenant"))
    time.sleep(2.5)  # more sweeps: nothing else goes, no second event
    ev2 = [e for e in c.all_events(query="&job=" + ja) if e["type"] == "artifacts.expired"]
    check(len(ev2) == 1, "one event only: %s" % ev2)
    for who in ("b", "c"):
        j, tok = jobs[who]
        check({"checkpoint", "model", "adapter"} <= kinds(j, tok),
              "tenant %s keeps its artifacts: %s" % (who, kinds(j, tok)))
        check(os.path.isdir(os.path.join(where(j, tok), "checkpoints")), "%s's files stay" % who)
        check("artifacts.expired" not in event_types(c, j, token=tok), "no event for " + who)
    # Back to the default: null.
    st, r = c.request("PATCH", "/v1/tenants/%s" % c.tenant, {"artifact_ttl_s": None}, token=ADMIN)
    check(st == 200 and r["artifact_ttl_s"] is None, "TTL back to the default: %s %s" % (st, r))


class TimeoutHookCluster(Cluster):
    extra = Cluster.extra + ["--webhook-timeout", "1"]


class SlowHookCluster(Cluster):
    extra = Cluster.extra + ["--webhook-inflight-hook", "2"]


class PoolCluster(Cluster):
    extra = Cluster.extra + ["--events-fanout-threads", "3"]


class TTLCluster(Cluster):
    extra = Cluster.extra + ["--artifact-ttl", "3600", "--artifact-sweep", "1"]


class TTLNodeCluster(NodeLocalCluster):
    extra = Cluster.extra + ["--artifact-ttl", "3600", "--artifact-sweep", "1"]


SCENARIOS = {
    "events": (sc_events, {}),
    "sse": (sc_sse, {"nodes": 1}),
    "sse_fanout": (sc_sse_fanout, {"nodes": 1}),
    "agent_foreign": (sc_agent_foreign, {"nodes": 2, "devices": 1}),
    "metrics_auth": (sc_metrics_auth, {"nodes": 1}),
    "webhooks": (sc_webhooks, {"nodes": 1}),
    "webhook_crash": (sc_webhook_crash, {"nodes": 0}),
    "webhook_stop": (sc_webhook_stop, {"nodes": 0}),
    "artifacts": (sc_artifacts, {"nodes": 1}),
    "event_ring": (sc_event_ring, {"nodes": 0}),
    "cli_wait": (sc_cli_wait, {"nodes": 1}),
    "artifacts_node": (sc_artifacts_node, {"nodes": 1}),
}


class PlainCluster(Cluster):
    extra = []


class RingCluster(Cluster):
    extra = Cluster.extra + ["--events-ring", "16"]


def main():
    for b in ("loomd", "loom-agent", "fake_worker", "loomctl"):
        if not os.access(os.path.join(BIN, b), os.X_OK):
            print("SKIP: %s not built" % b)
            return 77
    name = tc.SCENARIO
    if name == "webhook_connect_check":
        fn, kw, cls = sc_webhook_connect_check, {"nodes": 0}, Cluster
    elif name == "webhook_private":
        fn, kw, cls = sc_webhook_private, {"nodes": 0}, PlainCluster
    elif name == "artifacts_node":
        fn, kw, cls = sc_artifacts_node, {"nodes": 1}, NodeLocalCluster
    elif name in ("artifact_ttl", "artifact_ttl_node"):
        node_local = name == "artifact_ttl_node"
        fn, kw = (lambda c: sc_artifact_ttl(c, node_local)), {"nodes": 1}
        cls = TTLNodeCluster if node_local else TTLCluster
    elif name == "webhook_timeout":
        fn, kw, cls = sc_webhook_timeout, {"nodes": 0}, TimeoutHookCluster
    elif name == "webhook_slow":
        fn, kw, cls = sc_webhook_slow, {"nodes": 0}, SlowHookCluster
    elif name == "sse_fanout_pool":
        fn, kw, cls = sc_sse_fanout, {"nodes": 1}, PoolCluster
    elif name == "metrics_private":
        fn, kw, cls = sc_metrics_private, {"nodes": 0}, PrivateMetricsCluster
    elif name == "event_ring":
        fn, kw, cls = sc_event_ring, {"nodes": 0}, RingCluster
    else:
        (fn, kw), cls = SCENARIOS[name], Cluster
    c = cls(**kw)
    ok = False
    try:
        fn(c)
        ok = True
        print("PASS", name)
        return 0
    except Fail as e:
        print("FAIL %s: %s" % (name, e))
        return 1
    except Exception:
        import traceback
        traceback.print_exc()
        print("FAIL %s: exception" % name)
        return 1
    finally:
        c.close(ok)


if __name__ == "__main__":
    sys.exit(main())
