"""train_gpt with the model config's fp8 keys, on CPU ranks, against the same run in bf16.

A tiny GPT (2 blocks, every block in fp8: first_last_layers_bf16 off) learns sequences where each
token is the sum of the two before it (mod 64) on 2 data ranks, ZeRO 1, bf16, 40 steps: its loss
falls by a fifth. Each fp8 recipe (hybrid tensorwise, e4m3
rowwise, and hybrid tensorwise at tensor parallel 2) ends within 3% of bf16's final loss, and
its losses are not bf16's (the products really are fp8's); so does the delayed recipe (an amax
history of 4 steps, its maximum). A wrong scale must fail that bound: fp8_margin 20 maps every
tensor 2^20 times below its range, so every value underflows, and its final loss is checked to
be further than 3% from bf16's. The delayed recipe's history and scales are checkpointed state:
a job saved after step 20 and resumed trains steps 21-40 as the uninterrupted job did, loss for
loss. With fp16 the job is refused, naming the fix.
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_train_gpt_flags import FAILED, Job, check, megatron_format, write_json  # noqa: E402
from test_train_gpt_pipeline import steps  # noqa: E402

STEPS = 40
TOLERANCE = 0.03


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(args.launcher, args.train_gpt, tmp)
        prefix = os.path.join(tmp, "tokens")
        # t[k] = t[k-1] + t[k-2] mod 64 from a different start each: the next token needs the one
        # before the current, which only attention gives, so broken products show in the loss.
        docs = []
        for i in range(40):
            t = [(7 * i + 1) % 64, (11 * i + 5) % 64]
            while len(t) < 70:
                t.append((t[-1] + t[-2]) % 64)
            docs.append([t])
        megatron_format.write(prefix, docs, "uint16")
        shape = {"hidden_size": 64, "num_layers": 2, "num_attention_heads": 4, "seq_length": 16,
                 "vocab_size": 128, "ffn_hidden_size": 128, "hidden_dropout": 0.0, "attention_dropout": 0.0,
                 "tie_word_embeddings": True}
        ds = {"train_batch_size": 8, "gradient_accumulation_steps": 1, "steps_per_print": 1 << 30,
              "gradient_clipping": 1.0, "zero_optimization": {"stage": 1}, "bf16": {"enabled": True},
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}}
        ds_path = write_json(os.path.join(tmp, "ds.json"), ds)
        common = ["--deepspeed_config", ds_path, "--data-path", prefix, "--train-iters", str(STEPS),
                  "--log-interval", "1", "--seed", "5"]

        def run(name, extra_model=None, extra_flags=(), ranks=2):
            job.model = write_json(os.path.join(tmp, name + ".json"), dict(shape, **(extra_model or {})))
            rc, log = job.run(*common, *extra_flags, ranks=ranks)
            losses = [s["loss"] for s in steps(log)]
            ok = rc == 0 and len(losses) == STEPS
            check(f"{name}: {STEPS} steps", ok, log)
            return losses if ok else None, log

        bf16, _ = run("bf16")
        if bf16:
            check("bf16: the loss falls by a fifth", bf16[-1] < 0.8 * bf16[0], str(bf16))
        fp8 = {"first_last_layers_bf16": False}
        delayed = dict(fp8, fp8="hybrid", fp8_recipe="delayed", fp8_amax_history_len=4, fp8_amax_compute_algo="max")
        results = {}
        runs = {
            "fp8 hybrid tensorwise": (dict(fp8, fp8="hybrid", fp8_recipe="tensorwise"), ()),
            "fp8 e4m3 rowwise": (dict(fp8, fp8="e4m3", fp8_recipe="rowwise"), ()),
            "fp8 hybrid tensorwise, tensor parallel 2": (dict(fp8, fp8="hybrid"),
                                                         ("--tensor-model-parallel-size", "2")),
            "fp8 hybrid delayed": (delayed, ("--save", os.path.join(tmp, "delayed_ck"), "--save-interval", "20")),
        }
        for name, (model, flags) in runs.items():
            losses, _ = run(name.replace(" ", "_").replace(",", ""), model, flags)
            results[name] = losses
            if not (bf16 and losses):
                continue
            gap = abs(losses[-1] - bf16[-1]) / bf16[-1]
            print(f"note: {name}: final loss {losses[-1]:.5f} against bf16's {bf16[-1]:.5f} ({gap:.2%})")
            check(f"{name}: final loss within {TOLERANCE:.0%} of bf16's", gap <= TOLERANCE, f"{losses}\n{bf16}")
            check(f"{name}: its losses are not bf16's", losses != bf16)
        # The delayed job resumed from its checkpoint after step 20: its history and scales come
        # back with it (without them the scales would restart at 1 and the losses part).
        straight = results.get("fp8 hybrid delayed")
        ck = os.path.join(tmp, "delayed_ck")
        if straight and os.path.isdir(os.path.join(ck, "global_step20")):
            with open(os.path.join(ck, "latest"), "w") as f:
                f.write("global_step20")
            job.model = write_json(os.path.join(tmp, "delayed_resumed.json"), dict(shape, **delayed))
            rc, log = job.run(*common, "--load", ck)
            got = steps(log)
            check("the delayed job resumed trains steps 21-40",
                  rc == 0 and [s["step"] for s in got] == list(range(21, STEPS + 1)), log)
            worst = max((abs(a["loss"] - b) / b for a, b in zip(got, straight[20:])), default=float("inf"))
            print(f"note: fp8 delayed resumed after step 20: steps 21-40 within {worst:.1e} of the uninterrupted job's")
            check("the delayed job resumed matches the uninterrupted one within 1e-6", worst <= 1e-6,
                  f"{[s['loss'] for s in got]}\n{straight[20:]}")
        else:
            check("the delayed job saved global_step20", False, str(straight))
        wrong, _ = run("wrong_scale", dict(fp8, fp8="hybrid", fp8_margin=20))
        if bf16 and wrong:
            gap = abs(wrong[-1] - bf16[-1]) / bf16[-1]
            print(f"note: fp8_margin 20: final loss {wrong[-1]:.5f} ({gap:.2%} from bf16's)")
            check(f"a wrong scale (fp8_margin 20) fails the {TOLERANCE:.0%} bound", gap > TOLERANCE, str(wrong))
        # fp16 with fp8: refused, naming bf16.
        ds16 = write_json(os.path.join(tmp, "ds16.json"), dict(
            {k: v for k, v in ds.items() if k != "bf16"}, fp16={"enabled": True}))
        job.model = write_json(os.path.join(tmp, "fp16.json"), dict(shape, fp8="hybrid"))
        rc, log = job.run("--deepspeed_config", ds16, "--data-path", prefix, "--train-iters", "1")
        check("fp8 with fp16 is refused, naming bf16", rc != 0 and "fp8 with fp16" in log and "bf16" in log, log)
    print(f"{len(FAILED)} failed" if FAILED else "all passed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
