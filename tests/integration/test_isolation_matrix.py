#!/usr/bin/env python3
"""The tenant isolation matrix: every route of loomd's route table, read from
daemon/routes.c, is called with tenant B's token against tenant A's objects
(job, logs, metrics, events, artifacts, webhook, usage, tokens, nodes).

Each route has one row in MATRIX saying what B must get:
  foreign  404 for A's object (reads and writes alike), A's object unchanged
  admin    403 (an admin route; B's token is a tenant token)
  list     200 whose body names none of A's ids (jobs, webhook, tenant, token)
  create   B's own object is made (2xx) and the reply names none of A's ids
  shared   200, cluster-wide data (nodes, node checks, prices): no job id of A
  agent    401 (agent routes take a node credential, never a tenant token)
  bearer   403 (rendezvous and staging take the attempt's token)
  public   200 without a token (health, Prometheus, the web view's files)
The test fails when a route has no row, or a row no route: a new route needs
its row here. Afterwards A still sees its objects as before.

Runs a real loomd and one loom-agent (tests/fake_worker), reusing the
Cluster helper of test_cluster.py. Usage: test_isolation_matrix.py BIN_DIR
SOURCE_DIR. Exit 0 pass, 1 fail, 77 skip."""
import json
import os
import re
import sys
import urllib.parse

SRC = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else \
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.argv = sys.argv[:2] + ["isolation"]  # test_cluster reads BIN_DIR SCENARIO
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_cluster as tc  # noqa: E402

ADMIN = tc.ADMIN
check = tc.check

