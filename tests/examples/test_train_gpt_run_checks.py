"""train_gpt's checks around a run, through the dscpp launcher on 2 CPU ranks.

- The batch rule (train_batch_size = micro x accumulation x data ranks): a global batch that the
  others do not divide is refused with the numbers and where each came from, whichever of the
  three is left to derive ("auto" in the ds_config, or absent for the engine to derive).
- A ds_config with no optimizer and no --lr: the message names --lr or an optimizer section.
- Errors found after the ranks meet (the engine's ds_config reading, the data files, --load's
  checkpoint) are printed once, by rank 0, as the command line's are; every rank exits non-zero.
- A run whose loss turns non-finite (an lr of 1e30: the weights overflow after step 1) stops with
  exit status 1 at the next log line, naming the first non-finite step (2, not the log's 3), on
  a pipeline too, and saves no checkpoint after it; with --no-check-for-nan-in-loss-and-grad it
  says so once and trains to the end.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "data"))
sys.path.insert(0, os.path.dirname(HERE))  # tests/
import megatron_format  # noqa: E402
from dscpp_test_ports import free_port  # noqa: E402

FAILED = []


def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name)
    if not ok:
        FAILED.append(name)
        print(detail[-3000:])


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "tokens")
        megatron_format.write(prefix, [[[(7 * i + j) % 64 for j in range(40)]] for i in range(16)], "uint16")
        model = write_json(os.path.join(tmp, "gpt.json"), {
            "hidden_size": 16, "num_layers": 1, "num_attention_heads": 2, "seq_length": 8, "vocab_size": 64,
            "ffn_hidden_size": 32, "hidden_dropout": 0.0, "attention_dropout": 0.0, "layernorm_epsilon": 1e-5,
            "init_method_std": 0.02, "tie_word_embeddings": True})
        model2 = write_json(os.path.join(tmp, "gpt2.json"), dict(json.load(open(model)), num_layers=2))
        adam = {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}}
        base = {"steps_per_print": 1 << 30, "zero_optimization": {"stage": 1}, "optimizer": adam}

        def run(ds, *flags, data=prefix, model=model):
            cmd = [args.launcher, "--num_gpus", "2", "--master_port", str(free_port()), args.train_gpt,
                   "--model-config", model, "--data-path", data, "--seed", "7",
                   "--deepspeed_config", write_json(os.path.join(tmp, "ds.json"), ds), *flags]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
            return p.returncode, p.stdout + p.stderr

        def refused(name, ds, flags, message, status=None, data=prefix):
            rc, log = run(ds, "--train-iters", "2", *flags, data=data)
            check(f"{name}: refused (exit {rc})", rc != 0 and (status is None or rc == status), log)
            n = log.count(message)
            check(f"{name}: said once ({n} times): {message}", n == 1, log)
            return log

        # The batch rule, each size derived in turn (2 data ranks).
        refused("global batch 10, micro 4, accumulation auto",
                dict(base, train_batch_size="auto", train_micro_batch_size_per_gpu="auto",
                     gradient_accumulation_steps="auto"),
                ["--global-batch-size", "10", "--micro-batch-size", "4"],
                "--global-batch-size 10 is not a multiple of 4 x 2 = 8 (--micro-batch-size x data ranks), so "
                'gradient_accumulation_steps ("auto" in the ds_config) has no whole value', status=2)
        refused("global batch 10, accumulation 3, micro auto",
                dict(base, train_batch_size="auto", train_micro_batch_size_per_gpu="auto",
                     gradient_accumulation_steps=3),
                ["--global-batch-size", "10"],
                "--global-batch-size 10 is not a multiple of 3 x 2 = 6 (gradient_accumulation_steps x data "
                'ranks), so train_micro_batch_size_per_gpu ("auto" in the ds_config) has no whole value', status=2)
        log = refused("global batch given, micro and accumulation auto",
                      dict(base, train_batch_size="auto", train_micro_batch_size_per_gpu="auto",
                           gradient_accumulation_steps="auto"),
                      ["--global-batch-size", "16"],
                      'ds_config gradient_accumulation_steps is "auto": give --micro-batch-size\n', status=2)
        check("global batch given: not asked for again", "give --global-batch-size" not in log, log)
        # No accumulation key: the engine derives it, and says which division failed (its error is
        # found after the ranks meet: printed once all the same).
        refused("global batch 10, micro 4, no accumulation key",
                dict(base, train_batch_size="auto", train_micro_batch_size_per_gpu="auto"),
                ["--global-batch-size", "10", "--micro-batch-size", "4"],
                "train_batch_size (10) is not a multiple of train_micro_batch_size_per_gpu (4) * data-parallel "
                "world size (2) = 8, so gradient_accumulation_steps has no whole value", status=1)

        # No optimizer anywhere: the command line's way out, not the C++ API's.
        plain = {"steps_per_print": 1 << 30, "zero_optimization": {"stage": 1}, "train_batch_size": 8,
                 "train_micro_batch_size_per_gpu": 2}
        log = refused("no optimizer and no --lr", plain, [],
                      "the ds_config names no optimizer: give --lr", status=2)
        check("no optimizer: no C++ API named", "InitArgs" not in log, log)
        rc, log = run(plain, "--train-iters", "2", "--lr", "1e-3")
        check("no optimizer but --lr: trains", rc == 0 and "[train_gpt] step 2/2" in log, log)

        # After the ranks meet: the engine's ds_config error and the data's, once each.
        written = dict(base, train_batch_size=8, train_micro_batch_size_per_gpu=2)
        refused("an optimizer the engine does not know",
                dict(written, optimizer={"type": "NoSuchOptimizer", "params": {"lr": 1e-3}}), [],
                "optimizer.type", status=1)
        bad = os.path.join(tmp, "aliased")
        megatron_format.write(bad, [[[1, 2, 3]], [[4, 5, 6]]], "uint16")
        with open(bad + ".idx", "r+b") as f:  # sequence 1's pointer (byte 34 + 8 + 8) onto 0
            f.seek(34 + 2 * 4 + 8)
            f.write((0).to_bytes(8, "little"))
        refused("a data file with an aliased pointer", written, [],
                "sequence 1 starts at byte 0 of " + bad + ".bin", status=1, data=bad)
        refused("a missing data file", written, [], os.path.join(tmp, "missing") + ".idx", status=1,
                data=os.path.join(tmp, "missing"))

        # --load of a checkpoint whose latest tag has no files: the checkpoint's error, once.
        broken = os.path.join(tmp, "broken_ck")
        os.makedirs(os.path.join(broken, "global_step5"))
        with open(os.path.join(broken, "latest"), "w") as f:
            f.write("global_step5")
        refused("a checkpoint without its files", written, ["--load", broken],
                "global_step5/mp_rank_00_model_states.pt", status=1)

        # A diverging run: lr 1e30 overflows the weights at step 1's update.
        huge = dict(written, optimizer={"type": "AdamW", "params": {"lr": 1e30, "weight_decay": 0.0}})
        rc, log = run(huge, "--train-iters", "6", "--log-interval", "3")
        check(f"non-finite loss: stops with exit 1 ({rc})", rc == 1, log)
        message = "step 2: the loss"
        check("non-finite loss: the first non-finite step named once, with the switch",
              log.count(message) == 1 and "not finite" in log
              and "stopped by --check-for-nan-in-loss-and-grad" in log, log)
        check("non-finite loss: stopped at the first log line (step 3), before step 6",
              "[train_gpt] step 3/6" in log and "[train_gpt] step 6/6" not in log, log)
        ck = os.path.join(tmp, "ck")
        rc, log = run(huge, "--train-iters", "6", "--log-interval", "6", "--save", ck, "--save-interval", "2")
        check("non-finite loss: no checkpoint saved after it", rc == 1 and not os.path.exists(
            os.path.join(ck, "global_step4")) and log.count("step 2: the loss") == 1, log)
        # The same on a pipeline of 2 stages (its own training loop).
        rc, log = run(huge, "--train-iters", "6", "--log-interval", "3", "--pipeline-model-parallel-size", "2",
                      model=model2)
        check(f"non-finite loss on a pipeline: stops with exit 1 ({rc}), naming step 2 once",
              rc == 1 and "pipeline 2 stages" in log and log.count("step 2: the loss") == 1
              and "[train_gpt] step 6/6" not in log, log)
        rc, log = run(huge, "--train-iters", "6", "--log-interval", "3", "--no-check-for-nan-in-loss-and-grad")
        check(f"--no-check-for-nan-in-loss-and-grad: trains to the end ({rc})",
              rc == 0 and "[train_gpt] step 6/6" in log, log)
        warning = "[train_gpt] warning: step 2: the loss"
        check("--no-check-for-nan-in-loss-and-grad: says so once",
              log.count(warning) == 1 and "training goes on (--no-check-for-nan-in-loss-and-grad)" in log, log)
        refused("both switches", written, ["--check-for-nan-in-loss-and-grad", "--no-check-for-nan-in-loss-and-grad"],
                "--check-for-nan-in-loss-and-grad and --no-check-for-nan-in-loss-and-grad: choose one", status=2)
        rc, log = run(written, "--train-iters", "4", "--log-interval", "2")
        check("a finite run: no word of it", rc == 0 and "not finite" not in log
              and "[train_gpt] step 4/4" in log, log)
    if FAILED:
        print(f"{len(FAILED)} check(s) failed: {FAILED}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
