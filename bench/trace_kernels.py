#!/usr/bin/env python3
"""GPU time by kernel in a Chrome trace (train_gpt --profile-out, or torch.profiler's export).

  python3 bench/trace_kernels.py TRACE.json [TRACE2.json] [--top N]

Sums the duration of the trace's GPU events (kernels, copies, sets) by name and prints the
largest, each with its count, its total in ms and its share of all GPU time; the GPU time's
span from first start to last end beside the sum shows how much the GPU stood idle. With a
second trace, a column per trace and the difference, so that what a change added shows
first.
"""

import argparse
import collections
import json
import sys

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def short(name, width=90):
    # Template arguments make CUTLASS's and ATen's names long; their head names the kernel.
    return name if len(name) <= width else name[: width - 3] + "..."


def gpu_time(path):
    """{kernel name: [count, total us]}, the sum of all, and the span from first to last."""
    with open(path) as f:
        events = json.load(f)
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    by_name = collections.defaultdict(lambda: [0, 0.0])
    start, end, total = None, None, 0.0
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in GPU_CATEGORIES:
            continue
        dur, ts = float(e.get("dur", 0.0)), float(e["ts"])
        entry = by_name[e.get("name", "?")]
        entry[0] += 1
        entry[1] += dur
        total += dur
        start = ts if start is None else min(start, ts)
        end = ts + dur if end is None else max(end, ts + dur)
    if start is None:
        sys.exit(f"trace_kernels: {path}: no GPU events (was the trace taken on a GPU, with CUDA activity?)")
    return by_name, total, end - start


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", metavar="TRACE")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    if len(a.traces) > 2:
        ap.error("one trace, or two to compare")
    runs = [gpu_time(p) for p in a.traces]
    for path, (_, total, span) in zip(a.traces, runs):
        print(f"{path}: GPU busy {total / 1e3:.1f} ms in a span of {span / 1e3:.1f} ms "
              f"({100 * total / span:.0f}% busy)")
    if len(runs) == 1:
        by_name, total, _ = runs[0]
        print(f"{'count':>6} {'ms':>9} {'share':>6}  kernel")
        for name, (n, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[: a.top]:
            print(f"{n:6d} {us / 1e3:9.2f} {100 * us / total:5.1f}%  {short(name)}")
        return
    (b, _, _), (c, _, _) = runs
    names = set(b) | set(c)
    rows = [(name, b.get(name, [0, 0.0]), c.get(name, [0, 0.0])) for name in names]
    rows.sort(key=lambda r: -abs(r[2][1] - r[1][1]))
    print(f"{'ms (1)':>9} {'ms (2)':>9} {'2 - 1':>9} {'n (1)':>6} {'n (2)':>6}  kernel")
    for name, (n1, u1), (n2, u2) in rows[: a.top]:
        print(f"{u1 / 1e3:9.2f} {u2 / 1e3:9.2f} {(u2 - u1) / 1e3:+9.2f} {n1:6d} {n2:6d}  {short(name)}")


if __name__ == "__main__":
    main()
