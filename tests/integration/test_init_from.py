#!/usr/bin/env python3
"""model.init_from resolved by loomd at submit (daemon/initfrom.c), through the
whole system: a real loomd and loom-agent on loopback running the real
loom-worker on the cpu backend.

  hf    a tiny random Llama in the exact HF layout (tests/hf/make_tiny_hf.py)
        submitted with model {"init_from": DIR} alone: the stored spec has the
        config's family and sizes, the job runs, and its first loss equals the
        independent torch forward (tests/hf/ref_forward.py) on the same batch.
        Sizes that disagree with config.json (INIT_FROM_MISMATCH), an
        unsupported architecture, a missing directory or config.json and a
        directory outside the tenant's data roots are refused with their codes
        and store nothing.
  fork  a finished job forked with job:<id> (its newest checkpoint) under
        another layout and with job:<id>@<step>: the fork starts at step 0
        from the parent's weights (its first loss equals the torch forward of
        the parent's exported model, and the parent's own loss at the step
        after the one named); stated sizes that differ from the parent's, a
        step that was not saved, and another tenant's job are refused.
  peft  a train.lora job's exported PEFT adapter directory as model.init_from
        of a new train.lora job under tp=2: loomd resolves the base model from
        the adapter's base_model_name_or_path (the stored spec has the base's
        family and sizes), the job continues the adapter (its first loss equals
        the torch forward of the first job's merged export) and exports its
        own; an adapter of another rank, a spec without train.lora, a base that
        is a hub name, missing or outside the tenant's roots are refused with
        their codes and store nothing.

Every batch is the same (the train shard repeats one token), so a loss is a
function of the weights alone and the reference sees the very batch the job
trained on. Usage: test_init_from.py BIN_DIR SCENARIO. Exit 0 pass, 1 fail,
77 skip (run by a python3 with numpy and torch: tests/init_from.cmake)."""
import json
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BIN_DIR = os.path.abspath(sys.argv[1])
SCENARIO = sys.argv[2]
sys.argv = [sys.argv[0], BIN_DIR, "real_worker"]  # the cluster harness reads its argv at import
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "hf"))
import make_tiny_hf  # noqa: E402
import test_cluster as tc  # noqa: E402
from test_cluster import ADMIN, check  # noqa: E402

TOKEN = 7   # the one token of the train shard
SEQ = 32    # model.seq_len of every job here
LOSS_TOL = 1e-4  # fp32 cpu against the float64 reference (tests/hf measures ~1e-5)


def write_shard(path, n):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *([TOKEN] * n)))


def ref_loss(model_dir):
    """Mean cross-entropy of the constant batch under the torch reference."""
    toks = ",".join([str(TOKEN)] * (SEQ + 1))
    r = subprocess.run([sys.executable, os.path.join(HERE, "..", "hf", "ref_forward.py"),
                        model_dir, toks, "0"], capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, "ref_forward: %s" % r.stderr[-400:])
    lp = json.loads(r.stdout)["logprobs"][1:]
    return -sum(lp) / len(lp)


def spec(c, model, steps=2, dp=1, every=1, export=False, name="ft"):
    s = {"name": name, "model": model,
         "data": {"train": os.path.join(c.tmp, "tok", "train_*.bin")},
         "parallel": {"dp": dp, "tp": 1, "pp": 1},
         "train": {"steps": steps, "global_batch_tokens": 2 * SEQ, "micro_batch": 1,
                   "lr": 0.002, "warmup_steps": 0, "seed": 5, "eval_every": 0},
         "checkpoint": {"every_steps": every, "keep": 5},
         "resources": {"device": "cpu", "gpus_per_node": 2},
         "max_retries": 0}
    if export:
        s["export"] = {"hf": True}
    return s


def submit(c, body, token="tenant"):
    return c.request("POST", "/v1/jobs", body, token=token)


def losses(c, jid):
    st, m = c.get("/v1/jobs/%s/metrics" % jid)
    check(st == 200, "metrics of %s: %s %s" % (jid, st, m))
    return {p["step"]: p["loss"] for p in m["series"]}


def run_ok(c, body, what):
    st, j = submit(c, body)
    check(st == 201, "%s: submit %s %s" % (what, st, j))
    j = c.wait_state(j["id"], ("succeeded", "failed"), 240)
    check(j["state"] == "succeeded", "%s: %s" % (what, tc.event_reasons(c, j["id"])))
    return j


def count_jobs(c, token="tenant"):
    st, r = c.get("/v1/jobs?limit=1000", token=token)
    check(st == 200, "list: %s" % st)
    return len(r["items"])


