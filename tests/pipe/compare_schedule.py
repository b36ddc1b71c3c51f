#!/usr/bin/env python3
"""Our plain schedules against DeepSpeed's own TrainSchedule and InferenceSchedule.

    compare_schedule.py --cli PATH/TO/schedule_cli

For p in 1..8 and m in 1..16, every stage, every step:
- train: the instruction names in DeepSpeed's order, step for step; the buffer ids equal
  DeepSpeed's on the first and last stage (on a middle stage we use one slot more than its
  num_pipe_buffers, docs/pipeline.md), and the buffer of each micro-batch is ours mod ours.
- inference: the same instructions and buffer ids per step; DeepSpeed lists LoadMicroBatch
  before the step's transfers, ours after them (schedule.h: a step's transfers come first).
Exits 1 on any difference.
"""
import argparse
import json
import os
import re
import subprocess
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
from deepspeed.runtime.pipe.schedule import TrainSchedule, InferenceSchedule  # noqa: E402

PARSE = re.compile(r"(\w+)\((?:micro_batch=(\d+), chunk=0, buffer=(\d+))?\)")


def ours_parsed(cmd):
    name, mb, buf = PARSE.fullmatch(cmd).groups()
    return name, None if buf is None else int(buf), None if mb is None else int(mb)


def theirs_parsed(cmd):
    return type(cmd).__name__, getattr(cmd, "buffer_id", None) if hasattr(cmd, "buffer_id") else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    args = ap.parse_args()
    cases = [(kind, p, m) for kind in ("train", "inference") for p in range(1, 9) for m in range(1, 17)]
    out = subprocess.run([args.cli], input="".join(f"{k} {p} {m}\n" for k, p, m in cases), capture_output=True,
                         text=True, check=True).stdout.splitlines()
    failures = 0
    for (kind, p, m), line in zip(cases, out):
        ours = json.loads(line)
        for s in range(p):
            sched = (TrainSchedule if kind == "train" else InferenceSchedule)(micro_batches=m, stages=p, stage_id=s)
            theirs = [[theirs_parsed(c) for c in step] for step in sched.steps()]
            mine = [[ours_parsed(c) for c in step] for step in ours[s]]
            middle = 0 < s < p - 1
            ok = len(theirs) == len(mine)
            for t_step, o_step in zip(theirs, mine):
                if not ok:
                    break
                if kind == "inference":  # same instructions; our load after the transfers
                    key = lambda c: (c[0], c[1])  # noqa: E731
                    ok = sorted(map(key, t_step)) == sorted(map(key, o_step))
                    continue
                ok = [c[0] for c in t_step] == [c[0] for c in o_step]
                if ok and not middle:
                    ok = [c[1] for c in t_step] == [c[1] for c in o_step]
                if ok:
                    slots = max(2, min(p - s + (1 if middle else 0), m))
                    ok = all(c[1] is None or c[1] == c[2] % slots for c in o_step)
            if not ok:
                failures += 1
                print(f"FAIL {kind} p={p} m={m} stage={s}\n  deepspeed: {theirs}\n  dscpp:     {mine}")
    print(f"{len(cases) - failures} of {len(cases)} schedules agree with DeepSpeed's")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
