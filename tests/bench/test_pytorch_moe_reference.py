"""bench/pytorch_moe_gpt.py is the same model as dscpp's MoE GPT (its PyTorch reference).

gpt_export builds dscpp's GPT from a MoE model config, runs a forward and backward on a random
batch in fp32 on the CPU and writes the weights, the batch, the logits, the loss and every
gradient. The reference model, built from the same config, must take those weights under the
same names (only its buffers, the expert biases and routing counts, are not dscpp parameters),
count the same parameters, and give the same logits, loss and gradients to fp32 accuracy: the
same blocks, the same routing (top-k choices, normalised combine weights), the same experts and
shared experts. Cases: sigmoid scores with the expert bias, top-3 of 8, grouped-query attention,
a dense block beside the MoE one, untied head (moe_1gpu's kind); softmax top-2, multi-head
attention, LayerNorm, tied embeddings, every block MoE. Then the script itself runs two steps on
the CPU (eager, fp32) and prints its line, and for model_zoo/configs/moe_1gpu.yaml its counts
(on the meta device: no memory) are train_gpt's (6.92 B parameters, 1.28 B active).
Last line: "N passed, M failed"; exits non-zero on any failure.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import pytorch_moe_gpt as ref  # noqa: E402

passed = 0
failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def config_of(flat, workdir, name):
    """The reference's config from the same keys (written as YAML with a model: section)."""
    path = os.path.join(workdir, name + ".json")
    with open(path, "w") as f:
        json.dump({"model": flat}, f)
    return ref.load_config(path)


def run_case(exe, name, flat, workdir):
    out = os.path.join(workdir, name + ".pt")
    options = {"config": flat, "batch": 2, "seq": flat["seq_length"], "seed": 7, "train": True}
    r = subprocess.run([exe, json.dumps(options), out], capture_output=True, text=True)
    if r.returncode != 0:
        check(name + " export", False, r.stderr)
        return
    got = torch.load(out)
    model = ref.GPT(config_of(flat, workdir, name))
    result = model.load_state_dict(got["state"], strict=False)
    buffers = {n for n, _ in model.named_buffers()}
    check(name + " names", not result.unexpected_keys and set(result.missing_keys) <= buffers,
          f"unexpected {result.unexpected_keys}, missing {result.missing_keys}")
    total, _ = ref.parameter_counts(model, model.c)
    check(name + " parameter count", total == got["num_parameters"], f"{total} vs {got['num_parameters']}")
    model.train()
    logits = model(got["input_ids"])
    loss = ref.loss_of(logits, got["targets"])
    loss.backward()
    err = rel_err(logits.detach(), got["logits"])
    check(name + " logits", err < 1e-5, f"relative error {err:.3g}")
    lerr = abs(loss.item() - got["loss"].item()) / got["loss"].item()
    check(name + " loss", lerr < 1e-6, f"relative error {lerr:.3g}")
    grads = dict(model.named_parameters())
    worst, where = 0.0, ""
    for k, g in got["grads"].items():
        e = rel_err(grads[k].grad, g)
        if e > worst:
            worst, where = e, k
    check(name + " gradients", worst < 1e-4, f"worst relative error {worst:.3g} at {where}")
    print(f"{name}: logits {err:.2g}, loss {lerr:.2g}, worst gradient {worst:.2g} ({where})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--export", required=True, help="tests/model_zoo's gpt_export")
    args = ap.parse_args()
    torch.manual_seed(0)
    base = {"hidden_size": 64, "num_layers": 2, "num_attention_heads": 4, "seq_length": 16,
            "vocab_size": 97, "hidden_dropout": 0.0, "attention_dropout": 0.0, "add_bias_linear": False,
            "swiglu": True, "ffn_hidden_size": 96, "position_embedding_type": "rope", "init_method_std": 0.05,
            "num_experts": 8, "moe_ffn_hidden_size": 32, "moe_shared_expert_intermediate_size": 32,
            "moe_router_load_balancing_type": "none", "moe_aux_loss_coeff": 0.0}
    cases = {
        "sigmoid_top3_gqa": dict(base, num_query_groups=2, normalization="RMSNorm", rotary_base=500000,
                                 untie_embeddings_and_output_weights=True, moe_router_topk=3,
                                 moe_layer_freq=[1, 0], moe_router_score_function="sigmoid",
                                 moe_router_enable_expert_bias=True),
        "softmax_top2_mha": dict(base, normalization="LayerNorm", moe_router_topk=2, moe_layer_freq=1,
                                 moe_router_score_function="softmax"),
    }
    with tempfile.TemporaryDirectory() as workdir:
        for name, flat in cases.items():
            run_case(args.export, name, flat, workdir)
        yaml_cfg = os.path.join(workdir, "tiny.json")
        with open(yaml_cfg, "w") as f:
            json.dump({"model": cases["sigmoid_top3_gqa"]}, f)
        r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "pytorch_moe_gpt.py"), "--model-config",
                            yaml_cfg, "--device", "cpu", "--dtype", "fp32", "--no-compile", "--micro-batch", "2",
                            "--accumulation", "2", "--warmup", "1", "--steps", "2"],
                           capture_output=True, text=True, env=dict(os.environ, PYTORCH_MOE_GPT_THREADS="1"))
        line = re.search(r"^pytorch_moe mode=single compile=0 gpus=1 micro_batch=2 accumulation=2 seq=16 steps=2 "
                         r"params=\d+ active_params=\d+ tokens_per_s_per_gpu=(\S+) .* loss=(\S+) secs=\S+ "
                         r"load_balance=(\S+) load_balance_worst=(\S+)$",
                         r.stdout, re.M)
        check("script runs on the CPU", r.returncode == 0 and line is not None
              and float(line[1]) > 0 and 0 < float(line[2]) < 10
              and 1 <= float(line[3]) <= float(line[4]), r.stdout + r.stderr)
    c = ref.load_config(os.path.join(ROOT, "model_zoo", "configs", "moe_1gpu.yaml"))
    with torch.device("meta"):
        total, active = ref.parameter_counts(ref.GPT(c), c)
    # train_gpt --dry-run --model-config model_zoo/configs/moe_1gpu.yaml (docs/model_zoo.md).
    check("moe_1gpu counts", (total, active) == (6919096320, 1281951744), f"{total}, {active}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
