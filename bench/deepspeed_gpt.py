#!/usr/bin/env python3
"""DeepSpeed itself as a row of the GPT table: the same GPT as bench/pytorch_gpt.py (and as
model_zoo's), trained by deepspeed.initialize from the same ds_config file dscpp reads.

    python3 bench/deepspeed_gpt.py --model-config bench/configs/gpt_1.3B_bench.json \
        --deepspeed_config ds_configs/gpt_bf16_zero2.json --adam fused|torch --steps 20 --warmup 10
    torchrun --nproc_per_node 2 bench/deepspeed_gpt.py ...        # two GPUs

--adam picks DeepSpeed's Adam for the config's Adam/AdamW: `fused` is its own FusedAdam (JIT-built
on first use: TORCH_CUDA_ARCH_LIST=9.0 on an H200, whose 9.0a DeepSpeed 0.19.8 cannot parse),
`torch` sets the optimizer's `torch_adam` (torch.optim.AdamW(fused=True) inside DeepSpeed). The
ds_config is otherwise used as written; micro-batch and accumulation come from it. Random
tokens. The model config's checkpoint_activations recomputes each block in backward
(torch.utils.checkpoint, non-reentrant), as train_gpt does.

Timing starts after --warmup steps and ends with a device synchronisation, as in
pytorch_gpt.py. Rank 0 prints one machine-readable line (read by bench/row_logs.py):
    deepspeed stage=S adam=fused|torch gpus=N micro_batch=B seq=S steps=K params=P
        tokens_per_s_per_gpu=X tflops_per_gpu=Y peak_mem_gib=Z steady_peak_mem_gib=W loss=L secs=T"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_gpt import GPT, checkpoint_blocks  # noqa: E402  the one model both references train


def strip_comments(text):
    """ds_config files may hold // comments (dscpp and DeepSpeed's hjson-free reader differ)."""
    out = []
    for line in text.splitlines():
        in_str, i = False, 0
        while i < len(line):
            if line[i] == '"' and (i == 0 or line[i - 1] != "\\"):
                in_str = not in_str
            if not in_str and line.startswith("//", i):
                line = line[:i]
                break
            i += 1
        out.append(line)
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-config", required=True)
    ap.add_argument("--deepspeed_config", required=True)
    ap.add_argument("--adam", choices=["fused", "torch"], default="fused")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--local_rank", type=int, default=0)  # the deepspeed launcher's
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda:  # a smoke run on a CPU machine: DeepSpeed's CPU accelerator over Gloo
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed  # after argparse: --help works without DeepSpeed

    with open(args.model_config) as f:
        c = json.load(f)
    with open(args.deepspeed_config) as f:
        ds = json.loads(strip_comments(f.read()))
    opt = ds.get("optimizer")
    if opt and opt.get("type", "").lower() in ("adam", "adamw"):
        # Only when asked: ZenFlow hands the optimizer's params to torch's AdamW, which takes
        # no torch_adam keyword (DeepSpeed 0.19.8).
        if args.adam == "torch":
            opt.setdefault("params", {})["torch_adam"] = True
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29741"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                 ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    local = int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local)
    deepspeed.init_distributed("nccl" if cuda else "gloo")
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    torch.manual_seed(0)
    stage = ds.get("zero_optimization", {}).get("stage", 0)
    # Built whole, then partitioned by initialize (as dscpp's engine does with a whole module):
    # under deepspeed.zero.Init the model's own normal_ initialisation would see empty
    # partitioned tensors and leave PyTorch's default initialisation in place.
    model = GPT(c)
    n_params = sum(p.numel() for p in model.parameters())
    if c.get("checkpoint_activations", False):
        checkpoint_blocks(model)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    micro = engine.train_micro_batch_size_per_gpu()
    accum = engine.gradient_accumulation_steps()
    seq, vocab = c["seq_length"], c["vocab_size"]
    ids = torch.randint(0, vocab, (micro, seq + 1), device=engine.device)
    flops_per_token = 6 * n_params + 12 * c["num_layers"] * c["hidden_size"] * seq
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    peak = torch.cuda.max_memory_allocated if cuda else (lambda: 0)
    reset_peak = torch.cuda.reset_peak_memory_stats if cuda else (lambda: None)
    reset_peak()
    run_peak = 0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            sync()
            run_peak = peak()
            reset_peak()
            t0 = time.perf_counter()
        for _ in range(accum):
            logits = engine(ids[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, vocab), ids[:, 1:].reshape(-1))
            engine.backward(loss)
            engine.step()
    sync()
    secs = time.perf_counter() - t0
    steady_peak = peak()
    tps = args.steps * accum * micro * seq / secs
    if rank == 0:
        print(f"deepspeed stage={stage} adam={args.adam} gpus={world} micro_batch={micro} seq={seq} "
              f"steps={args.steps} params={n_params} tokens_per_s_per_gpu={tps:.1f} "
              f"tflops_per_gpu={tps * flops_per_token / 1e12:.2f} "
              f"peak_mem_gib={max(run_peak, steady_peak) / 2**30:.3f} steady_peak_mem_gib={steady_peak / 2**30:.3f} "
              f"loss={loss.item():.4f} secs={secs:.3f} deepspeed_version={deepspeed.__version__}",
              flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
