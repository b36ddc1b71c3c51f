#!/usr/bin/env python3
"""ZeRO-Infinity (offload_optimizer.device = "nvme") against the same training without offload.

    nvme_oracle.py --launcher build/launcher/dscpp --train build/tests/runtime/engine/engine_train [--full]

Trains the tiny models with dscpp through the launcher (real processes over Gloo, fp32) with
the fp32 master and the optimizer state in swap files under a temporary nvme_path (io_uring,
small aio blocks and queue, a few swap buffers, sub_group_size pieces) and without offload:
losses and weights within 1e-6 relative; nothing of the state in memory but the swap buffers
(at most buffer_count sets); the files in DeepSpeed's folder
(nvme_path/zero_stage_<s>/optimizer/rank0/<name>.tensor.swp) while training, gone after a
clean exit. Checkpoints: an NVMe run saved mid-way resumes bit-exactly, loads into a run
without offload, and one without offload loads into an NVMe run (1e-6 against the
uninterrupted runs). Errors: an nvme_path that is missing, or is a file, stops the run with a
message naming it. Without --full a covering set (each stage, rank count and accumulation
once); --full is the grid (ctest label offload_matrix). Prints one line per case and
`N passed, M failed` last."""
import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from offload_oracle import config, rel_err, run  # noqa: E402

PORTS = list(range(29850, 29860))


def nvme(path, buffer_count=3):
    return {"offload_optimizer": {"device": "nvme", "nvme_path": path, "buffer_count": buffer_count},
            "sub_group_size": 50}


def with_aio(cfg):
    cfg["aio"] = {"block_size": 4096, "queue_depth": 4, "single_submit": False}
    return cfg


class Runner:
    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp()
        self.count = 0

    def cmd(self, model, n, cfg, steps, out):
        port = PORTS[self.count % len(PORTS)]
        self.count += 1
        return [self.args.launcher, "--num_gpus", str(n), "--master_port", str(port), self.args.train,
                "--mode", "dscpp", "--model", model, "--config", json.dumps(cfg), "--steps", str(steps),
                "--out", out]

    def train(self, model, n, cfg, steps, save=None, save_at=None, load=None):
        out = os.path.join(self.tmp, f"run{self.count}.json")
        cmd = self.cmd(model, n, cfg, steps, out)
        if save:
            cmd += ["--save", save, "--save-at", str(save_at)]
        if load:
            cmd += ["--load", load]
        return run(cmd, out)

    def fresh_path(self, name):
        p = os.path.join(self.tmp, name)
        shutil.rmtree(p, ignore_errors=True)
        os.makedirs(p)
        return p


