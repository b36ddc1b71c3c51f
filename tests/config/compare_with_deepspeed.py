#!/usr/bin/env python3
"""Compare dscpp's ds_config resolution with DeepSpeed 0.19.8's, over a directory of real configs.

    compare_with_deepspeed.py --report PATH/TO/dscpp_report --wild-dir DIR \
        --expect tests/config/deepspeed_differences.json

For every *.json / *.conf in DIR and world sizes 1, 2, 8 (with the fixed "auto" values below),
resolves the file with DeepSpeed (deepspeed_reference.resolve) and with dscpp_report (resolved
JSON, exit 0; or exit 2 and a message when it refuses the file), and prints PASS/FAIL per
file/world size, then "N passed, M failed". Exits 1 if anything failed. dscpp's side runs in one
process (`dscpp_report --config-list`, a launch each cost 0.45 s x 180); the first --cli-sample
requests also run as `dscpp_report --config FILE --world-size N --auto KEY=VALUE ...` and must
give the same exit, stdout and stderr, so the command line's path is still compared.
Without --report it only prints DeepSpeed's accept/refuse table.

Deliberate differences (--expect) are a JSON object keyed by file name:
    {"<file>": {"reason": "why dscpp differs on purpose",
                "keys": ["zero_optimization.stage3_param_persistence_threshold"],  # optional
                "outcome": "dscpp accepts, DeepSpeed refuses",                      # optional
                "world_sizes": [8]}}                                                # optional
"keys" excuses value differences at those keys (and below them); "outcome" excuses a refusal
mismatch, either "dscpp accepts, DeepSpeed refuses" or "dscpp refuses, DeepSpeed accepts";
"world_sizes" limits the entry to those world sizes (default: all).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import hjson

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deepspeed_reference import resolve  # noqa: E402

WORLD_SIZES = [1, 2, 8]
AUTOS = {  # what Hugging Face would fill in; batch sizes come from autos_for()
    "gradient_clipping": 1.0,
    "optimizer.params.lr": 1e-4,
    "optimizer.params.betas": [0.9, 0.999],
    "optimizer.params.eps": 1e-8,
    "optimizer.params.weight_decay": 0.01,
    "scheduler.params.warmup_min_lr": 0,
    "scheduler.params.warmup_max_lr": 1e-4,
    "scheduler.params.warmup_num_steps": 100,
    "scheduler.params.total_num_steps": 1000,
    "zero_optimization.reduce_bucket_size": 1048576,
    "zero_optimization.stage3_prefetch_bucket_size": 943718,
    "zero_optimization.stage3_param_persistence_threshold": 10240,
    "fp16.enabled": False,
    "bf16.enabled": False,
}
DS_REFUSES = "dscpp accepts, DeepSpeed refuses"
DSCPP_REFUSES = "dscpp refuses, DeepSpeed accepts"


def autos_for(path, world_size):
    """AUTOS plus batch sizes as HF fills them for per-device batch 2 and accumulation 1,
    or the file's own fixed values (a training run consistent with the file)."""
    try:
        with open(path) as f:
            cfg = hjson.load(f)
    except Exception:  # DeepSpeed will refuse it anyway
        cfg = None
    cfg = cfg if isinstance(cfg, dict) else {}
    fixed = lambda key, default: cfg.get(key) if isinstance(cfg.get(key), int) else default
    micro, gas = fixed("train_micro_batch_size_per_gpu", 2), fixed("gradient_accumulation_steps", 1)
    return {**AUTOS, "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas,
            "train_batch_size": micro * gas * world_size}


def request(path, world_size, autos):
    return {"config": path, "world_size": world_size, "autos": autos}


def run_dscpp_list(report, requests, tmp):
    """dscpp_report --config-list over every request: [(exit, stdout, stderr)] in order."""
    listing = os.path.join(tmp, "requests.jsonl")
    with open(listing, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in requests)
    p = subprocess.run([report, "--config-list", listing], capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"dscpp_report --config-list exited {p.returncode}: {p.stderr.strip()}")
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    if len(lines) != len(requests):
        raise RuntimeError(f"dscpp_report --config-list answered {len(lines)} of {len(requests)} requests")
    return [(l["exit"], l["stdout"], l["stderr"]) for l in lines]


def interpret(exit_code, out, err):
    """One answer as a resolution: {"error": msg} if refused; raises RuntimeError if it misbehaves."""
    if exit_code == 2:
        return {"error": err.strip()}
    if exit_code != 0:
        raise RuntimeError(f"dscpp_report exited {exit_code}: {err.strip()}")
    try:
        return json.loads(out)
    except ValueError as e:
        raise RuntimeError(f"dscpp_report printed invalid JSON ({e})")


