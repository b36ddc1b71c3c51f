"""The CPU optimizers (ops/cpu_adam.h) step by step against PyTorch's torch.optim (Adam,
AdamW, Adagrad), a Python Lion written from the paper's update, and DeepSpeed's own CPU
kernels (DeepSpeedCPUAdam, DeepSpeedCPUAdagrad, DeepSpeedCPULion, JIT-built once with g++
into TORCH_EXTENSIONS_DIR; --deepspeed-algos picks which, as each build takes minutes on 2 cores). Every step's parameters within 1e-6 relative (fp32 arithmetic in
a different order), and DeepSpeed's within 1e-6 too."""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

N = 4099  # whole vectors, a partial one, several tiles
STEPS = 5


def lion_reference(p, grads, lr, wd, b1=0.9, b2=0.99):
    m = torch.zeros_like(p)
    out = []
    for g in grads:
        c = b1 * m + (1 - b1) * g
        p = p * (1 - lr * wd) - lr * torch.sign(c)
        m = b2 * m + (1 - b2) * g
        out.append(p.clone())
    return out


def torch_run(algo, p0, grads, lr, wd):
    p = torch.nn.Parameter(p0.clone())
    if algo == "adam":
        opt = torch.optim.Adam([p], lr=lr, weight_decay=wd)
    elif algo == "adamw":
        opt = torch.optim.AdamW([p], lr=lr, weight_decay=wd)
    elif algo == "adagrad":
        opt = torch.optim.Adagrad([p], lr=lr, weight_decay=wd, eps=1e-10)
    else:
        return lion_reference(p0.clone(), grads, lr, wd)
    out = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        out.append(p.detach().clone())
    return out


def deepspeed_run(algo, p0, grads, lr, wd):
    if algo in ("adam", "adamw"):
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        make = lambda ps: DeepSpeedCPUAdam(ps, lr=lr, weight_decay=wd, adamw_mode=(algo == "adamw"))
    elif algo == "adagrad":
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
        make = lambda ps: DeepSpeedCPUAdagrad(ps, lr=lr, weight_decay=wd, eps=1e-10)
    else:
        from deepspeed.ops.lion import DeepSpeedCPULion
        make = lambda ps: DeepSpeedCPULion(ps, lr=lr, betas=(0.9, 0.99), weight_decay=wd)
    p = torch.nn.Parameter(p0.clone())
    opt = make([p])
    out = []
    for g in grads:
        p.grad = g.clone()
        opt.step()
        out.append(p.detach().clone())
    return out


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--no-deepspeed", action="store_true")
    ap.add_argument("--deepspeed-algos", default="adam,adamw,adagrad,lion",
                    help="the algorithms also checked against DeepSpeed's kernels (each one a JIT build)")
    args = ap.parse_args()
    torch.manual_seed(0)
    failures = []
    cases = [("adam", 1e-2, 0.1), ("adamw", 1e-2, 0.1), ("adagrad", 5e-2, 0.01), ("lion", 1e-3, 0.5),
             ("adamw", 1e-3, 0.0)]
    for algo, lr, wd in cases:
        p0 = torch.randn(N)
        grads = [torch.randn(N) * 0.1 for _ in range(STEPS)]
        with tempfile.TemporaryDirectory() as d:
            p0.numpy().tofile(os.path.join(d, "p0.bin"))
            for k, g in enumerate(grads, 1):
                g.numpy().tofile(os.path.join(d, f"g{k}.bin"))
            run = subprocess.run([args.cli, algo, d, str(N), str(STEPS), repr(lr), repr(wd)],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                print(run.stderr)
                return 1
            ours = [torch.from_numpy(np.fromfile(os.path.join(d, f"p{k}.bin"), dtype=np.float32))
                    for k in range(1, STEPS + 1)]
        refs = {"torch": torch_run(algo, p0, grads, lr, wd)}
        if not args.no_deepspeed and algo in args.deepspeed_algos.split(","):
            refs["deepspeed"] = deepspeed_run(algo, p0, grads, lr, wd)
        for name, ref in refs.items():
            errs = [rel(o, r) for o, r in zip(ours, ref)]
            print(f"{algo} lr={lr} wd={wd} vs {name} ({run.stdout.strip()}): per-step rel err "
                  + " ".join(f"{e:.2e}" for e in errs))
            if max(errs) > 1e-6:
                failures.append(f"{algo} vs {name}")
    if failures:
        print("FAILED:", ", ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
