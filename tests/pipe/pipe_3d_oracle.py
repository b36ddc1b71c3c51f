#!/usr/bin/env python3
"""3D parallelism (pipe x data x model) = one rank: the 3D oracle.

    pipe_3d_oracle.py --launcher build/launcher/dscpp --train build/tests/pipe/pipe_train [--full]

Trains the tiny GPT (hidden 64, 4 heads, 4 layers, tied vocabulary-parallel embedding and
head; fp32, 20 steps, global batch 16, SGD with momentum, clipping at 1.0) in one process with
plain LibTorch (the reference) and with dscpp's PipelineEngine on DeepSpeed's PipeModelDataParallelTopology through
the launcher: the tensor-parallel GPT's LayerSpecs on each stage, ZeRO over the data group,
the tied head's gradients summed per model rank, the norm over pipe and model. Every case must
give the reference's losses, grad norms and weights (relative 1e-5; each split weight
reassembled from its model ranks' shards by its partition dim and stride), and each rank must
hold 1/t of its stage's split parameters and no other stage's layers (1/(t*p) of the layers).
Default: one launch of 8 ranks (2 x 2 x 2, ZeRO 1 and 2, gradient accumulation; the second
case with sequence parallelism and checkpoint_activations on); --full: the grid p x t x d in
{(2,2,1), (2,2,2), (4,2,1), (2,1,2), (1,2,4)} x ZeRO 0-2 x micro-batches {1, 2, 4}, and on the
layouts with t > 1 sequence parallelism (ZeRO 0-2), checkpointing, and both (ctest label
pipe_matrix). Prints one line per case and `N passed, M failed`."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from dscpp_test_ports import free_port  # noqa: E402

GLOBAL_BATCH = 16
TOL = 1e-5


def rel_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def run(cmd, timeout=900):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}... exited {p.returncode}:\n"
                           f"{p.stdout[-3000:]}{p.stderr[-3000:]}")


def make_case(p, t, d, m, z, flags=""):
    """flags: "sp" (sequence parallelism), "ck" (checkpoint_activations), "zb" (the ZB-H1
    schedule, split backward), joined by "_" (e.g. "sp_ck_zb"), or ""."""
    case = {"name": f"gpt3d_p{p}_t{t}_d{d}_m{m}_z{z}" + (f"_{flags}" if flags else ""),
            "stages": p, "model": t,
            "config": {"train_micro_batch_size_per_gpu": GLOBAL_BATCH // (m * d),
                       "gradient_accumulation_steps": m,
                       "zero_optimization": {"stage": z, "reduce_bucket_size": 3000}}}
    if "sp" in flags.split("_"):
        case["sp"] = True
    if "ck" in flags.split("_"):
        case["checkpoint_activations"] = True
    if "zb" in flags.split("_"):
        case["config"]["pipeline"] = {"schedule": "zb-h1"}
    return case


def result_path(out, case, s, m):
    suffix = f".model{m}" if case["model"] > 1 else ""
    return os.path.join(out, f"{case['name']}.stage{s}{suffix}.json")


def unshard(shards, dim, stride):
    """The whole tensor from its t shards (tensor_parallel_attr.h: cut along dim into t*stride
    pieces, rank r holding pieces r, r+t, ...)."""
    t = len(shards)
    pieces = [np.split(x, stride, axis=dim) for x in shards]
    return np.concatenate([pieces[k % t][k // t] for k in range(t * stride)], axis=dim)


def check(case, ref, out):
    p, t, d, z = case["stages"], case["model"], case["data"], case["zero"]
    runs = {(s, m): json.load(open(result_path(out, case, s, m))) for s in range(p)
            for m in range(t)}
    errors = []
    for (s, m), r in runs.items():
        for key in ("losses", "grad_norms"):
            e = rel_err(r[key], ref[key])
            if e > TOL:
                errors.append(f"stage {s} model {m}: {key} differ by {e:.2e}")
        if abs(r["eval_loss"] - ref["eval_loss"]) > TOL * abs(ref["eval_loss"]):
            errors.append(f"stage {s} model {m}: eval loss {r['eval_loss']} != {ref['eval_loss']}")
    # Weights: each from the first stage holding it, split ones reassembled over model ranks.
    merged = {}
    for s in range(p):
        for name in runs[(s, 0)]["params"]:
            if name in merged:
                continue
            shapes = [runs[(s, m)]["shapes"][name] for m in range(t)]
            vals = [np.asarray(runs[(s, m)]["params"][name]).reshape(shapes[m]) for m in range(t)]
            tp = runs[(s, 0)]["tp"].get(name)
            if tp:
                merged[name] = unshard(vals, tp[0], tp[1])
            else:
                merged[name] = vals[0]
                if any(rel_err(v, vals[0]) > 0 for v in vals[1:]):
                    errors.append(f"replicated {name} differs across model ranks")
    missing = set(ref["params"]) - set(merged)
    if missing:
        errors.append(f"no rank holds {sorted(missing)[:3]}")
    worst, where = 0.0, ""
    for n in ref["params"]:
        if n in merged:
            if merged[n].size != len(ref["params"][n]):
                errors.append(f"{n}: {merged[n].size} elements, the model's {len(ref['params'][n])}")
                continue
            e = rel_err(merged[n].ravel(), ref["params"][n])
            if e > worst:
                worst, where = e, n
    if worst > TOL:
        errors.append(f"weights differ by {worst:.2e} ({where})")
    # Memory: a rank holds its stage's layers only (the tied word embedding on both ends), its
    # split parameters' 1/t, replicas whole: 1/(t*p) of the split layers.
    for a in range(p):
        for b in range(a + 1, p):
            shared = set(runs[(a, 0)]["params"]) & set(runs[(b, 0)]["params"])
            if any(not n.startswith("embedding.word") for n in shared):
                errors.append(f"stages {a} and {b} both hold {sorted(shared)[:2]}")
    for (s, m), r in runs.items():
        split = sum(len(ref["params"][n]) for n in r["params"] if n in r["tp"])
        held_split = sum(len(r["params"][n]) for n in r["params"] if n in r["tp"])
        if t > 1 and held_split * t != split:
            errors.append(f"stage {s} model {m}: holds {held_split} of its {split} split elements")
        if t > 1 and not r["tp"]:
            errors.append(f"stage {s} model {m}: no split parameter")
        expect = r["total"] // d if z >= 1 else r["total"]
        if r["partition"] != expect or r["total"] < r["trainable_numel"]:
            errors.append(f"stage {s} model {m}: partition {r['partition']} of {r['total']}")
    return errors


def covering():
    # One launch of 8 ranks: sequence parallelism and checkpoint_activations on in the second.
    return [(2, 2, 2, 2, 1, ""), (2, 2, 2, 4, 2, "sp_ck")]


def full():
    layouts = [(2, 2, 1), (2, 2, 2), (4, 2, 1), (2, 1, 2), (1, 2, 4)]
    plain = [(p, t, d, m, z, "") for (p, t, d) in layouts for z in (0, 1, 2) for m in (1, 2, 4)
             if GLOBAL_BATCH % (m * d) == 0]
    # Sequence parallelism and checkpointing on the layouts with a model axis (t2p2d1 among
    # them, on 4 ranks): sp at every ZeRO stage, ck alone, both with accumulation.
    extra = []
    for (p, t, d) in layouts:
        if t == 1:
            continue
        extra += [(p, t, d, 2, z, "sp") for z in (0, 1, 2)]
        extra += [(p, t, d, 1, 1, "ck"), (p, t, d, 4, 2, "sp_ck")]
    # checkpoint_activations without a model axis (the one-rank GPT's LayerSpecs).
    extra += [(2, 1, 2, 2, 1, "ck")]
    return plain + extra


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--cases", default="",
                    help="p,t,d,m,z[,flags];... in place of the default set (flags: sp, ck, zb, joined by _)")
    args = ap.parse_args()
    out = tempfile.mkdtemp()
    run([args.train, "--mode", "reference", "--model", "gpt3d", "--steps", str(args.steps),
         "--out", out])
    with open(os.path.join(out, "reference.json")) as f:
        ref = json.load(f)
    by_world = {}
    chosen = []
    for c in args.cases.split(";"):
        if c:
            f = c.split(",")
            chosen.append(tuple(int(x) for x in f[:5]) + ((f[5] if len(f) > 5 else ""),))
    for c in chosen or (full() if args.full else covering()):
        by_world.setdefault(c[0] * c[1] * c[2], []).append(c)
    passed = failed = 0
    for world, combos in sorted(by_world.items()):
        cases = [make_case(*c) for c in combos]
        launch_error = None
        try:
            run([args.launcher, "--num_gpus", str(world), "--master_port", str(free_port()), args.train,
                 "--mode", "pipe", "--model", "gpt3d", "--steps", str(args.steps),
                 "--cases", json.dumps(cases), "--out", out])
        except Exception as e:  # noqa: BLE001 - the cases that finished are still checked
            launch_error = str(e)
            print(f"launch of {world} ranks failed: {launch_error[-2500:]}")
        for (p, t, d, m, z, _), c in zip(combos, cases):
            c.update(data=d, zero=z)
            if not all(os.path.exists(result_path(out, c, s, r)) for s in range(p)
                       for r in range(t)):
                errors = ["did not finish" + (" (the launch failed)" if launch_error else "")]
            else:
                errors = check(c, ref, out)
            print(("PASS " if not errors else "FAIL ") + c["name"] +
                  ("" if not errors else ": " + "; ".join(errors)), flush=True)
            passed += not errors
            failed += bool(errors)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
