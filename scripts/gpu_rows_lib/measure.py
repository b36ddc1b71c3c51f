"""A row's figures from its log, and the one table of a call.

Each system's program prints one line the figures come from: train_gpt its "[train_gpt] step"
lines (the last log interval), bench/pytorch_gpt.py "pytorch mode=...", bench/deepspeed_gpt.py
"deepspeed stage=...", bench/pytorch_moe_gpt.py "pytorch_moe ..."; bench/peak_rss.py adds
"peak_rss_gib=". TFLOP/s are recounted from tokens/s with one formula for every system where the
model config is a dense JSON GPT (6 N + 12 L h s per token, N as model_zoo counts parameters:
bench/row_logs.py's num_parameters); otherwise (the MoE GPT: 6 x active parameters) the
program's own figure. MFU is against the card's dense bf16 peak."""
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from row_logs import last_error, num_parameters, parse_deepspeed, parse_dscpp, parse_pytorch  # noqa: E402

# Dense bf16 tensor-core peaks, TFLOP/s, by the name torch.cuda.get_device_name gives.
PEAKS = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("GH200", 989.0),
         ("A100", 312.0)]


def peak_tflops(card):
    for key, peak in PEAKS:
        if key in (card or ""):
            return peak
    return None


def dense_config(model_path):
    """The model config if it is a dense JSON GPT that num_parameters counts, else None."""
    if not model_path or not model_path.endswith(".json"):
        return None
    with open(model_path) as f:
        c = json.load(f)
    # num_parameters counts the dense GELU GPT with learned positions; any other shape keeps
    # the program's own count.
    if set(c) & {"num_experts", "moe", "swiglu", "num_query_groups", "untie_embeddings_and_output_weights",
                 "add_bias_linear", "position_embedding_type", "normalization"}:
        return None
    return c


def flops_per_token(model_path):
    """6 N + 12 L h s of a dense JSON GPT config; None where the program's count must stand."""
    c = dense_config(model_path)
    if c is None:
        return None
    return 6.0 * num_parameters(c) + 12.0 * c["num_layers"] * c["hidden_size"] * c["seq_length"]


def parse_pytorch_moe(text):
    m = re.findall(r"^pytorch_moe (.*)$", text, re.M)
    if not m:
        return None
    kv = dict(re.findall(r"(\w+)=(\S+)", m[-1]))
    note = "compile failed: eager" if "compile_failed" in kv else ""
    if "load_balance" in kv:
        note += f"{', ' if note else ''}load balance {kv['load_balance']} (worst {kv.get('load_balance_worst', '?')})"
    if "oom_at_micro_batch" in kv:
        note += f"{', ' if note else ''}out of memory at micro-batch {kv['oom_at_micro_batch']}, ran at {kv['micro_batch']}"
    return {"tps": float(kv["tokens_per_s_per_gpu"]), "tflops_logged": float(kv["tflops_per_gpu"]),
            "peak_gib": float(kv["peak_mem_gib"]), "note": note}


