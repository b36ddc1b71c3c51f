"""train_gpt on a pipeline saves and resumes (--save, --save-interval, --load), through the
launcher on CPU ranks.

- Pipeline 2 x data 2 (4 CPU ranks), the tiny GPT of test_train_gpt_pipeline.py (fp32, ZeRO 1,
  gradient accumulation 4, clipping, AdamW under WarmupDecayLR so that the schedule's state
  matters): 6 steps in one go, and 3 steps with --save (then --save-interval 3 of 6 steps: the
  tag global_step3 in DeepSpeed's pipeline layout, layer_XX-model_states.pt) followed by --load
  and 3 more steps in new processes: steps 4-6 print the uninterrupted run's loss, lr and grad
  norm to every digit printed (the data position, the schedule and the counters restored).
- The same checkpoint loaded onto another layout: 2 stages x 1 data rank, and one rank without a
  pipeline (--seed-layers: the same LayerSpecs as one module): steps 4-6 within 1e-5 relative of
  the uninterrupted run's losses, lr as printed.
- The MoE GPT (4 experts top-2, a shared expert, the expert bias) at 2 stages x data 2, expert
  degree 2 (DeepSpeed's MoE pipeline layout: layer_L_expert_E files): the resume prints the
  uninterrupted run's lines, aux loss and load balance included.
- A resumed run at its last step says it is finished.
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


def lines(log):
    """The step lines as printed, without the timing, MFU, memory and bubble fields and the run's
    --train-iters (an MoE model's aux loss and load balance stay)."""
    out = []
    for line in log.splitlines():
        if not line.startswith("[train_gpt] step "):
            continue
        line = re.sub(r"(step \d+)/\d+", r"\1", line)
        line = re.sub(r" \| [0-9.]+ tokens/s .*? \| MFU [^|]*?(?= \||$)", "", line)
        out.append(re.sub(r" \| [0-9.]+ GiB [^|]*\(peak\)( \| bubble \S+)?$", "", line))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(args.launcher, args.train_gpt, tmp)
        prefix = os.path.join(tmp, "tokens")
        megatron_format.write(prefix, [[[(3 * i + j) % 64 for j in range(70)]]
                                       for i in range(40)], "uint16")
        shape = {"hidden_size": 64, "num_layers": 4, "num_attention_heads": 4, "seq_length": 16,
                 "vocab_size": 256, "ffn_hidden_size": 128, "hidden_dropout": 0.0, "attention_dropout": 0.0,
                 "layernorm_epsilon": 1e-5, "init_method_std": 0.02, "tie_word_embeddings": True,
                 "gelu_approximation": "tanh"}
        one_model = write_json(os.path.join(tmp, "gpt.json"), shape)
        pipe_model = write_json(os.path.join(tmp, "gpt_pipe.json"),
                                dict(shape, parallelism={"pipeline_model_parallel_size": 2}))
        base = {"steps_per_print": 1 << 30, "train_batch_size": 16, "gradient_accumulation_steps": 4,
                "gradient_clipping": 1.0, "zero_optimization": {"stage": 1},
                "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "eps": 1e-6}},
                "scheduler": {"type": "WarmupDecayLR",
                              "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-3, "warmup_num_steps": 2,
                                         "total_num_steps": 6}}}
        ds = write_json(os.path.join(tmp, "pipe.json"), dict(base, train_micro_batch_size_per_gpu=2))
        # One data rank: the same global batch of 16 in micro-batches of 4.
        ds_one = write_json(os.path.join(tmp, "one.json"), dict(base, train_micro_batch_size_per_gpu=4))
        common = ["--data-path", prefix, "--log-interval", "1", "--seed", "11"]
        ck = os.path.join(tmp, "ck")

        job.model = pipe_model
        rc, log_full = job.run("--deepspeed_config", ds, *common, "--train-iters", "6", ranks=4)
        full = lines(log_full)
        check("pipeline 2 x data 2 trains 6 steps in one go", rc == 0 and len(full) == 6, log_full)
        rc, log_a = job.run("--deepspeed_config", ds, *common, "--train-iters", "3", "--save", ck, ranks=4)
        tag = os.path.join(ck, "global_step3")
        check("--save after 3 steps writes the pipeline layout (layer files, latest)",
              rc == 0 and os.path.isfile(os.path.join(tag, "layer_01-model_states.pt"))
              and os.path.isfile(os.path.join(tag, "mp_rank_01_model_states.pt"))
              and open(os.path.join(ck, "latest")).read().strip() == "global_step3"
              and f"saved {ck}/global_step3" in log_a, log_a)
        check("its steps 1-3 are the uninterrupted run's", lines(log_a) == full[:3], log_a)
        rc, log_b = job.run("--deepspeed_config", ds, *common, "--train-iters", "6", "--load", ck, ranks=4)
        check("--load resumes at step 3", rc == 0 and f"resumed from {tag} at step 3" in log_b, log_b)
        check("steps 4-6 print the uninterrupted run's loss, lr, grad norm and loss scale",
              lines(log_b) == full[3:], "\n".join(lines(log_b)) + "\n---\n" + "\n".join(full[3:]))

        # --save-interval: the tags of steps 3 and 6, the end not saved twice.
        ck2 = os.path.join(tmp, "ck2")
        rc, log_i = job.run("--deepspeed_config", ds, *common, "--train-iters", "6", "--save", ck2,
                            "--save-interval", "3", ranks=4)
        check("--save-interval 3 of 6 steps saves global_step3 and global_step6 once each",
              rc == 0 and log_i.count("saved ") == 2 and os.path.isdir(os.path.join(ck2, "global_step3"))
              and os.path.isdir(os.path.join(ck2, "global_step6")) and lines(log_i) == full, log_i)
        rc, log_f = job.run("--deepspeed_config", ds, *common, "--train-iters", "6", "--load", ck2, ranks=4)
        check("resumed at its last step: says it is finished", rc == 0 and "[train_gpt] finished" in log_f, log_f)

        ref = steps(log_full)
        for name, model, ranks, extra in (("2 stages x data 1", pipe_model, 2, []),
                                          ("one rank without a pipeline", one_model, 1, ["--seed-layers"])):
            job.model = model
            rc, log_o = job.run("--deepspeed_config", ds_one, *common, "--train-iters", "6", "--load", ck, *extra,
                                ranks=ranks)
            got = steps(log_o)
            ok = rc == 0 and [s["step"] for s in got] == [4, 5, 6]
            worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(ref[3:], got)) if ok else 1
            check(f"the 2 x 2 checkpoint loaded on {name}: steps 4-6 within 1e-5 (worst {worst:.1e}), lr as printed",
                  ok and worst <= 1e-5 and [a["lr"] for a in ref[3:]] == [b["lr"] for b in got], log_o)

        moe = dict(shape, num_layers=2, ffn_hidden_size=None, num_experts=4, moe_router_topk=2,
                   moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=64,
                   moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
                   moe_aux_loss_coeff=0.01, gelu_approximation="none",
                   parallelism={"pipeline_model_parallel_size": 2, "expert_model_parallel_size": 2})
        del moe["ffn_hidden_size"]
        job.model = write_json(os.path.join(tmp, "moe_pipe.json"), moe)
        ck3 = os.path.join(tmp, "ck3")

        rc, log_mf = job.run("--deepspeed_config", ds, *common, "--train-iters", "6", ranks=4)
        mfull = lines(log_mf)
        rc2, log_ma = job.run("--deepspeed_config", ds, *common, "--train-iters", "3", "--save", ck3, ranks=4)
        check("MoE at ep 2 on 2 x 2: trains, saves DeepSpeed's MoE pipeline files",
              rc == 0 and rc2 == 0 and len(mfull) == 6 and "aux loss" in mfull[0]
              and os.path.isfile(os.path.join(ck3, "global_step3", "layer_0_expert_3_mp_rank_01_model_states.pt")),
              log_mf + "\n---\n" + log_ma)
        rc, log_mb = job.run("--deepspeed_config", ds, *common, "--train-iters", "6", "--load", ck3, ranks=4)
        check("MoE at ep 2: steps 4-6 print the uninterrupted run's lines (aux loss, load balance too)",
              rc == 0 and lines(log_mb) == mfull[3:], "\n".join(lines(log_mb)) + "\n---\n" + "\n".join(mfull[3:]))
    if FAILED:
        print("FAILED:", FAILED)
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
