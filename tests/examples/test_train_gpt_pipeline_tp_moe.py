"""train_gpt with experts on a pipeline with a tensor degree (pipeline x tensor x
experts), through the launcher on CPU ranks.

The MoE GPT of test_train_gpt_tp_moe.py (GPT-2's blocks, h 64, 2 blocks both MoE, 4 experts
top-2 of FFN 32, a shared expert of 64, sigmoid scores with the expert bias, aux loss 0.01, fp32,
AdamW, clipping 1.0) on 2 stages x tensor 2 x data 2 with expert degree 2 (8 CPU ranks; every
degree from the model config's `parallelism`) trains as the same model at tensor 1 x data 2, ep 1
without a pipeline (2 CPU ranks, --seed-layers: each layer seeded as the pipeline seeds it), on
the same global batch (micro-batch 2 x data 2 x GA 2): every step's logged loss within 1e-5
relative, the grad norm, lr, aux loss and load balance as printed; dropless at ZeRO 1 and with
token dropping (capacity factor 1.0, per data rank in both layouts) at ZeRO 2. The start-up line
names the layout.
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_train_gpt_flags import FAILED, Job, check, megatron_format, write_json  # noqa: E402
from test_train_gpt_pipeline import steps  # noqa: E402
from test_train_gpt_tp_moe import moe_fields  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(args.launcher, args.train_gpt, tmp)
        prefix = os.path.join(tmp, "tokens")
        megatron_format.write(prefix, [[[(5 * i + 3 * j) % 128 for j in range(70)]]
                                       for i in range(40)], "uint16")
        shape = {"hidden_size": 64, "num_layers": 2, "num_attention_heads": 4, "seq_length": 16,
                 "vocab_size": 256, "hidden_dropout": 0.0, "attention_dropout": 0.0,
                 "gelu_approximation": "none", "num_experts": 4, "moe_router_topk": 2,
                 "moe_ffn_hidden_size": 32, "moe_shared_expert_intermediate_size": 64,
                 "moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
                 "moe_aux_loss_coeff": 0.01}
        base = {"steps_per_print": 1 << 30, "train_batch_size": 8, "gradient_accumulation_steps": 2,
                "gradient_clipping": 1.0,
                "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "eps": 1e-6}}}
        common = ["--data-path", prefix, "--train-iters", "5", "--log-interval", "1", "--seed", "7"]

        for label, extra, stage in (("dropless", {}, 1), ("token dropping", {"moe_expert_capacity_factor": 1.0}, 2)):
            ds = write_json(os.path.join(tmp, f"z{stage}.json"), dict(base, zero_optimization={"stage": stage}))
            job.model = write_json(os.path.join(tmp, f"one_{stage}.json"), dict(shape, **extra))
            rc1, log1 = job.run("--deepspeed_config", ds, *common, "--seed-layers", ranks=2)
            job.model = write_json(os.path.join(tmp, f"3d_{stage}.json"),
                                   dict(shape, **extra, parallelism={"pipeline_model_parallel_size": 2,
                                                                     "tensor_model_parallel_size": 2,
                                                                     "expert_model_parallel_size": 2}))
            rc2, log2 = job.run("--deepspeed_config", ds, *common, ranks=8)
            ref, got = steps(log1), steps(log2)
            name = f"2 stages x tensor 2 x data 2 at ep 2, {label}, ZeRO {stage}"
            check(f"{name}: both layouts train 5 steps", rc1 == 0 and rc2 == 0 and len(ref) == 5 and len(got) == 5,
                  log1 + "\n---\n" + log2)
            check(f"{name}: the start-up line names the layout",
                  "pipeline 2 stages" in log2 and "x data 2 x tensor 2 (experts 2 of the data ranks)" in log2, log2)
            if len(ref) != 5 or len(got) != 5:
                continue
            worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(ref, got))
            print(f"note: {name} against tensor 1 x data 2 at ep 1: worst loss {worst:.2e}")
            check(f"{name}: the losses of tensor 1 x data 2 at ep 1 within 1e-5 relative (worst {worst:.2e})",
                  worst <= 1e-5, log1 + "\n---\n" + log2)
            check(f"{name}: lr and grad norm as printed at tensor 1, ep 1",
                  [(a["lr"], a["norm"]) for a in ref] == [(b["lr"], b["norm"]) for b in got],
                  log1 + "\n---\n" + log2)
            check(f"{name}: aux loss and load balance as printed at tensor 1, ep 1",
                  len(moe_fields(log1)) == 5 and moe_fields(log1) == moe_fields(log2), log1 + "\n---\n" + log2)
    if FAILED:
        print("FAILED:", FAILED)
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
