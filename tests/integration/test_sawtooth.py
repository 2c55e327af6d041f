#!/usr/bin/env python3
"""Saw-tooth GPU utilization through a real loomd, without GPUs: a node
registered over the agent protocol as a 2-GPU cuda host runs a dp2 job (its
tasks reported running by this script, as an agent would); its heartbeats
carry the devices' util_pct. Checks:
  - steady utilization (95 %) on both devices for 20 heartbeats: no finding;
  - rank 1's device then alternating 90 % / 10 %: one SAWTOOTH finding naming
    rank 1 and the node, with the layout advice, as a job event and as a
    job.diagnosis event of GET /v1/events (tenant-scoped: another tenant
    does not see it), and only once however long it goes on.
Usage: test_sawtooth.py BIN_DIR. Exit 0 pass, 1 fail."""
import os
import shutil
import subprocess
import sys
import tempfile

from loomtest import Fail, daemon_env, free_port, http, wait_for  # noqa: E402

BIN = os.path.abspath(sys.argv[1])
ADMIN = "admin-token-for-sawtooth"
JOIN = "join-token-for-sawtooth"


def check(cond, msg):
    if not cond:
        raise Fail(msg)
    print("ok:", msg)


def main():
    tmp = tempfile.mkdtemp(prefix="loom-sawtooth-")
    port = free_port()
    url = "http://127.0.0.1:%d" % port
    log = open(os.path.join(tmp, "loomd.log"), "ab")
    proc = subprocess.Popen(
        [os.path.join(BIN, "loomd"), "--auto-approve", "--listen", "127.0.0.1:%d" % port,
         "--data-dir", os.path.join(tmp, "loomd"), "--node-timeout", "30", "--heartbeat", "1",
         "--hang-timeout", "600", "--store-sync-full", "false"],
        env=daemon_env(LOOM_ADMIN_TOKEN=ADMIN, LOOM_JOIN_TOKEN=JOIN), stdout=log,
        stderr=subprocess.STDOUT)

    def req(method, path, body=None, token=ADMIN):
        return http(url + path, method, body, token, offline=True)

    ok = False
    try:
        wait_for(lambda: req("GET", "/healthz", token=None)[0] == 200, 10, "loomd up", errors=())
        data = os.path.join(tmp, "train_000.bin")
        with open(data, "wb") as f:
            f.write(b"\0" * 4096)
        tokens = []
        for name in ("acme", "beta"):
            st, t = req("POST", "/v1/tenants", {"name": name})
            st, k = req("POST", "/v1/tenants/%s/tokens" % t["id"], {})
            tokens.append(k["token"])
        tenant, other = tokens

        def devs(u0, u1):
            return [{"index": i, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-saw-%d" % i,
                     "mem_total_mib": 81559, "mem_used_mib": 0, "util_pct": u, "power_w": 0,
                     "temp_c": 30, "gpu_type": "H100-SXM"} for i, u in enumerate((u0, u1))]
        st, r = req("POST", "/v1/agent/register",
                    {"node": "g1", "hostname": "g1", "kind": "cuda", "devices": devs(0, 0),
                     "tasks": [], "version": "0.1",
                     "host": {"cpus": 16, "mem_total_mib": 65536, "interconnect": "nvlink"}},
                    token=JOIN)
        check(st == 200, "register g1: %s %s" % (st, r))
        cred = r["credential"]
        spec = {"name": "saw", "model": {"family": "gpt2", "n_layer": 2, "n_head": 2,
                                         "d_model": 64, "d_ff": 256, "vocab_size": 256,
                                         "seq_len": 32},
                "data": {"train": data}, "parallel": {"dp": 2, "tp": 1, "pp": 1},
                "train": {"steps": 1000, "global_batch_tokens": 256, "micro_batch": 4},
                "resources": {"device": "cuda", "gpus_per_node": 2}, "max_retries": 0}
        st, j = req("POST", "/v1/jobs", spec, token=tenant)
        check(st == 201, "submit dp2: %s %s" % (st, j))
        jid = j["id"]
        tasks = []

        def assigned():
            st, a = req("GET", "/v1/agent/assignments?node=g1", token=cred)
            tasks[:] = [t for t in a.get("tasks", []) if t.get("job") == jid] if st == 200 else []
            return len(tasks) == 2
        wait_for(assigned, 10, "both ranks assigned to g1", errors=())
        dev_of = {t["rank"]: t["device"] for t in tasks}
        running = [{"job": jid, "attempt": t["attempt"], "rank": t["rank"], "state": "running",
                    "pid": 1000 + t["rank"]} for t in tasks]

        def beat(u_rank0, u_rank1):
            u = [0, 0]
            u[dev_of[0]], u[dev_of[1]] = u_rank0, u_rank1
            st, _ = req("POST", "/v1/agent/heartbeat",
                        {"node": "g1", "devices": devs(*u), "tasks": running}, token=cred)
            if st != 200:
                raise Fail("heartbeat: %s" % st)

        def job_state():
            return req("GET", "/v1/jobs/" + jid, token=tenant)[1]["state"]
        beat(95, 95)
        wait_for(lambda: job_state() == "running", 10, "the job running", errors=())

        def findings(token=tenant):
            st, e = req("GET", "/v1/events?job=%s&type=job.diagnosis" % jid, token=token)
            check(st == 200, "events readable: %s" % st)
            return [it["data"] for it in e["items"]]

        def job_notes():
            st, e = req("GET", "/v1/jobs/%s/events" % jid, token=tenant)
            return [x["reason"] for x in e["items"] if x["reason"].startswith("SAWTOOTH")]
        for _ in range(20):
            beat(95, 95)
        check(findings() == [] and job_notes() == [], "steady utilization: no finding")
        for k in range(40):
            beat(95, 90 if k % 2 == 0 else 10)
        got = findings()
        check(len(got) == 1 and got[0]["code"] == "SAWTOOTH" and got[0]["rank"] == 1 and
              got[0]["node"] == "g1" and got[0]["reason"].startswith("SAWTOOTH rank=1 node=g1 ")
              and "between 10% and" in got[0]["reason"] and "micro-batch" in
              got[0]["reason"], "one SAWTOOTH job.diagnosis event naming rank 1 on g1: %s" % got)
        notes = job_notes()
        check(notes == [got[0]["reason"]], "the same finding is a job event: %s" % notes)
        st, e = req("GET", "/v1/events?type=job.diagnosis", token=other)
        check(st == 200 and e["items"] == [], "another tenant's stream does not have it: %s %s"
              % (st, e))
        st, e = req("GET", "/v1/events?job=%s&type=job.diagnosis" % jid, token=other)
        check(st == 404, "nor can it ask for that job's: %s" % st)
        ok = True
        print("PASS")
        return 0
    except Fail as e:
        print("FAIL:", e)
        return 1
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("files kept in", tmp)


if __name__ == "__main__":
    sys.exit(main())
