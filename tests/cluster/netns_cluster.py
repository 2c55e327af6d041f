#!/usr/bin/env python3
"""A multi-host Loom cluster made of Linux network namespaces, and the
scenarios that need real hosts with their own addresses.

Topology: one namespace "sw" holds a bridge; every host namespace h0..hN has
a veth pair whose far end is a port of that bridge; host i has 10.77.0.(i+1)/24
on its eth0 and nothing else (no route out, the root namespace untouched).
h0 runs loomd (listening on 10.77.0.1), h1..hN one loom-agent each with one
cpu device, so every multi-rank job crosses hosts. The scenarios run inside
h0 (this script re-executes itself there), reaching loomd over the bridge.

Scenarios (all by default, or name them):
  dp2        dp=2 cpu job over two hosts: succeeds, its loss curve equals the
             single-process run within 1e-5 relative; the nodes advertise
             their 10.77.0.x address and eth0 (GET /v1/nodes "comm")
  pp2        pp=2 cpu job over two hosts: the same check, and no STRAGGLER (the
             stages differ by design and are not compared)
  nodeloss   dp=2 job; `ip link set eth0 down` on the host of rank 1 mid-job:
             the node is lost, the attempt fails with the lost-node reason, the
             job is retried on the remaining hosts from its checkpoint and
             succeeds on the single-process curve
  straggler  dp=2 job whose rank 1 sleeps in every step (the worker's test
             knob LOOM_DEBUG_SLOW_RANK / LOOM_DEBUG_SLOW_MS): the job events
             name it, "STRAGGLER rank=1 node=<its host>", and nobody else;
             GET /v1/jobs/{id}/metrics has both ranks' timing rows
  commbound  dp=2 job over links throttled with tc tbf (8 mbit/s): the job
             events carry COMM_BOUND and no STRAGGLER
  partition  dp=2 job; loomd's host cut off from the bridge for 6 s (its
             switch port down) while the workers train: the workers go on (their
             own step lines grow), the nodes are not lost (node timeout 30 s),
             and when the link heals the agents' queued records reach loomd:
             the job succeeds on its first attempt with every step recorded,
             on the single-process curve
  p2pcut     dp=2 job; the two worker hosts cannot reach each other
             (blackhole routes) while both still reach loomd: no step
             progress, so the hang timeout (5 s) ends the attempt (event "no
             step progress ... (hang timeout)", usage cause hang) with the
             nodes still ready; with the routes back the retry succeeds

Usage: netns_cluster.py BIN_DIR [SCENARIO...]   (as root)
Exit 0 pass, 1 fail, 77 not run (no root, no `ip netns`, no veth/bridge):
ctest reports 77 as "Not Run" (SKIP_RETURN_CODE), never as passed."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from loomtest import Fail, daemon_env, http  # noqa: E402

ADMIN = "admin-token-netns"
JOIN = "join-token-netns"
NET = "10.77.0"
PORT = 8420
SCENARIOS = ["dp2", "pp2", "nodeloss", "straggler", "commbound", "partition", "p2pcut"]


def sh(*args, check=True):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise Fail("%s: %s" % (" ".join(args), (r.stderr or r.stdout).strip()))
    return r


def check(cond, msg):
    if not cond:
        raise Fail(msg)


# ---- topology (root namespace side) ----

class Net:
    def __init__(self, hosts):
        self.prefix = "lm%d" % os.getpid()
        self.sw = self.prefix + "-sw"
        self.hosts = [self.prefix + "-h%d" % i for i in range(hosts)]
        self.made = []

    def ns(self, i):
        return self.hosts[i]

    def addr(self, i):
        return "%s.%d" % (NET, i + 1)

    def create(self):
        for n in [self.sw] + self.hosts:
            sh("ip", "netns", "add", n)
            self.made.append(n)
            sh("ip", "-n", n, "link", "set", "lo", "up")
        sh("ip", "-n", self.sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.sw, "link", "set", "br0", "up")
        for i, h in enumerate(self.hosts):
            port = "p%d" % i
            sh("ip", "-n", self.sw, "link", "add", port, "type", "veth", "peer", "name", "eth0",
               "netns", h)
            sh("ip", "-n", self.sw, "link", "set", port, "master", "br0", "up")
            sh("ip", "-n", h, "addr", "add", self.addr(i) + "/24", "dev", "eth0")
            sh("ip", "-n", h, "link", "set", "eth0", "up")

    def destroy(self):
        for n in self.made:
            # every process still in the namespace was started by this test
            r = sh("ip", "netns", "pids", n, check=False)
            for p in r.stdout.split():
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        for n in reversed(self.made):
            sh("ip", "netns", "del", n, check=False)


def preflight():
    """None when this machine can build the topology, else why not."""
    if os.geteuid() != 0:
        return "needs root (euid %d)" % os.geteuid()
    if not shutil.which("ip"):
        return "no `ip` command (iproute2)"
    probe = "lm%d-probe" % os.getpid()
    r = sh("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        return "`ip netns add` failed: %s" % r.stderr.strip()
    try:
        r = sh("ip", "-n", probe, "link", "add", "br0", "type", "bridge", check=False)
        if r.returncode != 0:
            return "no bridge links: %s" % r.stderr.strip()
        r = sh("ip", "-n", probe, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1",
               check=False)
        if r.returncode != 0:
            return "no veth links: %s" % r.stderr.strip()
    finally:
        sh("ip", "netns", "del", probe, check=False)
    return None


# ---- the cluster (runs inside h0) ----

class Cluster:
    def __init__(self, bin_dir, net, agents, tmp, agent_env=None, node_timeout=3,
                 hang_timeout=60):
        self.bin = bin_dir
        self.net = net
        self.tmp = tmp
        self.url = "http://%s:%d" % (net["addrs"][0], PORT)
        self.procs = []
        self.env = daemon_env(LOOM_ADMIN_TOKEN=ADMIN, LOOM_JOIN_TOKEN=JOIN)
        d = os.path.join(tmp, "loomd")
        os.makedirs(d)
        with open(os.path.join(d, "gpu_prices.json"), "w") as f:
            json.dump({"cpu": 0.5}, f)
        self.spawn("loomd", None, [os.path.join(bin_dir, "loomd"), "--auto-approve", "--listen",
                                   "%s:%d" % (net["addrs"][0], PORT), "--data-dir", d,
                                   "--node-timeout", str(node_timeout), "--hang-timeout",
                                   str(hang_timeout),
                                   "--heartbeat", "1", "--store-sync-full", "false"], self.env)
        self.wait(lambda: self.get("/healthz", token=None)[0] == 200, 10, "loomd up")
        aenv = dict(self.env, **(agent_env or {}))
        self.names = []
        for i in agents:
            name = "host%d" % i
            self.names.append(name)
            self.spawn(name, net["hosts"][i], [
                os.path.join(bin_dir, "loom-agent"), "--coordinator", self.url, "--name", name,
                "--work-dir", os.path.join(tmp, name), "--cpu-devices", "1", "--worker",
                os.path.join(bin_dir, "loom-worker"), "--heartbeat-ms", "500",
                "--stop-grace-ms", "1000", "--retry-max-ms", "500"], aenv)
        self.wait(lambda: len([n for n in self.nodes() if n["state"] == "ready"]) == len(agents),
                  15, "agents registered")
        self.token = self.new_tenant()

    def spawn(self, name, ns, argv, env):
        if ns:
            argv = ["ip", "netns", "exec", ns] + argv  # ip execs the program: same pid
        log = open(os.path.join(self.tmp, name + ".log"), "ab")
        self.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))

    def request(self, method, path, body=None, token="tenant"):
        if token == "tenant":
            token = self.token
        return http(self.url + path, method, body, token, by_type=True, offline=True)

    def get(self, path, token="tenant"):
        return self.request("GET", path, token=token)

    def new_tenant(self):
        st, t = self.request("POST", "/v1/tenants", {"name": "netns"}, token=ADMIN)
        check(st in (200, 201), "create tenant: %s %s" % (st, t))
        st, k = self.request("POST", "/v1/tenants/%s/tokens" % t["id"], {}, token=ADMIN)
        check(st in (200, 201), "create token: %s %s" % (st, k))
        return k["token"]

    def nodes(self):
        st, r = self.get("/v1/nodes", token=ADMIN)
        return r["nodes"] if st == 200 else []

    def wait(self, cond, timeout, what):
        end = time.time() + timeout
        while time.time() < end:
            try:
                v = cond()
                if v:
                    return v
            except Fail:
                pass
            time.sleep(0.1)
        raise Fail("timed out after %ss waiting for %s" % (timeout, what))

    def job(self, jid):
        st, j = self.get("/v1/jobs/" + jid)
        check(st == 200, "get job %s: %s" % (jid, st))
        return j

    def events(self, jid):
        st, e = self.get("/v1/jobs/%s/events" % jid)
        check(st == 200, "events: %s" % st)
        return e["items"]

    def wait_state(self, jid, states, timeout):
        last = {}

        def ok():
            last["j"] = self.job(jid)
            return last["j"]["state"] in states

        try:
            self.wait(ok, timeout, "job %s to reach %s" % (jid, states))
        except Fail:
            raise Fail("job %s is %s (wanted %s); events: %s" % (
                jid, last.get("j", {}).get("state"), states,
                [e["reason"] for e in self.events(jid)]))
        return last["j"]

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.kill()
                p.wait()


def spec_for(shards, layout, steps, ckpt=3, name="netns"):
    parallel = {"dp": 1, "tp": 1, "pp": 1, "zero_stage": 0}
    parallel.update(layout)
    return {
        "name": name,
        "model": {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 32, "d_ff": 64,
                  "vocab_size": 256, "seq_len": 16},
        "data": {"train": os.path.join(shards, "train_*.bin")},
        "parallel": parallel,
        "train": {"steps": steps, "global_batch_tokens": 128, "micro_batch": 4,
                  "precision": "fp32", "lr": 0.003, "warmup_steps": 1, "seed": 11},
        "checkpoint": {"every_steps": ckpt, "keep": 2},
        "resources": {"device": "cpu", "gpus_per_node": 1},
        "max_retries": 2,
    }


class Run:
    """What every scenario shares: the binaries, the shards, reference curves."""

    def __init__(self, bin_dir, net, tmp):
        self.bin, self.net, self.tmp = bin_dir, net, tmp
        self.shards = os.path.join(tmp, "shards")
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w") as f:
            f.write(" ".join("hosts meet on the bridge and reduce %d" % i for i in range(4000)))
        r = subprocess.run([os.path.join(bin_dir, "loom-data"), "prepare", "--in", corpus,
                            "--out", self.shards], capture_output=True, timeout=60)
        check(r.returncode == 0, "loom-data prepare: %s" % r.stderr.decode()[-300:])
        self.refs = {}

    def reference(self, steps):
        """The single-process loss curve of `steps` steps (same global batch)."""
        if steps in self.refs:
            return self.refs[steps]
        path = os.path.join(self.tmp, "ref%d.json" % steps)
        with open(path, "w") as f:
            json.dump(spec_for(self.shards, {}, steps), f)
        r = subprocess.run([os.path.join(self.bin, "loom-worker"), "--spec", path, "--out",
                            os.path.join(self.tmp, "ref%d" % steps), "--threads", "1",
                            "--no-save"], capture_output=True, timeout=120)
        check(r.returncode == 0, "reference run: %s" % r.stderr.decode()[-300:])
        ref = {}
        for line in r.stdout.decode().splitlines():
            j = json.loads(line)
            if j.get("type") == "step":
                ref[j["step"]] = j["loss"]
        check(sorted(ref) == list(range(1, steps + 1)), "reference steps: %s" % sorted(ref))
        self.refs[steps] = ref
        return ref

    def cluster(self, name, agents, agent_env=None, **kw):
        d = os.path.join(self.tmp, name)
        os.makedirs(d)
        return Cluster(self.bin, self.net, agents, d, agent_env, **kw)

    def curve_matches(self, c, jid, steps, what):
        ref = self.reference(steps)
        st, m = c.get("/v1/jobs/%s/metrics" % jid)
        check(st == 200, "metrics: %s" % st)
        got = {p["step"]: p["loss"] for p in m["series"]}
        check(sorted(got) == list(range(1, steps + 1)), "%s: steps recorded %s" % (what,
                                                                                sorted(got)))
        worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)
        print("  %s: loss rel diff max %.2e over %d steps" % (what, worst, steps))
        check(worst <= 1e-5, "%s: loss differs from the single-process run by %.3g" % (what,
                                                                                      worst))
        return m

    def submit(self, c, spec):
        st, j = c.request("POST", "/v1/jobs", spec)
        check(st == 201, "submit: %s %s" % (st, j))
        return j["id"]


def placement_nodes(job):
    return {p["rank"]: p["node"] for p in job.get("placement") or []}


def sc_dp2(run):
    c = run.cluster("dp2", [1, 2])
    try:
        for n in c.nodes():
            i = int(n["name"][4:])
            check(n["comm"]["addr"] == run.net["addrs"][i] and n["comm"]["iface"] == "eth0",
                  "node %s advertises %s (want %s on eth0)" % (n["name"], n["comm"],
                                                               run.net["addrs"][i]))
        jid = run.submit(c, spec_for(run.shards, {"dp": 2}, 6))
        j = c.wait_state(jid, ("succeeded", "failed"), 60)
        check(j["state"] == "succeeded", "dp2 job: %s" % [e["reason"] for e in c.events(jid)])
        nodes = placement_nodes(j)
        check(len(set(nodes.values())) == 2, "dp2 ranks share a host: %s" % nodes)
        m = run.curve_matches(c, jid, 6, "dp2 over host1+host2")
        ranks = {(r["rank"], r["node"]) for r in m["ranks"]}
        check(ranks == {(0, nodes[0]), (1, nodes[1])}, "per-rank rows: %s" % sorted(ranks))
    finally:
        c.close()


def sc_pp2(run):
    c = run.cluster("pp2", [1, 2])
    try:
        jid = run.submit(c, spec_for(run.shards, {"pp": 2}, 6))
        j = c.wait_state(jid, ("succeeded", "failed"), 60)
        check(j["state"] == "succeeded", "pp2 job: %s" % [e["reason"] for e in c.events(jid)])
        check(len(set(placement_nodes(j).values())) == 2, "pp2 stages share a host")
        run.curve_matches(c, jid, 6, "pp2 over host1+host2")
        # one rank per stage: stages are not compared with each other
        check(not diag_events(c, jid, "STRAGGLER"), "STRAGGLER on a pp2 job: %s" %
              diag_events(c, jid, "STRAGGLER"))
    finally:
        c.close()


def sc_nodeloss(run):
    steps = 30
    # rank 0 sleeps 150 ms a step so that the job runs for seconds
    c = run.cluster("nodeloss", [1, 2, 3], {"LOOM_DEBUG_SLOW_RANK": "0",
                                            "LOOM_DEBUG_SLOW_MS": "150"})
    try:
        jid = run.submit(c, spec_for(run.shards, {"dp": 2}, steps, ckpt=4))
        c.wait(lambda: c.job(jid)["state"] == "running", 30, "job running")

        def step_at_least(n):
            st, m = c.get("/v1/jobs/%s/metrics" % jid)
            return st == 200 and any(p["step"] >= n for p in m["series"])

        c.wait(lambda: step_at_least(9), 40, "step 9")
        placed = placement_nodes(c.job(jid))
        check_worker_env(run, c, placed)
        victim = placed[1]
        vi = int(victim[4:])
        t0 = time.time()
        sh("ip", "-n", run.net["hosts"][vi], "link", "set", "eth0", "down")
        print("  link of %s (rank 1) down at step >= 9" % victim)
        lost = c.wait(lambda: [n for n in c.nodes() if n["name"] == victim and
                               n["state"] == "lost"], 15, "node %s lost" % victim)
        print("  %s lost after %.1f s" % (victim, time.time() - t0))
        check(lost, "node not lost")
        j = c.wait_state(jid, ("succeeded", "failed"), 90)
        reasons = [e["reason"] for e in c.events(jid)]
        check(j["state"] == "succeeded", "job after the node loss: %s" % reasons)
        check(j["attempt"] >= 1, "the job was not retried (attempt %s)" % j["attempt"])
        check(any(victim in r and "lost" in r for r in reasons),
              "no event names the lost node %s: %s" % (victim, reasons))
        check(victim not in placement_nodes(j).values(),
              "the retry was placed on the lost node: %s" % placement_nodes(j))
        st, m = c.get("/v1/jobs/%s/metrics" % jid)
        first = min(p["step"] for p in m["series"] if p["attempt"] == j["attempt"])
        check(first > 1, "the retry started from step %d, not from a checkpoint" % first)
        print("  retried as attempt %d on %s from step %d" % (
            j["attempt"], sorted(placement_nodes(j).values()), first - 1))
        run.curve_matches(c, jid, steps, "dp2 across a node loss")
    finally:
        c.close()
        for h in run.net["hosts"][1:]:  # whichever host lost its link gets it back
            sh("ip", "-n", h, "link", "set", "eth0", "up", check=False)


def worker_env(ns):
    """The environments of the loom-worker processes in host namespace ns."""
    out = []
    for p in sh("ip", "netns", "pids", ns, check=False).stdout.split():
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                if not f.read().split(b"\0")[0].endswith(b"loom-worker"):
                    continue
            with open("/proc/%s/environ" % p, "rb") as f:
                env = dict(kv.split("=", 1) for kv in f.read().decode().split("\0") if "=" in kv)
        except OSError:
            continue
        out.append(env)
    return out


def check_worker_env(run, c, placed):
    """Each rank listens on its own host's address, knows rank 0's, and
    loomd's desired set carries rank 0's address (master_addr)."""
    addr0 = run.net["addrs"][int(placed[0][4:])]
    for rank, node in placed.items():
        i = int(node[4:])
        envs = [e for e in worker_env(run.net["hosts"][i]) if e.get("LOOM_RANK") == str(rank)]
        check(envs, "no worker of rank %d on %s" % (rank, node))
        e = envs[0]
        check(e.get("LOOM_COMM_HOST") == run.net["addrs"][i],
              "rank %d listens on %s, want %s" % (rank, e.get("LOOM_COMM_HOST"),
                                                  run.net["addrs"][i]))
        check(e.get("LOOM_MASTER_ADDR") == addr0,
              "rank %d: LOOM_MASTER_ADDR %s, want %s" % (rank, e.get("LOOM_MASTER_ADDR"), addr0))
        check(e.get("LOOM_RANK_STEPS") == "1", "rank %d: LOOM_RANK_STEPS unset" % rank)
        with open(os.path.join(c.tmp, node, "node.credential")) as f:  # the node's own bearer
            cred = f.read().strip()
        st, a = c.request("GET", "/v1/agent/assignments?node=%s" % node, token=cred)
        check(st == 200 and all(t.get("master_addr") == addr0 for t in a["tasks"]),
              "assignments of %s: %s %s" % (node, st, a))
    print("  workers listen on their host's address; LOOM_MASTER_ADDR=%s" % addr0)


def diag_events(c, jid, code):
    return [e["reason"] for e in c.events(jid) if e["reason"].startswith(code)]


def diag_stream(c, jid, code):
    """The job.diagnosis events of GET /v1/events with this code: the
    tenant's stream carries each finding the job events show."""
    st, e = c.get("/v1/events?job=%s&type=job.diagnosis" % jid)
    check(st == 200, "events: %s %s" % (st, e))
    return [it["data"] for it in e["items"] if it["type"] == "job.diagnosis" and
            it["data"].get("code") == code]


