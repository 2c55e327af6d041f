"""Tokenizing inside a job: loom-stage (the agent's staging step) turns a spec's raw data
(jsonl, completion, webdataset) into token shards in the node cache before the worker starts.

  stage_tokenize_test.py LOOM_STAGE

loom-stage runs as the agent runs it (worker command line, LOOM_* environment) with
LOOM_STAGE_WORKER = a script that saves the spec it is given, so the test sees what the worker
would read. The tokenizer is a byte-level tokenizer.json (tests/datasets/bytetok.py: GPT-2's
byte-to-unicode table, no merges: token id = byte value, <|endoftext|> = 256), so the expected
ids of any text are its UTF-8 bytes then 256, computed without Loom. Asserts:
  - the staged spec points data.train at DIR/tokens/KEY/train_*.bin whose tokens (read with
    struct from the documented shard layout) are the records' bytes + EOS, in order;
  - progress lines (phase tokenizing, 0 to 1) and a result line (phase tokenized);
  - a second job on the same data and tokenizer finds the cache (cache_hits 1, same KEY, no
    new directory); a changed input file gets a new KEY;
  - completion records get a .mask (prompt 0, completion and EOS 1);
  - data.val_fraction splits by example into val_*.bin and is set to 0 in the staged spec;
  - webdataset tars made by Python's tarfile: .txt members are documents, .json members records,
    other members skipped; a tar.gz works too;
  - 1 and 2 encoding threads give byte-identical shards;
  - a bad record fails the job: exit 2, the worker is not started, the error line names the
    file, the line and the field; without LOOM_STAGE_DIR the job fails naming it.
"""
import glob
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile

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


def read_shard(path, magic=20240520):
    with open(path, "rb") as f:
        h = struct.unpack("<256i", f.read(1024))
        assert h[0] == magic, path
        n = h[2]
        if magic == 20240521:
            return list(f.read(n))
        width = 2 if h[1] == 1 else 4
        return list(struct.unpack(f"<{n}{'H' if width == 2 else 'I'}", f.read(n * width)))


def shards(pattern, magic=20240520):
    out = []
    for p in sorted(glob.glob(pattern)):
        out += read_shard(p, magic)
    return out


class Stage:
    def __init__(self, tmp):
        self.tmp = tmp
        self.cache = os.path.join(tmp, "cache")
        self.worker = os.path.join(tmp, "worker.sh")
        with open(self.worker, "w") as f:
            f.write("#!/bin/sh\n# the worker stand-in: keep the spec it was given\n"
                    "while [ $# -gt 0 ]; do [ \"$1\" = --spec ] && cp \"$2\" \"$SAVE_SPEC\"; "
                    "shift; done\nexit 0\n")
        os.chmod(self.worker, 0o755)
        self.n = 0

    def run(self, spec, threads=2, stage_dir=True):
        self.n += 1
        d = os.path.join(self.tmp, f"task{self.n}")
        os.makedirs(d)
        sp = os.path.join(d, "spec.json")
        with open(sp, "w") as f:
            json.dump(spec, f)
        saved = os.path.join(d, "seen.json")
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOM_")}
        env.update(LOOM_STAGE_WORKER=self.worker, SAVE_SPEC=saved, LOOM_JOB=f"job{self.n}",
                   LOOM_LOCAL_RANK="0", LOOM_STAGE_THREADS=str(threads))
        if stage_dir:
            env["LOOM_STAGE_DIR"] = self.cache
        p = subprocess.run([STAGE, "--spec", sp, "--device", "cpu", "--out", d], env=env,
                           capture_output=True, text=True, timeout=120, cwd=d)
        lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        seen = json.load(open(saved)) if os.path.exists(saved) else None
        return p.returncode, lines, seen, p.stderr


