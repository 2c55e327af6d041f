#!/usr/bin/env python3
"""GPU fleet integration test: a real loomd with nodes registered over the
agent protocol (POST /v1/agent/register with the join token) as an H100 node,
an RTX 4090 node (an agent that sends no gpu_type: loomd normalizes the model
name) and an A100 node, without GPUs on this machine. Checks, against the HTTP
API only:
  - GET /v1/nodes: gpu_type and the inventory of each node;
  - PUT/GET /v1/prices: admin only, validation (code + field, nothing changed),
    aliases normalized, kept across a loomd restart;
  - submit: UNSCHEDULABLE for more ranks than one type holds, DOES_NOT_FIT with
    an alternative for a model no GPU type holds, gpu_type restricts placement,
    ranks never mix types, pending_reason names the shortage;
  - train.precision fp8: PRECISION_GPU for an A100-only job, placed on the
    H100 node rather than the best-fit A100 one, planned on FP8-capable types,
    and placed on a GPU the type table lacks by its reported capability;
  - POST /v1/plan: cost per GPU type at the set prices, the cheapest that fits;
  - usage: an attempt on the H100 node (lost: no heartbeats) is billed at the
    H100-SXM price; group_by=gpu_type.
Usage: test_fleet.py BIN_DIR. Exit 0 pass, 1 fail."""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from loomtest import Fail, daemon_env, free_port, http, wait_for  # noqa: E402

BIN = os.path.abspath(sys.argv[1])
ADMIN = "admin-token-for-fleet"
JOIN = "join-token-for-fleet"


def check(cond, msg):
    if not cond:
        raise Fail(msg)
    print("ok:", msg)


class Loomd:
    def __init__(self, tmp):
        self.tmp = tmp
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.proc = None
        self.env = daemon_env(LOOM_ADMIN_TOKEN=ADMIN, LOOM_JOIN_TOKEN=JOIN)

    def start(self):
        log = open(os.path.join(self.tmp, "loomd.log"), "ab")
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "loomd"), "--auto-approve", "--listen", "127.0.0.1:%d" % self.port, "--data-dir",
             os.path.join(self.tmp, "loomd"), "--node-timeout", "2", "--heartbeat", "1",
             # the usage check below bills an attempt lost with its node (not billed by
             # default), so that its cost shows the type price
             "--bill-causes", "user,preempted,node_lost",
             "--store-sync-full", "false"], env=self.env, stdout=log, stderr=subprocess.STDOUT)
        wait(lambda: self.request("GET", "/healthz", token=None)[0] == 200, 10, "loomd up")

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


def wait(cond, timeout, what):
    wait_for(cond, timeout, what, errors=())


def devices(name, mib, n, gpu_type=None):
    out = []
    for i in range(n):
        d = {"index": i, "name": name, "uuid": "GPU-%s-%d" % (name[-4:].replace(" ", ""), i),
             "mem_total_mib": mib, "mem_used_mib": 0, "util_pct": 0, "power_w": 0, "temp_c": 30}
        if gpu_type:
            d["gpu_type"] = gpu_type
        out.append(d)
    return out


CREDS = {}  # node -> the credential loomd issued at registration


def register(d, node, devs, inventory=None):
    body = {"node": node, "hostname": node, "kind": "cuda", "devices": devs, "tasks": [],
            "version": "0.1", "host": {"cpus": 64, "mem_total_mib": 1048576,
                                       "interconnect": "nvlink"}}
    if inventory is not None:
        body["inventory"] = inventory
    st, r = d.request("POST", "/v1/agent/register", body, token=JOIN)
    check(st == 200, "register %s: %s %s" % (node, st, r))
    CREDS[node] = r["credential"]  # the node's own credential, for its later calls


class Heart(threading.Thread):
    """Heartbeats for the nodes in `alive` (node -> devices) every 0.3 s, as
    their agents would; a node taken out of it is lost after --node-timeout."""

    def __init__(self, d):
        super().__init__(daemon=True)
        self.d, self.alive, self.stop = d, {}, threading.Event()

    def run(self):
        while not self.stop.wait(0.3):
            for node, devs in list(self.alive.items()):
                self.d.request("POST", "/v1/agent/heartbeat",
                               {"node": node, "devices": devs, "tasks": []}, token=CREDS[node])


SMALL = {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 64, "d_ff": 256,
         "vocab_size": 256, "seq_len": 32}


