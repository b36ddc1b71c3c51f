#!/usr/bin/env python3
"""Universal checkpoints both ways, against DeepSpeed 0.19.8's own engine and converter (CPU,
Gloo, fp32, engine_train's MLP; 10 steps, save, resume to 20).

    universal_oracle.py --launcher build/launcher/dscpp --train build/tests/runtime/engine/engine_train \
        --to-universal build/tools/to_universal [--part ours|theirs]

ours:   a 2-rank ZeRO-2 run of dscpp saves; tools/to_universal converts it; DeepSpeed's engine
        loads it on 4 ranks with checkpoint.load_universal and trains on as dscpp's own 4-rank
        resume of the original checkpoint does (1e-5 relative); the files open with
        torch.load's defaults (weights_only=True) and hold what DeepSpeed's ds_to_universal
        writes (zero/<name>/{fp32,exp_avg,exp_avg_sq,step}.pt, {"param", "cat_dim"}); our own
        reader takes them onto 4 ranks at stage 3 and 1 rank at stage 0; to_universal of
        stage-0 and stage-3 checkpoints resumes on 1 rank at stage 2 as the originals do.
theirs: a 2-rank ZeRO-2 run of DeepSpeed saves at step 10 and trains on to 20; DeepSpeed's
        ds_to_universal converts the checkpoint; dscpp resumes it with
        checkpoint.load_universal on 1 rank (stages 0 and 2) and on 4 (stages 1 and 3) and
        trains on as DeepSpeed's run did. With --matrix (ctest checkpoint.Universal_theirs_matrix,
        label checkpoint_matrix) the reference is DeepSpeed's own 4-rank universal resume, one
        more launch of DeepSpeed (~25 s of CI's 2 cores), and dscpp resumes on 4 ranks at stage
        2 too. By default each stage and each side of the world size (fewer and more ranks)
        once; DeepSpeed's universal resume on 4 ranks is `ours`'s reference.
errors: no latest_universal, a missing state file, a missing parameter folder, a tensor of
        another shape: each an error naming the file (and the shapes).
Prints one line per case and `N passed, M failed`; exits 1 on any failure."""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from checkpoint_oracle import Runner, compare  # noqa: E402
from dscpp_test_ports import free_port  # noqa: E402  (checkpoint_oracle put tests/ on the path)
from ds_train import config  # noqa: E402  (checkpoint_oracle put tests/runtime/engine on the path)

STEPS, SAVE_AT = 20, 10


def universal(cfg):
    return {**cfg, "checkpoint": {"load_universal": True}}


def ds_universal(r, name, ranks, load):
    """ds_train.py with checkpoint.load_universal, resuming from `load`."""
    out = os.path.join(r.tmp, name + ".json")
    return r.run([r.args.launcher, "--num_gpus", str(ranks), "--master_port", str(free_port()), "--no_local_rank",
                  sys.executable, os.path.join(HERE, "ds_train_universal.py"), "--load-universal", "--init", r.init,
                  "--stage", "2", "--ga", "2", "--steps", str(STEPS), "--load", load, "--out", out], out)


def layout_problems(folder):
    """What DeepSpeed's loader reads is there, in the form ds_to_universal writes it."""
    import torch
    problems = []
    for name in ("l1.weight", "l1.bias", "l2.weight", "l2.bias", "l3.weight", "l3.bias"):
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            path = os.path.join(folder, "zero", name, state + ".pt")
            if not os.path.isfile(path):
                problems.append(f"no {path}")
                continue
            d = torch.load(path)  # weights_only=True
            if not (isinstance(d, dict) and torch.is_tensor(d.get("param")) and d.get("cat_dim") == 0):
                problems.append(f"{path} is not {{'param': tensor, 'cat_dim': 0}}")
            elif d["dscpp_partition"]["replicated"] is not True:
                problems.append(f"{path}: partition metadata {d['dscpp_partition']}")
        step = torch.load(os.path.join(folder, "zero", name, "step.pt"))
        if int(step) != SAVE_AT:
            problems.append(f"{name}/step.pt holds {step}")
    for path in [os.path.join(folder, "mp_rank_00_model_states.pt"), os.path.join(folder, "zero", "optimizer_state.pt")]:
        try:
            torch.load(path)
        except Exception as e:  # noqa: BLE001
            problems.append(f"torch.load({path}): {str(e)[:200]}")
    return problems


