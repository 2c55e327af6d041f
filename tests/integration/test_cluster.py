#!/usr/bin/env python3
"""Cluster integration tests: a real loomd and two or three loom-agents with
--cpu-devices as separate "nodes" on loopback, running tests/fake_worker (or
the real loom-worker for the happy path when asked).

Usage: test_cluster.py BIN_DIR SCENARIO [WORKER]
Each scenario starts its own cluster on a free port in a fresh temp dir and
asserts on the job states, events, processes, logs, metrics and usage.
Exit 0 pass, 1 fail, 77 skip (cannot run here)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from loomtest import Fail, daemon_env, free_port, http  # noqa: E402

BIN = os.path.abspath(sys.argv[1])
SCENARIO = sys.argv[2]
WORKER = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else os.path.join(BIN, "fake_worker")
ADMIN = "admin-token-for-tests"
JOIN = "join-token-for-tests"


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Cluster:
    def __init__(self, nodes=2, devices=2, node_timeout=5, hang_timeout=5, worker=None,
                 loomd_args=()):
        self.worker = worker or WORKER
        self.loomd_args = list(loomd_args)
        self.tmp = tempfile.mkdtemp(prefix="loom-cluster-")
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.pids_dir = os.path.join(self.tmp, "pids")
        os.makedirs(self.pids_dir)
        self.data = os.path.join(self.tmp, "data")
        os.makedirs(self.data)
        with open(os.path.join(self.data, "train_000.bin"), "wb") as f:
            f.write(b"\0" * 4096)
        self.node_timeout = node_timeout
        self.hang_timeout = hang_timeout
        self.loomd = None
        self.agents = {}
        self.env = daemon_env(LOOM_ADMIN_TOKEN=ADMIN, LOOM_JOIN_TOKEN=JOIN,
                              FAKE_PID_DIR=self.pids_dir)
        try:
            self.start_loomd()
            for i in range(nodes):
                self.start_agent("node-%d" % (i + 1), devices)
            self.wait(lambda: len([n for n in self.nodes() if n["state"] == "ready"]) == nodes,
                      10, "agents registered")
            self.tenant, self.token = self.new_tenant("acme")
        except BaseException:
            self.close(False)  # never leave loomd or agents behind a failed start
            raise

    def log(self, name):
        return open(os.path.join(self.tmp, name + ".log"), "ab")

    def start_loomd(self):
        os.makedirs(os.path.join(self.tmp, "loomd"), exist_ok=True)
        with open(os.path.join(self.tmp, "loomd", "gpu_prices.json"), "w") as f:
            json.dump({"cpu": 0.5}, f)  # cpu "devices" cost 0.5 per hour; default is 2.0
        self.loomd = subprocess.Popen(
            [os.path.join(BIN, "loomd"), "--listen", "127.0.0.1:%d" % self.port, "--data-dir",
             os.path.join(self.tmp, "loomd"), "--node-timeout", str(self.node_timeout),
             "--hang-timeout", str(self.hang_timeout), "--heartbeat", "1",
             "--store-sync-full", "false"] + self.loomd_args,
            env=self.env, stdout=self.log("loomd"), stderr=subprocess.STDOUT)
        self.wait(lambda: self.get("/healthz", token=None)[0] == 200, 10, "loomd up")

    def start_agent(self, name, devices, extra=()):
        p = subprocess.Popen(
            [os.path.join(BIN, "loom-agent"), "--coordinator", self.url, "--name", name,
             "--work-dir", os.path.join(self.tmp, name), "--cpu-devices", str(devices),
             "--worker", self.worker, "--heartbeat-ms", "500", "--stop-grace-ms", "1000",
             "--retry-max-ms", "500"] + list(extra),
            env=self.env, stdout=self.log(name), stderr=subprocess.STDOUT)
        self.agents[name] = p
        return p

    def request(self, method, path, body=None, token="tenant"):
        if token == "tenant":
            token = self.token
        return http(self.url + path, method, body, token, by_type=True, offline=True)

    def get(self, path, token="tenant"):
        return self.request("GET", path, token=token)

    def new_tenant(self, name):
        st, t = self.request("POST", "/v1/tenants", {"name": name}, token=ADMIN)
        check(st in (200, 201), "create tenant: %s %s" % (st, t))
        st, k = self.request("POST", "/v1/tenants/%s/tokens" % t["id"], {}, token=ADMIN)
        check(st in (200, 201), "create token: %s %s" % (st, k))
        return t["id"], k["token"]

    def nodes(self):
        st, r = self.get("/v1/nodes", token=ADMIN)
        return r["nodes"] if st == 200 else []

    def submit(self, world=4, steps=10, step_ms=100, labels=None, token="tenant", ckpt=0,
               max_retries=1, priority=50, name="t", expect=201):
        lab = {"fake_step_ms": str(step_ms)}
        lab.update(labels or {})
        spec = {
            "name": name,
            "model": {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 64, "d_ff": 256,
                      "vocab_size": 256, "seq_len": 32},
            "data": {"train": os.path.join(self.data, "train_000.bin")},
            "parallel": {"dp": world, "tp": 1, "pp": 1},
            "train": {"steps": steps, "global_batch_tokens": 128 * world, "micro_batch": 4,
                      "precision": "fp32"},
            "resources": {"device": "cpu", "gpus_per_node": 2},
            "labels": lab,
            "priority": priority,
            "max_retries": max_retries,
        }
        if ckpt:
            spec["checkpoint"] = {"every_steps": ckpt, "keep": 2}
        st, j = self.request("POST", "/v1/jobs", spec, token=token)
        check(st == expect, "submit: %s %s" % (st, j))
        return j["id"] if expect == 201 else j

    def job(self, jid, token="tenant"):
        st, j = self.get("/v1/jobs/" + jid, token=token)
        check(st == 200, "get job %s: %s %s" % (jid, st, j))
        return j

    def events(self, jid, token="tenant"):
        st, e = self.get("/v1/jobs/%s/events" % jid, token=token)
        check(st == 200, "events: %s" % st)
        return e["items"]

    def wait(self, cond, timeout, what):
        end = time.time() + timeout
        while time.time() < end:
            try:
                if cond():
                    return
            except Fail:
                pass
            time.sleep(0.05)
        raise Fail("timed out after %ss waiting for %s" % (timeout, what))

    def wait_state(self, jid, states, timeout, token="tenant"):
        states = (states,) if isinstance(states, str) else states
        last = {}

        def ok():
            last["j"] = self.job(jid, token=token)
            return last["j"]["state"] in states

        try:
            self.wait(ok, timeout, "job %s to reach %s" % (jid, states))
        except Fail:
            raise Fail("job %s is %s (wanted %s); events: %s" % (
                jid, last.get("j", {}).get("state"), states, json.dumps(self.events(jid, token))))
        return last["j"]

    def workers(self, jid=None):
        """[(pid, job, attempt, rank, token)] of every worker process ever started."""
        out = []
        for name in os.listdir(self.pids_dir):
            with open(os.path.join(self.pids_dir, name)) as f:
                parts = f.read().split()
            if len(parts) == 4 and (jid is None or parts[0] == jid):
                out.append((int(name), parts[0], int(parts[1]), int(parts[2]), parts[3]))
        return out

    def alive_workers(self, jid=None):
        return [w for w in self.workers(jid) if pid_alive(w[0])]

    def close(self, ok):
        for w in self.workers():
            try:
                os.kill(w[0], signal.SIGKILL)
            except OSError:
                pass
        for p in list(self.agents.values()) + [self.loomd]:
            if p and p.poll() is None:
                p.kill()
                p.wait()
        if ok and not os.environ.get("LOOM_KEEP_TEST_DIR"):
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            print("cluster files kept in", self.tmp)


def event_reasons(c, jid):
    return [(e["from"], e["to"], e["attempt"], e["reason"]) for e in c.events(jid)]


# ---------------- scenarios ----------------


def sc_happy(c):
    t0 = time.time()
    jid = c.submit(world=4, steps=10, step_ms=100)
    j = c.wait_state(jid, "running", 10)
    started = time.time() - t0
    nodes = sorted(set(p["node"] for p in j["placement"]))
    check(nodes == ["node-1", "node-2"], "4 ranks on two 2-device nodes: %s" % j["placement"])
    # loomctl logs -f streams while the job runs and ends after it finished
    env = dict(c.env, LOOM_URL=c.url, LOOM_TOKEN=c.token)
    follower = subprocess.Popen([os.path.join(BIN, "loomctl"), "logs", jid, "--rank", "3", "-f"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    c.wait_state(jid, "succeeded", 20)
    try:
        fout, ferr = follower.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        follower.kill()
        raise Fail("loomctl logs -f did not end after the job finished")
    check(follower.returncode == 0 and b"step 10 loss" in fout and b"done" in fout,
          "logs -f output: rc %s, %r %r" % (follower.returncode, fout[-200:], ferr))
    for args, want in ((["nodes"], "node-2"), (["metrics", jid], "10"),
                       (["usage", "--group-by", "job"], jid)):
        r = subprocess.run([os.path.join(BIN, "loomctl")] + args, env=env, capture_output=True,
                           timeout=10)
        check(r.returncode == 0 and want in r.stdout.decode(),
              "loomctl %s: %s %s" % (args, r.stdout.decode(), r.stderr.decode()))
    ws = c.workers(jid)
    check(sorted(w[3] for w in ws) == [0, 1, 2, 3], "one worker per rank: %s" % ws)
    c.wait(lambda: not c.alive_workers(jid), 5, "workers gone")
    # logs of rank 2 (stderr text), metrics series of rank 0, usage rows
    def logs_ok():
        st, text = c.get("/v1/jobs/%s/logs?rank=2" % jid)
        return (st == 200 and "step 10 loss" in text and "rank 2/4" in text
                and "rendezvous ok" in text)
    c.wait(logs_ok, 5, "rank 2 logs shipped")
    st, m = c.get("/v1/jobs/%s/metrics" % jid)
    check(st == 200 and [p["step"] for p in m["series"]] == list(range(1, 11)),
          "metrics steps 1..10: %s" % (m if st != 200 else [p["step"] for p in m["series"]]))
    check(abs(m["series"][-1]["loss"] - 10.0 / 11) < 1e-4, "loss of step 10")
    st, u = c.get("/v1/usage?group_by=job")
    check(st == 200 and len(u["rows"]) == 1 and u["rows"][0]["key"] == jid,
          "usage by job: %s" % u)
    check(u["rows"][0]["rows"] == 2 and u["total"]["gpu_seconds"] > 3.0,
          "usage: 2 node rows, >= 4 ranks x ~1 s: %s" % u)
    check(abs(u["total"]["cost"] - u["total"]["gpu_hours"] * 0.5) < 1e-9,
          "cost at the cpu model's price from gpu_prices.json: %s" % u["total"])
    month = time.strftime("%Y-%m", time.gmtime())
    st, um = c.get("/v1/usage?group_by=month")
    check(st == 200 and [r["key"] for r in um["rows"]] == [month], "usage by month: %s" % um)
    tomorrow = time.strftime("%Y-%m-%d", time.gmtime(time.time() + 86400))
    st, uf = c.get("/v1/usage?from=" + tomorrow)
    check(st == 200 and uf["rows"] == [], "usage from tomorrow is empty: %s" % uf)
    check(c.get("/v1/usage?from=yesterday")[0] == 400, "bad time: 400")
    st, ua = c.get("/v1/usage?group_by=tenant", token=ADMIN)
    check(st == 200 and [r["key"] for r in ua["rows"]] == [c.tenant], "admin sees all: %s" % ua)
    # another tenant sees neither the job nor its usage
    _, tok2 = c.new_tenant("other")
    check(c.get("/v1/jobs/%s/logs" % jid, token=tok2)[0] == 404, "other tenant: logs 404")
    st, u2 = c.get("/v1/usage", token=tok2)
    check(st == 200 and u2["rows"] == [], "other tenant: no usage")
    print("happy: submit -> running %.0f ms" % (started * 1000))


def sc_crash(c):
    """Rank 1 crashes at step 5 in attempt 0: every rank of the attempt stops
    within 5 s, attempt 1 resumes from the step-4 checkpoint and succeeds."""
    jid = c.submit(world=4, steps=12, step_ms=150, ckpt=2, max_retries=2,
                   labels={"fake_crash_step": "5", "fake_crash_rank": "1",
                           "fake_crash_attempt": "0"})
    env = dict(c.env, LOOM_URL=c.url, LOOM_TOKEN=c.token)
    follower = subprocess.Popen([os.path.join(BIN, "loomctl"), "logs", jid, "--rank", "0", "-f",
                                 "--stream", "stderr"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    c.wait(lambda: c.job(jid)["attempt"] == 1, 15, "retry to attempt 1")
    t_fail = time.time()
    c.wait(lambda: not [w for w in c.alive_workers(jid) if w[2] == 0], 5,
           "every attempt-0 rank stopped within 5 s")
    stop_s = time.time() - t_fail
    j = c.wait_state(jid, "succeeded", 30)
    check(j["attempt"] == 1, "succeeded on attempt 1: %s" % j["attempt"])
    try:
        fout, _ = follower.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        follower.kill()
        raise Fail("logs -f did not end after the job finished")
    check(b"attempt 0 rank 0/4" in fout and b"--- loom: attempt 1 ---" in fout and
          fout.rstrip().endswith(b"fake_worker: done"),
          "logs -f followed the retry into attempt 1: %r" % fout[-300:])
    ev = event_reasons(c, jid)
    fails = [e for e in ev if e[1] == "queued" and e[0] in ("running", "starting")]
    check(len(fails) == 1 and "rank 1" in fails[0][3] and "code 3" in fails[0][3],
          "retry event names rank 1 and its exit code: %s" % ev)
    # resumed from the checkpoint: attempt 1 starts past step 0
    st, text = c.get("/v1/jobs/%s/logs?rank=0&stream=stdout&attempt=1" % jid)
    start = json.loads(text.splitlines()[0])
    check(start["resume_step"] >= 2, "attempt 1 resumed from a checkpoint: %s" % start)
    print("crash: attempt 0 stopped everywhere %.2f s after the retry was visible" % stop_s)


def sc_crash_no_retry(c):
    jid = c.submit(world=2, steps=10, step_ms=50, max_retries=0,
                   labels={"fake_crash_step": "2", "fake_crash_code": "7"})
    j = c.wait_state(jid, "failed", 15)
    check("no retries left" in c.events(jid)[-1]["reason"], "failure reason")
    c.wait(lambda: not c.alive_workers(jid), 5, "workers gone")
    jid2 = c.submit(world=1, steps=5, step_ms=20, max_retries=3,
                    labels={"fake_crash_step": "1", "fake_crash_code": "2"})
    c.wait_state(jid2, "failed", 15)
    check(c.job(jid2)["attempt"] == 0, "exit code 2 (bad spec/data) is not retried")
    check("not retried" in c.events(jid2)[-1]["reason"], "reason says not retried")
    # A retry prefers another node than the one its rank failed on.
    jid3 = c.submit(world=2, steps=4, step_ms=50, max_retries=1,
                    labels={"fake_crash_step": "2", "fake_crash_attempt": "0"})
    c.wait_state(jid3, "succeeded", 20)
    ev = [e for e in c.events(jid3) if e["to"] == "starting"]
    check(len(ev) == 2, "two placements: %s" % ev)
    n0 = ev[0]["reason"].split(" on ")[-1]
    n1 = ev[1]["reason"].split(" on ")[-1]
    check(n0 != n1, "attempt 1 placed on another node (%s, then %s)" % (n0, n1))


def sc_hang(c):
    """Rank 0 stops making progress at step 3 in attempt 0: the hang timeout
    fails the attempt, which is retried and succeeds."""
    jid = c.submit(world=2, steps=6, step_ms=100, max_retries=1,
                   labels={"fake_hang_step": "3", "fake_hang_rank": "0",
                           "fake_hang_attempt": "0"})
    c.wait_state(jid, "running", 10)
    t0 = time.time()
    c.wait(lambda: c.job(jid)["attempt"] == 1, c.hang_timeout + 10, "hang detected")
    took = time.time() - t0
    c.wait(lambda: not [w for w in c.alive_workers(jid) if w[2] == 0], 5, "hung ranks killed")
    c.wait_state(jid, "succeeded", 20)
    check(any("hang" in e[3] for e in event_reasons(c, jid)), "hang named in events")
    print("hang: detected %.1f s after running (timeout %d s)" % (took, c.hang_timeout))


def kill_node(c, name):
    """kill -9 the agent and every worker it started: the node is gone."""
    c.agents[name].kill()
    c.agents[name].wait()
    wd = os.path.join(c.tmp, name, "tasks")
    for d in os.listdir(wd) if os.path.isdir(wd) else []:
        try:
            pid = int(open(os.path.join(wd, d, "pid")).read().split()[0])
            os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass


def sc_node_lost(c):
    jid = c.submit(world=2, steps=30, step_ms=100, max_retries=2)
    j = c.wait_state(jid, "running", 10)
    node = j["placement"][0]["node"]
    check(all(p["node"] == node for p in j["placement"]), "2 ranks packed on one node")
    t0 = time.time()
    kill_node(c, node)
    c.wait(lambda: c.job(jid)["attempt"] == 1, c.node_timeout + 10, "job re-queued")
    requeue = time.time() - t0
    check(requeue <= 20, "re-queued within 20 s (took %.1f)" % requeue)
    why = [e[3] for e in event_reasons(c, jid) if e[1] == "queued" and e[2] == 1]
    check(why and "node %s lost" % node in why[0], "retry names the lost node: %s" % why)
    j = c.wait_state(jid, ("running", "succeeded"), 10)
    check(all(p["node"] != node for p in j["placement"]), "re-placed on the other node")
    c.wait_state(jid, "succeeded", 30)
    lost = [n for n in c.nodes() if n["name"] == node]
    check(lost and lost[0]["state"] == "lost", "node shows lost: %s" % lost)
    print("node lost: re-queued %.1f s after kill -9 (node timeout %d s)" % (requeue,
                                                                            c.node_timeout))


def sc_loomd_restart(c):
    """kill -9 of loomd mid-run: job A keeps running through the restart, job B
    finishes while loomd is down; both end succeeded on attempt 0, every rank
    started once, every step recorded."""
    a = c.submit(world=2, steps=50, step_ms=100, name="a")
    b = c.submit(world=2, steps=12, step_ms=100, name="b")
    c.wait_state(a, "running", 10)
    c.wait_state(b, "running", 10)
    c.loomd.kill()
    c.loomd.wait()
    time.sleep(2.5)  # b's ranks exit meanwhile; the agents keep their exit codes
    c.start_loomd()
    for jid, steps in ((a, 50), (b, 12)):
        j = c.wait_state(jid, "succeeded", 30)
        check(j["attempt"] == 0, "no retry after a loomd restart: attempt %d" % j["attempt"])
        ws = c.workers(jid)
        check(len(ws) == 2 and sorted(w[3] for w in ws) == [0, 1],
              "each rank started exactly once: %s" % ws)
        st, m = c.get("/v1/jobs/%s/metrics" % jid)
        check(st == 200 and len(m["series"]) == steps,
              "all %d steps recorded: %d" % (steps, len(m["series"])))


def sc_agent_restart(c):
    jid = c.submit(world=2, steps=30, step_ms=100)
    j = c.wait_state(jid, "running", 10)
    node = j["placement"][0]["node"]
    c.agents[node].kill()
    c.agents[node].wait()
    time.sleep(0.5)
    c.start_agent(node, 2)
    j = c.wait_state(jid, "succeeded", 30)
    check(j["attempt"] == 0, "workers were re-adopted, no retry")
    check(len(c.workers(jid)) == 2, "no duplicate workers: %s" % c.workers(jid))
    with open(os.path.join(c.tmp, node + ".log")) as f:
        check("re-adopted" in f.read(), "agent log says re-adopted")


def sc_agent_restart_kill(c):
    """An agent restarted with --adopt false kills the workers it finds and
    reports them; the attempt fails and is retried."""
    jid = c.submit(world=2, steps=30, step_ms=100, max_retries=1)
    j = c.wait_state(jid, "running", 10)
    node = j["placement"][0]["node"]
    c.wait(lambda: len(c.alive_workers(jid)) == 2, 5, "workers up")
    old = [w[0] for w in c.alive_workers(jid)]
    c.agents[node].kill()
    c.agents[node].wait()
    c.start_agent(node, 2, ["--adopt", "false"])
    c.wait(lambda: not [p for p in old if tc_alive(p)], 5, "old workers killed on restart")
    c.wait(lambda: c.job(jid)["attempt"] == 1, 10, "attempt failed and retried")
    why = [e[3] for e in event_reasons(c, jid) if e[1] == "queued" and e[2] == 1]
    check(why and "agent restarted" in why[0], "reason names the restart: %s" % why)
    c.wait_state(jid, "succeeded", 30)


def tc_alive(pid):
    return pid_alive(pid)


def sc_cancel(c):
    # fake_child: every worker forks a child in its process group;
    # fake_ignore_term: SIGTERM is ignored, so the SIGKILL escalation is needed.
    jid = c.submit(world=4, steps=100, step_ms=100,
                   labels={"fake_child": "1", "fake_ignore_term": "1"})
    c.wait_state(jid, "running", 10)
    c.wait(lambda: len(c.alive_workers(jid)) == 8, 5, "4 workers + 4 children alive")
    t0 = time.time()
    st, _ = c.request("POST", "/v1/jobs/%s/cancel" % jid, {})
    check(st in (200, 202), "cancel: %s" % st)
    c.wait_state(jid, "cancelled", 10)
    c.wait(lambda: not c.alive_workers(jid), 5, "no process left")
    print("cancel: every process gone %.2f s after cancel (SIGTERM ignored)" % (time.time() - t0))


def sc_rdzv(c):
    jid = c.submit(world=2, steps=100, step_ms=100)
    jid2 = c.submit(world=2, steps=100, step_ms=100)
    c.wait_state(jid, "running", 10)
    c.wait_state(jid2, "running", 10)
    c.wait(lambda: len(c.workers(jid)) == 2 and len(c.workers(jid2)) == 2, 10, "workers up")
    tok = c.workers(jid)[0][4]
    tok2 = c.workers(jid2)[0][4]
    path = "/v1/rdzv/%s/0/fake-addr" % jid
    st, v = c.get(path + "?wait_ms=5000", token=tok)
    check(st == 200 and v["value"] == "ZmFrZQ==", "own attempt's key readable: %s %s" % (st, v))
    check(c.get(path, token=tok2)[0] == 403, "another attempt's token: 403")
    check(c.get(path, token=c.token)[0] == 403, "a tenant API token: 403")
    check(c.get(path, token=ADMIN)[0] == 403, "the admin token: 403")
    check(c.get(path, token=None)[0] == 401, "no token: 401")
    check(c.get("/v1/rdzv/%s/1/fake-addr" % jid, token=tok)[0] == 403, "attempt 1 path: 403")
    st, _ = c.request("PUT", "/v1/rdzv/%s/0/k1" % jid, {"value": "YQ=="}, token=tok)
    check(st == 200, "put: %s" % st)
    st, _ = c.request("PUT", "/v1/rdzv/%s/0/k1" % jid, {"value": "Yg=="}, token=tok)
    check(st == 409, "a key is written once: %s" % st)
    t0 = time.time()
    st, _ = c.get("/v1/rdzv/%s/0/missing?wait_ms=500" % jid, token=tok)
    check(st == 404 and time.time() - t0 >= 0.45, "long-poll waits then 404")
    # Running attempts show in /v1/usage with their usage so far.
    st, u = c.get("/v1/usage")
    run = sorted((r["job"], r["gpus"]) for r in u.get("running", []))
    check(st == 200 and run == sorted([(jid, 2), (jid2, 2)]) and
          all(r["gpu_seconds"] > 0 for r in u["running"]), "usage so far: %s" % u)
    _, other = c.new_tenant("other")
    st, u2 = c.get("/v1/usage", token=other)
    check(st == 200 and u2["running"] == [], "another tenant sees no running usage: %s" % u2)
    for j in (jid, jid2):
        c.request("POST", "/v1/jobs/%s/cancel" % j, {})
    c.wait_state(jid, "cancelled", 10)
    check(c.get(path, token=tok)[0] == 403, "token dead once the attempt ended")


def sc_sched(c):
    """Drain, pending reasons, gang all-or-nothing, priority."""
    r = subprocess.run([os.path.join(BIN, "loomctl"), "drain", "node-1"], capture_output=True,
                       env=dict(c.env, LOOM_URL=c.url, LOOM_TOKEN=ADMIN), timeout=10)
    check(r.returncode == 0 and b"drained" in r.stdout, "loomctl drain: %r %r" % (r.stdout,
                                                                                 r.stderr))
    check(c.request("POST", "/v1/nodes/node-1/drain", {})[0] == 403, "tenant cannot drain")
    jid = c.submit(world=2, steps=5, step_ms=50)
    j = c.wait_state(jid, "running", 10)
    check(all(p["node"] == "node-2" for p in j["placement"]), "drained node takes no work")
    big = c.submit(world=4, steps=5, step_ms=50, name="big")

    def reason():
        r = c.job(big).get("pending_reason") or ""
        return "needs 4" in r
    c.wait(reason, 5, "pending reason for the 4-rank job")
    print("pending:", c.job(big)["pending_reason"])
    c.wait_state(jid, "succeeded", 15)
    j = c.job(big)
    check(j["state"] == "queued", "gang: 4 ranks never start on 2 free devices")
    r = subprocess.run([os.path.join(BIN, "loomctl"), "undrain", "node-1"], capture_output=True,
                       env=dict(c.env, LOOM_URL=c.url, LOOM_TOKEN=ADMIN), timeout=10)
    check(r.returncode == 0 and b"ready" in r.stdout, "loomctl undrain: %r" % r.stdout)
    c.wait_state(big, "succeeded", 20)
    # more ranks than the cluster's devices: refused at submit, naming the capacity
    err = c.submit(world=6, steps=1, step_ms=10, name="toobig", expect=422)["error"]
    check(err["code"] == "UNSCHEDULABLE" and "at most 4" in err["message"],
          "never-fits job refused: %s" % err)
    print("refused:", err["message"])
    st, n = c.get("/v1/nodes/node-1")
    check(st == 200 and n["state"] == "ready" and n["devices_total"] == 2, "node get: %s" % n)
    check(n["host"]["cpus"] >= 1 and n["host"]["mem_total_mib"] > 0, "host info: %s" % n)
    st, text = c.get("/metrics", token=None)
    check(st == 200 and 'loom_nodes{state="ready"} 2' in text, "metrics: nodes by state")
    check("loom_queue_wait_seconds_bucket" in text, "metrics: queue wait histogram")


def sc_quota_priority(c):
    """Per-tenant GPU quota and priority order on the real loop."""
    st, t = c.request("POST", "/v1/tenants", {"name": "small", "gpu_quota": 2}, token=ADMIN)
    check(st in (200, 201), "tenant with quota: %s %s" % (st, t))
    st, k = c.request("POST", "/v1/tenants/%s/tokens" % t["id"], {}, token=ADMIN)
    qtok = k["token"]
    a = c.submit(world=2, steps=100, step_ms=100, token=qtok, name="qa")
    c.wait_state(a, "running", 10, token=qtok)
    b = c.submit(world=2, steps=100, step_ms=100, token=qtok, name="qb")
    c.wait(lambda: "quota" in (c.job(b, token=qtok).get("pending_reason") or ""), 5,
           "quota pending reason")
    print("pending:", c.job(b, token=qtok)["pending_reason"])
    check(c.job(b, token=qtok)["state"] == "queued", "quota holds the second job")
    # Priority: with the cluster full, a later high-priority job starts first.
    fill = c.submit(world=2, steps=100, step_ms=100, name="fill")
    c.wait_state(fill, "running", 10)
    low = c.submit(world=2, steps=5, step_ms=50, priority=10, name="low")
    high = c.submit(world=2, steps=5, step_ms=50, priority=90, name="high")
    # Following a queued job's log waits for it to start, then streams it.
    env = dict(c.env, LOOM_URL=c.url, LOOM_TOKEN=c.token)
    # (stderr: the worker's text log; the default stream is stdout's step records as text)
    follower = subprocess.Popen([os.path.join(BIN, "loomctl"), "logs", low, "-f", "--stream",
                                 "stderr"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(3.5)
    check(follower.poll() is None, "logs -f of a queued job keeps waiting")
    check(c.job(low)["state"] == "queued" and c.job(high)["state"] == "queued", "cluster full")
    c.request("POST", "/v1/jobs/%s/cancel" % fill, {})
    j = c.wait_state(high, ("starting", "running", "succeeded"), 10)
    check(c.job(low)["state"] == "queued", "low priority still waits while high runs")
    c.wait_state(high, "succeeded", 20)
    c.wait_state(low, "succeeded", 20)
    try:
        fout, _ = follower.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        follower.kill()
        raise Fail("logs -f did not end after the job finished")
    check(b"fake_worker: done" in fout, "follower saw the whole log: %r" % fout[-200:])
    c.request("POST", "/v1/jobs/%s/cancel" % a, {}, token=qtok)
    c.wait_state(b, "running", 10, token=qtok)  # quota freed
    c.request("POST", "/v1/jobs/%s/cancel" % b, {}, token=qtok)
    c.wait_state(b, "cancelled", 10, token=qtok)


def sc_soak(c):
    """30 random jobs (1-6 ranks, priorities, injected crashes and hangs,
    cancels) on three 4-device nodes. Invariants: every job ends; no device
    ever ran two ranks at once (task start/exit times per node and device);
    no worker process is left."""
    import glob
    import random
    rnd = random.Random(7)
    ids = []
    for i in range(30):
        labels = {}
        r = rnd.random()
        if r < 0.15:
            labels = {"fake_crash_step": "2", "fake_crash_attempt": "0"}
        elif r < 0.2:
            labels = {"fake_hang_step": "2", "fake_hang_attempt": "0"}
        ids.append(c.submit(world=rnd.choice([1, 1, 2, 2, 3, 4, 6]), steps=rnd.randint(2, 8),
                            step_ms=rnd.choice([20, 50]), labels=labels, max_retries=1,
                            priority=rnd.choice([10, 50, 90]), name="soak%d" % i))
        if rnd.random() < 0.1:
            c.request("POST", "/v1/jobs/%s/cancel" % ids[-1], {})
    final = ("succeeded", "failed", "cancelled")
    c.wait(lambda: all(c.job(j)["state"] in final for j in ids), 150, "every soak job to end")
    states = [c.job(j)["state"] for j in ids]
    check("failed" not in states, "no job failed (one retry covers each fault): %s" % states)
    spans = {}
    for node in c.agents:
        for d in glob.glob(os.path.join(c.tmp, node, "tasks", "*")):
            dev = int(open(os.path.join(d, "meta")).read().split()[2])
            start = os.stat(os.path.join(d, "pid")).st_mtime
            end = os.stat(os.path.join(d, "exit")).st_mtime
            spans.setdefault((node, dev), []).append((start, end, os.path.basename(d)))
    for key, v in spans.items():
        v.sort()
        for a, b in zip(v, v[1:]):
            check(b[0] >= a[1] - 0.01, "device %s ran %s and %s at once" % (key, a, b))
    c.wait(lambda: not c.alive_workers(), 5, "no worker left")
    print("soak: %d jobs, %d rank runs, states %s" % (
        len(ids), sum(len(v) for v in spans.values()),
        {s: states.count(s) for s in set(states)}))


def real_spec(c, dp, steps, every):
    shards = os.path.join(c.tmp, "shards")
    if not os.path.isdir(shards):
        corpus = os.path.join(c.tmp, "corpus.txt")
        with open(corpus, "w") as f:
            f.write(" ".join("loom trains tiny models on cpu devices %d" % i for i in range(4000)))
        r = subprocess.run([os.path.join(BIN, "loom-data"), "prepare", "--in", corpus, "--out",
                            shards], capture_output=True, timeout=60)
        check(r.returncode == 0, "loom-data prepare: %s" % r.stderr.decode()[-300:])
    return {
        "name": "real",
        "model": {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 32, "d_ff": 128,
                  "vocab_size": 256, "seq_len": 16},
        "data": {"train": os.path.join(shards, "train_*.bin")},
        "parallel": {"dp": dp, "tp": 1, "pp": 1},
        "train": {"steps": steps, "global_batch_tokens": 64 * dp, "micro_batch": 4,
                  "precision": "fp32", "lr": 0.001, "warmup_steps": 1},
        "checkpoint": {"every_steps": every, "keep": 2},
        "resources": {"device": "cpu", "gpus_per_node": 2},
        "max_retries": 1,
    }


def sc_real_worker_retry(c):
    """SIGKILL one real worker rank after a checkpoint: the attempt is stopped
    everywhere, retried, and the new attempt resumes from the checkpoint."""
    st, j = c.request("POST", "/v1/jobs", real_spec(c, 2, 400, 5))
    check(st == 201, "submit: %s %s" % (st, j))
    jid = j["id"]
    j = c.wait_state(jid, "running", 20)

    def has_ckpt():
        st, out = c.get("/v1/jobs/%s/logs?rank=0&stream=stdout" % jid)
        return st == 200 and '"type":"checkpoint"' in out
    c.wait(has_ckpt, 60, "a first checkpoint")
    node = j["placement"][1]["node"]
    pidfile = os.path.join(c.tmp, node, "tasks", "%s.0.1" % jid, "pid")
    pid = int(open(pidfile).read().split()[0])
    os.kill(pid, signal.SIGKILL)
    c.wait(lambda: c.job(jid)["attempt"] == 1, 15, "retry after the killed rank")
    why = [e[3] for e in event_reasons(c, jid) if e[1] == "queued" and e[2] == 1]
    check(why and "rank 1" in why[0] and "signal 9" in why[0], "reason: %s" % why)
    c.wait_state(jid, "running", 20)

    def resumed():
        st, out = c.get("/v1/jobs/%s/logs?rank=0&stream=stdout&attempt=1" % jid)
        if st != 200 or not out.strip():
            return False
        start = json.loads(out.splitlines()[0])
        return start.get("type") == "start" and start.get("start_step", 0) >= 5
    c.wait(resumed, 20, "attempt 1 to resume from a checkpoint (start_step >= 5)")
    c.request("POST", "/v1/jobs/%s/cancel" % jid, {})
    c.wait_state(jid, "cancelled", 15)


def sc_real_worker(c):
    """The real loom-worker (cpu backend, tiny GPT-2): dp=4 across the two
    agents, ranks meeting through loomd's rendezvous."""
    shards = os.path.join(c.tmp, "shards")
    corpus = os.path.join(c.tmp, "corpus.txt")
    with open(corpus, "w") as f:
        f.write(" ".join("loom trains tiny models on cpu devices %d" % i for i in range(4000)))
    r = subprocess.run([os.path.join(BIN, "loom-data"), "prepare", "--in", corpus, "--out", shards],
                       capture_output=True, timeout=60)
    check(r.returncode == 0, "loom-data prepare: %s" % r.stderr.decode()[-300:])
    spec = {
        "name": "real",
        "model": {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 32, "d_ff": 128,
                  "vocab_size": 256, "seq_len": 16},
        "data": {"train": os.path.join(shards, "train_*.bin")},
        "parallel": {"dp": 4, "tp": 1, "pp": 1},
        "train": {"steps": 4, "global_batch_tokens": 256, "micro_batch": 4, "precision": "fp32",
                  "lr": 0.001, "warmup_steps": 1},
        "checkpoint": {"every_steps": 2, "keep": 1},
        "resources": {"device": "cpu", "gpus_per_node": 2},
    }
    st, j = c.request("POST", "/v1/jobs", spec)
    check(st == 201, "submit: %s %s" % (st, j))
    jid = j["id"]
    j = c.wait_state(jid, ("succeeded", "failed"), 60)
    check(j["state"] == "succeeded", "real worker job: %s" % event_reasons(c, jid))
    st, m = c.get("/v1/jobs/%s/metrics" % jid)
    check(st == 200 and [p["step"] for p in m["series"]] == [1, 2, 3, 4],
          "4 real steps recorded: %s" % m)
    check(all(p["loss"] > 0 for p in m["series"]), "losses are positive")
    check(sorted(set(p["node"] for p in j["placement"])) == ["node-1", "node-2"],
          "4 ranks over both nodes: %s" % j["placement"])
    # Only rank 0 prints step lines; every rank ends with its summary line.
    st, out3 = c.get("/v1/jobs/%s/logs?rank=3&stream=stdout" % jid)
    check(st == 200 and '"type":"summary"' in out3 and '"world":4' in out3,
          "rank 3 ran to its summary: %s" % out3[-300:])
    ck = os.path.join(j["out_dir"], "checkpoints")
    check(os.path.isdir(ck) and os.listdir(ck), "checkpoint written under the job's out_dir")


