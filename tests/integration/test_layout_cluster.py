#!/usr/bin/env python3
"""A parallel layout through the whole system: a real loomd and two agents
(2 cpu devices each) on loopback run a 4-rank or 2-rank job of the real
loom-worker (GPT-2 with tied embeddings, Gloo). The ranks meet through loomd's
HTTP rendezvous and the env contract (LOOM_RANK, LOOM_WORLD, LOOM_RDZV, ...);
the job must succeed and its loss curve (GET /v1/jobs/{id}/metrics) must
match a standalone single-process run with the same global batch within 1e-5
relative.

Reuses the cluster harness of tests/integration/test_cluster.py unchanged.
Usage: test_layout_cluster.py BIN_DIR LAYOUT, LAYOUT like "dp=2,zero_stage=3"
or "tp=2,pp=2". Exit 0 pass, 1 fail, 77 skip."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BIN_DIR = os.path.abspath(sys.argv[1])
LAYOUT = dict((k, int(v)) for k, v in (kv.split("=") for kv in sys.argv[2].split(",")))
sys.argv = [sys.argv[0], BIN_DIR, "real_worker"]  # the harness reads its argv at import
sys.path.insert(0, HERE)
import test_cluster as tc  # noqa: E402

STEPS = 6


def spec_for(shards, layout):
    parallel = {"dp": 1, "tp": 1, "pp": 1, "zero_stage": 0}
    parallel.update(layout)
    return {
        "name": "layout-cluster",
        "model": {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 32, "d_ff": 64,
                  "vocab_size": 256, "seq_len": 16},
        "data": {"train": os.path.join(shards, "train_*.bin")},
        "parallel": parallel,
        "train": {"steps": STEPS, "global_batch_tokens": 128, "micro_batch": 4,
                  "precision": "fp32", "lr": 0.003, "warmup_steps": 1, "seed": 11},
        "checkpoint": {"every_steps": 3, "keep": 2},
        "resources": {"device": "cpu", "gpus_per_node": 2},
    }


def scenario(c):
    shards = os.path.join(c.tmp, "shards")
    corpus = os.path.join(c.tmp, "corpus.txt")
    with open(corpus, "w") as f:
        f.write(" ".join("ranks meet at the rendezvous and reduce %d" % i for i in range(4000)))
    r = subprocess.run([os.path.join(BIN_DIR, "loom-data"), "prepare", "--in", corpus, "--out",
                        shards], capture_output=True, timeout=60)
    tc.check(r.returncode == 0, "loom-data prepare: %s" % r.stderr.decode()[-300:])

    # reference: one process, same global batch (micro-batches accumulated)
    ref_spec = os.path.join(c.tmp, "ref.json")
    with open(ref_spec, "w") as f:
        json.dump(spec_for(shards, {}), f)
    r = subprocess.run([os.path.join(BIN_DIR, "loom-worker"), "--spec", ref_spec, "--out",
                        os.path.join(c.tmp, "ref-out"), "--threads", "1"],
                       capture_output=True, timeout=120)
    tc.check(r.returncode == 0, "reference run: %s" % r.stderr.decode()[-300:])
    ref = {}
    for line in r.stdout.decode().splitlines():
        j = json.loads(line)
        if j.get("type") == "step":
            ref[j["step"]] = j["loss"]
    tc.check(sorted(ref) == list(range(1, STEPS + 1)), "reference steps: %s" % sorted(ref))

    st, j = c.request("POST", "/v1/jobs", spec_for(shards, LAYOUT))
    tc.check(st == 201, "submit: %s %s" % (st, j))
    jid = j["id"]
    j = c.wait_state(jid, ("succeeded", "failed"), 180)
    tc.check(j["state"] == "succeeded", "%s job: %s" % (LAYOUT, tc.event_reasons(c, jid)))
    st, m = c.get("/v1/jobs/%s/metrics" % jid)
    tc.check(st == 200, "metrics: %s" % st)
    got = {p["step"]: p["loss"] for p in m["series"]}
    tc.check(sorted(got) == list(range(1, STEPS + 1)), "steps recorded: %s" % sorted(got))
    worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)
    print("%s via loomd and agents: loss rel diff max %.2e over %d steps" % (LAYOUT, worst, STEPS))
    tc.check(worst <= 1e-5, "loss differs from the single-process run by %.3g" % worst)


def main():
    for b in ("loomd", "loom-agent", "loom-worker", "loom-data"):
        if not os.access(os.path.join(BIN_DIR, b), os.X_OK):
            print("SKIP: %s not built" % b)
            return 77
    c = tc.Cluster(worker=os.path.join(BIN_DIR, "loom-worker"))
    ok = False
    try:
        scenario(c)
        ok = True
        print("PASS layout_cluster", LAYOUT)
        return 0
    except tc.Fail as e:
        print("FAIL layout_cluster %s: %s" % (LAYOUT, e))
        return 1
    finally:
        c.close(ok)


if __name__ == "__main__":
    sys.exit(main())