# (method, pattern) -> (kind, concrete path with {job} {array} {hook} {tenant}
# {token} {node} {check} {art} of tenant A's objects, body or None)
MATRIX = {
    ("GET", "/healthz"): ("public", "/healthz", None),
    ("GET", "/metrics"): ("public", "/metrics", None),
    ("GET", "/ui"): ("public", "/ui", None),
    ("GET", "/ui/{file}"): ("public", "/ui/app.js", None),
    ("GET", "/v1/system/connections"): ("admin", "/v1/system/connections", None),
    ("POST", "/v1/tenants"): ("admin", "/v1/tenants", {"name": "b-made"}),
    ("GET", "/v1/tenants"): ("admin", "/v1/tenants", None),
    ("GET", "/v1/tenants/{id}"): ("admin", "/v1/tenants/{tenant}", None),
    ("PATCH", "/v1/tenants/{id}"): ("admin", "/v1/tenants/{tenant}", {"gpu_quota": 1}),
    ("POST", "/v1/tenants/{id}/tokens"): ("admin", "/v1/tenants/{tenant}/tokens", {}),
    ("GET", "/v1/tenants/{id}/tokens"): ("admin", "/v1/tenants/{tenant}/tokens", None),
    ("DELETE", "/v1/tenants/{id}/tokens/{tid}"):
        ("admin", "/v1/tenants/{tenant}/tokens/{token}", None),
    ("POST", "/v1/tenants/{id}/tokens/{tid}/rotate"):
        ("admin", "/v1/tenants/{tenant}/tokens/{token}/rotate", {}),
    ("GET", "/v1/audit"): ("admin", "/v1/audit", None),
    ("POST", "/v1/jobs"): ("create", "/v1/jobs", "SPEC"),
    ("GET", "/v1/jobs"): ("list", "/v1/jobs?limit=1000", None),
    ("GET", "/v1/jobs/{id}"): ("foreign", "/v1/jobs/{job}", None),
    ("POST", "/v1/jobs/{id}/cancel"): ("foreign", "/v1/jobs/{job}/cancel", None),
    ("POST", "/v1/arrays/{id}/cancel"): ("foreign", "/v1/arrays/{array}/cancel", None),
    ("GET", "/v1/jobs/{id}/events"): ("foreign", "/v1/jobs/{job}/events", None),
    ("POST", "/v1/plan"): ("create", "/v1/plan", "SPEC"),
    ("GET", "/v1/jobs/{id}/logs"): ("foreign", "/v1/jobs/{job}/logs?rank=0", None),
    ("GET", "/v1/jobs/{id}/metrics"): ("foreign", "/v1/jobs/{job}/metrics", None),
    ("GET", "/v1/nodes"): ("shared", "/v1/nodes", None),
    ("GET", "/v1/nodes/{id}"): ("shared", "/v1/nodes/{node}", None),
    ("DELETE", "/v1/nodes/{id}"): ("admin", "/v1/nodes/{node}", None),
    ("PATCH", "/v1/nodes/{id}"): ("admin", "/v1/nodes/{node}", {"labels": {"zone": "eu"}}),
    ("POST", "/v1/nodes/{id}/drain"): ("admin", "/v1/nodes/{node}/drain", None),
    ("POST", "/v1/nodes/{id}/undrain"): ("admin", "/v1/nodes/{node}/undrain", None),
    ("POST", "/v1/nodes/{id}/approve"): ("admin", "/v1/nodes/{node}/approve", None),
    ("POST", "/v1/nodes/{id}/reject"): ("admin", "/v1/nodes/{node}/reject", None),
    ("GET", "/v1/usage"): ("list", "/v1/usage?group_by=job", None),
    ("PUT", "/v1/prices"): ("admin", "/v1/prices", {"items": []}),
    ("GET", "/v1/prices"): ("shared", "/v1/prices", None),
    ("POST", "/v1/agent/register"): ("agent", "/v1/agent/register",
                                     {"node": "b-node", "kind": "cpu", "devices": []}),
    ("POST", "/v1/agent/heartbeat"): ("agent", "/v1/agent/heartbeat", {"node": "{node}"}),
    ("GET", "/v1/agent/assignments"): ("agent", "/v1/agent/assignments?node={node}", None),
    ("POST", "/v1/agent/metrics"): ("agent", "/v1/agent/metrics", {"node": "{node}", "items": []}),
    ("POST", "/v1/agent/logs"): ("agent", "/v1/agent/logs", {"node": "{node}"}),
    ("PUT", "/v1/rdzv/{job}/{attempt}/{key}"): ("bearer", "/v1/rdzv/{job}/0/k", {"value": "YQ=="}),
    ("GET", "/v1/rdzv/{job}/{attempt}/{key}"): ("bearer", "/v1/rdzv/{job}/0/k", None),
    ("POST", "/v1/nodes/{id}/check"): ("admin", "/v1/nodes/{node}/check", None),
    ("DELETE", "/v1/nodes/{id}/degraded"): ("admin", "/v1/nodes/{node}/degraded", None),
    ("GET", "/v1/nodechecks"): ("shared", "/v1/nodechecks", None),
    ("GET", "/v1/nodechecks/{id}"): ("shared", "/v1/nodechecks/{check}", None),
    ("GET", "/v1/agent/checks"): ("agent", "/v1/agent/checks?node={node}", None),
    ("POST", "/v1/agent/checks/{id}"): ("agent", "/v1/agent/checks/{check}", {"node": "{node}"}),
    ("PUT", "/v1/nodechecks/{id}/rdzv/{key}"): ("bearer", "/v1/nodechecks/{check}/rdzv/k",
                                                {"value": "YQ=="}),
    ("GET", "/v1/nodechecks/{id}/rdzv/{key}"): ("bearer", "/v1/nodechecks/{check}/rdzv/k", None),
    ("POST", "/v1/jobs/{id}/staging"): ("bearer", "/v1/jobs/{job}/staging", {"attempt": 0}),
    ("GET", "/v1/events"): ("list", "/v1/events?limit=1000", None),
    ("POST", "/v1/webhooks"): ("create", "/v1/webhooks",
                               {"url": "http://127.0.0.1:9/b", "events": ["*"]}),
    ("GET", "/v1/webhooks"): ("list", "/v1/webhooks", None),
    ("GET", "/v1/webhooks/{id}"): ("foreign", "/v1/webhooks/{hook}", None),
    ("DELETE", "/v1/webhooks/{id}"): ("foreign", "/v1/webhooks/{hook}", None),
    ("GET", "/v1/webhooks/{id}/deliveries"): ("foreign", "/v1/webhooks/{hook}/deliveries", None),
    ("GET", "/v1/jobs/{id}/artifacts"): ("foreign", "/v1/jobs/{job}/artifacts", None),
    ("GET", "/v1/jobs/{id}/artifacts/{path*}"): ("foreign", "/v1/jobs/{job}/artifacts/{art}", None),
    ("DELETE", "/v1/jobs/{id}/artifacts/{path*}"):
        ("foreign", "/v1/jobs/{job}/artifacts/{art}", None),
}

EXPECT = {"foreign": (404,), "admin": (403,), "list": (200,), "create": (200, 201),
          "shared": (200,), "agent": (401,), "bearer": (403,), "public": (200,)}