def check_nvme(got, base, path, stage, n, buffer_count):
    problems = []
    if not got.get("offloaded"):
        problems.append("not offloaded")
    if got.get("state_numel") != 0:
        problems.append(f"{got.get('state_numel')} state elements in memory (all should be in files)")
    folder = os.path.join(path, f"zero_stage_{stage}", "optimizer", "rank0")
    if got.get("nvme_folder") != folder:
        problems.append(f"swap folder {got.get('nvme_folder')}, DeepSpeed's is {folder}")
    want_files = ["exp_avg.tensor.swp", "exp_avg_sq.tensor.swp", "fp32_master.tensor.swp"]
    if got.get("nvme_files") != want_files:
        problems.append(f"swap files {got.get('nvme_files')}")
    if got.get("partition") != got.get("total", 0) // n:
        problems.append(f"partition {got.get('partition')} of {got.get('total')} on {n} ranks")
    if got.get("nvme_bytes") != 3 * 4 * got.get("partition", -1):
        problems.append(f"{got.get('nvme_bytes')} bytes on disk for a partition of {got.get('partition')}")
    # At most buffer_count sets of (master + 2 states) pieces of sub_group_size (50).
    if not 0 < got.get("nvme_buffer_numel", 0) <= buffer_count * 3 * 50:
        problems.append(f"{got.get('nvme_buffer_numel')} buffer elements in memory")
    if os.listdir(path):
        problems.append(f"left behind under nvme_path: {os.listdir(path)}")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    r = Runner(args)
    if args.full:
        cases = [(m, s, ga, n) for m, s in (("mlp", 1), ("mlp", 2), ("gpt", 3))
                 for ga, n in itertools.product([1, 4], [1, 2, 4])]
    else:
        # Each stage, rank count and accumulation once.
        cases = [("mlp", 1, 4, 2), ("mlp", 2, 1, 4), ("gpt", 3, 1, 1)]
    passed = failed = 0

    def report(ok, name, msg):
        nonlocal passed, failed
        print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)
        passed += ok
        failed += not ok

    for model, stage, ga, n in cases:
        name = f"{model} stage={stage} accumulation={ga} ranks={n} offload=nvme"
        if args.only not in name:
            continue
        try:
            path = r.fresh_path(f"nvme_{model}_{stage}_{ga}_{n}")
            base, _ = r.train(model, n, config(stage, ga, None), args.steps)
            got, _ = r.train(model, n, with_aio(config(stage, ga, nvme(path))), args.steps)
            le, pe = rel_err(got["losses"], base["losses"]), rel_err(got["params"], base["params"])
            problems = []
            if le > 1e-6:
                problems.append(f"losses differ ({le:.2e})")
            if pe > 1e-6:
                problems.append(f"weights differ ({pe:.2e})")
            problems += check_nvme(got, base, path, stage, n, 3)
            report(not problems, name, f"losses {le:.1e}, weights {pe:.1e}" if not problems else "; ".join(problems))
        except Exception as e:  # noqa: BLE001
            report(False, name, str(e))

    # Checkpoints across NVMe and back.
    ck_cases = [("mlp", 2, 1, 2)]
    if args.full:
        ck_cases += [("gpt", 3, 1, 2), ("mlp", 1, 4, 2)]
    for model, stage, ga, n in ck_cases:
        name = f"checkpoint {model} stage={stage} accumulation={ga} ranks={n} offload=nvme"
        if args.only not in name:
            continue
        try:
            path = r.fresh_path(f"ck_nvme_{model}_{stage}")
            off_cfg = config(stage, ga, nvme(path, buffer_count=2))
            plain_cfg = config(stage, ga, None)
            off_dir = os.path.join(r.tmp, f"ck_off_{model}_{stage}_{ga}")
            plain_dir = os.path.join(r.tmp, f"ck_plain_{model}_{stage}_{ga}")
            off_full, _ = r.train(model, n, off_cfg, args.steps, save=off_dir, save_at=3)
            plain_full, _ = r.train(model, n, plain_cfg, args.steps, save=plain_dir, save_at=3)
            problems = []
            resumed, _ = r.train(model, n, off_cfg, args.steps, load=off_dir)
            if resumed["params"] != off_full["params"] or resumed["losses"] != off_full["losses"][3:]:
                problems.append("NVMe resume is not bit-exact")
            into_plain, _ = r.train(model, n, plain_cfg, args.steps, load=off_dir)
            e1 = rel_err(into_plain["params"], off_full["params"])
            into_off, _ = r.train(model, n, off_cfg, args.steps, load=plain_dir)
            e2 = rel_err(into_off["params"], plain_full["params"])
            if e1 > 1e-6:
                problems.append(f"NVMe checkpoint into a run without offload: weights {e1:.2e}")
            if e2 > 1e-6:
                problems.append(f"checkpoint without offload into an NVMe run: weights {e2:.2e}")
            if os.listdir(path):
                problems.append(f"left behind under nvme_path: {os.listdir(path)}")
            report(not problems, name, f"resume bit-exact, across {e1:.1e} / {e2:.1e}" if not problems
                   else "; ".join(problems))
        except Exception as e:  # noqa: BLE001
            report(False, name, str(e))

    # A bad nvme_path stops the run with a message naming it (no crash, no hang).
    missing = os.path.join(r.tmp, "no_such_folder")
    a_file = os.path.join(r.tmp, "a_file")
    with open(a_file, "w") as f:
        f.write("x")
    for bad, says in ((missing, "does not exist"), (a_file, "is not a directory")):
        name = f"error nvme_path {says}"
        if args.only not in name:
            continue
        out = os.path.join(r.tmp, "bad.json")
        cmd = r.cmd("mlp", 1, config(2, 1, nvme(bad)), 2, out)
        p = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                           text=True, timeout=120)
        want = f"zero_optimization.offload_optimizer.nvme_path '{bad}': {says}"
        # Exit 1 with the message: not a signal (an abort, a crash), not a hang.
        ok = p.returncode == 1 and want in p.stdout + p.stderr
        report(ok, name, f"exit {p.returncode}" if ok else f"exit {p.returncode}: {(p.stdout + p.stderr)[-800:]}")
    print(f"{passed} passed, {failed} failed")
    shutil.rmtree(r.tmp, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