def part_ours(r, report):
    cfg = config(2, 2)
    ckpt = os.path.join(r.tmp, "ours")
    r.dscpp("ours_first", 2, cfg, ["--save", ckpt, "--save-at", str(SAVE_AT)], steps=SAVE_AT)
    subprocess.run([r.args.to_universal, "--input_folder", os.path.join(ckpt, f"global_step{SAVE_AT}")], check=True,
                   capture_output=True)
    problems = []
    with open(os.path.join(ckpt, "latest_universal")) as f:
        if f.read() != f"global_step{SAVE_AT}_universal":
            problems.append("latest_universal does not name the universal tag")
    problems += layout_problems(os.path.join(ckpt, f"global_step{SAVE_AT}_universal"))
    ours4 = r.dscpp("ours_resume4", 4, cfg, ["--load", ckpt])
    ds4 = ds_universal(r, "ds_from_ours_u4", 4, ckpt)
    if ds4["first_step"] != SAVE_AT:
        problems.append(f"DeepSpeed resumed at {ds4['first_step']}")
    problems += compare(ds4["losses"], ours4["losses"], "DeepSpeed (4 ranks, universal) losses", exact=False)
    problems += compare(ds4["params"], ours4["params"], "DeepSpeed (4 ranks, universal) weights", exact=False)
    report("ours 2 ranks ZeRO-2 -> to_universal -> DeepSpeed 4 ranks ZeRO-2", problems)
    # Our own reader on the same files: 4 ranks at stage 3, 1 rank at stage 0.
    for ranks, stage in ((4, 3), (1, 0)):
        got = r.dscpp(f"ours_u_{ranks}_{stage}", ranks, universal(config(stage, 2)), ["--load", ckpt])
        p = compare(got["losses"], ours4["losses"], "losses", exact=False)
        p += compare(got["params"], ours4["params"], "weights", exact=False)
        report(f"ours -> to_universal -> dscpp {ranks} ranks ZeRO-{stage}", p)
    # to_universal from checkpoints of stages 0 and 3 (stage 3: per-parameter partitions and
    # one model-states file per rank), resumed on 1 rank at stage 2 as the original resumes.
    for src in (0, 3):
        c = config(src, 2)
        ck = os.path.join(r.tmp, f"ours_s{src}")
        r.dscpp(f"ours_s{src}_first", 2, c, ["--save", ck, "--save-at", str(SAVE_AT)], steps=SAVE_AT)
        subprocess.run([r.args.to_universal, "--input_folder", ck], check=True, capture_output=True)
        want = r.dscpp(f"ours_s{src}_resume", 2, c, ["--load", ck])
        got = r.dscpp(f"ours_s{src}_u_1_2", 1, universal(config(2, 2)), ["--load", ck])
        p = compare(got["losses"], want["losses"], "losses", exact=False)
        p += compare(got["params"], want["params"], "weights", exact=False)
        p += layout_problems(os.path.join(ck, f"global_step{SAVE_AT}_universal"))
        report(f"ours 2 ranks ZeRO-{src} -> to_universal -> dscpp 1 rank ZeRO-2", p)


def refused(r, name, cfg, load, want):
    """A run that must fail with an error holding every string of `want`."""
    try:
        r.dscpp(name, 1, cfg, ["--load", load], steps=SAVE_AT + 1)
    except RuntimeError as e:
        missing = [w for w in want if w not in str(e)]
        return [f"{name}: the error lacks {missing}: {str(e)[-600:]}"] if missing else []
    return [f"{name}: loaded"]


