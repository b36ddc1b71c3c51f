"""dscpp's monitors against TensorBoard's reader and DeepSpeed's own monitors.

The C++ CLI (monitor_write_events) writes a set of events through MonitorMaster, built from a
ds_config with `tensorboard` and `csv_monitor` on; then
1. TensorBoard's readers open the event file: its name is TensorBoard's pattern, every
   record's CRCs check out, the first record is file_version "brain.Event:2", and tags, steps,
   float32 values and wall times are what was written (EventAccumulator and raw records).
2. DeepSpeed's own MonitorMaster (deepspeed.monitor, 0.19.8) is given the same ds_config and
   the same events: its CSV folder and ours hold the same file names with the same bytes, and
   its TensorBoard scalars equal ours (all but wall times). The CSVs also parse back to the
   exact doubles written.
3. A resumed run appends to the CSVs as DeepSpeed's does (byte for byte).
4. A non-zero rank, and a config with the monitors off, write nothing.
5. An output_path that cannot be created fails with the folder named.
Last line: "N passed, M failed"; exits non-zero on any failure.
"""

import argparse
import csv
import json
import math
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

passed = 0
failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def same_float(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def same_scalars(a, b):
    """Two lists of (step, value) agree, NaN matching NaN."""
    return len(a) == len(b) and all(x[0] == y[0] and same_float(x[1], y[1]) for x, y in zip(a, b))


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if not (x[0] == y[0] and same_float(x[1], y[1])):
            return f"at {i}: {x} vs {y}"
    return f"{len(a)} vs {len(b)} entries"


def as_float32(v):
    with np.errstate(over="ignore"):
        return float(np.float32(v))


NAMES = [
    "Train/Samples/train_loss",
    "Train/Samples/lr",
    "Train/Samples/loss_scale",
    "Train/Samples/elapsed_time_ms_forward",
    "Eval/loss scale",  # a space: '_' in the file name, kept in the header
    'Odd/a,b "quoted"',  # a header csv.writer must quote
    "plain",  # no '/': the whole name is the header
]
REPR_NAME = "Check/python_repr"  # one last call of 3000 events: doubles of every kind
ALL_NAMES = NAMES + [REPR_NAME]


def make_batches(rng):
    """Ten write_events calls, DeepSpeed-like: one step (samples seen) per call."""
    special = [0.0, -0.0, 1.0, 0.1, 1e-05, 1.5e-07, 0.0001, 1e15, 1e16, 65536.0, 5e-324,
               1.7976931348623157e308, 3.4028234663852886e38, 1e300, float("inf"),
               float("-inf"), float("nan"), 2.0 ** -149, 1.0 / 3.0, -123456.789]
    batches = []
    for i in range(10):
        batch = []
        for name in NAMES:
            kind = rng.randrange(4)
            if special:
                value = special.pop()
            elif kind == 0:
                value = rng.uniform(0.0, 10.0)
            elif kind == 1:
                value = 10.0 ** rng.uniform(-8, -2)
            elif kind == 2:
                value = float(rng.randrange(1 << 20))
            else:  # any double at all, from its bits
                value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
            batch.append((name, value, 8 * (i + 1)))
        batches.append(batch)
    many = []
    for _ in range(3000):
        bits = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        many.append(rng.choice([bits, rng.uniform(-1e6, 1e6), 10.0 ** rng.uniform(-30, 30),
                                float(rng.randrange(-10**17, 10**17))]))
    batches.append([(REPR_NAME, v, 88) for v in many])
    return batches


def write_events_file(path, batches):
    with open(path, "w") as f:
        for batch in batches:
            for name, value, step in batch:
                f.write(f"{name}\t{step}\t{value.hex()}\n")
            f.write("\n")


def ds_config(tb_path, csv_path, tb=True, csv_on=True, job="job"):
    return {
        "train_batch_size": 8,
        "tensorboard": {"enabled": tb, "output_path": tb_path, "job_name": job},
        "csv_monitor": {"enabled": csv_on, "output_path": csv_path, "job_name": job},
    }


def run_cli(cli, work, config, rank, batches, tag):
    cfg = os.path.join(work, f"{tag}.json")
    with open(cfg, "w") as f:
        json.dump(config, f)
    events = os.path.join(work, f"{tag}.events")
    write_events_file(events, batches)
    return subprocess.run([cli, cfg, str(rank), events], capture_output=True, text=True)


def deepspeed_write(config, batches_per_run):
    """DeepSpeed's own MonitorMaster on rank 0, one instance per run (a resume starts anew)."""
    import deepspeed.comm as dist
    from deepspeed.monitor.config import get_monitor_config
    from deepspeed.monitor.monitor import MonitorMaster

    dist.get_rank = lambda: 0  # its monitors ask the rank; no process group is needed
    for batches in batches_per_run:
        monitor = MonitorMaster(get_monitor_config(config))
        for batch in batches:
            monitor.write_events(batch)
        if monitor.tb_monitor is not None:
            monitor.tb_monitor.summary_writer.close()


def csv_files(folder):
    return sorted(f for f in os.listdir(folder) if f.endswith(".csv"))


def records(path):
    """The TFRecord payloads of a file, each CRC checked with TensorBoard's masked_crc32c."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    out, ok = [], True
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        payload = data[pos + 12:pos + 12 + length]
        (dcrc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        ok = ok and hcrc == masked_crc32c(header) and dcrc == masked_crc32c(payload)
        out.append(payload)
        pos += 16 + length
    return out, ok and pos == len(data)


def scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(folder)
    acc.Reload()
    return {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}


def check_tensorboard(tb_file, folder, batches, t0, t1):
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
    from tensorboard.compat.proto import event_pb2

    expected = [e for batch in batches for e in batch]
    check("tb.folder", os.path.dirname(tb_file) == folder, tb_file)
    m = re.fullmatch(r"events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.0", os.path.basename(tb_file))
    check("tb.file_name", m is not None and m.group(2) == socket.gethostname(), tb_file)
    if m:
        check("tb.file_name.seconds", int(t0) - 1 <= int(m.group(1)) <= t1 + 1, m.group(1))

    payloads, crcs_ok = records(tb_file)
    check("tb.record_crcs", crcs_ok)
    check("tb.record_count", len(payloads) == 1 + len(expected), f"{len(payloads)}")

    events = list(LegacyEventFileLoader(tb_file).Load())
    check("tb.loader_reads_all", len(events) == 1 + len(expected), f"{len(events)}")
    if not events:
        return
    first = events[0]
    check("tb.file_version", first.file_version == "brain.Event:2", str(first))
    check("tb.first_wall_time", t0 <= first.wall_time <= t1, f"{first.wall_time} {t0} {t1}")
    last_wall, bad = first.wall_time, []
    for event, (name, value, step) in zip(events[1:], expected):
        ok = (event.WhichOneof("what") == "summary" and len(event.summary.value) == 1
              and event.summary.value[0].tag == name and event.step == step
              and event.summary.value[0].WhichOneof("value") == "simple_value"
              and same_float(event.summary.value[0].simple_value, as_float32(value))
              and last_wall <= event.wall_time <= t1)
        if not ok:
            bad.append((event, (name, value, step)))
        last_wall = event.wall_time
    check("tb.raw_events", not bad, f"{len(bad)} differ; first (read, written): {bad[:1]}")
    # The records are TensorBoard's own Event messages.
    check("tb.parses_as_event_pb2", event_pb2.Event.FromString(payloads[1]) == events[1])

    # A flipped data byte is caught by the reader (so the CRCs above are really checked).
    broken = tb_file + ".broken"
    raw = bytearray(open(tb_file, "rb").read())
    first_len = struct.unpack("<Q", bytes(raw[:8]))[0]
    raw[16 + first_len + 12] ^= 0x01  # the second record's first data byte
    open(broken, "wb").write(bytes(raw))
    check("tb.reader_checks_crcs", len(list(LegacyEventFileLoader(broken).Load())) == 1)
    os.remove(broken)

    got = scalars(folder)
    check("tb.tags", sorted(got) == sorted(ALL_NAMES), f"{sorted(got)}")
    for name in ALL_NAMES:
        want = [(step, as_float32(value)) for n, value, step in expected if n == name]
        have = [(s.step, s.value) for s in got.get(name, [])]
        check(f"tb.scalars[{name}]", same_scalars(have, want), first_difference(have, want))
        check(f"tb.wall_times[{name}]", all(t0 <= s.wall_time <= t1 for s in got.get(name, [])))


def check_csv_values(folder, batches):
    expected = [e for batch in batches for e in batch]
    for name in ALL_NAMES:
        path = os.path.join(folder, name.replace("/", "_").replace(" ", "_") + ".csv")
        if not os.path.exists(path):
            check(f"csv.exists[{name}]", False, path)
            continue
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        check(f"csv.header[{name}]", rows[0] == ["step", name.split("/")[-1]], f"{rows[0]}")
        want = [(step, value) for n, value, step in expected if n == name]
        have = [(int(r[0]), float(r[1])) for r in rows[1:]]
        # The exact double, -0.0 included (NaN prints as "nan" whatever its sign).
        bad = [(h, w) for h, w in zip(have, want) if not (
            h[0] == w[0] and same_float(h[1], w[1])
            and (math.isnan(w[1]) or math.copysign(1, h[1]) == math.copysign(1, w[1])))]
        check(f"csv.values[{name}]", len(have) == len(want) and not bad,
              f"{len(have)} rows for {len(want)}; first mismatch (read, written): {bad[:1]}")


def compare_csv_folders(ours, theirs, label):
    check(f"{label}.same_files", csv_files(ours) == csv_files(theirs),
          f"{csv_files(ours)} vs {csv_files(theirs)}")
    for f in csv_files(theirs):
        mine = os.path.join(ours, f)
        a = open(mine, "rb").read() if os.path.exists(mine) else b""
        b = open(os.path.join(theirs, f), "rb").read()
        check(f"{label}.bytes[{f}]", a == b, f"\nours:   {a[:300]!r}\ntheirs: {b[:300]!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True)
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = parser.parse_args()
    rng = random.Random(20261130)
    batches = make_batches(rng)
    work = tempfile.mkdtemp(prefix="dscpp_monitor_")
    try:
        # 1 and 2: both monitors in one folder, as a typical config has them.
        ours = os.path.join(work, "ours")
        t0 = time.time()
        r = run_cli(args.cli, work, ds_config(ours, ours), 0, batches, "rank0")
        t1 = time.time()
        check("cli.rank0", r.returncode == 0, r.stderr)
        folder = os.path.join(ours, "job")
        check_tensorboard(r.stdout.strip(), folder, batches, t0, t1)
        check_csv_values(folder, batches)

        theirs = os.path.join(work, "deepspeed")
        deepspeed_write(ds_config(theirs, theirs), [batches])
        ds_folder = os.path.join(theirs, "job")
        compare_csv_folders(folder, ds_folder, "deepspeed.csv")
        ds_scalars, our_scalars = scalars(ds_folder), scalars(folder)
        check("deepspeed.tb.tags", sorted(ds_scalars) == sorted(our_scalars))
        for tag, events in ds_scalars.items():
            mine = [(s.step, s.value) for s in our_scalars.get(tag, [])]
            theirs_ = [(s.step, s.value) for s in events]
            check(f"deepspeed.tb.scalars[{tag}]", same_scalars(mine, theirs_),
                  first_difference(mine, theirs_))

        # 3: a resumed run appends, after a header row of its own.
        resumed = [batches[:3], batches[3:5]]
        ours_r, theirs_r = os.path.join(work, "ours_resume"), os.path.join(work, "ds_resume")
        for i, part in enumerate(resumed):
            r = run_cli(args.cli, work, ds_config(ours_r, ours_r, tb=False), 0, part, f"resume{i}")
            check(f"cli.resume{i}", r.returncode == 0 and r.stdout == "\n", r.stderr)
        deepspeed_write(ds_config(theirs_r, theirs_r, tb=False), resumed)
        compare_csv_folders(os.path.join(ours_r, "job"), os.path.join(theirs_r, "job"),
                            "deepspeed.resume")

        # 4: other ranks, and monitors off, write nothing.
        quiet = os.path.join(work, "quiet")
        for rank in (1, 3):
            r = run_cli(args.cli, work, ds_config(quiet, quiet), rank, batches, f"rank{rank}")
            check(f"cli.rank{rank}", r.returncode == 0 and r.stdout == "\n", r.stderr)
        off = ds_config(quiet, quiet, tb=False, csv_on=False)
        r = run_cli(args.cli, work, off, 0, batches, "off")
        check("cli.off", r.returncode == 0 and r.stdout == "\n", r.stderr)
        check("quiet.nothing_written", not os.path.exists(quiet),
              str(list(os.walk(quiet)) if os.path.exists(quiet) else ""))

        # 5: the error names the folder.
        blocker = os.path.join(work, "a_file")
        open(blocker, "w").write("x")
        r = run_cli(args.cli, work, ds_config(blocker, blocker), 0, batches, "bad")
        check("cli.bad_path", r.returncode == 1 and os.path.join(blocker, "job") in r.stderr,
              r.stderr)
    finally:
        if args.keep:
            print(f"scratch folder: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
