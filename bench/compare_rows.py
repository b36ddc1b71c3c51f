#!/usr/bin/env python3
"""The same dscpp rows of two source trees, measured in one call by scripts/gpu_run.sh's
GPU_BASELINE: tokens/s per rank and peak memory of each, and this tree's change against the
baseline's.

    python3 bench/compare_rows.py NEW_LOGDIR BASE_LOGDIR ROW [ROW ...]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_table import parse_dscpp, trailer  # noqa: E402


def row(logdir, name):
    path = os.path.join(logdir, name + ".log")
    if not os.path.exists(path):
        return None, "not run"
    with open(path, errors="replace") as f:
        text = f.read()
    r = parse_dscpp(text)
    rc, _ = trailer(text)
    return r, ("" if r else f"no step line (rc={rc})")


def main():
    new_dir, base_dir, rows = sys.argv[1], sys.argv[2], sys.argv[3:]
    print("| row | tokens/s per rank, this tree | baseline | change | peak GiB, this tree | baseline |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in rows:
        new, why_new = row(new_dir, name)
        base, why_base = row(base_dir, name)
        if new and base:
            change = f"{100.0 * (new['tps'] / base['tps'] - 1.0):+.2f}%"
            print(f"| {name} | {new['tps']:,.0f} | {base['tps']:,.0f} | {change} | "
                  f"{new['peak_gib']:.2f} | {base['peak_gib']:.2f} |")
        else:
            print(f"| {name} | {why_new or round(new['tps'])} | {why_base or round(base['tps'])} | - | - | - |")


if __name__ == "__main__":
    main()
