"""train_gpt with experts and a tensor degree, through the launcher on CPU ranks.

An MoE GPT of GPT-2's blocks (h 64, 2 blocks both MoE, 4 experts top-2 of FFN 32, a shared expert
of 64, sigmoid scores with the expert bias, aux loss 0.01, fp32, AdamW, clipping 1.0) at tensor 2 x
data 2 with expert degree 2 (4 CPU ranks; the degrees from the model config's `parallelism`) trains
as the same model at tensor 1 x data 2, ep 1 (2 CPU ranks) on the same global batch (micro-batch 2
x data 2 x GA 2): every step's logged loss within 1e-5 relative, the grad norm, lr, aux loss and load
balance as printed; dropless at ZeRO 2 and with token dropping (capacity factor 1.0, per data rank
in both layouts) at ZeRO 1; with sequence parallelism too (the model config's
parallelism.sequence_parallel; dropless at ZeRO 2: each tensor rank routes its own sequence shard,
the aux loss printed is the tensor ranks' parts summed, the grad norm and aux loss within 1e-5
relative). The start-up line names the layout. --save at tensor 2 x data 2, ep 2
writes DeepSpeed's MoE layout per tensor rank (layer_L_expert_E_mp_rank_XX, XX the tensor rank),
and --load of it continues at tensor 1 x data 2, ep 1 as the uninterrupted tensor-2 run does.
"""
import argparse
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_train_gpt_flags import FAILED, Job, check, megatron_format, write_json  # noqa: E402
from test_train_gpt_pipeline import steps  # noqa: E402

MOE = re.compile(r"\[train_gpt\] step (\d+)/\d+ .*\| aux loss (\S+) \| load balance (\S+) \(worst (\S+),")


def moe_fields(log):
    return [(int(m[1]), m[2], m[3], m[4]) for m in MOE.finditer(log)]


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

        layouts = (("dropless", {}, 2, False), ("token dropping", {"moe_expert_capacity_factor": 1.0}, 1, False),
                   ("sequence parallel, dropless", {}, 2, True))
        for label, extra, stage, sp in layouts:
            ds = write_json(os.path.join(tmp, f"z{stage}.json"), dict(base, zero_optimization={"stage": stage}))
            job.model = write_json(os.path.join(tmp, f"one_{stage}.json"), dict(shape, **extra))
            rc1, log1 = job.run("--deepspeed_config", ds, *common, ranks=2)
            par = {"tensor_model_parallel_size": 2, "expert_model_parallel_size": 2}
            if sp:
                par["sequence_parallel"] = True
            job.model = write_json(os.path.join(tmp, f"tp_{stage}_{int(sp)}.json"), dict(shape, **extra, parallelism=par))
            rc2, log2 = job.run("--deepspeed_config", ds, *common, ranks=4)
            ref, got = steps(log1), steps(log2)
            if label == "token dropping":
                dropping = got
            name = f"tensor 2 x data 2 at ep 2, {label}, ZeRO {stage}"
            check(f"{name}: both layouts train 5 steps", rc1 == 0 and rc2 == 0 and len(ref) == 5 and len(got) == 5,
                  log1 + "\n---\n" + log2)
            check(f"{name}: the start-up line names the layout",
                  ("tensor parallel 2 x data 2, sequence parallel" if sp else "tensor parallel 2 x data 2") in log2, log2)
            if len(ref) != 5 or len(got) != 5:
                continue
            worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(ref, got))
            print(f"note: {name} against tensor 1 x data 2 at ep 1: worst loss {worst:.2e}")
            check(f"{name}: the losses of tensor 1 x data 2 at ep 1 within 1e-5 relative (worst {worst:.2e})",
                  worst <= 1e-5, log1 + "\n---\n" + log2)
            if sp:
                # The shards' parts in another order: the printed digits may differ in the last place.
                close = lambda a, b: abs(float(a) - float(b)) <= 1e-5 * abs(float(b)) + 1e-6
                check(f"{name}: lr as printed, grad norm within 1e-5 of tensor 1, ep 1",
                      [a["lr"] for a in ref] == [b["lr"] for b in got]
                      and all(close(a["norm"], b["norm"]) for a, b in zip(ref, got)), log1 + "\n---\n" + log2)
                f1, f2 = moe_fields(log1), moe_fields(log2)
                check(f"{name}: aux loss (the tensor ranks' parts summed) within 1e-5, load balance as printed",
                      len(f1) == 5 and len(f2) == 5 and all(a[0] == b[0] and close(a[1], b[1]) and a[2:] == b[2:]
                                                            for a, b in zip(f1, f2)), log1 + "\n---\n" + log2)
                continue
            check(f"{name}: lr and grad norm as printed at tensor 1, ep 1",
                  [(a["lr"], a["norm"]) for a in ref] == [(b["lr"], b["norm"]) for b in got],
                  log1 + "\n---\n" + log2)
            check(f"{name}: aux loss and load balance as printed at tensor 1, ep 1",
                  len(moe_fields(log1)) == 5 and moe_fields(log1) == moe_fields(log2), log1 + "\n---\n" + log2)
        # Token dropping at ZeRO 1: 3 steps at tensor 2, ep 2 saved, the rest at tensor 1, ep 1
        # from the checkpoint, as the uninterrupted tensor-2 run (`dropping`) went on.
        got = dropping
        ds = write_json(os.path.join(tmp, "z1.json"), dict(base, zero_optimization={"stage": 1}))
        job.model = write_json(os.path.join(tmp, "tp_1_0.json"),
                               dict(shape, moe_expert_capacity_factor=1.0,
                                    parallelism={"tensor_model_parallel_size": 2, "expert_model_parallel_size": 2}))
        ck = os.path.join(tmp, "ck")
        short = [c if c != "5" else "3" for c in common]
        rc3, log3 = job.run("--deepspeed_config", ds, *short, "--save", ck, ranks=4)
        tag = os.path.join(ck, "global_step3")
        names = ["mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt",
                 "layer_1_expert_3_mp_rank_01_model_states.pt", "zero_pp_rank_1_mp_rank_01_optim_states.pt"]
        check("--save at tensor 2 x data 2, ep 2: DeepSpeed's MoE file names per tensor rank",
              rc3 == 0 and all(os.path.isfile(os.path.join(tag, n)) for n in names), log3)
        job.model = write_json(os.path.join(tmp, "one_resume.json"), dict(shape, moe_expert_capacity_factor=1.0))
        rc4, log4 = job.run("--deepspeed_config", ds, *common, "--load", ck, ranks=2)
        resumed = steps(log4)
        check("--load at tensor 1 x data 2, ep 1: steps 4 and 5, the tensor-2 run's losses within 1e-5",
              rc4 == 0 and [s["step"] for s in resumed] == [4, 5] and len(got) == 5
              and all(abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]) for a, b in zip(resumed, got[3:])),
              log4)
    if FAILED:
        print("FAILED:", FAILED)
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
