"""The seed's workflow, its commands as it typed them, on 8 CPU ranks with a tiny model
in place of 1.3B and a free port in place of 6000:

- `preprocess_data --input raw.json --output-prefix P --tokenizer-type GPT2Tokenizer
  --vocab-file vocab.json --merge-file merges.txt --dataset-impl mmap`: the seed's spellings write
  the same files as Megatron's (GPT2BPETokenizer, no --dataset-impl); another --dataset-impl is
  refused with a message.
- `dscpp --num_gpus=8 --master_port=PORT ./train_gpt --model-config tiny.yaml --train-data-path P
  --global-batch-size 16 --deepspeed-config ds_config_small.json` (the seed's ds_config,
  examples/ds_config_small.json): the YAML model config with its `model:` and `parallelism:`
  sections, --global-batch-size filling "train_batch_size": "auto"; the run trains (the loss falls)
  and logs its steps, the batch split 16 = 2 x 1 x 8, ZeRO-2 in fp16.
- The same command with the seed's 2 x 2 x 2 layout (1.3B_demo.yaml's: tensor 2 x pipeline 2 x
  data 2) trains on the 8 ranks: a pipeline of 2 stages of the tensor-parallel GPT, 16 = 8 x 1 x 2
  (the ds_config's micro-batch "auto" from the data degree 2); its --dry-run prints the figures.
  With --pipeline-schedule zb-h1 and zb-v it trains to 1F1B's losses (fp32, 4 micro-batches,
  no dropout).
"""
import argparse
import filecmp
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from dscpp_test_ports import free_port  # noqa: E402

FAILED = []


START = time.time()


def check(name, ok, detail=""):
    print(("PASS " if ok else "FAIL ") + name + f" ({time.time() - START:.1f} s)", flush=True)
    if not ok:
        FAILED.append(name)
        print(detail[-4000:], flush=True)


def run(cmd, cwd=None, timeout=300):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    return p.returncode, p.stdout + p.stderr


