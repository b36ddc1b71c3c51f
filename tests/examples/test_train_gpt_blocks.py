"""train_gpt with the current models' blocks, through the launcher on CPU ranks.

A tiny Llama-style model config (RMSNorm, rope, SwiGLU, grouped-query attention, no linear
bias, untied head under Megatron's key) trains on 2 data ranks at ZeRO 1, and at ZeRO 3 (the
LayerSpec form), with the same losses, lr and grad norms as on one rank; on a pipeline of 2
stages as on one rank with --seed-layers (the pipeline's weights); a tensor degree of 2 is
refused naming the first key the tensor-parallel GPT lacks, and so is converting the model to
Hugging Face's GPT-2 format (tools/convert_checkpoint --to hf).
Last line: "N passed, M failed"; exits non-zero on any failure.
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

passed = 0
failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name}\n{detail[-3000:]}")


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


def step_values(log):
    """(loss, lr, grad norm) of each step line."""
    return [m.groups() for m in re.finditer(
        r"\[train_gpt\] step \d+/\d+ \| loss (\S+) \| lr (\S+) \| grad norm (\S+)", log)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    ap.add_argument("--convert", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "tokens")
        megatron_format.write(prefix, [[[(7 * i + j) % 64 for j in range(40)]] for i in range(16)],
                              "uint16")
        llama = {"hidden_size": 32, "num_layers": 2, "num_attention_heads": 4, "seq_length": 8,
                 "vocab_size": 64, "ffn_hidden_size": 48, "hidden_dropout": 0.0,
                 "attention_dropout": 0.0, "normalization": "RMSNorm",
                 "position_embedding_type": "rope", "swiglu": True, "num_query_groups": 2,
                 "add_bias_linear": False, "untie_embeddings_and_output_weights": True}
        model = write_json(os.path.join(tmp, "llama.json"), llama)
        piped = write_json(os.path.join(tmp, "llama_pp2.json"),
                           dict(llama, parallelism={"pipeline_model_parallel_size": 2}))

        def ds(stage):
            return write_json(os.path.join(tmp, f"ds{stage}.json"), {
                "steps_per_print": 1 << 30, "zero_optimization": {"stage": stage},
                "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
                "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.0}}})

        def run(ranks, stage, *extra, config=model):
            cmd = [args.launcher, "--num_gpus", str(ranks), "--master_port", str(free_port()),
                   args.train_gpt, "--model-config", config, "--data-path", prefix,
                   "--deepspeed_config", ds(stage), "--train-iters", "4", "--log-interval", "1",
                   "--seed", "7", *extra]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            return p.returncode, p.stdout + p.stderr

        rc1, log1 = run(1, 1)
        one = step_values(log1)
        check("one rank trains 4 steps, the loss falling",
              rc1 == 0 and len(one) == 4 and float(one[-1][0]) < float(one[0][0]), log1)
        rc2, log2 = run(2, 1)
        check("2 data ranks at ZeRO 1: one rank's lines", rc2 == 0 and step_values(log2) == one,
              log2 + "\n---\n" + log1)
        rc3, log3 = run(2, 3)
        check("2 data ranks at ZeRO 3 (the LayerSpec form): one rank's lines",
              rc3 == 0 and step_values(log3) == one, log3 + "\n---\n" + log1)
        rc_s, log_s = run(1, 1, "--seed-layers")
        rc_p, log_p = run(2, 1, config=piped)
        seeded = step_values(log_s)
        check("a pipeline of 2 stages: one rank's --seed-layers losses",
              rc_s == 0 and rc_p == 0 and len(seeded) == 4
              and [v[0] for v in step_values(log_p)] == [v[0] for v in seeded],
              log_p + "\n---\n" + log_s)
        rc_t, log_t = run(2, 1, "--tensor-model-parallel-size", "2")
        check("a tensor degree of 2 is refused by the first key it lacks",
              rc_t != 0 and "normalization: expected GPT-2's block" in log_t
              and 'does not implement normalization = "RMSNorm"' in log_t, log_t)
        weights = os.path.join(tmp, "w.pt")
        with open(weights, "wb") as f:
            f.write(b"not read: the config is refused first")
        p = subprocess.run([args.convert, "--to", "hf", "--input", weights, "--model-config", model,
                            "--output", os.path.join(tmp, "hf")], capture_output=True, text=True)
        check("convert_checkpoint --to hf refuses the blocks GPT-2's format lacks, by key",
              p.returncode != 0 and 'normalization = "RMSNorm" has no place in Hugging Face\'s GPT-2'
              in p.stderr and not os.path.exists(os.path.join(tmp, "hf")), p.stdout + p.stderr)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