def main():
    tmp = tempfile.mkdtemp(prefix="stage_tok.")
    tok = os.path.join(tmp, "tok")
    os.makedirs(tok)
    write_tokenizer(os.path.join(tok, "tokenizer.json"))
    st = Stage(tmp)
    texts = ["hello world", "caf\u00e9 \u2615 na\u00efve", "line with  two spaces", "x"]
    src = os.path.join(tmp, "raw", "a.jsonl")
    os.makedirs(os.path.dirname(src))
    with open(src, "w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"text": t}) + "\n")
            if i == 1:
                f.write("\n")  # blank lines are skipped
    base = {"name": "t", "model": {"init_from": tok, "seq_len": 64},
            "data": {"train": src, "format": "jsonl"},
            "train": {"steps": 1, "global_batch_tokens": 64}}

    rc, lines, seen, err = st.run(base)
    check(rc == 0 and seen is not None, f"jsonl: worker started (exit {rc}) {err[-300:]}")
    key = None
    if seen:
        pat = seen["data"]["train"]
        key = pat.split("/")[-2]
        check(pat == os.path.join(st.cache, "tokens", key, "train_*.bin"),
              f"jsonl: data.train points into the cache: {pat}")
        want = sum((enc(t) for t in texts), [])
        got = shards(pat)
        check(got == want, f"jsonl: {len(got)} tokens are the records' bytes + EOS ({len(want)})")
        check(not glob.glob(pat.replace(".bin", ".mask")), "jsonl: no mask for loss on all")
        check(seen["data"]["format"] == "jsonl", "jsonl: data.format kept")
    prog = [l for l in lines if l.get("phase") == "tokenizing"]
    done = [l for l in lines if l.get("phase") == "tokenized"]
    check(len(prog) >= 2 and prog[0]["progress"] == 0 and prog[-1]["progress"] == 1,
          f"jsonl: progress lines 0 .. 1: {[l['progress'] for l in prog]}")
    check(len(done) == 1 and done[0]["cache_hits"] == 0 and done[0]["examples"] == 4 and
          done[0]["train_tokens"] == sum(len(enc(t)) for t in texts),
          f"jsonl: result line {done}")

    rc, lines, seen2, err = st.run(base, threads=1)
    done = [l for l in lines if l.get("phase") == "tokenized"]
    check(rc == 0 and done and done[0]["cache_hits"] == 1 and done[0]["key"] == key,
          f"second job: found in the cache ({done})")
    check(seen2 and seen and seen2["data"]["train"] == seen["data"]["train"],
          "second job: the same shards")
    check(len(os.listdir(os.path.join(st.cache, "tokens"))) == 1, "second job: no new directory")
    with open(src, "a") as f:
        f.write(json.dumps({"text": "one more"}) + "\n")
    rc, lines, seen3, err = st.run(base)
    done = [l for l in lines if l.get("phase") == "tokenized"]
    check(rc == 0 and done and done[0]["cache_hits"] == 0 and done[0]["key"] != key and
          done[0]["examples"] == 5, f"changed input: tokenized again under a new key ({done})")

    # completion: prompt masked, completion and EOS counted
    comp = os.path.join(tmp, "raw", "c.jsonl")
    pairs = [("Q: 2+2?", " 4"), ("say hi", " hi there")]
    with open(comp, "w") as f:
        for p, c in pairs:
            f.write(json.dumps({"prompt": p, "completion": c}) + "\n")
    spec = json.loads(json.dumps(base))
    spec["data"] = {"train": comp, "format": "completion"}
    spec["train"]["loss_on"] = "completion"
    rc, lines, seen, err = st.run(spec)
    check(rc == 0 and seen, f"completion: exit {rc} {err[-300:]}")
    if seen:
        pat = seen["data"]["train"]
        want = sum((list(p.encode()) + list(c.encode()) + [256] for p, c in pairs), [])
        wmask = sum(([0] * len(p.encode()) + [1] * (len(c.encode()) + 1) for p, c in pairs), [])
        check(shards(pat) == want, "completion: tokens")
        check(shards(pat.replace(".bin", ".mask"), 20240521) == wmask,
              "completion: mask 0 on the prompt, 1 on the completion and EOS")

    # val_fraction: split by example, data.val set, val_fraction 0
    many = os.path.join(tmp, "raw", "many.jsonl")
    docs = [f"document {i}" for i in range(10)]
    with open(many, "w") as f:
        for t in docs:
            f.write(json.dumps({"text": t}) + "\n")
    spec = json.loads(json.dumps(base))
    spec["data"] = {"train": many, "format": "jsonl", "val_fraction": 0.2}
    rc, lines, seen, err = st.run(spec)
    check(rc == 0 and seen, f"val_fraction: exit {rc} {err[-300:]}")
    if seen:
        val = [d for i, d in enumerate(docs) if int((i + 1) * 0.2) > int(i * 0.2)]
        trn = [d for d in docs if d not in val]
        check(seen["data"].get("val", "").endswith("/val_*.bin") and
              seen["data"].get("val_fraction") == 0, f"val_fraction: data {seen['data']}")
        check(shards(seen["data"]["train"]) == sum((enc(t) for t in trn), []) and
              shards(seen["data"]["val"]) == sum((enc(t) for t in val), []),
              f"val_fraction: val holds {val}")

    # webdataset: tars by Python's tarfile
    wds = os.path.join(tmp, "wds")
    os.makedirs(wds)
    members = [("000.txt", b"a text document\nwith two lines"),
               ("001.json", json.dumps({"text": "a json record"}).encode()),
               ("001.jpg", b"\xff\xd8 not text"),
               ("002.json", json.dumps({"prompt": "p?", "completion": " c"}).encode())]
    for name, mode in (("shard-000.tar", "w"), ("shard-001.tar.gz", "w:gz")):
        with tarfile.open(os.path.join(wds, name), mode) as tf:
            for mname, data in members:
                ti = tarfile.TarInfo(mname)
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    spec = json.loads(json.dumps(base))
    spec["data"] = {"train": wds + "/shard-*", "format": "webdataset"}
    results = []
    for threads in (1, 2):
        rc, lines, seen, err = st.run(spec, threads=threads)
        check(rc == 0 and seen, f"webdataset threads={threads}: exit {rc} {err[-300:]}")
        if seen:
            results.append(shards(seen["data"]["train"]))
        shutil.rmtree(os.path.join(st.cache, "tokens"))  # tokenize again with the other count
    one = list(b"a text document\nwith two lines") + [256] + enc("a json record") + \
        list(b"p?") + list(b" c") + [256]
    check(len(results) == 2 and results[0] == one * 2, "webdataset: .txt and .json members of "
          "both tars in order, the .jpg skipped")
    check(len(results) == 2 and results[0] == results[1], "webdataset: 1 and 2 threads agree")

    # bad data fails the job before the worker starts
    bad = os.path.join(tmp, "raw", "bad.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps({"text": "fine"}) + "\n" + json.dumps({"txt": "oops"}) + "\n")
    spec = json.loads(json.dumps(base))
    spec["data"] = {"train": bad, "format": "jsonl"}
    rc, lines, seen, err = st.run(spec)
    errs = [l for l in lines if l.get("type") == "error"]
    check(rc == 2 and seen is None and errs and "bad.jsonl line 2" in errs[0]["message"] and
          '"text"' in errs[0]["message"] and errs[0]["code"] == "DATA_INVALID",
          f"bad record: exit {rc}, {errs}")
    spec["data"] = {"train": src, "format": "chat", "chat_template": "klingon"}
    rc, lines, seen, err = st.run(spec)
    errs = [l for l in lines if l.get("type") == "error"]
    check(rc == 2 and seen is None and errs and "klingon" in errs[0]["message"],
          f"unknown template: exit {rc}, {errs}")
    rc, lines, seen, err = st.run(base, stage_dir=False)
    errs = [l for l in lines if l.get("type") == "error"]
    check(rc != 0 and seen is None and errs and "LOOM_STAGE_DIR" in errs[0]["message"],
          f"no LOOM_STAGE_DIR: exit {rc}, {errs}")
    # shards are passed through untouched
    spec = json.loads(json.dumps(base))
    spec["data"] = {"train": os.path.join(tmp, "nowhere", "*.bin")}
    rc, lines, seen, err = st.run(spec, stage_dir=False)
    check(rc == 0 and seen and seen["data"]["train"] == spec["data"]["train"],
          "bin data: spec passed unchanged")

    shutil.rmtree(tmp)
    print(f"{'FAIL' if failures else 'PASS'}: {failures} failure(s)", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
