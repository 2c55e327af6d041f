#!/usr/bin/env python3
"""What diagnosis sampling costs training: the same run with sampling on
(LOOM_DIAG=1: every rank's step timing, the rank_step lines, the device sync
that splits a dp step into compute and exposed communication) and off
(LOOM_DIAG=0), interleaved on/off, off/on, ... so that drift of a loaded host
falls on both sides alike. Each run's figure is the median step time of its
steps after the warm-up; the report gives the medians of both sides, the
paired ratio (each run against its pair partner) with its spread and a 95 %
interval, and the off runs' own spread (the A/A noise).

  bench_diag.py worker BIN_DIR [options]
      loom-worker alone: --nproc NPROC ranks (cpu: dp2 over the cpu comm,
      one thread a rank; cuda: --device cuda, one GPU a rank) with
      --rank-steps, as loom-agent starts them.
  bench_diag.py cluster BIN_DIR [options]
      the full path: loomd and one loom-agent (--cpu-devices 2) with the real
      loom-worker; a dp2 cpu job per run, the agent started with LOOM_DIAG=1
      or 0 (its config row diag). Also loomd's and the agent's CPU seconds per
      training step, and which ranks' series reached loomd.

Options: --pairs N (on/off pairs), --steps N, --warmup N (steps left out of
each run's median), --device cpu|cuda, --nproc N, --preset NAME (a GPT-2
preset, e.g. 124m; default a small cpu model of --layers 2 --width 64, vocab
256), --mbs N, --seq N (64; 1024 with a preset), --threads N (cpu: per rank, 1),
--smoke (2
pairs of short runs; checks that every run parsed and, in cluster mode, that
sampling off leaves only rank 0's series in loomd), --ab N (worker mode:
each of --pairs runs is one process alternating sampling on N steps / off N
steps, the worker's debug row diag-ab; each off block against its two on
neighbours, which takes the host's slow drift out), --control (with --ab:
as many A/A runs again, interleaved, the same blocks with sampling off
throughout: what the block method reads when nothing differs), --json FILE.
Prints a table and one 'RESULT {json}' line. Exit 0, 1 on a failed run or
check. Python's standard library only."""
import argparse
import array
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

# two-sided 95 % Student t quantiles, df 1..30
T95 = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14,
       2.13, 2.12, 2.11, 2.10, 2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05,
       2.05, 2.04]


class Failed(Exception):
    pass


def write_shard(path, n, vocab):
    """A random-token shard in the loader's format (256 int32 header: magic,
    version, token count; uint16 tokens)."""
    hdr = array.array("i", [0] * 256)
    hdr[0], hdr[1], hdr[2] = 20240520, 1, n
    raw = array.array("H", os.urandom(2 * n))
    if vocab < 65536:
        raw = array.array("H", (t % vocab for t in raw))
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(raw.tobytes())


def make_spec(a, data, dp, name):
    if a.preset:
        model = {"family": "gpt2", "preset": a.preset}
        vocab = 50257
    else:
        model = {"family": "gpt2", "n_layer": a.layers, "n_head": 4, "d_model": a.width,
                 "d_ff": 4 * a.width, "vocab_size": 256, "seq_len": a.seq}
        vocab = 256
    need = (a.steps + 4) * a.mbs * a.seq * dp + 1
    if not os.path.exists(data) or os.path.getsize(data) < 1024 + 2 * need:
        write_shard(data, need, vocab)
    return {"name": name, "model": model, "data": {"train": data},
            "parallel": {"dp": dp, "tp": 1, "pp": 1},
            "train": {"steps": a.steps, "global_batch_tokens": a.mbs * a.seq * dp,
                      "micro_batch": a.mbs, "lr": 3e-4, "warmup_steps": 2, "seed": 7,
                      "precision": "bf16" if a.device == "cuda" else "fp32"},
            "checkpoint": {"every_steps": 1000000, "keep": 1},
            "resources": {"device": a.device, "gpus_per_node": 8 if a.device == "cuda" else 2},
            "max_retries": 0}


