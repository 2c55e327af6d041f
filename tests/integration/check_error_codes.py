#!/usr/bin/env python3
"""Every error code the sources answer with is a row of api/errors.h, used
with that row's HTTP status; no row is left unused; the codes that were
renamed (docs/internals/api.md "Renamed error codes") appear nowhere.
Usage: check_error_codes.py SOURCE_DIR"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
rows = dict((c, int(s)) for c, s in
            re.findall(r'X\((\w+), (\d+),', (root / "api/errors.h").read_text()))
assert len(rows) > 50, f"only {len(rows)} rows read from api/errors.h"

literal = re.compile(r'\b(?:http_error_field|http_error|loom_error_set)\(\s*[^,()]+,\s*(\d+),\s*"([A-Z][A-Z0-9_]+)"')
token = re.compile(r'\b(?:API_ERROR_FIELD|API_ERROR)\(\s*[^,()]+,\s*([A-Z][A-Z0-9_]+)\b|\bLOOM_E_([A-Z][A-Z0-9_]+)\b')
renamed = ["BAD_NODE_NAME", "BAD_DEVICE_KIND", "BAD_DEVICES", "BAD_METRICS", "BAD_LOG_CHUNK",
           "BAD_STREAM", "BAD_RANK", "BAD_RDZV_VALUE", "BAD_TIME", "BAD_GROUP_BY", "UNKNOWN_NODE"]
bad, used, uses = [], set(), 0
for d in ("daemon", "api", "agent"):
    for f in sorted((root / d).rglob("*.[ch]")):
        if f.name == "errors.h":
            continue
        text = f.read_text()
        for st, code in literal.findall(text):
            uses += 1
            used.add(code)
            if code not in rows:
                bad.append(f"{f.relative_to(root)}: {code} is not in api/errors.h")
            elif rows[code] != int(st):
                bad.append(f"{f.relative_to(root)}: {code} answered with {st}, its row says {rows[code]}")
        for a, b in token.findall(text):
            code = a or b
            if code == "COUNT":
                continue
            uses += 1
            used.add(code)
            if code not in rows:
                bad.append(f"{f.relative_to(root)}: {code} is not in api/errors.h")
        for old in renamed:
            if f'"{old}"' in text:
                bad.append(f"{f.relative_to(root)}: the renamed code {old} is still used")
for t in ("tests", "docs", "deploy"):
    for f in (root / t).rglob("*"):
        if f.is_file() and f.suffix in (".c", ".h", ".sh", ".py", ".md", ".js", ".yaml"):
            text = f.read_text(errors="replace")
            for old in renamed:
                if re.search(rf'(?<![A-Z_]){old}(?![A-Z_])', text) and f.name != "api.md" \
                        and f.name != "check_error_codes.py":
                    bad.append(f"{f.relative_to(root)}: the renamed code {old} is still used")
# the planner's codes and the routes' codes are all answered somewhere
unused = sorted(set(rows) - used)
if unused:
    bad.append("rows no source answers with: " + ", ".join(unused))
if uses < 150:
    bad.append(f"only {uses} error sites found: the patterns no longer match the sources")
for b in bad:
    print("FAIL:", b)
print(f"error codes: {len(rows)} rows, {uses} sites, {len(used)} codes used")
sys.exit(1 if bad else 0)