TINY = """# A tiny stand-in for 1.3B_demo.yaml: the four keys, the rest Megatron-LM's defaults.
model:
  hidden_size: 64
  num_layers: 2
  num_attention_heads: 4
  seq_length: 32

parallelism:
  tensor_model_parallel_size: {t}
  pipeline_model_parallel_size: {p}
  data_parallel_size: {d}
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    ap.add_argument("--preprocess", required=True)
    ap.add_argument("--bpe-dir", required=True)
    ap.add_argument("--ds-config", required=True)
    ap.add_argument("--configs", required=True)
    ap.add_argument("--full", action="store_true", help="20 steps, the loss falling; both config spellings")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # The seed's file names for GPT-2's vocabulary and merges.
        shutil.copy(os.path.join(args.bpe_dir, "encoder.json"), os.path.join(tmp, "vocab.json"))
        shutil.copy(os.path.join(args.bpe_dir, "vocab.bpe"), os.path.join(tmp, "merges.txt"))
        shutil.copy(args.ds_config, os.path.join(tmp, "ds_config_small.json"))
        words = "the quick brown fox jumps over a lazy dog while seven engineers train a model".split()
        with open(os.path.join(tmp, "raw.json"), "w") as f:
            for i in range(200):
                f.write(json.dumps({"text": " ".join(words[(i + j) % len(words)] for j in range(40))}) + "\n")

        seed_pp = [args.preprocess, "--input", "raw.json", "--output-prefix", "P", "--tokenizer-type", "GPT2Tokenizer",
                   "--vocab-file", "vocab.json", "--merge-file", "merges.txt", "--dataset-impl", "mmap"]
        rc, log = run(seed_pp, cwd=tmp)
        check("preprocess_data with the seed's spellings writes P_text_document", rc == 0 and os.path.exists(
            os.path.join(tmp, "P_text_document.idx")), log)
        rc, log = run([args.preprocess, "--input", "raw.json", "--output-prefix", "M", "--tokenizer-type",
                       "GPT2BPETokenizer", "--vocab-file", "vocab.json", "--merge-file", "merges.txt"], cwd=tmp)
        same = rc == 0 and all(filecmp.cmp(os.path.join(tmp, "P_text_document" + e), os.path.join(
            tmp, "M_text_document" + e), shallow=False) for e in (".bin", ".idx"))
        check("GPT2Tokenizer + --dataset-impl mmap write what GPT2BPETokenizer does", same, log)
        rc, log = run(seed_pp[:-1] + ["lazy"], cwd=tmp)
        check("--dataset-impl lazy is refused with a message", rc == 2 and "--dataset-impl lazy is not supported" in log
              and "only mmap" in log, log)
        rc, log = run(seed_pp[:6] + ["SentencePieceTokenizer"] + seed_pp[7:], cwd=tmp)
        check("another tokenizer is refused naming both GPT-2 spellings",
              rc == 2 and "GPT2BPETokenizer" in log and "GPT2Tokenizer" in log, log)

        with open(os.path.join(tmp, "tiny.yaml"), "w") as f:
            f.write(TINY.format(t=1, p=1, d=8))
        train_dir = os.path.dirname(os.path.abspath(args.train_gpt))
        seed_run = [args.launcher, "--num_gpus=8", f"--master_port={free_port()}", "./train_gpt",
                    "--model-config", os.path.join(tmp, "tiny.yaml"), "--train-data-path",
                    os.path.join(tmp, "P_text_document"), "--global-batch-size", "16",
                    "--deepspeed-config", os.path.join(tmp, "ds_config_small.json")]
        # The default run: 2 steps, each logged; --full (the examples_matrix label): 20 steps as
        # the seed's steps_per_print 10 logs them, and the loss falls between the two logs.
        iters, interval = ("20", "10") if args.full else ("2", "1")
        rc, log = run(seed_run + ["--train-iters", iters, "--log-interval", interval], cwd=train_dir)
        steps = re.findall(r"\[train_gpt\] step (\d+)/\d+ \| loss ([0-9.]+)", log)
        logged = ["10", "20"] if args.full else ["1", "2"]
        check("the seed's launch line trains on 8 ranks", rc == 0 and [s for s, _ in steps] == logged, log)
        check("--global-batch-size fills the auto: 16 = 2 per rank x 1 x 8 ranks",
              "global batch 16 = 2 x 1 x 8" in log, log)
        check("ZeRO-2 in fp16 from the seed's ds_config", "ZeRO stage 2, Half" in log, log)
        check("the model section's defaults: GPT-2's vocabulary padded to 50304",
              "L=2 h=64 heads=4 seq=32 vocab=50304" in log, log)
        check("a finite loss is logged", len(steps) == 2 and all(0 < float(l) < 20 for _, l in steps), log)
        if args.full:
            check("the loss falls", float(steps[1][1]) < float(steps[0][1]), log)
            rc, log = run(seed_run[:-4] + ["--global-batch-size", "16", "--deepspeed_config",
                                           os.path.join(tmp, "ds_config_small.json"), "--train-iters", "1"],
                          cwd=train_dir)
            check("--deepspeed_config is read as --deepspeed-config", rc == 0 and "global batch 16" in log, log)
        # Refusals happen before the ranks meet: 2 ranks suffice, with the data degree left to
        # the world (data_parallel_size 0).
        with open(os.path.join(tmp, "tiny_any.yaml"), "w") as f:
            f.write(TINY.format(t=1, p=1, d=0))
        with open(os.path.join(tmp, "ds_fixed.json"), "w") as f:
            f.write(open(os.path.join(tmp, "ds_config_small.json")).read().replace('"auto"', "32"))
        two = [a.replace("--num_gpus=8", "--num_gpus=2").replace("tiny.yaml", "tiny_any.yaml") for a in seed_run]
        rc, log = run(two[:-1] + [os.path.join(tmp, "ds_fixed.json"), "--train-iters", "1"], cwd=train_dir)
        check("a number in the ds_config against --global-batch-size: an error naming both",
              rc != 0 and "train_batch_size=32" in log and "--global-batch-size=16" in log, log)

        with open(os.path.join(tmp, "tiny222.yaml"), "w") as f:
            f.write(TINY.format(t=2, p=2, d=2))
        rc, log = run([a if a != os.path.join(tmp, "tiny.yaml") else os.path.join(tmp, "tiny222.yaml")
                       for a in seed_run] + ["--train-iters", "2", "--log-interval", "1"], cwd=train_dir)
        steps = re.findall(r"\[train_gpt\] step (\d+)/\d+ \| loss ([0-9.]+)", log)
        check("the seed's 2 x 2 x 2 layout trains on 8 ranks: pipeline 2 x data 2 x tensor 2",
              rc == 0 and [x for x, _ in steps] == ["1", "2"] and "pipeline 2 stages" in log
              and "x data 2 x tensor 2" in log and all(0 < float(l) < 20 for _, l in steps), log)
        # The zero-bubble schedules (split backward) on the seed's layout, in fp32 with 4
        # micro-batches and no dropout (ZB-V places the layers on other ranks, whose dropout
        # streams differ): the losses of 1F1B.
        with open(os.path.join(tmp, "tiny222_nodrop.yaml"), "w") as f:
            f.write(TINY.format(t=2, p=2, d=2).replace(
                "  seq_length: 32\n", "  seq_length: 32\n  hidden_dropout: 0.0\n  attention_dropout: 0.0\n"))
        with open(os.path.join(tmp, "ds_fp32.json"), "w") as f:
            f.write(open(os.path.join(tmp, "ds_config_small.json")).read()
                    .replace('"enabled": true, "loss_scale"', '"enabled": false, "loss_scale"')
                    .replace('"gradient_accumulation_steps": 1', '"gradient_accumulation_steps": 4'))
        schedules = {}
        for schedule in ("1f1b", "zb-h1", "zb-v"):
            cmd = [a if a != os.path.join(tmp, "tiny.yaml") else os.path.join(tmp, "tiny222_nodrop.yaml")
                   for a in seed_run[:-1]] + [os.path.join(tmp, "ds_fp32.json")]
            rc, log = run(cmd + ["--train-iters", "3", "--log-interval", "1", "--pipeline-schedule",
                                 schedule], cwd=train_dir)
            losses = [float(x) for _, x in re.findall(r"\[train_gpt\] step (\d+)/\d+ \| loss ([0-9.]+)", log)]
            schedules[schedule] = (rc, losses, log)
        rc_a, a, log_a = schedules["1f1b"]
        for schedule in ("zb-h1", "zb-v"):
            rc_b, b, log_b = schedules[schedule]
            check(f"the 2 x 2 x 2 layout trains with {schedule} as with 1f1b: fp32 losses within 1e-5",
                  rc_a == 0 and rc_b == 0 and len(a) == 3 and len(b) == 3
                  and all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b)),
                  f"1f1b {a}, {schedule} {b}\n{log_a[-2000:]}\n{log_b[-2000:]}")
        rc, log = run([args.train_gpt, "--dry-run", "--model-config", os.path.join(tmp, "tiny222.yaml")])
        check("--dry-run of the 2 x 2 x 2 tiny config", rc == 0 and "tensor groups    4 of 2: [0, 1] [2, 3] [4, 5] [6, 7]"
              in log, log)
        rc, log = run([args.train_gpt, "--dry-run", "--model-config", os.path.join(args.configs, "1.3B_demo.yaml"),
                       "--deepspeed-config", os.path.join(tmp, "ds_config_small.json"), "--global-batch-size", "256"])
        check("--dry-run of 1.3B_demo with the seed's ds_config: micro-batch 128 = 256 / 2 data ranks, ZeRO-2 marked",
              rc == 0 and "parameters: 1,315,819,520" in log and "micro-batch 128" in log
              and "<- the ds_config's stage" in log, log)
        rc, log = run([args.train_gpt, "--dry-run", "--model-config", os.path.join(args.configs, "535B_model.yaml")])
        check("--dry-run of the 535B layout: 8 x 16 x 64 = 8192 ranks",
              rc == 0 and "tensor 8 x pipeline 16 x data 64 = 8192 ranks" in log, log)
    if FAILED:
        print(f"{len(FAILED)} check(s) failed: {FAILED}")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
