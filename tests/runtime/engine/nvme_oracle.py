#!/usr/bin/env python3
"""ZeRO-Infinity (offload_optimizer / offload_param device "nvme") against training without offload.

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
message naming it.
Parameters (offload_param nvme, stage 3, alone and with the optimizer's): the same 1e-6; the
16-bit chunks past max_in_cpu in DeepSpeed's folder (nvme_path/zero_stage_3/float32params/rank0/
<bucket>_param.tensor.swp, sizes adding up to the swapped part of the partition); in memory at
most buffer_count buffers of at most buffer_size elements at a time and max_in_cpu resident
elements, by the swapper's own accounting; reads issued ahead of their gathers used; an NVMe
run saved mid-way resumes bit-exactly (--full: also across to and from a run without offload);
an nvme_path that cannot be written stops the run naming it.
Without --full a covering set (each stage, rank count and accumulation once, and for the
parameters each of those once); --full is the grid (ctest label offload_matrix). Prints one
line per case and `N passed, M failed` last."""
import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # tests/
from dscpp_test_ports import free_port  # noqa: E402
from offload_oracle import config, rel_err, run  # noqa: E402

# Elements per parameter swap buffer: the tiny models' largest chunk (a bucket of about 300
# elements and one weight of up to 1024) fits.
PARAM_BUFFER_SIZE = 2048


def nvme(path, buffer_count=3):
    return {"offload_optimizer": {"device": "nvme", "nvme_path": path, "buffer_count": buffer_count},
            "sub_group_size": 50}


def param_nvme(path, buffer_count=3, buffer_size=PARAM_BUFFER_SIZE, max_in_cpu=0):
    return {"offload_param": {"device": "nvme", "nvme_path": path, "buffer_count": buffer_count,
                              "buffer_size": buffer_size, "max_in_cpu": max_in_cpu}}


def with_aio(cfg):
    cfg["aio"] = {"block_size": 4096, "queue_depth": 4, "single_submit": False}
    return cfg