def refused(c, body, status, code, names=(), token="tenant", what=""):
    """The submit is refused with status/code, its message naming each of
    names; nothing is stored."""
    before = count_jobs(c, token)
    st, r = submit(c, body, token)
    err = r.get("error", {}) if isinstance(r, dict) else {}
    check(st == status and err.get("code") == code,
          "%s: want %d %s, got %s %s" % (what, status, code, st, r))
    for n in names:
        check(n in err.get("message", ""), "%s: message lacks %r: %s" % (what, n, err))
    check(count_jobs(c, token) == before, "%s: a job was stored" % what)
    print("refused %-28s %d %s: %s" % (what, st, code, err.get("message", "")[:150]))
    return err


def make_models(c):
    models = os.path.join(c.tmp, "models")
    make_tiny_hf.make_good(models)
    os.makedirs(os.path.join(c.tmp, "tok"))
    write_shard(os.path.join(c.tmp, "tok", "train_000.bin"), 50000)
    return models


def sc_hf(c):
    models = make_models(c)
    llama = os.path.join(models, "llama")
    cfg = json.load(open(os.path.join(llama, "config.json")))
    j = run_ok(c, spec(c, {"init_from": llama, "seq_len": SEQ}, steps=2), "init_from only")
    m = j["spec"]["model"]
    want = {"family": "llama", "n_layer": cfg["num_hidden_layers"],
            "n_head": cfg["num_attention_heads"], "n_kv_head": cfg["num_key_value_heads"],
            "d_model": cfg["hidden_size"], "d_ff": cfg["intermediate_size"],
            "vocab_size": cfg["vocab_size"], "seq_len": SEQ, "init_from": llama,
            "tied_embeddings": cfg["tie_word_embeddings"]}
    check(all(m.get(k) == v for k, v in want.items()), "stored model %s, want %s" % (m, want))
    check(abs(m["rope_theta"] - cfg["rope_theta"]) < 1e-9 and
          abs(m["norm_eps"] - cfg["rms_norm_eps"]) < 1e-15, "stored theta/eps: %s" % m)
    got = losses(c, j["id"])
    ref = ref_loss(llama)
    print("init_from only: stored model %s; first loss %.7f, torch reference %.7f (diff %.1e)"
          % ({k: m[k] for k in ("family", "n_layer", "d_model", "d_ff", "vocab_size")},
             got[1], ref, abs(got[1] - ref)))
    check(abs(got[1] - ref) <= LOSS_TOL * max(1.0, abs(ref)),
          "first loss %s, torch reference %s" % (got[1], ref))
    check(got[2] < got[1], "the second step learned: %s" % got)

    # /v1/plan reads the directory too: its echoed spec and memory estimate have the sizes
    st, r = c.request("POST", "/v1/plan", {"model": {"init_from": llama, "seq_len": SEQ},
                                           "resources": {"device": "cpu"}})
    check(st == 200 and r["spec"]["model"].get("d_model") == cfg["hidden_size"] and
          r["spec"]["model"].get("n_kv_head") == cfg["num_key_value_heads"],
          "plan of init_from only: %s %s" % (st, r))
    st, r = c.request("POST", "/v1/plan", {"model": {"init_from": llama, "n_layer": 5},
                                           "resources": {"device": "cpu"}})
    check(st == 422 and r["error"]["code"] == "INIT_FROM_MISMATCH", "plan mismatch: %s %s"
          % (st, r))

    # a spec stating sizes that agree is accepted as it was before (cancelled at once)
    st, r = submit(c, spec(c, {"init_from": llama, "family": "llama", "n_layer": 2,
                               "d_model": cfg["hidden_size"], "seq_len": SEQ}, steps=1))
    check(st == 201 and r["spec"]["model"]["d_ff"] == cfg["intermediate_size"],
          "agreeing sizes: %s %s" % (st, r))
    c.request("POST", "/v1/jobs/%s/cancel" % r["id"], {})

    # refusals: code, both values named, nothing stored
    refused(c, spec(c, {"init_from": llama, "n_layer": 3}), 422, "INIT_FROM_MISMATCH",
            ("model.n_layer=3", "n_layer=2"), what="n_layer disagrees")
    refused(c, spec(c, {"init_from": llama, "family": "gpt2"}), 422, "INIT_FROM_MISMATCH",
            ("model.family=gpt2", "family=llama"), what="family disagrees")
    refused(c, spec(c, {"init_from": llama, "family": "llama", "preset": "tiny"}), 422,
            "INIT_FROM_MISMATCH", ("preset tiny",), what="preset disagrees")
    refused(c, spec(c, {"init_from": os.path.join(models, "gpt2"), "seq_len": SEQ}), 422,
            "HF_CONFIG_UNSUPPORTED", ("seq_len must be 128",), what="gpt2 seq_len")
    falcon = os.path.join(c.tmp, "falcon")
    os.makedirs(falcon)
    json.dump(dict(cfg, architectures=["FalconForCausalLM"], model_type="falcon"),
              open(os.path.join(falcon, "config.json"), "w"))
    refused(c, spec(c, {"init_from": falcon}), 422, "UNSUPPORTED_ARCHITECTURE",
            ("FalconForCausalLM", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
             "GPT2LMHeadModel"), what="falcon")
    refused(c, spec(c, {"init_from": os.path.join(c.tmp, "no-such-model")}), 422,
            "INIT_FROM_NOT_FOUND", ("no-such-model",), what="missing directory")
    empty = os.path.join(c.tmp, "empty-model")
    os.makedirs(empty)
    refused(c, spec(c, {"init_from": empty}), 422, "HF_CONFIG_MISSING",
            (os.path.join(empty, "config.json"),), what="no config.json")
    refused(c, spec(c, {"init_from": llama, "init_checkpoint": "/x/step_00000001"}), 422,
            "INVALID_INIT_FROM", ("model.init_checkpoint",), what="init_checkpoint given")
    # a tenant confined to the token data: the models directory is outside its roots
    st, t = c.request("POST", "/v1/tenants",
                      {"name": "confined", "data_roots": [os.path.join(c.tmp, "tok")]},
                      token=ADMIN)
    check(st in (200, 201), "create tenant: %s %s" % (st, t))
    st, k = c.request("POST", "/v1/tenants/%s/tokens" % t["id"], {}, token=ADMIN)
    check(st in (200, 201), "token: %s %s" % (st, k))
    refused(c, spec(c, {"init_from": llama}), 422, "DATA_PATH_FORBIDDEN", (llama,),
            token=k["token"], what="outside the data roots")


