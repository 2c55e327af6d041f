#!/bin/sh
# api/openapi.yaml must be valid YAML with an OpenAPI 3 header and paths
# (needs python3 with PyYAML; says SKIP and exits 77 where it is missing).
python3 -c 'import yaml' 2>/dev/null || { echo "SKIP: python3 yaml not available"; exit 77; }
exec python3 - "$1" <<'PY'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
assert str(d["openapi"]).startswith("3."), "not OpenAPI 3"
n = sum(1 for p in d["paths"].values() for m in p if m in ("get", "post", "put", "delete", "patch"))
assert n > 0
for path, item in d["paths"].items():
    for m, op in item.items():
        assert "responses" in op, f"{m} {path} has no responses"
print(f"openapi.yaml: valid, {len(d['paths'])} paths, {n} operations")
PY
