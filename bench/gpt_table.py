#!/usr/bin/env python3
"""Prints the GPU benchmark table from the row logs bench/gpt_table.sh writes.

    python3 bench/gpt_table.py LOGDIR [--model-config bench/configs/gpt_1.3B_bench.json] [--peak 989]

LOGDIR holds <row>.log per row: mm.log (bench/matmul_peak.py's "matmul_tflops=" line),
dSxN.log (train_gpt at ZeRO stage S on N GPUs: its last "[train_gpt] step" line, i.e. the last
log interval, gives tokens/s per rank and peak memory allocated on rank 0), pt_*.log
(bench/pytorch_gpt.py's "pytorch mode=..." line), each with gpt_table.sh's trailer
"## gpt_table row=R rc=C wall_s=W". Missing rows are left out; failed ones are listed as such.

Everything is recomputed from tokens/s per GPU with one formula for both systems: FLOPs per
token = 6*Psi + 12*L*h*s, Psi the trainable parameters of the model config (tied embeddings once,
as model_zoo's GPTConfig::num_parameters counts them). MFU is given against --peak (989
TFLOP/s, H100/H200 dense bf16) and against the measured bf16 matrix rate. The ratio columns
divide each dscpp row's tokens/s per GPU by its like-for-like rows, named in the cell (like_rows).

Second table, dscpp rows only: peak memory per rank against the ZeRO paper's model states
(mixed-precision Adam; bytes per parameter: stage 0 16, stage 1 4 + 12/N, stage 2 2 + 14/N,
stage 3 16/N) plus activations, taken as the stage-0 row's peak minus 16*Psi (the stage-0 row
on the same GPU count if there is one, else the other). GiB = 2^30 bytes."""
import argparse
import collections
import json
import os
import re

CANONICAL = ["mm", "d0x1", "d1x1", "d2x1", "d3x1", "ds0x1", "ds0x1t", "ds1x1", "ds1x1t", "ds2x1", "ds2x1t",
             "ds2x1e", "ds2x1te", "ds3x1", "ds3x1t", "pt_single", "pt_single_c", "pt_single_w", "d0x2", "d1x2", "d2x2", "d2x2u", "d2x2n", "d2x2d", "d3x2",
             "pt_ddp", "pt_ddp_c", "pt_fsdp2", "pt_fsdp2_c"]
LABELS = {"pt_single": "PyTorch 1 GPU, autocast", "pt_ddp": "PyTorch DDP, autocast",
          "pt_fsdp2": "PyTorch FSDP2 (bf16 params, fp32 reduce)"}
GIB = float(2**30)


def num_parameters(c):
    """model_zoo/gpt_config.cpp's GPTConfig::num_parameters."""
    h, v = c["hidden_size"], c["vocab_size"]
    f = c.get("ffn_hidden_size") or 4 * h
    positions = c.get("max_position_embeddings") or c["seq_length"]
    block = 4 * h * h + 2 * h * f + 9 * h + f
    head = 0 if c.get("tie_word_embeddings", True) else v * h
    return v * h + positions * h + c["num_layers"] * block + 2 * h + head


def trailer(text):
    m = re.findall(r"^## gpt_table row=\S+ rc=(\d+) wall_s=(\d+)", text, re.M)
    return (int(m[-1][0]), int(m[-1][1])) if m else (None, None)


def last_error(text):
    """The last line that looks like an error, for a failed row."""
    lines = [l.strip() for l in text.splitlines() if l.strip() and not l.startswith("##")]
    for l in reversed(lines):
        if re.search(r"error|Error|ERROR|what\(\)|Killed|out of memory|Traceback|failed", l):
            return l[:160].replace("|", "/").replace("`", "'")
    return lines[-1][:160].replace("|", "/").replace("`", "'") if lines else "no output"