STRAGGLER_STEPS = 12


def sc_straggler(run):
    # 250 ms: well above the scheduling noise of a loaded test machine
    c = run.cluster("straggler", [1, 2], {"LOOM_DEBUG_SLOW_RANK": "1",
                                          "LOOM_DEBUG_SLOW_MS": "250"})
    try:
        jid = run.submit(c, spec_for(run.shards, {"dp": 2}, STRAGGLER_STEPS))
        j = c.wait_state(jid, ("succeeded", "failed"), 60)
        check(j["state"] == "succeeded", "straggler job: %s" % [e["reason"] for e in c.events(jid)])
        node1 = placement_nodes(j)[1]
        got = diag_events(c, jid, "STRAGGLER")
        print("  events: %s" % got)
        check(len(got) == 1 and got[0].startswith("STRAGGLER rank=1 node=%s " % node1),
              "want one STRAGGLER naming rank 1 on %s: %s" % (node1, got))
        ev = diag_stream(c, jid, "STRAGGLER")
        check(len(ev) == 1 and ev[0]["reason"] == got[0] and ev[0]["rank"] == 1 and
              ev[0]["node"] == node1 and ev[0]["attempt"] == 0,
              "GET /v1/events has the STRAGGLER as job.diagnosis: %s" % ev)
        st, m = c.get("/v1/jobs/%s/metrics" % jid)
        rows = {(r["rank"], r["step"]): r for r in m["ranks"]}
        n = STRAGGLER_STEPS
        check(all((r, s) in rows for r in (0, 1) for s in range(1, n + 1)),
              "per-rank rows missing: %s" % sorted(rows))
        slow = sum(rows[(1, s)]["ms"]["compute"] for s in range(2, n + 1)) / (n - 1)
        fast = sum(rows[(0, s)]["ms"]["compute"] for s in range(2, n + 1)) / (n - 1)
        wait0 = sum(rows[(0, s)]["ms"]["comm_exposed"] for s in range(2, n + 1)) / (n - 1)
        print("  mean compute rank 1 %.1f ms, rank 0 %.1f ms (rank 0 waits %.1f ms)" % (
            slow, fast, wait0))
        check(slow - fast >= 200, "rank 1's compute is not 250 ms above rank 0's")
    finally:
        c.close()


