#!/usr/bin/env python3
"""Checkpoints of dscpp's engine, checked against independent references.

    checkpoint_oracle.py --launcher build/launcher/dscpp --train build/tests/runtime/engine/engine_train \
        --zero-to-fp32 build/tools/zero_to_fp32 [--part resume|ranks|deepspeed]

resume:    for ZeRO stages 0, 1, 2, 3 on 2 ranks, training to step 20 in one go gives bit-for-bit
           the losses and weights of training to 10, saving, and resuming to 20 in new
           processes; client_state comes back; every file opens with torch.load's defaults
           (weights_only=True).
kill:      a job SIGKILLed at random moments while saving every step resumes from `latest`:
           stages 0, 2 and 3, each killed twice (a fresh job, then the job resumed from the
           first one's `latest`); three times with --matrix (Oracle_kill_matrix).
ranks:     a checkpoint of N ranks continues on M (2->4, 4->2, 2->1, stages 1, 2 and 3) as the
           single-process LibTorch reference trains (1e-5 relative): by default each stage and
           each change of ranks once, and stage 3 (partitions per parameter) both ways; every
           case with --matrix (ctest checkpoint.Oracle_ranks_matrix, label checkpoint_matrix).
stages:    a checkpoint of one ZeRO stage continues at another (through the checkpoint's normal
           form: every parameter whole by name), with or without a change of ranks, as the
           single-process reference trains (1e-5 relative): by default each stage saved and
           loaded, each pair of (0, 1-2, 3), each change of ranks with a change of stage; every
           pair of stages at 1, 2 and 4 ranks with --matrix (checkpoint.Oracle_stages_matrix).
deepspeed: DeepSpeed's zero_to_fp32 gives our tools/zero_to_fp32's weights for stages 1, 2, 3;
           DeepSpeed loads our checkpoints of stages 0-2 and continues as we do, and we load
           its checkpoints and continue as it does (1e-5 relative, fp32 on CPU).
muon:      the same for DeepSpeed's Muon (part_muon says what).
Prints one line per case and `N passed, M failed`; exits 1 on any failure."""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE_TESTS = os.path.join(os.path.dirname(HERE), "engine")
sys.path.insert(0, ENGINE_TESTS)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # tests/
from dscpp_test_ports import free_port  # noqa: E402
from ds_train import config  # noqa: E402  (the ds_config DeepSpeed and dscpp both train with)
from oracle import rel_err  # noqa: E402

STEPS, SAVE_AT = 20, 10
TOLERANCE = 1e-5


class Runner:

    def __init__(self, args, tmp):
        self.args, self.tmp = args, tmp

    def run(self, cmd, out):
        env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=self.args.timeout)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"{' '.join(cmd[:8])}... timed out") from e
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:8])}... exited {p.returncode}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)

    def dscpp(self, name, ranks, cfg, extra=(), steps=STEPS):
        out = os.path.join(self.tmp, name + ".json")
        return self.run([self.args.launcher, "--num_gpus", str(ranks), "--master_port", str(free_port()),
                         self.args.train, "--mode", "dscpp", "--config", json.dumps(cfg), "--steps", str(steps),
                         "--out", out, *extra], out)

    def deepspeed(self, name, ranks, stage, ga, extra=(), steps=STEPS):
        out = os.path.join(self.tmp, name + ".json")
        return self.run([self.args.launcher, "--num_gpus", str(ranks), "--master_port", str(free_port()),
                         "--no_local_rank", sys.executable, os.path.join(ENGINE_TESTS, "ds_train.py"),
                         "--init", self.init, "--stage", str(stage), "--ga", str(ga), "--steps", str(steps),
                         "--out", out, *extra], out)

    def deepspeed_cases(self, name, ranks, cases, extra=(), steps=STEPS):
        """One launch of ds_train.py --cases: every (stage, ga) of `cases` in turn, each writing
        `name` with {stage} and {ga} filled in (as are --save and --load in `extra`)."""
        out = os.path.join(self.tmp, name + ".json")
        self.run([self.args.launcher, "--num_gpus", str(ranks), "--master_port", str(free_port()),
                  "--no_local_rank", sys.executable, os.path.join(ENGINE_TESTS, "ds_train.py"),
                  "--init", self.init, "--cases", ",".join(f"{s}:{g}" for s, g in cases), "--steps", str(steps),
                  "--out", out, *extra], out.format(stage=cases[-1][0], ga=cases[-1][1]))
        return {c: self.load(out.format(stage=c[0], ga=c[1])) for c in cases}

    @staticmethod
    def load(path):
        with open(path) as f:
            return json.load(f)

    def reference(self, cfg):
        out = os.path.join(self.tmp, "reference.json")
        return self.run([self.args.train, "--mode", "reference", "--config", json.dumps(cfg), "--steps",
                         str(STEPS), "--out", out], out)