def run_median(step_ms, warmup):
    later = step_ms[warmup:] or step_ms[-1:]
    return statistics.median(later) if later else None


def cpu_s(pid):
    """utime + stime of a process, seconds (/proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s(pid):
    """cutime + cstime: the CPU of a process's children it has waited for."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def loadavg():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


# ---- worker mode


def worker_run(a, binp, tmp, on, k, ab=0):
    dp = a.nproc
    name = "diag_%s_%d" % ("on" if on else "off", k)
    sf = os.path.join(tmp, name + ".json")
    with open(sf, "w") as f:
        json.dump(make_spec(a, os.path.join(tmp, "train_000.bin"), dp, name), f)
    out = os.path.join(tmp, name + ".run")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [os.path.join(binp, "loom-worker"), "--spec", sf, "--out", out, "--no-save",
           "--log-level", "warn", "--rank-steps"]
    if a.device == "cuda":
        cmd += ["--device", "cuda"]
    else:
        cmd += ["--threads", str(a.threads)]
    if dp > 1:
        cmd += ["--nproc", str(dp)]
    env = dict(os.environ, LOOM_DIAG="1" if on else "0", NCCL_NVLS_ENABLE="0",
               LOOM_DIAG_AB=str(ab))
    t0 = time.time()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=a.timeout)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.time() - t0
    # the launcher and its ranks (all waited for): CPU a step, start-up included
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    if r.returncode != 0:
        raise Failed("%s: loom-worker exited %d: %s" % (name, r.returncode, r.stderr[-600:]))
    steps, rank_lines = [], 0
    for ln in (r.stdout + "\n" + r.stderr).splitlines():
        try:
            j = json.loads(ln)
        except ValueError:
            continue
        if j.get("type") == "step":
            steps.append(j["ms"]["step"])
        elif j.get("type") == "rank_step":
            rank_lines += 1
    if len(steps) != a.steps:
        raise Failed("%s: %d step lines, want %d" % (name, len(steps), a.steps))
    shutil.rmtree(out, ignore_errors=True)
    return {"median_ms": run_median(steps, a.warmup), "wall_s": wall, "rank_lines": rank_lines,
            "step_ms": steps, "worker_cpu_ms_per_step": 1e3 * cpu / a.steps}


def ab_blocks(steps, n, warmup):
    """Blocks of n steps, on (even blocks) and off (odd) as the worker's
    diag-ab runs them: each off block's median step against the mean of its
    two neighbouring on blocks' medians (a linear drift cancels). Returns
    [(on_ms, off_ms)] for the off blocks that start after the warm-up."""
    med = [statistics.median(steps[i:i + n]) for i in range(0, len(steps) - n + 1, n)]
    out = []
    for b in range(1, len(med) - 1, 2):
        if b * n >= warmup:
            out.append((0.5 * (med[b - 1] + med[b + 1]), med[b]))
    return out


def median_ci(d):
    """Distribution-free 95 % interval of the median of d (order statistics
    of the sign test); the host's noise is heavy-tailed (a descheduled block
    is 20-50 % slow), which widens the t interval of the mean far more."""
    x = sorted(d)
    n = len(x)
    k = int((n - 1.96 * n ** 0.5) / 2)
    if n < 6 or k < 0:
        return [float("nan"), float("nan")]
    return [x[k], x[n - 1 - k]]