def sc_commbound(run):
    for h in run.net["hosts"][1:3]:
        sh("tc", "-n", h, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "8mbit",
           "burst", "16kbit", "latency", "400ms")
    c = run.cluster("commbound", [1, 2])
    try:
        jid = run.submit(c, spec_for(run.shards, {"dp": 2}, 12))
        j = c.wait_state(jid, ("succeeded", "failed"), 90)
        check(j["state"] == "succeeded", "comm-bound job: %s" % [e["reason"] for e in
                                                                 c.events(jid)])
        got = diag_events(c, jid, "COMM_BOUND")
        print("  events: %s" % got)
        check(len(got) == 1, "want one COMM_BOUND event: %s" % got)
        ev = diag_stream(c, jid, "COMM_BOUND")
        check(len(ev) == 1 and ev[0]["reason"] == got[0],
              "GET /v1/events has the COMM_BOUND as job.diagnosis: %s" % ev)
        check(not diag_events(c, jid, "STRAGGLER"), "a STRAGGLER on a symmetric slow link")
        st, m = c.get("/v1/jobs/%s/metrics" % jid)
        fr = [r["ms"]["comm_exposed"] / r["ms"]["step"] for r in m["ranks"] if r["step"] > 1]
        print("  exposed communication %.0f%%..%.0f%% of the step" % (100 * min(fr),
                                                                     100 * max(fr)))
    finally:
        c.close()
        for h in run.net["hosts"][1:3]:
            sh("tc", "-n", h, "qdisc", "del", "dev", "eth0", "root", check=False)


