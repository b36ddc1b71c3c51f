#!/usr/bin/env python3
"""The PyTorch reference of dscpp's MoE GPT, run beside train_gpt on the same machine.

    python3 bench/pytorch_moe_gpt.py --model-config model_zoo/configs/moe_1gpu.yaml \
        --data-path .gpu/corpus/fortunes_text_document --micro-batch 4 --accumulation 2 \
        --warmup 8 --steps 4 [--no-compile] [--fallback-micro-batch 2]
    python3 bench/pytorch_moe_gpt.py --model-config CFG --device cpu --dtype fp32 ...  # smoke run

The same model as model_zoo's MoE GPT built from the same model config (its module names are
dscpp's state-dict names, so tests/bench/test_pytorch_moe_reference.py loads dscpp's weights
into it and checks logits, loss and gradients): pre-norm blocks (RMSNorm or LayerNorm), rotary
positions (Megatron's rotate-half), grouped-query SDPA causal attention over a fused qkv
projection laid out [q | k | v], untied or tied head; each MoE layer a router in fp32 (softmax
or sigmoid scores, the expert bias added for selection only, top-k, combine weights normalised
over the chosen for k > 1, dropless), routed SwiGLU experts as two `torch._grouped_mm`
products behind a sort-based dispatch (a stable argsort of the chosen experts, rows gathered
expert-major, the outputs put back into route order and summed with their weights in fp32),
and the shared expert beside them. Megatron's initialisation as model_zoo's. The expert biases
move after each optimizer step by rate * sign(mean - count), as train_gpt does.

What a performance engineer would run: fp32 weights under bf16 autocast (the dense rows'
convention, bench/pytorch_gpt.py), fused AdamW with the ds_config's settings (lr 3e-4, betas
0.9/0.95, eps 1e-8, weight decay 0.1), gradient clipping at 1.0, the micro-batches of one step
accumulated as train_gpt does; each block compiled with torch.compile (the blocks share one
graph) and the final norm, head and loss compiled as one function (--no-compile: eager).
Not supported (refused with the key's name): capacity factors (token dropping), LatentMoE,
group-limited routing, aux / z losses with a non-zero coefficient, dropout, biases, learned
positions, GELU experts.

Data: windows of seq + 1 tokens at seeded random offsets of the Megatron indexed dataset at
--data-path (train_gpt's corpus), random tokens without one. Timing starts after --warmup steps
(compilation happens inside them) and each interval ends with a device synchronisation. With
--fallback-micro-batch, a first step that runs out of memory is retried at that micro-batch
(accumulation raised to keep the global batch) and the line says so; a first step whose
compilation fails runs again eager (compile=0 compile_failed=1, the error on the line before).
One line, read by
scripts/gpu_rows.py (the row moe1gpu-pt-compile):
    pytorch_moe mode=single compile=0|1 gpus=1 micro_batch=B accumulation=G seq=S steps=K
        params=P active_params=A tokens_per_s_per_gpu=X tflops_per_gpu=Y mfu=M
        peak_mem_gib=Z loss=L secs=T [load_balance=R load_balance_worst=W]
        [oom_at_micro_batch=B0] [compile_failed=1]
(load_balance: the last step's max/mean routes per expert over the MoE layers, train_gpt's.)
TFLOP/s count 6 * active parameters + 12 * L * h * s per token (train_gpt's formula for the MoE
GPT); MFU is against 989 TFLOP/s (--peak-tflops)."""
import argparse
import gc
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# model_zoo's GPTConfig defaults for the keys a config may leave out.
DEFAULTS = {
    "layernorm_epsilon": 1e-5, "init_method_std": 0.02, "rotary_base": 10000.0, "rotary_percent": 1.0,
    "normalization": "LayerNorm", "position_embedding_type": "learned_absolute", "swiglu": False,
    "add_bias_linear": True, "untie_embeddings_and_output_weights": False, "hidden_dropout": 0.1,
    "attention_dropout": 0.1, "num_experts": 0, "moe_router_topk": 2, "moe_layer_freq": 1,
    "moe_shared_expert_intermediate_size": 0, "moe_router_score_function": "softmax",
    "moe_router_enable_expert_bias": False, "moe_router_bias_update_rate": 1e-3,
    "moe_router_topk_scaling_factor": 1.0, "moe_aux_loss_coeff": 0.0, "moe_z_loss_coeff": 0.0,
    "moe_router_load_balancing_type": "aux_loss",
}


