"""dscpp's GPT against an independent reference written here with PyTorch's Python math.

gpt_export builds a GPT from a config, runs a forward and backward on a random batch and
writes the weights, the batch, the logits, the loss and the gradients. This script rebuilds the
model from the weights alone, in float64, with the formulas written out: LayerNorm from mean and
variance, attention as softmax(q k^T / sqrt(d) + causal mask) v, GELU as its tanh or erf
formula, cross entropy from log-softmax. Our fp32 logits, loss and every gradient must agree
with it to fp32 accuracy; the parameter names, shapes and count must be as documented.
Last line: "N passed, M failed"; exits non-zero on any failure.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import torch

passed = 0
failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def gelu(x, approximation):
    if approximation == "tanh":
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def linear(x, w, b=None):
    y = x @ w.t()
    return y if b is None else y + b


def reference_logits(p, cfg, ids):
    """GPT-2 / Megatron decoder, pre-LayerNorm, from the weights `p` (name -> tensor)."""
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    d = h // heads
    eps = cfg.get("layernorm_epsilon", 1e-5)
    approx = cfg.get("gelu_approximation", "tanh")
    batch, seq = ids.shape
    x = p["embedding.word.weight"][ids] + p["embedding.position.weight"][:seq]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    for i in range(cfg["num_layers"]):
        q = f"blocks.{i}."
        a = layer_norm(x, p[q + "ln_1.weight"], p[q + "ln_1.bias"], eps)
        qkv = linear(a, p[q + "attn.qkv.weight"], p[q + "attn.qkv.bias"])
        split = [t.reshape(batch, seq, heads, d).transpose(1, 2) for t in qkv.split(h, dim=-1)]
        scores = split[0] @ split[1].transpose(-1, -2) / math.sqrt(d)
        scores = scores.masked_fill(~causal, float("-inf"))
        y = (scores.softmax(-1) @ split[2]).transpose(1, 2).reshape(batch, seq, h)
        x = x + linear(y, p[q + "attn.proj.weight"], p[q + "attn.proj.bias"])
        m = layer_norm(x, p[q + "ln_2.weight"], p[q + "ln_2.bias"], eps)
        m = gelu(linear(m, p[q + "mlp.fc.weight"], p[q + "mlp.fc.bias"]), approx)
        x = x + linear(m, p[q + "mlp.proj.weight"], p[q + "mlp.proj.bias"])
    x = layer_norm(x, p["final_norm.weight"], p["final_norm.bias"], eps)
    tied = cfg.get("tie_word_embeddings", True)
    return linear(x, p["embedding.word.weight"] if tied else p["head.weight"])


def cross_entropy(logits, targets):
    logp = logits.reshape(-1, logits.shape[-1]).log_softmax(-1)
    return -logp.gather(1, targets.reshape(-1, 1)).mean()


def expected_names(cfg):
    names = ["embedding.word.weight", "embedding.position.weight"]
    for i in range(cfg["num_layers"]):
        for part in ["ln_1", "attn.qkv", "attn.proj", "ln_2", "mlp.fc", "mlp.proj"]:
            names += [f"blocks.{i}.{part}.weight", f"blocks.{i}.{part}.bias"]
    names += ["final_norm.weight", "final_norm.bias"]
    if not cfg.get("tie_word_embeddings", True):
        names.append("head.weight")
    return names


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def run_case(exe, name, options, workdir):
    out = os.path.join(workdir, name + ".pt")
    r = subprocess.run([exe, json.dumps(options), out], capture_output=True, text=True)
    if r.returncode != 0:
        check(name + " export", False, r.stderr)
        return
    got = torch.load(out)  # weights_only=True, PyTorch's default
    cfg = options["config"]
    state = got["state"]
    check(name + " parameter names", list(state.keys()) == expected_names(cfg),
          f"{list(state.keys())}")
    numel = sum(t.numel() for t in state.values())
    check(name + " num_parameters", got["num_parameters"] == numel,
          f"{got['num_parameters']} vs {numel}")
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    ffn = cfg.get("ffn_hidden_size", 4 * h)
    check(name + " shapes",
          state["blocks.0.attn.qkv.weight"].shape == (3 * h, h)
          and state["blocks.0.mlp.fc.weight"].shape == (ffn, h)
          and state["embedding.word.weight"].shape == (v, h)
          and state["embedding.position.weight"].shape
          == (cfg.get("max_position_embeddings", cfg.get("seq_length")), h))

    params = {k: t.double().requires_grad_() for k, t in state.items()}
    logits = reference_logits(params, cfg, got["input_ids"])
    loss = cross_entropy(logits, got["targets"])
    loss.backward()

    check(name + " logits dtype", got["logits"].dtype == torch.float32)
    err = rel_err(got["logits"], logits.detach())
    check(name + " logits", err < 2e-6, f"relative error {err:.3g}")
    lerr = abs(got["loss"].item() - loss.item()) / loss.item()
    check(name + " loss", lerr < 1e-6, f"relative error {lerr:.3g}")
    worst = max(rel_err(got["grads"][k], params[k].grad) for k in state)
    check(name + " gradients", worst < 2e-5, f"worst relative error {worst:.3g}")
    print(f"{name}: logits {err:.2g}, loss {lerr:.2g}, worst gradient {worst:.2g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--export", required=True)
    args = ap.parse_args()
    base = {"hidden_size": 48, "num_layers": 2, "num_attention_heads": 4, "seq_length": 16,
            "vocab_size": 97, "hidden_dropout": 0.0, "attention_dropout": 0.0}
    cases = {
        "tied_tanh": dict(base),
        "untied_erf_ffn": dict(base, tie_word_embeddings=False, gelu_approximation="none",
                               ffn_hidden_size=80, layernorm_epsilon=1e-3),
        "longer_position_table": dict(base, max_position_embeddings=40, num_layers=3),
        # Dropout configured but the model in eval mode: no dropout is applied.
        "eval_mode": dict(base, hidden_dropout=0.1, attention_dropout=0.1),
        "checkpointed": dict(base, checkpoint_activations=True, num_layers=3),
    }
    with tempfile.TemporaryDirectory() as workdir:
        for name, cfg in cases.items():
            run_case(args.export, name,
                     {"config": cfg, "batch": 3, "seq": 12 if name != "tied_tanh" else 16,
                      "seed": 5, "train": name != "eval_mode"}, workdir)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
