#!/usr/bin/env python3
"""api/openapi.yaml against the code: every operation has a unique
operationId, and every route of daemon/routes.c is documented with each
client-error (4xx) status its handler can answer with (so at least one,
except /healthz-like routes open to anyone that answer none).

A handler's statuses are read from its source: the error codes it names
(API_ERROR(req, CODE) -> the code's status in api/errors.h;
http_error(req, STATUS, ...) literally), in its own body and in the bodies
of the functions of the same file it calls (one level: the load_job-style
helpers), plus 401 for every route that takes a token and 403 for the
admin-only and tenant-only ones. 5xx statuses (INTERNAL, STORE_UNAVAILABLE,
SHUTTING_DOWN) and the layer's 413, 415 and 429 can come from any route and
are not required. With --fix the missing statuses are added as Error references
(run once, then review the diff).
Usage: check_openapi_errors.py SOURCE_DIR [--fix]"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
fix = "--fix" in sys.argv[2:]
try:
    import yaml
except ImportError:
    print("SKIP: python3 yaml not available")
    sys.exit(77)

status_of = dict((c, int(s)) for c, s in
                 re.findall(r'X\((\w+), (\d+),', (root / "api/errors.h").read_text()))
assert len(status_of) > 50, "api/errors.h rows not read"

routes_c = (root / "daemon/routes.c").read_text()
routes = re.findall(r'\{\s*"(GET|POST|PUT|PATCH|DELETE)",\s*"([^"]+)",\s*(HTTP_AUTH_\w+),\s*'
                    r'HTTP_BODY_\w+,\s*(\w+)\s*\}', routes_c)
assert len(routes) > 40, "only %d routes read from daemon/routes.c" % len(routes)

# Every function body of the daemon's sources, by name.
bodies, file_of = {}, {}
func = re.compile(r'^[a-z][\w \*]*?\b(\w+)\(([^;{}]*)\)\s*\{', re.M)
for f in sorted((root / "daemon").glob("*.c")):
    text = f.read_text()
    for m in func.finditer(text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        bodies[m.group(1)] = text[m.end():i]
        file_of[m.group(1)] = f.name

api_error = re.compile(r'\bAPI_ERROR(?:_FIELD)?\(\s*[^,()]+,\s*([A-Z][A-Z0-9_]+)\b')
literal = re.compile(r'\bhttp_error(?:_field)?\(\s*[^,()]+,\s*(\d+),')
call = re.compile(r'\b([a-z_][a-z0-9_]*)\(')
GENERIC = {413, 415, 429}


def statuses(fn):
    body = bodies.get(fn, "")
    seen = {fn}
    texts = [body]
    for c in call.findall(body):  # helpers of the same file, one level down
        if c not in seen and file_of.get(c) == file_of.get(fn):
            seen.add(c)
            texts.append(bodies[c])
    out = set()
    for t in texts:
        out |= {status_of[c] for c in api_error.findall(t) if c in status_of}
        out |= {int(s) for s in literal.findall(t)}
    return out - GENERIC


spec_text = (root / "api/openapi.yaml").read_text()
spec = yaml.safe_load(spec_text)
bad, ids = [], {}
for path, item in spec["paths"].items():
    for m, op in item.items():
        if m not in ("get", "post", "put", "patch", "delete"):
            continue
        oid = op.get("operationId")
        if not oid:
            bad.append("%s %s: no operationId" % (m.upper(), path))
        elif oid in ids:
            bad.append("operationId %s twice (%s and %s %s)" % (oid, ids[oid], m.upper(), path))
        else:
            ids[oid] = "%s %s" % (m.upper(), path)

missing = {}
for method, pattern, auth, fn in routes:
    path = pattern.replace("*}", "}")
    op = spec["paths"].get(path, {}).get(method.lower())
    if op is None:
        bad.append("%s %s (daemon/routes.c) is not in api/openapi.yaml" % (method, path))
        continue
    want = statuses(fn)
    if fn not in bodies:
        bad.append("%s %s: handler %s not found in daemon/*.c" % (method, path, fn))
    if auth != "HTTP_AUTH_ANYONE":
        want.add(401)
    if auth in ("HTTP_AUTH_ADMIN", "HTTP_AUTH_TENANT"):
        want.add(403)
    have = {int(k) for k in op.get("responses", {}) if str(k).isdigit()}
    if not any(str(k).startswith("4") for k in op.get("responses", {})) and (
            auth != "HTTP_AUTH_ANYONE" or any(400 <= s < 500 for s in want)):
        bad.append("%s %s: no 4xx response" % (method, path))
    if "default" in op.get("responses", {}):
        continue
    lack = sorted(s for s in want if 400 <= s < 500 and s not in have)
    if lack:
        missing[(path, method.lower())] = lack
        bad.append("%s %s: the handler %s answers %s, not declared" %
                   (method, path, fn, ", ".join(map(str, lack))))

if fix and missing:
    lines = spec_text.split("\n")
    out, cur_path, cur_m, in_resp = [], None, None, False
    for ln in lines:
        mp = re.match(r'^  (/\S*):\s*$', ln)
        mm = re.match(r'^    (get|post|put|patch|delete):\s*$', ln)
        if mp:
            cur_path, cur_m = mp.group(1), None
        elif mm:
            cur_m = mm.group(1)
        out.append(ln)
        if re.match(r'^      responses:\s*$', ln) and (cur_path, cur_m) in missing:
            for s in missing.pop((cur_path, cur_m)):
                out.append('        "%d": {$ref: "#/components/responses/Error"}' % s)
    (root / "api/openapi.yaml").write_text("\n".join(out))
    print("added; check the order of the response keys by hand")

n_ops = sum(1 for it in spec["paths"].values() for m in it
            if m in ("get", "post", "put", "patch", "delete"))
print("openapi: %d operations, %d routes, %d operationIds" % (n_ops, len(routes), len(ids)))
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
