#!/usr/bin/env python3
"""Pipeline = one rank: the pipeline's single-rank oracle.

    pipe_oracle.py --launcher build/launcher/dscpp --train build/tests/pipe/pipe_train [--full]

Trains an MLP stack (8 layers) and model_zoo's tiny GPT (tied embedding and head) for 20
steps in fp32 with plain LibTorch in one process (the reference, the whole global batch of
16 per step) and with dscpp's PipelineEngine through the launcher: pipeline 2 and 4 stages x
data 1 and 2, micro-batches 1, 2, 4 and 8, plain 1F1B and interleaved (2 chunks), ZeRO 0, 1
and 2. Every case must end with the reference's losses and weights (relative 1e-5), and each
rank must hold only its stage's parameters (names and sizes) and, at ZeRO 1-2, 1/data of
their optimizer state. By default a covering set (every value of every dimension and the
interacting pairs, several cases per launch); --full runs the whole matrix (ctest label
pipe_matrix). --schedule zb-h1 runs the zero-bubble schedule (split backward) instead, on
its own covering set: 2 and 4 stages, 4 to 16 micro-batches, ZeRO 0-2, data 1 and 2, with
and without activation checkpointing; --schedule zb-v the same with two chunks per stage
placed in a V (the first stage computes the loss, the last hands its chunks' activations to
itself). Prints one line per case and `N passed, M failed`
last."""
import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from dscpp_test_ports import free_port  # noqa: E402

GLOBAL_BATCH = 16
TOL = 1e-5


def rel_err(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) / max(max(abs(y) for y in b), 1e-30)


def run(cmd, timeout=900):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}... exited {p.returncode}:\n"
                           f"{p.stdout[-3000:]}{p.stderr[-3000:]}")


def case_name(model, p, d, m, v, z):
    return f"{model}_p{p}_d{d}_m{m}_v{v}_z{z}"


def make_case(model, p, d, m, v, z, extra=None, schedule=None):
    mb = GLOBAL_BATCH // (m * d)
    extra = extra or {}
    suffix = "".join(f"_{k}{str(v_).replace(':', '')}" for k, v_ in sorted(extra.items()))
    config = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": m,
              "zero_optimization": {"stage": z, "reduce_bucket_size": 300}}
    if schedule:
        config["pipeline"] = {"schedule": schedule}
        suffix += "_" + schedule.replace("-", "")
    if schedule == "zb-v":
        extra = dict(extra, v_shape=True)
    return {"name": case_name(model, p, d, m, v, z) + suffix, "stages": p, "chunks": v, **extra,
            "config": config}


def valid(p, m, v):
    # Interleaving needs m >= p and m % p == 0 (Megatron's rule, refused otherwise).
    return v == 1 or (m >= p and m % p == 0)


def check(model, case, p, d, z, ref, out):
    stages = []
    for s in range(p):
        path = os.path.join(out, f"{case['name']}.stage{s}.json")
        with open(path) as f:
            stages.append(json.load(f))
    errors = []
    # Every stage returns the same loss, the reference's.
    for s, r in enumerate(stages):
        e = rel_err(r["losses"], ref["losses"])
        if e > TOL:
            errors.append(f"stage {s} losses differ by {e:.2e}")
        # eval_batch: the next batch's loss under the final weights, on every stage.
        if "eval_loss" in r and abs(r["eval_loss"] - ref["eval_loss"]) > TOL * abs(ref["eval_loss"]):
            errors.append(f"stage {s} eval_batch loss {r['eval_loss']} != {ref['eval_loss']}")
        # The global norm (before clipping at 1.0) over every stage, tied weights once.
        e = rel_err(r["grad_norms"], ref["grad_norms"])
        if e > TOL:
            errors.append(f"stage {s} grad norms differ by {e:.2e}")
    # Weights: each parameter from the first stage that holds it (a tied copy is the same).
    merged = {}
    for r in stages:
        for name, values in r["params"].items():
            merged.setdefault(name, values)
    missing = set(ref["params"]) - set(merged)
    if missing:
        errors.append(f"no stage holds {sorted(missing)[:3]}")
    worst = max((rel_err(merged[n], ref["params"][n]) for n in ref["params"] if n in merged),
                default=0)
    if worst > TOL:
        errors.append(f"weights differ by {worst:.2e}")
    # Memory: a stage holds its own layers only (the tied weight on each of its stages), and
    # at ZeRO 1-2 the optimizer state of 1/d of them.
    names = [set(r["params"]) for r in stages]
    for a, b in itertools.combinations(range(p), 2):
        shared = names[a] & names[b]
        if any(not n.startswith("embedding.word") for n in shared):
            errors.append(f"stages {a} and {b} both hold {sorted(shared)[:2]}")
    ref_numel = sum(len(v) for v in ref["params"].values())
    held = sum(r["trainable_numel"] for r in stages)
    tied = sum(len(ref["params"][n]) for n in ref["params"] if n.startswith("embedding.word"))
    copies = sum(1 for r in stages if "embedding.word.weight" in r["params"]) - 1
    if held != ref_numel + max(copies, 0) * tied:
        errors.append(f"stages hold {held} elements, the model {ref_numel} (+{copies} tied copies)")
    for s, r in enumerate(stages):
        if r["trainable_numel"] >= ref_numel and p > 1:
            errors.append(f"stage {s} holds the whole model")
        expect_partition = r["total"] // d if z >= 1 else r["total"]
        if r["partition"] != expect_partition or r["total"] < r["trainable_numel"]:
            errors.append(f"stage {s}: partition {r['partition']} of {r['total']} at data {d}")
        if r["state_numel"] > 2 * r["partition"] + 64:
            errors.append(f"stage {s}: optimizer state {r['state_numel']} > 2 x partition")
    return errors


