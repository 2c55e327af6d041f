#!/usr/bin/env python3
"""Fair shared fleet integration tests: a real loomd and loom-agents with
--cpu-devices running tests/fake_worker (the cluster of test_cluster.py).

Scenarios:
  qos         PATCH /v1/tenants/{id} QoS fields: validation (nothing changes),
              PRIORITY_TOO_HIGH naming both values, max_running_jobs holding
              jobs queued with a pending_reason naming the limit,
              BUDGET_EXHAUSTED once this month's usage reached the budget.
  time_limit  max_runtime_s ends a job: failed, event reason TIME_LIMIT, the
              worker stopped by SIGTERM (no rank left alive).
  fair_share  after one tenant used the cluster, another tenant's job of the
              same priority starts before its earlier-submitted job.
  after       `after` holds a job until its dependencies succeed; a failed
              dependency fails the dependent job with DEPENDENCY_FAILED <id>.
  array       an `array` of 3 learning rates makes 3 jobs labelled with one
              array id; a bad member stores nothing; another tenant cannot
              cancel it; POST /v1/arrays/{id}/cancel cancels all 3.
  preempt     the real cpu loom-worker on one device: a preemptible low-
              priority job runs, another tenant's high-priority job arrives;
              the low one checkpoints within its grace and is requeued
              (PREEMPTED by <job>, job.preempted, no retry used), the high one
              runs, the low one resumes from that checkpoint and succeeds, and
              its losses equal an uninterrupted run's, bit for bit.
  budget      the real cpu loom-worker on one device: a running job whose
              tenant's gpu_hours_per_month is used up mid-job writes a final
              checkpoint within its grace and fails with BUDGET_EXHAUSTED (not
              requeued); queued jobs wait; with budget_warn_only a job over
              the budget gets one BUDGET_EXHAUSTED event and succeeds.

Usage: test_fair_share.py BIN_DIR SCENARIO. Exit 0 pass, 1 fail, 77 skip."""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIO = sys.argv[2]
sys.argv = [sys.argv[0], sys.argv[1], "none"]  # test_cluster reads BIN_DIR SCENARIO
sys.path.insert(0, HERE)
import test_cluster as tc  # noqa: E402

check = tc.check
ADMIN = tc.ADMIN


def spec_of(c, world=1, steps=10, step_ms=100, priority=50, labels=None, **extra):
    lab = {"fake_step_ms": str(step_ms)}
    lab.update(labels or {})
    s = {
        "name": "fs",
        "model": {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 64, "d_ff": 256,
                  "vocab_size": 256, "seq_len": 32},
        "data": {"train": os.path.join(c.data, "train_000.bin")},
        "parallel": {"dp": world, "tp": 1, "pp": 1},
        "train": {"steps": steps, "global_batch_tokens": 128 * world, "micro_batch": 4,
                  "precision": "fp32"},
        "resources": {"device": "cpu", "gpus_per_node": 2},
        "labels": lab,
        "priority": priority,
        "max_retries": 0,
    }
    s.update(extra)
    return s


def reasons_to(c, jid, state):
    return [r for (_f, to, _a, r) in tc.event_reasons(c, jid) if to == state]


def submit(c, expect=201, **kw):
    st, j = c.request("POST", "/v1/jobs", spec_of(c, **kw))
    check(st == expect, "submit (expect %d): %s %s" % (expect, st, j))
    return j["id"] if expect == 201 else j


def patch(c, body):
    return c.request("PATCH", "/v1/tenants/" + c.tenant, body, token=ADMIN)


