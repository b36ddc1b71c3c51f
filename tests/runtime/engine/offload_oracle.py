#!/usr/bin/env python3
"""ZeRO-Offload of the optimizer and of the parameters against the same training without it.

    offload_oracle.py --launcher build/launcher/dscpp --train build/tests/runtime/engine/engine_train [--full]

Trains the tiny models with dscpp through the launcher (real processes over Gloo) with
`offload_optimizer: {device: cpu}` (the CPU optimizer, sub_group_size pieces, the staging
copies) and without it, at stages 1, 2 and 3 (3 by layer for the GPT), on 1, 2 and 4 ranks,
accumulation 1 and 4: losses and weights within 1e-6 relative, the master and the optimizer
state on the host, 1/N of it per rank. Partial offload (ratio 0.5, stage 3): the host holds
only its share of the state. Parameter offload (stage 3, alone and with the optimizer's): the
16-bit partition on the host, its chunks brought up through at most buffer_count staging
buffers. Checkpoints: an offloaded run saved mid-way resumes
bit-exactly, and its checkpoint loads into a run without offload (and a checkpoint of a run
without offload into an offloaded one), which then train as the uninterrupted runs (1e-6).
Without --full a covering subset runs (the default ctest); --full is ctest label offload_matrix.
--overlap: the update overlapped with backward (stages 1-2, overlap_comm, no clipping;
zero/offload_overlap.h): offload == no offload within 1e-6 at stages 1 and 2, accumulation 1 and 4,
every step after the first (whose backward's end lays the buffers out) overlapped, and bucket updates that
began before backward ended (the order the worker records); with clipping (1.0) the same runs take
the step's own path (no overlapped step) and agree too.
--bf16 (bench/rows.toml's GPU row offload-oracle; it runs on a CPU too): one rank in bf16,
stages 1, 2 and 3 and ratio 0.5, which on a GPU goes through the pinned staging slots and the copy
stream; the run without offload steps on the device (its fused Adam), so the two agree only to
bf16's rounding of the 16-bit parameters: losses within 2e-2 relative, weights within 2e-2 of
their largest (bf16's spacing is 7.8e-3; an fp32 difference of one ulp in the master can flip a
rounding, and 8 steps carry it on).
Prints one line per case and `N passed, M failed` last."""
import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # tests/
from dscpp_test_ports import free_port  # noqa: E402

GLOBAL_BATCH = 16


def config(stage, ga, offload, extra=None, optimizer="AdamW", bf16=False, clip=1.0):
    params = {"lr": 1e-2, "weight_decay": 0.01}
    if optimizer == "AdamW":
        params.update(betas=[0.9, 0.999], eps=1e-4)
    cfg = {
        "train_batch_size": GLOBAL_BATCH,
        "gradient_accumulation_steps": ga,
        "gradient_clipping": clip,
        "optimizer": {"type": optimizer, "params": params},
        "zero_optimization": {"stage": stage, "overlap_comm": True, "reduce_bucket_size": 300,
                              "stage3_param_persistence_threshold": 0},
    }
    if bf16:
        cfg["bf16"] = {"enabled": True}
    if offload:
        cfg["zero_optimization"].update(offload)
    if extra:
        cfg["zero_optimization"].update(extra)
    return cfg


def ends(text, n):
    """The first and last n/2 characters: the first error a rank printed, and how the job ended."""
    return text if len(text) <= n else f"{text[:n // 2]}\n[...]\n{text[-n // 2:]}"


def run(cmd, out):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... exited {p.returncode}:\n{p.stdout[-2000:]}{ends(p.stderr, 4000)}")
    with open(out) as f:
        return json.load(f), p.stderr


def rel_err(a, b):
    if len(a) != len(b):
        return float("inf")
    return max(abs(x - y) for x, y in zip(a, b)) / max(max(abs(y) for y in b), 1e-30)


class Runner:
    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp()
        self.count = 0

    def train(self, model, n, cfg, steps, save=None, save_at=None, load=None):
        self.count += 1
        out = os.path.join(self.tmp, f"run{self.count}.json")
        cmd = [self.args.launcher, "--num_gpus", str(n), "--master_port", str(free_port()), self.args.train,
               "--mode", "dscpp", "--model", model, "--config", json.dumps(cfg), "--steps", str(steps),
               "--out", out]
        if save:
            cmd += ["--save", save, "--save-at", str(save_at)]
        if load:
            cmd += ["--load", load]
        return run(cmd, out)


