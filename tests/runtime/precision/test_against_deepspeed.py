"""Drives DeepSpeed's loss scaler and ours (through loss_scaler_trace) over the same random
overflow sequences and compares the scale after every step, where (if anywhere) each raises at
the minimum scale, and the final scaler state.

DeepSpeed's scaler is built as its ZeRO optimizers build it: the fp16 section read by
get_float16_config, then CreateLossScaler(dtype, loss_scale, loss_scale == 0,
dynamic_loss_scale_args()).

usage: test_against_deepspeed.py --cli PATH/TO/loss_scaler_trace   (env DS_ACCELERATOR=cpu)
"""
import argparse
import json
import logging
import random
import subprocess
import sys
import types

import torch
import deepspeed.runtime.fp16.loss_scaler as ds_loss_scaler
from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
from deepspeed.runtime.precision_config import get_float16_config
from deepspeed.utils import logger as ds_logger

# update_scale asks dist.get_rank() only to decide whether to log; no process group is needed.
ds_loss_scaler.dist = types.SimpleNamespace(get_rank=lambda: 0)
# The static scaler logs a warning on every overflow.
ds_logger.setLevel(logging.ERROR)

FP16 = [
    {"enabled": True},  # DeepSpeed's defaults: 2^16, window 1000, hysteresis 2, min 1
    {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 10, "hysteresis": 2},
    {"enabled": True, "initial_scale_power": 4, "loss_scale_window": 3, "hysteresis": 1,
     "min_loss_scale": 1},
    {"enabled": True, "initial_scale_power": 6, "loss_scale_window": 5, "hysteresis": 3,
     "consecutive_hysteresis": True},
    {"enabled": True, "initial_scale_power": 5, "loss_scale_window": 7, "hysteresis": 4,
     "consecutive_hysteresis": False, "min_loss_scale": 3},
    {"enabled": True, "initial_scale_power": 3, "loss_scale_window": 1, "hysteresis": 2,
     "min_loss_scale": 2, "consecutive_hysteresis": True},
    {"enabled": True, "initial_scale_power": 0, "loss_scale_window": 4, "hysteresis": 1,
     "min_loss_scale": 4},  # starts below the minimum
    {"enabled": True, "initial_scale_power": 32, "loss_scale_window": 2, "hysteresis": 5,
     "min_loss_scale": 1024},
    {"enabled": True, "loss_scale": 128},  # static
    {"enabled": False},  # no fp16: a static scale of 1
]
SEEDS = [0, 1, 2]
OVERFLOW_RATES = [0.02, 0.2, 0.6]
STEPS = 400


def deepspeed_trace(fp16, overflows):
    cfg = get_float16_config({"fp16": fp16})
    dtype = torch.half if cfg.enabled else torch.float32
    scaler = CreateLossScaler(dtype=dtype,
                              static_loss_scale=cfg.loss_scale,
                              dynamic_scaling=cfg.loss_scale == 0,
                              dynamic_loss_args=cfg.dynamic_loss_scale_args())
    scales, error = [], None
    for i, overflow in enumerate(overflows):
        try:
            scaler.update_scale(overflow)
        except Exception as e:  # DeepSpeed raises a bare Exception at the minimum scale
            error = {"step": i, "message": str(e)}
            break
        scales.append(float(scaler.cur_scale))
    return scales, error, scaler


def our_traces(cli, fp16, sequences):
    config = json.dumps({"train_batch_size": 1, "fp16": fp16})
    seqs = ["".join("1" if o else "0" for o in overflows) for overflows in sequences]
    out = subprocess.run([cli, config, *seqs], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def compare(fp16, overflows, ours):
    """Returns a list of disagreements (empty when they agree)."""
    ds_scales, ds_error, scaler = deepspeed_trace(fp16, overflows)
    problems = []
    for i, (a, b) in enumerate(zip(ds_scales, ours["scales"])):
        if a != b:
            problems.append(f"step {i}: deepspeed {a} ours {b}")
            break
    if len(ds_scales) != len(ours["scales"]):
        problems.append(f"steps applied: deepspeed {len(ds_scales)} ours {len(ours['scales'])}")
    if ds_error != ours["error"]:
        problems.append(f"error: deepspeed {ds_error} ours {ours['error']}")
    # Every field we checkpoint must match the attribute DeepSpeed pickles.
    ds_fields = {k: v for k, v in vars(scaler).items() if k != "dtype"}
    for key, value in ours["state"].items():
        if key not in ds_fields or ds_fields[key] != value:
            problems.append(f"state {key}: deepspeed {ds_fields.get(key, '<absent>')} ours {value}")
    for key in ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis"):
        if key in ds_fields and key not in ours["state"]:
            problems.append(f"state lacks {key}")
    return problems


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True)
    args = parser.parse_args()
    passed = failed = 0
    for n, fp16 in enumerate(FP16):
        cases = []
        for seed in SEEDS:
            for rate in OVERFLOW_RATES:
                rng = random.Random(seed * 1000 + n)
                # Bursts as well as isolated overflows: a burst repeats the last verdict.
                overflows, last = [], False
                for _ in range(STEPS):
                    last = last if rng.random() < 0.3 else rng.random() < rate
                    overflows.append(last)
                cases.append((f"config {n} {json.dumps(fp16)} seed {seed} rate {rate}", overflows))
        ours = our_traces(args.cli, fp16, [overflows for _, overflows in cases])
        assert len(ours) == len(cases), "loss_scaler_trace printed the wrong number of lines"
        for (name, overflows), our in zip(cases, ours):
            problems = compare(fp16, overflows, our)
            if problems:
                failed += 1
                print(f"FAIL {name}: " + "; ".join(problems))
            else:
                passed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