def part_errors(r, report):
    """Broken universal folders: an error naming the file, on every rank, never a crash."""
    cfg = config(2, 2)
    ckpt = os.path.join(r.tmp, "errors")
    r.dscpp("errors_first", 2, cfg, ["--save", ckpt, "--save-at", str(SAVE_AT)], steps=SAVE_AT)
    problems = refused(r, "no_latest_universal", universal(cfg), ckpt, ["latest_universal", "does not exist"])
    zero = os.path.join(ckpt, f"global_step{SAVE_AT}_universal", "zero")

    def fresh():  # each case breaks one thing of an intact folder
        shutil.rmtree(os.path.dirname(zero), ignore_errors=True)
        subprocess.run([r.args.to_universal, "--input_folder", ckpt], check=True, capture_output=True)

    fresh()
    os.remove(os.path.join(zero, "l2.bias", "exp_avg_sq.pt"))
    problems += refused(r, "no_exp_avg_sq", universal(cfg), ckpt, [os.path.join(zero, "l2.bias"), "exp_avg_sq"])
    fresh()
    shutil.rmtree(os.path.join(zero, "l3.weight"))
    problems += refused(r, "no_param_folder", universal(cfg), ckpt, ["l3.weight", "has no folder"])
    import torch
    fresh()
    path = os.path.join(zero, "l1.weight", "fp32.pt")
    d = torch.load(path)
    d["param"] = d["param"][:, :8].clone()
    torch.save(d, path)
    problems += refused(r, "wrong_shape", universal(cfg), ckpt, [path, "32x8", "32x16"])
    report("broken universal checkpoints are refused, naming the file", problems)


def part_theirs(r, report):
    ckpt = os.path.join(r.tmp, "theirs")
    straight = r.deepspeed("ds_first", 2, 2, 2, ["--save", ckpt, "--save-at", str(SAVE_AT)],
                           steps=SAVE_AT if r.args.matrix else STEPS)
    tag = os.path.join(ckpt, f"global_step{SAVE_AT}")
    p = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", tag,
                        "--output_folder", tag + "_universal", "--num_extract_workers", "1", "--num_merge_workers",
                        "1", "--inject_missing_state"], capture_output=True, text=True,
                       env=dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        report("DeepSpeed ds_to_universal", [p.stdout[-2000:] + p.stderr[-2000:]])
        return
    if r.args.matrix:
        ref, layouts = ds_universal(r, "ds_u4", 4, ckpt), ((1, 0), (1, 2), (4, 1), (4, 2), (4, 3))
    else:
        straight["losses"] = straight["losses"][SAVE_AT:]
        ref, layouts = straight, ((1, 0), (1, 2), (4, 1), (4, 3))
    for ranks, stage in layouts:
        got = r.dscpp(f"theirs_u_{ranks}_{stage}", ranks, universal(config(stage, 2)), ["--load", ckpt])
        problems = []
        if got["first_step"] != SAVE_AT:
            problems.append(f"resumed at {got['first_step']}")
        problems += compare(got["losses"], ref["losses"], "losses", exact=False)
        problems += compare(got["params"], ref["params"], "weights", exact=False)
        if got.get("client_state", {}).get("saved_at") != SAVE_AT:
            problems.append(f"client_state {got.get('client_state')}")
        report(f"DeepSpeed 2 ranks ZeRO-2 -> ds_to_universal -> dscpp {ranks} ranks ZeRO-{stage}", problems)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--to-universal", dest="to_universal", required=True)
    ap.add_argument("--part", choices=["ours", "theirs", "errors", "all"], default="all")
    ap.add_argument("--matrix", action="store_true", help="theirs: against DeepSpeed's universal resume")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="universal_oracle_")
    r = Runner(args, tmp)
    r.init = os.path.join(tmp, "init.json")
    r.run([args.train, "--mode", "init", "--out", r.init], r.init)
    counts = [0, 0]
    start = time.monotonic()

    def report(name, problems):
        ok = not problems
        counts[0 if ok else 1] += 1
        print(f"{'PASS' if ok else 'FAIL'} {name}{'' if ok else ': ' + '; '.join(problems)}", flush=True)

    for name, fn in {"ours": part_ours, "theirs": part_theirs, "errors": part_errors}.items():
        if args.part in (name, "all"):
            try:
                fn(r, report)
            except Exception as e:  # noqa: BLE001 - a failed run fails the part
                report(f"{name} (aborted)", [str(e)])
    print(f"{counts[0]} passed, {counts[1]} failed ({time.monotonic() - start:.0f} s)")
    if counts[1]:
        print(f"outputs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if counts[1] else 0)


if __name__ == "__main__":
    main()