def sc_qos(c):
    # Validation: bad values are refused with the field named; nothing changes.
    for body, field in (({"max_priority": 101}, "max_priority"),
                        ({"max_priority": "high"}, "max_priority"),
                        ({"max_running_jobs": -1}, "max_running_jobs"),
                        ({"gpu_hours_per_month": -0.5}, "gpu_hours_per_month"),
                        ({"max_priority": 10, "gpu_quota": -3}, "gpu_quota")):
        st, r = patch(c, body)
        check(st == 422 and r["error"]["code"] == "INVALID_FIELD" and
              field in r["error"]["message"], "PATCH %s refused: %s %s" % (body, st, r))
    st, t = c.get("/v1/tenants/" + c.tenant, token=ADMIN)
    check(st == 200 and t["max_priority"] == -1 and t["max_running_jobs"] == 0 and
          t["gpu_hours_per_month"] == 0, "defaults unchanged after refused PATCHes: %s" % t)
    st, r = patch(c, {"max_priority": 60, "max_running_jobs": 1})
    check(st == 200 and r["max_priority"] == 60 and r["max_running_jobs"] == 1,
          "PATCH sets max_priority and max_running_jobs: %s %s" % (st, r))
    st, lst = c.get("/v1/tenants", token=ADMIN)
    mine = [t for t in lst["items"] if t["id"] == c.tenant] if st == 200 else []
    check(len(mine) == 1 and mine[0]["max_priority"] == 60 and mine[0]["max_running_jobs"] == 1,
          "the tenant list shows the QoS fields: %s" % mine)
    st, r = c.request("PATCH", "/v1/tenants/" + c.tenant, {"max_priority": 1}, token=c.token)
    check(st == 403, "a tenant cannot set its own QoS: %s" % st)

    # Priority above the limit: refused (not clamped), both values named.
    r = submit(c, expect=422, priority=61)
    check(r["error"]["code"] == "PRIORITY_TOO_HIGH" and "61" in r["error"]["message"] and
          "60" in r["error"]["message"], "PRIORITY_TOO_HIGH names 61 and 60: %s" % r)
    st, lst = c.get("/v1/jobs")
    check(st == 200 and len(lst["items"]) == 0, "the refused submit stored no job")

    # max_running_jobs=1: the second job waits with the limit as its reason.
    a = submit(c, priority=60, steps=40, step_ms=100)  # 4 s: b is seen waiting while a runs
    b = submit(c, priority=60, steps=2, step_ms=50)
    c.wait_state(a, ("running",), 20)

    def b_waits():
        j = c.job(b)
        return j["state"] == "queued" and "max_running_jobs" in (j.get("pending_reason") or "")
    c.wait(b_waits, 10, "second job queued on max_running_jobs")
    check("1 of 1" in c.job(b)["pending_reason"], "reason names the limit: %s" %
          c.job(b)["pending_reason"])
    c.wait_state(a, ("succeeded",), 30)
    c.wait_state(b, ("succeeded",), 30)

    # Budget: the first job used some GPU-seconds this month; a budget below
    # that refuses new jobs, 0 lifts the limit again.
    st, r = patch(c, {"gpu_hours_per_month": 0.0001})
    check(st == 200 and abs(r["gpu_hours_per_month"] - 0.0001) < 1e-12, "budget set: %s" % r)
    r = submit(c, expect=409, priority=10)
    check(r["error"]["code"] == "BUDGET_EXHAUSTED" and "GPU-hours" in r["error"]["message"],
          "BUDGET_EXHAUSTED names the usage and the budget: %s" % r)
    st, r = patch(c, {"gpu_hours_per_month": 0})
    check(st == 200, "budget lifted")
    submit(c, priority=10, steps=1, step_ms=10)


def sc_time_limit(c):
    jid = submit(c, world=2, steps=1000, step_ms=100, max_runtime_s=2)
    c.wait_state(jid, ("running",), 20)
    t0 = time.time()
    c.wait_state(jid, ("failed",), 20)
    check(time.time() - t0 < 10, "ended near its limit (%.1f s after running)" % (time.time() - t0))
    reasons = reasons_to(c, jid, "failed")
    check(len(reasons) == 1 and reasons[0].startswith("TIME_LIMIT") and
          "max_runtime_s=2" in reasons[0], "failed with a TIME_LIMIT reason: %s" % reasons)
    c.wait(lambda: not c.alive_workers(jid), 10, "no worker left alive (SIGTERM)")
    # Without a limit the same job keeps running past 2 s.
    free = submit(c, world=1, steps=150, step_ms=100)
    c.wait_state(free, ("running",), 20)
    time.sleep(3)
    check(c.job(free)["state"] == "running", "a job without max_runtime_s keeps running")
    c.request("POST", "/v1/jobs/%s/cancel" % free)


