#!/usr/bin/env python3
"""The rendezvous protocol of node checks (/v1/nodechecks/{id}/rdzv/{key}) is
the one of attempts (/v1/rdzv/...): both are daemon/rdzv.c's rdzv_scope_put /
rdzv_scope_get. A real loomd; this script plays the agent of one node (register,
take the check's part with the join token, which hands out the check token)
and asserts, with the check token:
  - PUT stores (200), the same value again is 200, another value is
    409 RDZV_KEY_EXISTS, a value that is not a string is 400 INVALID_RDZV_VALUE,
    one over 256 KiB is 413 PAYLOAD_TOO_LARGE;
  - GET returns the stored value; a missing key is 404 RDZV_KEY_NOT_FOUND after
    the wait (not before); a waiting GET is woken by the PUT of its key;
  - the admin token, the join token, the token of another check and tokens
    one character short or long are 403 RDZV_FORBIDDEN (no token: 401); the
    check token cannot read an attempt's keys;
  - once the check has ended its keys are gone (403).
Usage: test_rdzv_scopes.py BIN_DIR
Exit 0 pass, 1 fail, 77 skip."""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import loomtest  # noqa: E402
from loomtest import http  # noqa: E402

BIN = os.path.abspath(sys.argv[1])
ADMIN = "rz-admin"
JOIN = "rz-join"
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL: " + msg, file=sys.stderr)


def call(url, method, path, body=None, token=None, raw=None):
    return http(url + path, method, body, token, raw)


def code(reply):
    return reply.get("error", {}).get("code") if isinstance(reply, dict) else None


def wait_for(fn, secs, what):
    return loomtest.wait_for(fn, secs, what, step=0.05, exc=RuntimeError)


CREDS = {}  # node -> the credential loomd issued at registration


def register(url, node):
    st, r = call(url, "POST", "/v1/agent/register",
                 {"node": node, "kind": "cpu", "hostname": node,
                  "devices": [{"index": 0, "name": "cpu"}, {"index": 1, "name": "cpu"}]},
                 token=JOIN)
    check(st == 200, "register %s: %s %s" % (node, st, r))
    CREDS[node] = r["credential"]


def take_check(url, node, check_id):
    """The part of check_id handed to `node` (as its agent would get it)."""
    def poll():
        st, r = call(url, "GET", "/v1/agent/checks?node=%s&wait_ms=1000" % node,
                     token=CREDS[node])
        parts = [p for p in (r or {}).get("checks", []) if p.get("id") == check_id]
        return parts[0] if st == 200 and parts else None
    return wait_for(poll, 10, "the part of check " + check_id)


