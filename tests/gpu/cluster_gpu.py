#!/usr/bin/env python3
"""A GPU job through the whole control plane (issue 8), on the GPU machine:
loomd + one loom-agent that finds the GPUs through NVML (no --cpu-devices),
a dp=2 zero-1 bf16 job of the real loom-worker submitted over HTTP.

  1. The node registers with 2 GPUs; the job runs to `succeeded` with every
     step's loss in GET /v1/jobs/{id}/metrics; while it runs, the node's
     telemetry (GET /v1/nodes/{id}) shows both GPUs with utilization > 0 and
     memory in use.
  2. A longer job checkpoints every 5 steps; SIGKILL of rank 1 makes the job
     go back to the queue as attempt 1, which resumes from a checkpoint
     (start_step >= 5); then it is cancelled.

Reuses the cluster harness of tests/integration/test_cluster.py unchanged.
Usage: cluster_gpu.py BIN_DIR [--cpu]   (--cpu: rehearsal with 2 cpu devices,
fp32, no telemetry check; needs a Gloo build). Exit 0 pass, 1 fail, 77 skip."""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN_DIR = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ""
CPU = "--cpu" in sys.argv
sys.argv = [sys.argv[0], BIN_DIR, "real_worker"]  # the harness reads its argv at import
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import test_cluster as tc  # noqa: E402


def spec(shards, steps, every, name):
    # big enough that a step keeps both GPUs busy for the telemetry samples
    # (~0.5 s apart); the rehearsal runs a tiny model on the cpu backend
    T = 16 if CPU else 512
    model = {"family": "gpt2", "n_layer": 8, "n_head": 8, "d_model": 512, "d_ff": 2048,
             "vocab_size": 512, "seq_len": T}
    if CPU:
        model.update(n_layer=2, n_head=2, d_model=32, d_ff=128)
    return {
        "name": name,
        "model": model,
        "data": {"train": os.path.join(shards, "train_*.bin")},
        "parallel": {"dp": 2, "tp": 1, "pp": 1, "zero_stage": 1},
        "train": {"steps": steps, "global_batch_tokens": 2 * 16 * T, "micro_batch": 16,
                  "precision": "fp32" if CPU else "bf16", "lr": 0.001, "warmup_steps": 2},
        "checkpoint": {"every_steps": every, "keep": 2},
        "resources": {"device": "cpu" if CPU else "cuda", "gpus_per_node": 2},
        "max_retries": 1,
    }


def start_gpu_agent(c, name):
    """loom-agent without --cpu-devices: its inventory comes from NVML."""
    extra = ["--cpu-devices", "2"] if CPU else []
    p = subprocess.Popen(
        [os.path.join(tc.BIN, "loom-agent"), "--coordinator", c.url, "--name", name,
         "--work-dir", os.path.join(c.tmp, name), "--worker", c.worker, "--heartbeat-ms", "500",
         "--stop-grace-ms", "3000", "--retry-max-ms", "500"] + extra,
        env=dict(c.env, NCCL_NVLS_ENABLE="0"), stdout=c.log(name), stderr=subprocess.STDOUT)
    c.agents[name] = p
    c.wait(lambda: any(n["name"] == name and n["state"] == "ready" for n in c.nodes()), 20,
           "agent %s registered" % name)


