#!/usr/bin/env python3
"""Node pools, labels and NVLink islands against a real loomd, with nodes
registered over the agent protocol (no GPUs needed). Checks, through the HTTP
API only:
  - GET /v1/nodes: nvlink_islands from the reported topology (two interleaved
    islands of 4 on p1; none on q1, whose GPUs have no NVLink), pool and labels;
  - PATCH /v1/nodes/{id}: admin only; bad bodies get a code and field and change
    nothing; labels merge (null removes a key); kept across a loomd restart;
  - submit: a pool or labels no node carries -> 422 UNSCHEDULABLE naming it;
  - placement: resources.pool / labels pick the node; a tp=4 job on p1 gets one
    island (devices 0 2 4 6), not adjacent devices 0-3; a job whose selector
    matches only busy or drained nodes waits with a pending reason naming it,
    and starts once an admin labels another node to match.
Usage: test_node_pools.py BIN_DIR. Exit 0 pass, 1 fail."""
import os
import shutil
import subprocess
import sys
import tempfile
import threading

from loomtest import Fail, daemon_env, free_port, http, wait_for  # noqa: E402

BIN = os.path.abspath(sys.argv[1])
ADMIN = "admin-token-for-pools"
JOIN = "join-token-for-pools"
CREDS = {}


def check(cond, msg):
    if not cond:
        raise Fail(msg)
    print("ok:", msg)


class Loomd:
    def __init__(self, tmp):
        self.tmp, self.port = tmp, free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.proc = None
        self.env = daemon_env(LOOM_ADMIN_TOKEN=ADMIN, LOOM_JOIN_TOKEN=JOIN)

    def start(self):
        log = open(os.path.join(self.tmp, "loomd.log"), "ab")
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "loomd"), "--auto-approve", "--listen", "127.0.0.1:%d" % self.port,
             "--data-dir", os.path.join(self.tmp, "loomd"), "--node-timeout", "30",
             "--heartbeat", "1", "--store-sync-full", "false"],
            env=self.env, stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: self.request("GET", "/healthz", token=None)[0] == 200, 10, "loomd up",
                 errors=())

    def stop(self):
        if self.proc:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def request(self, method, path, body=None, token=ADMIN):
        return http(self.url + path, method, body, token, offline=True)


def devices(name, mib, n, gpu_type):
    return [{"index": i, "name": name, "uuid": "GPU-%s-%d" % (gpu_type, i), "gpu_type": gpu_type,
             "mem_total_mib": mib, "mem_used_mib": 0, "util_pct": 0, "power_w": 0, "temp_c": 30}
            for i in range(n)]


def topology(n, linked):
    """nvidia-smi topo style matrix: NV12 where linked(a, b), else the PCIe level."""
    return [["X" if a == b else ("NV12" if linked(a, b) else "SYS") for b in range(n)]
            for a in range(n)]


def register(d, node, devs, inventory):
    body = {"node": node, "hostname": node, "kind": "cuda", "devices": devs, "tasks": [],
            "version": "0.1", "inventory": inventory,
            "host": {"cpus": 64, "mem_total_mib": 1048576, "interconnect": "nvlink"}}
    st, r = d.request("POST", "/v1/agent/register", body, token=JOIN)
    check(st == 200, "register %s: %s %s" % (node, st, r))
    CREDS[node] = r["credential"]


class Heart(threading.Thread):
    def __init__(self, d):
        super().__init__(daemon=True)
        self.d, self.alive, self.stop = d, {}, threading.Event()

    def run(self):
        while not self.stop.wait(0.3):
            for node, devs in list(self.alive.items()):
                self.d.request("POST", "/v1/agent/heartbeat",
                               {"node": node, "devices": devs, "tasks": []}, token=CREDS[node])


SMALL = {"family": "gpt2", "n_layer": 2, "n_head": 4, "d_model": 64, "d_ff": 256,
         "vocab_size": 256, "seq_len": 32}


def spec(data, dp, tp=1, resources=None):
    r = {"device": "cuda", "gpus_per_node": 8}
    r.update(resources or {})
    return {"name": "pools", "model": SMALL, "data": {"train": data},
            "parallel": {"dp": dp, "tp": tp, "pp": 1},
            "train": {"steps": 10, "global_batch_tokens": 128 * dp, "micro_batch": 4},
            "resources": r, "max_retries": 0}


