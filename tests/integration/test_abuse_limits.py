#!/usr/bin/env python3
"""Abuse limits of loomd on loopback: a real loomd and one loom-agent running
tests/fake_worker with a job that writes a log line every 20 s. Opens and
drops (FIN or RST) waves of log-follow streams of that running job, plus
half-open connections that never finish their request head, and checks:
  - /healthz and an authenticated GET answer within 1 s during and after;
  - dropped streams are freed at once (no CLOSE_WAIT sockets pile up on
    loomd's port, counted from /proc/net/tcp; the stream count falls to 0);
  - the per-tenant stream limit answers 429 TENANT_STREAM_LIMIT while
    the admin token (counted apart) still gets a stream;
  - half-open connections are closed after --header-timeout;
  - the SQLite read pool stays within --store-read-max and shrinks back to
    --store-read-idle.
Usage: test_abuse_limits.py BIN_DIR. Exit 0 pass, 1 fail, 77 skip."""
import os
import resource
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# test_cluster reads BIN_DIR and a scenario name from argv when imported.
sys.argv = [sys.argv[0], sys.argv[1] if len(sys.argv) > 1 else ".", "abuse_limits"]
sys.path.insert(0, HERE)
import test_cluster as tc  # noqa: E402

check = tc.check
WAVE = 300  # streams open at once, = --tenant-streams
WAVES = 6
HALF_OPEN = 300
CW_TRANSIENT = 3  # the prober's own just-closed connections
HEADER_TIMEOUT = 3
READ_MAX, READ_IDLE = 8, 2


class LimitCluster(tc.Cluster):
    def start_loomd(self):
        os.makedirs(os.path.join(self.tmp, "loomd"), exist_ok=True)
        self.loomd = subprocess.Popen(
            [os.path.join(tc.BIN, "loomd"), "--auto-approve", "--listen", "127.0.0.1:%d" % self.port, "--data-dir",
             os.path.join(self.tmp, "loomd"), "--heartbeat", "1", "--store-sync-full", "false",
             "--rate-limit", "0", "--conn-limit", "1024", "--tenant-streams", str(WAVE),
             "--header-timeout", str(HEADER_TIMEOUT), "--store-read-max", str(READ_MAX),
             "--store-read-idle", str(READ_IDLE)],
            env=self.env, stdout=self.log("loomd"), stderr=subprocess.STDOUT)
        self.wait(lambda: self.get("/healthz", token=None)[0] == 200, 10, "loomd up")


def close_wait_count(port):
    """Sockets in CLOSE_WAIT (state 08) whose local port is loomd's."""
    n = 0
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "08":
                        n += 1
        except OSError:
            pass
    return n


class Prober(threading.Thread):
    """GETs /healthz and an authenticated job every 100 ms; keeps the worst time."""

    def __init__(self, c, jid):
        super().__init__(daemon=True)
        self.c, self.jid = c, jid
        self.worst, self.fails, self.n = 0.0, [], 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            for path, tok in (("/healthz", None), ("/v1/jobs/" + self.jid, "tenant")):
                t0 = time.time()
                st, _ = self.c.get(path, token=tok)
                dt = time.time() - t0
                self.n += 1
                self.worst = max(self.worst, dt)
                if st != 200 or dt > 1.0:
                    self.fails.append((path, st, round(dt, 3)))
            time.sleep(0.1)


def open_streams(c, jid, token, n):
    req = ("GET /v1/jobs/%s/logs?follow=1 HTTP/1.1\r\nHost: loom\r\n"
           "Authorization: Bearer %s\r\n\r\n" % (jid, token)).encode()
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", c.port), timeout=10)
        s.sendall(req)
        socks.append(s)
    statuses = []
    for s in socks:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
        statuses.append(head)  # status line, headers and what came of the body
    return socks, statuses


def drop(socks, rst):
    for s in socks:
        if rst:  # SO_LINGER 0: close sends RST
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()


def connections(c):
    st, r = c.request("GET", "/v1/system/connections", token=tc.ADMIN)
    check(st == 200, "connections summary: %s %s" % (st, r))
    return r


