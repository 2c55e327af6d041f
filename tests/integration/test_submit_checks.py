#!/usr/bin/env python3
"""Submit-time checks of POST /v1/jobs against the real loomd on loopback: data patterns that
match no file under visible data roots (DATA_PATH_NOT_FOUND), a model vocabulary smaller than
the data's meta.json vocab_size (VOCAB_TOO_SMALL), a world size above the tenant's gpu_quota
(QUOTA_TOO_SMALL). Each refusal is 422 with the code and a message naming the values, and stores
nothing; the same spec with the problem fixed is accepted. Without data roots loomd does not look
for the files (shared storage is not assumed then). Usage: test_submit_checks.py BIN_DIR"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

BIN = os.path.abspath(sys.argv[1])
ADMIN = "submit-check-admin"
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def request(url, method, path, body, token):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Authorization": "Bearer " + token,
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def start_loomd(tmp, name, roots):
    dd = os.path.join(tmp, name)
    args = [os.path.join(BIN, "loomd"), "--listen", "127.0.0.1:0", "--data-dir", dd]
    if roots:
        args += ["--data-roots", roots]
    env = dict(os.environ, LOOM_ADMIN_TOKEN=ADMIN, LOOM_JOIN_TOKEN="j")
    p = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    addr = os.path.join(dd, "loomd.addr")
    for _ in range(200):
        if os.path.exists(addr) and os.path.getsize(addr) > 0:
            return p, open(addr).read().strip()
        time.sleep(0.05)
    p.kill()
    raise SystemExit("loomd did not start")


def tenant(url, name, quota=0):
    st, t = request(url, "POST", "/v1/tenants", {"name": name, "gpu_quota": quota}, ADMIN)
    st2, k = request(url, "POST", "/v1/tenants/%s/tokens" % t["id"], {}, ADMIN)
    return k["token"]


def spec(root, **kw):
    s = {"name": "check", "model": {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 32,
                                    "vocab_size": kw.get("vocab", 256), "seq_len": 32},
         "data": {"train": root + "/train_*.bin", "val": root + "/val_*.bin"},
         "parallel": {"dp": kw.get("dp", 1)},
         "train": {"steps": 4, "micro_batch": 2},
         "resources": {"device": "cpu", "gpus_per_node": kw.get("dp", 1)}}
    s["data"].update(kw.get("data", {}))
    return s


def main():
    tmp = tempfile.mkdtemp(prefix="loom-submit-checks-")
    procs = []
    try:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        for f in ("train_000.bin", "val_000.bin"):
            open(os.path.join(data, f), "wb").close()
        big = os.path.join(data, "gpt2")
        os.makedirs(big)
        open(os.path.join(big, "train_000.bin"), "wb").close()
        json.dump({"tokenizer": "gpt2", "vocab_size": 50257}, open(os.path.join(big, "meta.json"), "w"))
        p, url = start_loomd(tmp, "loomd", data)
        procs.append(p)
        tok = tenant(url, "a")
        qtok = tenant(url, "small", quota=2)
        cases = [
            ("train matches no file", tok, spec(data, data={"train": data + "/nope_*.bin"}),
             "DATA_PATH_NOT_FOUND", [data + "/nope_*.bin", "data.train"]),
            ("val matches no file", tok, spec(data, data={"val": data + "/val_9*.bin"}),
             "DATA_PATH_NOT_FOUND", [data + "/val_9*.bin", "data.val"]),
            ("train directory missing", tok, spec(data, data={"train": data + "/gone/t_*.bin"}),
             "DATA_PATH_NOT_FOUND", ["gone"]),
            ("vocab below the data's", tok,
             spec(data, data={"train": big + "/train_*.bin", "val": None}), "VOCAB_TOO_SMALL",
             ["256", "50257"]),
            ("quota below world size", qtok, spec(data, dp=4), "QUOTA_TOO_SMALL", ["4", "2"]),
        ]
        for name, t, s, code, words in cases:
            if s["data"].get("val") is None:
                s["data"].pop("val", None)
            st, r = request(url, "POST", "/v1/jobs", s, t)
            err = (r or {}).get("error", {})
            msg = err.get("message", "")
            check(st == 422 and err.get("code") == code and all(w in msg for w in words),
                  "%s: %s %s %s" % (name, st, err.get("code"), msg))
        for t in (tok, qtok):
            st, r = request(url, "GET", "/v1/jobs", None, t)
            check(st == 200 and r["items"] == [], "refusals stored nothing (%d jobs)" % len(r["items"]))
        good = [("fixed data", tok, spec(data)),
                ("vocab 50257", tok, spec(data, vocab=50257,
                                          data={"train": big + "/train_*.bin", "val": None})),
                ("quota 2, world 2", qtok, spec(data, dp=2))]
        for name, t, s in good:
            if s["data"].get("val") is None:
                s["data"].pop("val", None)
            st, r = request(url, "POST", "/v1/jobs", s, t)
            check(st == 201, "%s is accepted: %s %s" % (name, st, (r or {}).get("error")))
        # No data roots: loomd cannot know where the nodes see data; the files are not looked for.
        p2, url2 = start_loomd(tmp, "loomd2", None)
        procs.append(p2)
        tok2 = tenant(url2, "b")
        st, r = request(url2, "POST", "/v1/jobs", spec("/no/such/dir"), tok2)
        check(st == 201, "without data roots a missing path is left to staging: %s" % st)
    finally:
        for p in procs:
            p.terminate()
            rc = p.wait(timeout=10)
            check(rc == 0, "loomd exits 0 on SIGTERM (sanitizer builds: no report): %s" % rc)
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