def scenario(url):
    register(url, "node-a")
    register(url, "node-b")
    st, ck = call(url, "POST", "/v1/nodes/node-a/check", {"timeout_s": 30}, token=ADMIN)
    check(st == 202, "queue check on node-a: %s %s" % (st, ck))
    st, ck2 = call(url, "POST", "/v1/nodes/node-b/check", {"timeout_s": 30}, token=ADMIN)
    check(st == 202, "queue check on node-b: %s %s" % (st, ck2))
    part = take_check(url, "node-a", ck["id"])
    other = take_check(url, "node-b", ck2["id"])
    tok, base = part["token"], part["rdzv"]
    check(base == "/v1/nodechecks/%s/rdzv" % ck["id"], "rdzv path: %s" % base)
    check(tok and tok != other["token"], "each check has its own token")

    st, r = call(url, "PUT", base + "/k1", {"value": "YQ=="}, token=tok)
    check(st == 200 and r == {"ok": True}, "put k1: %s %s" % (st, r))
    st, r = call(url, "PUT", base + "/k1", {"value": "YQ=="}, token=tok)
    check(st == 200, "same value again: %s %s" % (st, r))
    st, r = call(url, "PUT", base + "/k1", {"value": "Yg=="}, token=tok)
    check(st == 409 and code(r) == "RDZV_KEY_EXISTS", "other value: %s %s" % (st, r))
    st, r = call(url, "PUT", base + "/k2", {"value": 7}, token=tok)
    check(st == 400 and code(r) == "INVALID_RDZV_VALUE", "number value: %s %s" % (st, r))
    st, r = call(url, "PUT", base + "/k3", {"value": "x" * (256 * 1024 + 1)}, token=tok)
    check(st == 413 and code(r) == "PAYLOAD_TOO_LARGE", "oversized value: %s %s" % (st, r))
    st, r = call(url, "GET", base + "/k1", token=tok)
    check(st == 200 and r == {"value": "YQ=="}, "get k1: %s %s" % (st, r))

    t0 = time.time()
    st, r = call(url, "GET", base + "/missing?wait_ms=400", token=tok)
    dt = time.time() - t0
    check(st == 404 and code(r) == "RDZV_KEY_NOT_FOUND", "missing key: %s %s" % (st, r))
    check(dt >= 0.35, "404 only after the wait (%.3f s)" % dt)

    got = {}

    def waiter():
        got["t0"] = time.time()
        got["reply"] = call(url, "GET", base + "/late?wait_ms=10000", token=tok)
        got["t1"] = time.time()
    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.3)
    st, r = call(url, "PUT", base + "/late", {"value": "bGF0ZQ=="}, token=tok)
    check(st == 200, "put late: %s %s" % (st, r))
    th.join(15)
    check(got.get("reply") == (200, {"value": "bGF0ZQ=="}), "woken waiter: %s" % (got.get("reply"),))
    check(got.get("t1", 99) - got.get("t0", 0) < 5, "waiter woken by the put, not the timeout")

    st, r = call(url, "GET", base + "/k1")
    check(st == 401 and code(r) == "UNAUTHORIZED", "get with no token: %s %s" % (st, r))
    for name, t in (("admin", ADMIN), ("join", JOIN), ("other check", other["token"]),
                    ("prefix", tok[:-1]), ("longer", tok + "0")):
        st, r = call(url, "GET", base + "/k1", token=t)
        check(st == 403 and code(r) == "RDZV_FORBIDDEN", "get with %s token: %s %s" % (name, st, r))
        st, r = call(url, "PUT", base + "/k9", {"value": "YQ=="}, token=t)
        check(st == 403 and code(r) == "RDZV_FORBIDDEN", "put with %s token: %s %s" % (name, st, r))
    st, r = call(url, "GET", "/v1/rdzv/j-nothere/0/k1", token=tok)
    check(st == 403 and code(r) == "RDZV_FORBIDDEN", "check token on an attempt path: %s %s" % (st, r))

    # The check ends (its one part reports); its keys are gone.
    st, r = call(url, "POST", "/v1/agent/checks/" + ck["id"],
                 {"node": "node-a", "ok": False, "error": "ended by the test"},
                 token=CREDS["node-a"])
    check(st == 200, "report: %s %s" % (st, r))
    st, r = call(url, "GET", base + "/k1", token=tok)
    check(st == 403 and code(r) == "RDZV_FORBIDDEN", "after the end: %s %s" % (st, r))


def main():
    if not os.path.exists(os.path.join(BIN, "loomd")):
        print("no loomd in " + BIN)
        return 77
    tmp = tempfile.mkdtemp(prefix="loom-rz-")
    env = dict(os.environ, LOOM_ADMIN_TOKEN=ADMIN, LOOM_JOIN_TOKEN=JOIN)
    dd = os.path.join(tmp, "loomd")
    log = open(os.path.join(tmp, "log"), "ab")
    p = subprocess.Popen([os.path.join(BIN, "loomd"), "--auto-approve", "--listen", "127.0.0.1:0", "--data-dir",
                          dd, "--store-sync-full", "false"], env=env, stdout=log,
                         stderr=subprocess.STDOUT)
    rc = 1
    try:
        url = wait_for(lambda: open(os.path.join(dd, "loomd.addr")).read().strip(), 10,
                       "loomd.addr")
        scenario(url)
        rc = 1 if failures else 0
    except RuntimeError as e:
        print("FAIL: %s" % e, file=sys.stderr)
    finally:
        p.terminate()
        try:
            exit_code = p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            exit_code = -9
        if exit_code != 0:
            print("FAIL: loomd exited %s on SIGTERM" % exit_code, file=sys.stderr)
            rc = 1
        log.close()
    if rc == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        print("test_rdzv_scopes: ok")
    else:
        print("kept " + tmp, file=sys.stderr)
        with open(os.path.join(tmp, "log"), "rb") as f:
            sys.stderr.write(f.read().decode(errors="replace")[-4000:])
    return rc


if __name__ == "__main__":
    sys.exit(main())
