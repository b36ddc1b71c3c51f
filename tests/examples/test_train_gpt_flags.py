"""train_gpt's command line, through the dscpp launcher on 2 CPU ranks.

- Megatron-LM's flags filling a ds_config of "auto"s train exactly as the same numbers written
  in the ds_config do (the same log lines: loss, lr, grad norm), under --deepspeed-config and
  --deepspeed_config alike, with Megatron-DeepSpeed's --deepspeed switch before them; with no
  optimizer or schedule in the ds_config the flags make them (as the sections written out);
  --bf16 switches bf16 on.
- A flag that contradicts a number of the ds_config is an error naming both; an "auto" no flag
  fills names the flag; an unknown flag, a prefix of a known one (--train-it), a stray value
  (--deepspeed x), a tensor-parallel degree above 1, pipeline degrees or schedules that disagree, a
  schedule without a pipeline and --bf16 against fp16 on are refused: each
  message printed once (by
  rank 0), every rank exiting non-zero.
- A finished run resumed says it is finished and how to go on; raising --train-iters goes on.
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


def summary():
    """The exit status of a test of checks: 1, naming them, when any failed."""
    if FAILED:
        print("FAILED:", FAILED)
        return 1
    print("all passed")
    return 0


class Job:

    def __init__(self, launcher, train_gpt, tmp):
        self.launcher, self.train_gpt, self.tmp = launcher, train_gpt, tmp

    def run(self, *flags, ranks=2):
        cmd = [self.launcher, "--num_gpus", str(ranks), "--master_port", str(free_port()), self.train_gpt,
               "--model-config", self.model, *flags]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        return p.returncode, p.stdout + p.stderr


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f)
    return path


def step_lines(log):
    """The training log lines without their timing and memory figures."""
    return [re.sub(r" \| [0-9.]+ tokens/s.*", "", l) for l in log.splitlines() if l.startswith("[train_gpt] step ")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(args.launcher, args.train_gpt, tmp)
        prefix = os.path.join(tmp, "tokens")
        megatron_format.write(prefix, [[[(7 * i + j) % 64 for j in range(40)]] for i in range(16)], "uint16")
        job.model = write_json(os.path.join(tmp, "gpt.json"), {
            "hidden_size": 16, "num_layers": 1, "num_attention_heads": 2, "seq_length": 8, "vocab_size": 64,
            "ffn_hidden_size": 32, "hidden_dropout": 0.0, "attention_dropout": 0.0, "layernorm_epsilon": 1e-5,
            "init_method_std": 0.02, "tie_word_embeddings": True})
        base = {"steps_per_print": 1 << 30, "zero_optimization": {"stage": 1}}
        # The numbers the flags below stand for: 8 = 2 per rank x 2 accumulation x 2 ranks.
        written = dict(base, train_batch_size=8, train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=2,
                       optimizer={"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.0}},
                       scheduler={"type": "WarmupCosineLR", "params": {
                           "warmup_num_steps": 2, "total_num_steps": 6, "warmup_min_ratio": 0.0,
                           "cos_min_ratio": 0.1, "warmup_type": "linear"}})
        auto = dict(base, train_batch_size="auto", train_micro_batch_size_per_gpu="auto",
                    gradient_accumulation_steps="auto",
                    optimizer={"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.0}},
                    scheduler={"type": "auto", "params": {
                        "warmup_num_steps": "auto", "total_num_steps": "auto", "warmup_min_ratio": 0.0,
                        "cos_min_ratio": "auto", "warmup_type": "linear"}})
        ds_written = write_json(os.path.join(tmp, "written.json"), written)
        ds_auto = write_json(os.path.join(tmp, "auto.json"), auto)
        common = ["--data-path", prefix, "--train-iters", "6", "--log-interval", "2", "--seed", "7"]
        megatron = ["--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "2e-3", "--min-lr", "2e-4",
                    "--lr-warmup-iters", "2", "--lr-decay-style", "cosine"]

        rc_w, log_w = job.run("--deepspeed_config", ds_written, *common)
        check("numbers in the ds_config: trains", rc_w == 0 and len(step_lines(log_w)) == 3, log_w)
        check("numbers in the ds_config: global batch 8 = 2 x 2 x 2", "global batch 8 = 2 x 2 x 2" in log_w, log_w)
        rc_a, log_a = job.run("--deepspeed", "--deepspeed-config", ds_auto, *common, *megatron)
        check("Megatron-LM's flags fill the autos: trains", rc_a == 0, log_a)
        check("the flags train as the numbers written do (loss, lr, grad norm at every log)",
              step_lines(log_a) == step_lines(log_w) and step_lines(log_w), log_a + "\n---\n" + log_w)
        # Megatron-DeepSpeed's own words: `--deepspeed --deepspeed_config ds.json` (Boost once read
        # --deepspeed as a prefix of --deepspeed_config and refused the pair).
        rc_u, log_u = job.run("--deepspeed", "--deepspeed_config", ds_auto, "--train-data-path", prefix,
                              "--train-iters", "6", "--log-interval", "2", "--seed", "7", *megatron)
        check("--deepspeed --deepspeed_config and --train-data-path, the same run",
              rc_u == 0 and step_lines(log_u) == step_lines(log_w), log_u)

        # Adam's settings and clipping: flags into "auto"s as the numbers written.
        adam_written = dict(written, gradient_clipping=0.5, optimizer={"type": "AdamW", "params": {
            "lr": 2e-3, "weight_decay": 0.05, "betas": [0.9, 0.95], "eps": 1e-6}})
        adam_auto = dict(written, gradient_clipping="auto", optimizer={"type": "AdamW", "params": {
            "lr": 2e-3, "weight_decay": "auto", "betas": "auto", "eps": "auto"}})
        ds_adam = write_json(os.path.join(tmp, "adam_written.json"), adam_written)
        rc1, log1 = job.run("--deepspeed_config", ds_adam, *common)
        rc2, log2 = job.run("--deepspeed_config", write_json(os.path.join(tmp, "adam_auto.json"), adam_auto), *common,
                            "--weight-decay", "0.05", "--adam-beta2", "0.95", "--adam-eps", "1e-6", "--clip-grad", "0.5")
        check("--weight-decay, --adam-beta2, --adam-eps, --clip-grad fill the autos as written",
              rc1 == 0 and rc2 == 0 and step_lines(log1) == step_lines(log2) and step_lines(log1)
              and step_lines(log1) != step_lines(log_w), log1 + "\n---\n" + log2)

        # A ds_config with no optimizer or schedule: Megatron-LM's flags make them (an AdamW with
        # Megatron-LM's defaults; the --lr-decay-style schedule with a linear warmup, as long
        # as --train-iters), training as the same sections written out do.
        bare = write_json(os.path.join(tmp, "bare.json"), dict(base, train_batch_size=8,
                                                                 train_micro_batch_size_per_gpu=2))
        spelled = write_json(os.path.join(tmp, "spelled.json"), dict(
            written, optimizer={"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01,
                                                            "betas": [0.9, 0.999], "eps": 1e-8}}))
        rc_b, log_b = job.run("--deepspeed_config", bare, *common, "--lr", "2e-3", "--min-lr", "2e-4",
                              "--lr-warmup-iters", "2", "--lr-decay-style", "cosine")
        rc_s, log_s = job.run("--deepspeed_config", spelled, *common)
        check("no optimizer or schedule in the ds_config: the flags make them, as written out",
              rc_b == 0 and rc_s == 0 and step_lines(log_b) == step_lines(log_s) and step_lines(log_s),
              log_b + "\n---\n" + log_s)
        rc, log = job.run("--deepspeed_config", bare, *common, "--lr", "2e-3", "--bf16")
        check("--bf16 switches bf16 on", rc == 0 and "BFloat16" in log, log)

        def refused(name, flags, message, ds=ds_written, ranks=2):
            rc, log = job.run("--deepspeed_config", ds, *common, *flags, ranks=ranks)
            check(name + ": refused", rc != 0, log)
            n = log.count(message)
            check(name + f": said once ({n} times): {message}", n == 1, log)
            return log

        refused("a contradicted number", ["--global-batch-size", "16"],
                "ds_config train_batch_size=8 vs --global-batch-size=16")
        refused("a contradicted lr", ["--lr", "1e-3"], "ds_config optimizer.params.lr=0.002 vs --lr=0.001")
        refused("an auto no flag fills", ["--lr", "2e-3"], 'ds_config train_batch_size is "auto": give --global-batch-size',
                ds=write_json(os.path.join(tmp, "batch_auto.json"), dict(written, train_batch_size="auto",
                                                                         train_micro_batch_size_per_gpu="auto")))
        refused("an unknown flag", ["--no-such-flag", "1"], "unrecognised option '--no-such-flag'")
        refused("a prefix of --train-iters", ["--train-it", "3"], "unrecognised option '--train-it'")
        refused("--deepspeed followed by a value", ["--deepspeed", "x"], "unexpected argument 'x'")
        refused("sequence parallelism without a tensor degree", ["--sequence-parallel"],
                "--sequence-parallel (or the model config's sequence_parallel) needs a tensor degree > 1")
        refused("pipeline degrees that disagree", ["--pipeline-model-parallel-size", "2"],
                "pipeline degree: the ds_config's pipeline.stages is 1 but --pipeline-model-parallel-size is 2",
                ds=write_json(os.path.join(tmp, "stages1.json"), dict(written, pipeline={"stages": 1})))
        refused("a pipeline schedule without a pipeline", ["--pipeline-schedule", "zb-h1"],
                "a pipeline schedule (--pipeline-schedule, parallelism.pipeline_parallel_schedule) needs a "
                "pipeline: the pipeline degree is 1")
        refused("pipeline schedules that disagree",
                ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zb-h1"],
                "pipeline schedule: --pipeline-schedule is zb-h1 but the ds_config's pipeline.schedule is 1f1b",
                ds=write_json(os.path.join(tmp, "sched.json"), dict(written, pipeline={"schedule": "1f1b"})))
        refused("an unknown pipeline schedule", ["--pipeline-schedule", "gpipe"],
                "--pipeline-schedule: expected auto, 1f1b, interleaved, zb-h1 or zb-v, found 'gpipe'")
        refused("--bf16 against fp16 on in the ds_config", ["--bf16"],
                "--bf16 contradicts the ds_config's fp16.enabled=true",
                ds=write_json(os.path.join(tmp, "fp16.json"), dict(written, fp16={"enabled": True})))
        refused("a contradicted clipping", ["--clip-grad", "2"], "ds_config gradient_clipping=0.5 vs --clip-grad=2.0",
                ds=ds_adam)
        refused("the same flag twice", ["--train-data-path", prefix + "_other"], "are one flag given two values")

        # A finished run, resumed: nothing to train, and it says what to do.
        ck = os.path.join(tmp, "ck")
        rc, log = job.run("--deepspeed_config", ds_written, *common, "--save", ck, "--save-interval", "3")
        check("a run of 6 steps saves", rc == 0 and os.path.exists(os.path.join(ck, "global_step6")), log)
        rc, log = job.run("--deepspeed_config", ds_written, *common, "--load", ck)
        check("resumed at its last step: says finished and how to go on",
              rc == 0 and "finished: the checkpoint is at step 6 and --train-iters is 6, so there is nothing left "
              "to train. To train further, raise --train-iters (e.g. --train-iters 12)" in log
              and "total_num_steps=6 too" in log and not step_lines(log), log)
        rc, log = job.run("--deepspeed_config", ds_written, *[c if c != "6" else "8" for c in common], "--load", ck)
        check("--train-iters raised: trains on from step 6 to 8",
              rc == 0 and "at step 6" in log and [l.split(" |")[0] for l in step_lines(log)] == ["[train_gpt] step 8/8"],
              log)
    if FAILED:
        print(f"{len(FAILED)} check(s) failed: {FAILED}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
