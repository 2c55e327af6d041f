#!/usr/bin/env python3
"""The cpu peak for MFU through the whole system: a real loomd and a loom-agent with one cpu
device running the real loom-worker. The agent measures one device's fp32 GEMM peak at start
(loom-worker --bench-gemm, bounded at 2 s) and reports it at registration: GET /v1/nodes shows a
positive cpu_peak_gflops, below the hardware ceiling of an AVX2 core (2 FMA units x 8 lanes x 2
FLOPs at 6 GHz = 192 GFLOP/s per thread). A cpu job's step records then carry 0 < mfu <= 1.5:
the peak is measured on one GEMM shape, not a hardware limit, so a step's matmuls on other
shapes, or a quieter moment on a shared machine, may run somewhat faster than the calibration;
well above 1 would mean the peak or the FLOP count is wrong. An agent started with
--cpu-peak-gflops reports that value as given, a registration with a bad value is refused (400
INVALID_CPU_PEAK, nothing changed), the bench mode itself finishes within its bound, and the
peak survives a loomd restart (schema 150). Reuses the harness of test_cluster.py.
Usage: test_cpu_peak.py BIN_DIR. Exit 0 pass, 1 fail, 77 skip."""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN_DIR = os.path.abspath(sys.argv[1])
sys.argv = [sys.argv[0], BIN_DIR, "real_worker"]  # the harness reads its argv at import
sys.path.insert(0, HERE)
import test_cluster as tc  # noqa: E402

CEILING_PER_THREAD = 192.0


def node(c, name):
    return next((n for n in c.nodes() if n["name"] == name), None)


def spec_for(shards):
    return {
        "name": "cpu-peak",
        "model": {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 64, "d_ff": 256,
                  "vocab_size": 256, "seq_len": 32},
        "data": {"train": os.path.join(shards, "train_*.bin")},
        "parallel": {"dp": 1, "tp": 1, "pp": 1, "zero_stage": 0},
        "train": {"steps": 6, "global_batch_tokens": 256, "micro_batch": 8,
                  "precision": "fp32", "lr": 0.003, "warmup_steps": 1, "seed": 3},
        "checkpoint": {"every_steps": 6, "keep": 1},
        "resources": {"device": "cpu", "gpus_per_node": 1},
    }