def read_routes():
    """(method, pattern, auth) of every row of daemon/routes.c's table."""
    text = open(os.path.join(SRC, "daemon", "routes.c")).read()
    body = text[text.index("http_routes[] = {"):]
    body = body[:body.index("};")]
    rows = re.findall(r'\{\s*"([A-Z]+)",\s*"([^"]+)",\s*(HTTP_AUTH_[A-Z_]+),', body)
    check(len(rows) > 40, "only %d routes read from daemon/routes.c" % len(rows))
    return rows


def spec(c, name):
    return {"name": name,
            "model": {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 64, "d_ff": 256,
                      "vocab_size": 256, "seq_len": 32},
            "data": {"train": os.path.join(c.data, "train_000.bin")},
            "parallel": {"dp": 1, "tp": 1, "pp": 1},
            "train": {"steps": 4, "global_batch_tokens": 128, "micro_batch": 4,
                      "precision": "fp32"},
            "resources": {"device": "cpu", "gpus_per_node": 2}}


def fill(s, ids):
    for k, v in ids.items():
        s = s.replace("{%s}" % k, v)
    return s


def snapshot(c, ids, tok):
    """What A sees of its objects (compared before and after B's calls)."""
    out = {}
    for p in ("/v1/jobs/{job}", "/v1/jobs/{job}/events", "/v1/jobs/{job}/artifacts",
              "/v1/webhooks/{hook}", "/v1/jobs/{job}/metrics"):
        st, r = c.get(fill(p, ids), token=tok)
        check(st == 200, "A reads %s: %s %s" % (p, st, r))
        if isinstance(r, dict):
            r.pop("updated_at", None)
        out[p] = json.dumps(r, sort_keys=True)
    return out


