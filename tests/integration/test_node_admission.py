#!/usr/bin/env python3
"""Node admission end to end: a real loomd without --auto-approve and real
loom-agents (tests/fake_worker as the worker).

- A node that registers with the join token is `pending`, gets its own
  credential (file node.credential, mode 0600) and no task; the join token
  and a pending credential are refused on the other agent routes.
- An admin approves it: the job that waited runs; a node.approved event and an
  audit row record who did it. A tenant cannot approve.
- The join token cannot take over an approved node's name; a credential
  cannot speak for another node.
- A tenant's GET /v1/nodes shows capacity and state, never job ids or task
  states; the admin's shows the tasks.
- DELETE (revoke) makes the old credential 401, the job's running ranks are
  retried elsewhere (lost-node handling), the agent applies again as pending.
- Reject: the node cannot apply again until deleted; approving it is 409.
- Admission survives a loomd restart, and the agent's credential still works.

Usage: test_node_admission.py BIN_DIR. Exit 0 pass, 1 fail, 77 skip."""
import os
import stat
import sys
import time

sys.argv = sys.argv[:2] + ["admission"]  # test_cluster reads BIN_DIR SCENARIO
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_cluster as tc  # noqa: E402

ADMIN, JOIN = tc.ADMIN, tc.JOIN


def code(r):
    return (r or {}).get("error", {}).get("code") if isinstance(r, dict) else None


def node(c, name, token=ADMIN):
    st, r = c.get("/v1/nodes/" + name, token=token)
    return r if st == 200 else {}


def cred_of(c, name):
    # the agent writes the file (atomically, by rename) after loomd's reply to its
    # registration, which is also when the node shows as pending: wait for it
    path = os.path.join(c.tmp, name, "node.credential")
    c.wait(lambda: os.path.exists(path), 10, "%s's node.credential" % name)
    with open(path) as f:
        tok = f.read().strip()
    mode = stat.S_IMODE(os.stat(path).st_mode)
    tc.check(mode == 0o600, "node.credential is mode 0600 (%o)" % mode)
    return tok


def hb(c, name, token):
    return c.request("POST", "/v1/agent/heartbeat", {"node": name, "devices": [], "tasks": []},
                     token=token)


def register(c, name, token):
    return c.request("POST", "/v1/agent/register",
                     {"node": name, "kind": "cpu", "hostname": name,
                      "devices": [{"index": 0, "name": "cpu"}]}, token=token)


def events_of(c, typ):
    st, r = c.get("/v1/events?limit=1000", token=ADMIN)
    tc.check(st == 200, "admin events: %s %s" % (st, r))
    return [e for e in r["items"] if e["type"] == typ]


def audit_rows(c, route, method):
    st, r = c.get("/v1/audit?limit=1000", token=ADMIN)
    tc.check(st == 200, "audit: %s %s" % (st, r))
    return [a for a in r["items"] if a["route"] == route and a["method"] == method]