def sc_after(c):
    a = submit(c, steps=30, step_ms=100)  # 3 s: b is seen waiting while a runs
    b = submit(c, steps=2, step_ms=20, after=[a])

    def b_waits():
        j = c.job(b)
        return j["state"] == "queued" and ("waiting for " + a) in (j.get("pending_reason") or "")
    c.wait(b_waits, 10, "dependent job waits for its dependency")
    c.wait_state(a, ("succeeded",), 30)
    c.wait_state(b, ("succeeded",), 30)
    ja, jb = c.job(a), c.job(b)
    check(jb["started_at"] >= ja["finished_at"], "b started after a finished: %s >= %s" %
          (jb["started_at"], ja["finished_at"]))

    bad = submit(c, steps=10, step_ms=50, labels={"fake_crash_step": "2"})
    dep = submit(c, steps=2, step_ms=20, after=[bad])
    c.wait_state(bad, ("failed",), 30)
    c.wait_state(dep, ("failed",), 20)
    reasons = reasons_to(c, dep, "failed")
    check(len(reasons) == 1 and reasons[0].startswith("DEPENDENCY_FAILED " + bad),
          "DEPENDENCY_FAILED names %s: %s" % (bad, reasons))
    check(c.job(dep).get("started_at") is None, "the dependent job never started")


def sc_array(c):
    st, lst = c.get("/v1/jobs")
    before = len(lst["items"])
    st, r = c.request("POST", "/v1/jobs", spec_of(c, steps=400, step_ms=100,
                                                  array={"model.n_layer": [2, 0]}))
    check(st == 422 and "model.n_layer" in json.dumps(r), "a bad member is refused: %s %s" %
          (st, r))
    st, lst = c.get("/v1/jobs")
    check(len(lst["items"]) == before, "the refused array stored nothing")
    st, r = c.request("POST", "/v1/jobs", spec_of(c, steps=400, step_ms=100,
                                                  array={"train.lr": [1e-4, 3e-4, 1e-3]}))
    check(st == 201 and r["array_id"].startswith("a-") and len(r["items"]) == 3,
          "an array of 3 makes 3 jobs: %s %s" % (st, r))
    aid = r["array_id"]
    ids = [j["id"] for j in r["items"]]
    lrs = []
    for i, jid in enumerate(ids):
        j = c.job(jid)
        lrs.append(j["spec"]["train"]["lr"])
        check(j["labels"].get("loom.array") == aid and j["labels"].get("loom.array_index") ==
              str(i) and "array" not in j["spec"], "member %d labelled, no array key: %s" % (i, j))
    check(lrs == [1e-4, 3e-4, 1e-3], "each member has its value: %s" % lrs)
    st, lst = c.get("/v1/jobs?label=loom.array=" + aid)
    check(st == 200 and sorted(j["id"] for j in lst["items"]) == sorted(ids),
          "the array lists by its label: %s" % lst)
    c.wait_state(ids[0], ("running",), 20)
    other, other_token = c.new_tenant("beta")
    st, r = c.request("POST", "/v1/arrays/%s/cancel" % aid, {}, token=other_token)
    check(st == 404, "another tenant cannot cancel it: %s %s" % (st, r))
    check(all(c.job(j)["state"] in ("queued", "starting", "running") for j in ids),
          "nothing was cancelled by the other tenant")
    st, r = c.request("POST", "/v1/arrays/a-000000000000/cancel", {})
    check(st == 404 and r["error"]["code"] == "NOT_FOUND", "unknown array: %s %s" % (st, r))
    st, r = c.request("POST", "/v1/arrays/%s/cancel" % aid, {})
    check(st == 200 and r["jobs"] == 3, "cancel the array: %s %s" % (st, r))
    for jid in ids:
        c.wait_state(jid, ("cancelled",), 20)


def losses(c, jid, token="tenant"):
    st, m = c.get("/v1/jobs/%s/metrics" % jid, token=token)
    check(st == 200, "metrics of %s: %s %s" % (jid, st, m))
    return {p["step"]: p["loss"] for p in m["series"]}


