#!/usr/bin/env python3
"""Where a profiled training step's time goes, from a Chrome trace (Kineto's, as train_gpt's
--profile-step or torch.profiler write it; plain JSON or gzip).

    python3 bench/trace_summary.py trace.json[.gz] [--top 25] [--annotation train_gpt::step]

Per GPU device in the trace: kernel (and memcpy/memset) time grouped by category (GEMM,
attention, NCCL, optimizer, LayerNorm, GELU/elementwise, cross-entropy/softmax,
copies/casts, other), the top kernels by total time, the step's wall span (the
--annotation user scope on the CPU, and first-to-last GPU activity), the idle time of the
compute stream (the stream with the most non-NCCL kernel time) within the GPU span, and how
much of the NCCL kernels' time overlaps compute kernels on any other stream. NCCL kernel
time includes waiting for the peer, so "NCCL exposed" is an upper bound of what
communication costs the step.

A trace without GPU activity (the CPU build) is summarised from its CPU operators instead:
self time (an operator's duration less that of the operators nested in it on its thread),
in the same categories by operator name, so the parser can be exercised without a GPU."""
import argparse
import bisect
import collections
import gzip
import json
import re

# First match wins: NCCL before anything else (its names hold "Reduce", "Copy"...), attention
# before GEMM (FlashAttention-3's kernels are cutlass kernels), GEMM before elementwise
# ("aten::addmm" holds "aten::add"), copies before elementwise (PyTorch's copy and cast
# kernels are instances of its elementwise kernel templates).
CATEGORIES = [
    ("NCCL", r"nccl|c10d::|gloo|all_reduce|allreduce|reduce_scatter|all_gather|allgather|broadcast"),
    ("attention/flash", r"flash|fmha|attention|attn|sdpa|_efficient_attention|cudnn.*mha"),
    ("optimizer (Adam)", r"adam|multi_tensor_apply|_foreach|optimizer|clip_grad"),
    ("LayerNorm", r"layer_?norm|layernorm|LayerNorm"),
    ("cross-entropy/softmax", r"softmax|cross_entropy|nll_?loss|cunn_SoftMax|logsumexp"),
    ("GEMM", r"gemm|nvjet|xmma|cutlass|cublas|wgmma|matmul|aten::mm\b|aten::addmm|aten::bmm|aten::linear"
             r"|aten::baddbmm|sm90_|sm80_|ampere_|hopper_"),
    ("copies/casts", r"memcpy|memset|copy|cast|_to_copy|aten::to\b|aten::fill_|aten::zero_|fill|"
                     r"CatArrayBatched|aten::cat"),
    ("GELU/elementwise", r"gelu|elementwise|triton_poi|aten::add|aten::mul|aten::div|aten::sub|pointwise"),
]
DISPLAY = ["GEMM", "attention/flash", "NCCL", "optimizer (Adam)", "LayerNorm", "GELU/elementwise",
           "cross-entropy/softmax", "copies/casts", "other"]
_COMPILED = [(name, re.compile(rx, re.I)) for name, rx in CATEGORIES]
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}


def category(name, cat=""):
    if cat.lower() in ("gpu_memcpy", "memcpy", "gpu_memset", "memset"):
        return "copies/casts"
    for label, rx in _COMPILED:
        if rx.search(name):
            return label
    return "other"


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        # Tolerate a trailing comma before a closing bracket, which Chrome accepts and JSON not.
        data = json.loads(re.sub(r",\s*([\]}])", r"\1", text))
    return data["traceEvents"] if isinstance(data, dict) else data


