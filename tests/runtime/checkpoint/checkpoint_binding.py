#!/usr/bin/env python3
"""The files of a checkpoint tag bind to each other (runtime/checkpoint/save_binding.h), on
real 2-rank jobs through the launcher:

    checkpoint_binding.py --launcher build/launcher/dscpp --train build/tests/runtime/engine/engine_train \
        --zero-to-fp32 build/tools/zero_to_fp32

A tag whose partition files were swapped, one copied over another, a model-states file from
another step, or a partition from another save of the same step: the load (and zero_to_fp32)
fails, naming the file and both values (read back here with torch.load). The intact tag resumes
on 2 ranks and on 1 (another layout stays allowed); a folder without `latest` trains from
scratch after DeepSpeed's warning, printed once, and train_gpt --load says it starts from
scratch. Exits 1 on any failure."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "engine"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "data"))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # tests/
from dscpp_test_ports import free_port  # noqa: E402
from ds_train import config  # noqa: E402

STAGE = 2
P0 = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
P1 = "zero_pp_rank_1_mp_rank_00_optim_states.pt"
MODEL = "mp_rank_00_model_states.pt"


class Job:

    def __init__(self, args, tmp):
        self.args, self.tmp, self.n = args, tmp, 0

    def train(self, ranks, steps, extra):
        self.n += 1
        out = os.path.join(self.tmp, f"out_{self.n}.json")
        cmd = [self.args.launcher, "--num_gpus", str(ranks), "--master_port", str(free_port()), self.args.train,
               "--mode", "dscpp", "--config", json.dumps(config(STAGE, 1)), "--steps", str(steps), "--out", out,
               *extra]
        env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        result = None
        if p.returncode == 0 and os.path.exists(out):
            with open(out) as f:
                result = json.load(f)
        return p.returncode, p.stdout + p.stderr, result


def save_id(path):
    import torch
    return torch.load(path)["dscpp_save_id"]


def train_gpt_from_scratch(train_gpt, tmp, empty, warning, check):
    """train_gpt --load on a folder without `latest`: the warning, then "starting from scratch"."""
    import megatron_format
    prefix = os.path.join(tmp, "tokens")
    megatron_format.write(prefix, [[[(7 * i + j) % 64 for j in range(40)]] for i in range(8)], "uint16")
    model = os.path.join(tmp, "gpt.json")
    with open(model, "w") as f:
        json.dump({"hidden_size": 16, "num_layers": 1, "num_attention_heads": 2, "seq_length": 8,
                   "vocab_size": 64, "ffn_hidden_size": 32, "hidden_dropout": 0.0, "attention_dropout": 0.0,
                   "layernorm_epsilon": 1e-5, "init_method_std": 0.02, "tie_word_embeddings": True}, f)
    ds = os.path.join(tmp, "ds.json")
    with open(ds, "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                   "zero_optimization": {"stage": 1}, "steps_per_print": 1 << 30}, f)
    p = subprocess.run([train_gpt, "--model-config", model, "--train-data-path", prefix, "--deepspeed_config", ds,
                        "--train-iters", "1", "--load", empty], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    log = p.stdout + p.stderr
    check("train_gpt without latest: trains", p.returncode == 0, log)
    check("train_gpt without latest: warns and says it starts from scratch",
          warning in log and f"no checkpoint in {empty}: starting from scratch" in log, log)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--zero-to-fp32", dest="zero_to_fp32", required=True)
    ap.add_argument("--train-gpt", dest="train_gpt", help="examples/train_gpt (its --load case)")
    args = ap.parse_args()
    # DS_ACCELERATOR=cpu (its ctest environment): CPU ranks over Gloo on a GPU machine too.
    failed = []

    def check(name, ok, detail=""):
        print(("PASS " if ok else "FAIL ") + name + ("" if ok else f": {detail[-2500:]}"))
        if not ok:
            failed.append(name)

    with tempfile.TemporaryDirectory(prefix="dscpp_binding_") as tmp:
        job = Job(args, tmp)
        a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        rc, log, _ = job.train(2, 6, ["--save", a, "--save-interval", "3"])
        check("save global_step3 and global_step6", rc == 0, log)
        rc, log, _ = job.train(2, 6, ["--save", b, "--save-at", "6"])
        check("a second save of step 6", rc == 0, log)
        if failed:
            return 1
        a6 = os.path.join(a, "global_step6")
        ids = {"a6": save_id(os.path.join(a6, MODEL)), "a3": save_id(os.path.join(a, "global_step3", MODEL)),
               "b6": save_id(os.path.join(b, "global_step6", MODEL))}
        check("every save has its own id", len(set(ids.values())) == 3, str(ids))
        check("every file of a save has its id",
              all(save_id(os.path.join(a6, f)) == ids["a6"] for f in (P0, P1)), str(ids))

        rc, log, got = job.train(2, 8, ["--load", a])
        check("the intact tag resumes on 2 ranks", rc == 0 and got["first_step"] == 6, log)
        rc, log, got = job.train(1, 8, ["--load", a])
        check("the intact tag resumes on 1 rank", rc == 0 and got["first_step"] == 6, log)

        def broken(name, change, wants):
            ck = os.path.join(tmp, name)
            shutil.copytree(a, ck)
            tag = os.path.join(ck, "global_step6")
            change(tag)
            wants = [w(tag) if callable(w) else w for w in wants]
            rc, log, _ = job.train(2, 8, ["--load", ck])
            check(f"{name}: the load fails", rc != 0, log)
            missing = [w for w in wants if w not in log]
            check(f"{name}: the error names {wants}", not missing, log)
            p = subprocess.run([args.zero_to_fp32, ck, os.path.join(tmp, name + ".bin")], capture_output=True,
                               text=True, timeout=120)
            missing = [w for w in wants if w not in p.stderr]
            check(f"{name}: zero_to_fp32 refuses it too", p.returncode == 1 and not missing, p.stderr)

        def swap(tag):
            os.rename(os.path.join(tag, P0), os.path.join(tag, "x"))
            os.rename(os.path.join(tag, P1), os.path.join(tag, P0))
            os.rename(os.path.join(tag, "x"), os.path.join(tag, P1))

        broken("swapped", swap, [lambda t: os.path.join(t, P0), "partition of rank 1", "says rank 0"])
        broken("copied", lambda t: shutil.copy(os.path.join(t, P0), os.path.join(t, P1)),
               [lambda t: os.path.join(t, P1), "partition of rank 0", "says rank 1"])
        broken("model_from_step3", lambda t: shutil.copy(os.path.join(a, "global_step3", MODEL),
                                                        os.path.join(t, MODEL)),
               [lambda t: os.path.join(t, MODEL), lambda t: os.path.join(t, P0), "step 6", "step 3",
                "save " + ids["a6"], "save " + ids["a3"]])
        broken("partition_of_another_save", lambda t: shutil.copy(os.path.join(b, "global_step6", P1),
                                                                 os.path.join(t, P1)),
               [lambda t: os.path.join(t, P1), "save " + ids["b6"], "save " + ids["a6"]])

        empty = os.path.join(tmp, "empty")
        os.makedirs(empty)
        rc, log, got = job.train(2, 2, ["--load", empty])
        warning = "Unable to find latest file at " + os.path.join(empty, "latest")
        check("no latest: trains from scratch", rc == 0 and got["first_step"] == 0, log)
        check("no latest: DeepSpeed's warning, once", log.count(warning) == 1, log)
        if args.train_gpt:
            train_gpt_from_scratch(args.train_gpt, tmp, empty, warning, check)

    print(f"{len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