def opens_with_torch_load(folder):
    """Every .pt file under folder opens with torch.load at its defaults (weights_only=True)."""
    import torch
    files = sorted(glob.glob(os.path.join(folder, "*", "*.pt")))
    if not files:
        return ["no .pt files"]
    problems = []
    for path in files:
        try:
            torch.load(path)
        except Exception as e:  # noqa: BLE001
            problems.append(f"torch.load({os.path.basename(path)}): {str(e)[:300]}")
    return problems


def compare(got, ref, what, exact):
    if len(got) != len(ref):
        return [f"{what}: {len(got)} values, expected {len(ref)}"]
    if exact:
        return [] if got == ref else [f"{what} differ (worst relative error {rel_err(got, ref):.2e}, want bit-exact)"]
    err = rel_err(got, ref)
    return [] if err <= TOLERANCE else [f"{what} differ (worst relative error {err:.2e})"]


def part_resume(r, report):
    for stage in (0, 1, 2, 3):
        cfg = config(stage, 2)
        ckpt = os.path.join(r.tmp, f"resume_s{stage}")
        full = r.dscpp(f"full_s{stage}", 2, cfg)
        r.dscpp(f"first_s{stage}", 2, cfg, ["--save", ckpt, "--save-at", str(SAVE_AT)], steps=SAVE_AT)
        resumed = r.dscpp(f"resumed_s{stage}", 2, cfg, ["--load", ckpt])
        problems = []
        if resumed["first_step"] != SAVE_AT:
            problems.append(f"resumed at step {resumed['first_step']}, saved at {SAVE_AT}")
        problems += compare(resumed["losses"], full["losses"][SAVE_AT:], "losses", exact=True)
        problems += compare(resumed["params"], full["params"], "weights", exact=True)
        want_client = {"saved_at": SAVE_AT, "note": "from engine_train"}
        if resumed.get("client_state") != want_client:
            problems.append(f"client_state {resumed.get('client_state')}, saved {want_client}")
        with open(os.path.join(ckpt, "latest")) as f:
            if f.read() != f"global_step{SAVE_AT}":
                problems.append("latest does not name the saved tag")
        problems += opens_with_torch_load(ckpt)
        report(f"resume stage={stage} ranks=2 (bit-exact)", problems)


def part_kill(r, report):
    """A job killed (SIGKILL, every process) at random moments while it saves every step still
    resumes from the checkpoint `latest` names, and that checkpoint is complete. Two kills per
    stage cover both jobs that can be killed (one starting fresh, one resuming); --matrix kills
    a third time."""
    import random
    import signal
    rng = random.Random(1234)
    for stage in (0, 2, 3):
        cfg = config(stage, 1)
        ckpt = os.path.join(r.tmp, f"kill_s{stage}")
        problems = []
        for attempt in range(3 if r.args.matrix else 2):
            out = os.path.join(r.tmp, f"kill_s{stage}_{attempt}.json")
            cmd = [r.args.launcher, "--num_gpus", "2", "--master_port", str(free_port()), r.args.train, "--mode",
                   "dscpp", "--config", json.dumps(cfg), "--steps", "100000", "--save", ckpt, "--save-interval",
                   "1", "--out", out] + (["--load", ckpt] if os.path.exists(os.path.join(ckpt, "latest")) else [])
            env = dict(os.environ, OMP_NUM_THREADS="1")
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
            time.sleep(rng.uniform(2.0, 4.0))
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            time.sleep(0.5)  # let the killed ranks' exits settle before the next job
        if not os.path.exists(os.path.join(ckpt, "latest")):
            problems.append("no checkpoint was completed before the kills")
        else:
            with open(os.path.join(ckpt, "latest")) as f:
                tag = f.read()
            saved = int(tag.replace("global_step", ""))
            got = r.dscpp(f"kill_resume_s{stage}", 2, cfg, ["--load", ckpt], steps=saved + 2)
            if got["first_step"] != saved or len(got["losses"]) != 2:
                problems.append(f"resumed at {got['first_step']} with {len(got['losses'])} steps, latest is {tag}")
            problems += opens_with_torch_load(ckpt)
        report(f"kill during saves stage={stage} ({3 if r.args.matrix else 2} SIGKILLs, resumed from latest)",
               problems)