def load_config(path):
    """A model config (JSON or YAML, flat or with a `model:` section) with model_zoo's defaults."""
    with open(path) as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml
        raw = yaml.safe_load(text)
    else:
        raw = json.loads(text)
    flat = dict(raw.get("model", raw)) if isinstance(raw.get("model"), dict) else dict(raw)
    c = dict(DEFAULTS)
    c.update({k: v for k, v in flat.items() if v is not None})
    h = c["hidden_size"]
    c.setdefault("num_query_groups", c["num_attention_heads"])
    if not c.get("ffn_hidden_size"):
        c["ffn_hidden_size"] = 4 * h * 2 // 3 // 64 * 64 if c["swiglu"] else 4 * h
    if not c.get("moe_ffn_hidden_size"):
        c["moe_ffn_hidden_size"] = c["ffn_hidden_size"]
    refuse = {
        "moe_expert_capacity_factor": lambda v: v is not None and v > 0,
        "moe_latent_size": lambda v: bool(v),
        "moe_router_group_topk": lambda v: bool(v),
        "moe_z_loss_coeff": lambda v: v > 0,
        "hidden_dropout": lambda v: v > 0,
        "attention_dropout": lambda v: v > 0,
        "add_bias_linear": lambda v: v,
        "position_embedding_type": lambda v: v != "rope",
        "swiglu": lambda v: not v,
    }
    for key, bad in refuse.items():
        if key in c and bad(c[key]):
            raise SystemExit(f"pytorch_moe_gpt: {path}: {key} = {c[key]!r} is not supported by this reference")
    if c["moe_aux_loss_coeff"] > 0 and c["moe_router_load_balancing_type"] != "none":
        raise SystemExit(f"pytorch_moe_gpt: {path}: moe_aux_loss_coeff > 0 is not supported by this reference")
    freq = c["moe_layer_freq"]
    layers = c["num_layers"]
    c["moe_layers"] = ([i % freq == 0 for i in range(layers)] if isinstance(freq, int)
                       else [bool(v) for v in freq])
    if c["num_experts"] <= 0 or len(c["moe_layers"]) != layers:
        raise SystemExit(f"pytorch_moe_gpt: {path}: expected num_experts > 0 and moe_layer_freq for {layers} layers")
    return c


def make_norm(c):
    h, eps = c["hidden_size"], c["layernorm_epsilon"]
    return RMSNorm(h, eps) if c["normalization"] == "RMSNorm" else nn.LayerNorm(h, eps=eps)


class RMSNorm(nn.Module):

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(seq, rot, base, device):
    """fp32 cos and sin [seq, rot] of Megatron's rotate-half rope (model_zoo's apply_rotary)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float32, device=device) / rot))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv_freq)
    angles = torch.cat((angles, angles), -1)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    rot, half = cos.shape[-1], cos.shape[-1] // 2
    r = x[..., :rot]
    rotated = torch.cat((-r[..., half:], r[..., :half]), -1)
    y = r * cos.to(x.dtype) + rotated * sin.to(x.dtype)
    return y if rot == x.shape[-1] else torch.cat((y, x[..., rot:]), -1)


class Attention(nn.Module):

    def __init__(self, c):
        super().__init__()
        h, self.heads, self.groups = c["hidden_size"], c["num_attention_heads"], c["num_query_groups"]
        self.d = h // self.heads
        self.qkv = nn.Linear(h, (self.heads + 2 * self.groups) * self.d, bias=False)
        self.proj = nn.Linear(h, h, bias=False)

    def forward(self, x, cos, sin):
        b, s, h = x.shape
        y = self.qkv(x)
        nq, nk = self.heads * self.d, self.groups * self.d
        q = y[..., :nq].view(b, s, self.heads, self.d).transpose(1, 2)
        k = y[..., nq:nq + nk].view(b, s, self.groups, self.d).transpose(1, 2)
        v = y[..., nq + nk:].view(b, s, self.groups, self.d).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.groups != self.heads)
        return self.proj(a.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    """model_zoo's GPTMLP with SwiGLU: fc [2f, h] (gate, then up), proj [h, f]."""

    def __init__(self, h, f):
        super().__init__()
        self.fc = nn.Linear(h, 2 * f, bias=False)
        self.proj = nn.Linear(f, h, bias=False)

    def forward(self, x):
        gate, up = self.fc(x).chunk(2, -1)
        return self.proj(F.silu(gate) * up)


