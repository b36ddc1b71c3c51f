#!/usr/bin/env python3
"""engine_train's model, data and micro-batch assignment, trained by DeepSpeed itself.

    DS_ACCELERATOR=cpu dscpp --num_gpus 2 --no_local_rank --master_port P python ds_train.py \
        --init init.json --stage S --ga GA --steps N --out out.json
    ... ds_train.py --init init.json --cases 0:1,0:4,1:1 --steps N --out 'out_s{stage}_ga{ga}.json'

The oracle for dscpp's engine: the MLP of engine_train.cpp (Linear(16,32) -> exact gelu ->
Linear(32,32) -> tanh -> Linear(32,4), MSE loss), started from the weights that
`engine_train --mode init` wrote, fed the same deterministic samples, trained by DeepSpeed on
CPU (Gloo) in fp32 with torch's AdamW. Rank 0 writes {"losses": [global mean loss per step],
"params": [flat, in module.parameters() order]} to --out. --cases STAGE:GA,... trains each case
in turn in this one process (a fresh model and engine each, one process group, as a second
deepspeed.initialize does), writing --out (and saving to --save, loading from --load) with
{stage} and {ga} filled in: the interpreter's ~5 s of importing torch and DeepSpeed, most of a
launch's cost on CPU, is paid once per launch, not once per case.

The rank comes from the environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
`--local_rank=K` is accepted, but the launcher inserts it right after the program it starts,
which here is the Python interpreter and would reject it: start this with `--no_local_rank`."""
import argparse
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # tests/
from rank_exit import exit_rank  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

GLOBAL_BATCH = 16
MUON_RUNS = [0]  # this rank's muon_update calls (with --muon)


class Mlp(torch.nn.Module):

    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.l2 = torch.nn.Linear(32, 32)
        self.l3 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.l3(torch.tanh(self.l2(F.gelu(self.l1(x)))))


def samples(first, count):
    """engine_train.cpp's samples(): computed in fp32 the same way, so the inputs are bitwise equal."""
    i = torch.arange(first, first + count, dtype=torch.float32).unsqueeze(1)
    x = torch.sin(i * 0.37 + torch.arange(16, dtype=torch.float32) * 0.11)
    y = torch.cos(i * 0.21 + torch.arange(4, dtype=torch.float32) * 0.5)
    return x, y