RANKS_CASES = [(1, 2, 4), (2, 2, 4), (2, 4, 2), (1, 4, 2), (2, 2, 1), (3, 2, 4), (3, 4, 2)]
# (stage, saved, loaded) by default: stage 1 4->2, stage 2 2->4 and 2->1, stage 3 both ways.
RANKS_COVERING = [(2, 2, 4), (1, 4, 2), (2, 2, 1), (3, 2, 4), (3, 4, 2)]


def part_ranks(r, report):
    for stage, saved, loaded in RANKS_CASES if r.args.matrix else RANKS_COVERING:
        cfg = config(stage, 2)
        ckpt = os.path.join(r.tmp, f"ranks_s{stage}_{saved}")
        if not os.path.isdir(ckpt):
            r.dscpp(f"save_s{stage}_{saved}", saved, cfg,
                    ["--save", ckpt, "--save-at", str(SAVE_AT)], steps=SAVE_AT)
        got = r.dscpp(f"load_s{stage}_{saved}_{loaded}", loaded, cfg, ["--load", ckpt])
        ref = r.reference(cfg)
        problems = compare(got["losses"], ref["losses"][SAVE_AT:], "losses", exact=False)
        problems += compare(got["params"], ref["params"], "weights", exact=False)
        report(f"ranks stage={stage} {saved}->{loaded}", problems)


# (saved stage, ranks, loaded stage, ranks)
STAGES_CASES = [(a, 2, b, n) for a in range(4) for b in range(4) if a != b for n in (1, 2, 4)]
STAGES_COVERING = [(0, 2, 1, 2), (1, 2, 0, 4), (2, 4, 3, 2), (3, 2, 0, 1), (0, 2, 3, 4), (3, 2, 2, 2),
                   (2, 2, 1, 1)]


def part_stages(r, report):
    for saved_stage, saved, stage, loaded in STAGES_CASES if r.args.matrix else STAGES_COVERING:
        ckpt = os.path.join(r.tmp, f"stages_s{saved_stage}_{saved}")
        if not os.path.isdir(ckpt):
            r.dscpp(f"stages_save_s{saved_stage}_{saved}", saved, config(saved_stage, 2),
                    ["--save", ckpt, "--save-at", str(SAVE_AT)], steps=SAVE_AT)
        cfg = config(stage, 2)
        got = r.dscpp(f"stages_load_s{saved_stage}_{saved}_s{stage}_{loaded}", loaded, cfg, ["--load", ckpt])
        ref = r.reference(cfg)
        problems = compare(got["losses"], ref["losses"][SAVE_AT:], "losses", exact=False)
        problems += compare(got["params"], ref["params"], "weights", exact=False)
        report(f"stages {saved_stage}->{stage} ranks {saved}->{loaded}", problems)