VARIANTS = {
    "mlp": [((2, 1, 4, 1, 0), {"partition": "uniform"}),
            ((2, 2, 4, 1, 2), {"checkpoint_interval": 2})],
    "gpt": [((2, 1, 4, 1, 1), {"partition": "type:GPTBlock", "checkpoint_interval": 1}),
            ((4, 1, 8, 2, 0), {"checkpoint_interval": 1})],
    "tuple": [((2, 1, 4, 1, 0), {"partition": "uniform"})],
}


def covering(model):
    """Every value of every dimension, and the pairs that interact: stages x data, micro-
    batches x stages (the schedule's warm-up and drain), chunks x micro-batches, ZeRO x data
    (the partition) and ZeRO x micro-batches (accumulation against reduce-every-micro-batch)."""
    cases = set()
    for p, d in itertools.product([2, 4], [1, 2]):
        cases.add((p, d, 4, 1, 0))
    for p, m in itertools.product([2, 4], [1, 2, 4, 8]):
        cases.add((p, 1, m, 1, 1 if m % 2 else 2))
    for p in (2, 4):
        cases.add((p, 1, 4 if p == 2 else 8, 2, 0))
    cases.add((2, 2, 2, 2, 2))
    for z, d in itertools.product([0, 1, 2], [1, 2]):
        cases.add((2, d, 4, 1, z))
    for z, m in itertools.product([1, 2], [1, 8]):
        cases.add((2, 2, m, 1, z) if m * 2 <= GLOBAL_BATCH else (2, 1, m, 1, z))
    if model == "gpt":
        # The schedule's pairs are the MLP's (the same engine, a cheaper model). The GPT's own
        # part is its tied embedding and head, on the first and last stage: its gradient summed
        # across stages, then reduced over the data ranks and partitioned. So each value of
        # every dimension once, and the pairs that move the tied weight: stages x ZeRO, stages x
        # chunks (which stage holds which end), stages x data and ZeRO x data, with the tied
        # weight across 4 stages, interleaved, with ZeRO 2 partitions. Every pair of the
        # schedule for the GPT too under --full (ctest pipe.EngineMatchesOneRankFullMatrix).
        cases = {(2, 2, 1, 1, 1), (2, 2, 2, 2, 2), (2, 2, 4, 1, 0), (2, 1, 8, 1, 2),
                 (4, 1, 8, 2, 0), (4, 1, 4, 1, 1), (4, 2, 4, 2, 2)}
    if model == "tuple":  # (hidden, mask) and an aux loss across stages: a few shapes suffice
        cases = {(2, 1, 4, 1, 0), (2, 2, 2, 1, 2), (4, 1, 4, 2, 1), (4, 2, 2, 1, 0)}
    return sorted(c for c in cases if valid(c[0], c[2], c[3]) and GLOBAL_BATCH % (c[1] * c[2]) == 0)