class Gate(nn.Module):

    def __init__(self, c):
        super().__init__()
        e = c["num_experts"]
        self.wg = nn.Linear(c["hidden_size"], e, bias=False)
        if c["moe_router_enable_expert_bias"]:
            self.register_buffer("expert_bias", torch.zeros(e))
        else:
            self.expert_bias = None
        # Routes per expert since the last bias update (train_gpt's tokens_per_expert).
        self.register_buffer("tokens_per_expert", torch.zeros(e), persistent=False)


class GroupedExperts(nn.Module):

    def __init__(self, e, h, f):
        super().__init__()
        self.weight1 = nn.Parameter(torch.empty(e, h, 2 * f))  # [gate | up] per expert
        self.weight2 = nn.Parameter(torch.empty(e, f, h))


class MoELayer(nn.Module):
    """DeepSpeed's MOELayer names: gate.wg, experts.weight1 / weight2."""

    def __init__(self, c):
        super().__init__()
        self.gate = Gate(c)
        self.experts = GroupedExperts(c["num_experts"], c["hidden_size"], c["moe_ffn_hidden_size"])


class MoE(nn.Module):

    def __init__(self, c):
        super().__init__()
        self.k, self.e = c["moe_router_topk"], c["num_experts"]
        self.sigmoid = c["moe_router_score_function"] == "sigmoid"
        self.scaling = c["moe_router_topk_scaling_factor"] or 1.0
        self.deepspeed_moe = MoELayer(c)
        fs = c["moe_shared_expert_intermediate_size"]
        self.shared_experts = MLP(c["hidden_size"], fs) if fs > 0 else None

    def forward(self, x):
        shape, h = x.shape, x.shape[-1]
        t = x.reshape(-1, h)
        gate, experts = self.deepspeed_moe.gate, self.deepspeed_moe.experts
        # The router in fp32 whatever autocast does, as model_zoo's TopKGate.
        with torch.autocast(t.device.type, enabled=False):
            logits = F.linear(t.float(), gate.wg.weight.float())
        scores = torch.sigmoid(logits) if self.sigmoid else torch.softmax(logits, -1)
        sel = scores.detach() if gate.expert_bias is None else scores.detach() + gate.expert_bias
        chosen = torch.topk(sel, self.k, dim=-1).indices  # [T, k]
        w = scores.gather(1, chosen)
        if self.k > 1:
            w = w / w.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).eps)
        w = w * self.scaling
        flat = chosen.reshape(-1)
        counts = torch.zeros(self.e, dtype=torch.int64, device=t.device).scatter_add_(0, flat, torch.ones_like(flat))
        if self.training:
            with torch.no_grad():
                gate.tokens_per_expert.add_(counts.float())
        # Sort-based dispatch: routes stably by expert, their tokens' rows gathered expert-major.
        order = torch.argsort(flat, stable=True)
        offs = counts.cumsum(0).to(torch.int32)
        dt = torch.get_autocast_dtype(t.device.type) if torch.is_autocast_enabled(t.device.type) else t.dtype
        rows = t.to(dt)[order // self.k]
        h1 = torch._grouped_mm(rows, experts.weight1.to(dt), offs=offs)
        f = h1.shape[-1] // 2
        y = torch._grouped_mm(F.silu(h1[:, :f]) * h1[:, f:], experts.weight2.to(dt), offs=offs)
        routed = y.new_zeros(y.shape).index_copy(0, order, y).view(-1, self.k, h)
        out = (routed.float() * w.unsqueeze(-1)).sum(1).to(dt).view(shape)
        return out if self.shared_experts is None else out + self.shared_experts(x)


class Block(nn.Module):

    def __init__(self, c, moe):
        super().__init__()
        self.ln_1, self.ln_2 = make_norm(c), make_norm(c)
        self.attn = Attention(c)
        self.mlp = MoE(c) if moe else MLP(c["hidden_size"], c["ffn_hidden_size"])

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x))


class Embedding(nn.Module):

    def __init__(self, c):
        super().__init__()
        self.word = nn.Embedding(c["vocab_size"], c["hidden_size"])


