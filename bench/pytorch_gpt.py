#!/usr/bin/env python3
"""The PyTorch reference dscpp's GPT throughput is compared with, run beside it on the same machine.

    torchrun --nproc_per_node 2 bench/pytorch_gpt.py --model-config bench/configs/gpt_1.3B_bench.json \
        --mode fsdp2|ddp --micro-batch 8 --steps 20 --warmup 10 [--compile]
    python3 bench/pytorch_gpt.py --model-config ... --mode single [--compile | --compile-whole]  # one GPU
    python3 bench/pytorch_gpt.py ... --mode single --compile-whole --float8 tensorwise|rowwise  # torchao

Plain PyTorch as a user would write it: the same GPT as model_zoo's (pre-LN,
tanh GELU, learned positions, tied embeddings, SDPA causal attention), bf16 autocast with fp32
weights for DDP/single, FSDP2 with bf16 parameters and fp32 gradient reduction, fused AdamW.
The model config's checkpoint_activations recomputes each block in backward, as train_gpt does.
--compile wraps each transformer block in torch.compile (before DDP/fully_shard wraps it, as
torchtitan does, so FSDP2's hooks stay outside the compiled graphs); --compile-whole (one GPU)
compiles the whole model with its loss as one function, what a performance engineer would set
against a fused runtime. Random tokens.

Timing starts after --warmup steps (compilation happens inside them) and ends with a device
synchronisation. Rank 0 prints one machine-readable line (read by bench/row_logs.py):
    pytorch mode=M compile=0|1|2 gpus=N micro_batch=B seq=S steps=K params=P
        tokens_per_s_per_gpu=X tflops_per_gpu=Y peak_mem_gib=Z steady_peak_mem_gib=W loss=L secs=T
TFLOP/s count 6N + 12*L*h*s per token (the formula train_gpt uses); peak_mem_gib is the
caching allocator's peak allocated bytes over the whole run (as train_gpt reports), steady_*
the peak over the timed steps only. compile: 0 eager, 1 blocks, 2 whole model and loss."""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):

    def __init__(self, h, heads, ffn, eps):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(h, eps=eps), nn.LayerNorm(h, eps=eps)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc, self.out = nn.Linear(h, ffn), nn.Linear(ffn, h)
        self.heads = heads

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln_1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(a)
        return x + self.out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


def checkpoint_blocks(model):
    """Recompute each block in backward (non-reentrant), as train_gpt's checkpoint_activations."""
    from torch.utils.checkpoint import checkpoint
    for b in model.blocks:
        b.forward = (lambda f: lambda x: checkpoint(f, x, use_reentrant=False))(b.forward)


class GPT(nn.Module):

    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.wte = nn.Embedding(c["vocab_size"], h)
        self.wpe = nn.Embedding(c.get("max_position_embeddings", c["seq_length"]), h)
        self.blocks = nn.ModuleList(
            Block(h, c["num_attention_heads"], c.get("ffn_hidden_size", 4 * h), c.get("layernorm_epsilon", 1e-5))
            for _ in range(c["num_layers"]))
        self.ln_f = nn.LayerNorm(h, eps=c.get("layernorm_epsilon", 1e-5))
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", required=True)
    ap.add_argument("--mode", choices=["single", "ddp", "fsdp2"], default="fsdp2")
    ap.add_argument("--compile", action="store_true", help="torch.compile each transformer block")
    ap.add_argument("--compile-whole", action="store_true",
                    help="torch.compile the whole model and its loss as one function (--mode single)")
    ap.add_argument("--float8", choices=["tensorwise", "rowwise"],
                    help="torchao's float8 training of the blocks' linears (the first and last block "
                         "and the head stay bf16, as dscpp's default fp8 keeps them)")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=10)
    args = ap.parse_args()
    with open(args.model_config) as f:
        c = json.load(f)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.mode == "single" and world > 1:
        raise SystemExit("--mode single runs on one GPU: start it with python3, not torchrun with several ranks")
    if args.compile_whole and (args.mode != "single" or args.compile):
        raise SystemExit("--compile-whole is the one-GPU row (--mode single), without --compile")
    torch.cuda.set_device(local)
    distributed = args.mode != "single"
    if distributed:
        # DDP and FSDP2 need a process group even on one GPU (the 1-GPU row of a scaling
        # pair); started by plain python3, the group is this process alone.
        for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29731"), ("RANK", "0"), ("WORLD_SIZE", "1")):
            os.environ.setdefault(k, v)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    torch.manual_seed(0)
    model = GPT(c).cuda()
    if c.get("checkpoint_activations", False):
        checkpoint_blocks(model)
    n_params = sum(p.numel() for p in model.parameters())
    if args.float8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        last = c["num_layers"] - 1

        def inner_block_linear(mod, fqn):
            parts = fqn.split(".")
            return (isinstance(mod, nn.Linear) and parts[0] == "blocks" and 0 < int(parts[1]) < last
                    and mod.in_features % 16 == 0 and mod.out_features % 16 == 0)

        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(args.float8),
                                   module_filter_fn=inner_block_linear)
    if args.compile:
        # Per block, before any wrapper: the 24 blocks share one compiled graph (their
        # parameters are graph inputs), and DDP's/FSDP2's communication stays eager around them.
        for i, b in enumerate(model.blocks):
            model.blocks[i] = torch.compile(b)
    autocast = True
    if args.mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local])
    elif args.mode == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for b in model.blocks:
            fully_shard(b, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        autocast = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    seq, vocab = c["seq_length"], c["vocab_size"]

    def forward_loss(ids):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = model(ids[:, :-1])
        return F.cross_entropy(logits.float().view(-1, vocab), ids[:, 1:].reshape(-1))

    if args.compile_whole:
        forward_loss = torch.compile(forward_loss)
    ids = torch.randint(0, vocab, (args.micro_batch, seq + 1), device="cuda")
    flops_per_token = 6 * n_params + 12 * c["num_layers"] * c["hidden_size"] * seq
    torch.cuda.reset_peak_memory_stats()
    run_peak = 0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            torch.cuda.synchronize()
            run_peak = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
        loss = forward_loss(ids)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    steady_peak = torch.cuda.max_memory_allocated()
    tps = args.steps * args.micro_batch * seq / secs
    if rank == 0:
        print(f"pytorch mode={args.mode} compile={2 if args.compile_whole else int(args.compile)} gpus={world} micro_batch={args.micro_batch} "
              f"seq={seq} steps={args.steps} params={n_params} tokens_per_s_per_gpu={tps:.1f} "
              f"tflops_per_gpu={tps * flops_per_token / 1e12:.2f} "
              f"peak_mem_gib={max(run_peak, steady_peak) / 2**30:.3f} steady_peak_mem_gib={steady_peak / 2**30:.3f} "
              f"loss={loss.item():.4f} secs={secs:.3f}",
              flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
