#!/usr/bin/env python3
"""Node checks end to end: a real loomd and two loom-agents with 2 CPU devices
each on loopback; loom-agent runs loom-nodecheck (Gloo all-reduce through the
comm layer) for each check. Asserts:
  - `loomctl node check NODE` passes with a measured bus bandwidth, stored
    with its date (GET /v1/nodechecks?node=);
  - `loomctl node check --all` runs 2 node checks and 1 pair check, all pass;
  - an expectation far above the measurement marks the node degraded with a
    reason naming the numbers (exit code 4), /v1/nodes shows it, the scheduler
    places a 2-rank job on the healthy node only and a job needing both nodes
    waits; the mark survives a loomd restart;
  - a node running job ranks refuses a check (409 NODE_BUSY);
  - a part nobody picks up (agent stopped) fails the check at its timeout,
    without a mark;
  - the check rendezvous refuses other tokens (403);
  - with --nodecheck-on-join, a node that joins and was never checked gets a
    node check, already checked nodes do not;
  - `--clear` puts the node back to ready, and a passing check clears a mark.
Usage: ops_nodecheck.py BIN_DIR
Exit 0 pass, 1 fail, 77 skip."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from loomtest import Fail, daemon_env, http, wait_for  # noqa: E402

BIN = os.path.abspath(sys.argv[1])
ADMIN = "nc-admin"
JOIN = "nc-join"
# Small messages keep it quick; a low bar keeps a loaded CI machine from failing
# the checks meant to pass (the degraded cases set a huge expectation).
SMALL = ["--max-bytes", "262144"]
PASS = SMALL + ["--expect-busbw", "0.001"]


def check(cond, msg):
    if not cond:
        raise Fail(msg)


class Cluster:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="loom-nc-")
        self.env = daemon_env(LOOM_ADMIN_TOKEN=ADMIN, LOOM_JOIN_TOKEN=JOIN, OMP_NUM_THREADS="1")
        self.procs = {}
        self.log = open(os.path.join(self.tmp, "log"), "ab")
        try:
            self.start_loomd()
            for n in ("node-a", "node-b"):
                self.start_agent(n)
            self.wait(lambda: len([n for n in self.nodes() if n["state"] == "ready"]) == 2, 10,
                      "2 nodes ready")
        except Fail:
            self.close(keep=True)  # no process outlives a failed start
            raise

    def start_loomd(self, extra=()):
        dd = os.path.join(self.tmp, "loomd")
        addr = os.path.join(dd, "loomd.addr")
        if os.path.exists(addr):
            os.unlink(addr)
        self.procs["loomd"] = subprocess.Popen(
            [os.path.join(BIN, "loomd"), "--auto-approve", "--listen", getattr(self, "listen", "127.0.0.1:0"),
             "--data-dir", dd, "--heartbeat", "1", "--store-sync-full", "false"] + list(extra),
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = self.wait(lambda: open(addr).read().strip(), 10, "loomd.addr")
        self.listen = self.url.replace("http://", "")

    def start_agent(self, n):
        self.procs[n] = subprocess.Popen(
            [os.path.join(BIN, "loom-agent"), "--coordinator", self.url, "--name", n,
             "--work-dir", os.path.join(self.tmp, n), "--cpu-devices", "2", "--worker",
             os.path.join(BIN, "fake_worker"), "--heartbeat-ms", "300",
             "--stop-grace-ms", "500", "--retry-max-ms", "300"],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait(self, fn, secs, what):
        return wait_for(fn, secs, what, errors=(OSError, ValueError, KeyError, TypeError),
                        last=True)

    def call(self, method, path, body=None, token=ADMIN):
        return http(self.url + path, method, body, token)

    def nodes(self):
        st, r = self.call("GET", "/v1/nodes")
        return r["nodes"] if st == 200 else []

    def node(self, name):
        return [n for n in self.nodes() if n["name"] == name][0]

    def loomctl(self, *args):
        env = dict(self.env, LOOM_URL=self.url, LOOM_TOKEN=ADMIN)
        p = subprocess.run([os.path.join(BIN, "loomctl")] + list(args), env=env,
                           capture_output=True, text=True, timeout=120)
        return p.returncode, p.stdout + p.stderr

    def close(self, keep):
        """Stops everything; returns the names that did not exit 0 on SIGTERM
        (a sanitizer build aborts on a leak or UB at exit)."""
        bad = []
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in self.procs.items():
            try:
                if p.wait(15) != 0:
                    bad.append("%s exited %d" % (name, p.returncode))
            except subprocess.TimeoutExpired:
                p.kill()
                bad.append(name + " did not stop")
        if keep:
            print("kept " + self.tmp)
            self.log.flush()
            print(open(os.path.join(self.tmp, "log"), errors="replace").read()[-4000:])
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return bad


def main():
    for b in ("loomd", "loom-agent", "loomctl", "loom-nodecheck", "fake_worker"):
        if not os.path.exists(os.path.join(BIN, b)):
            print("SKIP: %s not built" % b)
            return 77
    try:
        c = Cluster()
    except Fail as e:
        print("FAIL: %s" % e)
        return 1
    ok = False
    try:
        # 1. one node
        rc, out = c.loomctl("node", "check", "node-a", *PASS)
        print(out)
        check(rc == 0 and "passed" in out, "node check node-a: rc %d" % rc)
        st, hist = c.call("GET", "/v1/nodechecks?node=node-a")
        first = hist["items"][0]
        check(first["state"] == "passed" and first["finished_at"], "stored with date: %s" % first)
        bw = first["summary"]["peak_busbw_gbps"]
        check(bw > 0 and first["summary"]["world"] == 2 and first["summary"]["backend"] == "gloo",
              "summary: %s" % first["summary"])
        sizes = first["parts"][0]["result"]["sizes"]
        check(len(sizes) >= 6 and all(s["busbw_gbps"] > 0 for s in sizes), "size table")

        # 2. --all: 2 node checks + 1 pair
        rc, out = c.loomctl("node", "check", "--all", *PASS)
        print(out)
        rows = [line for line in out.splitlines() if line.startswith("c-")]
        check(rc == 0 and len(rows) == 3, "--all: rc %d, %d rows" % (rc, len(rows)))
        check(sum(" pair " in r for r in rows) == 1 and all(" passed " in r for r in rows),
              "--all rows: %s" % rows)

        # 3. far below the expectation: degraded, avoided by the scheduler
        rc, out = c.loomctl("node", "check", "node-b", "--expect-busbw", "100000", *SMALL)
        print(out)
        check(rc == 4 and "degraded" in out, "degraded check exit 4: rc %d" % rc)
        nb = c.node("node-b")
        check(nb["state"] == "degraded" and nb["health"]["degraded"], "node-b state: %s" % nb)
        check("GB/s" in nb["health"]["reasons"][0] and "expected 1e+05" in
              nb["health"]["reasons"][0], "reason names the numbers: %s" % nb["health"])
        st, t = c.call("POST", "/v1/tenants", {"name": "acme"})
        st, k = c.call("POST", "/v1/tenants/%s/tokens" % t["id"], {})
        tok = k["token"]
        data = os.path.join(c.tmp, "train.bin")
        with open(data, "wb") as f:
            f.write(b"\0" * 4096)

        def spec(name, world, steps):
            return {"name": name, "labels": {"fake_step_ms": "100"},
                    "model": {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 64,
                              "d_ff": 256, "vocab_size": 256, "seq_len": 32},
                    "data": {"train": data}, "parallel": {"dp": world},
                    "train": {"steps": steps, "global_batch_tokens": 128 * world,
                              "micro_batch": 4, "precision": "fp32"},
                    "resources": {"device": "cpu", "gpus_per_node": 2}}
        st, j2 = c.call("POST", "/v1/jobs", spec("two", 2, 200), token=tok)
        check(st == 201, "submit: %s" % j2)
        j = c.wait(lambda: (lambda r: r if r["placement"] else None)(
            c.call("GET", "/v1/jobs/" + j2["id"], token=tok)[1]), 10, "job placed")
        nodes = sorted(set(p["node"] for p in j["placement"]))
        check(nodes == ["node-a"], "placed on the healthy node only: %s" % j["placement"])
        st, j4 = c.call("POST", "/v1/jobs", spec("four", 4, 5), token=tok)
        time.sleep(1.0)
        st, j4s = c.call("GET", "/v1/jobs/" + j4["id"], token=tok)
        check(j4s["state"] == "queued", "4-rank job waits while node-b is degraded: %s" %
              j4s["state"])
        # 4. a busy node refuses a check
        st, r = c.call("POST", "/v1/nodes/node-a/check", {})
        check(st == 409 and r["error"]["code"] == "NODE_BUSY", "busy: %s %s" % (st, r))
        c.call("POST", "/v1/jobs/%s/cancel" % j2["id"], {}, token=tok)
        c.call("POST", "/v1/jobs/%s/cancel" % j4["id"], {}, token=tok)

        # 5. the mark survives a loomd restart; with nodecheck-on-join a node that
        # joins and was never checked gets a check, the checked ones do not
        c.procs["loomd"].send_signal(signal.SIGTERM)
        c.procs["loomd"].wait(10)
        c.start_loomd(["--nodecheck-on-join", "true"])
        c.wait(lambda: len([n for n in c.nodes() if n["state"] in ("ready", "degraded")]) == 2,
               10, "agents back")
        check(c.node("node-b")["state"] == "degraded", "mark kept across restart")
        c.start_agent("node-c")
        joined = c.wait(lambda: (lambda r: r if r and r[0]["state"] in ("passed", "degraded")
                                 else None)(c.call("GET", "/v1/nodechecks?node=node-c")[1]["items"]),
                        30, "on-join check of node-c")
        check(len(joined) == 1 and joined[0]["kind"] == "node" and joined[0]["world"] == 2,
              "one node check of node-c on join: %s" % joined)
        st, ha = c.call("GET", "/v1/nodechecks?node=node-a")
        check(all(x["state"] != "queued" and x["state"] != "running" for x in ha["items"]) and
              len(ha["items"]) == 3, "no on-join check for checked node-a: %d" % len(ha["items"]))

        # 6. an agent that never picks up its part (stopped): the check fails at its
        # timeout, without a mark, and the node takes work again afterwards
        c.procs["node-a"].send_signal(signal.SIGSTOP)
        try:
            st, ck = c.call("POST", "/v1/nodes/node-a/check", {"timeout_s": 2})
            check(st == 202, "check of a stopped agent's node: %s %s" % (st, ck))
            time.sleep(2.5)
            st, got = c.call("GET", "/v1/nodechecks/" + ck["id"])
            check(got["state"] == "failed" and "did not report" in got["reason"],
                  "timed-out check: %s" % got)
        finally:
            c.procs["node-a"].send_signal(signal.SIGCONT)
        check(c.node("node-a")["state"] == "ready", "no mark from a failed check")

        # 7. rendezvous of a check refuses other tokens
        st, r = c.call("GET", "/v1/nodechecks/%s/rdzv/x" % first["id"], token=tok)
        check(st == 403, "rdzv with a tenant token: %s" % st)

        # 8. clear, then a failing and a passing check
        rc, out = c.loomctl("node", "check", "node-b", "--clear")
        check(rc == 0 and c.node("node-b")["state"] == "ready", "clear: %s" % out)
        rc, out = c.loomctl("node", "check", "node-b", "--expect-busbw", "100000", *SMALL)
        check(rc == 4 and c.node("node-b")["state"] == "degraded", "degraded again")
        c.wait(lambda: c.node("node-a")["devices_used"] == 0, 10, "node-a idle")
        rc, out = c.loomctl("node", "check", "node-b", *PASS)
        check(rc == 0 and c.node("node-b")["state"] == "ready",
              "a passing check clears the mark: %s" % out)
        rc, out = c.loomctl("node", "check", "--history")
        check(rc == 0 and len([x for x in out.splitlines() if x.startswith("c-")]) >= 9,
              "history lists every check")
        ok = True
    except Fail as e:
        print("FAIL: %s" % e)
    bad = c.close(keep=not ok)
    if ok and bad:
        print("FAIL: unclean exit: %s" % ", ".join(bad))
        return 1
    if ok:
        print("PASS: node checks (peak busbw %.3f GB/s on node-a)" % bw)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