def run(c):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    jid = c.submit(world=1, steps=1000, step_ms=20000, name="quiet")
    c.wait_state(jid, "running", 20)
    # The log exists (the worker's start line) before streams follow it.
    c.wait(lambda: "starting" in str(c.get("/v1/jobs/%s/logs" % jid)[1]), 15, "first log line")
    port = c.port
    prober = Prober(c, jid)
    prober.start()
    peak_cw, peak_pool, total, freed_s = 0, 0, 0, 0.0
    try:
        for w in range(WAVES):
            socks, sts = open_streams(c, jid, c.token, WAVE)
            total += len(socks)
            check(all(s.startswith(b"HTTP/1.1 200 ") for s in sts),
                  "wave %d: statuses %s" % (w, set(s.split(b"\r\n", 1)[0] for s in sts)))
            summary = connections(c)
            peak_pool = max(peak_pool, summary["read_pool"]["open"])
            check(summary["streams"]["open"] >= WAVE,
                  "wave %d: %s streams open" % (w, summary["streams"]))
            if w == 0:
                # One more for this tenant is over --tenant-streams; another tenant gets in.
                extra, est = open_streams(c, jid, c.token, 1)
                check(est[0].startswith(b"HTTP/1.1 429 "), "stream %d of a tenant: %r"
                      % (WAVE + 1, est[0]))
                body = est[0]
                if b"TENANT_STREAM_LIMIT" not in body:
                    body += extra[0].recv(4096)
                check(b"TENANT_STREAM_LIMIT" in body, "429 body: %r" % body)
                drop(extra, False)
                check(summary["streams"]["by_tenant"].get(c.tenant) == WAVE,
                      "by_tenant: %s" % summary["streams"]["by_tenant"])
                # The admin token counts apart from the tenant: it still gets a stream.
                adm, ast = open_streams(c, jid, tc.ADMIN, 1)
                check(ast[0].startswith(b"HTTP/1.1 200 "), "admin stream beside a full tenant: %s" % ast[0])
                drop(adm, False)
            drop(socks, rst=(w % 2 == 1))
            # Freed at once: within 3 s no stream is open and no CLOSE_WAIT is left
            # (but for a transient one of the prober's closed connections).
            t_drop = time.time()
            end = t_drop + 3
            while time.time() < end:
                cw = close_wait_count(port)
                peak_cw = max(peak_cw, cw)
                if cw <= CW_TRANSIENT and connections(c)["streams"]["open"] == 0:
                    break
                time.sleep(0.05)
            freed_s = max(freed_s, time.time() - t_drop)
            cw = close_wait_count(port)
            check(cw <= CW_TRANSIENT, "wave %d: %d CLOSE_WAIT sockets 3 s after the drop" % (w, cw))
            check(connections(c)["streams"]["open"] == 0, "wave %d: streams still open: %s"
                  % (w, connections(c)["streams"]))
        # Half-open connections: a request head that never ends.
        half = []
        for _ in range(HALF_OPEN):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: loom\r\nX-Slow: ")
            half.append(s)
        check(connections(c)["connections"]["open"] >= HALF_OPEN, "half-open connections counted")
        time.sleep(HEADER_TIMEOUT + 2)
        closed = 0
        for s in half:
            s.settimeout(2)
            try:
                closed += s.recv(4096) == b""
            except (socket.timeout, ConnectionError):
                pass
            s.close()
        check(closed == HALF_OPEN, "%d of %d half-open connections closed after %d s"
              % (closed, HALF_OPEN, HEADER_TIMEOUT))
        time.sleep(0.5)
    finally:
        prober.stop.set()
        prober.join()
    check(not prober.fails, "slow or failed probes: %s" % prober.fails[:10])
    check(prober.n > 20, "only %d probes ran" % prober.n)
    summary = connections(c)
    pool = summary["read_pool"]
    check(peak_pool <= READ_MAX and pool["max"] == READ_MAX, "read pool above its max: %s" % pool)
    check(pool["open"] <= READ_IDLE, "read pool did not shrink: %s" % pool)
    check(summary["connections"]["open"] < 20, "connections left open: %s" % summary)
    cw = close_wait_count(port)
    check(cw <= CW_TRANSIENT, "%d CLOSE_WAIT after the run" % cw)
    print("streams opened and dropped: %d (+1 refused), all freed within %.2f s of a drop, "
          "peak CLOSE_WAIT %d, half-open %d, probes %d, worst probe %.3f s, read pool peak %d "
          "now %s" % (total, freed_s, peak_cw, HALF_OPEN, prober.n, prober.worst, peak_pool, pool))


def main():
    for b in ("loomd", "loom-agent", "fake_worker"):
        if not os.access(os.path.join(tc.BIN, b), os.X_OK):
            print("SKIP: %s not built" % b)
            return 77
    c = LimitCluster(nodes=1, devices=1, node_timeout=10, hang_timeout=600)
    ok = False
    try:
        run(c)
        ok = True
        print("PASS abuse_limits")
        return 0
    except tc.Fail as e:
        print("FAIL abuse_limits: %s" % e)
        return 1
    finally:
        c.close(ok)


if __name__ == "__main__":
    sys.exit(main())
