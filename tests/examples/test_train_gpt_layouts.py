"""train_gpt trains every layout it accepts with the model config's default dropouts.

Tensor t, pipeline p and data d each 1 or 2 (up to 8 CPU ranks; the degrees from the flags, data
what the world leaves), a tiny GPT whose config names no dropout (Megatron's 0.1 for hidden and
attention dropout: the tensor-parallel GPT's split regions draw from the model-parallel RNG
tracker), ZeRO 1, the same global batch of 8 in 2 accumulation steps, 3 steps. Each layout:
- exits 0 with a log line at every step, its start-up line naming the layout;
- applies dropout: its losses are not those of one rank with dropout 0 (printed to 6 digits),
  yet within 2% of one rank's with dropout on at every step (other masks, the same initial
  weights, data and schedule: one rank with --seed-layers for a pipeline, whose layers are
  seeded each), and its loss falls from step 1 to step 3.
All eight layouts take about 30 s on 2 cores.
"""
import argparse
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_train_gpt_flags import FAILED, Job, check, megatron_format, write_json  # noqa: E402
from test_train_gpt_pipeline import steps  # noqa: E402

LAYOUTS = [(t, p, d) for t in (1, 2) for p in (1, 2) for d in (1, 2)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(args.launcher, args.train_gpt, tmp)
        prefix = os.path.join(tmp, "tokens")
        megatron_format.write(prefix, [[[(5 * i + 3 * j) % 64 for j in range(70)]] for i in range(40)], "uint16")
        # No dropout keys: the defaults.
        shape = {"hidden_size": 32, "num_layers": 2, "num_attention_heads": 4, "seq_length": 16,
                 "vocab_size": 128, "ffn_hidden_size": 64, "tie_word_embeddings": True}
        job.model = write_json(os.path.join(tmp, "gpt.json"), shape)
        no_dropout = write_json(os.path.join(tmp, "gpt_nodrop.json"),
                                dict(shape, hidden_dropout=0.0, attention_dropout=0.0))
        ds = write_json(os.path.join(tmp, "ds.json"), {
            "train_batch_size": 8, "gradient_accumulation_steps": 2, "steps_per_print": 1 << 30,
            "gradient_clipping": 1.0, "zero_optimization": {"stage": 1},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}})
        common = ["--deepspeed_config", ds, "--data-path", prefix, "--train-iters", "3", "--log-interval", "1",
                  "--seed", "3"]

        # The references on one rank: the GPT as one module (what t x 1 x d starts from) and as
        # LayerSpecs seeded per layer (--seed-layers: what a pipeline starts from), each with
        # dropout on and with dropout 0.
        ref, off = {}, {}
        for init, extra in (("one module", []), ("seeded layers", ["--seed-layers"])):
            rc, log = job.run(*common, *extra, ranks=1)
            ref[init] = [s["loss"] for s in steps(log)]
            check(f"one rank ({init}), dropout on: 3 steps", rc == 0 and len(ref[init]) == 3, log)
            saved_model, job.model = job.model, no_dropout
            rc, log = job.run(*common, *extra, ranks=1)
            job.model = saved_model
            off[init] = [s["loss"] for s in steps(log)]
            check(f"one rank ({init}), dropout 0: 3 steps", rc == 0 and len(off[init]) == 3, log)
            check(f"one rank ({init}): dropout changes the losses", ref[init] != off[init], f"{ref} {off}")
        if any(len(v) != 3 for v in list(ref.values()) + list(off.values())):
            return finish()

        for t, p, d in LAYOUTS:
            name = f"tensor {t} x pipeline {p} x data {d}"
            rc, log = job.run(*common, "--tensor-model-parallel-size", str(t), "--pipeline-model-parallel-size",
                              str(p), ranks=t * p * d)
            got = [s["loss"] for s in steps(log)]
            check(f"{name}: trains 3 steps", rc == 0 and len(got) == 3 and all(math.isfinite(l) for l in got), log)
            if len(got) != 3:
                continue
            named = (f"pipeline {p} stages" in log and f"x data {d} x tensor {t}" in log if p > 1
                     else f"tensor parallel {t} x data {d}" in log if t > 1 else f"{d} ranks on cpu" in log)
            check(f"{name}: the start-up line names the layout", named, log)
            init = "seeded layers" if p > 1 else "one module"
            worst = max(abs(a - b) / a for a, b in zip(ref[init], got))
            check(f"{name}: within 2% of one rank's losses with dropout ({init}; worst {worst:.1e})",
                  worst <= 0.02, f"{got} {ref[init]}")
            check(f"{name}: dropout applied (not the dropout-0 losses)", got != off[init], f"{got} {off[init]}")
            check(f"{name}: the loss falls", got[2] < got[0], str(got))
    return finish()


def finish():
    if FAILED:
        print(f"{len(FAILED)} check(s) failed: {FAILED}")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
