#!/usr/bin/env python3
"""Preemption latency on one cpu device (real loomd, one loom-agent with
--cpu-devices 1, the real cpu loom-worker): a preemptible low-priority job
trains; another tenant's high-priority job is submitted; measured from the
server's timestamps:

  latency      high job submitted (created_at) -> every rank running (started_at)
  decide       submit -> the victim is requeued (PREEMPTED event)
  victim stop  PREEMPTED -> the high job placed (queued -> starting): the
               victim's ranks finish their step, write the checkpoint and exit
  start        placed -> running (the high job's worker starts)

beside the victim's checkpoint size and its step time. Runs `--reps` times for
each model size (the victim's checkpoint grows with it).

Usage: bench_preempt.py BIN_DIR [--reps 3] [--sizes 32x2,256x4,512x8]
(d_model x n_layer). Prints a Markdown table for docs/perf.md."""
import argparse
import datetime
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
sys.argv, ARGS = sys.argv[:2] + ["none"], sys.argv[2:]
import test_cluster as tc  # noqa: E402


def ts(s):
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def du(path):
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def one(c, other_token, d_model, n_layer):
    low = tc.real_spec(c, 1, 1000000, 1000000)
    low["model"].update({"d_model": d_model, "n_layer": n_layer, "d_ff": 4 * d_model,
                         "n_head": max(2, d_model // 64)})
    low.update({"priority": 10, "preemptible": True, "max_retries": 0})
    st, j = c.request("POST", "/v1/jobs", low)
    tc.check(st == 201, "low submit: %s %s" % (st, j))
    lid = j["id"]
    c.wait_state(lid, ("running",), 60)

    def steps():
        st, m = c.get("/v1/jobs/%s/metrics" % lid)
        return m["series"] if st == 200 else []
    c.wait(lambda: len(steps()) >= 5, 120, "the low job past step 5")
    s = steps()
    ms = [p["ms"]["step"] for p in s if isinstance(p.get("ms"), dict) and "step" in p["ms"]]
    step_ms = sorted(ms)[len(ms) // 2] if ms else float("nan")
    high = tc.real_spec(c, 1, 3, 0)
    high.pop("checkpoint")
    high.update({"priority": 90, "max_retries": 0})
    st, h = c.request("POST", "/v1/jobs", high, token=other_token)
    tc.check(st == 201, "high submit: %s %s" % (st, h))
    hid = h["id"]
    jh = c.wait_state(hid, ("running", "succeeded"), 120, token=other_token)
    c.wait_state(hid, ("succeeded",), 120, token=other_token)
    jh = c.job(hid, token=other_token)
    ev_low = c.events(lid)
    ev_high = c.events(hid, token=other_token)
    pre = [e for e in ev_low if e["to"] == "queued" and e["reason"].startswith("PREEMPTED")]
    placed = [e for e in ev_high if e["to"] == "starting"]
    tc.check(pre and placed and jh.get("started_at"), "events: %s %s" % (ev_low, ev_high))
    t_sub, t_pre = ts(jh["created_at"]), ts(pre[0]["at"])
    t_pl, t_run = ts(placed[0]["at"]), ts(jh["started_at"])
    ck = os.path.join(c.tmp, "loomd", "jobs", lid, "checkpoints")
    size = du(ck) if os.path.isdir(ck) else 0
    c.request("POST", "/v1/jobs/%s/cancel" % lid)
    c.wait_state(lid, ("cancelled", "failed", "succeeded"), 120)
    return {"latency": (t_run - t_sub) * 1000, "decide": (t_pre - t_sub) * 1000,
            "stop": (t_pl - t_pre) * 1000, "start": (t_run - t_pl) * 1000,
            "ckpt_mb": size / 1e6, "step_ms": step_ms}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default="32x2,256x4,512x8")
    a = ap.parse_args(ARGS)
    if not os.access(os.path.join(tc.BIN, "loom-worker"), os.X_OK):
        print("SKIP: loom-worker not built")
        return 77
    c = tc.Cluster(nodes=1, devices=1, hang_timeout=120,
                   worker=os.path.join(tc.BIN, "loom-worker"),
                   loomd_args=["--preempt-min-runtime", "0", "--preempt-grace", "30"])
    ok = False
    try:
        _other, other_token = c.new_tenant("beta")
        print("| victim model (d_model x layers) | checkpoint MB | victim step ms | submit -> "
              "running ms | decide ms | victim stop (step + checkpoint + exit) ms | start ms |")
        print("|---|---|---|---|---|---|---|")
        for size in a.sizes.split(","):
            d_model, n_layer = (int(x) for x in size.split("x"))
            runs = [one(c, other_token, d_model, n_layer) for _ in range(a.reps)]
            for r in runs:
                print("| %dx%d | %.1f | %.1f | %.0f | %.0f | %.0f | %.0f |" %
                      (d_model, n_layer, r["ckpt_mb"], r["step_ms"], r["latency"], r["decide"],
                       r["stop"], r["start"]))
            sys.stdout.flush()
        ok = True
        return 0
    except tc.Fail as e:
        print("FAIL:", e)
        return 1
    finally:
        c.close(ok)


if __name__ == "__main__":
    sys.exit(main())