def scenario(c):
    routes = read_routes()
    have = {(m, p) for m, p, _ in routes}
    missing = sorted(have - set(MATRIX))
    extra = sorted(set(MATRIX) - have)
    check(not missing, "routes without an isolation row (add them to MATRIX): %s" % missing)
    check(not extra, "MATRIX rows for routes that do not exist: %s" % extra)
    auth = {(m, p): a for m, p, a in routes}
    for key, (kind, _, _) in MATRIX.items():
        a = auth[key]
        want = {"admin": ("HTTP_AUTH_ADMIN",), "agent": ("HTTP_AUTH_JOIN", "HTTP_AUTH_NODE"),
                "bearer": ("HTTP_AUTH_BEARER",), "public": ("HTTP_AUTH_ANYONE",)}.get(kind)
        check(want is None or a in want, "%s %s: row %s, route auth %s" % (key + (kind, a)))
        check(kind in ("admin", "agent", "bearer", "public") or
              a in ("HTTP_AUTH_TENANT", "HTTP_AUTH_ANY_TOKEN"),
              "%s %s is %s but row says %s" % (key + (a, kind)))

    # Tenant A's objects: a finished job with logs, metrics, checkpoints and
    # exports, a webhook, a token, a node check on the node.
    st, ta = c.request("POST", "/v1/tenants", {"name": "tenant-a"}, token=ADMIN)
    check(st == 201, "tenant A: %s %s" % (st, ta))
    st, ka = c.request("POST", "/v1/tenants/%s/tokens" % ta["id"], {}, token=ADMIN)
    tok_a = ka["token"]
    tb, tok_b = c.new_tenant("tenant-b")
    sa = spec(c, "a-job")
    sa["checkpoint"] = {"every_steps": 2, "keep": 2}
    sa["labels"] = {"fake_artifacts": "1", "fake_step_ms": "30"}
    st, j = c.request("POST", "/v1/jobs", sa, token=tok_a)
    check(st == 201, "A submits: %s %s" % (st, j))
    job = j["id"]
    c.wait_state(job, "succeeded", 30, token=tok_a)
    st, h = c.request("POST", "/v1/webhooks", {"url": "http://127.0.0.1:9/a", "events": ["*"]},
                      token=tok_a)
    check(st == 201, "A's webhook: %s %s" % (st, h))
    st, arts = c.get("/v1/jobs/%s/artifacts" % job, token=tok_a)
    art = [i["path"] for i in arts["items"] if i["path"].startswith("checkpoints/")][0]
    st, ck = c.request("POST", "/v1/nodes/node-1/check", {"timeout_s": 5}, token=ADMIN)
    check(st in (200, 201, 202), "a node check: %s %s" % (st, ck))
    ids = {"job": job, "hook": h["id"], "tenant": ta["id"], "token": ka["id"], "node": "node-1",
           "check": ck["id"], "art": "/".join(urllib.parse.quote(p) for p in art.split("/"))}
    # A second job of A runs during B's calls: the nodes' views must not name it.
    c.wait(lambda: c.get("/v1/nodechecks/" + ck["id"], token=ADMIN)[1].get("state")
           not in ("queued", "running"), 30, "the node check to end")
    sr = spec(c, "a-running")
    sr["train"]["steps"] = 100000
    sr["labels"] = {"fake_step_ms": "50"}
    st, j = c.request("POST", "/v1/jobs", sr, token=tok_a)
    check(st == 201, "A submits a long job: %s %s" % (st, j))
    running = j["id"]
    c.wait_state(running, "running", 20, token=tok_a)
    c.wait(lambda: running in json.dumps(c.get("/v1/nodes", token=ADMIN)[1]), 10,
           "the admin's node view shows the running job")
    # And a job array of A whose members wait behind it (B's array cancel must not reach it).
    sa = spec(c, "a-array")
    sa["train"]["steps"] = 100000
    sa["array"] = {"train.lr": [1e-3, 2e-3]}
    st, arr = c.request("POST", "/v1/jobs", sa, token=tok_a)
    check(st == 201 and arr.get("array_id"), "A submits an array: %s %s" % (st, arr))
    ids["array"] = arr["array_id"]
    members = [m["id"] for m in arr["items"]]
    secrets = [job, running, h["id"], ta["id"], ka["id"], tok_a, arr["array_id"]] + members
    before = snapshot(c, ids, tok_a)

    counts = {}
    for (method, pattern), (kind, path, body) in sorted(MATRIX.items()):
        url = fill(path, ids)
        if body == "SPEC":
            body = spec(c, "b-job")
        elif isinstance(body, dict):
            body = json.loads(fill(json.dumps(body), ids))
        token = None if kind == "public" else tok_b
        st, r = c.request(method, url, body, token=token)
        what = "%s %s as tenant B (%s): %s %s" % (method, url, kind, st, str(r)[:300])
        check(st in EXPECT[kind], what)
        text = r if isinstance(r, str) else json.dumps(r)
        if kind in ("list", "create", "shared"):
            leaked = [s for s in secrets if s in text]
            check(not leaked, "%s names A's %s" % (what, leaked))
        if kind == "foreign":
            code = (r or {}).get("error", {}).get("code", "")
            check(code.endswith("NOT_FOUND"), "%s: a *NOT_FOUND code" % what)
        if kind == "public" and pattern == "/metrics":
            check(tok_a not in text, "the token never appears in /metrics")
        counts[kind] = counts.get(kind, 0) + 1

    after = snapshot(c, ids, tok_a)
    for p in before:
        check(before[p] == after[p], "A's %s changed under B's calls:\n%s\n%s" % (
            p, before[p][:300], after[p][:300]))
    st, r = c.get("/v1/jobs/%s/artifacts/%s" % (job, ids["art"]), token=tok_a)
    check(st == 200, "A still downloads its artifact: %s" % st)
    st, r = c.get("/v1/jobs?limit=1000", token=ADMIN)
    check(job in json.dumps(r), "the admin token sees A's job")
    st, r = c.get("/v1/jobs/" + running, token=tok_a)
    check(st == 200 and r["state"] == "running", "A's running job still runs: %s" % r)
    for m in members:
        st, r = c.get("/v1/jobs/" + m, token=tok_a)
        check(st == 200 and r["state"] not in ("cancelling", "cancelled"),
              "A's array member %s not cancelled: %s" % (m, r.get("state")))
    print("isolation matrix: %d routes, %s" % (len(MATRIX), ", ".join(
        "%s %d" % kv for kv in sorted(counts.items()))))


def main():
    for b in ("loomd", "loom-agent", "fake_worker"):
        if not os.access(os.path.join(tc.BIN, b), os.X_OK):
            print("SKIP: %s not built" % b)
            return 77
    c = tc.Cluster(nodes=1, devices=2, loomd_args=["--webhook-allow-private"])
    ok = False
    try:
        scenario(c)
        ok = True
        print("PASS isolation matrix")
        return 0
    except tc.Fail as e:
        print("FAIL isolation matrix: %s" % e)
        return 1
    finally:
        c.close(ok)


if __name__ == "__main__":
    sys.exit(main())
