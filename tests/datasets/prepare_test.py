"""`loom-data prepare --tokenizer` on golden examples and on bad input.

  prepare_test.py LOOM_DATA

Token ids are compared with @huggingface/tokenizers (tests/datasets/prepare_ref.mjs for
jsonl and completion, tests/tok/chat_ref.mjs for chat templates), never with Loom's own
encode; shards and masks are read back here from their documented layouts. Tokenizer files
are built by tests/tok's generators (GPT-2, vocabulary 50257: version 1 shards; Llama 3,
vocabulary 128256: version 2 shards). A missing reference (node, the npm packages that
tools/setup.sh installs) fails the test with a message.
"""
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOK = os.path.join(os.path.dirname(HERE), "tok")
LOOM_DATA = os.path.abspath(sys.argv[1])
failures = 0
passed = 0


def check(cond, what):
    global failures, passed
    print(("ok: " if cond else "FAIL: ") + what)
    if cond:
        passed += 1
    else:
        failures += 1


def die(msg):
    print("FAIL:", msg)
    sys.exit(1)


def node(script, *args):
    p = subprocess.run(["node", script, *args], capture_output=True, text=True)
    if p.returncode != 0:
        die(f"node {os.path.basename(script)}: {p.stderr[-600:]}")
    return [json.loads(l) for l in p.stdout.splitlines() if l.strip()]