class GPT(nn.Module):

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embedding = Embedding(c)
        self.blocks = nn.ModuleList(Block(c, m) for m in c["moe_layers"])
        self.final_norm = make_norm(c)
        self.head = (nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
                     if c["untie_embeddings_and_output_weights"] else None)
        self.rot = int(c["hidden_size"] // c["num_attention_heads"] * c["rotary_percent"])
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """model_zoo's (Megatron's): normal(0, std); residual-branch outputs std / sqrt(2 L)."""
        std = self.c["init_method_std"]
        out_std = std / math.sqrt(2.0 * self.c["num_layers"])
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue  # norms start at one
            residual = name.endswith(("attn.proj.weight", "mlp.proj.weight", "shared_experts.proj.weight",
                                      "experts.weight2"))
            p.normal_(0.0, out_std if residual else std)

    def hidden(self, ids):
        x = self.embedding.word(ids)
        cos, sin = rope_tables(ids.shape[1], self.rot, self.c["rotary_base"], ids.device)
        for b in self.blocks:
            x = b(x, cos, sin)
        return x

    def logits(self, x):
        w = self.head.weight if self.head is not None else self.embedding.word.weight
        return F.linear(self.final_norm(x), w)

    def forward(self, ids):
        return self.logits(self.hidden(ids))


def loss_of(logits, targets):
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def parameter_counts(model, c):
    """(total, active): active leaves out the experts a token does not use, as train_gpt does."""
    total = sum(p.numel() for p in model.parameters())
    h, f, e, k = c["hidden_size"], c["moe_ffn_hidden_size"], c["num_experts"], c["moe_router_topk"]
    unused = sum(c["moe_layers"]) * (e - k) * (h * 2 * f + f * h)
    return total, total - unused


@torch.no_grad()
def update_expert_biases(model, rate):
    """Moves the biases; returns the step's max/mean routes per expert of each MoE layer, a
    device tensor (read once after the timing: an .item() a step would be a host wait)."""
    balance = []
    for m in model.modules():
        if isinstance(m, Gate):
            counts = m.tokens_per_expert
            balance.append(counts.max() / counts.mean().clamp_min(1e-9))
            if m.expert_bias is not None:
                m.expert_bias.add_(torch.sign(counts.mean() - counts) * rate)
            counts.zero_()
    return torch.stack(balance) if balance else None


def read_corpus(prefix):
    """The token stream of a Megatron indexed dataset (.idx header, .bin tokens in file order)."""
    codes = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
    with open(prefix + ".idx", "rb") as f:
        head = f.read(18)
    if head[:9] != b"MMIDIDX\x00\x00" or int.from_bytes(head[9:17], "little") != 1 or head[17] not in codes:
        raise SystemExit(f"pytorch_moe_gpt: {prefix}.idx is not a Megatron indexed dataset index")
    return np.memmap(prefix + ".bin", dtype=codes[head[17]], mode="r")


def make_batches(args, c, count):
    """`count` micro-batches [B, seq + 1] of token ids on the host (pinned on a GPU)."""
    seq, vocab = c["seq_length"], c["vocab_size"]
    rng = np.random.default_rng(1234)
    if args.data_path:
        tokens = read_corpus(args.data_path)
        if len(tokens) < seq + 2:
            raise SystemExit(f"pytorch_moe_gpt: {args.data_path} holds {len(tokens)} tokens, fewer than seq + 2")
        starts = rng.integers(0, len(tokens) - seq - 1, size=(count, args.micro_batch))
        batches = [torch.from_numpy(np.stack([tokens[s:s + seq + 1] for s in row]).astype(np.int64)) for row in starts]
    else:
        g = torch.Generator().manual_seed(1234)
        batches = [torch.randint(0, vocab, (args.micro_batch, seq + 1), generator=g) for _ in range(count)]
    if max(int(b.max()) for b in batches) >= vocab:
        raise SystemExit(f"pytorch_moe_gpt: a token id is outside the vocabulary of {vocab}")
    return [b.pin_memory() for b in batches] if args.device == "cuda" else batches


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-config", required=True)
    ap.add_argument("--data-path", default="", help="Megatron indexed dataset prefix (random tokens without)")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--accumulation", type=int, default=8, help="micro-batches per optimizer step")
    ap.add_argument("--fallback-micro-batch", type=int, default=0,
                    help="retry the first step at this micro-batch if it runs out of memory")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="autocast dtype (fp32: none)")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--lr-warmup-steps", type=int, default=0,
                    help="linear warmup from 0 over N steps, as train_gpt's --lr-warmup-iters (the "
                         "benchmark's balanced routing: the router barely moves in its few steps)")
    args = ap.parse_args()
    c = load_config(args.model_config)
    torch.manual_seed(0)
    device = torch.device(args.device)
    with device:
        model = GPT(c)
    total, active = parameter_counts(model, c)
    seq, compiled = c["seq_length"], not args.no_compile
    autocast = args.dtype == "bf16"
    if compiled:
        for b in model.blocks:
            b.compile()  # in place: the names stay dscpp's; the blocks share one graph
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            fused=args.device == "cuda")
    warm = args.lr_warmup_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, k / warm) if warm > 0 else 1.0)

    def head_loss(x, targets):
        return loss_of(model.logits(x), targets)

    fn = {"head_loss": torch.compile(head_loss) if compiled else head_loss}
    steps_total = args.warmup + args.steps
    oom_at, compile_error = 0, ""
    state = {"balance": None}

    def run_step(batches):
        last = None
        for ids in batches:
            ids = ids.to(device, non_blocking=True)
            with torch.autocast(args.device, dtype=torch.bfloat16, enabled=autocast):
                loss = fn["head_loss"](model.hidden(ids[:, :-1]), ids[:, 1:])
            (loss / len(batches)).backward()
            last = loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        state["balance"] = update_expert_biases(model, c["moe_router_bias_update_rate"])
        return last

    batches = make_batches(args, c, steps_total * args.accumulation)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    step, loss = 0, None
    while step < steps_total:
        if step == args.warmup:
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        group = batches[step * args.accumulation:(step + 1) * args.accumulation]
        retry = ""
        try:
            loss = run_step(group)
        except torch.OutOfMemoryError:
            if step > 0 or not args.fallback_micro_batch or args.fallback_micro_batch >= args.micro_batch:
                raise
            retry = "oom"
        except Exception as e:  # noqa: BLE001 - a compiler failure: say it, then run eager
            if step > 0 or not compiled:
                raise
            retry, compile_error = "eager", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        if retry:  # out of the except block, so that its traceback's tensors are gone
            if retry == "oom":
                oom_at, tokens = args.micro_batch, args.micro_batch * args.accumulation
                print(f"pytorch_moe_gpt: out of memory at micro-batch {oom_at}; again at "
                      f"{args.fallback_micro_batch}", flush=True)
                args.micro_batch = args.fallback_micro_batch
                args.accumulation = tokens // args.micro_batch
                batches = make_batches(args, c, steps_total * args.accumulation)
            else:
                print(f"pytorch_moe_gpt: torch.compile failed ({compile_error}); eager from here", flush=True)
                compiled = False
                for b in model.blocks:
                    b._compiled_call_impl = None  # what nn.Module.compile set
                fn["head_loss"] = head_loss
            loss = None
            opt.zero_grad(set_to_none=True)
            opt.state.clear()
            torch._dynamo.reset()  # a fresh graph at the new shapes, not a dynamic-shape one
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            continue
        step += 1
    if args.device == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else 0.0
    tps = args.steps * args.accumulation * args.micro_batch * seq / secs
    flops = 6 * active + 12 * c["num_layers"] * c["hidden_size"] * seq
    tflops = tps * flops / 1e12
    print(f"pytorch_moe mode=single compile={int(compiled)} gpus=1 micro_batch={args.micro_batch} "
          f"accumulation={args.accumulation} seq={seq} steps={args.steps} params={total} active_params={active} "
          f"tokens_per_s_per_gpu={tps:.1f} tflops_per_gpu={tflops:.2f} mfu={100 * tflops / args.peak_tflops:.1f}% "
          f"peak_mem_gib={peak:.3f} loss={loss.item():.4f} secs={secs:.3f}"
          + (f" load_balance={state['balance'].mean().item():.2f} load_balance_worst="
             f"{state['balance'].max().item():.2f}" if state["balance"] is not None else "")
          + (f" oom_at_micro_batch={oom_at}" if oom_at else "")
          + (" compile_failed=1" if compile_error else ""), flush=True)


if __name__ == "__main__":
    if os.environ.get("PYTORCH_MOE_GPT_THREADS"):
        torch.set_num_threads(int(os.environ["PYTORCH_MOE_GPT_THREADS"]))
    main()