def part_deepspeed(r, report):
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    r.init = os.path.join(r.tmp, "init.json")
    r.run([r.args.train, "--mode", "init", "--out", r.init], r.init)
    stages, ga = (0, 1, 2), 2
    ours, theirs = (os.path.join(r.tmp, f"{who}_s{{stage}}") for who in ("ours", "theirs"))
    # One run of ours both saves at SAVE_AT and trains on (part_resume shows a save changes
    # nothing). DeepSpeed's side is two launches of every stage each (ds_train.py --cases): its
    # resumes from our checkpoints, and its straight runs saving at SAVE_AT. A launch costs CI's
    # 2 cores ~12 s of importing torch and DeepSpeed on each rank, a case well under a second.
    full = {s: r.dscpp(f"ds_full_s{s}", 2, config(s, ga), ["--save", ours.format(stage=s), "--save-at",
                                                         str(SAVE_AT)]) for s in stages}
    cases = [(s, ga) for s in stages]
    launch_errors = []
    try:
        ds_resumed = r.deepspeed_cases("ds_loads_ours_s{stage}", 2, cases, ["--load", ours])
        ds_full = r.deepspeed_cases("ds_straight_s{stage}", 2, cases, ["--save", theirs, "--save-at", str(SAVE_AT)])
    except RuntimeError as e:  # every stage's case below then names the failed launch
        launch_errors.append(str(e))
    for stage in stages:
        problems = list(launch_errors)
        if stage >= 1:
            ds_sd = get_fp32_state_dict_from_zero_checkpoint(ours.format(stage=stage))
            out = os.path.join(r.tmp, f"fp32_s{stage}.pt")
            subprocess.run([r.args.zero_to_fp32, ours.format(stage=stage), out], check=True, capture_output=True)
            our_sd = torch.load(out)
            if sorted(ds_sd) != sorted(our_sd):
                problems.append(f"zero_to_fp32 keys differ: DeepSpeed {sorted(ds_sd)}, ours {sorted(our_sd)}")
            else:
                bad = [k for k in ds_sd if not torch.equal(ds_sd[k], our_sd[k])]
                if bad:
                    problems.append(f"zero_to_fp32 values differ for {bad}")
        if not launch_errors:
            # DeepSpeed resumed from our checkpoint and trained on as we do.
            theirs_resumed, theirs_full = ds_resumed[(stage, ga)], ds_full[(stage, ga)]
            if theirs_resumed["first_step"] != SAVE_AT:
                problems.append(f"DeepSpeed resumed at {theirs_resumed['first_step']}")
            problems += compare(theirs_resumed["losses"], full[stage]["losses"][SAVE_AT:],
                                "DeepSpeed-from-ours losses", exact=False)
            problems += compare(theirs_resumed["params"], full[stage]["params"], "DeepSpeed-from-ours weights",
                                exact=False)
            # We resume from DeepSpeed's checkpoint and train on as it did.
            ours_resumed = r.dscpp(f"ours_loads_ds_s{stage}", 2, config(stage, ga),
                                   ["--load", theirs.format(stage=stage)])
            problems += compare(ours_resumed["losses"], theirs_full["losses"][SAVE_AT:], "ours-from-DeepSpeed losses",
                                exact=False)
            problems += compare(ours_resumed["params"], theirs_full["params"], "ours-from-DeepSpeed weights",
                                exact=False)
            if ours_resumed.get("client_state", {}).get("saved_at") != SAVE_AT:
                problems.append(f"client_state from DeepSpeed's checkpoint: {ours_resumed.get('client_state')}")
        report(f"deepspeed interop stage={stage}", problems)
    # Stage 3: DeepSpeed's zero_to_fp32 reads our per-parameter partitions as ours does.
    cfg = config(3, 2)
    ours = os.path.join(r.tmp, "ours_s3")
    r.dscpp("ds_first_s3", 2, cfg, ["--save", ours, "--save-at", str(SAVE_AT)], steps=SAVE_AT)
    ds_sd = get_fp32_state_dict_from_zero_checkpoint(ours)
    out = os.path.join(r.tmp, "fp32_s3.pt")
    subprocess.run([r.args.zero_to_fp32, ours, out], check=True, capture_output=True)
    our_sd = torch.load(out)
    problems = []
    if sorted(ds_sd) != sorted(our_sd):
        problems.append(f"zero_to_fp32 keys differ: DeepSpeed {sorted(ds_sd)}, ours {sorted(our_sd)}")
    elif any(not torch.equal(ds_sd[k].contiguous(), our_sd[k]) for k in ds_sd):
        problems.append("zero_to_fp32 values differ")
    problems += opens_with_torch_load(ours)
    report("deepspeed zero_to_fp32 stage=3", problems)


MUON_SAVE_AT, MUON_STEPS = 3, 4


