#!/usr/bin/env python3
"""Pipeline timing split: with pp=2 on cpu, stage 1 (rank 1) sleeps 150 ms
in every step (the worker's test knob debug-slow-rank / debug-slow-ms,
counted as its compute). Stage 0 then waits about that long for stage 1's
gradients: that wait must show as its exposed communication, not as compute,
and every rank's step must be compute + comm_exposed + data_wait.

Usage: test_pp_timing.py BIN_DIR. Exit 0 pass, 1 fail."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

SLOW_MS = 150
STEPS = 6


def main():
    bin_dir = sys.argv[1]
    tmp = tempfile.mkdtemp(prefix="loom-pp-timing-")
    ok = False
    try:
        corpus = os.path.join(tmp, "c.txt")
        with open(corpus, "w") as f:
            f.write(" ".join("loom trains tiny models on cpu devices %d" % i for i in range(4000)))
        shards = os.path.join(tmp, "shards")
        r = subprocess.run([os.path.join(bin_dir, "loom-data"), "prepare", "--in", corpus, "--out",
                            shards], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            print("FAIL: loom-data prepare: %s" % r.stderr[-300:])
            return 1
        spec = {"name": "pp-timing",
                "model": {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 32,
                          "d_ff": 128, "vocab_size": 256, "seq_len": 16},
                "data": {"train": os.path.join(shards, "train_*.bin")},
                "parallel": {"dp": 1, "tp": 1, "pp": 2},
                "train": {"steps": STEPS, "global_batch_tokens": 256, "micro_batch": 4,
                          "precision": "fp32", "lr": 0.001, "warmup_steps": 1},
                "resources": {"device": "cpu"}}
        with open(os.path.join(tmp, "spec.json"), "w") as f:
            json.dump(spec, f)
        env = dict(os.environ, LOOM_DEBUG_SLOW_RANK="1", LOOM_DEBUG_SLOW_MS=str(SLOW_MS),
                   LOOM_COMM_TIMEOUT_MS="30000")
        r = subprocess.run([os.path.join(bin_dir, "loom-worker"), "--spec",
                            os.path.join(tmp, "spec.json"), "--out", os.path.join(tmp, "out"),
                            "--threads", "1", "--nproc", "2", "--rank-steps", "--log-level",
                            "warn"], capture_output=True, text=True, timeout=120, env=env)
        if r.returncode != 0:
            print("FAIL: loom-worker exited %d: %s" % (r.returncode, r.stderr[-500:]))
            return 1
        recs = {}
        # rank 0 writes the step lines; the launcher passes the other ranks' lines on
        for ln in (r.stdout + "\n" + r.stderr).splitlines():
            try:
                j = json.loads(ln)
            except ValueError:
                continue
            if j.get("type") == "step":
                recs[(0, j["step"])] = j["ms"]
            elif j.get("type") == "rank_step":
                recs[(j["rank"], j["step"])] = j["ms"]
        bad = []
        for s in range(1, STEPS + 1):
            for rank in (0, 1):
                ms = recs.get((rank, s))
                if ms is None:
                    bad.append("no timing for rank %d step %d" % (rank, s))
                    continue
                parts = ms["compute"] + ms["comm_exposed"] + ms["data_wait"]
                if abs(parts - ms["step"]) > 1e-6 * ms["step"] + 1e-9 or min(
                        ms["compute"], ms["comm_exposed"], ms["data_wait"]) < 0:
                    bad.append("rank %d step %d: parts %s do not add up to the step" % (rank, s,
                                                                                       ms))
            if s == 1:
                continue  # the first step includes start-up on both stages
            m0, m1 = recs.get((0, s)), recs.get((1, s))
            if not m0 or not m1:
                continue
            if m0["comm_exposed"] < 0.6 * SLOW_MS or m0["compute"] > m0["comm_exposed"]:
                bad.append("step %d: stage 0's wait for stage 1 (~%d ms) is not communication: %s"
                           % (s, SLOW_MS, m0))
            if m1["compute"] < 0.9 * SLOW_MS:
                bad.append("step %d: stage 1's sleep is not in its compute: %s" % (s, m1))
        for b in bad:
            print("FAIL:", b)
        if not bad:
            print("PASS: stage 0 waits %.0f ms as comm_exposed (compute %.0f ms); stage 1 computes "
                  "%.0f ms" % (recs[(0, STEPS)]["comm_exposed"], recs[(0, STEPS)]["compute"],
                               recs[(1, STEPS)]["compute"]))
        ok = not bad
        return 0 if ok else 1
    finally:
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("files kept in", tmp)


if __name__ == "__main__":
    sys.exit(main())