def run_cli(report, req):
    cmd = [report, "--config", req["config"], "--world-size", str(req["world_size"])]
    for key, value in req["autos"].items():
        cmd += ["--auto", f"{key}={json.dumps(value)}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def same(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or abs(a - b) <= 1e-12 * max(abs(a), abs(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def diff(ds, cpp, prefix=""):
    """[(dotted key, DeepSpeed value, dscpp value)] where the two resolutions differ."""
    if isinstance(ds, dict) and isinstance(cpp, dict):
        out = []
        # dscpp's report holds more sections than this schema: compare the schema's keys,
        # and optimizer/scheduler params objects whole.
        keys = list(ds) + ([k for k in cpp if k not in ds] if prefix.endswith("params.") else [])
        for k in keys:
            out += diff(ds.get(k, "<missing>"), cpp.get(k, "<missing>"), f"{prefix}{k}.")
        return out
    return [] if same(ds, cpp) else [(prefix[:-1], ds, cpp)]


def covered(key, keys):
    return any(key == k or key.startswith(k + ".") for k in keys)


def check(ds, cpp, expect):
    """(ok, message) for one file/world size."""
    ds_err, cpp_err = ds.get("error"), cpp.get("error")
    if ds_err and cpp_err:
        return True, "both refuse"
    if ds_err or cpp_err:
        outcome = DS_REFUSES if ds_err else DSCPP_REFUSES
        msg = f"{outcome}: {ds_err or cpp_err}"
        if expect.get("outcome") == outcome:
            return True, f"expected ({expect['reason']}) {msg}"
        return False, msg
    diffs = diff(ds, cpp)
    bad = [d for d in diffs if not covered(d[0], expect.get("keys", []))]
    msg = "; ".join(f"{k}: deepspeed={json.dumps(a)} dscpp={json.dumps(b)}" for k, a, b in bad or diffs)
    if bad:
        return False, msg
    return True, f"expected ({expect['reason']}) {msg}" if diffs else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", help="dscpp_report binary (omit: only show DeepSpeed's verdicts)")
    ap.add_argument("--wild-dir", required=True)
    ap.add_argument("--expect", help="deliberate differences, JSON (see module doc)")
    ap.add_argument("--cli-sample", type=int, default=6,
                    help="requests also run one launch each through --config (half refusals)")
    args = ap.parse_args()
    expectations = json.load(open(args.expect)) if args.expect else {}
    files = sorted(f for f in os.listdir(args.wild_dir) if f.endswith((".json", ".conf")))
    for name in sorted(set(expectations) - set(files)):
        print(f"warning: {args.expect} names {name}, which is not in {args.wild_dir}")

    cases = []  # (name, world size, DeepSpeed's resolution, expectation, dscpp request)
    for name in files:
        path = os.path.join(args.wild_dir, name)
        for n in WORLD_SIZES:
            autos = autos_for(path, n)
            ds = resolve(path, n, autos)
            if not args.report:
                print(f"{name} ws={n}: " + (f"REFUSE {ds['error'].splitlines()[0]}"
                                            if "error" in ds else "accept"))
                continue
            expect = expectations.get(name, {})
            if n not in expect.get("world_sizes", WORLD_SIZES):
                expect = {}
            cases.append((name, n, ds, expect, request(path, n, autos)))
    passed = failed = 0
    if args.report:
        with tempfile.TemporaryDirectory() as tmp:
            answers = run_dscpp_list(args.report, [c[4] for c in cases], tmp)
        # The command line's path gives what the batch gave (refusals and acceptances both).
        sample = [i for i, a in enumerate(answers) if a[0] == 2][:args.cli_sample // 2]
        sample += [i for i, a in enumerate(answers) if a[0] == 0][:args.cli_sample - len(sample)]
        for i in sample:
            name, n = cases[i][0], cases[i][1]
            ok = run_cli(args.report, cases[i][4]) == answers[i]
            passed, failed = passed + ok, failed + (not ok)
            print(f"{'PASS' if ok else 'FAIL'} {name} ws={n}: --config gives what --config-list gave")
        for (name, n, ds, expect, _), answer in zip(cases, answers):
            try:
                ok, msg = check(ds, interpret(*answer), expect)
            except RuntimeError as e:
                ok, msg = False, str(e)
            passed, failed = passed + ok, failed + (not ok)
            print(f"{'PASS' if ok else 'FAIL'} {name} ws={n}" + (f": {msg}" if msg else ""))
    if args.report:
        print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