def sc_preempt(c):
    low = tc.real_spec(c, 1, 200, 20)
    low.update({"priority": 10, "preemptible": True, "max_retries": 0})
    # The reference: the same job, never interrupted.
    st, j = c.request("POST", "/v1/jobs", low)
    check(st == 201, "reference submit: %s %s" % (st, j))
    ref = j["id"]
    c.wait_state(ref, ("succeeded",), 120)
    want = losses(c, ref)
    check(len(want) == 200, "reference recorded 200 steps: %d" % len(want))

    st, j = c.request("POST", "/v1/jobs", low)
    jid = j["id"]
    c.wait_state(jid, ("running",), 30)
    c.wait(lambda: len(losses(c, jid)) >= 30, 60, "the low job past step 30")
    other, other_token = c.new_tenant("beta")
    high = tc.real_spec(c, 1, 5, 0)
    high.update({"priority": 90, "max_retries": 0})
    high.pop("checkpoint")
    st, h = c.request("POST", "/v1/jobs", high, token=other_token)
    check(st == 201, "high submit: %s %s" % (st, h))
    hid = h["id"]
    c.wait_state(hid, ("succeeded",), 90, token=other_token)
    c.wait_state(jid, ("succeeded",), 120)
    ev = tc.event_reasons(c, jid)
    pre = [e for e in ev if e[1] == "queued" and e[3].startswith("PREEMPTED by " + hid)]
    check(len(pre) == 1, "one requeue with reason PREEMPTED by %s: %s" % (hid, ev))
    j = c.job(jid)
    check(j["attempt"] == 1 and j["preemptions"] == 1 and j["max_retries"] == 0,
          "succeeded on attempt 1 after one preemption with max_retries 0: %s" % j)
    st, out = c.get("/v1/jobs/%s/logs?rank=0&stream=stdout&attempt=1" % jid)
    start = json.loads(out.splitlines()[0]) if st == 200 and out.strip() else {}
    check(start.get("type") == "start" and start.get("start_step", 0) >= 30,
          "attempt 1 resumed from the checkpoint written at the stop: %s" % start)
    st, e = c.get("/v1/events?job=%s&type=job.preempted" % jid)
    check(st == 200 and len(e["items"]) == 1 and hid in e["items"][0]["data"]["reason"],
          "a job.preempted event names the high job: %s %s" % (st, e))
    jh = c.job(hid, token=other_token)
    check(jh["started_at"] < j["finished_at"], "the high job ran before the low one finished")
    # Billing: the preempted attempt is billed once, under cause "preempted",
    # and the CSV invoice has a line per month, tenant and GPU type.
    st, u = c.get("/v1/usage?group_by=cause")
    causes = {r["key"]: r for r in u.get("rows", [])} if st == 200 else {}
    check("preempted" in causes and "user" in causes and causes["preempted"]["cost"] > 0,
          "usage by cause shows the billed preempted attempt: %s %s" % (st, u))
    st, csv = c.get("/v1/usage?format=csv", token=ADMIN)
    lines = csv.strip().splitlines() if st == 200 and isinstance(csv, str) else []
    check(lines and lines[0] == "month,tenant,gpu_type,currency,gpu_hours,billed_gpu_hours,cost"
          and any(("," + c.tenant + ",") in ln for ln in lines[1:]) and
          any(("," + other + ",") in ln for ln in lines[1:]),
          "CSV invoice lists both tenants: %s %r" % (st, csv))
    st, r = c.get("/v1/usage?format=xml")
    check(st == 400 and r["error"]["code"] == "INVALID_FORMAT" and "xml" in r["error"]["message"],
          "format=xml refused: %s %s" % (st, r))
    got = losses(c, jid)
    check(sorted(got) == list(range(1, 201)), "every step recorded once: %d steps" % len(got))
    diff = [s for s in want if got.get(s) != want[s]]
    check(not diff, "losses after the resume equal the uninterrupted run's bit for bit; "
          "first differing steps %s" % diff[:5])


