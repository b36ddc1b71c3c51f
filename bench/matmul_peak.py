#!/usr/bin/env python3
"""The measured bf16 matrix rate of one GPU: bench/rows.toml's row matmul-peak.

    python3 bench/matmul_peak.py [--n 8192] [--iters 20] [--warmup 5] [--device 0]

Random n x n bf16 inputs, C = A @ B (2 n^3 FLOPs), each product timed with its own pair of
CUDA events after --warmup untimed products (cuBLAS picks its kernel and the clocks settle).
Prints one machine-readable line:
    matmul n=8192 dtype=bf16 device="NVIDIA H200" iters=20 matmul_tflops=<median> min_tflops=.. max_tflops=..
The median, not the best: a sustained rate is what a training step can hope for."""
import argparse
import statistics

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args()
    torch.cuda.set_device(args.device)
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16, generator=g)
    c = torch.empty_like(a)
    for _ in range(args.warmup):
        torch.matmul(a, b, out=c)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(args.iters)]
    for start, end in events:
        start.record()
        torch.matmul(a, b, out=c)
        end.record()
    torch.cuda.synchronize()
    flops = 2.0 * args.n**3
    rates = [flops / (s.elapsed_time(e) * 1e-3) / 1e12 for s, e in events]
    print(f"matmul n={args.n} dtype=bf16 device=\"{torch.cuda.get_device_name()}\" iters={args.iters} "
          f"matmul_tflops={statistics.median(rates):.1f} min_tflops={min(rates):.1f} max_tflops={max(rates):.1f}",
          flush=True)


if __name__ == "__main__":
    main()