def parse_dscpp(text):
    steps = re.findall(
        r"\[train_gpt\] step (\d+)/(\d+) \|.*?\(([\d.]+) per rank\) \| ([\d.]+) TFLOP/s per rank"
        r".*?\| ([\d.]+) GiB (allocated|resident) \(peak\)", text)
    if not steps:
        return None
    step, total, tps, tflops, peak, kind = steps[-1]
    r = {"step": int(step), "iters": int(total), "tps": float(tps), "tflops_logged": float(tflops),
         "peak_gib": float(peak), "peak_kind": kind}
    m = re.search(r"\[train_gpt\] GPT ([\d.]+)M parameters.*?; (\d+) ranks on .*?ZeRO stage (\d)", text)
    if m:
        r.update(psi_logged=float(m.group(1)) * 1e6, ranks=int(m.group(2)), stage=int(m.group(3)))
    return r


def parse_pytorch(text):
    lines = re.findall(r"^.*?pytorch (mode=.*)$", text, re.M)
    if not lines:
        return None
    kv = dict(re.findall(r"(\w+)=(\S+)", lines[-1]))
    return {"tps": float(kv["tokens_per_s_per_gpu"]), "tflops_logged": float(kv["tflops_per_gpu"]),
            "peak_gib": float(kv["peak_mem_gib"]), "ranks": int(kv["gpus"]), "mode": kv["mode"],
            "compile": kv.get("compile") == "1", "psi_logged": float(kv.get("params", "nan"))}


def parse_deepspeed(text):
    lines = re.findall(r"^.*?deepspeed (stage=.*)$", text, re.M)
    if not lines:
        return None
    kv = dict(re.findall(r"(\w+)=(\S+)", lines[-1]))
    return {"tps": float(kv["tokens_per_s_per_gpu"]), "tflops_logged": float(kv["tflops_per_gpu"]),
            "peak_gib": float(kv["peak_mem_gib"]), "ranks": int(kv["gpus"]), "adam": kv["adam"],
            "psi_logged": float(kv.get("params", "nan"))}


def parse_mm(text):
    m = re.findall(r"matmul_tflops=([\d.]+)", text)
    return float(m[-1]) if m else None


def read_rows(logdir):
    names = sorted(f[:-4] for f in os.listdir(logdir) if f.endswith(".log"))
    order = [n for n in CANONICAL if n in names] + [n for n in names if n not in CANONICAL]
    rows = []
    for name in order:
        with open(os.path.join(logdir, name + ".log"), errors="replace") as f:
            text = f.read()
        rc, wall = trailer(text)
        m = re.findall(r"^## gpt_table row=.* (host=\S+ gpu0=\S+)", text, re.M)
        row = {"name": name, "rc": rc, "wall": wall, "text": text, "machine": m[-1] if m else None}
        if name == "mm":
            row["mm"] = parse_mm(text)
        elif name.startswith("ds"):
            row["r"] = parse_deepspeed(text)
            m = re.match(r"ds(\d)x(\d+)(t?)(e?)$", name)
            if m:
                row["ds_stage"], row["gpus"] = int(m.group(1)), int(m.group(2))
                row["torch_adam"], row["expandable"] = m.group(3) == "t", m.group(4) == "e"
        elif name.startswith("d"):
            row["r"] = parse_dscpp(text)
            m = re.match(r"d(\d)x(\d+)([undfg]?)$", name)
            if m:
                row["stage"], row["gpus"] = int(m.group(1)), int(m.group(2))
                row["unfused"] = m.group(3) == "u"  # bench/configs/gpt_1.3B_bench_unfused.json
                row["no_comm"] = m.group(3) == "n"  # train_gpt --bench-no-comm: the bound
                row["deferred"] = m.group(3) == "d"  # dscpp_deferred_allgather, LayerSpecs
                row["fused_ln"] = m.group(3) == "f"  # gpt_1.3B_bench_fusedln.json
                row["no_grad_fusion"] = m.group(3) == "g"  # gpt_1.3B_bench_nogradfusion.json
        elif name.startswith("pt_"):
            row["r"] = parse_pytorch(text)
            row["gpus"] = 1 if name.startswith("pt_single") else 2
        rows.append(row)
    return rows