def merged(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def union_length(intervals):
    return sum(e - s for s, e in merged(intervals))


def overlap_with(intervals, merged_other):
    """Total length of `intervals` covered by the merged, sorted intervals `merged_other`."""
    starts = [m[0] for m in merged_other]
    total = 0.0
    for s, e in intervals:
        i = max(bisect.bisect_right(starts, s) - 1, 0)
        while i < len(merged_other) and merged_other[i][0] < e:
            lo, hi = max(s, merged_other[i][0]), min(e, merged_other[i][1])
            if hi > lo:
                total += hi - lo
            i += 1
    return total


def cpu_self_times(events):
    """(name, self duration) of every complete CPU operator, nesting resolved per thread."""
    by_thread = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "Operator", "user_annotation", "python_function"):
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    out = []
    for evs in by_thread.values():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        stack = []  # [end, event, children time]
        for e in evs:
            ts, dur = float(e["ts"]), float(e.get("dur", 0))
            while stack and stack[-1][0] <= ts:
                _, ev, child = stack.pop()
                out.append((ev, float(ev.get("dur", 0)) - child))
            if stack:
                stack[-1][2] += dur
            stack.append([ts + dur, e, 0.0])
        while stack:
            _, ev, child = stack.pop()
            out.append((ev, float(ev.get("dur", 0)) - child))
    # User scopes (train_gpt::forward, ...) only carry their ops' time: leave their self time out.
    return [(ev["name"], d) for ev, d in out if ev.get("cat") != "user_annotation"]


def print_categories(items, total, unit_label):
    by_cat = collections.Counter()
    for name, dur, cat in items:
        by_cat[cat] += dur
    print(f"\n| category | {unit_label} ms | share |")
    print("| --- | --- | --- |")
    for label in DISPLAY:
        if by_cat[label]:
            print(f"| {label} | {by_cat[label] / 1e3:.3f} | {100 * by_cat[label] / total:.1f}% |")
    print(f"| all | {total / 1e3:.3f} | 100% |")


