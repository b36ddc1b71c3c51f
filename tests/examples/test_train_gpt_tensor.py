"""train_gpt with a tensor-parallel degree trains as train_gpt on one rank, through the launcher.

- Tensor 2 (2 CPU ranks, --tensor-model-parallel-size 2) and tensor 2 x data 2 with sequence
  parallelism (4 CPU ranks; the degree and sequence_parallel from the model config's
  `parallelism` object), a tiny GPT (h 64, 2 blocks, 4 heads, tied embeddings) at seq 16, fp32,
  ZeRO 1 and 2, gradient accumulation 2, clipping 1.0: every step's logged loss equals that of
  train_gpt on one rank with the same global batch (micro-batches 4 x GA 2 = 8) within 1e-5
  relative, the grad norm and lr as one rank's (printed to 3 decimals), and the start-up line
  names the layout.
- Muon (both ns_methods; gram also with offload_optimizer cpu) at tensor 2 x data 2, ZeRO 2,
  against Muon on one rank: the split
  matrices are orthogonalised whole; its checkpoint resumes at tensor 2 x data 2 exactly and
  on one rank.
- --stage3: instead, tensor 2 x data 2 with sequence parallelism at ZeRO 3 (overlap_comm)
  against the same one-rank run.
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_train_gpt_flags import FAILED, Job, check, megatron_format, write_json  # noqa: E402
from test_train_gpt_pipeline import steps  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    ap.add_argument("--stage3", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(args.launcher, args.train_gpt, tmp)
        prefix = os.path.join(tmp, "tokens")
        megatron_format.write(prefix, [[[(5 * i + 3 * j) % 128 for j in range(70)]]
                                       for i in range(40)], "uint16")
        shape = {"hidden_size": 64, "num_layers": 2, "num_attention_heads": 4, "seq_length": 16,
                 "vocab_size": 256, "hidden_dropout": 0.0, "attention_dropout": 0.0,
                 "tie_word_embeddings": True}
        one_model = write_json(os.path.join(tmp, "gpt.json"), shape)
        tp_model = write_json(os.path.join(tmp, "gpt_tp.json"),
                              dict(shape, parallelism={"tensor_model_parallel_size": 2,
                                                       "sequence_parallel": True}))
        base = {"steps_per_print": 1 << 30, "train_batch_size": 8, "gradient_accumulation_steps": 2,
                "gradient_clipping": 1.0,
                "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01, "eps": 1e-6}}}
        common = ["--data-path", prefix, "--train-iters", "5", "--log-interval", "1", "--seed", "7"]

        job.model = one_model
        rc1, log1 = job.run("--deepspeed_config", write_json(os.path.join(tmp, "one.json"), base), *common,
                            ranks=1)
        ref = steps(log1)
        check("one rank trains 5 steps", rc1 == 0 and len(ref) == 5, log1)

        def same(name, log):
            got = steps(log)
            if len(ref) != 5 or len(got) != 5:
                check(name + ": 5 steps", False, log)
                return
            worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(ref, got))
            check(f"{name}: losses as one rank's within 1e-5 relative (worst {worst:.2e})", worst <= 1e-5,
                  log1 + "\n---\n" + log)
            check(name + ": lr and grad norm as one rank's",
                  [(a["lr"], a["norm"]) for a in ref] == [(b["lr"], b["norm"]) for b in got],
                  log1 + "\n---\n" + log)

        if args.stage3:
            job.model = tp_model
            rc, log = job.run("--deepspeed_config",
                              write_json(os.path.join(tmp, "z3.json"),
                                         dict(base, zero_optimization={"stage": 3, "overlap_comm": True})),
                              *common, ranks=4)
            check("tensor 2 x data 2 at ZeRO 3 trains", rc == 0, log)
            check("tensor 2 x data 2 at ZeRO 3: the start-up line names the layout",
                  "ZeRO stage 3" in log and "tensor parallel 2 x data 2, sequence parallel" in log, log)
            same("tensor 2 x data 2, sequence parallel, ZeRO 3", log)
            return finish()

        rc2, log2 = job.run("--deepspeed_config",
                            write_json(os.path.join(tmp, "z1.json"), dict(base, zero_optimization={"stage": 1})),
                            *common, "--tensor-model-parallel-size", "2", ranks=2)
        check("tensor 2 trains", rc2 == 0, log2)
        check("tensor 2: the start-up line names the layout", "tensor parallel 2 x data 1" in log2, log2)
        same("tensor 2 (--tensor-model-parallel-size)", log2)

        job.model = tp_model
        rc3, log3 = job.run("--deepspeed_config",
                            write_json(os.path.join(tmp, "z2.json"),
                                       dict(base, zero_optimization={"stage": 2, "overlap_comm": True})),
                            *common, ranks=4)
        check("tensor 2 x data 2 with sequence parallelism trains", rc3 == 0, log3)
        check("tensor 2 x data 2: the start-up line names the layout",
              "tensor parallel 2 x data 2, sequence parallel" in log3 and "global batch 8 = 2 x 2 x 2" in log3, log3)
        same("tensor 2 x data 2, sequence parallel (model config)", log3)

        # Muon: each split matrix gathered over the model group and orthogonalised whole, as one
        # rank orthogonalises it (both ns_methods; the embedding and the norms take the Adam half).
        for method in ("gram", "standard"):
            muon = dict(base, optimizer={"type": "Muon", "params": {"lr": 0.02, "adam_lr": 3e-3,
                                                                    "weight_decay": 0.01, "ns_method": method}})
            job.model = one_model
            rc, log_one = job.run("--deepspeed_config", write_json(os.path.join(tmp, f"muon-{method}.json"),
                                                                   dict(muon, zero_optimization={"stage": 1})),
                                  *common, ranks=1)
            ref = steps(log_one)
            check(f"Muon ({method}), one rank: trains 5 steps", rc == 0 and len(ref) == 5, log_one)
            job.model = tp_model
            rc, log = job.run("--deepspeed_config",
                              write_json(os.path.join(tmp, f"muon-{method}-z2.json"),
                                         dict(muon, zero_optimization={"stage": 2})), *common, ranks=4)
            check(f"Muon ({method}), tensor 2 x data 2, ZeRO 2: trains", rc == 0, log)
            # Newton-Schulz magnifies the last bits in which the model ranks' gradients differ
            # from one rank's (another order of the same sums): the losses agree within 1e-4
            # (2.4e-5 measured), where orthogonalising each slice alone is 1.6e-3 off by step 2.
            got = steps(log)
            ok = rc == 0 and len(got) == 5 and len(ref) == 5
            worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(ref, got)) if ok else 1
            check(f"Muon ({method}), tensor 2 x data 2, ZeRO 2: losses as one rank's within 1e-4 relative "
                  f"(worst {worst:.2e})", worst <= 1e-4, log_one + "\n---\n" + log)
            # (the norms printed to 3 decimals: their rounding, and 5e-3 relative: bf16's Newton-Schulz
            # moved a norm by 1.7e-3 relative by step 4)
            check(f"Muon ({method}), tensor 2 x data 2, ZeRO 2: grad norms as one rank's within 5e-3 relative",
                  ok and all(abs(float(a["norm"]) - float(b["norm"])) <= 1e-3 + 5e-3 * float(a["norm"])
                             for a, b in zip(ref, got)),
                  str([(a["norm"], b["norm"]) for a, b in zip(ref, got)]) + "\n" + log_one + "\n---\n" + log)
            if method != "gram":
                continue
            # Under ZeRO-Offload (the master, the momentum and the gradients on the host, each
            # matrix's update computed where training runs) the same numbers.
            rc, log_off = job.run("--deepspeed_config",
                                  write_json(os.path.join(tmp, "muon-offload.json"),
                                             dict(muon, zero_optimization={
                                                 "stage": 2, "offload_optimizer": {"device": "cpu"}})),
                                  *common, ranks=4)
            off = steps(log_off)
            ok = rc == 0 and len(off) == 5
            worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(ref, off)) if ok else 1
            check(f"Muon, tensor 2 x data 2, ZeRO 2 with offload_optimizer cpu: losses as one rank's within "
                  f"1e-4 relative (worst {worst:.2e})", worst <= 1e-4, log_one + "\n---\n" + log_off)
            # Marin's MuonH: data 2, and tensor 2 x data 2 (each split matrix stepped whole, the
            # hyperball's norms the whole matrix's), at ZeRO 2 as one rank.
            muonh = dict(base, optimizer={"type": "MuonH", "params": {"lr": 0.02, "adam_lr": 3e-3}})
            job.model = one_model
            rc, log_h1 = job.run("--deepspeed_config", write_json(os.path.join(tmp, "muonh-z1.json"),
                                                                  dict(muonh, zero_optimization={"stage": 1})),
                                 *common, ranks=1)
            rc2, log_h2 = job.run("--deepspeed_config", write_json(os.path.join(tmp, "muonh-z2.json"),
                                                                   dict(muonh, zero_optimization={"stage": 2})),
                                  *common, ranks=2)
            h1, h2 = steps(log_h1), steps(log_h2)
            ok = rc == 0 and rc2 == 0 and len(h1) == 5 and len(h2) == 5
            worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(h1, h2)) if ok else 1
            check(f"MuonH, data 2 at ZeRO 2: losses as one rank's within 1e-4 relative (worst {worst:.2e})",
                  worst <= 1e-4, log_h1 + "\n---\n" + log_h2)
            check("MuonH: the loss falls", ok and h1[-1]["loss"] < h1[0]["loss"], log_h1)
            job.model = tp_model
            rc, log = job.run("--deepspeed_config",
                              write_json(os.path.join(tmp, "muonh-tp.json"), dict(muonh, zero_optimization={"stage": 2})),
                              *common, ranks=4)
            h4 = steps(log)
            ok = ok and rc == 0 and len(h4) == 5
            worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(h1, h4)) if ok else 1
            check(f"MuonH, tensor 2 x data 2 at ZeRO 2: losses as one rank's within 1e-4 relative "
                  f"(worst {worst:.2e})", worst <= 1e-4, log_h1 + "\n---\n" + log)
            buffers = [line for line in log_off.splitlines() if "engine buffers:" in line]
            check("Muon with offload_optimizer cpu: the fp32 master is on the host",
                  bool(buffers) and "fp32_master" in buffers[0].split("host", 1)[-1], log_off)
            # Its checkpoint (the Muon momentum in DeepSpeed's mp_rank files) resumes at tensor 2
            # x data 2 as the run not stopped, and on one rank, the slices joined.
            saved = os.path.join(tmp, "muon-ckpt")
            ds = os.path.join(tmp, f"muon-{method}-z2.json")
            rc, log_save = job.run("--deepspeed_config", ds, "--data-path", prefix, "--train-iters", "3",
                                   "--log-interval", "1", "--seed", "7", "--save", saved, "--save-interval", "3",
                                   ranks=4)
            check("Muon, tensor 2 x data 2: saves at step 3", rc == 0, log_save)
            for name, model_path, ranks, tol in (("tensor 2 x data 2", tp_model, 4, 0.0),
                                                 ("one rank", one_model, 1, 1e-4)):
                job.model = model_path
                rc, log_resumed = job.run("--deepspeed_config", ds, *common, "--load", saved, ranks=ranks)
                resumed = steps(log_resumed)
                ok = rc == 0 and len(resumed) == 2 and len(got) == 5
                worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(got[3:], resumed)) if ok else 1
                check(f"Muon, resumed at {name}: steps 4-5 as the run not stopped within {tol:g} (worst {worst:.2e})",
                      ok and worst <= tol, log_resumed)
    return finish()


def finish():
    if FAILED:
        print("FAILED:", FAILED)
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
