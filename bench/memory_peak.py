#!/usr/bin/env python3
"""What is live at the CUDA caching allocator's peak, from a memory snapshot (the pickle that
train_gpt --memory-snapshot or torch.cuda.memory._dump_snapshot writes).

    python3 bench/memory_peak.py snapshot.pickle [--device 0] [--top 30]

The snapshot holds the blocks live when it was taken ("segments") and the history of
allocations and frees before it ("device_traces"). Walking the history backwards from the
final state gives the allocated bytes after every event and the state when the history began;
replaying forwards from there to the highest point gives the blocks live at the peak. Each is
attributed to the first frame of its allocation's stack that names dscpp (the caller in our
code) and to the first ATen operator on it; blocks allocated before the history began have no
stack and are listed as "before the recorded step" (the model states, the caches)."""
import argparse
import collections
import pickle

GiB = 1024.0**3


def frame_name(f):
    return f.get("name", "") if isinstance(f, dict) else str(f)


def attribute(frames):
    """(our caller, ATen operator) of an allocation's stack, innermost first."""
    names = [frame_name(f) for f in frames or []]
    ours = next((n for n in names if "dscpp" in n), "")
    op = next((n for n in names if "at::_ops::" in n or n.startswith("at::native::")), "")
    if not names:
        return ("before the recorded step", "")
    return (ours or (names[0] if names else "?"), op)


def short(name, width=90):
    name = name.replace("|", "/")
    return name if len(name) <= width else name[: width - 3] + "..."


def live_at_peak(snapshot, device):
    final = {}
    for seg in snapshot.get("segments", []):
        if seg.get("device", 0) != device:
            continue
        addr = seg["address"]
        for b in seg.get("blocks", []):
            if b.get("state") == "active_allocated":
                final[addr] = (b["size"], b.get("frames", []))
            addr += b["size"]
    traces = snapshot.get("device_traces", [])
    trace = traces[device] if device < len(traces) else []
    events = [e for e in trace if e.get("action") in ("alloc", "free_completed")]
    # Backwards: the allocated total after each event, and the live set when the history began.
    live = dict(final)
    total = sum(s for s, _ in live.values())
    after = [0] * len(events)
    for i in range(len(events) - 1, -1, -1):
        after[i] = total
        e = events[i]
        if e["action"] == "alloc":
            live.pop(e["addr"], None)
            total -= e["size"]
        else:
            live[e["addr"]] = (e["size"], [])  # its stack comes with its alloc, if recorded
            total += e["size"]
    start_total = total
    peak_i = max(range(len(events)), key=lambda i: after[i]) if events else -1
    if peak_i < 0 or after[peak_i] <= start_total:
        return start_total, start_total, final, -1, len(events)
    # Forwards from the beginning to the peak.
    for e in events[: peak_i + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []))
        else:
            live.pop(e["addr"], None)
    return start_total, after[peak_i], live, peak_i, len(events)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("snapshot")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    with open(args.snapshot, "rb") as f:
        snapshot = pickle.load(f)
    start, peak, live, peak_i, n = live_at_peak(snapshot, args.device)
    print(f"# {args.snapshot}, device {args.device}: {n} allocations/frees recorded")
    print(f"- allocated when the history began: {start / GiB:.2f} GiB; at the peak "
          f"(event {peak_i}): {peak / GiB:.2f} GiB; {len(live)} live blocks\n")
    groups = collections.defaultdict(lambda: [0, 0, collections.Counter()])
    for size, frames in live.values():
        g = groups[attribute(frames)]
        g[0] += 1
        g[1] += size
        g[2][size] += 1
    print("| our caller | ATen operator | blocks | GiB | largest sizes (MiB x count) |")
    print("| --- | --- | --- | --- | --- |")
    for (ours, op), (count, size, sizes) in sorted(groups.items(), key=lambda kv: -kv[1][1])[: args.top]:
        common = ", ".join(f"{s / 2**20:.1f} x{c}" for s, c in sorted(sizes.items(), key=lambda kv: -kv[0] * kv[1])[:4])
        print(f"| `{short(ours)}` | `{short(op, 50)}` | {count} | {size / GiB:.3f} | {common} |")


if __name__ == "__main__":
    main()
