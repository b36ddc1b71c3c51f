"""What train_gpt's log line shows reaches the monitors, 2 CPU ranks via the launcher.

The csv_monitor's files and TensorBoard's event file (read by TensorBoard's own
EventAccumulator) hold, under DeepSpeed's names where its engine has them (Train/Samples/
train_loss, lr, loss_scale with fp16) and names of that form where it has none (grad_norm,
samples_per_sec, peak_memory_gib from the engine at every step; tokens_per_sec,
tflops_per_rank, mfu from train_gpt at every log line), at x = samples seen: the values the
log line printed at the same step, the two monitors agreeing with each other. The names
called DeepSpeed's (and the engine's wall_clock_breakdown timers) are checked against the
installed DeepSpeed's engine source; the others against being absent from it.
"""
import argparse
import csv
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_train_gpt_flags import FAILED, Job, check, megatron_format, write_json  # noqa: E402

ENGINE = ["train_loss", "lr", "grad_norm", "samples_per_sec", "peak_memory_gib"]
PROGRAM = ["tokens_per_sec", "tflops_per_rank", "mfu"]


def read_csv(folder, name):
    path = os.path.join(folder, f"Train_Samples_{name}.csv")
    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", name], rows[0]
    return {int(r[0]): float(r[1]) for r in rows[1:]}


def scalars(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(folder)
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def logged(log):
    """Per logged step: the figures of the log line."""
    out = {}
    pat = (r"\[train_gpt\] step (\d+)/\d+ \| loss \S+ \| lr (\S+) \| grad norm (\S+) \| loss scale (\S+) \| "
           r"(\d+) tokens/s \(\d+ per rank\) \| (\S+) TFLOP/s per rank \| MFU (\S+)% \| (\S+) GiB")
    for m in re.finditer(pat, log):
        out[int(m.group(1))] = dict(lr=float(m.group(2)), grad_norm=float(m.group(3)), loss_scale=float(m.group(4)),
                                    tokens_per_sec=float(m.group(5)), tflops_per_rank=float(m.group(6)),
                                    mfu=float(m.group(7)) / 100, peak_memory_gib=float(m.group(8)))
    return out


def close(a, b, rel, absolute=0.0):
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), absolute)


def run_case(job, tmp, prefix, name, precision, extra_ds):
    csv_dir, tb_dir = os.path.join(tmp, name, "csv"), os.path.join(tmp, name, "tb")
    ds = write_json(os.path.join(tmp, f"{name}.json"), dict(
        extra_ds, train_batch_size=8, train_micro_batch_size_per_gpu=2, steps_per_print=1 << 30,
        optimizer={"type": "AdamW", "params": {"lr": 1e-3}}, zero_optimization={"stage": 2},
        tensorboard={"enabled": True, "output_path": tb_dir, "job_name": "job"},
        csv_monitor={"enabled": True, "output_path": csv_dir, "job_name": "job"}))
    rc, log = job.run("--deepspeed_config", ds, "--data-path", prefix, "--train-iters", "4", "--log-interval", "2",
                      "--peak-tflops", "0.5", *precision)
    check(f"{name}: trains", rc == 0, log)
    if rc != 0:
        return
    lines = logged(log)
    check(f"{name}: two log lines", sorted(lines) == [2, 4], log)
    folder = os.path.join(csv_dir, "job")
    series = {n: read_csv(folder, n) for n in ENGINE + PROGRAM + ["loss_scale"]}
    for n in ENGINE:
        check(f"{name}: the engine's {n} at every step (x = 8, 16, 24, 32 samples)",
              series[n] is not None and sorted(series[n]) == [8, 16, 24, 32], str(series[n]))
    for n in PROGRAM:
        check(f"{name}: train_gpt's {n} at every log line (x = 16, 32)",
              series[n] is not None and sorted(series[n]) == [16, 32], str(series[n]))
    if any(series[n] is None for n in ENGINE + PROGRAM):
        return
    for step, line in lines.items():
        x = step * 8
        check(f"{name}: step {step}: lr as logged", close(series["lr"][x], line["lr"], 1e-3), f"{series['lr']} {line}")
        check(f"{name}: step {step}: grad norm as logged", close(series["grad_norm"][x], line["grad_norm"], 0, 1e-3),
              f"{series['grad_norm']} {line}")
        check(f"{name}: step {step}: tokens/s as logged",
              close(series["tokens_per_sec"][x], line["tokens_per_sec"], 0, 0.51), f"{series['tokens_per_sec']} {line}")
        check(f"{name}: step {step}: TFLOP/s as logged",
              close(series["tflops_per_rank"][x], line["tflops_per_rank"], 0, 5e-4), f"{series['tflops_per_rank']} {line}")
        check(f"{name}: step {step}: MFU = TFLOP/s over --peak-tflops 0.5",
              close(series["mfu"][x], series["tflops_per_rank"][x] / 0.5, 1e-9), f"{series['mfu']}")
        check(f"{name}: step {step}: peak memory as logged (rank 0's, GiB)",
              close(series["peak_memory_gib"][x], line["peak_memory_gib"], 0, 0.011), f"{series['peak_memory_gib']} {line}")
        if "--fp16" in precision:
            check(f"{name}: step {step}: loss scale as logged",
                  series["loss_scale"] is not None and series["loss_scale"][x] == line["loss_scale"],
                  f"{series['loss_scale']} {line}")
    if "--fp16" not in precision:
        check(f"{name}: no loss_scale event without fp16 (as DeepSpeed)", series["loss_scale"] is None)
    check(f"{name}: samples/s and the train loss are positive numbers",
          all(v > 0 for n in ("samples_per_sec", "train_loss") for v in series[n].values()), str(series))
    tb = scalars(os.path.join(tb_dir, "job"))
    for n in ENGINE + PROGRAM:
        got, want = tb.get("Train/Samples/" + n), series[n]
        check(f"{name}: TensorBoard's {n} is the csv's (float32)",
              got is not None and sorted(got) == sorted(want) and all(close(got[k], want[k], 1e-6) for k in want),
              f"{got} {want}")


