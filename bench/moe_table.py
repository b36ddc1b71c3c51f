#!/usr/bin/env python3
"""The MoE GPT row beside its PyTorch reference (scripts/gpu_run.sh GPU_MOE=1), as markdown.

    python3 bench/moe_table.py TRAIN_GPT_LOG PYTORCH_MOE_LOG

TRAIN_GPT_LOG: train_gpt's log (its last step line is the row: the last log interval, after the
earlier ones' warm-up); PYTORCH_MOE_LOG: bench/pytorch_moe_gpt.py's output (its pytorch_moe
line). Both count 6 x active parameters + 12 L h s FLOPs per token against 989 TFLOP/s. Prints
one row each (with the last step's load balance, max/mean routes per expert, which decides how
the experts' products run) and the ratio dscpp / PyTorch in tokens/s; a missing side prints as
such.
"""
import re
import sys

STEP = re.compile(r"\[train_gpt\] step (\d+)/\d+ \| loss (\S+) \|.*\| (\d+) tokens/s .*\| ([\d.]+) TFLOP/s per rank"
                  r" \| MFU ([\d.]+)% \(active parameters\).*\| ([\d.]+) GiB allocated \(peak\)")
BALANCE = re.compile(r"load balance ([\d.]+) \(worst ([\d.]+)")
GLOBAL = re.compile(r"global batch (\d+) = (\d+) x (\d+) x (\d+)")


def dscpp_row(path):
    try:
        text = open(path).read()
    except OSError:
        return None
    steps = STEP.findall(text)
    if not steps:
        return None
    step, loss, tps, tflops, mfu, peak = steps[-1]
    g = GLOBAL.search(text)
    lines = [l for l in text.splitlines() if f"step {step}/" in l]
    b = BALANCE.search(lines[-1]) if lines else None
    return {"balance": f"{b[1]} (worst {b[2]})" if b else "","run": "dscpp train_gpt", "micro": g[2] if g else "?", "accum": g[3] if g else "?",
            "tokens_per_s": float(tps), "tflops": float(tflops), "mfu": float(mfu), "peak": float(peak),
            "loss": float(loss), "note": f"step {step}"}


def pytorch_row(path):
    try:
        text = open(path).read()
    except OSError:
        return None
    m = re.search(r"^pytorch_moe .*$", text, re.M)
    if not m:
        return None
    f = dict(kv.split("=", 1) for kv in m[0].split()[1:])
    note = "blocks and loss compiled" if f["compile"] == "1" else "eager"
    if "compile_failed" in f:
        note += " (torch.compile failed: see its log)"
    if "oom_at_micro_batch" in f:
        note += f", out of memory at micro-batch {f['oom_at_micro_batch']}"
    balance = f"{f['load_balance']} (worst {f['load_balance_worst']})" if "load_balance" in f else ""
    return {"balance": balance, "run": "PyTorch, _grouped_mm experts", "micro": f["micro_batch"], "accum": f["accumulation"],
            "tokens_per_s": float(f["tokens_per_s_per_gpu"]), "tflops": float(f["tflops_per_gpu"]),
            "mfu": float(f["mfu"].rstrip("%")), "peak": float(f["peak_mem_gib"]), "loss": float(f["loss"]),
            "note": note}


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    rows = [("dscpp", dscpp_row(sys.argv[1])), ("PyTorch", pytorch_row(sys.argv[2]))]
    print("| run | micro-batch x accumulation | tokens/s | TFLOP/s | MFU (active, 989) | peak GiB | loss "
          "| load balance (max/mean) | note |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in rows:
        if r is None:
            print(f"| {name} | | no result | | | | | | see its log |")
            continue
        print(f"| {r['run']} | {r['micro']} x {r['accum']} | {r['tokens_per_s']:,.0f} | {r['tflops']:.1f} | "
              f"{r['mfu']:.1f}% | {r['peak']:.2f} | {r['loss']:.4f} | {r['balance']} | {r['note']} |")
    if rows[0][1] and rows[1][1]:
        print(f"\ndscpp / PyTorch: {rows[0][1]['tokens_per_s'] / rows[1][1]['tokens_per_s']:.3f}x tokens/s")


if __name__ == "__main__":
    main()