def config(stage, ga, muon=None):
    """muon: a Newton-Schulz method ("gram" or "standard"): DeepSpeed's Muon (the weights by
    Muon, the biases by its auxiliary Adam), without clipping (DeepSpeed's ZeRO 1-2 would clip
    the orthogonalised update, its stage 0 the gradient)."""
    optimizer = {"type": "AdamW",
                 "params": {"lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
                            "torch_adam": True}}
    if muon:
        optimizer = {"type": "Muon",
                     "params": {"lr": 1e-2, "momentum": 0.9, "weight_decay": 0.1, "ns_method": muon,
                                "betas": [0.9, 0.999], "eps": 1e-8}}
    return {
        "train_batch_size": GLOBAL_BATCH,
        "gradient_accumulation_steps": ga,
        "gradient_clipping": 0.0 if muon else 1.0,
        "optimizer": optimizer,
        "zero_optimization": {"stage": stage, "contiguous_gradients": True, "overlap_comm": False,
                              "reduce_bucket_size": 300},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def train(args, stage, ga_asked, out, save, load):
    """One case: a fresh model from --init trained at `stage` with accumulation `ga_asked`,
    resumed from `load` and saved to `save` when given."""
    import deepspeed

    torch.manual_seed(0)
    model = Mlp()
    with open(args.init) as f:
        init = json.load(f)
    with torch.no_grad():
        for name, p in model.named_parameters():
            w = init[name]
            p.copy_(torch.tensor(w["values"], dtype=torch.float64).reshape(w["shape"]).to(p.dtype))
    parameters = model.parameters()
    if args.groups:  # by name, each group's settings beside its parameters
        named = dict(model.named_parameters())
        parameters = [{**{k: v for k, v in g.items() if k != "params"}, "params": [named[n] for n in g["params"]]}
                      for g in json.loads(args.groups)]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=parameters,
                                           config=config(stage, ga_asked, args.muon))
    n, r = engine.world_size, engine.global_rank
    # Make sure DeepSpeed really runs the stage asked for: ZeRO 1 and 2 wrap the AdamW in its
    # DeepSpeedZeroOptimizer (partitioned fp32 state, reduce-scattered gradients).
    assert engine.zero_optimization_stage() == stage, engine.zero_optimization_stage()
    basic = "MuonWithAuxAdam" if args.muon else "AdamW"
    want = "DeepSpeedZeroOptimizer" if stage in (1, 2) else basic
    assert type(engine.optimizer).__name__ == want, type(engine.optimizer).__name__
    assert type(engine.basic_optimizer).__name__ == basic, type(engine.basic_optimizer)
    mb, ga = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    assert mb * ga * n == GLOBAL_BATCH, (mb, ga, n)

    first = 0
    if load:
        path, _ = engine.load_checkpoint(load)
        assert path is not None, f"DeepSpeed found no checkpoint in {load}"
        first = engine.global_steps
    losses = []
    for s in range(first, args.steps):
        loss_sum = 0.0
        for m in range(ga):
            x, y = samples(s * GLOBAL_BATCH + (m * n + r) * mb, mb)
            loss = F.mse_loss(engine(x), y)
            loss_sum += loss.item()
            engine.backward(loss)
            engine.step()
        # The global batch's loss: the mean of every rank's micro-batch losses.
        t = torch.tensor([loss_sum / ga], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        losses.append(t.item() / n)
        if s + 1 == args.save_at:
            engine.save_checkpoint(save, client_state={"saved_at": s + 1})
    assert engine.global_steps == args.steps, engine.global_steps

    # At stages 1 and 2 each rank updates its partition of the fp32 weights and the updated
    # partitions are all-gathered into the module's parameters at the end of every step, so
    # rank 0's module holds the full weights. Check that every rank holds the same ones.
    flat = torch.cat([p.detach().to(torch.float64).flatten() for p in engine.module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(n)]
    torch.distributed.all_gather(gathered, flat)
    for k, g in enumerate(gathered):
        assert torch.equal(g, flat), f"rank {k}'s module weights differ from rank {r}'s"
    runs = torch.tensor([float(MUON_RUNS[0])], dtype=torch.float64)
    torch.distributed.all_reduce(runs)
    MUON_RUNS[0] = 0
    if r == 0:
        with open(out, "w") as f:
            json.dump({"losses": losses, "params": flat.tolist(), "first_step": first,
                       "orthogonalised": runs.item()}, f)
            f.write("\n")
    torch.distributed.barrier()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local_rank", type=int, default=None, help="set by a launcher; unused")
    ap.add_argument("--init", required=True, help="engine_train --mode init's JSON")
    ap.add_argument("--stage", type=int)
    ap.add_argument("--ga", type=int, help="gradient_accumulation_steps")
    ap.add_argument("--cases", help="STAGE:GA,...: several cases in this process (instead of --stage/--ga)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", required=True, help="with --cases, {stage} and {ga} are filled in")
    ap.add_argument("--save", help="checkpoint folder to save to after step --save-at (as --out)")
    ap.add_argument("--save-at", type=int, default=-1)
    ap.add_argument("--load", help="checkpoint folder to resume from, its latest tag (as --out)")
    ap.add_argument("--muon", help="train with DeepSpeed's Muon and this ns_method (config's muon)")
    ap.add_argument("--groups", help="parameter groups, JSON [{\"params\": [names], settings...}]")
    args = ap.parse_args()
    if args.cases:
        cases = [tuple(int(v) for v in c.split(":")) for c in args.cases.split(",")]
        if any(len(c) != 2 for c in cases):
            ap.error("--cases takes STAGE:GA pairs")
    elif args.stage is None or args.ga is None:
        ap.error("--stage and --ga (or --cases) are required")
    else:
        cases = [(args.stage, args.ga)]

    if args.muon:
        # DeepSpeed compiles Muon's Newton-Schulz with torch.compile, whose fused kernels round
        # differently from its eager code, which is the definition dscpp follows: eager here.
        import torch._dynamo
        torch._dynamo.config.disable = True
    import deepspeed  # slow; after argument errors

    # On the CPU accelerator DeepSpeed's TorchBackend JIT-compiles its shared-memory
    # all-reduce op (deepspeed_shm_comm, ~2 min of g++) when it is created, after probing
    # every op builder for compatibility (more compiler runs). The op serves only
    # inference_all_reduce, never training, so declare no op compatible: build_shm_op() then
    # returns None, nothing is probed or compiled, and collectives go through Gloo.
    deepspeed.ops.__compatible_ops__ = {}
    if args.muon:
        # The user's override of DeepSpeed's tags (param.use_muon, set in initialize): l1.weight,
        # the model's one tall matrix, goes to the auxiliary Adam (deepspeed_oracle.py says why).
        tag = deepspeed.set_optimizer_flags

        def set_optimizer_flags(config_class, model):
            tag(config_class, model)
            model.l1.weight.use_muon = False

        deepspeed.set_optimizer_flags = set_optimizer_flags
        # Count the Newton-Schulz runs (muon_update calls) wherever DeepSpeed imported it.
        import deepspeed.runtime.zero.muon.original_muon as original
        import deepspeed.runtime.zero.muon.muon_optimizer as muon_optimizer
        import deepspeed.runtime.zero.stage_1_and_2 as stage_1_and_2
        update = original.muon_update

        def counted(*a, **k):
            MUON_RUNS[0] += 1
            return update(*a, **k)

        for module in (original, muon_optimizer, stage_1_and_2):
            if hasattr(module, "muon_update"):
                module.muon_update = counted
    deepspeed.init_distributed(dist_backend="gloo")
    def fill(pattern, stage, ga):
        return pattern.format(stage=stage, ga=ga) if args.cases and pattern else pattern

    for stage, ga in cases:
        train(args, stage, ga, *(fill(p, stage, ga) for p in (args.out, args.save, args.load)))
    exit_rank()  # not destroy_process_group(): see tests/rank_exit.py


if __name__ == "__main__":
    main()