def label(row):
    n = row["name"]
    if n.startswith("d") and "stage" in row:
        return f"dscpp ZeRO-{row['stage']}" + (", fusions off" if row.get("unfused") else "") + \
            (", collectives off (bound)" if row.get("no_comm") else "") + \
            (", deferred all-gathers" if row.get("deferred") else "") + \
            (", residual add + LayerNorm fused" if row.get("fused_ln") else "") + \
            (", gradient accumulation fusion off" if row.get("no_grad_fusion") else "")
    if "ds_stage" in row:
        return f"DeepSpeed ZeRO-{row['ds_stage']}, " + ("torch fused AdamW (torch_adam)" if row["torch_adam"]
                                                       else "its FusedAdam") + \
            (", expandable segments" if row["expandable"] else "")
    base = LABELS.get(n.removesuffix("_c").removesuffix("_w"), n)
    return base + (", compiled blocks" if n.endswith("_c") else "") + \
        (", whole model and loss compiled" if n.endswith("_w") else "")


def like_rows(row, ok):
    """The like-for-like rows a dscpp row is divided by (docs/performance.md, "Method"):
    DeepSpeed at the same stage and GPU count (the faster of its Adam rows), and PyTorch: on one
    GPU the whole model compiled (else compiled blocks, else eager); on two, FSDP2 (compiled if
    there)."""
    if "stage" not in row or row.get("unfused") or row.get("no_comm"):
        return None, None
    s, n = row["stage"], row["gpus"]
    ds = [ok[k] for k in (f"ds{s}x{n}", f"ds{s}x{n}t", f"ds{s}x{n}e", f"ds{s}x{n}te") if k in ok]
    ds = max(ds, key=lambda r: r["r"]["tps"]) if ds else None
    order = ["pt_single_w", "pt_single_c", "pt_single"] if n == 1 else ["pt_fsdp2_c", "pt_fsdp2"]
    pt = next((ok[k] for k in order if k in ok), None)
    return ds, pt


def ratio_cell(row, ref):
    return f"{row['r']['tps'] / ref['r']['tps']:.3f} ({ref['name']})" if ref else "n/a"


def fmt(x, spec, none="n/a"):
    return none if x is None else format(x, spec)