def sc_budget(c):
    st, r = patch(c, {"budget_warn_only": "yes"})
    check(st == 422 and r["error"]["code"] == "INVALID_FIELD" and
          "budget_warn_only" in r["error"]["message"], "budget_warn_only must be a boolean: %s %s"
          % (st, r))
    st, t = c.get("/v1/tenants/" + c.tenant, token=ADMIN)
    check(st == 200 and t["budget_warn_only"] is False, "default: stop, not warn: %s" % t)

    # A long job runs; its checkpoints are every 100000 steps, so any
    # checkpoint is the one written at the stop.
    spec = tc.real_spec(c, 1, 100000, 100000)
    spec["max_retries"] = 3
    st, j = c.request("POST", "/v1/jobs", spec)
    check(st == 201, "submit: %s %s" % (st, j))
    jid = j["id"]
    c.wait_state(jid, ("running",), 30)
    c.wait(lambda: len(losses(c, jid)) >= 20, 60, "the job past step 20")
    at = max(losses(c, jid))
    small = tc.real_spec(c, 1, 5, 0)
    small.pop("checkpoint")
    st, j = c.request("POST", "/v1/jobs", small)  # waits behind the running job (one device)
    check(st == 201, "submit: %s %s" % (st, j))
    queued = j["id"]
    # The budget is below what the running attempt used already.
    t0 = time.time()
    st, r = patch(c, {"gpu_hours_per_month": 0.0001})
    check(st == 200, "budget set: %s %s" % (st, r))
    c.wait_state(jid, ("failed",), 30)
    c.wait(lambda: not c.alive_workers(jid), 30, "the worker exited")
    took = time.time() - t0
    check(took < 20, "stopped within its grace (%.1f s after the budget was set)" % took)
    reasons = reasons_to(c, jid, "failed")
    check(len(reasons) == 1 and reasons[0].startswith("BUDGET_EXHAUSTED") and
          "not retried" in reasons[0], "failed with BUDGET_EXHAUSTED: %s" % reasons)
    j = c.job(jid)
    check(j["attempt"] == 0 and not reasons_to(c, jid, "queued")[1:],
          "not requeued (retries were left): attempt %s, events %s" % (j["attempt"],
                                                                     tc.event_reasons(c, jid)))
    # The worker's own records (its stdout, as loomd keeps it) show the
    # checkpoint written at the stop and a summary of a stopped run.
    def worker_records():
        st, out = c.get("/v1/jobs/%s/logs?rank=0&stream=stdout&attempt=0" % jid)
        recs = []
        for ln in (out.splitlines() if st == 200 and isinstance(out, str) else []):
            try:
                recs.append(json.loads(ln))
            except ValueError:
                pass
        return recs

    def stopped():
        return any(r.get("type") == "summary" for r in worker_records())
    c.wait(stopped, 15, "the worker's summary in its log")
    recs = worker_records()
    ck = [r["step"] for r in recs if r.get("type") == "checkpoint"]
    summ = [r for r in recs if r.get("type") == "summary"]
    check(len(ck) == 1 and ck[0] >= at and summ and summ[0].get("stopped") is True and
          summ[0].get("checkpoint"), "a final checkpoint at the stop (step >= %d): %s %s" %
          (at, ck, summ))
    check(os.path.isdir(summ[0]["checkpoint"]), "the checkpoint is on disk: %s" %
          summ[0]["checkpoint"])

    def saved():
        st, e = c.get("/v1/events?job=%s&type=checkpoint.saved" % jid)
        return st == 200 and [it["data"]["step"] for it in e["items"]] == ck
    c.wait(saved, 15, "a checkpoint.saved event for step %s" % ck)
    def held():
        q = c.job(queued)
        return q["state"] == "queued" and (q.get("pending_reason") or "").startswith(
            "BUDGET_EXHAUSTED")
    c.wait(held, 10, "the queued job waits on the budget")
    time.sleep(2)
    check(c.job(queued)["state"] == "queued", "the queued job does not start")
    st, r = c.request("POST", "/v1/jobs", small)
    check(st == 409 and r["error"]["code"] == "BUDGET_EXHAUSTED", "new jobs refused: %s %s" %
          (st, r))

    # Warn-only: submits are accepted, running jobs get one event and go on.
    st, r = patch(c, {"budget_warn_only": True})
    check(st == 200 and r["budget_warn_only"] is True, "warn-only set: %s %s" % (st, r))
    c.wait_state(queued, ("succeeded",), 60)
    spec = tc.real_spec(c, 1, 150, 0)
    spec.pop("checkpoint")
    st, j = c.request("POST", "/v1/jobs", spec)
    check(st == 201, "warn-only: submit accepted over the budget: %s %s" % (st, j))
    wid = j["id"]
    c.wait_state(wid, ("succeeded",), 120)
    warns = [e for e in tc.event_reasons(c, wid) if e[3].startswith("BUDGET_EXHAUSTED")]
    check(len(warns) == 1 and "warn-only" in warns[0][3] and warns[0][0] == warns[0][1],
          "one warn-only BUDGET_EXHAUSTED event, no state change: %s" % warns)
    check(len(losses(c, wid)) == 150, "the warned job ran every step")


