"""train_gpt saves at one (tensor, pipeline, data, expert, ZeRO stage) layout and resumes at
another, through the launcher on CPU ranks.

An MoE GPT (h 64, 2 blocks both MoE, 4 experts top-2 of FFN 32, dropless, no auxiliary loss,
fp32, AdamW, clipping 1.0; the global batch 8 = micro-batch x data x accumulation 2) trains 6
steps at a layout,
saving after step 3 (--save-interval 3). A second job at another layout loads that checkpoint
and trains steps 4-6: each loss within 1e-5 relative of the saving job's own steps 4-6 (which
other tests hold to the one-rank model's: examples.TrainGptTensorParallelMoEMatchesTensorOne,
pipe.ThreeDMatchesOneRank, the engine oracles). Loading onto another layout goes through the
checkpoint's normal form (docs/checkpoints.md, "Another layout"). No auxiliary loss: it is
taken per micro-batch (Megatron's and DeepSpeed's definition), so it is another loss where the
micro-batch differs, and with it steps 5-6 differ by up to 1e-4 across these layouts while
step 4 (the loaded weights alone) agrees exactly; without it every case agrees to 2e-7.

The cases are a covering set: every value of each dimension on both sides (t 1-2, p 1-2, d 1,
2 and 4, ep 1, 2 and 4, ZeRO 0-3; a pipeline trains at ZeRO 0-2 and experts with a tensor degree
at 0-2), and the pairs that interact: a stage change with a change of data ranks, tensor with
pipeline (3D both ways), experts with data ranks.
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_train_gpt_flags import Job, check, megatron_format, summary, write_json  # noqa: E402
from test_train_gpt_pipeline import steps  # noqa: E402

# (t, p, d, ep, ZeRO stage) saved -> loaded
CASES = [
    ((2, 1, 2, 2, 1), (1, 1, 1, 1, 3)),
    ((1, 2, 2, 1, 0), (2, 1, 2, 2, 2)),
    ((1, 1, 4, 4, 2), (1, 2, 2, 2, 1)),
    ((1, 1, 2, 1, 3), (2, 2, 1, 1, 0)),
    ((2, 2, 1, 1, 2), (1, 1, 4, 2, 0)),
    ((1, 1, 1, 1, 0), (1, 1, 2, 2, 3)),
]


def name(layout):
    t, p, d, e, z = layout
    return f"t{t} p{p} d{d} ep{e} ZeRO {z}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    ap.add_argument("--cases", default="", help="comma-separated indices of CASES (default: all)")
    args = ap.parse_args()
    only = {int(c) for c in args.cases.split(",") if c}
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(args.launcher, args.train_gpt, tmp)
        prefix = os.path.join(tmp, "tokens")
        megatron_format.write(prefix, [[[(5 * i + 3 * j) % 128 for j in range(70)]]
                                       for i in range(40)], "uint16")
        shape = {"hidden_size": 64, "num_layers": 2, "num_attention_heads": 4, "seq_length": 16,
                 "vocab_size": 256, "hidden_dropout": 0.0, "attention_dropout": 0.0,
                 "gelu_approximation": "none", "num_experts": 4, "moe_router_topk": 2,
                 "moe_ffn_hidden_size": 32, "moe_aux_loss_coeff": 0.0}
        base = {"steps_per_print": 1 << 30, "train_batch_size": 8, "gradient_accumulation_steps": 2,
                "gradient_clipping": 1.0,
                "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "eps": 1e-6}}}
        common = ["--data-path", prefix, "--train-iters", "6", "--log-interval", "1", "--seed", "7"]

        def run(layout, *flags):
            t, p, d, e, z = layout
            ds = write_json(os.path.join(tmp, f"z{z}.json"), dict(base, zero_optimization={"stage": z}))
            par = {"tensor_model_parallel_size": t, "pipeline_model_parallel_size": p,
                   "expert_model_parallel_size": e}
            job.model = write_json(os.path.join(tmp, f"model_{t}{p}{d}{e}.json"), dict(shape, parallelism=par))
            return job.run("--deepspeed_config", ds, *common, *flags, ranks=t * p * d)

        for i, (saved, loaded) in enumerate(CASES):
            if only and i not in only:
                continue
            ck = os.path.join(tmp, f"ck{i}")
            rc1, log1 = run(saved, "--save", ck, "--save-interval", "3")
            full = steps(log1)
            what = f"saved at {name(saved)}, loaded at {name(loaded)}"
            check(f"{what}: the saving job trains 6 steps and saves global_step3",
                  rc1 == 0 and len(full) == 6 and os.path.isdir(os.path.join(ck, "global_step3")), log1)
            if rc1 != 0 or len(full) != 6:
                continue
            # The tag the job resumes from: the one after step 3, not the last.
            with open(os.path.join(ck, "latest"), "w") as f:
                f.write("global_step3")
            rc2, log2 = run(loaded, "--load", ck)
            got = steps(log2)
            ok = rc2 == 0 and [s["step"] for s in got] == [4, 5, 6]
            worst = max((abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(got, full[3:])),
                        default=float("inf"))
            errs = ", ".join(f"{abs(a['loss'] - b['loss']) / abs(b['loss']):.1e}" for a, b in zip(got, full[3:]))
            print(f"note: {what}: steps 4-6 against the saving job's: {errs}")
            check(f"{what}: steps 4-6 within 1e-5 relative of the saving job's (worst {worst:.2e})",
                  ok and worst <= 1e-5, log2)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