def spec(data, dp, resources=None, model=None, train=None):
    t = {"steps": 10, "global_batch_tokens": 128 * dp, "micro_batch": 4}
    t.update(train or {})
    r = {"device": "cuda", "gpus_per_node": 8}
    r.update(resources or {})
    return {"name": "fleet", "model": model or SMALL, "data": {"train": data},
            "parallel": {"dp": dp, "tp": 1, "pp": 1}, "train": t, "resources": r,
            "max_retries": 0}


def main():
    tmp = tempfile.mkdtemp(prefix="loom-fleet-")
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

        h100 = devices("NVIDIA H100 80GB HBM3", 81559, 8, "H100-SXM")
        rtx = devices("NVIDIA GeForce RTX 4090", 24564, 2)  # no gpu_type: an older agent
        a100 = devices("NVIDIA A100-SXM4-80GB", 81920, 4, "A100-80GB")
        inv = {"driver_version": "550.54.15", "cuda_version": "12.4",
               "gpus": [{"index": i, "gpu_type": "H100-SXM", "sm_count": 132,
                         "compute_capability": "9.0", "nvlinks": 18} for i in range(8)],
               "topology": [["X" if a == b else "NV18" for b in range(8)] for a in range(8)]}
        register(d, "h1", h100, inv)
        register(d, "r1", rtx)
        register(d, "a1", a100)
        heart.alive.update({"h1": h100, "r1": rtx, "a1": a100})
        heart.start()
        st, r = d.request("GET", "/v1/nodes", token=tenant)
        nodes = {n["name"]: n for n in r["nodes"]}
        check(st == 200 and nodes["h1"]["gpu_type"] == "H100-SXM", "h1 is H100-SXM")
        check(nodes["r1"]["gpu_type"] == "RTX4090", "r1 normalized from the model name")
        check(nodes["a1"]["gpu_type"] == "A100-80GB", "a1 is A100-80GB")
        check(nodes["h1"]["inventory"]["cuda_version"] == "12.4" and
              nodes["h1"]["inventory"]["topology"][0][1] == "NV18", "h1 inventory shown")

        # ---- prices ----
        st, r = d.request("GET", "/v1/prices", token=tenant)
        check(st == 200 and r["items"] == [], "no prices yet: %s" % r)
        good = {"items": [{"gpu_type": "H100-80GB", "per_gpu_hour": 2.5, "currency": "USD"},
                          {"gpu_type": "RTX4090", "per_gpu_hour": 0.4, "per_gpu_month": 200,
                           "currency": "USD"},
                          {"gpu_type": "A100-80GB", "per_gpu_hour": 1.5, "currency": "USD"}]}
        st, r = d.request("PUT", "/v1/prices", good, token=tenant)
        check(st == 403, "a tenant cannot set prices: %s" % st)
        bad = [
            ({"items": [{"gpu_type": "H300", "per_gpu_hour": 1, "currency": "USD"}]},
             "INVALID_PRICE", "items[0].gpu_type"),
            ({"items": [{"gpu_type": "H200", "per_gpu_hour": -1, "currency": "USD"}]},
             "INVALID_PRICE", "items[0].per_gpu_hour"),
            ({"items": [{"gpu_type": "H200", "per_gpu_hour": 1, "currency": "dollars"}]},
             "INVALID_PRICE", "items[0].currency"),
            ({"items": [{"gpu_type": "H200", "per_gpu_hour": 1, "currency": "USD", "x": 1}]},
             "INVALID_PRICE", "items[0].x"),
            ({"items": [{"gpu_type": "H200", "per_gpu_hour": 1, "currency": "USD"},
                        {"gpu_type": "h200", "per_gpu_hour": 2, "currency": "USD"}]},
             "DUPLICATE_PRICE", "items[1].gpu_type"),
            ({"items": {}}, "INVALID_PRICES", "items"),
            ({"items": [], "extra": 1}, "UNKNOWN_FIELD", "extra"),
        ]
        for body, code, field in bad:
            st, r = d.request("PUT", "/v1/prices", body)
            e = r.get("error", {}) if isinstance(r, dict) else {}
            check(st == 422 and e.get("code") == code and e.get("field") == field and
                  e.get("message"), "bad prices %s -> %s %s: %s" % (field, code, st, e))
        st, r = d.request("GET", "/v1/prices", token=tenant)
        check(r["items"] == [], "bad PUTs changed nothing")
        st, r = d.request("PUT", "/v1/prices", good)
        by = {i["gpu_type"]: i for i in r["items"]}
        check(st == 200 and set(by) == {"H100-SXM", "RTX4090", "A100-80GB"},
              "prices set, alias normalized: %s" % sorted(by))
        check(by["RTX4090"]["per_gpu_month"] == 200 and by["H100-SXM"]["per_gpu_month"] is None,
              "per_gpu_month optional")

        # ---- submit: capacity, fit, placement ----
        st, r = d.request("POST", "/v1/jobs", spec(data, 16), token=tenant)
        check(st == 422 and r["error"]["code"] == "UNSCHEDULABLE" and
              "at most 8" in r["error"]["message"], "16 ranks on 8+4+2 unmixed: %s" % r)
        st, r = d.request("POST", "/v1/jobs", spec(data, 1, model={"family": "llama",
                                                                    "preset": "7b"},
                                                   train={"micro_batch": 1,
                                                          "global_batch_tokens": 4096}),
                          token=tenant)
        msg = r.get("error", {}).get("message", "")
        check(st == 422 and r["error"]["code"] == "DOES_NOT_FIT" and "best feasible" in msg and
              "> 80 GiB" in msg, "7B full fine-tune on one GPU: refused with an alternative "
              "layout: %s" % msg)
        st, r = d.request("POST", "/v1/jobs", spec(data, 1, {"gpu_type": "H300"}), token=tenant)
        check(st == 422 and r["error"]["code"] == "UNKNOWN_GPU_TYPE" and
              "H300" in r["error"]["message"], "unknown gpu_type refused: %s" % r)
        st, r = d.request("POST", "/v1/plan", spec(data, 1, {"gpu_type": ["H200", "X1"]}),
                          token=tenant)
        check(st == 422 and r["error"]["code"] == "UNKNOWN_GPU_TYPE" and
              r["error"]["field"] == "resources.gpu_type", "plan: unknown gpu_type: %s" % r)
        st, r = d.request("POST", "/v1/plan", spec(data, 1), token=tenant)
        types = {g["gpu_type"]: g for g in r.get("gpu_types", [])}
        check(st == 200 and set(types) == {"H100-SXM", "RTX4090", "A100-80GB"},
              "plan prices each type: %s" % sorted(types))
        costs = {k: v["cost"] for k, v in types.items()}
        want = min(costs, key=lambda k: costs[k])
        check(r["cheapest_fit"] == want, "cheapest type that fits: %s of %s" %
              (r["cheapest_fit"], costs))
        for k, v in types.items():
            check(abs(v["cost"] - v["gpu_hours"] * by[k]["per_gpu_hour"]) <= 1e-9 * v["cost"],
                  "%s plan cost = gpu_hours x price" % k)

        # train.precision fp8 needs FP8 tensor cores (compute capability 8.9+): refused on the
        # A100 by name; planned on the H100 and RTX 4090 only
        st, r = d.request("POST", "/v1/jobs", spec(data, 1, {"gpu_type": "A100-80GB"},
                                                   train={"precision": "fp8"}), token=tenant)
        err = r.get("error", {})
        check(st == 422 and err.get("code") == "PRECISION_GPU" and
              err.get("field") == "train.precision" and "A100-80GB (8.0)" in err.get("message", ""),
              "fp8 on A100-80GB refused: %s" % r)
        st, r = d.request("POST", "/v1/plan", spec(data, 1, train={"precision": "fp8"}),
                          token=tenant)
        f8types = {g["gpu_type"] for g in r.get("gpu_types", [])}
        check(st == 200 and f8types == {"H100-SXM", "RTX4090"},
              "fp8 plan prices the FP8-capable types only: %s" % sorted(f8types))

        def placed(jid):
            st, j = d.request("GET", "/v1/jobs/" + jid, token=tenant)
            return j if j.get("placement") else None

        # 4 ranks in fp8: not on the A100 node, whose 4 free GPUs fit best, but on h1
        st, jf = d.request("POST", "/v1/jobs", spec(data, 4, train={"precision": "fp8"}),
                           token=tenant)
        check(st == 201, "4-rank fp8 job accepted: %s" % jf)
        wait(lambda: placed(jf["id"]), 10, "placement of the fp8 job")
        check({p["node"] for p in placed(jf["id"])["placement"]} == {"h1"},
              "fp8 ranks on the H100 node, not the best-fit A100 one: %s" %
              placed(jf["id"])["placement"])

        # placement: 4 ranks, any type: one type only (A100 node has exactly 4 -> best fit)
        st, j = d.request("POST", "/v1/jobs", spec(data, 4), token=tenant)
        check(st == 201, "4-rank job accepted")
        jid = j["id"]
        wait(lambda: placed(jid), 10, "placement of the 4-rank job")
        nodes_used = {p["node"] for p in placed(jid)["placement"]}
        check(nodes_used == {"a1"}, "4 ranks on the one 4-GPU A100 node: %s" % nodes_used)
        # 2 ranks asking for H100-SXM: h1, though r1's two free GPUs would be the best fit
        st, j1 = d.request("POST", "/v1/jobs", spec(data, 2, {"gpu_type": "H100-SXM"}),
                           token=tenant)
        check(st == 201, "2 x H100-SXM accepted")
        wait(lambda: placed(j1["id"]), 10, "placement of the H100 job")
        check({p["node"] for p in placed(j1["id"])["placement"]} == {"h1"},
              "gpu_type H100-SXM lands on h1, not on the best-fit RTX node")
        st, j2 = d.request("POST", "/v1/jobs", spec(data, 8, {"gpu_type": "H100"}),
                           token=tenant)
        check(st == 201, "8 x H100 (alias) accepted")

        def reason():
            st, j = d.request("GET", "/v1/jobs/" + j2["id"], token=tenant)
            return j.get("pending_reason") or ""
        wait(lambda: "needs 8 x H100-SXM; largest free: 2" in reason(), 10,
             "pending reason naming the H100 shortage")
        print("pending:", reason())

        # ---- usage at the type price: h1 stops heart-beating, its attempt fails ----
        del heart.alive["h1"]
        for _ in range(40):
            st, j = d.request("GET", "/v1/jobs/" + j1["id"], token=tenant)
            if j["state"] in ("failed", "succeeded", "cancelled"):
                break
            time.sleep(0.25)
        check(j["state"] == "failed", "job on the lost H100 node failed: %s" % j["state"])
        st, u = d.request("GET", "/v1/usage?group_by=gpu_type", token=tenant)
        rows = {r["key"]: r for r in u["rows"]}
        check(st == 200 and "H100-SXM" in rows, "usage by gpu_type: %s" % sorted(rows))
        h = rows["H100-SXM"]
        check(h["gpu_hours"] > 0 and abs(h["cost"] - h["gpu_hours"] * 2.5) <= 1e-6 * h["cost"],
              "H100 usage billed at 2.5 per GPU-hour: %s" % h)
        st, u = d.request("GET", "/v1/usage?group_by=cause", token=tenant)
        check(st == 200 and "node_lost" in {r["key"] for r in u["rows"]},
              "the lost attempt's usage has cause node_lost: %s" % u.get("rows"))

        # ---- a GPU the type table lacks: fp8 placement by the inventory's capability ----
        # h1 is lost, a1 busy and no FP8 there, r1 has 2: a 4-rank fp8 job can only go to u1,
        # whose H800s (not in the table: gpu_type "unknown") report compute capability 9.0
        h800 = devices("NVIDIA H800 80GB HBM3", 81559, 4)
        register(d, "u1", h800, {"driver_version": "550.54.15", "cuda_version": "12.4",
                                 "gpus": [{"index": i, "compute_capability": "9.0"}
                                          for i in range(4)]})
        heart.alive["u1"] = h800
        st, ju = d.request("POST", "/v1/jobs", spec(data, 4, train={"precision": "fp8"}),
                           token=tenant)
        check(st == 201, "4-rank fp8 job with u1 in the fleet: %s" % ju)
        wait(lambda: placed(ju["id"]), 10, "placement of the fp8 job on the unknown type")
        check({p["node"] for p in placed(ju["id"])["placement"]} == {"u1"},
              "fp8 ranks on u1 by its reported capability: %s" % placed(ju["id"])["placement"])

        # ---- prices survive a restart ----
        d.stop()
        d.start()
        st, r = d.request("GET", "/v1/prices", token=tenant)
        check(st == 200 and len(r["items"]) == 3, "prices kept across a restart")
        ok = True
    except Fail as e:
        print("FAIL:", e)
    finally:
        heart.stop.set()
        d.stop()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("files kept in", tmp)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