def worker_steps(c, host, jid, attempt=0, rank=0):
    """The last step in the worker's own stdout (the agent's task log on its
    host), read from the file: it does not go through loomd."""
    path = os.path.join(c.tmp, host, "tasks", "%s.%d.%d" % (jid, attempt, rank), "stdout.log")
    last = 0
    try:
        with open(path) as f:
            for ln in f:
                if '"type":"step"' in ln:
                    last = max(last, json.loads(ln)["step"])
    except (OSError, ValueError):
        pass
    return last


def loomd_step(c, jid):
    st, m = c.get("/v1/jobs/%s/metrics" % jid)
    return max([p["step"] for p in m["series"]] or [0]) if st == 200 else 0


def sc_partition(run):
    steps = 60
    sw = run.net["hosts"][0].rsplit("-h0", 1)[0] + "-sw"
    c = run.cluster("partition", [1, 2], {"LOOM_DEBUG_SLOW_RANK": "0",
                                          "LOOM_DEBUG_SLOW_MS": "150"}, node_timeout=30)
    try:
        jid = run.submit(c, spec_for(run.shards, {"dp": 2}, steps, ckpt=10))
        c.wait(lambda: loomd_step(c, jid) >= 5, 40, "step 5")
        host0 = placement_nodes(c.job(jid))[0]
        sh("ip", "-n", sw, "link", "set", "p0", "down")  # loomd's host off the bridge
        cut = time.time()
        try:
            seen = loomd_step(c, jid)
            time.sleep(1)
            at_cut = worker_steps(c, host0, jid)
            time.sleep(5)
            during = loomd_step(c, jid)
            trained = worker_steps(c, host0, jid)
            nodes = {n["name"]: n["state"] for n in c.nodes()}
        finally:
            sh("ip", "-n", sw, "link", "set", "p0", "up")
        print("  cut %.1f s: loomd saw step %d -> %d, the worker trained %d -> %d" % (
            time.time() - cut, seen, during, at_cut, trained))
        check(during <= seen + 2, "loomd kept receiving steps through the cut (%d -> %d)" % (
            seen, during))
        check(trained >= at_cut + 5, "the workers did not train on through the cut (%d -> %d)"
              % (at_cut, trained))
        check(all(v == "ready" for v in nodes.values()), "nodes during the cut: %s" % nodes)
        j = c.wait_state(jid, ("succeeded", "failed"), 60)
        reasons = [e["reason"] for e in c.events(jid)]
        check(j["state"] == "succeeded" and j["attempt"] == 0,
              "after the heal: %s attempt %s: %s" % (j["state"], j["attempt"], reasons))
        check(not any("lost" in r or "hang" in r for r in reasons), "events: %s" % reasons)
        run.curve_matches(c, jid, steps, "dp2 across a loomd partition")
    finally:
        c.close()
        sh("ip", "-n", sw, "link", "set", "p0", "up", check=False)


