"""Helpers the python integration tests share (test_fleet.py, test_cluster.py,
test_rdzv_scopes.py, ops_nodecheck.py, ops_dashboard_metrics.py,
ops_staging.py): HTTP calls to loomd, waiting for a condition, a free port and
the environment the daemons start with. Each test keeps its own assertions;
this module asserts nothing. Python's standard library only (urllib), so the
tests run on a bare Debian python3."""
import json
import os
import socket
import time
import urllib.error
import urllib.request


class Fail(Exception):
    pass


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def daemon_env(**extra):
    """os.environ plus extra, without the client settings (LOOM_URL,
    LOOM_TOKEN, LOOM_CONFIG) that would point a daemon or loomctl elsewhere."""
    env = dict(os.environ, **extra)
    for k in ("LOOM_URL", "LOOM_TOKEN", "LOOM_CONFIG"):
        env.pop(k, None)
    return env


def http(url, method="GET", body=None, token=None, raw=None, timeout=30, by_type=False,
         error_json=True, offline=False):
    """One HTTP call; returns (status, reply). body is sent as JSON, raw as
    bytes. The reply is parsed JSON (null for an empty body); with by_type a
    successful reply is parsed only when its Content-Type says JSON, else it is
    the text. An error reply is its JSON, or its text where it is not JSON (or
    always its text without error_json). offline: a loomd that cannot be
    reached gives (0, None) instead of raising."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read()
            if by_type and "json" not in (r.headers.get("Content-Type") or ""):
                return r.status, text.decode()
            return r.status, json.loads(text or b"null")
    except urllib.error.HTTPError as e:
        text = e.read()
        if not error_json:
            return e.code, text.decode()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text.decode()
    except (urllib.error.URLError, ConnectionError, socket.timeout):
        if offline:
            return 0, None
        raise


def wait_for(fn, secs, what, errors=(OSError,), step=0.1, exc=Fail, last=False):
    """Polls fn until it returns something true and returns that; the errors
    listed count as not yet. Raises exc naming what after secs (with the last
    error caught where last is set)."""
    end = time.time() + secs
    err = None
    while time.time() < end:
        try:
            v = fn()
            if v:
                return v
        except errors as e:
            err = e
        time.sleep(step)
    raise exc("timed out waiting for %s (%s)" % (what, err) if last else
              "timed out waiting for " + what)
