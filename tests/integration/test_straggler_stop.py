#!/usr/bin/env python3
"""A straggler made from outside: loomd and one loom-agent (--cpu-devices 2)
run a dp2 cpu job with the real loom-worker; once it trains, this test
pauses rank 1's worker with SIGSTOP for 20 ms of every 30 ms (SIGCONT for
the rest), as a node whose cores are taken by something else would. The
cycle is shorter than a step's compute (about 20 ms of running), so every
step of rank 1 is stopped at least twice in its compute: with a cycle longer
than a step (60 of every 100 ms) a stop lands in the compute of some steps,
inside the gradient exchange of others (everyone waits then, the straggler
too) and misses others, so a streak of slow steps comes by chance and
several exchange-bound steps in a row can look like COMM_BOUND. Checks:
  - before the pauses, no STRAGGLER or COMM_BOUND finding (a tiny job on a
    loaded host: the noise floors of daemon/diagnose.c);
  - within 30 s of pausing, one STRAGGLER finding naming rank 1 and the node,
    none for rank 0, no COMM_BOUND (rank 1 waits for nobody);
  - the finding is also a job.diagnosis event of GET /v1/events.
Then the job is cancelled. Usage: test_straggler_stop.py BIN_DIR.
Exit 0 pass, 1 fail."""
import json
import os
import shutil
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, HERE)

import bench_diag  # noqa: E402  the cluster harness of the diagnosis cost bench


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)
    print("ok:", msg)


def findings(c, jid, code):
    st, e = c.req("GET", "/v1/jobs/%s/events" % jid, token=c.token)
    return [x["reason"] for x in (e or {}).get("items", [])
            if str(x.get("reason", "")).startswith(code)] if st == 200 else []


def main():
    binp = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="loom-straggler-stop-")
    c = None
    pid = None
    ok = False
    try:
        c = bench_diag.Cluster(binp, tmp)
        node = c.start_agent(True, 0)
        a = bench_diag.argparse.Namespace(preset=None, layers=2, width=128, seq=64, mbs=4,
                                          steps=3000, device="cpu")
        sp = bench_diag.make_spec(a, os.path.join(tmp, "train_000.bin"), 2, "stop")
        sp["resources"] = {"device": "cpu", "gpus_per_node": 2}
        st, j = c.req("POST", "/v1/jobs", sp, token=c.token)
        check(st == 201, "submit a dp2 cpu job: %s" % st)
        jid = j["id"]
        pidfile = os.path.join(tmp, node, "tasks", "%s.0.1" % jid, "pid")

        def trained(n):
            s, m = c.req("GET", "/v1/jobs/%s/metrics" % jid, token=c.token)
            return s == 200 and len(m["series"]) >= n

        c.wait(lambda: os.path.exists(pidfile) and trained(60), 60, "60 steps trained")
        with open(pidfile) as f:
            pid = int(f.read().split()[0])
        time.sleep(2)  # a few hundred steps of the tiny job, unpaused
        check(not findings(c, jid, "STRAGGLER") and not findings(c, jid, "COMM_BOUND"),
              "no finding before the pauses: %s" % (findings(c, jid, "")))
        end = time.time() + 30
        got = []
        while time.time() < end and not got:
            for _ in range(80):  # 2.4 s of 20 ms stopped / 10 ms running
                os.kill(pid, signal.SIGSTOP)
                time.sleep(0.020)
                os.kill(pid, signal.SIGCONT)
                time.sleep(0.010)
            got = findings(c, jid, "STRAGGLER")
        check(len(got) == 1 and got[0].startswith("STRAGGLER rank=1 node=%s " % node),
              "rank 1 named once while paused: %s" % got)
        check(not findings(c, jid, "COMM_BOUND"),
              "no COMM_BOUND: %s" % findings(c, jid, "COMM_BOUND"))
        st, e = c.req("GET", "/v1/events?job=%s&type=job.diagnosis" % jid, token=c.token)
        data = [it["data"] for it in (e or {}).get("items", []) if it["type"] == "job.diagnosis"]
        check(st == 200 and [(d.get("code"), d.get("rank")) for d in data] ==
              [("STRAGGLER", 1)], "one job.diagnosis event for rank 1: %s" % json.dumps(data))
        st, _ = c.req("POST", "/v1/jobs/%s/cancel" % jid, {}, token=c.token)
        check(st in (200, 202), "cancel: %s" % st)

        def cancelled():
            s, jj = c.req("GET", "/v1/jobs/%s" % jid, token=c.token)
            return s == 200 and jj.get("state") == "cancelled"

        c.wait(cancelled, 30, "the job cancelled (its ranks stopped)")
        ok = True
    except (Fail, bench_diag.Failed) as e:
        print("FAIL:", e)
    finally:
        if pid:
            try:
                os.kill(pid, signal.SIGCONT)  # never leave it stopped
            except OSError:
                pass
        if c:
            if c.agent:
                c.stop_agent(node)
            c.close()
        # ranks outlive a stopped agent by design: never leave this test's running
        for r in (0, 1):
            try:
                with open(os.path.join(tmp, node, "tasks", "%s.0.%d" % (jid, r), "pid")) as f:
                    os.kill(int(f.read().split()[0]), signal.SIGKILL)
            except (OSError, ValueError, NameError, UnboundLocalError):
                pass
    if ok:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print("logs in", tmp)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
