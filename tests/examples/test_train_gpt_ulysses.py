"""train_gpt with DeepSpeed-Ulysses sequence parallelism trains as train_gpt on one rank.

Tiny GPTs at seq 16, fp32, gradient accumulation 2, clipping 1.0, the same global batch (8
sequences a step) as one rank, through the launcher on CPU ranks (Gloo's all-to-all):
- tensor 2 (with Megatron's sequence parallelism) x sequence 2 at ZeRO 2;
- sequence 2 (the ds_config's sequence_parallel_size) at ZeRO 1; sequence 2 x data 2 at ZeRO 2
  (with the tiled loss and checkpointed blocks) and at ZeRO 3; sequence 4 (the model config's parallelism.sequence_parallel_size) at ZeRO 2;
  sequence 2 x data 2 for a Llama-style GPT (RMSNorm, rotary positions, SwiGLU, 4 query heads
  sharing 2 key/value heads) at ZeRO 1, under Megatron's name (context_parallel_size with
  cp_comm_type "a2a");
- every step's logged loss equals one rank's within 1e-5 relative, its lr and grad norm as one
  rank's (printed to 3 decimals); the start-up line names the layout;
- the final weights, saved by each run (DeepSpeed's layout), equal one rank's within 1e-5;
- an MoE GPT (aux loss, z loss, expert bias) at sequence 2 x data 2, its router counting over
  the sequence group, as data 2 without sequence parallelism (whose aux losses are each data
  rank's, as DeepSpeed's), also with its experts split 2 ways over the data x sequence ranks,
  and with the sequence-wise aux loss (seq_aux_loss);
- a pipeline of 2 stages x sequence 2 (ZeRO 1), and of 2 stages x tensor 2 x sequence 2, as one
  rank;
- the tiled loss (tiled_logits_loss_shards; at ZeRO 3 too, the layers' head) and the tiled MLP
  (tiled_mlp_shards; in checkpointed blocks at ZeRO 3; SwiGLU) under sequence parallelism as
  the untiled one rank;
- a run saved at sequence 2 resumes at sequence 1 (one rank) and at sequence 4, each going on as
  the run that was not stopped;
- DeepSpeed's uneven split of heads where the degree does not divide them: a 6-head GPT at
  tensor 2 x sequence 2 (ZeRO 2) and a Llama-style GPT of 6 query heads in 3 key/value groups at
  sequence 2 (ZeRO 1), each as one rank;
- refused by name: fewer heads than the degree, ring attention (cp_comm_type
  "p2p"), a degree that does not divide the ranks, the tiled loss in a pipeline.
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_train_gpt_flags import Job, check, megatron_format, summary, write_json  # noqa: E402
from test_train_gpt_pipeline import steps  # noqa: E402

import torch  # noqa: E402


def weights(zero_to_fp32, folder):
    """The fp32 weights of the newest checkpoint in `folder` (zero_to_fp32's consolidation, any
    ZeRO stage), by name, as float64."""
    out = folder + ".fp32.pt"
    subprocess.run([zero_to_fp32, folder, out], check=True, capture_output=True)
    return {k: v.double() for k, v in torch.load(out, map_location="cpu").items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    ap.add_argument("--zero-to-fp32", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(args.launcher, args.train_gpt, tmp)
        prefix = os.path.join(tmp, "tokens")
        megatron_format.write(prefix, [[[(5 * i + 3 * j) % 128 for j in range(70)]]
                                       for i in range(40)], "uint16")
        gpt = {"hidden_size": 64, "num_layers": 2, "num_attention_heads": 4, "seq_length": 16,
               "vocab_size": 256, "hidden_dropout": 0.0, "attention_dropout": 0.0,
               "tie_word_embeddings": True}
        llama = dict(gpt, normalization="RMSNorm", position_embedding_type="rope", swiglu=True,
                     add_bias_linear=False, num_query_groups=2, tie_word_embeddings=False)
        base = {"steps_per_print": 1 << 30, "train_batch_size": 8, "gradient_accumulation_steps": 2,
                "gradient_clipping": 1.0,
                "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "eps": 1e-6}}}
        common = ["--data-path", prefix, "--train-iters", "5", "--log-interval", "1", "--seed", "7"]

        def config(name, **keys):
            return write_json(os.path.join(tmp, name + ".json"), dict(base, **keys))

        def model(name, shape, **parallelism):
            return write_json(os.path.join(tmp, name + ".json"),
                              dict(shape, parallelism=parallelism) if parallelism else shape)

        def run(name, model_path, ds, ranks, *flags):
            job.model = model_path
            save = os.path.join(tmp, "save-" + name)
            rc, log = job.run("--deepspeed_config", ds, *common, "--save", save, "--save-interval", "5",
                              *flags, ranks=ranks)
            check(name + ": trains 5 steps", rc == 0 and len(steps(log)) == 5, log)
            return log, save

        def same(name, ref, log, ref_save, save, against="one rank's"):
            got = steps(log)
            if len(ref) != 5 or len(got) != 5:
                return
            worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(ref, got))
            check(f"{name}: losses as {against} within 1e-5 relative (worst {worst:.2e})", worst <= 1e-5,
                  log)
            check(f"{name}: lr and grad norm as {against}",
                  [(a["lr"], a["norm"]) for a in ref] == [(b["lr"], b["norm"]) for b in got], log)
            w1, w2 = weights(args.zero_to_fp32, ref_save), weights(args.zero_to_fp32, save)
            check(name + ": the same weights are saved", sorted(w1) == sorted(w2), f"{sorted(w1)} {sorted(w2)}")
            if sorted(w1) == sorted(w2):
                # Absolute: Adam moves a weight by about lr whatever its gradient's size, so the
                # sums' order (another reduction tree) shows as a few ulps of the step, not of w.
                diff = max((w1[k] - w2[k]).abs().max().item() for k in w1)
                check(f"{name}: the saved weights are {against} within 1e-5 (worst {diff:.2e})", diff <= 1e-5,
                      log)

        z1, z2, z3 = (config(f"z{s}", zero_optimization={"stage": s}) for s in (1, 2, 3))
        sp2 = {s: config(f"sp2-z{s}", zero_optimization={"stage": s}, sequence_parallel_size=2)
               for s in (1, 2, 3)}
        log_gpt, save_gpt = run("one rank, GPT", model("gpt", gpt), z1, 1)
        ref_gpt = steps(log_gpt)

        log, save = run("sequence 2, ZeRO 1", model("gpt", gpt), sp2[1], 2)
        check("sequence 2: the start-up line names the layout",
              "DeepSpeed-Ulysses: sequence parallel 2 x data 1; each rank 8 tokens" in log
              and "global batch 8 = 4 x 2 x 1" in log, log)
        same("sequence 2, ZeRO 1", ref_gpt, log, save_gpt, save)
        # (ZeRO 2 at sequence 2 x data 2 below, with the tiled loss and checkpointed blocks)
        log, save = run("sequence 2 x data 2, ZeRO 3", model("gpt", gpt), sp2[3], 4)
        check("sequence 2 x data 2, ZeRO 3: the start-up line names the layout",
              "sequence parallel 2 x data 2" in log and "global batch 8 = 2 x 2 x 2" in log, log)
        same("sequence 2 x data 2, ZeRO 3", ref_gpt, log, save_gpt, save)
        log, save = run("sequence 4 (model config), ZeRO 2", model("gpt-sp4", gpt, sequence_parallel_size=4), z2, 4)
        same("sequence 4 (model config), ZeRO 2", ref_gpt, log, save_gpt, save)

        # The tiled loss (the logits in 4 tiles of tokens) in the GPT module's checkpointed
        # blocks with the ds_config's options (one segment; the saved inputs on the host, which
        # CPU tensors already are), under sequence 2 x data 2.
        log, save = run("sequence 2 x data 2, tiled loss, checkpointed (ds_config options), ZeRO 2",
                        model("gpt-tiled-ckpt", dict(gpt, tiled_logits_loss_shards=4, checkpoint_activations=True)),
                        config("sp2-z2-ckpt", zero_optimization={"stage": 2}, sequence_parallel_size=2,
                               activation_checkpointing={"cpu_checkpointing": True, "number_checkpoints": 1}),
                        4)
        same("sequence 2 x data 2, tiled loss, checkpointed (ds_config options), ZeRO 2", ref_gpt, log, save_gpt,
             save)

        # The tiled MLP (4 tiles of the sequence) in checkpointed blocks and the tiled loss (3 tiles)
        # at ZeRO 3: the layers' form, its head layer's loss with the head gathered as a layer.
        # Its checkpointed layers take the ds_config's options (profile: a line per checkpoint).
        log, save = run("sequence 2 x data 2, tiled MLP and loss, checkpointed blocks, ZeRO 3",
                        model("gpt-tiled-mlp", dict(gpt, tiled_mlp_shards=4, tiled_logits_loss_shards=3,
                                                    checkpoint_activations=True)),
                        config("sp2-z3-ckpt", zero_optimization={"stage": 3}, sequence_parallel_size=2,
                               activation_checkpointing={"cpu_checkpointing": True, "profile": True}), 4)
        check("ZeRO 3's checkpointed layers take the ds_config's activation_checkpointing options",
              "dscpp: activation checkpoint forward:" in log, log)
        same("sequence 2 x data 2, tiled MLP and loss, checkpointed blocks, ZeRO 3", ref_gpt, log, save_gpt, save)

        # Tensor 2 (Megatron's sequence parallelism on) x sequence 2: each tensor rank's 2 heads
        # split over the sequence ranks, the engine's group the 2 sequence ranks of a tensor rank.
        for stage in (2,):
            log, save = run(f"tensor 2 x sequence 2, ZeRO {stage}",
                            model("gpt-t2s2", gpt, tensor_model_parallel_size=2, sequence_parallel=True,
                                  sequence_parallel_size=2), config(f"z{stage}-t2s2", zero_optimization={"stage": stage}), 4)
            check(f"tensor 2 x sequence 2, ZeRO {stage}: the start-up line names the layout",
                  "tensor parallel 2 x data 1" in log and "sequence parallel 2 x data 1" in log, log)
            same(f"tensor 2 x sequence 2, ZeRO {stage}", ref_gpt, log, save_gpt, save)

        # DeepSpeed's uneven split of heads: 6 heads, 3 a tensor rank, on 2 sequence ranks (2 and
        # 1); 6 query heads in 3 key/value groups on 2 sequence ranks (4 heads in 2 groups, then
        # 2 in 1), against one rank of each.
        gpt6 = dict(gpt, hidden_size=48, num_attention_heads=6)
        log_gpt6, save_gpt6 = run("one rank, 6 heads", model("gpt6", gpt6), z1, 1)
        log, save = run("6 heads, tensor 2 x sequence 2 (uneven), ZeRO 2",
                        model("gpt6-t2s2", gpt6, tensor_model_parallel_size=2, sequence_parallel=True,
                              sequence_parallel_size=2), z2, 4)
        same("6 heads, tensor 2 x sequence 2 (uneven), ZeRO 2", steps(log_gpt6), log, save_gpt6, save)
        gqa6 = dict(llama, hidden_size=48, num_attention_heads=6, num_query_groups=3)
        log_gqa6, save_gqa6 = run("one rank, 6 heads in 3 groups", model("gqa6", gqa6), z1, 1)
        log, save = run("6 heads in 3 groups, sequence 2 (uneven), ZeRO 1",
                        model("gqa6-sp2", gqa6, sequence_parallel_size=2), z1, 2)
        same("6 heads in 3 groups, sequence 2 (uneven), ZeRO 1", steps(log_gqa6), log, save_gqa6, save)

        # A pipeline of 2 stages, each with sequence 2 (the sequence ranks inside its data group),
        # against one rank whose layers are seeded as a pipeline seeds them.
        log_seeded, save_seeded = run("one rank, seeded layers", model("gpt", gpt), z1, 1, "--seed-layers")
        log, save = run("pipeline 2 x sequence 2, ZeRO 1", model("gpt", gpt),
                        config("pp2-sp2", zero_optimization={"stage": 1}, sequence_parallel_size=2,
                               pipeline={"stages": 2}), 4)
        check("pipeline 2 x sequence 2: the start-up line names the layout",
              "pipeline 2 stages" in log and "DeepSpeed-Ulysses sequence 2" in log, log)
        same("pipeline 2 x sequence 2, ZeRO 1", steps(log_seeded), log, save_seeded, save)
        # All three: each stage's tensor rank pair splits its 2 heads' sequences over 2 ranks.
        log, save = run("pipeline 2 x tensor 2 x sequence 2, ZeRO 1", model("gpt-t2", gpt, tensor_model_parallel_size=2),
                        config("pp2-t2-sp2", zero_optimization={"stage": 1}, sequence_parallel_size=2,
                               pipeline={"stages": 2}), 8)
        check("pipeline 2 x tensor 2 x sequence 2: the start-up line names the layout",
              "pipeline 2 stages" in log and "x tensor 2 x DeepSpeed-Ulysses sequence 2" in log, log)
        same("pipeline 2 x tensor 2 x sequence 2, ZeRO 1", steps(log_seeded), log, save_seeded, save)

        log_llama, save_llama = run("one rank, Llama-style", model("llama", llama), z1, 1)
        log, save = run("Llama-style, context 2 (a2a) x data 2, ZeRO 1",
                        model("llama-cp2", llama, context_parallel_size=2, cp_comm_type="a2a"), z1, 4)
        same("Llama-style, context 2 (a2a) x data 2, ZeRO 1", steps(log_llama), log, save_llama, save)
        log, save = run("Llama-style, sequence 2, tiled MLP and loss, ZeRO 2",
                        model("llama-tiled", dict(llama, tiled_mlp_shards=2, tiled_logits_loss_shards=3),
                              sequence_parallel_size=2), z2, 2)
        same("Llama-style, sequence 2, tiled MLP and loss, ZeRO 2", steps(log_llama), log, save_llama, save)

        # An MoE GPT (the Llama-style blocks, every other one 4 experts top-2 with a shared
        # expert, sigmoid scores, the aux and z losses and the expert bias): the router counts
        # over the sequence group, so its balancing is the whole sequences'. Its reference is
        # data 2 without sequence parallelism: the aux losses are each data rank's micro-batch's
        # (DeepSpeed's), not one rank's whole batch's.
        moe = dict(llama, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32, moe_layer_freq=2,
                   moe_shared_expert_intermediate_size=32, moe_router_score_function="sigmoid",
                   moe_router_enable_expert_bias=True, moe_router_bias_update_rate=0.001,
                   moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.01, moe_z_loss_coeff=0.001)
        log_moe, save_moe = run("data 2, MoE", model("moe", moe), z2, 2)
        log, save = run("MoE, sequence 2 x data 2, ZeRO 2", model("moe-sp2", moe, sequence_parallel_size=2), z2, 4)
        same("MoE, sequence 2 x data 2, ZeRO 2", steps(log_moe), log, save_moe, save, "data 2's")
        # Expert parallelism 2 over the data x sequence ranks: the experts' tokens are slices.
        log, save = run("MoE, experts 2, sequence 2 x data 2, ZeRO 2",
                        model("moe-ep2-sp2", moe, sequence_parallel_size=2, expert_model_parallel_size=2), z2, 4)
        same("MoE, experts 2, sequence 2 x data 2, ZeRO 2", steps(log_moe), log, save_moe, save, "data 2's")
        # The sequence-wise aux loss: each sequence's counts summed over its slices' ranks.
        seq_moe = dict(moe, moe_router_load_balancing_type="seq_aux_loss")
        log_seq, save_seq = run("data 2, MoE, seq_aux_loss", model("moe-seq", seq_moe), z2, 2)
        log, save = run("MoE seq_aux_loss, sequence 2 x data 2, ZeRO 2",
                        model("moe-seq-sp2", seq_moe, sequence_parallel_size=2), z2, 4)
        same("MoE seq_aux_loss, sequence 2 x data 2, ZeRO 2", steps(log_seq), log, save_seq, save, "data 2's")

        # Resume: 3 steps at sequence 2, then the rest at sequence 1 and at sequence 4.
        job.model = model("gpt", gpt)
        stopped = os.path.join(tmp, "stopped")
        rc, log = job.run("--deepspeed_config", sp2[2], "--data-path", prefix, "--train-iters", "3",
                          "--log-interval", "1", "--seed", "7", "--save", stopped, "--save-interval", "3", ranks=2)
        check("sequence 2 saves at step 3", rc == 0 and os.path.exists(os.path.join(stopped, "latest")), log)
        for name, ds, ranks in (("sequence 1", z2, 1), ("sequence 4", config("sp4-z2", zero_optimization={"stage": 2},
                                                                           sequence_parallel_size=4), 4)):
            rc, log = job.run("--deepspeed_config", ds, *common, "--load", stopped, ranks=ranks)
            got = steps(log)
            ok = rc == 0 and len(got) == 2 and len(ref_gpt) == 5
            check(f"resumed at {name}: steps 4-5", ok, log)
            if ok:
                worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(ref_gpt[3:], got))
                check(f"resumed at {name}: steps 4-5 as the run not stopped (worst {worst:.2e})", worst <= 1e-5, log)

        # Refusals, by name.
        rc, log = job.run("--deepspeed_config", config("sp3", sequence_parallel_size=3), *common, ranks=2)
        check("a degree that does not divide the ranks is refused",
              rc != 0 and "sequence_parallel_size" in log and "does not divide" in log, log)
        job.model = model("gpt-h3", dict(gpt, num_attention_heads=2, hidden_size=64))
        rc, log = job.run("--deepspeed_config", config("sp4", sequence_parallel_size=4), *common, ranks=4)
        check("fewer heads than the degree are refused (as DeepSpeed refuses them)",
              rc != 0 and "num_attention_heads" in log and "expected at least 4, found 2" in log, log)
        job.model = model("gpt-tiled", dict(gpt, tiled_logits_loss_shards=4))
        rc, log = job.run("--deepspeed_config", config("pipe2", pipeline={"stages": 2}), *common, ranks=2)
        check("the tiled loss in a pipeline is refused by name",
              rc != 0 and "tiled_logits_loss_shards" in log and "expected 1, found 4" in log, log)
        job.model = model("gpt-ring", gpt, context_parallel_size=2)
        rc, log = job.run("--deepspeed_config", z1, *common, ranks=2)
        check("ring attention is refused by name", rc != 0 and "ring attention" in log and "cp_comm_type" in log, log)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