def scenario(c):
    # ---- pending: a credential, no task ----
    c.start_agent("n1", 2)
    c.wait(lambda: node(c, "n1").get("state") == "pending", 10, "n1 pending")
    n1 = node(c, "n1")
    tc.check(n1["admission"] == "pending" and n1["devices_free"] == 0,
             "pending node offers no devices: %s" % n1)
    c1 = cred_of(c, "n1")
    tc.check(c1.startswith("loom_") and len(c1) == 69, "a loom_ credential was stored")
    jid = c.submit(world=2, steps=5, step_ms=50)
    time.sleep(2.0)
    j = c.job(jid)
    tc.check(j["state"] == "queued" and not c.workers(jid),
             "no task on a pending node: %s, workers %s" % (j["state"], c.workers(jid)))
    st, r = hb(c, "n1", JOIN)
    tc.check(st == 401 and code(r) == "UNAUTHORIZED", "join token on heartbeat: %s %s" % (st, r))
    st, r = c.get("/v1/agent/assignments?node=n1", token=c1)
    tc.check(st == 403 and code(r) == "NODE_NOT_APPROVED",
             "pending credential on assignments: %s %s" % (st, r))
    st, r = c.get("/v1/agent/assignments?node=n1", token=None)
    tc.check(st == 401, "no token on assignments: %s" % st)
    tc.check(events_of(c, "node.pending"), "a node.pending event")

    # ---- approve ----
    st, r = c.request("POST", "/v1/nodes/n1/approve", token="tenant")
    tc.check(st == 403, "a tenant cannot approve: %s %s" % (st, r))
    st, r = c.request("POST", "/v1/nodes/nothere/approve", token=ADMIN)
    tc.check(st == 404 and code(r) == "NODE_NOT_FOUND", "approve unknown: %s %s" % (st, r))
    t0 = time.time()
    st, r = c.request("POST", "/v1/nodes/n1/approve", token=ADMIN)
    tc.check(st == 200 and r["admission"] == "approved", "approve: %s %s" % (st, r))
    c.wait_state(jid, "succeeded", 20)
    print("approve -> job succeeded in %.2f s" % (time.time() - t0))
    st, r = c.request("POST", "/v1/nodes/n1/approve", token=ADMIN)
    tc.check(st == 200, "approving again is a no-op: %s %s" % (st, r))
    ev = events_of(c, "node.approved")
    tc.check(len(ev) == 1 and ev[0]["data"]["node"] == "n1" and ev[0]["data"]["by"] == "admin",
             "one node.approved event by admin: %s" % ev)
    rows = audit_rows(c, "/v1/nodes/{id}/approve", "POST")
    tc.check(any(a["object_id"] == "n1" and a["status"] == 200 and a["actor"] == "admin"
                 for a in rows), "audit row of the approval: %s" % rows)
    tc.check(any(a["status"] == 403 for a in rows), "the tenant's refused approval is audited")
    tc.check(hb(c, "n1", c1)[0] == 200, "the approved credential heartbeats")

    # ---- the join token cannot take over n1; a credential speaks for its node only ----
    st, r = register(c, "n1", JOIN)
    tc.check(st == 409 and code(r) == "NODE_CREDENTIAL_REQUIRED",
             "join token for an approved name: %s %s" % (st, r))
    c.start_agent("n2", 2)
    c.wait(lambda: node(c, "n2").get("state") == "pending", 10, "n2 pending")
    c2 = cred_of(c, "n2")
    st, r = hb(c, "n1", c2)
    tc.check(st == 403 and code(r) == "NODE_MISMATCH" or st == 403 and
             code(r) == "NODE_NOT_APPROVED", "n2's credential for n1: %s %s" % (st, r))
    st, r = c.request("POST", "/v1/nodes/n2/approve", token=ADMIN)
    tc.check(st == 200, "approve n2: %s" % st)
    st, r = hb(c, "n1", c2)
    tc.check(st == 403 and code(r) == "NODE_MISMATCH", "approved n2 as n1: %s %s" % (st, r))
    st, r = register(c, "n1", c2)
    tc.check(st == 403 and code(r) == "NODE_MISMATCH", "register n1 with n2's: %s %s" % (st, r))

    # ---- the tenant's view of nodes during a run ----
    other, other_tok = c.new_tenant("other")
    jid = c.submit(world=2, steps=400, step_ms=50, max_retries=2)
    j = c.wait_state(jid, "running", 15)
    c.wait(lambda: any(d.get("task") for n in c.nodes() for d in n["devices"]), 10,
           "admin sees the tasks")
    st, raw = c.request("GET", "/v1/nodes", token=other_tok)
    tc.check(st == 200, "tenant lists nodes: %s" % st)
    text = str(raw)
    tc.check(jid not in text and "running" not in text and "tasks" not in text,
             "another tenant's GET /v1/nodes names no job, task or task state: %s" % text[:400])
    for n in raw["nodes"]:
        tc.check({"state", "devices_total", "devices_free", "gpu_type"} <= set(n),
                 "capacity and state shown: %s" % sorted(n))
        tc.check(all(set(d) <= {"index", "name", "gpu_type", "mem_total_mib"}
                     for d in n["devices"]), "devices show capacity only: %s" % n["devices"])
    busy = j["placement"][0]["node"]
    st, r = c.get("/v1/nodes/" + busy, token=other_tok)
    tc.check(st == 200 and jid not in str(r), "GET /v1/nodes/{id} as a tenant: %s" % r)
    st, r = c.get("/v1/nodes/" + busy, token=ADMIN)
    tc.check(jid in str(r["tasks"]), "the admin sees the node's tasks")

    # ---- revoke the node that runs the job ----
    oldcred = cred_of(c, busy)
    t0 = time.time()
    st, r = c.request("DELETE", "/v1/nodes/" + busy, token=ADMIN)
    tc.check(st == 200 and r["state"] == "revoked", "revoke: %s %s" % (st, r))
    st, r = hb(c, busy, oldcred)
    tc.check(st == 401, "revoked credential: heartbeat %s %s" % (st, r))
    st, r = c.get("/v1/agent/assignments?node=" + busy, token=oldcred)
    tc.check(st == 401, "revoked credential: assignments %s" % st)
    c.wait(lambda: c.job(jid)["attempt"] >= 1, 15, "the revoked node's job retried")
    print("revoke -> job re-queued in %.2f s" % (time.time() - t0))
    j = c.wait_state(jid, "running", 20)
    tc.check(all(p["node"] != busy for p in j["placement"]), "re-placed off the revoked node")
    tc.check(events_of(c, "node.revoked"), "a node.revoked event")
    tc.check(audit_rows(c, "/v1/nodes/{id}", "DELETE"), "an audit row of the revocation")
    c.wait(lambda: node(c, busy).get("state") == "pending", 15, "the agent applies again")
    tc.check(cred_of(c, busy) != oldcred, "a new credential replaced the revoked one")
    st, r = c.request("POST", "/v1/jobs/%s/cancel" % jid, token="tenant")
    tc.check(st == 200, "cancel: %s" % st)

    # ---- reject ----
    st, r = c.request("POST", "/v1/nodes/%s/reject" % busy, token=ADMIN)
    tc.check(st == 200 and r["state"] == "rejected", "reject: %s %s" % (st, r))
    st, r = register(c, busy, JOIN)
    tc.check(st == 403 and code(r) == "NODE_REJECTED", "rejected applies again: %s %s" % (st, r))
    st, r = c.request("POST", "/v1/nodes/%s/approve" % busy, token=ADMIN)
    tc.check(st == 409 and code(r) == "NODE_NOT_PENDING", "approve rejected: %s %s" % (st, r))
    st, r = c.request("DELETE", "/v1/nodes/" + busy, token=ADMIN)
    tc.check(st == 200, "delete the rejected node: %s" % st)
    c.wait(lambda: node(c, busy).get("state") == "pending", 15, "deleted node applies again")

    # ---- restart: admission and credentials persist ----
    keep = "n1" if busy == "n2" else "n2"
    c.loomd.kill()
    c.loomd.wait()
    c.start_loomd()
    c.wait(lambda: node(c, keep).get("state") == "ready", 15, "%s ready after restart" % keep)
    tc.check(node(c, busy).get("state") == "pending", "still pending after restart")
    jid = c.submit(world=2, steps=5, step_ms=50)
    j = c.wait_state(jid, "succeeded", 20)
    tc.check(all(p["node"] == keep for p in j["placement"]), "runs on the approved node only")


def main():
    for b in ("loomd", "loom-agent", "fake_worker"):
        if not os.access(os.path.join(tc.BIN, b), os.X_OK):
            print("SKIP: %s not built" % b)
            return 77
    c = tc.Cluster(nodes=0, auto_approve=False)
    ok = False
    try:
        scenario(c)
        ok = True
        print("PASS node admission")
        return 0
    except tc.Fail as e:
        print("FAIL node admission: %s" % e)
        return 1
    finally:
        c.close(ok)


if __name__ == "__main__":
    sys.exit(main())
