#!/usr/bin/env python3
"""DeepSpeed's own flops profiler on model_zoo's GPT written in PyTorch, as the oracle for
dscpp's profiler report.

    python ds_flops_profile.py --model-config gpt_tiny.json --seq S --batch B --out report.txt

The model has model_zoo's module names and classes (GPT, GPTEmbedding, GPTBlock, GPTAttention,
GPTMLP; nn.LayerNorm, nn.Linear, nn.Embedding; the head multiplies by the tied token
embedding), dropout off. DeepSpeed's engine (CPU accelerator, one Gloo rank, fp32, SGD) trains
it with flops_profiler enabled at profile_step 1 and writes its report to --out; the one
training step before it is the warm-up DeepSpeed's docs ask for."""
import argparse
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
for k, v in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
    os.environ.setdefault(k, v)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # tests/
from rank_exit import exit_rank  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class GPTEmbedding(nn.Module):

    def __init__(self, c):
        super().__init__()
        self.word = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.position = nn.Embedding(c.get("max_position_embeddings", c["seq_length"]), c["hidden_size"])

    def forward(self, ids):
        return self.word(ids) + self.position(torch.arange(ids.shape[1]))


class GPTAttention(nn.Module):

    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.heads = c["num_attention_heads"]

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class GPTMLP(nn.Module):

    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        ffn = c.get("ffn_hidden_size", 4 * h)
        self.fc, self.proj = nn.Linear(h, ffn), nn.Linear(ffn, h)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class GPTBlock(nn.Module):

    def __init__(self, c):
        super().__init__()
        h, eps = c["hidden_size"], c.get("layernorm_epsilon", 1e-5)
        self.ln_1, self.attn = nn.LayerNorm(h, eps=eps), GPTAttention(c)
        self.ln_2, self.mlp = nn.LayerNorm(h, eps=eps), GPTMLP(c)

    def forward(self, x):
        h = x + self.attn(self.ln_1(x))
        return h + self.mlp(self.ln_2(h))


class GPT(nn.Module):

    def __init__(self, c):
        super().__init__()
        self.embedding = GPTEmbedding(c)
        self.blocks = nn.ModuleList(GPTBlock(c) for _ in range(c["num_layers"]))
        self.final_norm = nn.LayerNorm(c["hidden_size"], eps=c.get("layernorm_epsilon", 1e-5))

    def forward(self, ids):
        x = self.embedding(ids)
        for b in self.blocks:
            x = b(x)
        return F.linear(self.final_norm(x), self.embedding.word.weight)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.model_config) as f:
        c = json.load(f)
    import deepspeed
    os.environ.setdefault("MASTER_PORT", "29641")
    torch.manual_seed(0)
    model = GPT(c)
    ds_config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
        "steps_per_print": 1 << 30,
        "flops_profiler": {"enabled": True, "profile_step": 1, "module_depth": -1, "top_modules": 1,
                           "detailed": True, "output_file": args.out},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config,
                                           dist_init_required=True)
    ids = torch.randint(0, c["vocab_size"], (args.batch, args.seq + 1))
    for _ in range(2):
        logits = engine(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
    exit_rank()  # see tests/rank_exit.py


if __name__ == "__main__":
    main()