def deepspeed_event_names():
    """The "Train/Samples/..." names DeepSpeed's engines write, from the installed DeepSpeed's
    source text (found without importing it): the reference for which of our names are its."""
    import importlib.util
    spec = importlib.util.find_spec("deepspeed")
    if spec is None:
        return None
    root = os.path.dirname(spec.origin)
    names = set()
    for rel in ("runtime/engine.py", "runtime/pipe/engine.py"):
        with open(os.path.join(root, rel)) as f:
            names |= set(re.findall(r"[\"']Train/Samples/(\w+)[\"']", f.read()))
    return names


def check_names_against_deepspeed():
    theirs = deepspeed_event_names()
    if theirs is None:
        print("SKIP the event names against DeepSpeed's: no deepspeed in this Python")
        return
    shared = ["train_loss", "lr", "loss_scale"]
    check(f"DeepSpeed's engine writes {shared} under Train/Samples/ as we do",
          set(shared) <= theirs, sorted(theirs))
    # Ours where DeepSpeed has none: if it gains one of them, this says so (and its name, if it
    # differs, is the one to take).
    check("DeepSpeed has no event of its own for our other names",
          not (set(ENGINE + PROGRAM) - set(shared)) & theirs, sorted(theirs))
    # The engine's wall_clock_breakdown events (engine_core.cpp) are DeepSpeed's names.
    engine_src = os.path.join(os.path.dirname(os.path.dirname(HERE)), "runtime", "engine", "engine_core.cpp")
    with open(engine_src) as f:
        ours = set(re.findall(r'"Train/Samples/(\w+)"', f.read()))
    timers = {n for n in ours if n.startswith("elapsed_time_ms_")}
    check(f"the engine's timer events {sorted(timers)} are DeepSpeed's names",
          timers and timers <= theirs, f"ours {sorted(ours)}, DeepSpeed's {sorted(theirs)}")
    check("every engine event is DeepSpeed's or one of the names this test reads back",
          ours <= theirs | set(ENGINE), f"ours {sorted(ours)}")


def main():
    check_names_against_deepspeed()
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(args.launcher, args.train_gpt, tmp)
        prefix = os.path.join(tmp, "tokens")
        megatron_format.write(prefix, [[[(5 * i + j) % 64 for j in range(40)]] for i in range(16)], "uint16")
        job.model = write_json(os.path.join(tmp, "gpt.json"), {
            "hidden_size": 16, "num_layers": 1, "num_attention_heads": 2, "seq_length": 8, "vocab_size": 64,
            "ffn_hidden_size": 32, "hidden_dropout": 0.0, "attention_dropout": 0.0, "layernorm_epsilon": 1e-5,
            "init_method_std": 0.02, "tie_word_embeddings": True})
        run_case(job, tmp, prefix, "fp32", [], {})
        run_case(job, tmp, prefix, "fp16", ["--fp16"], {"fp16": {"initial_scale_power": 8}})
    if FAILED:
        print(f"{len(FAILED)} check(s) failed: {FAILED}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
