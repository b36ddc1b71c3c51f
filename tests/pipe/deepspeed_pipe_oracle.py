#!/usr/bin/env python3
"""DeepSpeed's own pipeline engine as a second oracle (issue 18): its PipelineModule and
train_batch over Gloo on CPU, 2 processes (2 stages), a small MLP stack with weights and data
fixed by formulas (no RNG), printing the loss of every step as JSON lines.

    deepspeed_pipe_oracle.py [--steps 5] [--micro-batches 4] [--stages 2] [--data 1] [--zero 0,1]
        [--out losses.json]

The model (LayerSpecs, global indices): 0 Linear(8, 16), 1 ReLU, 2 Linear(16, 16), 3 ReLU,
4 Linear(16, 16), 5 ReLU, 6 Linear(16, 4); loss MSELoss (mean). Element i of a weight or bias of layer L is
(((i * 7 + L * 3) mod 19) - 9) / 32 (+ 1/64 for a bias); batch b of step s has inputs
x[j, k] = sin(0.1 * (s * 1000 + b * 100 + j * 8 + k)) and labels y = cos of the same index
for the first 4 columns, as float32, the index shifted by 37 per data rank (see data()).
Micro-batch size 2, partition "uniform" (2 stages: layers 0-3 and 4-6; 4 stages: 0-1, 2-3,
4-5, 6),
SGD lr 0.05, no clipping, fp32; --data N puts N data-parallel ranks beside the pipeline
(DeepSpeed's PipeDataParallelTopology, stages * N processes). Our engine runs the
same layers, weights, data and config; its per-step losses must agree (relative 1e-5).

DeepSpeed's CPU accelerator JIT-builds its shared-memory all-reduce op in init_distributed
(minutes here); only inference all-reduce uses it, so this script replaces the builder
(see no_shm_op()).

It also trains the same model in plain PyTorch in one process (reference()) and exits 1
unless DeepSpeed's losses equal those within 1e-5 relative, so the oracle is checked before
it is used. Result on this machine (DeepSpeed 0.19.8, PyTorch 2.11, CPU, Gloo): DeepSpeed's
pipeline engine runs; its losses equal plain PyTorch's within 1e-7 relative (2 stages x 1 and
2 data ranks, 4 micro-batches; 4 stages, 8 micro-batches; 5 steps each).
"""
import argparse
import json
import math
import os
import socket
import subprocess
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

MICRO = 2


def weight_values(shape, layer, bias):
    import torch
    n = 1
    for d in shape:
        n *= d
    i = torch.arange(n, dtype=torch.long)
    v = (((i * 7 + layer * 3) % 19) - 9).double() / 32.0 + (1.0 / 64 if bias else 0.0)
    return v.float().reshape(shape)


def data(step, batch, dp_rank=0):
    import torch
    idx = torch.arange(MICRO * 8, dtype=torch.float64).reshape(MICRO, 8) + step * 1000 + batch * 100 + dp_rank * 37
    return (torch.sin(0.1 * idx).float(), torch.cos(0.1 * idx[:, :4]).float())


def no_shm_op():
    import importlib
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def worker(args):
    import torch
    import deepspeed
    no_shm_op()
    deepspeed.init_distributed(dist_backend="gloo")
    results = {}
    for zero in [int(z) for z in args.zero.split(",")]:
        results[str(zero)] = train(args, zero)
    if torch.distributed.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": next(iter(results.values())), "cases": results, "stages": args.stages,
                       "data": args.data, "micro_batches": args.micro_batches}, f)


def train(args, zero):
    """One fresh PipelineModule and engine at ZeRO stage `zero`: the losses of every step."""
    import torch
    from torch import nn
    import deepspeed
    from deepspeed.runtime.pipe.module import LayerSpec, PipelineModule
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology
    torch.manual_seed(0)
    specs = [LayerSpec(nn.Linear, 8, 16), LayerSpec(nn.ReLU), LayerSpec(nn.Linear, 16, 16), LayerSpec(nn.ReLU),
             LayerSpec(nn.Linear, 16, 16), LayerSpec(nn.ReLU), LayerSpec(nn.Linear, 16, 4)]
    topology = PipeDataParallelTopology(num_pp=args.stages, num_dp=args.data)
    module = PipelineModule(layers=specs, topology=topology, loss_fn=nn.MSELoss(), partition_method="uniform")
    dp_rank = module._grid.data_parallel_id
    with torch.no_grad():
        for local, layer in enumerate(module.forward_funcs):
            for key, p in layer.named_parameters():
                p.copy_(weight_values(list(p.shape), module._local_start + local, key == "bias"))
    config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": args.micro_batches,
        "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
        "gradient_clipping": 0.0,
        "steps_per_print": 1000000,
        "wall_clock_breakdown": False,
    }
    if zero > 0:
        # torch's SGD under ZeRO: DeepSpeed asks for the flag; its stage 2 and 3 refuse pipelines.
        config["zero_optimization"] = {"stage": zero}
        config["zero_allow_untested_optimizer"] = True
    engine, _, _, _ = deepspeed.initialize(model=module, config=config,
                                           model_parameters=[p for p in module.parameters() if p.requires_grad])
    losses = []
    for step in range(args.steps):
        batches = [data(step, b, dp_rank) for b in range(args.micro_batches)]
        loss = engine.train_batch(data_iter=iter(batches))
        losses.append(float(loss))
    return losses


def reference(args):
    """The same training in plain PyTorch, one process: the check that the oracle is one."""
    import torch
    from torch import nn
    layers = [nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
              nn.Linear(16, 4)]
    with torch.no_grad():
        for idx, layer in enumerate(layers):
            for key, p in layer.named_parameters():
                p.copy_(weight_values(list(p.shape), idx, key == "bias"))
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(args.steps):
        opt.zero_grad()
        total = 0.0
        # Every data rank's micro-batches: DeepSpeed scales each loss by 1/gradient_accumulation_steps
        # and averages the gradients over data ranks; train_batch returns the mean loss of all.
        count = args.micro_batches * args.data
        for r in range(args.data):
            for b in range(args.micro_batches):
                x, y = data(step, b, r)
                loss = nn.functional.mse_loss(model(x), y)
                (loss / count).backward()
                total += loss.item()
        opt.step()
        losses.append(total / count)
    return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--data", type=int, default=1, help="data-parallel ranks beside the pipeline")
    ap.add_argument("--zero", default="0", help="ZeRO stages, comma-separated: one engine each, in one launch")
    ap.add_argument("--out", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "deepspeed_pipe_losses.json"))
    ap.add_argument("--timeout", type=int, default=300)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    world = args.stages * args.data
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker"] + sys.argv[1:], env=env))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=args.timeout))
        except subprocess.TimeoutExpired:
            codes.append("timeout")
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    if any(c != 0 for c in codes):
        print(f"DeepSpeed's pipeline engine did not finish: exit codes {codes}")
        sys.exit(1)
    with open(args.out) as f:
        result = json.load(f)
    ref = reference(args)
    worst = 0.0
    for zero, losses in result["cases"].items():
        for step, (loss, want) in enumerate(zip(losses, ref)):
            worst = max(worst, abs(loss - want) / abs(want))
            print(json.dumps({"zero": int(zero), "step": step, "loss": loss, "plain_pytorch": want}))
    print(f"DeepSpeed's pipeline ({args.stages} stages x {args.data} data ranks, {args.micro_batches} micro-batches, "
          f"ZeRO {args.zero}) against plain PyTorch: "
          f"largest relative difference {worst:.2e}")
    sys.exit(0 if worst <= 1e-5 else 1)


if __name__ == "__main__":
    main()
