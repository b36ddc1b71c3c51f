#!/usr/bin/env python3
"""The ZeRO-Offload rows of bench/offload_rows.sh as a markdown table.

    python3 bench/offload_table.py LOGDIR

Each <row>.log has the header "## offload_rows row=R model=M ..." and gpt_table.sh's trailer;
dscpp's rows the last "[train_gpt] step" line (tokens/s per rank, peak GPU memory allocated),
DeepSpeed's its "deepspeed stage=..." line, both bench/peak_rss.py's "peak_rss_gib=". Host bytes
per parameter: the peak resident memory over the model's parameters (Psi as gpt_table.py counts
them), which includes the process's own (LibTorch, CUDA's context, the batch) and any whole
model built on the host before it was moved. The oracle row: its PASS/FAIL lines. Then each row's
step breakdown (wall_clock_breakdown in the ds_config): the last step's timer lines of both
systems, dscpp's "[dscpp] time (ms)" and "[dscpp] zero phases (ms)" (zero/phase_times.h), and
DeepSpeed's "time (ms) | ..." lines (its engine's and its ZeRO optimizer's timers)."""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_table import last_error, num_parameters, parse_deepspeed, parse_dscpp, trailer  # noqa: E402

ORDER = ["d2x9", "d2off9", "d2x83", "d2off83", "d2off46", "d2off46o", "ds2off46", "d3both"]
WHAT = {"d2x9": "dscpp ZeRO-2, no offload", "d2off9": "dscpp ZeRO-2 + offload_optimizer cpu",
        "d2x83": "dscpp ZeRO-2, no offload", "d2off83": "dscpp ZeRO-2 + offload_optimizer cpu",
        "d2off46": "dscpp ZeRO-2 + offload_optimizer cpu",
        "d2off46o": "dscpp ZeRO-2 + offload_optimizer cpu, no clipping: update overlaps backward",
        "ds2off46": "DeepSpeed ZeRO-2 + offload_optimizer cpu",
        "d3both": "dscpp ZeRO-3 + offload_optimizer + offload_param cpu"}
GIB = float(2**30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("logdir")
    args = ap.parse_args()
    logs = {}
    for name in os.listdir(args.logdir):
        if name.endswith(".log"):
            with open(os.path.join(args.logdir, name)) as f:
                logs[name[:-4]] = f.read()
    if "oracle" in logs:
        t = logs["oracle"]
        print("## bf16 offload == no offload, one GPU (offload_oracle.py --bf16)\n")
        for line in re.findall(r"^(?:PASS|FAIL) .*$|^\d+ passed, \d+ failed$", t, re.M):
            print(f"    {line}")
        rc, wall = trailer(t)
        print(f"\n(rc {rc}, {wall} s)\n")
    print("| row | run | parameters | tokens/s per GPU | TFLOP/s per GPU | peak GPU GiB | peak host RSS GiB "
          "| host B/param | / DeepSpeed | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    tps = {}
    rows = []
    for row in ORDER:
        if row not in logs:
            continue
        t = logs[row]
        m = re.search(r"^## offload_rows row=\S+ model=(\S+)", t, re.M)
        psi = None
        if m:
            with open(m.group(1)) as f:
                psi = num_parameters(json.load(f))
        r = parse_deepspeed(t) if row.startswith("ds") else parse_dscpp(t)
        rss = re.findall(r"peak_rss_gib=([\d.]+)", t)
        rc, wall = trailer(t)
        rows.append((row, t, psi, r, float(rss[-1]) if rss else None, rc, wall))
        if r:
            tps[row] = r["tps"]
    for row, t, psi, r, rss, rc, wall in rows:
        p = f"{psi / 1e9:.2f} B" if psi else "?"
        if not r:
            why = "out of GPU memory" if re.search(r"out of memory|OutOfMemory", t) else last_error(t)
            print(f"| {row} | {WHAT[row]} | {p} | failed (rc {rc}): {why} | | | "
                  f"{'' if rss is None else f'{rss:.1f}'} | | | {wall} |")
            continue
        flops = r["tps"] * (6 * psi) / 1e12 if psi else float("nan")
        per = f"{rss * GIB / psi:.1f}" if rss is not None and psi else ""
        ratio = ""
        if row in ("d2off46", "d2off46o") and "ds2off46" in tps:
            ratio = f"{r['tps'] / tps['ds2off46']:.2f}x"
        print(f"| {row} | {WHAT[row]} | {p} | {r['tps']:.0f} | {flops:.1f} | {r['peak_gib']:.2f} | "
              f"{'' if rss is None else f'{rss:.1f}'} | {per} | {ratio} | {wall} |")
    print("\nTFLOP/s here: 6 Psi per token only (no attention term). Host B/param: peak RSS / Psi, "
          "everything the process holds.")
    breakdowns = [(row, last_timer_lines(t)) for row, t, *_ in rows]
    if any(lines for _, lines in breakdowns):
        print("\n## Step breakdown (wall_clock_breakdown: each row's last step, ms)\n")
        for row, lines in breakdowns:
            for line in lines:
                print(f"    {row}: {line}")


def last_timer_lines(text):
    """The last line of each kind of timer line: dscpp's two, and each of DeepSpeed's (its
    log prefix dropped), keyed by their first timer's name."""
    last = {}
    for line in text.splitlines():
        m = re.search(r"(\[dscpp\] (?:time|zero phases) \(ms\).*|time \(ms\) \|.*)$", line)
        if not m:
            continue
        body = m.group(1).strip()
        key = re.sub(r"[\d.]+", "", body.split("|")[1] if "|" in body else body)
        last[body.split("|")[0] + key] = body
    return list(last.values())


if __name__ == "__main__":
    main()