def sc_fork(c):
    models = make_models(c)
    llama = os.path.join(models, "llama")
    parent = run_ok(c, spec(c, {"init_from": llama, "seq_len": SEQ}, steps=2, export=True,
                            name="parent"), "parent")
    pid = parent["id"]
    plosses = losses(c, pid)
    exported = os.path.join(parent["out_dir"], "export", "hf")
    check(os.path.isfile(os.path.join(exported, "config.json")), "the parent exported its model")

    # job:<id>: the newest checkpoint (step 2), run under dp=2 (the checkpoint is resharded)
    fork = run_ok(c, spec(c, {"init_from": "job:" + pid}, steps=1, dp=2, name="fork"), "fork")
    m = fork["spec"]["model"]
    check(m.get("init_from") == "job:%s@2" % pid, "resolved reference: %s" % m)
    check(m.get("init_checkpoint") == os.path.join(parent["out_dir"], "checkpoints",
                                                   "step_00000002"), "checkpoint: %s" % m)
    check(m.get("init_hf") == llama, "the parent's source directory: %s" % m)
    pm = parent["spec"]["model"]
    check(all(m[k] == pm[k] for k in ("family", "n_layer", "n_head", "n_kv_head", "d_model",
                                      "d_ff", "vocab_size", "seq_len")),
          "fork shape %s, parent %s" % (m, pm))
    flosses = losses(c, fork["id"])
    check(sorted(flosses) == [1], "the fork counts its own steps from 1: %s" % flosses)
    st, out = c.get("/v1/jobs/%s/logs?rank=0&stream=stdout" % fork["id"])
    start = json.loads(out.splitlines()[0]) if st == 200 and out.strip() else {}
    check(start.get("type") == "start" and start.get("start_step", -1) == 0,
          "the fork starts at step 0: %s" % start)
    ref = ref_loss(exported)
    print("fork of %s@2 under dp=2: first loss %.7f, torch reference on the parent's export "
          "%.7f (diff %.1e); parent losses %s" % (pid, flosses[1], ref, abs(flosses[1] - ref),
                                                 plosses))
    check(abs(flosses[1] - ref) <= LOSS_TOL * max(1.0, abs(ref)),
          "fork first loss %s, reference %s" % (flosses[1], ref))
    check(flosses[1] < plosses[1], "the fork starts from trained weights, not the source")

    # job:<id>@1: the parent's weights after step 1, which its step 2 computed its loss with
    f1 = run_ok(c, spec(c, {"init_from": "job:%s@1" % pid, "seq_len": SEQ}, steps=1,
                        name="fork1"), "fork @1")
    l1 = losses(c, f1["id"])[1]
    print("fork of %s@1: first loss %.7f, parent's step-2 loss %.7f" % (pid, l1, plosses[2]))
    check(abs(l1 - plosses[2]) <= 1e-6 * abs(plosses[2]),
          "fork@1 first loss %s != parent step 2 loss %s" % (l1, plosses[2]))

    # a parent trained from a random init (no HF source): the shape is its spec's; gpt2 keeps
    # its learned positions, so a fork may not change seq_len
    g = {"family": "gpt2", "n_layer": 2, "n_head": 2, "d_model": 64, "vocab_size": 300,
         "seq_len": SEQ}
    gp = run_ok(c, spec(c, g, steps=2, name="gpt2-parent"), "gpt2 parent")
    gl = losses(c, gp["id"])
    gf = run_ok(c, spec(c, {"init_from": "job:%s@1" % gp["id"]}, steps=1, name="gpt2-fork"),
                "gpt2 fork")
    check("init_hf" not in gf["spec"]["model"] and gf["spec"]["model"]["d_ff"] == 256,
          "gpt2 fork model: %s" % gf["spec"]["model"])
    l1 = losses(c, gf["id"])[1]
    print("gpt2 fork of %s@1: first loss %.7f, parent's step-2 loss %.7f" % (gp["id"], l1, gl[2]))
    check(abs(l1 - gl[2]) <= 1e-6 * abs(gl[2]), "gpt2 fork %s != parent step 2 %s" % (l1, gl[2]))
    refused(c, spec(c, {"init_from": "job:" + gp["id"], "seq_len": 2 * SEQ}), 422,
            "INIT_FROM_MISMATCH", ("learned positions", "seq_len must be %d" % SEQ),
            what="gpt2 fork seq_len")

    refused(c, spec(c, {"init_from": "job:%s@7" % pid}), 409, "CHECKPOINT_NOT_FOUND",
            ("step 7", "1, 2"), what="unsaved step")
    refused(c, spec(c, {"init_from": "job:" + pid, "n_layer": 4}), 422, "INIT_FROM_MISMATCH",
            ("model.n_layer=4", "n_layer=2", "job " + pid), what="fork n_layer disagrees")
    refused(c, spec(c, {"init_from": "job:" + pid, "seq_len": 64, "family": "gpt2"}), 422,
            "INIT_FROM_MISMATCH", ("family",), what="fork family disagrees")
    # another tenant: the parent answers exactly as a job that does not exist
    _, tok_b = c.new_tenant("other")
    e1 = refused(c, spec(c, {"init_from": "job:" + pid}), 404, "JOB_NOT_FOUND", (pid,),
                 token=tok_b, what="another tenant's job")
    e2 = refused(c, spec(c, {"init_from": "job:j-000000000000"}), 404, "JOB_NOT_FOUND",
                 token=tok_b, what="no such job")
    check(e1["message"].replace(pid, "ID") == e2["message"].replace("j-000000000000", "ID"),
          "another tenant's job is told apart from a missing one: %s / %s" % (e1, e2))
    st, r = c.get("/v1/jobs/" + pid, token=tok_b)
    check(st == 404, "tenant B reads the parent: %s" % st)


LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.0,
        "targets": ["q", "k", "v", "o", "gate", "up", "down"]}


def sc_peft(c):
    import shutil
    models = make_models(c)
    llama = os.path.join(models, "llama")
    cfg = json.load(open(os.path.join(llama, "config.json")))
    ps = spec(c, {"init_from": llama, "seq_len": SEQ}, steps=2, name="lora-parent")
    ps["train"]["lora"] = LORA
    ps["export"] = {"hf": True, "lora": True}
    parent = run_ok(c, ps, "lora parent")
    plosses = losses(c, parent["id"])
    adapter = os.path.join(parent["out_dir"], "export", "lora")
    merged = os.path.join(parent["out_dir"], "export", "hf")
    acfg = json.load(open(os.path.join(adapter, "adapter_config.json")))
    check(acfg.get("base_model_name_or_path") == llama, "parent adapter config: %s" % acfg)

    # the adapter directory alone as init_from, continued under tp=2
    cs = spec(c, {"init_from": adapter, "seq_len": SEQ}, steps=2, name="lora-continue")
    cs["parallel"]["tp"] = 2
    cs["train"]["lora"] = LORA
    cs["export"] = {"lora": True}
    cont = run_ok(c, cs, "continue the adapter")
    m = cont["spec"]["model"]
    want = {"family": "llama", "n_layer": cfg["num_hidden_layers"],
            "n_head": cfg["num_attention_heads"], "n_kv_head": cfg["num_key_value_heads"],
            "d_model": cfg["hidden_size"], "d_ff": cfg["intermediate_size"],
            "vocab_size": cfg["vocab_size"], "init_from": adapter}
    check(all(m.get(k) == v for k, v in want.items()), "stored model %s, want %s" % (m, want))
    check(cont["spec"]["parallel"]["tp"] == 2, "stored layout: %s" % cont["spec"]["parallel"])
    got = losses(c, cont["id"])
    ref = ref_loss(merged)
    print("PEFT init_from under tp=2: first loss %.7f, torch reference on the parent's merged "
          "export %.7f (diff %.1e); parent losses %s, continued %s"
          % (got[1], ref, abs(got[1] - ref), plosses, got))
    check(abs(got[1] - ref) <= LOSS_TOL * max(1.0, abs(ref)),
          "continued first loss %s, reference %s" % (got[1], ref))
    check(got[1] < plosses[1] and got[2] < got[1], "the adapter continued to learn: %s" % got)
    cad = os.path.join(cont["out_dir"], "export", "lora")
    ccfg = json.load(open(os.path.join(cad, "adapter_config.json")))
    check(ccfg.get("base_model_name_or_path") == llama and ccfg.get("r") == 4,
          "continued adapter config: %s" % ccfg)
    check(os.path.getsize(os.path.join(cad, "adapter_model.safetensors")) ==
          os.path.getsize(os.path.join(adapter, "adapter_model.safetensors")),
          "the continued adapter has every tensor whole (the tp=2 pieces gathered)")

    # refusals: code, values named, nothing stored
    def bad(**kw):
        s = spec(c, {"init_from": kw.get("init", adapter), "seq_len": SEQ}, steps=1)
        if kw.get("lora", True):
            s["train"]["lora"] = dict(LORA, **kw.get("lora_kw", {}))
        return s
    refused(c, bad(lora_kw={"rank": 8}), 422, "LORA_INIT_INVALID",
            ("train.lora.rank=8", "r=4"), what="another rank")
    refused(c, bad(lora=False), 422, "LORA_INIT_INVALID", ("no train.lora",),
            what="no train.lora")

    def adapter_copy(name, base):
        d = os.path.join(c.tmp, name)
        shutil.copytree(adapter, d)
        a = dict(acfg)
        if base is None:
            del a["base_model_name_or_path"]
        else:
            a["base_model_name_or_path"] = base
        json.dump(a, open(os.path.join(d, "adapter_config.json"), "w"))
        return d
    refused(c, bad(init=adapter_copy("hub-adapter", "meta-llama/Llama-3.2-1B")), 422,
            "PEFT_BASE_NOT_FOUND", ("meta-llama/Llama-3.2-1B",), what="base is a hub name")
    refused(c, bad(init=adapter_copy("nobase-adapter", None)), 422, "PEFT_BASE_NOT_FOUND",
            ("base_model_name_or_path",), what="no base named")
    gone = os.path.join(c.tmp, "no-such-base")
    refused(c, bad(init=adapter_copy("gone-adapter", gone)), 422, "PEFT_BASE_NOT_FOUND",
            (gone,), what="base missing")
    # a tenant confined to the token data: the adapter is there, its base is not
    inside = os.path.join(c.tmp, "tok", "adapter")
    shutil.copytree(adapter, inside)
    st, t = c.request("POST", "/v1/tenants",
                      {"name": "confined", "data_roots": [os.path.join(c.tmp, "tok")]},
                      token=ADMIN)
    check(st in (200, 201), "create tenant: %s %s" % (st, t))
    st, k = c.request("POST", "/v1/tenants/%s/tokens" % t["id"], {}, token=ADMIN)
    check(st in (200, 201), "token: %s %s" % (st, k))
    refused(c, bad(init=inside), 422, "DATA_PATH_FORBIDDEN", (llama,), token=k["token"],
            what="base outside the data roots")


SCENARIOS = {"hf": sc_hf, "fork": sc_fork, "peft": sc_peft}


def main():
    for b in ("loomd", "loom-agent", "loom-worker"):
        if not os.access(os.path.join(BIN_DIR, b), os.X_OK):
            print("SKIP: %s not built" % b)
            return 77
    c = tc.Cluster(nodes=1, devices=2, worker=os.path.join(BIN_DIR, "loom-worker"))
    ok = False
    try:
        SCENARIOS[SCENARIO](c)
        ok = True
        print("PASS init_from", SCENARIO)
        return 0
    except tc.Fail as e:
        print("FAIL init_from %s: %s" % (SCENARIO, e))
        return 1
    finally:
        c.close(ok)


if __name__ == "__main__":
    sys.exit(main())