SCENARIOS = {
    "happy": (sc_happy, {}),
    "crash": (sc_crash, {}),
    "crash_no_retry": (sc_crash_no_retry, {}),
    "hang": (sc_hang, {}),
    "node_lost": (sc_node_lost, {}),
    "loomd_restart": (sc_loomd_restart, {"node_timeout": 10}),
    "agent_restart": (sc_agent_restart, {"node_timeout": 10}),
    "agent_restart_kill": (sc_agent_restart_kill, {"node_timeout": 10}),
    "cancel": (sc_cancel, {}),
    "rdzv": (sc_rdzv, {}),
    "sched": (sc_sched, {}),
    "quota_priority": (sc_quota_priority, {}),
    "soak": (sc_soak, {"nodes": 3, "devices": 4, "node_timeout": 10, "hang_timeout": 6}),
    "real_worker": (sc_real_worker, {"worker": os.path.join(BIN, "loom-worker")}),
    "real_worker_retry": (sc_real_worker_retry, {"worker": os.path.join(BIN, "loom-worker")}),
}


def main():
    for b in ("loomd", "loom-agent"):
        if not os.access(os.path.join(BIN, b), os.X_OK):
            print("SKIP: %s not built" % b)
            return 77
    fn, kw = SCENARIOS[SCENARIO]
    needed = [kw.get("worker", WORKER)]
    if SCENARIO.startswith("real_worker"):
        needed.append(os.path.join(BIN, "loom-data"))
    for w in needed:
        if not os.access(w, os.X_OK):
            print("SKIP: %s not built" % w)
            return 77
    c = Cluster(**kw)
    ok = False
    try:
        fn(c)
        ok = True
        print("PASS", SCENARIO)
        return 0
    except Fail as e:
        print("FAIL %s: %s" % (SCENARIO, e))
        return 1
    except Exception:
        import traceback
        traceback.print_exc()
        print("FAIL %s: exception" % SCENARIO)
        return 1
    finally:
        c.close(ok)


if __name__ == "__main__":
    sys.exit(main())