def main():
    tmp = tempfile.mkdtemp(prefix="loom-pools-")
    d = Loomd(tmp)
    heart = Heart(d)
    ok = False
    try:
        d.start()
        data = os.path.join(tmp, "train_000.bin")
        with open(data, "wb") as f:
            f.write(b"\0" * 4096)
        st, t = d.request("POST", "/v1/tenants", {"name": "acme"})
        st, k = d.request("POST", "/v1/tenants/%s/tokens" % t["id"], {})
        tenant = k["token"]

        # p1: 8 x H100, NVLink islands {0,2,4,6} and {1,3,5,7}; q1, r1: 4 x H100 over PCIe
        p1 = devices("NVIDIA H100 80GB HBM3", 81559, 8, "H100-SXM")
        q1 = devices("NVIDIA H100 80GB HBM3", 81559, 4, "H100-SXM")
        r1 = devices("NVIDIA H100 80GB HBM3", 81559, 4, "H100-SXM")
        register(d, "p1", p1, {"gpus": [], "topology": topology(8, lambda a, b: a % 2 == b % 2)})
        register(d, "q1", q1, {"gpus": [], "topology": topology(4, lambda a, b: False)})
        register(d, "r1", r1, {"gpus": [], "topology": topology(4, lambda a, b: False)})
        heart.alive.update({"p1": p1, "q1": q1, "r1": r1})
        heart.start()

        st, r = d.request("GET", "/v1/nodes", token=tenant)
        nodes = {n["name"]: n for n in r["nodes"]}
        check(st == 200 and nodes["p1"]["nvlink_islands"] == [[0, 2, 4, 6], [1, 3, 5, 7]],
              "p1 islands from its topology: %s" % nodes["p1"]["nvlink_islands"])
        check(nodes["q1"]["nvlink_islands"] == [] and nodes["q1"]["pool"] == "" and
              nodes["q1"]["labels"] == {}, "q1: no NVLink, no pool, no labels")

        # ---- PATCH /v1/nodes/{id} ----
        st, r = d.request("PATCH", "/v1/nodes/q1", {"pool": "train"}, token=tenant)
        check(st == 403, "a tenant cannot set a pool: %s" % st)
        st, r = d.request("PATCH", "/v1/nodes/nope", {"pool": "train"})
        check(st == 404 and r["error"]["code"] == "NODE_NOT_FOUND", "unknown node: %s" % r)
        bad = [({"pool": "a b"}, "INVALID_VALUE", "pool"),
               ({"pool": 3}, "WRONG_TYPE", "pool"),
               ({"labels": ["zone"]}, "WRONG_TYPE", "labels"),
               ({"labels": {"zone": 1}}, "WRONG_TYPE", "labels.zone"),
               ({"labels": {"a b": "x"}}, "INVALID_LABEL", "labels.a b"),
               ({"labels": {"k%d" % i: "v" for i in range(17)}}, "OUT_OF_RANGE", "labels"),
               ({"pool": "x", "zone": "eu"}, "UNKNOWN_FIELD", "zone")]
        for body, code, field in bad:
            st, r = d.request("PATCH", "/v1/nodes/q1", body)
            e = r.get("error", {}) if isinstance(r, dict) else {}
            check(st == 422 and e.get("code") == code and e.get("field") == field and
                  e.get("message"), "bad PATCH %s -> %s: %s %s" % (field, code, st, e))
        st, r = d.request("GET", "/v1/nodes/q1")
        check(r["pool"] == "" and r["labels"] == {}, "bad PATCHes changed nothing")
        st, r = d.request("PATCH", "/v1/nodes/q1",
                          {"pool": "train", "labels": {"zone": "eu", "rack": "7"}})
        check(st == 200 and r["pool"] == "train" and r["labels"] == {"zone": "eu", "rack": "7"},
              "pool and labels set: %s %s" % (r.get("pool"), r.get("labels")))
        st, r = d.request("PATCH", "/v1/nodes/q1", {"labels": {"rack": None, "ib": "yes"}})
        check(st == 200 and r["pool"] == "train" and r["labels"] == {"zone": "eu", "ib": "yes"},
              "labels merge: null removes, pool kept: %s" % r.get("labels"))

        # kept across a restart
        heart.stop.set()
        heart.join()
        d.stop()
        d.start()
        for n in ("p1", "q1", "r1"):
            register(d, n, {"p1": p1, "q1": q1, "r1": r1}[n],
                     {"gpus": [], "topology": topology(8, lambda a, b: a % 2 == b % 2)
                      if n == "p1" else topology(4, lambda a, b: False)})
        heart = Heart(d)
        heart.alive.update({"p1": p1, "q1": q1, "r1": r1})
        heart.start()
        st, r = d.request("GET", "/v1/nodes/q1", token=tenant)
        check(r["pool"] == "train" and r["labels"] == {"zone": "eu", "ib": "yes"},
              "pool and labels kept across a loomd restart (tenants see them)")

        # ---- submit-time refusal ----
        st, r = d.request("POST", "/v1/jobs", spec(data, 1, resources={"pool": "infer"}),
                          token=tenant)
        e = r.get("error", {})
        check(st == 422 and e.get("code") == "UNSCHEDULABLE" and e.get("field") ==
              "resources.pool" and "resources.pool=infer" in e.get("message", ""),
              "a pool no node has is refused: %s" % e)
        st, r = d.request("POST", "/v1/jobs",
                          spec(data, 1, resources={"pool": "train", "labels": {"zone": "us"}}),
                          token=tenant)
        e = r.get("error", {})
        check(st == 422 and e.get("code") == "UNSCHEDULABLE" and "zone=us" in e.get("message", ""),
              "labels no node has are refused: %s" % e)

        def job(jid):
            return d.request("GET", "/v1/jobs/" + jid, token=tenant)[1]

        def placement(jid):
            return job(jid).get("placement")

        # ---- placement by selector ----
        st, j1 = d.request("POST", "/v1/jobs",
                           spec(data, 2, resources={"labels": {"zone": "eu"}}), token=tenant)
        check(st == 201, "zone=eu job accepted: %s" % j1)
        wait_for(lambda: placement(j1["id"]), 10, "zone=eu job placed", errors=())
        check({p["node"] for p in placement(j1["id"])} == {"q1"},
              "labels zone=eu land on q1: %s" % placement(j1["id"]))

        # tp=4 on p1 (selected by a label, else best fit takes a 4-GPU node): one island
        st, r = d.request("PATCH", "/v1/nodes/p1", {"labels": {"board": "hgx"}})
        check(st == 200 and r["labels"] == {"board": "hgx"}, "p1 labelled board=hgx")
        st, j2 = d.request("POST", "/v1/jobs",
                           spec(data, 1, tp=4, resources={"labels": {"board": "hgx"}}),
                           token=tenant)
        check(st == 201, "tp=4 job accepted: %s" % j2)
        wait_for(lambda: placement(j2["id"]), 10, "tp=4 job placed", errors=())
        pl = placement(j2["id"])
        devs = sorted(p["device"] for p in pl if p["node"] == "p1")
        check(len(pl) == 4 and devs == [0, 2, 4, 6],
              "tp=4 group inside NVLink island 0 2 4 6 of p1, not devices 0-3: %s" % devs)

        # a pool whose only node is busy: waits with a reason naming the pool's node
        st, j3 = d.request("POST", "/v1/jobs", spec(data, 4, resources={"pool": "train"}),
                           token=tenant)
        check(st == 201, "pool=train job accepted while q1 is busy")
        wait_for(lambda: "free (q1: 2)" in (job(j3["id"]).get("pending_reason") or ""), 10,
                 "pending reason counts only the pool's nodes", errors=())
        # an admin puts r1 into the pool: the job starts there
        st, r = d.request("PATCH", "/v1/nodes/r1", {"pool": "train"})
        check(st == 200 and r["pool"] == "train", "r1 joins pool train")
        wait_for(lambda: placement(j3["id"]), 10, "pool=train job placed on r1", errors=())
        check({p["node"] for p in placement(j3["id"])} == {"r1"},
              "pool job on r1: %s" % placement(j3["id"]))
        # the same through loomctl label (KEY- removes a label)
        env = dict(os.environ, LOOM_URL=d.url, LOOM_TOKEN=ADMIN)
        r = subprocess.run([os.path.join(BIN, "loomctl"), "label", "r1", "--pool", "gpu-b",
                            "zone=us", "ib-"], capture_output=True, text=True, env=env,
                           timeout=20)
        st, n = d.request("GET", "/v1/nodes/r1")
        check(r.returncode == 0 and n["pool"] == "gpu-b" and n["labels"] == {"zone": "us"},
              "loomctl label: %s %s -> %s %s" % (r.returncode, r.stdout.strip(), n["pool"],
                                                 n["labels"]))
        r = subprocess.run([os.path.join(BIN, "loomctl"), "label", "r1", "zone-"],
                           capture_output=True, text=True, env=env, timeout=20)
        st, n = d.request("GET", "/v1/nodes/r1")
        check(r.returncode == 0 and n["labels"] == {} and n["pool"] == "gpu-b",
              "loomctl label KEY- removes it, pool kept")
        r = subprocess.run([os.path.join(BIN, "loomctl"), "label", "r1", "a b=c"],
                           capture_output=True, text=True, env=env, timeout=20)
        check(r.returncode != 0 and "INVALID_LABEL" in r.stderr,
              "loomctl label prints the API error: %s" % r.stderr.strip())
        d.request("PATCH", "/v1/nodes/r1", {"pool": "train"})
        # drained pool nodes: the reason names the selector
        for n in ("q1", "r1"):
            d.request("POST", "/v1/nodes/%s/drain" % n, {})
        st, j4 = d.request("POST", "/v1/jobs", spec(data, 1, resources={"pool": "train"}),
                           token=tenant)
        check(st == 201, "pool=train job accepted (its nodes are drained, not gone)")
        wait_for(lambda: "no ready node matches resources.pool=train" in
                 (job(j4["id"]).get("pending_reason") or ""), 10,
                 "pending reason names the unmatched selector", errors=())
        print("pending:", job(j4["id"]).get("pending_reason"))
        ok = True
    except Fail as e:
        print("FAIL:", e)
    finally:
        heart.stop.set()
        d.stop()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("logs in", tmp)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
