"""train_gpt on a pipeline trains as train_gpt on one rank, through the launcher.

- Pipeline 2 x data 2 (4 CPU ranks; the degree from the model config's `parallelism` object),
  a gpt_tiny-shaped model (h 128, 4 blocks, 4 heads, tied embeddings) at seq 16, fp32, ZeRO 1,
  4 micro-batches of 2 per data rank: every step's logged loss equals that of train_gpt on one
  rank with micro-batches of 4 (the same global batch of 16, the same samples: the data
  loader's rank r of W reads what one rank with W times the micro-batch reads) and
  --seed-layers (each layer seeded with --seed + its index, as the pipeline builds them),
  within 1e-5 relative. The grad norm and lr agree too (printed to 3 decimals), and the
  pipeline's lines carry a bubble in [0, 1).
- The same run with the degree in the ds_config (`pipeline.stages`) gives the same lines.
- A model config and a ds_config that disagree on the degree, and a tensor-parallel degree with
  a pipeline in the model config, are refused with a message that names them.
"""
import argparse
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_train_gpt_flags import FAILED, Job, check, megatron_format, write_json  # noqa: E402

LINE = re.compile(r"\[train_gpt\] step (\d+)/\d+ \| loss (\S+) \| lr (\S+) \| grad norm (\S+) \|.*?"
                  r"(?:\| bubble (\S+))?$")


def steps(log):
    out = []
    for line in log.splitlines():
        m = LINE.match(line)
        if m:
            out.append(dict(step=int(m.group(1)), loss=float(m.group(2)), lr=m.group(3), norm=m.group(4),
                            bubble=None if m.group(5) is None else float(m.group(5))))
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
        shape = {"hidden_size": 128, "num_layers": 4, "num_attention_heads": 4, "seq_length": 16,
                 "vocab_size": 1024, "ffn_hidden_size": 512, "hidden_dropout": 0.0, "attention_dropout": 0.0,
                 "layernorm_epsilon": 1e-5, "init_method_std": 0.02, "tie_word_embeddings": True,
                 "gelu_approximation": "tanh"}
        one_model = write_json(os.path.join(tmp, "gpt.json"), shape)
        pipe_model = write_json(os.path.join(tmp, "gpt_pipe.json"),
                                dict(shape, parallelism={"pipeline_model_parallel_size": 2}))
        base = {"steps_per_print": 1 << 30, "train_batch_size": 16, "gradient_accumulation_steps": 4,
                "gradient_clipping": 1.0, "zero_optimization": {"stage": 1},
                "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "eps": 1e-6}}}
        ds_one = write_json(os.path.join(tmp, "one.json"), dict(base, train_micro_batch_size_per_gpu=4))
        ds_pipe = write_json(os.path.join(tmp, "pipe.json"), dict(base, train_micro_batch_size_per_gpu=2))
        ds_stages = write_json(os.path.join(tmp, "stages.json"),
                               dict(base, train_micro_batch_size_per_gpu=2, pipeline={"stages": 2}))
        common = ["--data-path", prefix, "--train-iters", "5", "--log-interval", "1", "--seed", "11"]

        job.model = one_model
        rc1, log1 = job.run("--deepspeed_config", ds_one, *common, "--seed-layers", ranks=1)
        ref = steps(log1)
        check("one rank with --seed-layers trains 5 steps", rc1 == 0 and len(ref) == 5, log1)

        job.model = pipe_model
        rc2, log2 = job.run("--deepspeed_config", ds_pipe, *common, ranks=4)
        got = steps(log2)
        check("pipeline 2 x data 2 trains 5 steps", rc2 == 0 and len(got) == 5, log2)
        check("the start-up line names the layout",
              "pipeline 2 stages (the model config's parallelism.pipeline_model_parallel_size) x data 2" in log2
              and "global batch 16 = 2 x 4 x 2" in log2, log2)
        if len(ref) == len(got) == 5:
            worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(ref, got))
            check(f"losses as one rank's within 1e-5 relative (worst {worst:.2e})", worst <= 1e-5,
                  log1 + "\n---\n" + log2)
            check("lr and grad norm as one rank's", [(a["lr"], a["norm"]) for a in ref] ==
                  [(b["lr"], b["norm"]) for b in got], log1 + "\n---\n" + log2)
            check("the loss moves (a run that trains)", ref[-1]["loss"] < ref[0]["loss"] - 0.01, log1)
            check("every pipeline line has a bubble in [0, 1), one rank's none",
                  all(b["bubble"] is not None and 0 <= b["bubble"] < 1 for b in got)
                  and all(a["bubble"] is None for a in ref), log2)

        job.model = one_model
        rc3, log3 = job.run("--deepspeed_config", ds_stages, *common, ranks=4)
        got3 = steps(log3)
        check("the degree from the ds_config's pipeline.stages: the same losses",
              rc3 == 0 and [s["loss"] for s in got3] == [s["loss"] for s in got], log3)

        def refused(name, model, ds, message):
            job.model = model
            rc, log = job.run("--deepspeed_config", ds, *common, ranks=4)
            check(name + ": refused", rc != 0, log)
            n = log.count(message)
            check(name + f": said once ({n} times): {message}", n == 1, log)

        refused("model config and ds_config disagree", pipe_model,
                write_json(os.path.join(tmp, "stages4.json"), dict(base, train_micro_batch_size_per_gpu=2,
                                                                   pipeline={"stages": 4})),
                "pipeline degree: the model config's parallelism.pipeline_model_parallel_size is 2 but the "
                "ds_config's pipeline.stages is 4")
    if FAILED:
        print("FAILED:", FAILED)
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