def scenario(c):
    shards = os.path.join(c.tmp, "shards")
    corpus = os.path.join(c.tmp, "corpus.txt")
    with open(corpus, "w") as f:
        f.write(" ".join("two gpus train one model and meet at the rendezvous %d" % i
                         for i in range(20000)))
    r = subprocess.run([os.path.join(tc.BIN, "loom-data"), "prepare", "--in", corpus, "--out",
                        shards], capture_output=True, timeout=120)
    tc.check(r.returncode == 0, "loom-data prepare: %s" % r.stderr.decode()[-300:])
    start_gpu_agent(c, "gpu-node")
    node = [n for n in c.nodes() if n["name"] == "gpu-node"][0]
    print("node: kind %s, %d devices, model %s" % (node["kind"], node["devices_total"],
                                                   node.get("gpu_model")))
    tc.check(node["devices_total"] == 2, "the node offers 2 devices: %s" % node)

    steps = 40 if CPU else 300
    st, j = c.request("POST", "/v1/jobs", spec(shards, steps, 1000, "gpu-dp2"))
    tc.check(st == 201, "submit: %s %s" % (st, j))
    jid = j["id"]
    busy = {}
    t0 = time.time()
    while time.time() - t0 < 240:
        j = c.job(jid)
        if j["state"] in ("succeeded", "failed", "cancelled"):
            break
        st, n = c.get("/v1/nodes/gpu-node")
        for d in (n.get("devices") or []) if st == 200 else []:
            k = d.get("index", len(busy))
            u, m = d.get("util_pct") or 0, d.get("mem_used_mib") or 0
            b = busy.setdefault(k, [0, 0])
            b[0], b[1] = max(b[0], u), max(b[1], m)
        time.sleep(0.3)
    tc.check(j["state"] == "succeeded", "dp=2 job: %s" % tc.event_reasons(c, jid))
    st, m = c.get("/v1/jobs/%s/metrics" % jid)
    got = [p["step"] for p in m.get("series", [])] if st == 200 else []
    tc.check(got == list(range(1, steps + 1)), "steps recorded: %s" % got)
    first, last = m["series"][0]["loss"], m["series"][-1]["loss"]
    print("job %s: %d steps, loss %.3f -> %.3f, %.1f s; telemetry max per device "
          "(util %%, MiB): %s" % (jid, steps, first, last, time.time() - t0, busy))
    tc.check(last < first, "loss went down: %.3f -> %.3f" % (first, last))
    if not CPU:
        tc.check(len(busy) == 2 and all(b[0] > 0 and b[1] > 0 for b in busy.values()),
                 "both GPUs showed utilization and memory while the job ran: %s" % busy)

    st, j = c.request("POST", "/v1/jobs", spec(shards, 100000, 5, "gpu-retry"))
    tc.check(st == 201, "submit: %s %s" % (st, j))
    jid = j["id"]
    j = c.wait_state(jid, "running", 60)

    def has_ckpt():
        st, out = c.get("/v1/jobs/%s/logs?rank=0&stream=stdout" % jid)
        return st == 200 and '"type":"checkpoint"' in out
    c.wait(has_ckpt, 120, "a first checkpoint")
    pidfile = os.path.join(c.tmp, "gpu-node", "tasks", "%s.0.1" % jid, "pid")
    pid = int(open(pidfile).read().split()[0])
    os.kill(pid, signal.SIGKILL)
    c.wait(lambda: c.job(jid)["attempt"] == 1, 30, "retry after the killed rank")
    why = [e[3] for e in tc.event_reasons(c, jid) if e[1] == "queued" and e[2] == 1]
    tc.check(why and "rank 1" in why[0], "retry reason names rank 1: %s" % why)
    c.wait_state(jid, "running", 60)

    def resumed():
        st, out = c.get("/v1/jobs/%s/logs?rank=0&stream=stdout&attempt=1" % jid)
        if st != 200 or not out.strip():
            return False
        s = json.loads(out.splitlines()[0])
        return s.get("type") == "start" and s.get("start_step", 0) >= 5
    c.wait(resumed, 120, "attempt 1 to resume from a checkpoint (start_step >= 5)")
    print("retry: rank 1 killed (%s); attempt 1 resumed from a checkpoint" % why[0])
    c.request("POST", "/v1/jobs/%s/cancel" % jid, {})
    c.wait_state(jid, "cancelled", 30)


def main():
    for b in ("loomd", "loom-agent", "loom-worker", "loom-data"):
        if not os.access(os.path.join(BIN_DIR, b), os.X_OK):
            print("SKIP: %s not built" % b)
            return 77
    if not CPU:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout \
            if subprocess.run(["which", "nvidia-smi"], capture_output=True).returncode == 0 else ""
        if sum(1 for l in out.splitlines() if l.startswith("GPU ")) < 2:
            print("SKIP: fewer than 2 GPUs")
            return 77
    c = tc.Cluster(nodes=0, worker=os.path.join(BIN_DIR, "loom-worker"))
    ok = False
    try:
        scenario(c)
        ok = True
        print("PASS cluster_gpu")
        return 0
    except tc.Fail as e:
        print("FAIL cluster_gpu: %s" % e)
        return 1
    finally:
        c.close(ok)


if __name__ == "__main__":
    sys.exit(main())