def prepare(out, *args):
    p = subprocess.run([LOOM_DATA, "prepare", "--out", out, "--val-fraction", "0", *args],
                       capture_output=True, text=True)
    summary = next((json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")), None)
    return p.returncode, summary, p.stderr


def read_bin(path):
    b = open(path, "rb").read()
    h = struct.unpack("<256i", b[:1024])
    assert h[0] == 20240520, f"{path}: magic {h[0]}"
    w = 2 if h[1] == 1 else 4
    n = h[2]
    assert len(b) == 1024 + n * w, f"{path}: size"
    return h[1], list(struct.unpack(f"<{n}{'H' if w == 2 else 'I'}", b[1024:]))


def read_mask(path):
    b = open(path, "rb").read()
    h = struct.unpack("<256i", b[:1024])
    assert h[0] == 20240521 and h[1] == 1 and len(b) == 1024 + h[2], f"{path}: header"
    return list(b[1024:])


def write(path, lines):
    with open(path, "w") as f:
        f.write("".join(l + "\n" for l in lines))


def expect(refs, eos, eos_mask, seq_len=0, overlong="truncate"):
    """What prepare must write for the reference examples: ids, mask and counts."""
    ids, mask = [], []
    c = dict(read=0, kept=0, empty=0, all_masked=0, truncated=0, dropped=0)
    for r in refs:
        c["read"] += 1
        i, m = list(r["ids"]), list(r["mask"])
        if not i:
            c["empty"] += 1
            continue
        if i[-1] != eos:
            m.append(m[-1] if eos_mask else 0)
            i.append(eos)
        if seq_len and len(i) > seq_len:
            if overlong == "drop":
                c["dropped"] += 1
                continue
            c["truncated"] += 1
            i, m = i[:seq_len], m[:seq_len]
        if not any(m):
            c["all_masked"] += 1
            continue
        c["kept"] += 1
        ids += i
        mask += m
    return ids, mask, c


def compare(tag, out, summary, want_ids, want_mask, counts, version, masked):
    check(summary is not None and summary["examples"] == counts,
          f"{tag}: counts {summary and summary['examples']} == {counts}")
    v, ids = read_bin(os.path.join(out, "train_000.bin"))
    check(v == version, f"{tag}: shard version {v} == {version}")
    check(ids == want_ids, f"{tag}: {len(ids)} token ids equal @huggingface/tokenizers "
          f"({len(want_ids)}) with EOS after each example")
    mpath = os.path.join(out, "train_000.mask")
    if masked:
        m = read_mask(mpath) if os.path.exists(mpath) else None
        check(m == want_mask, f"{tag}: mask ({sum(want_mask)} of {len(want_mask)} counted)")
        check(summary["train_loss_tokens"] == sum(want_mask), f"{tag}: train_loss_tokens")
    else:
        check(not os.path.exists(mpath), f"{tag}: no mask shard when the loss is on all tokens")
    meta = json.load(open(os.path.join(out, "meta.json")))
    check(len(meta.get("content_sha256", "")) == 64 and meta["vocab_size"] == summary["vocab_size"],
          f"{tag}: meta.json has the content hash and vocab size {meta['vocab_size']}")


def main():
    if not shutil.which("node"):
        die("node not found (tools/setup.sh installs nodejs)")
    if not os.path.isdir(os.path.join(TOK, "node_modules", "@huggingface")):
        die("tests/tok/node_modules missing (tools/setup.sh runs npm ci there)")
    w = tempfile.mkdtemp(prefix="prepare_test.")
    try:
        run(w)
    finally:
        shutil.rmtree(w, ignore_errors=True)
    print(f"{passed} passed, {failures} failed")
    sys.exit(1 if failures else 0)


def run(w):
    gpt2, llama3 = os.path.join(w, "gpt2.json"), os.path.join(w, "llama3.json")
    for script, args in (("make_gpt2_json.mjs", [gpt2, "string"]),
                         ("make_llama3_json.mjs", [llama3])):
        p = subprocess.run(["node", script, *args], cwd=TOK, capture_output=True, text=True)
        if p.returncode != 0:
            die(f"{script}: {p.stderr[-400:]}")
    EOS_GPT2, EOS_LLAMA3 = 50256, 128001

    # jsonl: text documents, loss on everything, a custom text key, an empty one, Unicode,
    # special-token text that must stay text
    docs = ["Hello world", "The GNU General Public License is a copyleft licence.", "",
            "naïve café — 東京 🎉 <|endoftext|> stays text", "   leading spaces\n\nand lines"]
    src = os.path.join(w, "docs.jsonl")
    write(src, [json.dumps({"body": d, "id": i}) for i, d in enumerate(docs)])
    refs = node(os.path.join(HERE, "prepare_ref.mjs"), "jsonl", gpt2, src, "body")
    ids, mask, c = expect(refs, EOS_GPT2, True)
    out = os.path.join(w, "o-jsonl")
    rc, s, err = prepare(out, "--tokenizer", gpt2, "--format", "jsonl", "--text-key", "body",
                         "--in", src)
    check(rc == 0, f"jsonl: exit {rc} {err[-300:]}")
    if rc == 0:
        compare("jsonl", out, s, ids, mask, c, 1, False)

    # overlong: drop and truncate at 6 tokens
    for mode in ("drop", "truncate"):
        ids, mask, c = expect(refs, EOS_GPT2, True, 6, mode)
        out = os.path.join(w, f"o-{mode}")
        rc, s, err = prepare(out, "--tokenizer", gpt2, "--format", "jsonl", "--text-key", "body",
                             "--seq-len", "6", "--overlong", mode, "--in", src)
        check(rc == 0 and c[{"drop": "dropped", "truncate": "truncated"}[mode]] > 0,
              f"overlong {mode}: exit {rc} {err[-300:]}")
        if rc == 0:
            compare(f"overlong {mode}", out, s, ids, mask, c, 1, False)

    # completion: loss on the completion (and its EOS) only; an empty completion leaves
    # nothing to learn (all masked), an empty pair is empty
    pairs = [("Translate to French: cheese", " fromage"), ("2 + 2 =", " 4"), ("Q: nothing?", ""),
             ("", ""), ("Say hi in Japanese:", " こんにちは")]
    src = os.path.join(w, "comp.jsonl")
    write(src, [json.dumps({"prompt": p, "completion": c}) for p, c in pairs])
    refs = node(os.path.join(HERE, "prepare_ref.mjs"), "completion", gpt2, src)
    ids, mask, c = expect(refs, EOS_GPT2, True)
    out = os.path.join(w, "o-comp")
    rc, s, err = prepare(out, "--tokenizer", gpt2, "--format", "completion", "--in", src)
    check(rc == 0 and c["all_masked"] == 1 and c["empty"] == 1,
          f"completion: exit {rc} {err[-300:]}")
    if rc == 0:
        compare("completion", out, s, ids, mask, c, 1, True)

    # chat, llama3 template, loss on the assistant: ids and mask from chat_ref.mjs; the EOS
    # that ends each conversation is not a target
    cases = os.path.join(TOK, "chat_cases.jsonl")
    refs = node(os.path.join(TOK, "chat_ref.mjs"), "llama3", llama3, cases)
    ids, mask, c = expect(refs, EOS_LLAMA3, False)
    out = os.path.join(w, "o-chat")
    rc, s, err = prepare(out, "--tokenizer", llama3, "--format", "chat", "--chat-template",
                         "llama3", "--in", cases)
    check(rc == 0, f"chat: exit {rc} {err[-300:]}")
    if rc == 0:
        compare("chat llama3", out, s, ids, mask, c, 2, True)
    # the same with the loss on every token: no mask shard, same ids
    out = os.path.join(w, "o-chat-all")
    allrefs = [{"ids": r["ids"], "mask": [1] * len(r["ids"])} for r in refs]
    ids, mask, c = expect(allrefs, EOS_LLAMA3, True)
    rc, s, err = prepare(out, "--tokenizer", llama3, "--format", "chat", "--chat-template",
                         "llama3", "--loss-on", "all", "--in", cases)
    check(rc == 0, f"chat all: exit {rc} {err[-300:]}")
    if rc == 0:
        compare("chat llama3 loss_on all", out, s, ids, mask, c, 2, False)

    # webdataset: a tar (Python's tarfile) of .txt documents and .json records (text and
    # completion), a member of another kind skipped; ids equal the reference of each member
    # read as jsonl / completion, loss on every token
    members = [("s000.txt", "A plain text member\nwith two lines and caf\u00e9."),
               ("s001.json", json.dumps({"text": "a json record \U0001f389"})),
               ("s001.cls", "7"),
               ("s002.json", json.dumps({"prompt": "Q: 3 + 4 =", "completion": " 7"}))]
    tar = os.path.join(w, "shard-000.tar")
    with tarfile.open(tar, "w") as tf:
        for name, text in members:
            data = text.encode()
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    refs = []
    for name, text in members:
        if name.endswith(".cls"):
            continue
        one = os.path.join(w, "member.jsonl")
        rec = json.loads(text) if name.endswith(".json") else {"text": text}
        write(one, [json.dumps(rec)])
        r = node(os.path.join(HERE, "prepare_ref.mjs"),
                 "completion" if "prompt" in rec else "jsonl", gpt2, one)[0]
        refs.append({"ids": r["ids"], "mask": [1] * len(r["ids"])})
    ids, mask, c = expect(refs, EOS_GPT2, True)
    out = os.path.join(w, "o-wds")
    rc, s, err = prepare(out, "--tokenizer", gpt2, "--format", "webdataset", "--threads", "2",
                         "--in", tar)
    check(rc == 0 and s and s.get("skipped_members") == 1,
          f"webdataset: exit {rc}, one member skipped {err[-300:]}")
    if rc == 0:
        compare("webdataset", out, s, ids, mask, c, 1, False)
    with open(tar, "r+b") as f:  # a truncated member is refused, naming it
        f.truncate(512 + 10)
    rc, s, err = prepare(os.path.join(w, "o-wds-bad"), "--tokenizer", gpt2, "--format",
                         "webdataset", "--in", tar)
    check(rc == 2 and "shard-000.tar" in err, f"webdataset truncated: exit {rc} {err[-200:]}")

    # the same records on 1 and 2 threads: identical shards
    src = os.path.join(w, "many.jsonl")
    write(src, [json.dumps({"text": f"record {i}: " + "word " * (i % 13)}) for i in range(3000)])
    outs = []
    for th in ("1", "2"):
        out = os.path.join(w, f"o-th{th}")
        rc, s, err = prepare(out, "--tokenizer", gpt2, "--format", "jsonl", "--threads", th,
                             "--in", src)
        outs.append(open(os.path.join(out, "train_000.bin"), "rb").read() if rc == 0 else None)
    check(outs[0] is not None and outs[0] == outs[1], "threads: 1 and 2 give identical shards")

    # validation split by example
    src = os.path.join(w, "four.jsonl")
    write(src, [json.dumps({"text": f"document number {i}"}) for i in range(4)])
    out = os.path.join(w, "o-val")
    p = subprocess.run([LOOM_DATA, "prepare", "--out", out, "--val-fraction", "0.5",
                        "--tokenizer", gpt2, "--format", "jsonl", "--in", src],
                       capture_output=True, text=True)
    s = json.loads(p.stdout) if p.returncode == 0 else {}
    check(s.get("train_examples") == 2 and s.get("val_examples") == 2 and
          os.path.exists(os.path.join(out, "val_000.bin")), f"val split 2/2: {p.stderr[-200:]}")

    # errors: exit 2, a message naming the file, the line and the field; nothing else
    bad = [("jsonl", ['{"text": "a"}', '{"text": "b"}', '{"text": "c"'], "line 3", "not a JSON"),
           ("jsonl", ['{"text": "a"}', '{"txt": "b"}'], "line 2", '"text"'),
           ("jsonl", ['{"text": 7}'], "line 1", '"text" is not a string'),
           ("completion", ['{"prompt": "a"}'], "line 1", '"completion"'),
           ("chat", ['{"messages": [{"role": "user", "content": "a"}, {"role": "assistant"}]}'],
            "line 1", "messages[1].content"),
           ("chat", ['{"msgs": []}'], "line 1", '"messages"')]
    for i, (fmt, lines, where, field) in enumerate(bad):
        src = os.path.join(w, f"bad{i}.jsonl")
        write(src, lines)
        extra = ["--chat-template", "llama3"] if fmt == "chat" else []
        rc, s, err = prepare(os.path.join(w, f"o-bad{i}"), "--tokenizer", llama3, "--format",
                             fmt, *extra, "--in", src)
        check(rc == 2 and f"bad{i}.jsonl {where}" in err and field in err,
              f"bad {fmt} {where}: exit {rc}: {err.strip()[-160:]}")
    # nothing left: every example empty, or every one all masked
    for tag, fmt, lines in (("empty", "jsonl", ['{"text": ""}', '{"text": ""}']),
                            ("all masked", "completion", ['{"prompt": "a", "completion": ""}'])):
        src = os.path.join(w, "none.jsonl")
        write(src, lines)
        rc, s, err = prepare(os.path.join(w, "o-none"), "--tokenizer", gpt2, "--format", fmt,
                             "--in", src)
        check(rc == 2 and "no training examples remain" in err, f"{tag}: refused: {err[-200:]}")
    for args, what in ((["--format", "xml"], '"xml"'), (["--format", "chat"], "--chat-template"),
                       (["--format", "jsonl", "--overlong", "cut"], '"cut"'),
                       (["--format", "jsonl", "--loss-on", "assistant"], '"assistant"')):
        rc, s, err = prepare(os.path.join(w, "o-opt"), "--tokenizer", gpt2, *args, "--in", src)
        check(rc == 2 and what in err, f"option {' '.join(args)}: refused naming {what}")


if __name__ == "__main__":
    main()