def print_top(items, total, top, unit_label):
    agg = collections.defaultdict(lambda: [0, 0.0, ""])
    for name, dur, cat in items:
        a = agg[name]
        a[0] += 1
        a[1] += dur
        a[2] = cat
    print(f"\nTop {top} by total {unit_label} time:\n")
    print("| # | name | category | calls | total ms | mean us | share |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for i, (name, (n, t, cat)) in enumerate(sorted(agg.items(), key=lambda kv: -kv[1][1])[:top], 1):
        short = name if len(name) <= 110 else name[:107] + "..."
        short = short.replace("|", "/")
        print(f"| {i} | `{short}` | {cat} | {n} | {t / 1e3:.3f} | {t / n:.1f} | {100 * t / total:.1f}% |")


def annotation_spans(events, name):
    return [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
            if e.get("ph") == "X" and e.get("name", "").startswith(name) and e.get("cat") in
            ("user_annotation", "cpu_op", "python_function")]


def launch_times(events):
    """The CPU time of each kernel launch, by correlation id (what ties a GPU kernel to the
    CPU scope that launched it)."""
    return {e["args"]["correlation"]: float(e["ts"]) for e in events
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}


def phase_report(events, evs, name, gpu_span):
    """The GPU work launched inside a CPU scope (by the launch's correlation id): from the
    start of its first kernel to the end of its last, the time that phase adds to the step
    (its kernels queue behind the previous phase's on the compute stream)."""
    spans = annotation_spans(events, name)
    if not spans:
        return
    launches = launch_times(events)

    def inside(e, within):
        t = launches.get(e.get("args", {}).get("correlation"))
        return t is not None and any(s <= t <= u for s, u in within)
    for n, span in enumerate(sorted(spans), 1):
        mine = [e for e in evs if inside(e, [span])]
        if not mine:
            print(f"- `{name}`: no GPU work found by correlation")
            continue
        start = min(float(e["ts"]) for e in mine)
        end = max(float(e["ts"]) + float(e.get("dur", 0)) for e in mine)
        by_cat = collections.defaultdict(float)
        for e in mine:
            by_cat[category(e["name"], e.get("cat", ""))] += float(e.get("dur", 0))
        parts = ", ".join(f"{c} {d / 1e3:.3f} ms" for c, d in sorted(by_cat.items(), key=lambda kv: -kv[1]))
        which = f" ({n} of {len(spans)})" if len(spans) > 1 else ""
        print(f"- `{name}`{which}'s GPU work: {len(mine)} kernels/copies in a window of {(end - start) / 1e3:.3f} ms "
              f"({100 * (end - start) / gpu_span:.1f}% of the GPU span); kernel time by category: {parts}")


def exposed_report(events, evs, compute_stream):
    """With two or more consecutive steps in the trace: what each optimizer step costs the
    compute stream. From the backward's last compute kernel to the next forward's first, plus
    the time the next forward's compute stream sits idle while this step's all-gathers still
    run (dscpp_deferred_allgather leaves them to overlap that forward; idle there is waiting
    for a layer's parameters, or the host). Against the step's period, next forward start to
    this forward start."""
    phases = {p: sorted(annotation_spans(events, "train_gpt::" + p)) for p in ("forward", "backward", "optimizer")}
    n = min(len(v) for v in phases.values())
    if n < 2:
        return
    launches = launch_times(events)

    def launched_in(span):
        s, u = span
        return [e for e in evs if s <= launches.get(e.get("args", {}).get("correlation"), -1.0) <= u]

    def is_nccl(e):
        return category(e["name"], e.get("cat", "")) == "NCCL"

    def stream(e):
        return e.get("args", {}).get("stream", e.get("tid"))

    compute = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in evs
                     if not is_nccl(e) and stream(e) == compute_stream)
    merged_compute = merged(compute)
    first_fwd = []
    for i in range(n):
        k = [float(e["ts"]) for e in launched_in(phases["forward"][i]) if not is_nccl(e)]
        first_fwd.append(min(k) if k else None)
    print("\n## Optimizer steps against the next forward (compute stream)")
    for i in range(n - 1):
        bwd = [float(e["ts"]) + float(e.get("dur", 0)) for e in launched_in(phases["backward"][i]) if not is_nccl(e)]
        opt = launched_in(phases["optimizer"][i])
        ag_end = max((float(e["ts"]) + float(e.get("dur", 0)) for e in opt if is_nccl(e)), default=None)
        f0, f1 = first_fwd[i], first_fwd[i + 1]
        if not bwd or f0 is None or f1 is None:
            continue
        gap = f1 - max(bwd)
        idle = 0.0
        if ag_end is not None and ag_end > f1:
            idle = (ag_end - f1) - overlap_with([(f1, ag_end)], merged_compute)
        period = f1 - f0
        # Before the optimizer's first kernel: backward's last reductions still running.
        tail = max(0.0, min((float(e["ts"]) for e in opt if not is_nccl(e)), default=max(bwd)) - max(bwd))
        own = gap - tail + idle
        print(f"- step {i + 1} of the trace: backward's last compute kernel to the next forward's first "
              f"{gap / 1e3:.3f} ms; the next forward's compute stream idle while this step's all-gathers run "
              f"{idle / 1e3:.3f} ms; exposed {(gap + idle) / 1e3:.3f} ms of a {period / 1e3:.3f} ms step "
              f"({100 * (gap + idle) / period:.1f}%); of it before the optimizer's first kernel (backward's "
              f"last reductions) {tail / 1e3:.3f} ms, from it on {own / 1e3:.3f} ms ({100 * own / period:.1f}%)")