# The zero-bubble schedule (one chunk): its covering set. The MLP's layers (torch::nn::Linear)
# do not split their backward, so B keeps their gradients for W; the GPT's (nn::linear) put
# their weight products off to W. Activation checkpointing recomputes inside B.
ZERO_BUBBLE = {
    "mlp": [(2, 1, 4, 1, 0), (2, 2, 4, 1, 1), (2, 1, 16, 1, 2), (4, 1, 8, 1, 0),
            (4, 1, 16, 1, 1), (4, 2, 4, 1, 2), (2, 2, 8, 1, 2), (4, 1, 4, 1, 1)],
    "gpt": [(2, 2, 4, 1, 1), (4, 1, 8, 1, 2), (2, 1, 16, 1, 0), (4, 2, 4, 1, 0)],
    "tuple": [(2, 1, 4, 1, 0), (4, 1, 8, 1, 2)],
}
# ZB-V: the same shapes, two chunks per stage in a V.
ZERO_BUBBLE_V = {model: [(p, d, m, 2, z) for (p, d, m, _, z) in cases]
                 for model, cases in ZERO_BUBBLE.items()}
ZERO_BUBBLE_V_VARIANTS = {
    "mlp": [((2, 2, 4, 2, 2), {"checkpoint_interval": 1})],
    "gpt": [((2, 1, 8, 2, 1), {"checkpoint_interval": 1})],
}
ZERO_BUBBLE_VARIANTS = {
    "mlp": [((2, 2, 4, 1, 2), {"checkpoint_interval": 2})],
    "gpt": [((2, 1, 8, 1, 1), {"checkpoint_interval": 1})],
}


def full():
    return [c for c in itertools.product([2, 4], [1, 2], [1, 2, 4, 8], [1, 2], [0, 1, 2])
            if valid(c[0], c[2], c[3])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--models", default="mlp,gpt,tuple")
    ap.add_argument("--chunks", default="1,2", help="the chunk counts to run (v)")
    ap.add_argument("--schedule", default=None, help="pipeline.schedule (default: the engine's)")
    args = ap.parse_args()
    zero_bubble = args.schedule in ("zb-h1", "zb-v")
    out = tempfile.mkdtemp()
    passed = failed = 0
    for model in args.models.split(","):
        run([args.train, "--mode", "reference", "--model", model, "--steps", str(args.steps),
             "--out", out])
        with open(os.path.join(out, "reference.json")) as f:
            ref = json.load(f)
        grid = ((ZERO_BUBBLE_V if args.schedule == "zb-v" else ZERO_BUBBLE)[model] if zero_bubble
                else full() if args.full else covering(model))
        chunks = [int(v) for v in args.chunks.split(",")]
        grid = [c for c in grid if c[3] in chunks]
        # One launch per world size, its cases one after another.
        by_world = {}
        for (p, d, m, v, z) in grid:
            by_world.setdefault(p * d, []).append(((p, d, m, v, z), None))
        # The module's options beside the default partition and no checkpointing.
        variants = (ZERO_BUBBLE_V_VARIANTS if args.schedule == "zb-v" else
                    ZERO_BUBBLE_VARIANTS if zero_bubble else VARIANTS)
        for combo, extra in variants.get(model, []):
            by_world.setdefault(combo[0] * combo[1], []).append((combo, extra))
        for world, entries in sorted(by_world.items()):
            combos = [c for c, _ in entries]
            cases = [make_case(model, *c, extra=e, schedule=args.schedule) for c, e in entries]
            launch_error = None
            try:
                run([args.launcher, "--num_gpus", str(world), "--master_port", str(free_port()),
                     args.train, "--mode", "pipe", "--model", model, "--steps", str(args.steps),
                     "--cases", json.dumps(cases), "--out", out])
            except Exception as e:  # noqa: BLE001 - the cases that finished are still checked
                launch_error = str(e)
                print(f"launch of {world} ranks failed: {launch_error[-1500:]}")
            for (p, d, m, v, z), c in zip(combos, cases):
                if not all(os.path.exists(os.path.join(out, f"{c['name']}.stage{s}.json"))
                           for s in range(p)):
                    errors = ["did not finish" + (" (the launch failed)" if launch_error else "")]
                else:
                    errors = check(model, c, p, d, z, ref, out)
                print(("PASS " if not errors else "FAIL ") + c["name"] +
                      ("" if not errors else ": " + "; ".join(errors)), flush=True)
                passed += not errors
                failed += bool(errors)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
