"""train_gpt on a pipeline writes its monitors once, from the rank that holds the loss.

Pipeline 2 x tensor 2 x data 2 on 8 CPU ranks (the model config's `parallelism`), the
tensorboard and csv_monitor on, 4 steps logged at every step, steps_per_print 1:
- one writer: a single TensorBoard event file and each CSV row once (each x once per file),
  the engine's `[dscpp] step=` progress line once per step;
- Train/Samples/train_loss at every step is the loss the log line printed (the batch's mean
  over micro-batches and data ranks, not 0), and lr and grad norm are the log's;
- train_gpt's tokens_per_sec, tflops_per_rank, mfu (with --peak-tflops) and the pipeline's
  bubble at every log line, each as the line printed;
- TensorBoard's own EventAccumulator reads the event file back: its scalars are the CSV's.
"""
import argparse
import glob
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_train_gpt_flags import FAILED, Job, check, megatron_format, write_json  # noqa: E402
from test_train_gpt_monitors import close  # noqa: E402

LINE = re.compile(r"\[train_gpt\] step (\d+)/\d+ \| loss (\S+) \| lr (\S+) \| grad norm (\S+) \| loss scale \S+ \| "
                  r"(\d+) tokens/s \(\d+ per rank\) \| (\S+) TFLOP/s per rank \| MFU (\S+)% \|.* \| bubble (\S+)$")
EVENTS = ["train_loss", "lr", "grad_norm", "samples_per_sec", "peak_memory_gib", "tokens_per_sec",
          "tflops_per_rank", "mfu", "pipeline_bubble"]


def logged(log):
    out = {}
    for line in log.splitlines():
        m = LINE.match(line)
        if m:
            out[int(m.group(1))] = dict(train_loss=float(m.group(2)), lr=float(m.group(3)),
                                        grad_norm=float(m.group(4)), tokens_per_sec=float(m.group(5)),
                                        tflops_per_rank=float(m.group(6)), mfu=float(m.group(7)) / 100,
                                        pipeline_bubble=float(m.group(8)))
    return out


def csv_rows(folder, name):
    """The data rows of an event's CSV file as written (x, value), or None without the file."""
    path = os.path.join(folder, f"Train_Samples_{name}.csv")
    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        lines = f.read().split("\r\n")
    rows = [] if lines[0] == f"step,{name}" else [("first line", lines[0])]
    for line in lines[1:-1]:
        try:
            x, value = line.split(",")
            rows.append((int(x), float(value)))
        except ValueError:  # another writer's header row
            rows.append(("row", line))
    return rows


def scalars(folder):
    """TensorBoard's own reader: every scalar event as (step, value) per tag, in file order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(folder)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(args.launcher, args.train_gpt, tmp)
        prefix = os.path.join(tmp, "tokens")
        megatron_format.write(prefix, [[[(5 * i + j) % 64 for j in range(40)]] for i in range(32)], "uint16")
        job.model = write_json(os.path.join(tmp, "gpt.json"), {
            "hidden_size": 16, "num_layers": 2, "num_attention_heads": 2, "seq_length": 8, "vocab_size": 64,
            "ffn_hidden_size": 32, "init_method_std": 0.02, "tie_word_embeddings": True,
            "parallelism": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}})
        csv_dir, tb_dir = os.path.join(tmp, "csv"), os.path.join(tmp, "tb")
        ds = write_json(os.path.join(tmp, "ds.json"), dict(
            train_batch_size=8, gradient_accumulation_steps=2, steps_per_print=1,
            optimizer={"type": "AdamW", "params": {"lr": 1e-3}}, zero_optimization={"stage": 1},
            tensorboard={"enabled": True, "output_path": tb_dir, "job_name": "job"},
            csv_monitor={"enabled": True, "output_path": csv_dir, "job_name": "job"}))
        rc, log = job.run("--deepspeed_config", ds, "--data-path", prefix, "--train-iters", "4",
                          "--log-interval", "1", "--peak-tflops", "0.5", ranks=8)
        check("pipeline 2 x tensor 2 x data 2 trains with the monitors on", rc == 0, log)
        lines = logged(log)
        check("a log line at every step, printed once", sorted(lines) == [1, 2, 3, 4]
              and log.count("[train_gpt] step ") == 4, log)
        progress = [l for l in log.splitlines() if l.startswith("[dscpp] step=")]
        check("the engine's progress line printed once per step (4)", len(progress) == 4, "\n".join(progress))
        events = glob.glob(os.path.join(tmp, "**", "events.out.tfevents.*"), recursive=True)
        check("one TensorBoard event file in the job", len(events) == 1, str(events))
        folder = os.path.join(csv_dir, "job")
        xs = [8, 16, 24, 32]
        series = {}
        for n in EVENTS:
            rows = csv_rows(folder, n)
            check(f"{n}: one CSV row per step (x = 8, 16, 24, 32), none twice",
                  rows is not None and [x for x, _ in rows] == xs, str(rows))
            series[n] = dict(rows) if rows else {}
        if len(lines) != 4 or any(sorted(series[n]) != xs for n in EVENTS):
            return finish()
        for step, line in sorted(lines.items()):
            x = step * 8
            check(f"step {step}: train_loss is the logged loss {line['train_loss']} (not 0)",
                  line["train_loss"] > 1 and close(series["train_loss"][x], line["train_loss"], 0, 5.1e-7),
                  f"{series['train_loss']} {line}")
            check(f"step {step}: lr and grad norm as logged",
                  close(series["lr"][x], line["lr"], 1e-3) and close(series["grad_norm"][x], line["grad_norm"], 0, 5.1e-4),
                  f"{series['lr']} {series['grad_norm']} {line}")
            check(f"step {step}: tokens/s, TFLOP/s and the bubble as logged",
                  close(series["tokens_per_sec"][x], line["tokens_per_sec"], 0, 0.51)
                  and close(series["tflops_per_rank"][x], line["tflops_per_rank"], 0, 5.1e-4)
                  and close(series["pipeline_bubble"][x], line["pipeline_bubble"], 0, 5.1e-4),
                  f"{series['tokens_per_sec']} {series['tflops_per_rank']} {series['pipeline_bubble']} {line}")
            check(f"step {step}: MFU = TFLOP/s over --peak-tflops 0.5",
                  close(series["mfu"][x], series["tflops_per_rank"][x] / 0.5, 1e-9), str(series["mfu"]))
        tb = scalars(os.path.join(tb_dir, "job"))
        for n in EVENTS:
            got, want = tb.get("Train/Samples/" + n), series[n]
            check(f"TensorBoard's {n} is the CSV's (float32), each step once",
                  got is not None and [x for x, _ in got] == xs and all(close(v, want[x], 1e-6) for x, v in got),
                  f"{got} {want}")
    return finish()


def finish():
    if FAILED:
        print(f"{len(FAILED)} check(s) failed: {FAILED}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