def summarise_gpu(events, gpu, top, annotation):
    by_device = collections.defaultdict(list)
    for e in gpu:
        by_device[e.get("args", {}).get("device", e.get("pid"))].append(e)
    steps = annotation_spans(events, annotation)
    for device, evs in sorted(by_device.items(), key=lambda kv: str(kv[0])):
        items = [(e["name"], float(e.get("dur", 0)), category(e["name"], e.get("cat", ""))) for e in evs]
        total = sum(d for _, d, _ in items)
        print(f"# GPU device {device}: {len(evs)} kernels/copies, {total / 1e3:.3f} ms of GPU time")
        print_categories(items, total, "GPU")
        print_top(items, total, top, "GPU")
        iv = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in evs]
        span0, span1 = min(s for s, _ in iv), max(e for _, e in iv)
        per_stream = collections.defaultdict(list)
        nccl, compute = [], []
        for e, (s, t), (_, _, cat) in zip(evs, iv, items):
            stream = e.get("args", {}).get("stream", e.get("tid"))
            if cat == "NCCL":
                nccl.append((s, t))
            else:
                per_stream[stream].append((s, t))
                compute.append((s, t))
        print("\n## Step")
        for s, t in steps:
            print(f"- CPU span of `{annotation}`: {(t - s) / 1e3:.3f} ms")
        print(f"- GPU span (first to last GPU activity): {(span1 - span0) / 1e3:.3f} ms")
        busy_all = union_length(iv)
        print(f"- GPU busy on any stream: {busy_all / 1e3:.3f} ms; idle on every stream: "
              f"{(span1 - span0 - busy_all) / 1e3:.3f} ms ({100 * (1 - busy_all / (span1 - span0)):.1f}%)")
        if per_stream:
            main, main_iv = max(per_stream.items(), key=lambda kv: sum(t - s for s, t in kv[1]))
            busy = union_length(main_iv)
            print(f"- compute stream {main}: busy {busy / 1e3:.3f} ms, idle {(span1 - span0 - busy) / 1e3:.3f} ms "
                  f"({100 * (1 - busy / (span1 - span0)):.1f}% of the GPU span)")
            others = {k: union_length(v) for k, v in per_stream.items() if k != main}
            if others:
                print("- other streams' non-NCCL busy time: " +
                      ", ".join(f"{k}: {v / 1e3:.3f} ms" for k, v in sorted(others.items(), key=lambda kv: -kv[1])))
        phase_report(events, evs, "train_gpt::optimizer", span1 - span0)
        if per_stream:
            exposed_report(events, evs, main)
        if nccl:
            n_total = sum(t - s for s, t in nccl)
            n_union = union_length(nccl)
            ov = overlap_with(merged(nccl), merged(compute))
            print(f"- NCCL kernels: {n_total / 1e3:.3f} ms ({n_union / 1e3:.3f} ms as wall time); overlapped with "
                  f"compute kernels {ov / 1e3:.3f} ms ({100 * ov / n_union:.1f}%), exposed "
                  f"{(n_union - ov) / 1e3:.3f} ms")
        else:
            print("- no NCCL kernels in this trace")
        print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--annotation", default="train_gpt::step",
                    help="user scope that spans the step (torch.profiler's: ProfilerStep#)")
    args = ap.parse_args()
    events = load(args.trace)
    gpu = [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU_CATS]
    print(f"Trace {args.trace}: {len(events)} events, {len(gpu)} GPU kernels/copies")
    if gpu:
        summarise_gpu(events, gpu, args.top, args.annotation)
        return
    print("No GPU activity: CPU operators by self time instead.")
    selfs = cpu_self_times(events)
    items = [(n, d, category(n)) for n, d in selfs]
    total = sum(d for _, d, _ in items)
    if not items:
        print("no CPU operators either")
        return
    print_categories(items, total, "CPU self")
    print_top(items, total, args.top, "CPU self")
    print("\n## Step")
    for s, t in annotation_spans(events, args.annotation):
        print(f"- CPU span of `{args.annotation}`: {(t - s) / 1e3:.3f} ms")
    for part in ("train_gpt::forward", "train_gpt::backward", "train_gpt::optimizer"):
        for s, t in annotation_spans(events, part):
            print(f"- {part}: {(t - s) / 1e3:.3f} ms")


if __name__ == "__main__":
    main()
