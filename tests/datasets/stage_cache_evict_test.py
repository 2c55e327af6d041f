"""The token cache's size cap: loom-stage (the agent's staging step) evicts least recently used
entries of LOOM_STAGE_DIR/tokens past LOOM_TOKEN_CACHE_MAX_GIB (loom-agent
--token-cache-max-gib), never one a running job uses.

  stage_cache_evict_test.py LOOM_STAGE

loom-stage runs as the agent runs it, with LOOM_STAGE_WORKER = a script that keeps the spec it
is given and, when asked, stays running until the test lets it go (a job still training on its
shards). Entries' ages are set by the test (the entry directory's mtime is its last use). Five
distinct jsonl inputs (byte-level tokenizer, tests/datasets/bytetok.py) give entries A..E of
about one size S; the cap is given in bytes through the GiB variable. Asserts, in order:
  - A, then B held by a running worker, then C with the cap at 2.5 S: A (oldest, unused) is
    evicted, B (older than C but in use) and C remain; the result line says 1 evicted and the
    remaining bytes;
  - D with the cap at 1.5 S while B runs: C goes, B stays though the cache is then over the cap;
  - B's worker exits; A again with the cap at 1.5 S: A is tokenized anew (no cache hit), B and D
    (now unused, oldest first) are evicted, only A remains;
  - E with the cap 0 (no cap): nothing is evicted; without the variable (default 50 GiB)
    nothing is either;
  - the data read through the remaining entries is still the records' bytes + EOS.
"""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bytetok import encode as enc  # noqa: E402
from bytetok import write_tokenizer  # noqa: E402

STAGE = os.path.abspath(sys.argv[1])
failures = 0


def check(cond, what):
    global failures
    print(("ok: " if cond else "FAIL: ") + what, file=sys.stderr)
    if not cond:
        failures += 1


def tokens(pattern):
    out = []
    for p in sorted(glob.glob(pattern)):
        with open(p, "rb") as f:
            h = struct.unpack("<256i", f.read(1024))
            out += list(struct.unpack(f"<{h[2]}H", f.read(2 * h[2])))
    return out


def entry_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
               if not f.startswith(".") and os.path.isfile(os.path.join(d, f)))


class Stage:
    def __init__(self, tmp):
        self.tmp = tmp
        self.cache = os.path.join(tmp, "cache")
        self.worker = os.path.join(tmp, "worker.sh")
        with open(self.worker, "w") as f:
            f.write("#!/bin/sh\n# the worker stand-in: keep the spec; with HOLD, run until "
                    "RELEASE exists\n"
                    "while [ $# -gt 0 ]; do [ \"$1\" = --spec ] && cp \"$2\" \"$SAVE_SPEC\"; "
                    "shift; done\n"
                    "if [ -n \"$HOLD\" ]; then touch \"$HOLD\"; i=0; "
                    "while [ ! -e \"$RELEASE\" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); "
                    "done; fi\nexit 0\n")
        os.chmod(self.worker, 0o755)
        self.n = 0

    def start(self, spec, cap_bytes, hold=False):
        self.n += 1
        d = os.path.join(self.tmp, f"task{self.n}")
        os.makedirs(d)
        sp = os.path.join(d, "spec.json")
        with open(sp, "w") as f:
            json.dump(spec, f)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
        env.update(LOOM_STAGE_WORKER=self.worker, SAVE_SPEC=os.path.join(d, "seen.json"),
                   LOOM_JOB=f"job{self.n}", LOOM_LOCAL_RANK="0", LOOM_STAGE_DIR=self.cache)
        if cap_bytes is not None:
            env["LOOM_TOKEN_CACHE_MAX_GIB"] = repr(cap_bytes / 2 ** 30)
        if hold:
            env.update(HOLD=os.path.join(d, "running"), RELEASE=os.path.join(d, "release"))
        p = subprocess.Popen([STAGE, "--spec", sp, "--device", "cpu", "--out", d], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=d)
        return p, d

    def run(self, spec, cap_bytes):
        p, d = self.start(spec, cap_bytes)
        out, err = p.communicate(timeout=120)
        return p.returncode, result_line(out), seen_key(d), err


def result_line(out):
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    done = [l for l in lines if l.get("phase") == "tokenized"]
    return done[0] if done else {}


def seen_key(d):
    p = os.path.join(d, "seen.json")
    if not os.path.exists(p):
        return None
    return json.load(open(p))["data"]["train"].split("/")[-2]