def summarize_ab(runs, n):
    comp = [c for r in runs for c in r["blocks"]]
    d = [100 * (on / off - 1) for on, off in comp]
    k = len(d)
    mean, sd = statistics.mean(d), statistics.stdev(d)
    ci = (T95[k - 2] if k - 1 <= len(T95) else 1.96) * sd / k ** 0.5
    on = [c[0] for c in comp]
    off = [c[1] for c in comp]
    s = {"ab_block_steps": n, "blocks": k, "runs": len(runs),
         "on_median_ms": statistics.median(on), "off_median_ms": statistics.median(off),
         "diff_pct": 100 * (statistics.median(on) / statistics.median(off) - 1),
         "paired_mean_pct": mean, "paired_median_pct": statistics.median(d),
         "paired_sd_pct": sd, "ci95_pct": [mean - ci, mean + ci],
         "off_spread_pct": 100 * statistics.stdev(off) / statistics.mean(off),
         "on_min_max_ms": [min(on), max(on)], "off_min_max_ms": [min(off), max(off)],
         "pairs": k, "median_ci95_pct": median_ci(d)}
    s["verdict"] = verdict(s)
    return s


def verdict(s):
    """On the median's interval where there is one (robust to the heavy
    tail), else the mean's."""
    lo, hi = s["median_ci95_pct"]
    what = "median"
    if hi != hi:  # nan: too few pairs
        lo, hi = s["ci95_pct"]
        what = "mean"
    if hi < 1.0 and lo <= 0.0:
        return "within noise (95%% interval of the paired %s %+.2f..%+.2f %%), below 1 %%" % (
            what, lo, hi)
    if hi < 1.0:
        return "below 1 %% (95%% interval of the paired %s %+.2f..%+.2f %%)" % (what, lo, hi)
    return "NOT shown below 1 %% (95%% interval of the paired %s %+.2f..%+.2f %%)" % (
        what, lo, hi)


# ---- cluster mode


class Cluster:
    ADMIN = "admin-token-for-bench-diag"
    JOIN = "join-token-for-bench-diag"

    def __init__(self, binp, tmp):
        from loomtest import daemon_env, free_port, http  # noqa: E402
        self.http, self.binp, self.tmp = http, binp, tmp
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.env = daemon_env(LOOM_ADMIN_TOKEN=self.ADMIN, LOOM_JOIN_TOKEN=self.JOIN)
        self.agent = None
        self.loomd = subprocess.Popen(
            [os.path.join(binp, "loomd"), "--listen", "127.0.0.1:%d" % self.port, "--data-dir",
             os.path.join(tmp, "loomd"), "--auto-approve", "--heartbeat", "1",
             "--node-timeout", "30", "--hang-timeout", "600", "--store-sync-full", "false"],
            env=self.env, stdout=open(os.path.join(tmp, "loomd.log"), "ab"),
            stderr=subprocess.STDOUT)
        self.wait(lambda: self.req("GET", "/healthz", token=None)[0] == 200, 15, "loomd up")
        st, t = self.req("POST", "/v1/tenants", {"name": "bench"})
        st, kk = self.req("POST", "/v1/tenants/%s/tokens" % t["id"], {})
        self.token = kk["token"]

    def req(self, method, path, body=None, token="admin"):
        tok = self.ADMIN if token == "admin" else token
        return self.http(self.url + path, method, body, tok, offline=True)

    def wait(self, fn, secs, what):
        end = time.time() + secs
        while time.time() < end:
            if fn():
                return
            time.sleep(0.1)
        raise Failed("timed out waiting for " + what)

    def start_agent(self, on, k):
        name = "node-%d" % k
        env = dict(self.env, LOOM_DIAG="1" if on else "0")
        self.agent = subprocess.Popen(
            [os.path.join(self.binp, "loom-agent"), "--coordinator", self.url, "--name", name,
             "--work-dir", os.path.join(self.tmp, name), "--cpu-devices", "2",
             "--cpu-peak-gflops", "10", "--heartbeat-ms", "1000"],
            env=env, stdout=open(os.path.join(self.tmp, name + ".log"), "ab"),
            stderr=subprocess.STDOUT)

        def ready():
            st, r = self.req("GET", "/v1/nodes")
            return st == 200 and any(n["name"] == name and n["state"] == "ready"
                                     for n in r["nodes"])
        self.wait(ready, 20, "agent %s ready" % name)
        return name

    def stop_agent(self, name):
        if self.agent:
            self.agent.send_signal(signal.SIGTERM)
            try:
                self.agent.wait(10)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait()
            self.agent = None
        self.req("DELETE", "/v1/nodes/" + name)  # best effort: the next run's node only

    def close(self):
        for p in (self.agent, self.loomd):
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def cluster_run(a, c, on, k):
    node = c.start_agent(on, k)
    try:
        sp = make_spec(a, os.path.join(c.tmp, "train_000.bin"), 2, "diag-%d" % k)
        sp["resources"] = {"device": "cpu", "gpus_per_node": 2}
        d0, a0 = cpu_s(c.loomd.pid), cpu_s(c.agent.pid)
        st, j = c.req("POST", "/v1/jobs", sp, token=c.token)
        if st != 201:
            raise Failed("submit: %s %s" % (st, j))
        jid = j["id"]
        state = {}

        def done():
            s, r = c.req("GET", "/v1/jobs/" + jid, token=c.token)
            state["job"] = r
            return s == 200 and r.get("state") in ("succeeded", "failed", "cancelled")
        c.wait(done, a.timeout, "job %s to end" % jid)
        d1, a1 = cpu_s(c.loomd.pid), cpu_s(c.agent.pid)
        w1 = children_cpu_s(c.agent.pid)  # the workers it started (and reaped)
        if state["job"]["state"] != "succeeded":
            raise Failed("job %s: %s" % (jid, state["job"].get("state")))
        st, m = c.req("GET", "/v1/jobs/%s/metrics" % jid, token=c.token)
        if st != 200:
            raise Failed("metrics of %s: %s" % (jid, st))
        steps = [p["ms"]["step"] for p in m["series"] if "ms" in p]
        ranks = sorted({row["rank"] for row in m.get("ranks", [])})
        if len(steps) != a.steps:
            raise Failed("job %s: %d step records in loomd, want %d" % (jid, len(steps), a.steps))
        return {"median_ms": run_median(steps, a.warmup), "loomd_cpu_ms_per_step":
                1e3 * (d1 - d0) / a.steps, "agent_cpu_ms_per_step": 1e3 * (a1 - a0) / a.steps,
                "worker_cpu_ms_per_step": 1e3 * w1 / a.steps,
                "ranks": ranks}
    finally:
        c.stop_agent(node)


