#!/usr/bin/env python3
"""dscpp's flops profiler report, read as DeepSpeed's is, against DeepSpeed's own.

    python test_against_deepspeed.py --train-gpt build/examples/train_gpt

train_gpt trains the tiny GPT (model_zoo/configs/gpt_tiny.json at 16 tokens, micro-batch 2, fp32,
CPU) with a ds_config whose flops_profiler section writes the report at profile_step 1;
ds_flops_profile.py has DeepSpeed 0.19.8's engine profile the same model written in PyTorch at
the same step. Both reports are parsed with one parser written against DeepSpeed's labels:
 - the summary has the same labels in the same order and the same title;
 - params per GPU agree; every module of DeepSpeed's detailed tree is in ours, with its class,
   parameters and MACs;
 - fwd MACs per GPU: ours is DeepSpeed's plus the tied head's product. DeepSpeed misses that
   one: its engine starts the profiler inside the root module's forward pre-hook, so the hooks
   that would count the root's own functionals (the head's F.linear) are not yet installed
   for that call; the blocks, where every other product runs, agree exactly.
 - the aggregated profile's params at every depth agree, its MACs below the root too.
Last line: "N passed, M failed"; exits non-zero on any failure."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "data"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from dscpp_test_ports import free_port  # noqa: E402

passed = failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


UNITS = {"T": 1e12, "G": 1e9, "B": 1e9, "M": 1e6, "K": 1e3, "": 1, "m": 1e-3, "u": 1e-6}


def number(text, suffix=""):
    """'25.69 MMACs' -> 25.69e6 (DeepSpeed's number_to_string read back)."""
    m = re.fullmatch(r"([0-9.e+-]+) ?([TGBMKmu]?)" + suffix, text.strip())
    if not m:
        raise ValueError(f"not a DeepSpeed number: {text!r}")
    return float(m.group(1)) * UNITS[m.group(2)]


def parse(report):
    """{'title', 'summary': [(label, value)], 'aggregated': {depth: {field: dict}},
    'modules': {path: (class, params, macs)}} from print_model_profile's text."""
    lines = report.splitlines()
    out = {"summary": [], "aggregated": {}, "modules": {}}
    i = 0
    while not lines[i].startswith("Profile Summary at step"):
        i += 1
    out["title"] = lines[i]
    while lines[i].strip():  # the notations
        i += 1
    i += 1
    while lines[i].strip():
        label, value = lines[i][:70], lines[i][72:]
        out["summary"].append((label.rstrip(), value.rstrip()))
        i += 1
    depth = None
    while i < len(lines) and "Detailed Profile per GPU" not in lines[i]:
        m = re.match(r"depth (\d+):", lines[i])
        if m:
            depth = int(m.group(1))
            out["aggregated"][depth] = {}
        m = re.match(r"    (params|MACs|fwd latency) +- (\{.*\})", lines[i])
        if m:
            out["aggregated"][depth][m.group(1)] = eval(m.group(2))  # a Python dict's repr
        i += 1
    # The module tree: "(name): Class(" opens a module (2 spaces a level), its first line or
    # the rest of its own line holds "P = x% Params, M = y% MACs, ...".
    stats = re.compile(r"([^,]+) = [0-9.]+% Params, ([^,]+) = [0-9.]+% MACs")
    stack = []  # (indent, path)
    for n, text in enumerate(lines[i:]):
        m = re.match(r"( *)(?:\((\S+)\): )?(?:\d+ x )?(\w+)\((.*)$", text)
        if not m or (not m.group(2) and m.group(1)):
            continue
        indent, name, cls, rest = len(m.group(1)), m.group(2), m.group(3), m.group(4)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([p for _, p in stack if p] + ([name] if name else []))
        stack.append((indent, name or ""))
        s = stats.match(rest) or (stats.match(lines[i + n + 1].strip()) if i + n + 1 < len(lines) else None)
        if s and cls != "ModuleList":
            out["modules"][path] = (cls, s.group(1), number(s.group(2), "MACs"))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-gpt", required=True)
    args = ap.parse_args()
    import megatron_format

    seq, batch = 16, 2
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(ROOT, "model_zoo", "configs", "gpt_tiny.json")) as f:
            model = json.load(f)
        model["seq_length"] = seq
        model_path = os.path.join(tmp, "gpt.json")
        with open(model_path, "w") as f:
            json.dump(model, f)
        prefix = os.path.join(tmp, "tokens")
        megatron_format.write(prefix, [[[(97 * i + 31 * j) % model["vocab_size"] for j in range(200)]]
                                       for i in range(8)], "uint16")
        ours_file = os.path.join(tmp, "ours", "flops.txt")
        ds = {"train_micro_batch_size_per_gpu": batch, "optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
              "steps_per_print": 1 << 30,
              "flops_profiler": {"enabled": True, "profile_step": 1, "output_file": ours_file}}
        ds_path = os.path.join(tmp, "ds.json")
        with open(ds_path, "w") as f:
            json.dump(ds, f)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        p = subprocess.run([args.train_gpt, "--model-config", model_path, "--train-data-path", prefix,
                            "--deepspeed_config", ds_path, "--train-iters", "3", "--log-interval", "100"],
                           capture_output=True, text=True, timeout=300, env=env)
        check("train_gpt with flops_profiler trains", p.returncode == 0, p.stdout + p.stderr)
        check("train_gpt announces no flops_profiler key as ignored", "flops_profiler" not in p.stderr, p.stderr)
        check("train_gpt wrote the report to output_file", os.path.exists(ours_file))
        if not os.path.exists(ours_file):
            return 1
        theirs_file = os.path.join(tmp, "ds_flops.txt")
        env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()))
        d = subprocess.run([sys.executable, os.path.join(HERE, "ds_flops_profile.py"), "--model-config", model_path,
                            "--seq", str(seq), "--batch", str(batch), "--out", theirs_file],
                           capture_output=True, text=True, timeout=600, env=env)
        check("DeepSpeed profiles the same model", d.returncode == 0 and os.path.exists(theirs_file),
              d.stdout[-3000:] + d.stderr[-3000:])
        if failed:
            return 1
        with open(ours_file) as f:
            ours_text = f.read()
        with open(theirs_file) as f:
            theirs_text = f.read()
        ours, theirs = parse(ours_text), parse(theirs_text)

    check("the same title", ours["title"] == theirs["title"], f"{ours['title']!r} vs {theirs['title']!r}")
    labels = [label for label, _ in ours["summary"]]
    check("the summary has DeepSpeed's labels, in its order", labels == [l for l, _ in theirs["summary"]],
          f"\nours:   {labels}\ntheirs: {[l for l, _ in theirs['summary']]}")
    o, t = dict(ours["summary"]), dict(theirs["summary"])
    for label in ("world size:", "data parallel size:", "model parallel size:", "batch size per GPU:",
                  "params per GPU:", "params of model = params per GPU * mp_size:"):
        check(f"'{label}' agrees", o.get(label) == t.get(label), f"{o.get(label)!r} vs {t.get(label)!r}")
    for label, suffix in (("fwd latency:", "s"), ("bwd latency:", "s"), ("step latency:", "s"),
                          ("iter latency:", "s"), ("fwd flops per GPU:", "")):
        check(f"'{label}' is a DeepSpeed number", number(o[label], suffix) > 0, o[label])
    check("samples/second is a number", float(o["samples/second:"]) > 0, o["samples/second:"])

    head = batch * seq * model["hidden_size"] * model["vocab_size"]
    ours_macs, theirs_macs = number(o["fwd MACs per GPU:"], "MACs"), number(t["fwd MACs per GPU:"], "MACs")
    check("fwd MACs per GPU: DeepSpeed's plus the tied head's", abs(ours_macs - (theirs_macs + head)) <=
          0.005 * ours_macs, f"ours {ours_macs:g}, DeepSpeed's {theirs_macs:g} + head {head:g}")

    for path, (cls, params, macs) in theirs["modules"].items():
        mine = ours["modules"].get(path)
        check(f"module '{path}' is in our tree", mine is not None)
        if mine is None:
            continue
        check(f"module '{path}' is a {cls}", mine[0] == cls, mine[0])
        check(f"module '{path}' has {params} params", mine[1] == params, mine[1])
        if path:  # the root: see fwd MACs above
            check(f"module '{path}' has DeepSpeed's MACs", abs(mine[2] - macs) <= 0.005 * max(macs, 1),
                  f"{mine[2]:g} vs {macs:g}")
    check("the tree has every block's modules", len(theirs["modules"]) >= 4 * 7 + 5, len(theirs["modules"]))

    check("the aggregated profile has DeepSpeed's depths", sorted(ours["aggregated"]) == sorted(theirs["aggregated"]),
          f"{sorted(ours['aggregated'])} vs {sorted(theirs['aggregated'])}")
    for depth, fields in theirs["aggregated"].items():
        mine = ours["aggregated"].get(depth, {})
        check(f"depth {depth}: the same top params", mine.get("params") == fields["params"],
              f"{mine.get('params')} vs {fields['params']}")
        if depth > 0:
            check(f"depth {depth}: the same top MACs", mine.get("MACs") == fields["MACs"],
                  f"{mine.get('MACs')} vs {fields['MACs']}")
    if failed:
        print("--- ours ---\n" + ours_text + "\n--- DeepSpeed's ---\n" + theirs_text)
    return 0


if __name__ == "__main__":
    rc = main()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed or rc else 0)
