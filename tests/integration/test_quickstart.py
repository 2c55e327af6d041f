#!/usr/bin/env python3
"""deploy/quickstart.sh end to end with the built binaries (LOOM_QUICKSTART_BIN), a tiny model
and a temporary LOOM_QUICKSTART_DIR, then loomctl against the cluster it leaves running:
- the run prints step lines with the loss, a loss plot, the URL, the token files and export
  lines; admin.token and tenant.token are mode 0600 and hold the tokens that work;
- a second run refuses to wipe the directory while the cluster runs and says how to stop it;
- loomctl get/list/logs/metrics show progress fields, every command has its own --help,
  --version works in every binary, API errors print as CODE: message;
- `quickstart.sh stop` stops both processes by their pid files.
Usage: test_quickstart.py BIN_DIR"""
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time

BIN = os.path.abspath(sys.argv[1])
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "deploy", "quickstart.sh")
STEPS = 6
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(args, env, timeout=120):
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie is gone for our purposes
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return True


def loomctl_checks(qs, env):
    """Defined in the loomctl section below; returns nothing, records failures."""
    if "loomctl_section" in globals():
        globals()["loomctl_section"](qs, env)


def loomctl_section(qs, env):
    ctl = os.path.join(BIN, "loomctl")
    jid = json.load(open(os.path.join(qs, "submitted.json")))["id"]
    rc, o, e = run([ctl, "get", jid], env)
    fields = dict(l.split(None, 1) for l in o.splitlines() if len(l.split(None, 1)) == 2)
    check(rc == 0 and fields.get("step") == "%d/%d" % (STEPS, STEPS), "get: step %s" % fields.get("step"))
    for k in ("loss", "val_loss", "tokens_per_s"):
        v = fields.get(k, "-")
        check(re.match(r"^[0-9.]+$", v) is not None, "get: %s is a number (%s)" % (k, v))
    check(re.match(r"^\d+s$", fields.get("elapsed", "")) is not None, "get: elapsed %s" % fields.get("elapsed"))
    check("eta" in fields, "get: eta row")
    rc, o, e = run([ctl, "list"], env)
    lines = o.splitlines()
    check(rc == 0 and "STEP" in lines[0] and "LOSS" in lines[0] and "VAL" in lines[0],
          "list has progress columns: " + lines[0])
    check(any(jid in l and "%d/%d" % (STEPS, STEPS) in l for l in lines), "list shows the job's step")
    rc, o, e = run([ctl, "--json", "list"], env)
    page = json.loads(o)
    check(rc == 0 and "next_cursor" in page and page["items"][0]["id"] == jid,
          "--json list keeps items and next_cursor: %s" % sorted(page))
    rc, o, e = run([ctl, "logs", jid], env)
    check(rc == 0 and re.search(r"^step %d/%d loss [0-9.]+ lr " % (STEPS, STEPS), o, re.M) is not None,
          "logs prints step lines as text")
    check(re.search(r"^eval step %d val_loss [0-9.]+" % STEPS, o, re.M) is not None, "logs prints eval lines")
    check('"type"' not in o, "logs by default prints no JSON records")
    rc, o, e = run([ctl, "logs", jid, "--raw"], env)
    recs = [json.loads(l) for l in o.splitlines() if l.startswith("{")]
    check(rc == 0 and any(r.get("type") == "step" and r.get("step") == STEPS for r in recs),
          "logs --raw prints the JSON records")
    rc, o, e = run([ctl, "metrics", jid], env)
    check(rc == 0 and "VAL_LOSS" in o.splitlines()[0], "metrics has a VAL_LOSS column")
    last = o.splitlines()[-1].split()
    check(len(last) > 3 and re.match(r"^[0-9.]+$", last[3]) is not None,
          "metrics: the last step's validation loss %s" % last[3:4])
    rc, o, e = run([ctl, "get", "j-000000000000"], env)
    check(rc == 1 and "404 JOB_NOT_FOUND: " in e, "get of an unknown job: " + e.strip())
    rc, o, e = run([ctl, "logs", "j-000000000000"], env)
    check(rc == 1 and "404 JOB_NOT_FOUND: " in e and "curl" not in e.lower() and "returned error" not in e,
          "logs of an unknown job prints the API's code and message: " + e.strip())
    rc, o, e = run([ctl, "logs", jid, "--rank", "99"], env)
    check(rc == 1 and "INVALID_RANK" in e and "99" in e and "world size 1" in e,
          "logs --rank 99 of a 1-rank job: " + e.strip())
    rc, o, e = run([ctl, "--help"], env)
    cmds = [l.split()[0] for l in o.splitlines()[3:] if l.startswith("  ")]
    check(len(cmds) >= 15, "global help lists %d commands" % len(cmds))
    for c in cmds:
        rc, o2, e2 = run([ctl, c, "--help"], env)
        check(rc == 0 and o2.startswith("usage: loomctl " + c), "%s --help prints its own usage" % c)
    rc, o, e = run([ctl, "plan", "--help"], env)
    check("..." not in o.splitlines()[0] or "see plan --help" in o, "plan usage line")
    for opt in ("--local", "--nodes N", "--gpus-per-node G", "--gpu NAME", "--price P"):
        check(opt in o, "plan --help lists " + opt)
    rc, o, e = run([ctl, "logs", "--help"], env)
    check("--raw" in o and "--follow" in o and "--stream" in o, "logs --help lists its options")
    # The agent's long-polls have their own histogram, not the request-latency one.
    import urllib.request
    text = urllib.request.urlopen(env["LOOM_URL"] + "/metrics", timeout=10).read().decode()
    lat = [l for l in text.splitlines() if l.startswith("loom_http_request_duration_seconds_count")]
    lp = [l for l in text.splitlines() if l.startswith("loom_http_long_poll_duration_seconds_count")]
    check(lat and not any("/v1/agent/assignments" in l for l in lat),
          "request latency leaves out the assignments long-poll (%d routes)" % len(lat))
    check(any('route="/v1/agent/assignments"' in l for l in lp),
          "long-poll histogram has the assignments route")
    # The node check of a one-device node runs what makes sense there and names what it skipped.
    adm = dict(env, LOOM_TOKEN=open(os.path.join(qs, "admin.token")).read().strip())
    rc, o, e = run([ctl, "--json", "node-check", "node-0"], adm, timeout=60)
    try:
        res = json.loads(o)
    except ValueError:
        res = {}
    if isinstance(res, list):
        res = res[0] if res else {}
    res = res.get("check", res)
    reason = res.get("reason", "")
    summ = res.get("summary") or {}
    check(rc == 0 and res.get("state") == "passed", "1-device node check passes: %s %s" % (rc, o[-300:] + e[-300:]))
    check("one device" in reason and "skipped bandwidth" in reason and "latency" in reason
          and "GB/s" not in reason, "it says what it skipped and why: " + reason)
    check(summ.get("peak_busbw_gbps") is None and summ.get("skipped"),
          "no bandwidth figure, a skipped list: %s" % summ.get("skipped"))
    # plan --cluster FILE: the same plan as the same cluster given as flags, another than the default.
    spec = os.path.join(qs, "job.json")
    cf = os.path.join(qs, "whatif.json")
    json.dump({"nodes": 4, "gpus_per_node": 2, "gpu": "H100-SXM"}, open(cf, "w"))
    r1 = run([ctl, "--json", "plan", "--local", spec, "--cluster", cf], env)
    r2 = run([ctl, "--json", "plan", "--local", spec, "--nodes", "4", "--gpus-per-node", "2",
              "--gpu", "H100-SXM"], env)
    r3 = run([ctl, "--json", "plan", "--local", spec], env)
    r4 = run([ctl, "--json", "plan", "--local", spec, "--cluster", cf, "--nodes", "1"], env)
    check(r1[0] == 0 and r1[1] == r2[1], "plan --cluster FILE equals the same flags (%s)" % r1[2][-200:])
    check(r1[1] != r3[1], "plan --cluster FILE differs from the default cluster")
    check(r4[0] == 0 and r4[1] != r1[1], "a flag after --cluster overrides the file")
    versions = set()
    for b in ("loomctl", "loomd", "loom-agent", "loom-worker"):
        rc, o, e = run([os.path.join(BIN, b), "--version"], env)
        m = re.match(r"^%s (\d+\.\d+\.\d+)$" % b, o.strip())
        check(rc == 0 and m is not None, "%s --version: %r" % (b, o.strip()))
        if m:
            versions.add(m.group(1))
    check(len(versions) == 1, "one version string: %s" % versions)