def sc_p2pcut(run):
    steps = 40
    h1, h2 = run.net["hosts"][1], run.net["hosts"][2]
    a1, a2 = run.net["addrs"][1], run.net["addrs"][2]
    c = run.cluster("p2pcut", [1, 2], {"LOOM_DEBUG_SLOW_RANK": "0",
                                       "LOOM_DEBUG_SLOW_MS": "100"}, hang_timeout=5)
    routes = [(h1, a2), (h2, a1)]
    try:
        jid = run.submit(c, spec_for(run.shards, {"dp": 2}, steps, ckpt=4))
        c.wait(lambda: loomd_step(c, jid) >= 5, 40, "step 5")
        for h, a in routes:
            sh("ip", "-n", h, "route", "add", "blackhole", a + "/32")
        t0 = time.time()
        try:
            def hung():
                return [e for e in c.events(jid) if "hang timeout" in e["reason"]]
            ev = c.wait(hung, 30, "the hang timeout to end the attempt")
            took = time.time() - t0
            nodes = {n["name"]: n["state"] for n in c.nodes()}
        finally:
            for h, a in routes:
                sh("ip", "-n", h, "route", "del", "blackhole", a + "/32", check=False)
        print("  worker-to-worker cut: %s after %.1f s" % (ev[0]["reason"], took))
        check(took <= 5 + 10, "the hang was seen %.1f s after the cut (timeout 5 s)" % took)
        check(ev[0]["reason"].startswith("attempt 0 failed") and ev[0]["to"] == "queued",
              "attempt 0 ended by the hang timeout, the job requeued: %s" % ev[0])
        check(all(v == "ready" for v in nodes.values()),
              "agents still reach loomd, no node lost: %s" % nodes)
        j = c.wait_state(jid, ("succeeded", "failed"), 60)
        check(j["state"] == "succeeded" and j["attempt"] >= 1,
              "the retry after the routes came back: %s attempt %s: %s" % (
                  j["state"], j["attempt"], [e["reason"] for e in c.events(jid)]))
        st, u = c.get("/v1/usage?group_by=cause")
        check(st == 200 and "hang" in {r["key"] for r in u["rows"]},
              "the hung attempt's usage has cause hang: %s" % u)
        run.curve_matches(c, jid, steps, "dp2 after a worker-to-worker cut")
    finally:
        c.close()
        for h, a in routes:
            sh("ip", "-n", h, "route", "del", "blackhole", a + "/32", check=False)