def result(row, text, rc, model_path=None):
    """The row's figures: {'tps', 'tflops', 'peak_gib', 'metric', 'note', 'ok'}."""
    kind = row.get("kind", "train")
    out = {"tps": None, "tflops": None, "peak_gib": None, "metric": None, "note": "", "ok": rc == 0}
    notes = []
    if kind == "train":
        system = row["system"]
        if system == "dscpp":
            r = parse_dscpp(text)
        elif system == "deepspeed":
            r = parse_deepspeed(text)
        elif row.get("program") == "bench/pytorch_moe_gpt.py":
            r = parse_pytorch_moe(text)
        else:
            r = parse_pytorch(text)
        if r:
            out["tps"], out["peak_gib"] = r["tps"], r["peak_gib"]
            fpt = flops_per_token(model_path) if model_path else None
            out["tflops"] = r["tps"] * fpt / 1e12 if fpt else r["tflops_logged"]
            if fpt and abs(out["tflops"] - r["tflops_logged"]) > 0.02 * out["tflops"] + 0.5:
                notes.append(f"the program counted {r['tflops_logged']:.1f} TFLOP/s")
            if r.get("note"):
                notes.append(r["note"])
            if r.get("peak_kind") == "resident":
                notes.append("peak: host resident (CPU ranks)")
            steps = re.findall(r"\[train_gpt\] step .*load balance ([\d.]+) \(worst ([\d.]+)", text)
            if steps:
                notes.append(f"load balance {steps[-1][0]} (worst {steps[-1][1]})")
            out["metric"] = out["tps"]
        else:
            out["ok"] = False
    elif kind == "program":
        metric = row.get("metric")
        if metric:
            m = re.findall(metric["regex"], text, re.M)
            if m:
                v = m[-1][0] if isinstance(m[-1], tuple) else m[-1]
                out["metric"] = float(v.replace(",", ""))
                notes.append(f"{out['metric']:,.1f} {metric['unit']}")
            else:
                out["ok"] = False
        for pattern in row.get("summary", []):
            lines = [l.strip() for l in text.splitlines() if re.search(pattern, l) and not l.startswith("## ")]
            if len(lines) > 3:
                lines = lines[:1] + [f"... {len(lines) - 2} more ..."] + lines[-1:]
            notes += lines
    rss = re.findall(r"peak_rss_gib=([\d.]+)", text)
    if rss:
        c = dense_config(model_path)
        per = f" ({float(rss[-1]) * 2**30 / num_parameters(c):.1f} B a parameter)" if c else ""
        notes.append(f"host peak {float(rss[-1]):.1f} GiB{per}")
    if rc in (124, 137):
        notes.insert(0, f"cut at its time limit (rc={rc})")
        out["ok"] = False
    elif rc != 0:
        notes.insert(0, f"rc={rc}: {last_error(text)}")
        out["ok"] = False
    elif not out["ok"]:
        notes.insert(0, f"no figure in its log: {last_error(text)}")
    out["note"] = "; ".join(n for n in notes if n)
    return out


def details(row, text):
    """The last line of each kind that the row's `details` patterns match (kinds: the line with
    its numbers taken out), for below the table: e.g. each system's last step timers."""
    last = {}
    for pattern in row.get("details", []):
        for m in re.finditer(pattern, text, re.M):
            line = m.group(0).strip()
            last[(pattern, re.sub(r"[\d.]+", "", line))] = line
    return list(last.values())


def fmt(x, spec, none=""):
    return none if x is None else format(x, spec)


def table(entries, rows, peak):
    """Markdown lines: one line per entry {'name', 'status', 'wall', 'res'} in the order run."""
    by_name = {e["name"]: e for e in entries}
    lines = [f"| row | tokens/s per GPU | TFLOP/s per GPU | MFU ({fmt(peak, 'g', 'n/a')}) | peak GiB | ratio (reference) "
             "| wall s | note |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for e in entries:
        res, name = e.get("res"), e["name"]
        if res is None:
            lines.append(f"| {name} | | | | | | | {e['status']} |")
            continue
        ratios = []
        for ref in rows[name].get("reference", []) if isinstance(rows[name].get("reference"), list) \
                else [rows[name]["reference"]] if "reference" in rows[name] else []:
            other = by_name.get(ref, {}).get("res")
            if res["metric"] and other and other["metric"] and res["ok"] and other["ok"]:
                ratios.append(f"{res['metric'] / other['metric']:.3f}x {ref}")
        mfu = 100.0 * res["tflops"] / peak if res["tflops"] and peak else None
        note = (res["note"] or "").replace("|", "/")
        if e.get("instead_of"):
            note = f"in place of {e['instead_of']}; " + note
        lines.append(f"| {name} | {fmt(res['tps'], ',.0f')} | {fmt(res['tflops'], '.1f')} | "
                     f"{fmt(mfu, '.1f')}{'%' if mfu is not None else ''} | {fmt(res['peak_gib'], '.2f')} | "
                     f"{', '.join(ratios)} | {e.get('wall', '')} | {note} |")
    return lines