def main():
    if not os.path.isdir("/usr/share/common-licenses"):
        print("SKIP: /usr/share/common-licenses missing")
        return 77
    tmp = tempfile.mkdtemp(prefix="loom-qs-test-")
    qs = os.path.join(tmp, "qs")
    env = dict(os.environ, LOOM_QUICKSTART_DIR=qs, LOOM_QUICKSTART_BIN=BIN,
               LOOM_QUICKSTART_MODEL="tiny", LOOM_QUICKSTART_STEPS=str(STEPS),
               LOOM_QUICKSTART_KEEP="1")
    for k in ("LOOM_URL", "LOOM_TOKEN", "LOOM_ADMIN_TOKEN", "LOOM_JOIN_TOKEN"):
        env.pop(k, None)
    pids = []
    try:
        t0 = time.time()
        rc, out, err = run(["sh", SCRIPT], env)
        print(out[-3000:], err[-2000:])
        check(rc == 0, "quick start exits 0 (rc=%d, %.1f s)" % (rc, time.time() - t0))
        steps = re.findall(r"step (\d+)/%d loss ([0-9.]+)" % STEPS, out)
        check(len(steps) >= 2 and steps[-1][0] == str(STEPS),
              "step lines with the loss up to step %d (%d lines)" % (STEPS, len(steps)))
        check("training loss" in out and "|" in out, "a text plot of the loss at the end")
        url = open(os.path.join(qs, "url")).read().strip()
        check(re.match(r"http://127\.0\.0\.1:\d+$", url) is not None, "url file holds " + url)
        check("export LOOM_URL=%s" % url in out, "prints export LOOM_URL=")
        check("export LOOM_TOKEN=$(cat %s/tenant.token)" % qs in out, "prints export LOOM_TOKEN=")
        admin = os.path.join(qs, "admin.token")
        check(admin in out, "prints the admin token's path")
        for f in ("admin.token", "tenant.token"):
            mode = stat.S_IMODE(os.stat(os.path.join(qs, f)).st_mode)
            check(mode == 0o600, "%s has mode 0600 (%o)" % (f, mode))
        env2 = dict(env, LOOM_URL=url, LOOM_TOKEN=open(admin).read().strip())
        rc, o, e = run([os.path.join(BIN, "loomctl"), "tenant-list"], env2)
        check(rc == 0 and "quickstart" in o, "the admin token file's token is loomd's admin token")
        for n in ("loomd", "loom-agent"):
            pids.append(int(open(os.path.join(qs, n + ".pid")).read()))
        check(all(alive(p) for p in pids), "loomd and loom-agent run after the script (KEEP=1)")

        env3 = dict(env, LOOM_URL=url, LOOM_TOKEN=open(os.path.join(qs, "tenant.token")).read().strip())
        loomctl_checks(qs, env3)

        rc, o, e = run(["sh", SCRIPT], env)
        check(rc == 1, "a second run while the cluster runs exits 1 (rc=%d)" % rc)
        check("still running" in e and "quickstart.sh stop" in e,
              "it says the cluster runs and how to stop it: " + e.strip()[:200])
        check(os.path.exists(os.path.join(qs, "model.safetensors")), "and wiped nothing")

        rc, o, e = run(["sh", SCRIPT, "stop"], env)
        check(rc == 0 and "stopped loomd" in o and "stopped loom-agent" in o, "stop: " + o.strip())
        deadline = time.time() + 10
        while time.time() < deadline and any(alive(p) for p in pids):
            time.sleep(0.1)
        check(not any(alive(p) for p in pids), "both processes are gone after stop")
        check(not os.path.exists(os.path.join(qs, "loomd.pid")), "stop removes the pid files")
        rc, o, e = run(["sh", SCRIPT, "stop"], env)
        check(rc == 0 and "no quick-start cluster" in o, "a second stop says none runs")
    finally:
        for p in pids:
            if alive(p):
                os.kill(p, 9)
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
