#!/usr/bin/env python3
"""DeepSpeed's own pipeline engine as a second oracle: its PipelineModule and
train_batch over Gloo on CPU, 2 processes (2 stages), a small MLP stack with weights and data
fixed by formulas (no RNG), printing the loss of every step as JSON lines.

    deepspeed_pipe_oracle.py [--steps 5] [--micro-batches 4] [--stages 2] [--data 1] [--zero 0,1]
        [--out losses.json]
    deepspeed_pipe_oracle.py --ours --launcher build/launcher/dscpp --train build/tests/pipe/pipe_train

--ours: the other direction for checkpoints (load_ours()): our PipelineEngine trains
pipe_train's MLP on 2 stages and saves; DeepSpeed's PipelineEngine (2 stages) loads the files
with load_checkpoint(load_module_only=True), i.e. its load_state_dir on our layer files, and its
eval_batch must give our eval loss (relative 1e-6; it is equal).

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
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from dscpp_test_ports import free_port  # noqa: E402
from rank_exit import exit_rank  # noqa: E402

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
    exit_rank()  # see tests/rank_exit.py


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


def our_mlp_specs():
    """pipe_train's "mlp" model as DeepSpeed LayerSpecs: Linear layers 16 -> 32 x 6 -> 4, GELU
    after the even ones and tanh after the odd ones (inside the layer, as ours), none after the
    last; the state_dict keys (weight, bias) are a Linear's."""
    import torch
    from torch import nn
    from deepspeed.runtime.pipe.module import LayerSpec

    class LinearAct(nn.Linear):
        def __init__(self, i, o, act):
            super().__init__(i, o)
            self.act = act

        def forward(self, x):
            y = super().forward(x)
            return torch.nn.functional.gelu(y) if self.act == "gelu" else torch.tanh(y) if self.act == "tanh" else y

    widths = [16, 32, 32, 32, 32, 32, 32, 32, 4]
    return [LayerSpec(LinearAct, widths[i], widths[i + 1],
                      "none" if i + 2 == len(widths) else ("gelu" if i % 2 == 0 else "tanh"))
            for i in range(len(widths) - 1)]


def our_samples(first, count):
    """pipe_train's samples() of the MLP, the same float32 operations."""
    import torch
    i = torch.arange(first, first + count, dtype=torch.float32).unsqueeze(1)
    x = torch.sin(i * 0.37 + torch.arange(16, dtype=torch.float32) * 0.11)
    y = torch.cos(i * 0.21 + torch.arange(4, dtype=torch.float32) * 0.5)
    return x, y


def load_ours_worker(args):
    """DeepSpeed's PipelineEngine (2 stages) loads our pipeline checkpoint with
    load_checkpoint(load_module_only=True), so its PipelineModule reads our layer files
    (load_state_dir), and evaluates the batch our engine evaluated after saving."""
    import torch
    from torch import nn
    import deepspeed
    from deepspeed.runtime.pipe.module import PipelineModule
    no_shm_op()
    deepspeed.init_distributed(dist_backend="gloo")
    module = PipelineModule(layers=our_mlp_specs(), num_stages=2, loss_fn=nn.MSELoss(), partition_method="parameters")
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4, "steps_per_print": 1000000}
    engine, _, _, _ = deepspeed.initialize(model=module, config=config)
    path, _ = engine.load_checkpoint(args.load_ours, load_module_only=True)
    if path is None:
        raise SystemExit(f"DeepSpeed found no checkpoint in {args.load_ours}")
    first = args.eval_first
    batches = [our_samples(first + j * 4, 4) for j in range(4)]
    loss = engine.eval_batch(data_iter=iter(batches))
    if torch.distributed.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"eval_loss": float(loss), "parts": [int(p) for p in module.parts]}, f)
    exit_rank()  # see tests/rank_exit.py


def load_ours(args):
    """Our engine trains pipe_train's MLP on 2 stages (4 micro-batches, ZeRO 0) and saves; then
    DeepSpeed's engine loads the files and must give our eval_batch loss (relative 1e-6)."""
    import tempfile
    work = tempfile.mkdtemp()
    ck = os.path.join(work, "ck")
    steps = 4
    cases = [{"name": "ds", "stages": 2, "chunks": 1, "save_dir": ck, "save_at": steps,
              "config": {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
                         "zero_optimization": {"stage": 0}}}]
    port = free_port()
    subprocess.run([args.launcher, "--num_gpus", "2", "--master_port", str(port), args.train, "--mode", "pipe",
                    "--model", "mlp", "--steps", str(steps), "--cases", json.dumps(cases), "--out", work],
                   check=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=args.timeout)
    with open(os.path.join(work, "ds.stage0.json")) as f:
        ours = json.load(f)
    out = os.path.join(work, "deepspeed.json")
    codes = spawn(2, ["--load-ours", ck, "--eval-first", str(steps * 16), "--out", out], args.timeout)
    if any(c != 0 for c in codes):
        print(f"DeepSpeed's pipeline engine did not load our checkpoint: exit codes {codes}")
        return 1
    with open(out) as f:
        theirs = json.load(f)
    err = abs(theirs["eval_loss"] - ours["eval_loss"]) / abs(ours["eval_loss"])
    print(f"DeepSpeed's PipelineEngine on our layer files (its partition {theirs['parts']}): eval loss "
          f"{theirs['eval_loss']:.9g}, ours {ours['eval_loss']:.9g}, relative difference {err:.2e}")
    return 0 if err <= 1e-6 else 1


def spawn(world, extra, timeout):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker"] + extra, env=env))
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            codes.append("timeout")
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    return codes


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
    ap.add_argument("--load-ours", help="worker: load this checkpoint of ours (see load_ours)")
    ap.add_argument("--eval-first", type=int, default=0)
    ap.add_argument("--ours", action="store_true",
                    help="DeepSpeed's engine loads a pipeline checkpoint our engine saved")
    ap.add_argument("--launcher")
    ap.add_argument("--train")
    args = ap.parse_args()
    if args.worker:
        return load_ours_worker(args) if args.load_ours else worker(args)
    if args.ours:
        sys.exit(load_ours(args))
    codes = spawn(args.stages * args.data, sys.argv[1:], args.timeout)
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