def model_states_bytes_per_param(stage, n):
    return {0: 16.0, 1: 4 + 12.0 / n, 2: 2 + 14.0 / n, 3: 16.0 / n}[stage]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("logdir")
    ap.add_argument("--model-config", default="bench/configs/gpt_1.3B_bench.json")
    ap.add_argument("--peak", type=float, default=989.0, help="peak dense bf16 TFLOP/s for MFU")
    args = ap.parse_args()
    with open(args.model_config) as f:
        c = json.load(f)
    psi = num_parameters(c)
    fpt = 6.0 * psi + 12.0 * c["num_layers"] * c["hidden_size"] * c["seq_length"]
    rows = read_rows(args.logdir)
    mm = next((r.get("mm") for r in rows if r["name"] == "mm"), None)
    ok = {r["name"]: r for r in rows if r.get("r")}
    for r in ok.values():
        r["tflops"] = r["r"]["tps"] * fpt / 1e12

    print(f"## GPT {psi / 1e9:.4f} B parameters (L={c['num_layers']} h={c['hidden_size']} s={c['seq_length']} "
          f"v={c['vocab_size']}), {fpt / 1e9:.3f} GFLOP per token (6N + 12Lhs)")
    print(f"Measured bf16 matrix rate (8192^3, median): {fmt(mm, '.1f')} TFLOP/s; peak for MFU: {args.peak:g}. "
          "dscpp: the last log interval of train_gpt; PyTorch: the timed steps after warm-up.\n")
    machines = collections.defaultdict(list)
    for r in rows:
        if r["machine"]:
            machines[r["machine"]].append(r["name"])
    if len(machines) > 1:
        print("WARNING: rows from different machines (compare only rows of one machine): " +
              "; ".join(f"{m}: {' '.join(n)}" for m, n in machines.items()) + "\n")
    print(f"| row | run | GPUs | tokens/s per GPU | TFLOP/s per GPU | MFU ({args.peak:g}) | MFU (matmul "
          f"{fmt(mm, '.0f')}) | peak memory GiB | / DeepSpeed (like row) | / PyTorch (like row) | wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        if row["name"] == "mm":
            continue
        name, wall = row["name"], fmt(row["wall"], "d", "?")
        r = row.get("r")
        if not r:
            why = ("no trailer (cut off?)" if row["rc"] is None else
                   f"cut at its time limit (rc={row['rc']})" if row["rc"] in (124, 137) else f"rc={row['rc']}")
            print(f"| {name} | {label(row)} | {row.get('gpus', '?')} | failed, {why}: "
                  f"`{last_error(row['text'])}` | | | | | | | {wall} |")
            continue
        t = row["tflops"]
        ds_ref, pt_ref = like_rows(row, ok)
        ratios = [ratio_cell(row, ds_ref), ratio_cell(row, pt_ref)] if "stage" in row else ["", ""]
        print(f"| {name} | {label(row)} | {row.get('gpus', r.get('ranks'))} | {r['tps']:,.0f} | {t:.1f} | "
              f"{100 * t / args.peak:.1f}% | {fmt(100 * t / mm if mm else None, '.1f')}{'%' if mm else ''} | "
              f"{r['peak_gib']:.2f} | {ratios[0]} | {ratios[1]} | {wall} |")
        if abs(t - r["tflops_logged"]) > 0.01 * max(t, 1e-9) + 0.5:
            print(f"|   | (the log said {r['tflops_logged']:.1f} TFLOP/s: another FLOP count?) | | | | | | | | | |")

    scaling = [(s, ok[f"d{s}x1"], ok[f"d{s}x2"]) for s in range(4) if f"d{s}x1" in ok and f"d{s}x2" in ok]
    bounds = [(n, ok[n[:-1]], ok[n]) for n in ok if re.match(r"d\dx2n$", n) and n[:-1] in ok]
    if scaling or bounds:
        print("\n## Scaling and the communication bound (tokens/s per GPU)\n")
        print("| measure | rows | tokens/s per GPU | ratio |")
        print("| --- | --- | --- | --- |")
        for s, one, two in scaling:
            print(f"| ZeRO-{s} scaling, 1 -> 2 GPUs | d{s}x1, d{s}x2 | {one['r']['tps']:,.0f} -> "
                  f"{two['r']['tps']:,.0f} | {100 * two['r']['tps'] / one['r']['tps']:.1f}% |")
        for n, real, bound in bounds:
            print(f"| {n[:-1]} against its collectives-off bound | {n[:-1]}, {n} | {real['r']['tps']:,.0f} / "
                  f"{bound['r']['tps']:,.0f} | {100 * real['r']['tps'] / bound['r']['tps']:.1f}% |")
    dscpp = [r for r in rows if r.get("r") and "stage" in r and not r.get("unfused") and not r.get("no_comm")]
    if not dscpp:
        return
    act = {}
    for n in (1, 2):
        d0 = ok.get(f"d0x{n}")
        if d0:
            act[n] = d0["r"]["peak_gib"] - 16.0 * psi / GIB
    print(f"\n## Peak memory per rank vs the ZeRO paper's model states (Psi = {psi:,}; 16 Psi = "
          f"{16 * psi / GIB:.2f} GiB); activations = stage-0 peak - 16 Psi: "
          + ", ".join(f"{a:.2f} GiB on {n} GPU{'s' if n > 1 else ''}" for n, a in act.items()) + "\n")
    print("| row | stage | GPUs | bytes/param | model states GiB | + activations GiB | predicted GiB | "
          "measured GiB | measured - predicted | measured / predicted |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in dscpp:
        s, n, r = row["stage"], row["gpus"], row["r"]
        bpp = model_states_bytes_per_param(s, n)
        states = bpp * psi / GIB
        a = act.get(n, act.get(3 - n))
        pred = states + a if a is not None else None
        meas = r["peak_gib"]
        print(f"| {row['name']} | {s} | {n} | {bpp:g} | {states:.2f} | {fmt(a, '.2f')} | {fmt(pred, '.2f')} | "
              f"{meas:.2f} | {fmt(meas - pred if pred is not None else None, '+.2f')} | "
              f"{fmt(meas / pred if pred else None, '.3f')} |")


if __name__ == "__main__":
    main()
