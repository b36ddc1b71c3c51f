#!/usr/bin/env python3
"""3D checkpoints: a checkpoint at (tensor, pipeline, data) resumes on any layout.

    pipe_3d_checkpoint_oracle.py --launcher build/launcher/dscpp --train build/tests/pipe/pipe_train
        --zero-to-fp32 build/tools/zero_to_fp32 [--full]

The tiny GPT of pipe_3d_oracle.py (hidden 64, 4 heads, 4 layers, tied vocabulary-parallel
embedding and head; fp32, SGD with momentum, clipping 1.0), STEPS steps of global batch 16:
- a job at (t, p, d) = (2, 2, 2) trains STEPS steps and saves after SAVE_AT (DeepSpeed's
  names: layer_XX-model_TT-model_states.pt, mp_rank_<stage*t+model>, zero_pp_rank_D_mp_rank_..);
- a fresh job at (2, 2, 2) loads it and trains on: losses and weights equal the first job's to
  the bit;
- the one-rank engine (no pipeline, no tensor parallelism) loads it and continues as the
  uninterrupted one-rank LibTorch reference does (1e-5 relative, losses and weights);
- jobs at (1, 2, 4) (and with --full (2, 1, 4), ZeRO 0 and 2 sources) load it and continue as
  the one-rank engine does (1e-5), each split weight reassembled from its model ranks' shards;
- tools/zero_to_fp32 and the folder's zero_to_fp32.py consolidate it into the one-rank model's
  state dict: the weights the one-rank engine holds right after loading, bit for bit;
- tools/to_universal converts it into DeepSpeed's universal layout (zero/<name>/fp32.pt,
  exp_avg... with the whole shape, {"param", "cat_dim"}, each split tensor's dscpp_partition):
  the files open with torch.load(weights_only=True) and hold the one-rank engine's loaded
  weights bit for bit; the one-rank engine (checkpoint.load_universal) loads it and continues
  as the one-rank reference does, and a (2, 2, 2) pipeline (each rank cutting its shard of the
  whole tensors) as the one-rank engine does; with --full, DeepSpeed's own reader
  (load_hp_checkpoint_state, ds_universal_reader.py) cuts each model rank's shard of every
  parameter as the (2, 2, 2) run held it.
Default: two 8-rank launches and three one-rank runs; --full (ctest label pipe_matrix) more."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from dscpp_test_ports import free_port  # noqa: E402
from pipe_3d_oracle import rel_err, unshard  # noqa: E402

GLOBAL_BATCH = 16
STEPS = 6
SAVE_AT = 3
TOL = 1e-5


def run(cmd, timeout=600):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}... exited {p.returncode}:\n"
                           f"{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return p.stdout + p.stderr


def case(name, t, p, d, z, m=2, **extra):
    return {"name": name, "stages": p, "model": t, **extra,
            "config": {"train_micro_batch_size_per_gpu": GLOBAL_BATCH // (m * d),
                       "gradient_accumulation_steps": m,
                       "zero_optimization": {"stage": z, "reduce_bucket_size": 3000}}}


def merged(out, c):
    """Losses and the whole model's weights of a pipe case, split weights reassembled."""
    p, t = c["stages"], c["model"]
    runs = {}
    for s in range(p):
        for m in range(t):
            suffix = f".model{m}" if t > 1 else ""
            with open(os.path.join(out, f"{c['name']}.stage{s}{suffix}.json")) as f:
                runs[(s, m)] = json.load(f)
    import numpy as np
    params = {}
    for s in range(p):
        for name in runs[(s, 0)]["params"]:
            if name in params:
                continue
            vals = [np.asarray(runs[(s, m)]["params"][name]).reshape(runs[(s, m)]["shapes"][name])
                    for m in range(t)]
            tp = runs[(s, 0)]["tp"].get(name)
            params[name] = (unshard(vals, tp[0], tp[1]) if tp else vals[0]).ravel().tolist()
    return runs[(0, 0)]["losses"], params


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--zero-to-fp32", required=True)
    ap.add_argument("--to-universal", required=True)
    ap.add_argument("--full", action="store_true")
    args = ap.parse_args()
    work = tempfile.mkdtemp()
    out = os.path.join(work, "out")
    os.makedirs(out)
    failures = []

    def launch(world, mode, cases):
        return run([args.launcher, "--num_gpus", str(world), "--master_port", str(free_port()),
                    args.train, "--mode", mode, "--model", "gpt3d", "--steps", str(STEPS),
                    "--cases", json.dumps(cases), "--out", out])

    def verdict(name, errors):
        print(("PASS " if not errors else "FAIL ") + name +
              ("" if not errors else ": " + "; ".join(errors)), flush=True)
        failures.extend(f"{name}: {e}" for e in errors)

    run([args.train, "--mode", "reference", "--model", "gpt3d", "--steps", str(STEPS), "--out", out])
    with open(os.path.join(out, "reference.json")) as f:
        ref = json.load(f)
    zs = [0, 1, 2] if args.full else [1]
    ck = {z: os.path.join(work, f"ck_z{z}") for z in zs}
    # 1. Save at (2, 2, 2).
    launch(8, "pipe", [case(f"save_z{z}", 2, 2, 2, z, save_dir=ck[z], save_at=SAVE_AT) for z in zs])
    # to_universal beside it (ck/<tag>_universal, ck/latest_universal).
    for z in zs:
        run([args.to_universal, "--input_folder", ck[z]])
    # 2. Load at (2, 2, 2) (bit-exact) and at other layouts of 8 ranks, in one launch.
    targets = [(1, 2, 4)] + ([(2, 1, 4)] if args.full else [])
    loads = []
    for z in zs:
        loads.append(case(f"resume_z{z}", 2, 2, 2, z, load_dir=ck[z]))
        loads += [case(f"t{t}_p{p}_d{d}_from_z{z}", t, p, d, z, load_dir=ck[z]) for t, p, d in targets]
        loads.append(case(f"t2_p2_d2_universal_z{z}", 2, 2, 2, z, load_dir=ck[z], universal=True))
    launch(8, "pipe", loads)
    for z in zs:
        first_losses, first_params = merged(out, case(f"save_z{z}", 2, 2, 2, z))
        losses, params = merged(out, case(f"resume_z{z}", 2, 2, 2, z))
        errors = []
        if losses != first_losses[SAVE_AT:]:
            errors.append(f"losses {losses} != {first_losses[SAVE_AT:]}")
        diff = [k for k in first_params if params.get(k) != first_params[k]]
        if diff or set(params) != set(first_params):
            errors.append(f"weights differ: {diff[:3]}")
        verdict(f"(2,2,2) z{z} resumes at (2,2,2) bit-exactly", errors)
        # 3. The one-rank engine loads it: the uninterrupted one-rank reference.
        launch(1, "single", [case(f"single_z{z}", 1, 1, 1, 0, m=1, load_dir=ck[z])])
        with open(os.path.join(out, f"single_z{z}.json")) as f:
            one = json.load(f)
        errors = []
        if one["start"] != SAVE_AT:
            errors.append(f"starts at step {one['start']}")
        e = rel_err(one["losses"], ref["losses"][SAVE_AT:])
        if e > TOL:
            errors.append(f"losses differ from the reference's by {e:.1e}")
        worst = max(rel_err(one["params"][k], ref["params"][k]) for k in ref["params"])
        if worst > TOL or set(one["params"]) != set(ref["params"]):
            errors.append(f"weights differ from the reference's by {worst:.1e}")
        verdict(f"(2,2,2) z{z} loaded by the one-rank engine = the one-rank run", errors)
        for t, p, d in targets:
            losses, params = merged(out, case(f"t{t}_p{p}_d{d}_from_z{z}", t, p, d, z))
            errors = []
            e = rel_err(losses, one["losses"])
            if e > TOL:
                errors.append(f"losses differ from the one-rank engine's by {e:.1e}")
            worst = max(rel_err(params[k], one["params"][k]) for k in one["params"])
            if worst > TOL or set(params) != set(one["params"]):
                errors.append(f"weights differ from the one-rank engine's by {worst:.1e}")
            verdict(f"(2,2,2) z{z} loaded at ({t},{p},{d}) = the one-rank engine", errors)
        # 4. zero_to_fp32 (C++ and the folder's script): the one-rank model's state dict.
        import torch
        fp32 = os.path.join(work, f"fp32_z{z}.pt")
        run([args.zero_to_fp32, ck[z], fp32])
        sd = torch.load(fp32, weights_only=True)
        errors = []
        if not set(one["loaded_params"]) <= set(sd):
            errors.append(f"keys {sorted(set(one['loaded_params']) - set(sd))[:4]} missing")
        for k, v in one["loaded_params"].items():
            if k in sd and sd[k].flatten().double().tolist() != v:
                errors.append(f"{k} differs")
        verdict(f"zero_to_fp32 of (2,2,2) z{z} = the one-rank model's weights", errors)
        script_out = os.path.join(work, f"script_z{z}.pt")
        run([sys.executable, os.path.join(ck[z], "zero_to_fp32.py"), ck[z], script_out])
        theirs = torch.load(script_out, weights_only=True)
        same = list(theirs) == list(sd) and all(torch.equal(theirs[k], sd[k]) for k in sd)
        verdict(f"the folder's zero_to_fp32.py on (2,2,2) z{z} = tools/zero_to_fp32",
                [] if same else [f"keys or values differ ({len(theirs)} and {len(sd)} tensors)"])
        # 5. to_universal: DeepSpeed's file layout, the whole tensors, loadable anywhere.
        errors = []
        with open(os.path.join(ck[z], "latest_universal")) as f:
            utag = os.path.join(ck[z], f.read().strip())
        for k, v in one["loaded_params"].items():
            pdir = os.path.join(utag, "zero", k)
            d = torch.load(os.path.join(pdir, "fp32.pt"), weights_only=True)
            if set(d) < {"param", "cat_dim"} or d["param"].flatten().double().tolist() != v:
                errors.append(f"{k}/fp32.pt is not the loaded weight")
            mom = os.path.join(pdir, "momentum_buffer.pt")
            if os.path.exists(mom) and torch.load(mom, weights_only=True)["param"].shape != d["param"].shape:
                errors.append(f"{k}/momentum_buffer.pt has another shape")
        qkv = torch.load(os.path.join(utag, "zero", "blocks.0.attn.qkv.weight", "fp32.pt"),
                         weights_only=True)["dscpp_partition"]
        if qkv["partition_dim"] != 0 or qkv["tp_degree"] != 2 or len(qkv["sub_param_sizes"] or []) != 3:
            errors.append(f"qkv's dscpp_partition is {qkv}")
        torch.load(os.path.join(utag, "mp_rank_00_model_states.pt"), weights_only=True)
        verdict(f"to_universal of (2,2,2) z{z}: DeepSpeed's universal files, whole tensors", errors)
        # DeepSpeed's own reader (load_hp_checkpoint_state) cuts each model rank's shard of
        # the whole tensors as the (2,2,2) run held them: pieces r, r+t, ... of dim's t*stride.
        errors = []
        checked = 0
        for s_ in range(2 if args.full else 0):  # importing DeepSpeed costs ~20 s: --full only
            from ds_universal_reader import ds_shard
            for m in range(2):
                with open(os.path.join(out, f"resume_z{z}.stage{s_}.model{m}.json")) as f:
                    r = json.load(f)
                for name, shape in r["shapes"].items():
                    whole = torch.load(os.path.join(utag, "zero", name, "fp32.pt"),
                                       weights_only=True)["param"]
                    tp = r["tp"].get(name)
                    if tp:
                        pieces = torch.chunk(whole, 2 * tp[1], dim=tp[0])
                        want = torch.cat([pieces[k] for k in range(m, 2 * tp[1], 2)], dim=tp[0])
                    else:
                        want = whole
                    got, states = ds_shard(utag, name, shape, m, 2)
                    if not torch.equal(got, want):
                        errors.append(f"{name} model rank {m}: DeepSpeed's shard differs")
                    if z >= 1 and "momentum_buffer" not in states:
                        errors.append(f"{name}: DeepSpeed read no momentum_buffer")
                    checked += 1
        if checked == 0 and args.full:
            errors.append("no parameter checked")
        if args.full:
            verdict(f"DeepSpeed's universal reader on to_universal of (2,2,2) z{z}: each model "
                    f"rank's shard ({checked} parameters)", errors)
        launch(1, "single", [case(f"single_universal_z{z}", 1, 1, 1, 0, m=1, load_dir=ck[z],
                                  universal=True)])
        with open(os.path.join(out, f"single_universal_z{z}.json")) as f:
            uni = json.load(f)
        errors = []
        if uni["start"] != SAVE_AT:
            errors.append(f"starts at step {uni['start']}")
        e = rel_err(uni["losses"], ref["losses"][SAVE_AT:])
        if e > TOL:
            errors.append(f"losses differ from the reference's by {e:.1e}")
        worst = max(rel_err(uni["params"][k], ref["params"][k]) for k in ref["params"])
        if worst > TOL:
            errors.append(f"weights differ from the reference's by {worst:.1e}")
        verdict(f"universal of (2,2,2) z{z} loaded by the one-rank engine = the one-rank run", errors)
        losses, params = merged(out, case(f"t2_p2_d2_universal_z{z}", 2, 2, 2, z))
        errors = []
        e = rel_err(losses, one["losses"])
        if e > TOL:
            errors.append(f"losses differ from the one-rank engine's by {e:.1e}")
        worst = max(rel_err(params[k], one["params"][k]) for k in one["params"])
        if worst > TOL or set(params) != set(one["params"]):
            errors.append(f"weights differ from the one-rank engine's by {worst:.1e}")
        verdict(f"universal of (2,2,2) z{z} loaded at (2,2,2) = the one-rank engine", errors)
    print(f"{len(failures)} failed")
    if not failures:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