def scenario(c):
    worker = os.path.join(BIN_DIR, "loom-worker")
    # the bench mode on its own: one JSON line, within the agent's 2 s bound
    t0 = time.monotonic()
    r = subprocess.run([worker, "--bench-gemm", "--threads", "1"], capture_output=True,
                       timeout=10)
    dt = time.monotonic() - t0
    lines = [json.loads(x) for x in r.stdout.decode().splitlines() if x.strip()]
    tc.check(r.returncode == 0 and len(lines) == 1 and lines[0].get("type") == "cpu_peak",
             "bench mode: rc %d, %s" % (r.returncode, r.stdout.decode()[-300:]))
    print("loom-worker --bench-gemm --threads 1: %.2f GFLOP/s in %.2f s (%s)" %
          (lines[0]["gflops"], dt, lines[0].get("isa")))
    tc.check(dt < 2.0, "bench mode took %.2f s (bound 2 s)" % dt)
    tc.check(0 < lines[0]["gflops"] <= CEILING_PER_THREAD,
             "bench gflops %s not in (0, %g]" % (lines[0]["gflops"], CEILING_PER_THREAD))

    n1 = node(c, "node-1")
    peak = n1.get("cpu_peak_gflops") if n1 else None
    threads = max(1, os.cpu_count() or 1)  # one cpu device: all the node's cores
    print("node-1 cpu_peak_gflops: %s (%d thread(s))" % (peak, threads))
    tc.check(isinstance(peak, (int, float)) and 0 < peak <= CEILING_PER_THREAD * threads,
             "node-1 cpu_peak_gflops %r not in (0, %g]" % (peak, CEILING_PER_THREAD * threads))

    # a registration with a bad value changes nothing
    for bad in (-3, 0, "fast", 1e9):
        st, j = c.request("POST", "/v1/agent/register",
                          {"node": "node-1", "kind": "cpu", "hostname": "h", "devices": [],
                           "cpu_peak_gflops": bad}, token=tc.JOIN)
        code = (j or {}).get("error", {}).get("code") if isinstance(j, dict) else None
        tc.check(st == 400 and code == "INVALID_CPU_PEAK",
                 "register cpu_peak_gflops=%r: %s %s" % (bad, st, j))
        msg = (j or {}).get("error", {}).get("message", "")
        tc.check(json.dumps(bad) in msg, "message names %r: %s" % (bad, msg))
    n1b = node(c, "node-1")
    tc.check(n1b and n1b.get("cpu_peak_gflops") == peak and n1b["devices_total"] == 1,
             "node-1 unchanged after bad registrations: %s" % n1b)

    # a cpu job: every step record has a real mfu
    shards = os.path.join(c.tmp, "shards")
    corpus = os.path.join(c.tmp, "corpus.txt")
    with open(corpus, "w") as f:
        f.write(" ".join("the node measured its peak %d times" % i for i in range(3000)))
    r = subprocess.run([os.path.join(BIN_DIR, "loom-data"), "prepare", "--in", corpus, "--out",
                        shards], capture_output=True, timeout=60)
    tc.check(r.returncode == 0, "loom-data prepare: %s" % r.stderr.decode()[-300:])
    st, j = c.request("POST", "/v1/jobs", spec_for(shards))
    tc.check(st == 201, "submit: %s %s" % (st, j))
    jid = j["id"]
    j = c.wait_state(jid, ("succeeded", "failed"), 120)
    tc.check(j["state"] == "succeeded", "job: %s" % tc.event_reasons(c, jid))
    st, m = c.get("/v1/jobs/%s/metrics" % jid)
    tc.check(st == 200 and len(m["series"]) == 6, "metrics: %s %s" % (st, m))
    mfus = [p.get("mfu") for p in m["series"]]
    print("mfu per step:", ", ".join("%.3f" % x if isinstance(x, float) else str(x)
                                     for x in mfus))
    tc.check(all(isinstance(x, (int, float)) and 0 < x <= 1.5 for x in mfus),
             "mfu not in (0, 1.5]: %s" % mfus)

    # the override: reported as given, no measurement
    c.start_agent("node-2", 1, ["--cpu-peak-gflops", "12.5"])
    c.wait(lambda: (node(c, "node-2") or {}).get("state") == "ready", 10, "node-2 registered")
    tc.check(node(c, "node-2")["cpu_peak_gflops"] == 12.5,
             "node-2 override: %s" % node(c, "node-2").get("cpu_peak_gflops"))

    # kept across a loomd restart (before the agents register again)
    c.loomd.kill()
    c.loomd.wait()
    for p in c.agents.values():
        p.kill()
        p.wait()
    c.agents.clear()
    c.start_loomd()
    tc.check(node(c, "node-1")["cpu_peak_gflops"] == peak and
             node(c, "node-2")["cpu_peak_gflops"] == 12.5,
             "after restart: %s" % [(n["name"], n.get("cpu_peak_gflops")) for n in c.nodes()])


def main():
    for b in ("loomd", "loom-agent", "loom-worker", "loom-data"):
        if not os.access(os.path.join(BIN_DIR, b), os.X_OK):
            print("SKIP: %s not built" % b)
            return 77
    c = tc.Cluster(nodes=1, devices=1, worker=os.path.join(BIN_DIR, "loom-worker"))
    ok = False
    try:
        scenario(c)
        ok = True
        print("PASS cpu_peak")
        return 0
    except tc.Fail as e:
        print("FAIL cpu_peak: %s" % e)
        return 1
    finally:
        c.close(ok)


if __name__ == "__main__":
    sys.exit(main())
