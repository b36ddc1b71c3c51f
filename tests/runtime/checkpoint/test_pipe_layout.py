#!/usr/bin/env python3
"""Our pipeline layer files against DeepSpeed's PipelineModule, both ways, two stages on CPU.

    test_pipe_layout.py --cli PATH/TO/pipe_layout_cli

For each topology (PipeDataParallelTopology(2, 1): files layer_XX-model_states.pt;
PipeModelDataParallelTopology(2, 1, 1): layer_XX-model_00-model_states.pt):
1. pipe_layout_cli writes the layer files of a known 4-layer model; Python's torch.load
   (weights_only=True) opens each one.
2. Two processes (gloo) build the same layers as DeepSpeed LayerSpecs in a 2-stage
   PipelineModule (uniform partition: layers 0-1 on stage 0, 2-3 on stage 1) and call
   DeepSpeed's load_state_dir on our files: every weight equals the known values.
3. The same processes give their layers random weights and call DeepSpeed's save_state_dict;
   pipe_layout_cli reads those files: every tensor equals DeepSpeed's, bit for bit, and the
   file names DeepSpeed wrote are the ones our layer_file_name gives.
4. The mp_rank / zero file names: DeepSpeed's grid.get_model_parallel_rank() (its
   checkpoint_mp_rank under a pipeline) of each stage gives the names our CLI prints.
Exits 1 on any difference.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # tests/
from dscpp_test_ports import free_port  # noqa: E402
from rank_exit import exit_rank  # noqa: E402

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def known(shape, layer, bias):
    import torch
    n = 1
    for d in shape:
        n *= d
    i = torch.arange(n, dtype=torch.long)
    v = ((i % 17) - 8).double() / 8.0 + layer / 16.0 + (1.0 / 32 if bias else 0.0)
    return v.float().reshape(shape)


def specs():
    from torch import nn
    from deepspeed.runtime.pipe.module import LayerSpec
    return [LayerSpec(nn.Linear, 4, 8), LayerSpec(nn.ReLU), LayerSpec(nn.Linear, 8, 8), LayerSpec(nn.Linear, 8, 2)]


def no_shm_op():
    """DeepSpeed's CPU backend JIT-builds its shared-memory all-reduce op (deepspeed_shm_comm)
    in init_distributed, minutes on a busy machine and a rebuild whenever the venv's path
    differs; only its inference all-reduce uses it, so the tests run without it."""
    import importlib
    # The submodule itself: the attribute deepspeed.comm.torch is the torch package.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def worker(args):
    import torch
    import deepspeed
    from deepspeed.runtime.pipe.module import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipeModelDataParallelTopology
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    no_shm_op()
    deepspeed.init_distributed(dist_backend="gloo")
    topo = (PipeModelDataParallelTopology(num_pp=2, num_mp=1, num_dp=1)
            if args.model_axis else PipeDataParallelTopology(num_pp=2, num_dp=1))
    module = PipelineModule(layers=specs(), topology=topo, partition_method="uniform")
    # As the engine makes it: its ds_config's checkpoint.checkpoint_serialization defaults to
    # True (torch.save's zip format); TorchCheckpointEngine() without a config writes the
    # legacy format, which DeepSpeed's engine never does by default and we do not read.
    from deepspeed.runtime.model_checkpointing import CHECKPOINT_SERIALIZATION
    engine = TorchCheckpointEngine(types.SimpleNamespace(checkpoint_config={CHECKPOINT_SERIALIZATION: True}))
    stage = module._grid.get_stage_id()
    report = {"stage": stage, "start": module._local_start, "mp_rank": module._grid.get_model_parallel_rank(),
              "errors": []}
    # 2. DeepSpeed loads our files.
    module.load_state_dir(args.load_dir, engine)
    for local, layer in enumerate(module.forward_funcs):
        global_idx = module._local_start + local
        for key, tensor in layer.state_dict().items():
            want = known(list(tensor.shape), global_idx, key == "bias")
            if not torch.equal(tensor, want):
                report["errors"].append(f"layer {global_idx} {key}: DeepSpeed loaded other values")
    # 3. DeepSpeed writes its own.
    torch.manual_seed(100 + stage)
    saved = {}
    for local, layer in enumerate(module.forward_funcs):
        for key, tensor in layer.state_dict().items():
            tensor.copy_(torch.randn(tensor.shape))
        saved[str(module._local_start + local)] = {k: v.clone() for k, v in layer.state_dict().items()}
    # The pipeline engine sets this from the ds_config (checkpoint.parallel_write.pipeline_stage).
    module.checkpoint_parallel_write_pipeline = False
    module.save_state_dict(args.save_dir, engine)
    torch.save(saved, os.path.join(args.out, f"reference_{stage}.pt"))
    with open(os.path.join(args.out, f"report_{stage}.json"), "w") as f:
        json.dump(report, f)
    torch.distributed.barrier()
    exit_rank()  # see tests/rank_exit.py


def run_case(cli, model_axis, work):
    import torch
    failures = []
    ours, theirs, out = (os.path.join(work, d) for d in ("ours", "theirs", "out"))
    for d in (theirs, out):
        os.makedirs(d)
    subprocess.run([cli, "write", work, "ours"] + (["--model-axis"] if model_axis else []), check=True)
    for name in sorted(os.listdir(ours)):
        torch.load(os.path.join(ours, name), weights_only=True)  # 1. opens at the defaults
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--load-dir", ours, "--save-dir", theirs,
                                       "--out", out] + (["--model-axis"] if model_axis else []), env=env))
    for p in procs:
        try:
            if p.wait(timeout=240) != 0:
                failures.append(f"a DeepSpeed worker exited {p.returncode}")
        except subprocess.TimeoutExpired:
            failures.append("a DeepSpeed worker did not finish in 240 s")
    for p in procs:  # none outlives the test
        if p.poll() is None:
            p.kill()
            p.wait()
    if failures:
        return failures
    reports = [json.load(open(os.path.join(out, f"report_{s}.json"))) for s in range(2)]
    for r in reports:
        failures += r["errors"]
    if [r["start"] for r in reports] != [0, 2]:
        failures.append(f"unexpected DeepSpeed partition {[r['start'] for r in reports]}")
    # 3. We read DeepSpeed's files.
    read = subprocess.run([cli, "read", work, "theirs", "4"], capture_output=True, text=True)
    if read.returncode != 0:
        return failures + [f"we cannot read DeepSpeed's layer files: {read.stderr.strip()}"]
    got = json.loads(read.stdout)
    reference = {}
    for s in range(2):
        reference.update(torch.load(os.path.join(out, f"reference_{s}.pt"), weights_only=True))
    for layer, state in reference.items():
        if list(got[layer].keys()) != list(state.keys()):
            failures.append(f"layer {layer}: keys {list(got[layer].keys())} != DeepSpeed's {list(state.keys())}")
            continue
        for key, tensor in state.items():
            mine = got[layer][key]
            if mine["shape"] != list(tensor.shape) or mine["dtype"] != "Float" or \
                    not torch.equal(torch.tensor(mine["values"], dtype=torch.float64).float(), tensor.flatten()):
                failures.append(f"layer {layer} {key}: we read other values than DeepSpeed wrote")
    # File names: DeepSpeed's set equals ours, and the engine-state names per stage.
    rank = 0 if model_axis else -1
    names = {subprocess.run([cli, "names", str(layer), str(rank), "0", "1", "0"], check=True, capture_output=True,
                            text=True).stdout.split()[0] for layer in range(4)}
    if names != set(os.listdir(theirs)):
        failures.append(f"DeepSpeed wrote {sorted(os.listdir(theirs))}, our names are {sorted(names)}")
    if sorted(os.listdir(ours)) != sorted(names):
        failures.append(f"we wrote {sorted(os.listdir(ours))}")
    for r in reports:
        lines = subprocess.run([cli, "names", "0", str(rank), str(r["stage"]), "1", "0"], check=True,
                               capture_output=True, text=True).stdout.split()
        want = [f"mp_rank_{r['mp_rank']:02d}_model_states.pt", f"zero_pp_rank_0_mp_rank_{r['mp_rank']:02d}_optim_states.pt"]
        if lines[1:] != want:
            failures.append(f"stage {r['stage']}: DeepSpeed's checkpoint_mp_rank gives {want}, ours {lines[1:]}")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--model-axis", action="store_true")
    ap.add_argument("--load-dir")
    ap.add_argument("--save-dir")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    failed = False
    for model_axis in (False, True):
        with tempfile.TemporaryDirectory() as work:
            failures = run_case(args.cli, model_axis, work)
        label = "PipeModelDataParallelTopology" if model_axis else "PipeDataParallelTopology"
        print(f"{label}: {'PASS' if not failures else 'FAIL'} (each stage's DeepSpeed checkpoint_mp_rank checked)")
        for f in failures:
            print("  " + f)
        failed |= bool(failures)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