def main():
    tmp = tempfile.mkdtemp(prefix="stage_evict.")
    tok = os.path.join(tmp, "tok")
    os.makedirs(tok)
    write_tokenizer(os.path.join(tok, "tokenizer.json"))
    st = Stage(tmp)
    specs, texts = {}, {}
    for name in "ABCDE":
        texts[name] = [f"{name} record {i} " + "x" * 40 for i in range(100)]
        src = os.path.join(tmp, "raw", f"{name}.jsonl")
        os.makedirs(os.path.dirname(src), exist_ok=True)
        with open(src, "w") as f:
            for t in texts[name]:
                f.write(json.dumps({"text": t}) + "\n")
        specs[name] = {"name": "t", "model": {"init_from": tok, "seq_len": 64},
                       "data": {"train": src, "format": "jsonl"},
                       "train": {"steps": 1, "global_batch_tokens": 64}}
    tdir = os.path.join(st.cache, "tokens")
    keys = {}

    def present():
        return {n for n, k in keys.items() if os.path.isdir(os.path.join(tdir, k))}

    def held():
        return sum(entry_bytes(os.path.join(tdir, keys[n])) for n in present())

    def age(name, seconds_ago):
        t = time.time() - seconds_ago
        os.utime(os.path.join(tdir, keys[name]), (t, t))

    rc, line, keys["A"], err = st.run(specs["A"], None)
    check(rc == 0 and keys["A"], f"A staged (exit {rc}) {err[-300:]}")
    S = entry_bytes(os.path.join(tdir, keys["A"]))
    check(S > 1024 * 5, f"an entry holds {S} bytes")
    age("A", 400)
    hold, hd = st.start(specs["B"], None, hold=True)
    for _ in range(300):
        if os.path.exists(os.path.join(hd, "running")) or hold.poll() is not None:
            break
        time.sleep(0.1)
    keys["B"] = seen_key(hd)
    check(os.path.exists(os.path.join(hd, "running")) and keys["B"], "B's worker is running")
    age("B", 300)
    rc, line, keys["C"], err = st.run(specs["C"], 2.5 * S)
    check(rc == 0 and keys["C"], f"C staged (exit {rc}) {err[-300:]}")
    check(present() == {"B", "C"}, f"cap 2.5 S: A evicted, B (in use) and C kept: {present()}")
    check(line.get("token_cache_evicted") == 1 and line.get("token_cache_bytes") == held(),
          f"C's result line: evicted {line.get('token_cache_evicted')}, "
          f"{line.get('token_cache_bytes')} bytes ({held()} remain)")
    age("C", 200)
    rc, line, keys["D"], err = st.run(specs["D"], 1.5 * S)
    check(rc == 0 and present() == {"B", "D"},
          f"cap 1.5 S while B runs: C evicted, B kept over the cap: {present()}")
    check(line.get("token_cache_evicted") == 1 and line.get("token_cache_bytes") == held() and
          held() > 1.5 * S, f"D's result line: evicted {line.get('token_cache_evicted')}, "
          f"{line.get('token_cache_bytes')} bytes, over the cap")
    age("D", 100)
    open(os.path.join(hd, "release"), "w").close()
    hold.communicate(timeout=60)
    check(hold.returncode == 0, f"B's worker exited ({hold.returncode})")
    rc, line, ka, err = st.run(specs["A"], 1.5 * S)
    check(rc == 0 and ka == keys["A"] and line.get("cache_hits") == 0,
          f"A again: same key, tokenized anew (cache_hits {line.get('cache_hits')})")
    check(present() == {"A"} and line.get("token_cache_evicted") == 2,
          f"cap 1.5 S after B ended: B and D evicted, A alone: {present()}")
    check(tokens(os.path.join(tdir, keys["A"], "train_*.bin")) ==
          sum((enc(t) for t in texts["A"]), []), "A's shards hold its records' bytes + EOS")
    rc, line, keys["E"], err = st.run(specs["E"], 0)
    check(rc == 0 and present() == {"A", "E"} and line.get("token_cache_evicted") == 0,
          f"cap 0 (none): nothing evicted: {present()}")
    rc, line, kb, err = st.run(specs["B"], None)
    keys["B"] = kb
    check(rc == 0 and present() == {"A", "B", "E"} and line.get("token_cache_evicted") == 0,
          f"default cap (50 GiB): nothing evicted: {present()}")
    shutil.rmtree(tmp)
    print(f"{'FAIL' if failures else 'PASS'}: token cache eviction, {failures} failure(s)",
          file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