class Runner:
    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp()
        self.count = 0
        self.baselines = {}

    def cmd(self, model, n, cfg, steps, out):
        self.count += 1
        return [self.args.launcher, "--num_gpus", str(n), "--master_port", str(free_port()), self.args.train,
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

    def baseline(self, model, stage, ga, n, steps, extra=None):
        # One run without offload per layout, shared by the cases that compare with it.
        key = (model, stage, ga, n, steps, json.dumps(extra))
        if key not in self.baselines:
            self.baselines[key], _ = self.train(model, n, config(stage, ga, None, extra), steps)
        return self.baselines[key]

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


def check_param_nvme(got, path, n, buffer_count, buffer_size, max_in_cpu, layered):
    problems = []
    folder = os.path.join(path, "zero_stage_3", "float32params", "rank0")
    if got.get("param_nvme_folder") != folder:
        problems.append(f"parameter swap folder {got.get('param_nvme_folder')}, DeepSpeed's is {folder}")
        return problems
    partition, resident = got.get("partition", -1), got.get("param_resident", -1)
    if got.get("partition16") != partition or got.get("partition") != got.get("total", 0) // n:
        problems.append(f"16-bit partition {got.get('partition16')} of {got.get('total')} on {n} ranks")
    if not 0 <= resident <= max_in_cpu:
        problems.append(f"{resident} parameter elements kept in memory, max_in_cpu {max_in_cpu}")
    files = got.get("param_nvme_files", {})
    if not files or any(not (f.endswith("_param.tensor.swp") and f.split("_")[0].isdigit()) for f in files):
        problems.append(f"parameter swap files {sorted(files)}")
    if sum(files.values()) != 4 * (partition - resident) or got.get("param_nvme_bytes") != 4 * (partition - resident):
        problems.append(f"{sum(files.values())} bytes in files ({got.get('param_nvme_bytes')} counted) for "
                        f"{partition - resident} swapped elements")
    if not 0 < got.get("param_nvme_peak_buffers", 0) <= buffer_count:
        problems.append(f"{got.get('param_nvme_peak_buffers')} swap buffers in use at once, buffer_count {buffer_count}")
    if not 0 < got.get("param_nvme_buffer_numel", 0) <= buffer_count * buffer_size:
        problems.append(f"{got.get('param_nvme_buffer_numel')} buffer elements, at most {buffer_count} x {buffer_size}")
    elif len(files) > buffer_count and got["param_nvme_buffer_numel"] >= partition - resident:
        problems.append(f"{got['param_nvme_buffer_numel']} buffer elements: as many as the swapped ones")
    # (by layer only: a model gathered whole has no order to read ahead in)
    if layered and got.get("param_nvme_reads_ahead_used", 0) <= 0:
        problems.append("no read ahead of its gather was used")
    if got.get("param_nvme_writes", 0) <= 0 or got.get("param_nvme_reads", 0) <= 0:
        problems.append(f"{got.get('param_nvme_reads')} reads, {got.get('param_nvme_writes')} writes")
    if got.get("partition16_device") != "cpu":
        problems.append(f"16-bit partition on {got.get('partition16_device')}")
    return problems


def param_cases(r, args, report):
    """offload_param nvme (stage 3) against no offload; then its checkpoint; then a bad path."""
    # Gathering that releases each layer after use and prefetches little (more reads, reads
    # ahead given up), with the small parameters persistent (their chunks refreshed from a swap
    # buffer at every step).
    tight = {"stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 1500,
             "stage3_param_persistence_threshold": 100}
    if args.full:
        # (The transformer stops at 2 ranks, as it always did here.)
        cases = [(m, ga, n, both, None, 3 if m == "gpt" else 1) for m in ("gpt", "transformer")
                 for ga, n in itertools.product([1, 4], [1, 2, 4] if m == "gpt" else [1, 2])
                 for both in (False, True)]
        cases += [("gpt", 4, 2, False, tight, 1), ("gpt", 1, 4, True, tight, 2)]
    else:
        # Each rank count, accumulation, optimizer placement, max_in_cpu (0 or a part), way of
        # gathering (by layer, tight or not, and whole) once. (A buffer that wrote a chunk
        # serves its next read: the transformer's few buckets take 1 buffer to be read back.)
        cases = [("gpt", 4, 2, False, None, 3), ("gpt", 1, 1, True, tight, 3), ("transformer", 1, 2, False, None, 1)]
    for model, ga, n, both, extra, buffers in cases:
        name = f"{model} stage=3 accumulation={ga} ranks={n} offload_param=nvme buffers={buffers}" + \
            (" offload_optimizer=nvme" if both else "") + (" tight gathering" if extra else "")
        if args.only not in name:
            continue
        try:
            path = r.fresh_path(f"pnvme_{model}_{ga}_{n}_{both}_{buffers}")
            max_in_cpu = 600 if both else 0  # a head of the partition kept in memory, or none
            off = param_nvme(path, buffer_count=buffers, max_in_cpu=max_in_cpu)
            if both:
                off.update(nvme(path))
            base = r.baseline(model, 3, ga, n, args.steps, extra)
            got, _ = r.train(model, n, with_aio(config(3, ga, off, extra)), args.steps)
            le, pe = rel_err(got["losses"], base["losses"]), rel_err(got["params"], base["params"])
            problems = []
            if le > 1e-6:
                problems.append(f"losses differ ({le:.2e})")
            if pe > 1e-6:
                problems.append(f"weights differ ({pe:.2e})")
            problems += check_param_nvme(got, path, n, buffers, PARAM_BUFFER_SIZE, max_in_cpu, model == "gpt")
            if both and got.get("state_numel") != 0:
                problems.append(f"{got.get('state_numel')} optimizer state elements in memory")
            if os.listdir(path):
                problems.append(f"left behind under nvme_path: {os.listdir(path)}")
            report(not problems, name, f"losses {le:.1e}, weights {pe:.1e}, {got['param_nvme_reads']} reads "
                   f"({got['param_nvme_reads_ahead_used']} ahead), peak {got['param_nvme_peak_buffers']} buffers"
                   if not problems else "; ".join(problems))
        except Exception as e:  # noqa: BLE001
            report(False, name, str(e))

    ck_cases = [("gpt", 1, 2)] + ([("gpt", 4, 2), ("transformer", 1, 2)] if args.full else [])
    for model, ga, n in ck_cases:
        name = f"checkpoint {model} stage=3 accumulation={ga} ranks={n} offload_param=nvme"
        if args.only not in name:
            continue
        try:
            path = r.fresh_path(f"ck_pnvme_{model}_{ga}")
            off_cfg = config(3, ga, param_nvme(path, buffer_count=2))
            off_dir = os.path.join(r.tmp, f"ck_poff_{model}_{ga}")
            off_full, _ = r.train(model, n, off_cfg, args.steps, save=off_dir, save_at=3)
            resumed, _ = r.train(model, n, off_cfg, args.steps, load=off_dir)
            problems = []
            if resumed["params"] != off_full["params"] or resumed["losses"] != off_full["losses"][3:]:
                problems.append("NVMe resume is not bit-exact")
            msg = "resume bit-exact"
            if args.full:
                plain_cfg = config(3, ga, None)
                plain_dir = os.path.join(r.tmp, f"ck_pplain_{model}_{ga}")
                plain_full, _ = r.train(model, n, plain_cfg, args.steps, save=plain_dir, save_at=3)
                into_plain, _ = r.train(model, n, plain_cfg, args.steps, load=off_dir)
                into_off, _ = r.train(model, n, off_cfg, args.steps, load=plain_dir)
                e1 = rel_err(into_plain["params"], off_full["params"])
                e2 = rel_err(into_off["params"], plain_full["params"])
                if e1 > 1e-6 or e2 > 1e-6:
                    problems.append(f"across NVMe and no offload: weights {e1:.2e} / {e2:.2e}")
                msg += f", across {e1:.1e} / {e2:.1e}"
            if os.listdir(path):
                problems.append(f"left behind under nvme_path: {os.listdir(path)}")
            report(not problems, name, msg if not problems else "; ".join(problems))
        except Exception as e:  # noqa: BLE001
            report(False, name, str(e))

    # An nvme_path that cannot be written (/proc refuses new folders even to root).
    name = "error offload_param nvme_path cannot be written"
    if args.only in name:
        out = os.path.join(r.tmp, "bad.json")
        cmd = r.cmd("gpt", 1, config(3, 1, param_nvme("/proc")), 2, out)
        p = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                           text=True, timeout=120)
        want = "zero_optimization.offload_param.nvme_path '/proc': cannot make the swap folder"
        ok = p.returncode == 1 and want in p.stdout + p.stderr
        report(ok, name, f"exit {p.returncode}" if ok else f"exit {p.returncode}: {(p.stdout + p.stderr)[-800:]}")


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
            base = r.baseline(model, stage, ga, n, args.steps)
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
    param_cases(r, args, report)
    print(f"{passed} passed, {failed} failed")
    shutil.rmtree(r.tmp, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