OFFLOADS = {
    "cpu": {"offload_optimizer": {"device": "cpu"}},
    # The same, without clipping: the update overlaps backward (the runs of both sides unclipped).
    "overlap": {"offload_optimizer": {"device": "cpu"}, "sub_group_size": 100},
    # DeepSpeed's first spelling, unpinned staging, and the optimizer stepped in pieces of 50.
    "old": {"cpu_offload": True, "sub_group_size": 50},
    "unpinned": {"offload_optimizer": {"device": "cpu", "pin_memory": False}, "sub_group_size": 64},
    # Partial offload (stage 3): the partition in sub-groups of 64, the first half of them
    # stepped where they are, the rest on the host.
    "ratio": {"offload_optimizer": {"device": "cpu", "ratio": 0.5}, "sub_group_size": 64},
    # The parameters' offload (stage 3): the 16-bit partition on the host, each bucket's chunk
    # up through 2 staging buffers of 4096 elements; alone, and with the optimizer's.
    "param": {"offload_param": {"device": "cpu", "buffer_count": 2, "buffer_size": 4096}},
    "both": {"offload_param": {"device": "cpu", "buffer_count": 2, "buffer_size": 4096},
             "offload_optimizer": {"device": "cpu"}},
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--bf16", action="store_true", help="one rank in bf16 (the GPU run's cases)")
    ap.add_argument("--overlap", action="store_true", help="the update overlapped with backward")
    args = ap.parse_args()
    tol = 2e-2 if args.bf16 else 1e-6
    r = Runner(args)
    if args.full:
        cases = [(m, s, ga, n, "cpu", "AdamW") for m, s in (("mlp", 1), ("mlp", 2), ("gpt", 3))
                 for ga, n in itertools.product([1, 4], [1, 2, 4])]
        cases += [("mlp", s, 1, 2, k, "AdamW") for s in (1, 2) for k in ("old", "unpinned")]
        cases += [("gpt", 3, 4, 2, "old", "AdamW"), ("gpt", 2, 1, 2, "cpu", "AdamW")]
        cases += [("mlp", 2, 1, 2, "cpu", o) for o in ("Adam", "Adagrad", "Lion")]
        cases += [("transformer", s, 4, 2, "cpu", "AdamW") for s in (1, 2, 3)]
        cases += [(m, 3, ga, n, k, "AdamW") for m in ("mlp", "gpt") for k in ("ratio", "param")
                  for ga, n in itertools.product([1, 4], [1, 2, 4])]
        cases += [("gpt", 3, ga, 2, "both", "AdamW") for ga in (1, 4)]
    elif args.overlap:
        cases = [("mlp", 1, 1, 2, "overlap", "AdamW"), ("mlp", 2, 4, 2, "overlap", "AdamW"),
                 ("gpt", 2, 1, 1, "overlap", "AdamW"), ("mlp", 1, 4, 1, "overlap", "AdamW"),
                 ("mlp", 2, 1, 2, "cpu", "AdamW")]
    elif args.bf16:
        cases = [("mlp", 1, 1, 1, "cpu", "AdamW"), ("mlp", 2, 1, 1, "cpu", "AdamW"),
                 ("gpt", 2, 1, 1, "cpu", "AdamW"), ("gpt", 3, 1, 1, "cpu", "AdamW"),
                 ("gpt", 3, 1, 1, "ratio", "AdamW")]
    else:
        cases = [("mlp", 1, 4, 2, "old", "AdamW"), ("mlp", 2, 1, 4, "cpu", "AdamW"),
                 ("mlp", 2, 4, 1, "unpinned", "AdamW"), ("gpt", 3, 1, 2, "cpu", "AdamW"),
                 ("mlp", 2, 1, 2, "cpu", "Lion"), ("gpt", 3, 4, 2, "ratio", "AdamW"),
                 ("gpt", 3, 1, 2, "both", "AdamW")]
    passed = failed = 0

    def report(ok, name, msg):
        nonlocal passed, failed
        print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)
        passed += ok
        failed += not ok

    early_updates = []
    for model, stage, ga, n, kind, opt in cases:
        name = f"{model} stage={stage} accumulation={ga} ranks={n} offload={kind} optimizer={opt}" + \
            (" bf16" if args.bf16 else "")
        if args.only not in name:
            continue
        try:
            clip = 0.0 if kind == "overlap" else 1.0
            base, _ = r.train(model, n, config(stage, ga, None, optimizer=opt, bf16=args.bf16, clip=clip),
                              args.steps)
            got, log = r.train(model, n, config(stage, ga, OFFLOADS[kind], optimizer=opt, bf16=args.bf16,
                                                clip=clip), args.steps)
            le, pe = rel_err(got["losses"], base["losses"]), rel_err(got["params"], base["params"])
            problems = []
            if le > tol:
                problems.append(f"losses differ ({le:.2e})")
            if pe > tol:
                problems.append(f"weights differ ({pe:.2e})")
            if kind == "overlap":
                # Every step whose backward follows the first (at accumulation 1 the first
                # step's backward is the one that lays the buffers out).
                want = args.steps - (1 if ga == 1 else 0)
                if got["overlapped_steps"] < want:
                    problems.append(f"{got['overlapped_steps']} overlapped steps of {args.steps}")
                # Whether a bucket's update begins before a tiny model's backward ends is the
                # scheduler's call on a loaded machine: asserted over all overlap cases below.
                early_updates.append(got["updates_during_backward"])
            elif stage <= 2 and got.get("overlapped_steps", 0) != 0:
                problems.append(f"{got['overlapped_steps']} overlapped steps with clipping")
            if kind in ("param", "both"):
                po = OFFLOADS[kind]["offload_param"]
                if got["partition16_device"] != "cpu" or got["staged_gathers"] <= 0 or \
                        not 0 < got["staging_buffers"] <= po["buffer_count"]:
                    problems.append(f"parameters not offloaded: partition on {got['partition16_device']}, "
                                    f"{got['staged_gathers']} staged gathers, {got['staging_buffers']} buffers")
                if got["partition16"] != base["partition16"]:
                    problems.append(f"16-bit partition {got['partition16']} vs {base['partition16']}")
            if kind == "param":
                pass  # the optimizer stays where it was
            elif not got.get("offloaded") or got["master_device"] != "cpu" or got["state_device"] != "cpu":
                problems.append(f"not offloaded ({got.get('offloaded')}, master on {got.get('master_device')})")
            if "not implemented by the engine yet" in log and "offload_optimizer" in log:
                problems.append("the engine announced offload as ignored")
            # Partial offload: the host's optimizer holds only its share of the state (the
            # rest is the device optimizer's).
            if kind == "ratio":
                if not 0 < got["state_numel"] < base["state_numel"]:
                    problems.append(f"host state {got['state_numel']} of {base['state_numel']}: not a share")
            elif got["state_numel"] != base["state_numel"] or (
                    kind != "param" and got["partition"] != got["total"] // n):
                problems.append(f"state {got['state_numel']} vs {base['state_numel']}, partition {got['partition']}")
            extra = f", {got.get('updates_during_backward', 0)} updates begun during backward" \
                if kind == "overlap" else ""
            report(not problems, name, f"losses {le:.1e}, weights {pe:.1e}{extra}" if not problems
                   else "; ".join(problems))
        except Exception as e:  # noqa: BLE001
            report(False, name, str(e))

    if early_updates:
        report(sum(early_updates) > 0, "overlap: bucket updates begun during backward",
               f"{sum(early_updates)} over {len(early_updates)} runs")

    # Checkpoints: save after step 3 of an offloaded run (and of one without), resume.
    ck_cases = [("mlp", 2, 1, 2, "cpu"), ("gpt", 3, 1, 2, "ratio")]
    if args.bf16 or args.overlap:
        ck_cases = []
    if args.full:
        ck_cases += [("mlp", 1, 4, 2, "cpu"), ("gpt", 3, 1, 2, "cpu"), ("mlp", 3, 4, 2, "ratio"),
                     ("gpt", 3, 1, 2, "both")]
    for model, stage, ga, n, kind in ck_cases:
        name = f"checkpoint {model} stage={stage} accumulation={ga} ranks={n} offload={kind}"
        if args.only not in name:
            continue
        try:
            off_cfg = config(stage, ga, OFFLOADS[kind])
            plain_cfg = config(stage, ga, None)
            off_dir = os.path.join(r.tmp, f"ck_off_{model}_{stage}_{kind}_{ga}")
            plain_dir = os.path.join(r.tmp, f"ck_plain_{model}_{stage}_{kind}_{ga}")
            off_full, _ = r.train(model, n, off_cfg, args.steps, save=off_dir, save_at=3)
            plain_full, _ = r.train(model, n, plain_cfg, args.steps, save=plain_dir, save_at=3)
            problems = []
            resumed, _ = r.train(model, n, off_cfg, args.steps, load=off_dir)
            if resumed["params"] != off_full["params"] or resumed["losses"] != off_full["losses"][3:]:
                problems.append("offloaded resume is not bit-exact")
            into_plain, _ = r.train(model, n, plain_cfg, args.steps, load=off_dir)
            e1 = rel_err(into_plain["params"], off_full["params"])
            into_off, _ = r.train(model, n, off_cfg, args.steps, load=plain_dir)
            e2 = rel_err(into_off["params"], plain_full["params"])
            if e1 > 1e-6:
                problems.append(f"offloaded checkpoint into a run without offload: weights {e1:.2e}")
            if e2 > 1e-6:
                problems.append(f"checkpoint without offload into an offloaded run: weights {e2:.2e}")
            report(not problems, name, f"resume bit-exact, across {e1:.1e} / {e2:.1e}" if not problems
                   else "; ".join(problems))
        except Exception as e:  # noqa: BLE001
            report(False, name, str(e))
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
