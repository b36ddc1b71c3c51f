#!/usr/bin/env python3
"""Our pipeline engine against DeepSpeed's: the same layers, initial weights, data,
seed and config on both sides, the same losses within 1e-5 relative.

DeepSpeed's side is deepspeed_pipe_oracle.py (its PipelineModule and train_batch over Gloo on
CPU, DeepSpeed 0.19.8; the script itself exits 1 unless DeepSpeed's losses equal plain
PyTorch's in one process). Ours is pipe_vs_deepspeed (dscpp's PipelineModule and
PipelineEngine through the dscpp launcher). Both build the 7-layer MLP with every weight from
the oracle's formula (no RNG, no checkpoint), partition "uniform", micro-batches of 2, SGD lr
0.05, no clipping, fp32, 5 steps of 4 micro-batches; each data rank reads its own micro-batches
(the index shifted by 37 per data rank).

    compare_deepspeed_pipe.py --launcher L --ours pipe_vs_deepspeed [--stages 2] [--data 1] [--zero 0,1]

Cases: 2 stages x data 1 and 2, ZeRO 0 and 1, each ZeRO stage a fresh engine in the same
launch. ZeRO 2 is not compared: DeepSpeed refuses ZeRO stage 2 (and 3) with a pipeline
("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"), which is the point of ours.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/
from dscpp_test_ports import free_port  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--ours", required=True)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--data", type=int, default=1)
    ap.add_argument("--zero", default="0,1")
    args = ap.parse_args()
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "deepspeed.json")
        ds = subprocess.run([sys.executable, os.path.join(HERE, "deepspeed_pipe_oracle.py"), "--stages",
                             str(args.stages), "--data", str(args.data), "--zero", args.zero, "--out", out],
                            capture_output=True, text=True, env=env, timeout=600)
        if ds.returncode != 0:
            print(ds.stdout[-4000:], ds.stderr[-4000:])
            print("FAIL: DeepSpeed's pipeline did not run, or differs from plain PyTorch")
            return 1
        with open(out) as f:
            theirs = json.load(f)["cases"]
    world = args.stages * args.data
    p = subprocess.run([args.launcher, "--num_gpus", str(world), "--master_port", str(free_port()), args.ours,
                        "--stages", str(args.stages), "--zero", args.zero],
                       capture_output=True, text=True, env=env, timeout=300)
    if p.returncode != 0:
        print(p.stdout[-4000:], p.stderr[-4000:])
        print("FAIL: our pipeline engine did not run")
        return 1
    ours = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            ours[str(r["zero"])] = r["losses"]
    failed = False
    for zero in args.zero.split(","):
        a, b = ours.get(zero), theirs.get(zero)
        if not a or not b or len(a) != len(b):
            print(f"FAIL ZeRO {zero}: losses missing (ours {a}, DeepSpeed's {b})")
            failed = True
            continue
        worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
        ok = worst <= 1e-5
        failed |= not ok
        print(f"{'PASS' if ok else 'FAIL'} {args.stages} stages x {args.data} data, ZeRO {zero}: "
              f"largest relative difference {worst:.2e}")
        for step, (x, y) in enumerate(zip(a, b)):
            print(json.dumps({"step": step, "ours": x, "deepspeed": y}))
    if failed:
        return 1
    print("our pipeline engine equals DeepSpeed's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
