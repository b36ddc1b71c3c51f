#!/usr/bin/env python3
"""Pipeline checkpoints: resume bit-exactly, load onto another layout, zero_to_fp32.

    pipe_checkpoint_oracle.py --launcher build/launcher/dscpp --train build/tests/pipe/pipe_train
        --zero-to-fp32 build/tools/zero_to_fp32 [--full]

The MLP stack of pipe_oracle.py (8 layers, AdamW, clipping at 1.0, fp32, CPU, Gloo, real
processes through the launcher), global batch 16, STEPS steps:
- resume: a job trains STEPS steps and saves after SAVE_AT; a fresh job loads that checkpoint
  and trains the rest: its losses and weights equal the first job's to the bit (ZeRO 0, 1, 2;
  plain 1F1B and interleaved with 2 chunks);
- layouts: a checkpoint saved on pipeline 2 x data 2 is loaded on 4 x 1 and 1 x 2 pipelines and
  by the non-pipeline engine on one rank over the whole model (the one-rank oracle); the
  pipelines continue as the one-rank engine does (relative 1e-6), and all of them as the
  uninterrupted run (1e-5);
- zero_to_fp32 consolidates the pipeline checkpoint into the one-rank model's state dict: equal
  to the weights the one-rank engine holds right after loading it, bit for bit; the folder's
  zero_to_fp32.py (Python, torch only) writes the same keys and values;
- ZB-V: a checkpoint saved with two chunks per stage in a V resumes bit-exactly under ZB-V and
  loads on a 4-stage 1F1B pipeline, which goes on as the uninterrupted run (1e-5);
- refusals: a missing layer file and a layer file of another run (the same name, from another
  checkpoint) are refused, the message naming the file.
By default a covering set (under ~40 s on two cores); --full (ctest label pipe_matrix) every
ZeRO stage x chunks for resume and every stage for the layouts, 4-stage interleaved too.
--models mlp,gpt adds model_zoo's tiny GPT, whose embedding and output head are one tied
module on the first and last stage (the matrix runs both)."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from dscpp_test_ports import free_port  # noqa: E402

GLOBAL_BATCH = 16
STEPS = 6
SAVE_AT = 3


def run(cmd, timeout=600, expect_fail=False):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if (p.returncode != 0) != expect_fail:
        raise RuntimeError(f"{' '.join(cmd[:6])}... exited {p.returncode}:\n"
                           f"{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return p.stdout + p.stderr


def case(name, p, d, m, v, z, **extra):
    return {"name": name, "stages": p, "chunks": v, **extra,
            "config": {"train_micro_batch_size_per_gpu": GLOBAL_BATCH // (m * d),
                       "gradient_accumulation_steps": m,
                       "zero_optimization": {"stage": z, "reduce_bucket_size": 300}}}


def rel_err(a, b):
    if len(a) != len(b):
        return float("inf")
    return max((abs(x - y) for x, y in zip(a, b)), default=0) / max(max((abs(y) for y in b), default=0), 1e-30)


def merged(out, name, p):
    """Losses (stage 0's: every stage returns the same) and every stage's weights."""
    params, losses = {}, None
    for s in range(p):
        with open(os.path.join(out, f"{name}.stage{s}.json")) as f:
            r = json.load(f)
        losses = r["losses"] if losses is None else losses
        for k, v in r["params"].items():
            params.setdefault(k, v)
    return losses, params


class Launcher:
    def __init__(self, args, out):
        self.args, self.out, self.model = args, out, "mlp"

    def pipe(self, world, cases):
        run([self.args.launcher, "--num_gpus", str(world), "--master_port", str(free_port()),
             self.args.train, "--mode", "pipe", "--model", self.model, "--steps", str(STEPS),
             "--cases", json.dumps(cases), "--out", self.out])

    def single(self, c, expect_fail=False):
        return run([self.args.launcher, "--num_gpus", "1", "--master_port", str(free_port()),
                    self.args.train, "--mode", "single", "--model", self.model, "--steps", str(STEPS),
                    "--cases", json.dumps([c]), "--out", self.out], expect_fail=expect_fail)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--zero-to-fp32", required=True)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--models", default="mlp", help="mlp and/or gpt (the tied embedding and head)")
    args = ap.parse_args()
    L = Launcher(args, None)
    failures, passed = [], 0
    for model in args.models.split(","):
        L.model = model
        work = tempfile.mkdtemp()
        L.out = os.path.join(work, "out")
        os.makedirs(L.out)
        f, p = check_model(args, L, work, model)
        failures += f
        passed += p
    print(f"{passed} passed, {len(failures)} failed")
    return 1 if failures else 0


def check_model(args, L, work, model):
    out = L.out
    failures, passed = [], 0

    def verdict(name, errors):
        nonlocal passed
        name = f"{model}: {name}"
        print(("PASS " if not errors else "FAIL ") + name + ("" if not errors else ": " + "; ".join(errors)),
              flush=True)
        passed += not errors
        failures.extend(f"{name}: {e}" for e in errors)

    # Resume cases: (p, d, m, v, z) of the job that saves and of the one that loads.
    resume = [(2, 2, 2, 1, 0), (2, 2, 2, 1, 1), (2, 2, 2, 1, 2), (2, 2, 2, 2, 1)]
    if args.full:
        resume = [(2, 2, 2, v, z) for v in (1, 2) for z in (0, 1, 2)] + [(4, 1, 4, 2, 2), (2, 1, 4, 2, 0)]
    name = lambda p, d, m, v, z: f"p{p}_d{d}_m{m}_v{v}_z{z}"
    by_world = {}
    for c in resume:
        by_world.setdefault(c[0] * c[1], []).append(c)
    # 1. The first jobs: train STEPS, saving after SAVE_AT.
    for world, combos in sorted(by_world.items()):
        L.pipe(world, [case("save_" + name(*c), *c, save_dir=os.path.join(work, "ck_" + name(*c)),
                            save_at=SAVE_AT) for c in combos])
    stages = [1] if not args.full else [0, 1, 2]

    def targets_of(z):
        """The layouts a 2 x 2 checkpoint of ZeRO stage z is loaded on, with their world sizes."""
        t = [((4, 1, 4, 1, z), 4), ((1, 2, 2, 1, 2 if z == 1 else z), 2)]
        return t + ([((4, 1, 4, 2, z), 4), ((2, 1, 4, 1, z), 2)] if args.full else [])

    # Layout loads of a checkpoint step 1 wrote ride in step 2's launches (fewer launches).
    early = {}
    for z in stages:
        if (2, 2, 2, 1, z) in resume:
            for t, world in targets_of(z):
                early.setdefault(world, []).append(
                    case(f"layout_{name(*t)}_from_z{z}", *t, load_dir=os.path.join(work, "ck_" + name(2, 2, 2, 1, z))))
    # 2. Fresh jobs load and train on: the same losses and weights, bit for bit.
    for world, combos in sorted(by_world.items()):
        # The first of them saves again, 2 steps later: the refusals' layer file of another run.
        L.pipe(world, [case("load_" + name(*c), *c, load_dir=os.path.join(work, "ck_" + name(*c)),
                            **({"save_dir": os.path.join(work, "ck_later"), "save_at": SAVE_AT + 2}
                               if c == resume[0] else {}))
                       for c in combos] + early.pop(world, []))
        for c in combos:
            first_losses, first_params = merged(out, "save_" + name(*c), c[0])
            losses, params = merged(out, "load_" + name(*c), c[0])
            errors = []
            if losses != first_losses[SAVE_AT:]:
                errors.append(f"losses {losses} != {first_losses[SAVE_AT:]}")
            diff = [k for k in first_params if params.get(k) != first_params[k]]
            if diff or set(params) != set(first_params):
                errors.append(f"weights differ: {diff[:3]}")
            verdict(f"resume {name(*c)} (bit-exact)", errors)

    # 3. Another layout: saved on 2 x 2, loaded on 4 x 1, 1 x 2 and one rank without a pipeline.
    launched = {c["name"] for cases in early.values() for c in cases}
    for world, cases in early.items():  # worlds step 2 did not launch
        L.pipe(world, cases)
    for z in stages:
        src = (2, 2, 2, 1, z)
        ck = os.path.join(work, "ck_" + name(*src))
        if src not in resume:
            L.pipe(4, [case("save_" + name(*src), *src, save_dir=ck, save_at=SAVE_AT)])
        L.single(case(f"single_z{z}", 1, 1, 1, 1, 0, load_dir=ck))
        with open(os.path.join(out, f"single_z{z}.json")) as f:
            one = json.load(f)
        targets = targets_of(z)
        for t, world in targets:
            if f"layout_{name(*t)}_from_z{z}" not in launched:
                L.pipe(world, [case(f"layout_{name(*t)}_from_z{z}", *t, load_dir=ck)])
        full_losses, full_params = merged(out, "save_" + name(*src), 2)
        errors = []
        if one["start"] != SAVE_AT:
            errors.append(f"one rank starts at step {one['start']}")
        if rel_err(one["losses"], full_losses[SAVE_AT:]) > 1e-5:
            errors.append("the one-rank engine's losses differ from the uninterrupted run's")
        worst = max(rel_err(one["params"][k], full_params[k]) for k in full_params)
        if worst > 1e-5 or set(one["params"]) != set(full_params):
            errors.append(f"the one-rank engine's weights differ from the uninterrupted run's by {worst:.1e}")
        verdict(f"one rank, no pipeline, loads 2x2 z{z}", errors)
        for t, _ in targets:
            losses, params = merged(out, f"layout_{name(*t)}_from_z{z}", t[0])
            errors = []
            e = rel_err(losses, one["losses"])
            if e > 1e-6:
                errors.append(f"losses differ from the one-rank engine's by {e:.1e}")
            worst = max(rel_err(params[k], one["params"][k]) for k in one["params"])
            if worst > 1e-6 or set(params) != set(one["params"]):
                errors.append(f"weights differ from the one-rank engine's by {worst:.1e}")
            verdict(f"2x2 z{z} loaded on {t[0]}x{t[1]} (z{t[4]}, v{t[3]})", errors)
        # 4. zero_to_fp32: the one-rank model's state dict, as the one-rank engine loaded it.
        fp32 = os.path.join(work, f"fp32_z{z}.pt")
        run([args.zero_to_fp32, ck, fp32])
        import torch
        sd = torch.load(fp32, weights_only=True)
        errors = []
        if not set(one["loaded_params"]) <= set(sd) or (model == "mlp" and set(sd) != set(one["loaded_params"])):
            errors.append(f"keys {sorted(set(sd) ^ set(one['loaded_params']))[:4]} differ")
        for k, v in one["loaded_params"].items():
            if k in sd and sd[k].dtype == torch.float32 and sd[k].flatten().double().tolist() != v:
                errors.append(f"{k} differs")
        verdict(f"zero_to_fp32 of 2x2 z{z} = the one-rank model's weights", errors)
        # The script the save put beside `latest` (Python and torch only) writes the same.
        script_out = os.path.join(work, f"script_z{z}.pt")
        run([sys.executable, os.path.join(ck, "zero_to_fp32.py"), ck, script_out])
        theirs = torch.load(script_out, weights_only=True)
        errors = [] if list(theirs) == list(sd) and all(torch.equal(theirs[k], sd[k]) for k in sd) else [
            f"keys or values differ from tools/zero_to_fp32's ({len(theirs)} and {len(sd)} tensors)"]
        verdict(f"the folder's zero_to_fp32.py on 2x2 z{z} = tools/zero_to_fp32", errors)

    # 5. ZB-V (two chunks per stage in a V, the first stage holding the last layers): its
    # checkpoint is the pipeline's layout whatever the schedule. Saved on 2 x 2 under ZB-V,
    # resumed there bit for bit, and loaded by 1F1B on 4 x 1 going on as the uninterrupted run.
    def zbv(c):
        c["config"]["pipeline"] = {"schedule": "zb-v"}
        c["v_shape"] = True
        return c
    ck_v = os.path.join(work, "ck_zbv")
    L.pipe(4, [zbv(case("save_zbv", 2, 2, 2, 2, 1, save_dir=ck_v, save_at=SAVE_AT))])
    L.pipe(4, [zbv(case("load_zbv", 2, 2, 2, 2, 1, load_dir=ck_v)),
               case("zbv_on_1f1b", 4, 1, 4, 1, 1, load_dir=ck_v)])
    full_losses, full_params = merged(out, "save_zbv", 2)
    losses, params = merged(out, "load_zbv", 2)
    errors = [] if losses == full_losses[SAVE_AT:] and params == full_params else [
        f"losses {losses} != {full_losses[SAVE_AT:]} or weights differ"]
    verdict("resume under ZB-V (bit-exact)", errors)
    losses, params = merged(out, "zbv_on_1f1b", 4)
    worst = max(rel_err(params[k], full_params[k]) for k in full_params)
    errors = [] if rel_err(losses, full_losses[SAVE_AT:]) <= 1e-5 and worst <= 1e-5 else [
        f"losses {losses} against {full_losses[SAVE_AT:]}, weights {worst:.1e} apart"]
    verdict("a ZB-V checkpoint loaded by 1F1B on 4 x 1 goes on as the uninterrupted run", errors)

    # 6. Refusals, naming the file: a missing layer file, a layer file of another run.
    good = os.path.join(work, "ck_" + name(2, 2, 2, 1, 1))
    later = os.path.join(work, "ck_later", f"global_step{SAVE_AT + 2}", "layer_05-model_states.pt")
    tag = open(os.path.join(good, "latest")).read().strip()
    for what, edit in (("missing", lambda d: os.remove(os.path.join(d, tag, "layer_05-model_states.pt"))),
                       ("of another run", lambda d: shutil.copy(later, os.path.join(d, tag, "layer_05-model_states.pt")))):
        bad = os.path.join(work, "bad_" + what.split()[-1])
        shutil.copytree(good, bad)
        edit(bad)
        text = L.single(case("refuse", 1, 1, 1, 1, 0, load_dir=bad), expect_fail=True)
        ok = "layer_05-model_states.pt" in text and "load refused" in text
        verdict(f"a layer file {what}: refused, named", [] if ok else [f"output: {text[-600:]}"])

    if not failures:
        shutil.rmtree(work, ignore_errors=True)
    return failures, passed


if __name__ == "__main__":
    sys.exit(main())
