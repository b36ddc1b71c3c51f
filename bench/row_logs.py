#!/usr/bin/env python3
"""The figures each GPU row's program prints, read from its log (scripts/gpu_rows.py's table).

train_gpt: its last "[train_gpt] step" line (the last log interval): tokens/s per rank, its
TFLOP/s, peak memory (allocated on a GPU, resident on CPU ranks). bench/pytorch_gpt.py: its
"pytorch mode=..." line; bench/deepspeed_gpt.py: its "deepspeed stage=..." line. num_parameters
counts a dense GPT config's parameters as model_zoo's GPTConfig::num_parameters does (tied
embeddings once), for FLOPs per token = 6 N + 12 L h s."""
import re


def num_parameters(c):
    """model_zoo/gpt_config.cpp's GPTConfig::num_parameters."""
    h, v = c["hidden_size"], c["vocab_size"]
    f = c.get("ffn_hidden_size") or 4 * h
    positions = c.get("max_position_embeddings") or c["seq_length"]
    block = 4 * h * h + 2 * h * f + 9 * h + f
    head = 0 if c.get("tie_word_embeddings", True) else v * h
    return v * h + positions * h + c["num_layers"] * block + 2 * h + head


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
