#!/usr/bin/env python3
"""Loss curves from train_gpt logs (every step's line: a row with log_interval = 1).

  python3 bench/plot_curves.py --out curves.png LOG [LOG ...] [--names A B ...]

Reads each log's "step N/M | loss X" lines, prints the losses every 50 steps side by side and
each run's last loss against the first log's (the reference: bf16, AdamW), as a relative gap,
and draws the curves (a running mean over --smooth steps beside the raw losses) into --out.
The PNG needs matplotlib (`pip install matplotlib`); without it the table is still printed.
"""
import argparse
import os
import re
import sys

LINE = re.compile(r"step (\d+)/\d+ \| loss ([-+0-9.eEnaif]+)")


def losses(path):
    out = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.search(line)
            if m:
                out[int(m.group(1))] = float(m.group(2))
    return out


def running_mean(values, width):
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > width:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--names", nargs="*", help="one per log (default: the log's file name)")
    ap.add_argument("--out", help="the PNG to write")
    ap.add_argument("--smooth", type=int, default=20, help="running mean width in steps")
    ap.add_argument("--title", default="train_gpt loss")
    a = ap.parse_args()
    names = a.names or [os.path.splitext(os.path.basename(p))[0] for p in a.logs]
    if len(names) != len(a.logs):
        sys.exit("plot_curves: --names needs one name per log")
    runs = [losses(p) for p in a.logs]
    for name, run, path in zip(names, runs, a.logs):
        if not run:
            sys.exit(f"plot_curves: {path} has no 'step N/M | loss X' line ({name})")
    last = min(max(r) for r in runs)
    marks = sorted({s for s in range(50, last + 1, 50)} | {1, last})
    print("| step | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for s in marks:
        print(f"| {s} | " + " | ".join(f"{r[s]:.4f}" if s in r else "" for r in runs) + " |")
    ref = runs[0]
    for name, run in zip(names[1:], runs[1:]):
        gap = (run[last] - ref[last]) / ref[last]
        # (one step's loss is one batch's: the means of the last steps are the steadier figure)
        run_mean = running_mean([run[s] for s in sorted(run) if s <= last], a.smooth)[-1]
        ref_mean = running_mean([ref[s] for s in sorted(ref) if s <= last], a.smooth)[-1]
        mean_gap = (run_mean - ref_mean) / ref_mean
        print(f"{name}: step {last} loss {run[last]:.4f} against {names[0]}'s {ref[last]:.4f}: {gap:+.2%} "
              f"(the last {a.smooth} steps' means: {mean_gap:+.2%})")
    if not a.out:
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_curves: the PNG needs matplotlib (pip install matplotlib); the table above stands")
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for name, run in zip(names, runs):
        steps = sorted(run)
        values = [run[s] for s in steps]
        line, = ax.plot(steps, values, alpha=0.25, linewidth=0.8)
        ax.plot(steps, running_mean(values, a.smooth), color=line.get_color(), linewidth=1.6,
                label=f"{name} (mean of {a.smooth})")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(a.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