def part_muon(r, report):
    """Checkpoints of DeepSpeed's "type": "Muon" (ds_train.config's, Newton-Schulz "gram"; the
    tall l1.weight with the auxiliary Adam on both sides, as deepspeed_oracle.py --muon says
    why): Muon's matrices are the first parameter group, their momentum_buffer partitioned as
    DeepSpeed partitions the group.
    - resume: bit-exact at stages 0-3 on 2 ranks (MUON_STEPS steps, saved after MUON_SAVE_AT),
      and at stage 1 with parameter groups;
    - another layout: a stage-1 checkpoint of 2 ranks continues on 1 rank (the same stage, its
      partitions re-cut), at stage 2 (the normal form) and, through tools/to_universal, on 1
      rank at stage 2, as the 2-rank run does, one step, 1e-5 (one step: Newton-Schulz's half
      precision turns later last-bit differences into rounding flips);
    - DeepSpeed: its engine loads ours of stages 0-2 and we load its, each continuing one step
      as the other does (1e-5)."""
    adam = ["--adam-param", "l1.weight"]
    for stage in (0, 1, 2, 3):
        cfg = config(stage, 2, "gram")
        ckpt = os.path.join(r.tmp, f"muon_s{stage}")
        full = r.dscpp(f"muon_full_s{stage}", 2, cfg, adam, steps=MUON_STEPS)
        r.dscpp(f"muon_first_s{stage}", 2, cfg, adam + ["--save", ckpt, "--save-at", str(MUON_SAVE_AT)],
                steps=MUON_SAVE_AT)
        resumed = r.dscpp(f"muon_resumed_s{stage}", 2, cfg, adam + ["--load", ckpt], steps=MUON_STEPS)
        problems = compare(resumed["losses"], full["losses"][MUON_SAVE_AT:], "losses", exact=True)
        problems += compare(resumed["params"], full["params"], "weights", exact=True)
        problems += opens_with_torch_load(ckpt)
        report(f"muon: resume stage={stage} ranks=2 (bit-exact)", problems)
    # With parameter groups (each split into its Muon and Adam halves): bit-exact too.
    groups = ["--groups", json.dumps([{"params": ["l1.weight", "l2.weight", "l3.weight"], "lr": 0.004,
                                       "weight_decay": 0.05},
                                      {"params": ["l1.bias", "l2.bias", "l3.bias"], "weight_decay": 0.0}])]
    cfg = config(1, 2, "gram")
    ckpt = os.path.join(r.tmp, "muon_groups")
    full = r.dscpp("muon_groups_full", 2, cfg, adam + groups, steps=MUON_STEPS)
    r.dscpp("muon_groups_first", 2, cfg, adam + groups + ["--save", ckpt, "--save-at", str(MUON_SAVE_AT)],
            steps=MUON_SAVE_AT)
    resumed = r.dscpp("muon_groups_resumed", 2, cfg, adam + groups + ["--load", ckpt], steps=MUON_STEPS)
    problems = compare(resumed["losses"], full["losses"][MUON_SAVE_AT:], "losses", exact=True)
    problems += compare(resumed["params"], full["params"], "weights", exact=True)
    report("muon: resume with parameter groups, stage=1 ranks=2 (bit-exact)", problems)
    full = r.load(os.path.join(r.tmp, "muon_full_s1.json"))
    for name, ranks, stage in (("1 rank, stage 1", 1, 1), ("2 ranks, stage 2", 2, 2)):
        got = r.dscpp(f"muon_from_s1_{ranks}_{stage}", ranks, config(stage, 2, "gram"),
                      adam + ["--load", os.path.join(r.tmp, "muon_s1")], steps=MUON_STEPS)
        problems = compare(got["losses"], full["losses"][MUON_SAVE_AT:], "losses", exact=False)
        problems += compare(got["params"], full["params"], "weights", exact=False)
        report(f"muon: a 2-rank stage-1 checkpoint goes on at {name}", problems)
    # tools/to_universal of it: every parameter whole, its momentum_buffer beside fp32, taken by
    # a 1-rank engine at stage 2 (checkpoint.load_universal) going on as the 2-rank run does.
    if r.args.to_universal:
        subprocess.run([r.args.to_universal, "--input_folder",
                        os.path.join(r.tmp, "muon_s1", f"global_step{MUON_SAVE_AT}")],
                       check=True, capture_output=True)
        cfg = {**config(2, 2, "gram"), "checkpoint": {"load_universal": True}}
        got = r.dscpp("muon_universal", 1, cfg, adam + ["--load", os.path.join(r.tmp, "muon_s1")],
                      steps=MUON_STEPS)
        problems = compare(got["losses"], full["losses"][MUON_SAVE_AT:], "losses", exact=False)
        problems += compare(got["params"], full["params"], "weights", exact=False)
        momentum = glob.glob(os.path.join(r.tmp, "muon_s1", f"global_step{MUON_SAVE_AT}_universal", "zero",
                                          "*", "momentum_buffer.pt"))
        if not momentum:
            problems.append("the universal folder holds no momentum_buffer.pt")
        report("muon: to_universal of a 2-rank stage-1 checkpoint goes on at 1 rank, stage 2", problems)
    # DeepSpeed: its runs from ours and straight (saving at MUON_SAVE_AT), then ours from its.
    r.init = os.path.join(r.tmp, "init.json")
    r.run([r.args.train, "--mode", "init", "--out", r.init], r.init)
    stages, ga = (0, 1, 2), 2
    ours, theirs = (os.path.join(r.tmp, f"muon_{who}_s{{stage}}") for who in ("ours", "theirs"))
    for s in stages:
        r.dscpp(f"muon_save_s{s}", 2, config(s, ga, "gram"),
                adam + ["--save", ours.format(stage=s), "--save-at", str(MUON_SAVE_AT)], steps=MUON_STEPS)
    cases = [(s, ga) for s in stages]
    launch_errors = []
    try:
        ds_resumed = r.deepspeed_cases("muon_ds_loads_ours_s{stage}", 2, cases,
                                       ["--muon", "gram", "--load", ours], steps=MUON_STEPS)
        ds_full = r.deepspeed_cases("muon_ds_straight_s{stage}", 2, cases,
                                    ["--muon", "gram", "--save", theirs, "--save-at", str(MUON_SAVE_AT)],
                                    steps=MUON_STEPS)
    except RuntimeError as e:
        launch_errors.append(str(e))
    for s in stages:
        problems = list(launch_errors)
        if not launch_errors:
            mine = r.load(os.path.join(r.tmp, f"muon_save_s{s}.json"))
            theirs_resumed, theirs_full = ds_resumed[(s, ga)], ds_full[(s, ga)]
            problems += compare(theirs_resumed["losses"], mine["losses"][MUON_SAVE_AT:],
                                "DeepSpeed-from-ours losses", exact=False)
            problems += compare(theirs_resumed["params"], mine["params"], "DeepSpeed-from-ours weights",
                                exact=False)
            ours_resumed = r.dscpp(f"muon_ours_loads_ds_s{s}", 2, config(s, ga, "gram"),
                                   adam + ["--load", theirs.format(stage=s)], steps=MUON_STEPS)
            problems += compare(ours_resumed["losses"], theirs_full["losses"][MUON_SAVE_AT:],
                                "ours-from-DeepSpeed losses", exact=False)
            problems += compare(ours_resumed["params"], theirs_full["params"], "ours-from-DeepSpeed weights",
                                exact=False)
        report(f"muon: deepspeed interop stage={s}", problems)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--zero-to-fp32", dest="zero_to_fp32", required=True)
    ap.add_argument("--to-universal", dest="to_universal", help="tools/to_universal (the muon part)")
    ap.add_argument("--part", choices=["resume", "kill", "ranks", "stages", "deepspeed", "muon", "all"],
                    default="all")
    ap.add_argument("--matrix", action="store_true",
                    help="ranks, stages: every case, not the covering set; kill: three kills per stage")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="checkpoint_oracle_")
    r = Runner(args, tmp)
    counts = [0, 0]
    start = time.monotonic()

    def report(name, problems):
        ok = not problems
        counts[0 if ok else 1] += 1
        print(f"{'PASS' if ok else 'FAIL'} {name}{'' if ok else ': ' + '; '.join(problems)}", flush=True)

    parts = {"resume": part_resume, "kill": part_kill, "ranks": part_ranks, "stages": part_stages,
             "deepspeed": part_deepspeed, "muon": part_muon}
    for name, fn in parts.items():
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
