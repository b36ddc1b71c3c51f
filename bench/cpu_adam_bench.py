#!/usr/bin/env python3
"""dscpp's CPU Adam beside DeepSpeed's DeepSpeedCPUAdam on the same cores and partition sizes.

    cpu_adam_bench.py --bench build/bench/cpu_adam_bench [--threads T] [--sizes N,N] [--steps K]
                      [--only dscpp|deepspeed]

Both step an fp32 partition with fp32 Adam state from an fp32 gradient (28 bytes moved per
element: p, m, v and g read, p, m, v written); dscpp also with a bf16 gradient and a bf16
parameter copy written in the same pass (DeepSpeed's CPU Adam has no such pass; ZeRO-Offload
copies its fp16 parameters separately). Prints one table row per implementation and size:
elements/s (the mean over the steps and the fastest step), GB/s reached, and the GB/s of the reference that moves the same bytes through the same
arrays on the same threads, cut as the kernel cuts them, with next to no arithmetic (cpu_adam_bench.cpp's
stream_reference: the fair ceiling; DeepSpeed's rows are set against the fp32 one), and that share.
--thp sets THP_MEM_ALLOC_ENABLE=1 for both (LibTorch's CPU allocator then gives allocations of 2 MiB
or more transparent huge pages: fewer TLB misses, and the hardware prefetchers, which stop at page
boundaries, run on).
DeepSpeed's op is JIT-built with g++ into TORCH_EXTENSIONS_DIR (build/torch_extensions) once."""
import argparse
import json
import os
import subprocess
import sys
import time

import torch


def deepspeed_row(n, steps, threads):
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    torch.set_num_threads(threads)
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n) * 0.01
    opt = DeepSpeedCPUAdam([p], lr=1e-3, weight_decay=0.01)
    opt.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    dt = sum(times) / steps
    return {"impl": "deepspeed", "n": n, "grad": "fp32", "threads": threads,
            "elements_per_s": n / dt, "best_elements_per_s": n / min(times), "bytes_per_element": 28,
            "gb_per_s": n * 28 / dt / 1e9}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", help="the cpu_adam_bench executable (dscpp's rows)")
    ap.add_argument("--only", choices=["dscpp", "deepspeed"],
                    help="one implementation's rows (the GPU rows cpuadam-dscpp and cpuadam-ds run one each)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--sizes", default=f"{1 << 20},{1 << 24},{1 << 26}")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--thp", action="store_true", help="THP_MEM_ALLOC_ENABLE=1 for both")
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if args.thp:
        env["THP_MEM_ALLOC_ENABLE"] = "1"
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"  # this process's (DeepSpeed's) tensors too
    if args.only != "deepspeed" and not args.bench:
        ap.error("--bench is required for dscpp's rows")
    rows = []
    for grad in ("fp32", "bf16") if args.only != "deepspeed" else ():
        out = subprocess.run([args.bench, "--sizes", args.sizes, "--steps", str(args.steps), "--grad", grad],
                             env=env, capture_output=True, text=True, check=True).stdout
        rows += [json.loads(line) for line in out.splitlines() if line.strip()]
    ref_of = {(r["n"], r["grad"]): r["ref_gb_per_s"] for r in rows}
    try:
        for n in map(int, args.sizes.split(",")) if args.only != "dscpp" else ():
            rows.append(deepspeed_row(n, args.steps, args.threads))
    except Exception as e:  # noqa: BLE001 - no DeepSpeed op here: say why, keep our rows
        print(f"DeepSpeed's CPU Adam did not run: {e}", file=sys.stderr)
        if args.only == "deepspeed":
            return 1
    print(f"{'impl':10} {'grad':5} {'elements':>10} {'threads':>7} {'Melem/s':>9} {'best':>9} {'B/elem':>6} "
          f"{'GB/s':>6} {'ref GB/s':>8} {'of ref':>6} {'vs DS':>6} {'best vs DS':>10}" + ("  (THP)" if args.thp else ""))
    ds = {r["n"]: r for r in rows if r["impl"] == "deepspeed"}
    for r in rows:
        d = ds.get(r["n"])
        ratio = f"{r['elements_per_s'] / d['elements_per_s']:.2f}x" if d else ""
        best_ratio = f"{r['best_elements_per_s'] / d['best_elements_per_s']:.2f}x" if d else ""
        ref = ref_of.get((r["n"], r["grad"]), 0.0)
        share = f"{100 * r['gb_per_s'] / ref:.0f}%" if ref else ""
        print(f"{r['impl']:10} {r['grad']:5} {r['n']:>10} {r['threads']:>7} {r['elements_per_s'] / 1e6:>9.1f} "
              f"{r['best_elements_per_s'] / 1e6:>9.1f} {r['bytes_per_element']:>6} {r['gb_per_s']:>6.2f} "
              f"{ref:>8.2f} {share:>6} {ratio:>6} {best_ratio:>10}")
    threading = {r.get("threading") for r in rows if r["impl"] == "dscpp"}
    print(f"dscpp threading: {', '.join(sorted(t for t in threading if t))}; "
          "best: the fastest of the steps (the mean carries whatever else ran on the machine)")

if __name__ == "__main__":
    sys.exit(main())