# ---- the A/B loop and the report


def summarize(runs):
    on = [r["median_ms"] for r in runs if r["on"]]
    off = [r["median_ms"] for r in runs if not r["on"]]
    pairs = [runs[i]["median_ms"] / runs[i + 1]["median_ms"] if runs[i]["on"] else
             runs[i + 1]["median_ms"] / runs[i]["median_ms"] for i in range(0, len(runs) - 1, 2)]
    d = [100 * (p - 1) for p in pairs]
    n = len(d)
    mean = statistics.mean(d)
    sd = statistics.stdev(d) if n > 1 else float("nan")
    ci = T95[min(n - 1, len(T95)) - 1] * sd / n ** 0.5 if n > 1 else float("nan")
    aa = 100 * statistics.stdev(off) / statistics.mean(off) if len(off) > 1 else float("nan")
    s = {"pairs": n, "on_median_ms": statistics.median(on), "off_median_ms": statistics.median(off),
         "diff_pct": 100 * (statistics.median(on) / statistics.median(off) - 1),
         "paired_mean_pct": mean, "paired_median_pct": statistics.median(d), "paired_sd_pct": sd,
         "ci95_pct": [mean - ci, mean + ci], "off_spread_pct": aa,
         "on_min_max_ms": [min(on), max(on)], "off_min_max_ms": [min(off), max(off)],
         "median_ci95_pct": median_ci(d)}
    s["verdict"] = verdict(s)
    # CPU a step, paired the same way: far less sensitive to the host's load
    # than wall time (a descheduled rank's wait costs no CPU). The difference
    # is also given as a share of the off runs' median step: the slowdown if
    # every extra CPU ms were spent on a rank's critical path.
    for key in ("worker_cpu_ms_per_step", "loomd_cpu_ms_per_step", "agent_cpu_ms_per_step"):
        if key not in runs[0]:
            continue
        con = statistics.median(r[key] for r in runs if r["on"])
        coff = statistics.median(r[key] for r in runs if not r["on"])
        dd = [runs[i][key] - runs[i + 1][key] if runs[i]["on"] else
              runs[i + 1][key] - runs[i][key] for i in range(0, len(runs) - 1, 2)]
        m = statistics.mean(dd)
        half = T95[min(n - 1, len(T95)) - 1] * statistics.stdev(dd) / n ** 0.5 if n > 1 else 0
        s[key] = {"on": con, "off": coff, "paired_diff_ms": m,
                  "paired_diff_ci95_ms": [m - half, m + half],
                  "diff_pct_of_step": 100 * m / s["off_median_ms"],
                  "diff_ci95_pct_of_step": [100 * (m - half) / s["off_median_ms"],
                                            100 * (m + half) / s["off_median_ms"]]}
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("worker", "cluster"))
    ap.add_argument("bin")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--preset", default=None)
    ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--ab", type=int, default=0)
    ap.add_argument("--control", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.preset:
        a.seq = 1024
    if a.smoke:
        a.pairs, a.steps, a.warmup = 2, min(a.steps, 12), 2
    if a.mode == "cluster" and (a.device != "cpu" or a.nproc != 2):
        print("cluster mode runs a dp2 cpu job", file=sys.stderr)
        return 2
    if a.ab and (a.mode != "worker" or a.steps < 6 * a.ab):
        print("--ab N: worker mode, and --steps of at least 6 N", file=sys.stderr)
        return 2
    binp = os.path.abspath(a.bin)
    tmp = tempfile.mkdtemp(prefix="loom-bench-diag-")
    c = None
    runs = []
    load0 = loadavg()
    t0 = time.time()
    try:
        if a.mode == "cluster":
            c = Cluster(binp, tmp)
        controls = []
        for k in range(2 * a.pairs if a.ab else 0):
            # with --control every other run is the A/A control: the same
            # blocks with sampling off in all of them (LOOM_DIAG=0)
            ctl = a.control and k % 2 == 1
            if not a.control and k >= a.pairs:
                break
            r = worker_run(a, binp, tmp, not ctl, k, ab=a.ab)
            r["blocks"] = ab_blocks(r.pop("step_ms"), a.ab, a.warmup)
            on_steps = 0 if ctl else sum(1 for i in range(a.steps) if (i // a.ab) % 2 == 0)
            if a.nproc > 1 and r["rank_lines"] != (a.nproc - 1) * on_steps:
                raise Failed("diag-ab %d: %d rank_step lines, want %d" % (
                    a.ab, r["rank_lines"], (a.nproc - 1) * on_steps))
            (controls if ctl else runs).append(r)
            d = [100 * (x / y - 1) for x, y in r["blocks"]]
            print("run %2d diag-ab %d%s: %d off blocks, on/off %+.2f %% median, step %.3f ms" % (
                k, a.ab, " A/A control (LOOM_DIAG=0)" if ctl else "", len(d),
                statistics.median(d), r["median_ms"]), flush=True)
        for k in range(0 if a.ab else 2 * a.pairs):
            # on/off in pair 0, off/on in pair 1, ...: ABBAABBA
            on = (k % 2 == 0) == ((k // 2) % 2 == 0)
            r = worker_run(a, binp, tmp, on, k) if c is None else cluster_run(a, c, on, k)
            r["on"] = on
            r.pop("step_ms", None)
            runs.append(r)
            print("run %2d diag %-3s median step %8.3f ms, CPU ms a step: workers %.3f%s" % (
                k, "on" if on else "off", r["median_ms"], r["worker_cpu_ms_per_step"],
                " loomd %.3f agent %.3f; ranks in loomd %s" % (
                    r["loomd_cpu_ms_per_step"], r["agent_cpu_ms_per_step"], r["ranks"])
                if "ranks" in r else "; rank_step lines %d" % r["rank_lines"]), flush=True)
        # the switch must do what it says
        for r in runs if not a.ab else []:
            if "ranks" in r:
                want = [0, 1] if r["on"] else [0]
                if r["ranks"] != want:
                    raise Failed("diag %s: loomd holds the series of ranks %s, want %s" % (
                        "on" if r["on"] else "off", r["ranks"], want))
            elif a.nproc > 1:
                want = (a.nproc - 1) * a.steps if r["on"] else 0
                if r["rank_lines"] != want:
                    raise Failed("diag %s: %d rank_step lines, want %d" % (
                        "on" if r["on"] else "off", r["rank_lines"], want))
        s = summarize_ab(runs, a.ab) if a.ab else summarize(runs)
        if a.ab and controls:
            cs = summarize_ab(controls, a.ab)
            s["control"] = {k: cs[k] for k in ("blocks", "runs", "paired_mean_pct",
                                               "paired_median_pct", "paired_sd_pct", "ci95_pct",
                                               "median_ci95_pct")}
    except (Failed, subprocess.TimeoutExpired) as e:
        print("FAIL: %s (logs in %s)" % (e, tmp))
        if c:
            c.close()
        return 1
    if c:
        c.close()
    s.update({"mode": a.mode, "device": a.device, "nproc": a.nproc, "steps": a.steps,
              "warmup": a.warmup, "preset": a.preset, "mbs": a.mbs, "seq": a.seq,
              "loadavg_before": load0, "loadavg_after": loadavg(), "cpus": os.cpu_count(),
              "wall_s": round(time.time() - t0, 1)})
    print("diag on : median %.3f ms a step (runs %.3f..%.3f)" % (
        s["on_median_ms"], *s["on_min_max_ms"]))
    print("diag off: median %.3f ms a step (runs %.3f..%.3f; A/A spread %.2f %%)" % (
        s["off_median_ms"], *s["off_min_max_ms"], s["off_spread_pct"]))
    print("on / off: %+.2f %% (medians); paired %+.2f %% mean (95%% %+.2f..%+.2f), %+.2f %% "
          "median (95%% %+.2f..%+.2f), sd %.2f %% over %d pairs; %s" % (
              s["diff_pct"], s["paired_mean_pct"], *s["ci95_pct"], s["paired_median_pct"],
              *s["median_ci95_pct"], s["paired_sd_pct"], s["pairs"], s["verdict"]))
    if "control" in s:
        c = s["control"]
        print("A/A control (sampling off in every block): paired %+.2f %% mean (95%% %+.2f.."
              "%+.2f), %+.2f %% median (95%% %+.2f..%+.2f), sd %.2f %% over %d blocks" % (
                  c["paired_mean_pct"], *c["ci95_pct"], c["paired_median_pct"],
                  *c["median_ci95_pct"], c["paired_sd_pct"], c["blocks"]))
    for key in ("worker_cpu_ms_per_step", "loomd_cpu_ms_per_step", "agent_cpu_ms_per_step"):
        if key in s:
            v = s[key]
            print("%s CPU ms a step: on %.3f off %.3f; paired on-off %+.3f ms (95%% %+.3f.."
                  "%+.3f) = %+.2f %% of a step (95%% %+.2f..%+.2f)" % (
                      key.split("_")[0], v["on"], v["off"], v["paired_diff_ms"],
                      *v["paired_diff_ci95_ms"], v["diff_pct_of_step"],
                      *v["diff_ci95_pct_of_step"]))
    print("RESULT " + json.dumps(s))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": s, "runs": runs}, f, indent=1)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