TABLE = {"dp2": sc_dp2, "pp2": sc_pp2, "nodeloss": sc_nodeloss, "straggler": sc_straggler,
         "commbound": sc_commbound, "partition": sc_partition, "p2pcut": sc_p2pcut}


def inside(bin_dir, net, names):
    tmp = tempfile.mkdtemp(prefix="loom-netns-")
    run = Run(bin_dir, net, tmp)
    failed = []
    for n in names:
        t0 = time.time()
        try:
            TABLE[n](run)
            print("PASS %s (%.1f s)" % (n, time.time() - t0), flush=True)
        except Fail as e:
            failed.append(n)
            print("FAIL %s (%.1f s): %s" % (n, time.time() - t0, e), flush=True)
    if failed or os.environ.get("LOOM_KEEP_TEST_DIR"):
        print("files kept in", tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--inside":
        cfg = json.loads(sys.argv[2])
        return inside(cfg["bin"], cfg["net"], cfg["scenarios"])
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    bin_dir = os.path.abspath(sys.argv[1])
    names = sys.argv[2:] or SCENARIOS
    bad = [n for n in names if n not in TABLE]
    if bad:
        print("unknown scenario(s) %s; known: %s" % (bad, SCENARIOS))
        return 2
    why = preflight()
    if why:
        print("not run: needs root and ip netns (%s)" % why)
        return 77
    net = Net(4)
    try:
        net.create()
        cfg = {"bin": bin_dir, "scenarios": names,
               "net": {"hosts": net.hosts, "addrs": [net.addr(i) for i in range(4)]}}
        r = subprocess.run(["ip", "netns", "exec", net.ns(0), sys.executable,
                            os.path.abspath(__file__), "--inside", json.dumps(cfg)])
        return r.returncode
    finally:
        net.destroy()


if __name__ == "__main__":
    sys.exit(main())