def sc_fair_share(c):
    # acme uses the whole cluster (4 cpu devices) for a while: usage rows.
    used = submit(c, world=4, steps=10, step_ms=100)
    c.wait_state(used, ("succeeded",), 30)
    st, u = c.get("/v1/usage?group_by=tenant", token=ADMIN)
    check(st == 200, "usage readable: %s %s" % (st, u))
    other, other_token = c.new_tenant("beta")
    # A blocker holds the cluster; then acme submits first, beta second, at
    # one priority. When the blocker ends beta (no usage) must start first.
    # The blocker runs 4 s, so that both submits land while it holds the
    # cluster however loaded the machine is.
    blocker = submit(c, world=4, steps=40, step_ms=100)
    c.wait_state(blocker, ("running",), 20)
    a = submit(c, world=4, steps=5, step_ms=100)
    time.sleep(0.05)
    st, j = c.request("POST", "/v1/jobs", spec_of(c, world=4, steps=5, step_ms=100),
                      token=other_token)
    check(st == 201, "beta submits: %s %s" % (st, j))
    b = j["id"]
    c.wait_state(b, ("running", "succeeded"), 30, token=other_token)
    check(c.job(a)["state"] == "queued",
          "acme's earlier job still waits while beta's runs: %s" % c.job(a)["state"])
    c.wait_state(a, ("succeeded",), 30)
    jb = c.job(b, token=other_token)
    check(jb["started_at"] < c.job(a)["started_at"], "beta started before acme")


SCENARIOS = {"qos": sc_qos, "time_limit": sc_time_limit, "after": sc_after,
             "fair_share": sc_fair_share, "preempt": sc_preempt, "array": sc_array,
             "budget": sc_budget}


def main():
    if SCENARIO not in SCENARIOS:
        print("unknown scenario", SCENARIO)
        return 1
    if not os.access(tc.WORKER, os.X_OK):
        print("SKIP: %s not built" % tc.WORKER)
        return 77
    if SCENARIO == "preempt":
        # The tiny real job runs 200 steps in about 0.3 s, less than it takes
        # the test to see step 30 (records are shipped every 300 ms) plus the
        # preemption: it could end before the high job arrives. The worker's
        # test knob sleeps 15 ms in each step of rank 0 (counted as compute,
        # numerics untouched), so the low job runs at least 3 s.
        os.environ.update(LOOM_DEBUG_SLOW_RANK="0", LOOM_DEBUG_SLOW_MS="15")
    if SCENARIO in ("preempt", "budget"):
        c = tc.Cluster(nodes=1, devices=1, hang_timeout=60,
                       worker=os.path.join(tc.BIN, "loom-worker"),
                       loomd_args=["--preempt-min-runtime", "0", "--preempt-grace", "10"])
    else:
        c = tc.Cluster(nodes=2, devices=2)
    ok = False
    try:
        SCENARIOS[SCENARIO](c)
        ok = True
        print("PASS", SCENARIO)
        return 0
    except tc.Fail as e:
        print("FAIL %s: %s" % (SCENARIO, e))
        return 1
    finally:
        c.close(ok)


if __name__ == "__main__":
    sys.exit(main())
