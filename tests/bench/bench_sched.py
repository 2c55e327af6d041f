#!/usr/bin/env python3
"""Scheduler / agent benchmark on an idle two-agent loopback cluster (real
loomd, two loom-agents with --cpu-devices 2, tests/fake_worker):

1. submit-to-all-ranks-started latency, p50/p99, for 1-rank and 4-rank jobs
   (server timestamps: job.started_at - job.created_at; started_at is set when
   every rank has been reported running);
2. throughput: jobs completed per minute for N tiny 1-rank jobs submitted at once;
3. lost-node detection: kill -9 of an agent (and its workers) with a job on it,
   time until the job is re-queued (default node timeout 15 s).

Usage: bench_sched.py BIN_DIR [--latency-jobs 50] [--tiny-jobs 500] [--node-timeout 15]
Prints a Markdown table for docs/perf.md."""
import argparse
import datetime
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.argv, ARGS = sys.argv[:2] + ["happy"], sys.argv[2:]
import test_cluster as tc  # noqa: E402


def ts(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def latency(c, world, n):
    out = []
    for _ in range(n):
        jid = c.submit(world=world, steps=1, step_ms=1, max_retries=0)
        j = c.wait_state(jid, "succeeded", 30)
        out.append((ts(j["started_at"]) - ts(j["created_at"])) * 1000.0)
    return out


def throughput(c, n):
    t0 = time.time()
    ids = [c.submit(world=1, steps=1, step_ms=0, max_retries=0, name="tiny") for _ in range(n)]
    t_sub = time.time() - t0
    pending = set(ids)
    while pending:
        st, r = c.get("/v1/jobs?state=succeeded&limit=1000")
        if st == 200:
            pending -= set(j["id"] for j in r["items"])
        st, r = c.get("/v1/jobs?state=failed&limit=10")
        tc.check(st != 200 or not r["items"], "a tiny job failed: %s" % (r["items"][:1],))
        tc.check(time.time() - t0 < 600, "throughput run took over 10 minutes")
        time.sleep(0.2)
    took = time.time() - t0
    return took, t_sub


def lost_node(c):
    jid = c.submit(world=2, steps=1000, step_ms=100, max_retries=1)
    j = c.wait_state(jid, "running", 10)
    node = j["placement"][0]["node"]
    t0 = time.time()
    tc.kill_node(c, node)
    c.wait(lambda: c.job(jid)["attempt"] == 1, c.node_timeout + 30, "re-queue")
    requeue = time.time() - t0
    why = [e["reason"] for e in c.events(jid) if e["to"] == "queued" and e["attempt"] == 1]
    tc.check(why and "lost" in why[0], "re-queued because the node was lost: %s" % why)
    c.wait_state(jid, "running", 30)
    restart = time.time() - t0
    c.request("POST", "/v1/jobs/%s/cancel" % jid, {})
    return requeue, restart


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency-jobs", type=int, default=50)
    ap.add_argument("--tiny-jobs", type=int, default=500)
    ap.add_argument("--node-timeout", type=int, default=15)
    a = ap.parse_args(ARGS)
    rows = []
    # A long hang timeout, so the lost-node case measures node loss only.
    c = tc.Cluster(node_timeout=a.node_timeout, hang_timeout=600)
    ok = False
    try:
        for world in (1, 4):
            lat = latency(c, world, a.latency_jobs)
            rows.append(("submit → all ranks started, %d-rank (%d jobs)" % (world, len(lat)),
                         "p50 %.0f ms, p99 %.0f ms, max %.0f ms" % (pct(lat, 50), pct(lat, 99),
                                                                     max(lat))))
            print(rows[-1], flush=True)
        took, t_sub = throughput(c, a.tiny_jobs)
        rows.append(("%d tiny 1-rank jobs, 4 cpu devices" % a.tiny_jobs,
                     "%.1f s (%.0f jobs/min; submits took %.1f s)" % (took, a.tiny_jobs * 60 / took,
                                                                     t_sub)))
        print(rows[-1], flush=True)
        requeue, restart = lost_node(c)
        rows.append(("kill -9 of a node's agent + workers → job re-queued (node timeout %d s)"
                     % a.node_timeout, "%.1f s (running again on the other node after %.1f s)"
                     % (requeue, restart)))
        print(rows[-1], flush=True)
        ok = True
    finally:
        c.close(ok)
    print("\n| measurement | result |\n|---|---|")
    for r in rows:
        print("| %s | %s |" % r)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
