"""train_gpt with the MoE GPT, through the launcher on CPU ranks.

model_zoo/configs/moe_tiny.yaml (hidden 64; MoE layers 0 and 2 of 4: 8 experts top-2, a shared
expert, sigmoid scores with the expert bias, aux loss 0.01 and z-loss 1e-3) trains on 1 rank and
on 2 data ranks at ZeRO 1, and on 2 ranks at ZeRO 3 (the LayerSpec form): the loss falls, each
log line carries the aux loss, the load balance and MFU on active parameters, the first step's
loss (before any update) is one rank's, and the expert biases saved in the checkpoint moved by
whole multiples of moe_router_bias_update_rate, at most one per step. A tensor degree is
refused naming moe_tiny's Llama-style normalization (the tensor-parallel GPT has GPT-2's blocks,
with or without experts: test_train_gpt_tp_moe.py trains those).
2 pipeline stages x 2 data ranks (ep 2, dropless and dropping; ep 1 dropping) train like one
rank with the same micro-batches (--seed-layers): losses, aux losses and load balance, 10 steps.
Expert parallelism (parallelism.expert_model_parallel_size 2): moe_tiny at ep 2 trains on 2 ranks
and on 4 ranks (dp 4, ep 2), 10 steps, the loss falls; saved at step 5 at ep 2 and resumed there,
steps 6-10 repeat the uninterrupted run's losses (1e-6). ep 2 = ep 1 on the same 2 ranks (the
experts drawn by their global ids), dropless and with token dropping: 10 steps, losses and every
saved weight within 1e-5; at ZeRO 3 (the LayerSpec form) the losses. bf16 on one rank: the saved
expert biases are fp32 and whole steps of the rate (a bf16 bias could not move by 1e-3 near its
values).
By default a covering set; --full adds the rest of the layouts (ctest
examples.TrainGptMoEFullMatrix, label examples_matrix): the ZeRO-3 run with AdamW (by default the
ZeRO-3 ep 1 run of the equality pair, with SGD, carries its checks: it falls, its first loss is
one rank's), the ZeRO-1 run with AdamW on 2 data ranks (by default the ep-1 dropless run of the
equality pair, with SGD, carries its checks and its checkpoint's expert biases), the pipeline
dropless (by default with token dropping, at ep 2 and ep 1: the capacity is what a pipeline's
micro-batches can change; dropless MoE pipelines at ep 2 are pipe.MoeCheckpointCovering's), and
moe_tiny at ep 2 on 4 data ranks (by default ep 2 on 2 ranks and in the pipeline's data groups;
the engine's expert-data groups of 2 on 4 ranks are checkpoint.MoeLayoutEp2's).
Last line: "N passed, M failed"; exits non-zero on any failure.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "data"))
sys.path.insert(0, os.path.dirname(HERE))  # tests/
import megatron_format  # noqa: E402
from dscpp_test_ports import free_port  # noqa: E402

passed = 0
failed = 0
STEPS = 8


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name}\n{detail[-3000:]}")


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


LINE = re.compile(r"\[train_gpt\] step (\d+)/\d+ \| loss (\S+) \|.*\| MFU (\S+) \(active parameters\)"
                  r" \| aux loss (\S+) \| load balance (\S+) \(worst (\S+), max/mean tokens per "
                  r"expert over 2 MoE layers\)")


def lines(log):
    """(step, loss, aux loss, mean balance, worst balance) of each step line."""
    return [(int(m[1]), float(m[2]), float(m[4]), float(m[5]), float(m[6]))
            for m in LINE.finditer(log)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train-gpt", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--full", action="store_true", help="every layout, not the covering set")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "tokens")
        megatron_format.write(prefix, [[[(7 * i + 3 * j) % 97 for j in range(130)]]
                                       for i in range(24)], "uint16")

        def ds(stage, micro=2, bf16=False, sgd=False, pipeline=False):
            # sgd: SGD with momentum and an active clip, for the equality runs (Adam would
            # turn the rounding noise of a near-zero gradient into whole steps). pipeline: the
            # GPT's blocks split evenly over the stages (type:GPTBlock), so that moe_tiny's
            # MoE layers 0 and 2 land on stages 0 and 1.
            optimizer = ({"type": "SGD", "params": {"lr": 0.5, "momentum": 0.9}} if sgd else
                         {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}})
            body = {"steps_per_print": 1 << 30, "zero_optimization": {"stage": stage},
                    "train_batch_size": 4, "train_micro_batch_size_per_gpu": micro,
                    "bf16": {"enabled": bf16}, "gradient_clipping": 1.0 if sgd else 0.0,
                    "optimizer": optimizer}
            if pipeline:
                body["pipeline"] = {"partition": "type:GPTBlock"}
            name = f"ds{stage}{micro}{int(bf16)}{int(sgd)}{int(pipeline)}.json"
            return write_json(os.path.join(tmp, name), body)

        def run(ranks, stage, *extra, config=args.config, micro=2, steps=STEPS, bf16=False,
                sgd=False, pipeline=False):
            cmd = [args.launcher, "--num_gpus", str(ranks), "--master_port", str(free_port()),
                   args.train_gpt, "--model-config", config, "--data-path", prefix,
                   "--deepspeed_config", ds(stage, micro, bf16, sgd, pipeline),
                   "--train-iters", str(steps),
                   "--log-interval", "1", "--seed", "11", *extra]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
            return p.returncode, p.stdout + p.stderr

        rc1, log1 = run(1, 1)
        one = lines(log1)
        check("one rank: 8 steps, each line with aux loss, load balance and active-parameter MFU",
              rc1 == 0 and [l[0] for l in one] == list(range(1, STEPS + 1)), log1)
        check("the start-up line counts total and active parameters",
              "GPT 3.54M parameters, 3.39M active (8 experts top-2 in 2 MoE layers)" in log1, log1)
        check("one rank: the loss falls", len(one) == STEPS and one[-1][1] < one[0][1] - 0.5, log1)
        check("aux loss > 0 (coefficient 0.01 and z-loss on) and balance >= 1",
              len(one) > 0 and all(l[2] > 0 and 1.0 <= l[3] <= l[4] <= 8.0 for l in one), log1)

        def two_data_ranks(rc2, log2, save, steps):
            """The checks of 2 data ranks at ZeRO 1 that saved to `save` after `steps` steps."""
            two = lines(log2)
            check("2 data ranks at ZeRO 1: all steps; the first loss is one rank's",
                  rc2 == 0 and len(two) == steps and len(one) > 0
                  and abs(two[0][1] - one[0][1]) < 2e-5, log2 + "\n---\n" + log1)
            check("2 data ranks: the loss falls", len(two) == steps and two[-1][1] < two[0][1] - 0.5,
                  log2)
            # The expert biases in the checkpoint: rate x (a sum of signs), at most one per step.
            probe = ("import torch,sys,glob\n"
                     "f=glob.glob(sys.argv[1]+'/global_step*/mp_rank_00_model_states.pt')[0]\n"
                     "sd=torch.load(f,weights_only=False)['module']\n"
                     "for k in sorted(sd):\n"
                     "  if k.endswith('expert_bias'): print(k, ' '.join(f'{v:.6f}' for v in sd[k].tolist()))\n")
            p = subprocess.run([sys.executable, "-c", probe, save], capture_output=True, text=True)
            biases = [[float(v) for v in line.split()[1:]] for line in p.stdout.splitlines()]
            names = [line.split()[0] for line in p.stdout.splitlines()]
            ok = (p.returncode == 0 and names == ["blocks.0.mlp.deepspeed_moe.gate.expert_bias",
                                                  "blocks.2.mlp.deepspeed_moe.gate.expert_bias"]
                  and all(len(b) == 8 for b in biases))
            steps_of = [[v / 1e-3 for v in b] for b in biases]
            ok = ok and all(abs(s - round(s)) < 1e-3 and abs(s) <= steps for b in steps_of for s in b)
            ok = ok and any(abs(s) > 0.5 for b in steps_of for s in b)
            check("the saved expert biases moved by whole steps of the update rate",
                  ok, p.stdout + p.stderr + log2)

        if args.full:  # by default the ep-1 runs of the equality pairs below carry these checks
            save = os.path.join(tmp, "ckpt")
            two_data_ranks(*run(2, 1, "--save", save), save, STEPS)
            rc3, log3 = run(2, 3)
            three = lines(log3)
            check("2 data ranks at ZeRO 3 (the LayerSpec form): trains with the MoE fields",
                  rc3 == 0 and len(three) == STEPS and three[-1][1] < three[0][1] - 0.5
                  and abs(three[0][1] - one[0][1]) < 2e-5, log3)

        # Expert parallelism: moe_tiny with parallelism.expert_model_parallel_size 2.
        with open(args.config) as f:
            ep2_config = os.path.join(tmp, "moe_tiny_ep2.yaml")
            with open(ep2_config, "w") as out:
                out.write(f.read() + "\nparallelism:\n  expert_model_parallel_size: 2\n")

        # ep 2 = ep 1 (the experts drawn by their global ids, nn::normal_init_experts): on the
        # same 2 ranks and batches, ep 2 must train like ep 1, losses and weights within 1e-5
        # over 10 steps (SGD with momentum, the clip active). Dropless that is also one rank's
        # model; with token dropping (capacity factor 1.0: capacity = the mean count, so a load
        # balance above 1 drops routes) the capacity is each rank's own in both, as DeepSpeed's.
        with open(args.config) as f:
            text = f.read()
        drop_config = os.path.join(tmp, "moe_tiny_drop.yaml")
        with open(drop_config, "w") as out:
            out.write(text.replace("model:\n", "model:\n  moe_expert_capacity_factor: 1.0\n", 1))
        drop_ep2_config = os.path.join(tmp, "moe_tiny_drop_ep2.yaml")
        with open(drop_ep2_config, "w") as out:
            with open(drop_config) as f:
                out.write(f.read() + "\nparallelism:\n  expert_model_parallel_size: 2\n")
        compare = ("import torch,sys,glob,os\n"
                   "def files(d):\n"
                   "  return sorted(os.path.basename(f) for f in glob.glob(d+'/global_step10/*model_states.pt'))\n"
                   "a,b=sys.argv[1],sys.argv[2]\n"
                   "assert files(a)==files(b) and len(files(a))==17, (files(a),files(b))\n"
                   "worst=0\n"
                   "for name in files(a):\n"
                   "  sa,sb=(torch.load(d+'/global_step10/'+name,weights_only=False) for d in (a,b))\n"
                   "  sa,sb=(s['module'] if 'module' in s else s for s in (sa,sb))\n"
                   "  assert sorted(sa)==sorted(sb), name\n"
                   "  for k in sa:\n"
                   "    x,y=sa[k].double(),sb[k].double()\n"
                   "    worst=max(worst,((x-y).abs().max()/y.abs().max().clamp_min(1e-30)).item())\n"
                   "print('worst', worst)\n")
        equal_runs = {}
        for label, ep1_cfg, ep2_cfg in (("dropless", args.config, ep2_config),
                                        ("dropping", drop_config, drop_ep2_config)):
            runs = []
            for cfg in (ep1_cfg, ep2_cfg):
                ck_dir = os.path.join(tmp, f"eq_{label}_{len(runs)}")
                rc_e, log_e = run(2, 1, "--save", ck_dir, config=cfg, steps=10, sgd=True)
                runs.append((rc_e, log_e, lines(log_e), ck_dir))
            (rc_a, log_a, la, ck_a), (rc_b, log_b, lb, ck_b) = runs
            if label == "dropless" and not args.full:
                # 2 data ranks at ZeRO 1 with its checkpoint (SGD rather than AdamW changes no
                # check: the first loss is before any update, the biases follow the routing).
                two_data_ranks(rc_a, log_a, ck_a, 10)
            ok = rc_a == 0 and rc_b == 0 and len(la) == 10 and len(lb) == 10
            worst_loss = max((abs(x[1] - y[1]) / abs(y[1]) for x, y in zip(lb, la)), default=1.0)
            p = subprocess.run([sys.executable, "-c", compare, ck_b, ck_a], capture_output=True,
                               text=True)
            m = re.search(r"worst (\S+)", p.stdout)
            worst_weight = float(m[1]) if p.returncode == 0 and m else 1.0
            print(f"note: ep 2 vs ep 1 on 2 ranks, {label}: worst loss {worst_loss:.2e}, "
                  f"worst weight {worst_weight:.2e} (relative)")
            check(f"{label}: ep 2 on 2 ranks trains like ep 1 on 2 ranks, 10 steps, losses and "
                  "weights within 1e-5",
                  ok and worst_loss <= 1e-5 and worst_weight <= 1e-5 and la[-1][1] < la[0][1] - 0.5,
                  f"worst loss {worst_loss}, worst weight {worst_weight}\n{p.stdout}{p.stderr}\n"
                  + log_b + "\n---\n" + log_a)
            equal_runs[label] = la
        d, c = equal_runs["dropless"], equal_runs["dropping"]
        check("the capacity acts: dropping's first balance is above 1 (routes dropped) and its "
              "losses differ from dropless's",
              len(d) == 10 and len(c) == 10 and c[0][3] > 1.0
              and max(abs(x[1] - y[1]) for x, y in zip(c, d)) > 1e-4, f"{d}\n{c}")

        # ZeRO 3 (the LayerSpec form, its MoE blocks on the expert-parallel group): ep 2 = ep 1
        # on 2 ranks, dropless, 10 steps, losses within 1e-5 (stage 3 saves no MoE checkpoint).
        z3 = [run(2, 3, config=c, steps=10, sgd=True) for c in (args.config, ep2_config)]
        za, zb = lines(z3[0][1]), lines(z3[1][1])
        if not args.full:
            # The AdamW ZeRO-3 run's checks, on the ep-1 run (its first loss, before any update,
            # does not depend on the optimizer).
            check("2 data ranks at ZeRO 3 (the LayerSpec form): trains with the MoE fields",
                  z3[0][0] == 0 and len(za) == 10 and za[-1][1] < za[0][1] - 0.5
                  and len(one) > 0 and abs(za[0][1] - one[0][1]) < 2e-5, z3[0][1])
        worst = max((abs(x[1] - y[1]) / abs(y[1]) for x, y in zip(zb, za)), default=1.0)
        check("ZeRO 3: ep 2 on 2 ranks trains like ep 1 on 2 ranks, 10 steps, losses within 1e-5",
              z3[0][0] == 0 and z3[1][0] == 0 and len(za) == 10 and len(zb) == 10
              and worst <= 1e-5,
              f"rc {z3[1][0]} and {z3[0][0]}, worst {worst}\n" + z3[1][1][-1500:] + "\n---\n"
              + z3[0][1][-1500:])

        # 2 pipeline stages (pipeline x experts through train_gpt): 4 ranks = pipeline 2 x data 2,
        # MoE layer 0 on stage 0 and layer 2 on stage 1, micro-batches of 1 (accumulation 2),
        # against one rank with --seed-layers (the pipeline's per-layer seeds) and micro-batches
        # of 1 (accumulation 4): the same micro-batches, so each one's routing, capacity and
        # l_aux are the same, dropless and with token dropping. ep 2 (the experts over each
        # stage's data group) and, with dropping, ep 1 on the same layout. ZeRO 1, SGD, 10
        # steps: losses within 1e-5, aux loss within 2e-6 (its 6 decimals), balance equal.
        pipelined = (("dropless", args.config, ep2_config), ("dropping", drop_config, drop_ep2_config))
        for label, ep1_cfg, ep2_cfg in pipelined if args.full else pipelined[1:]:
            rc_o, log_o = run(1, 1, "--seed-layers", config=ep1_cfg, micro=1, steps=10, sgd=True)
            one_rank = lines(log_o)
            runs = [(2, ep2_cfg)] + ([(1, ep1_cfg)] if label == "dropping" else [])
            for ep, cfg in runs:
                rc_p, log_p = run(4, 1, "--pipeline-model-parallel-size", "2", config=cfg, micro=1,
                                  steps=10, sgd=True, pipeline=True)
                piped = lines(log_p)
                ok = rc_o == 0 and rc_p == 0 and len(one_rank) == 10 and len(piped) == 10
                worst = max((abs(x[1] - y[1]) / abs(y[1]) for x, y in zip(piped, one_rank)),
                            default=1.0)
                aux = max((abs(x[2] - y[2]) for x, y in zip(piped, one_rank)), default=1.0)
                balance = all(x[3] == y[3] and x[4] == y[4] for x, y in zip(piped, one_rank))
                print(f"note: pipeline 2 x data 2 at ep {ep}, {label}, against one rank: worst "
                      f"loss {worst:.2e}, worst aux loss {aux:.1e}")
                check(f"pipeline 2 x data 2 at ep {ep}, {label}: one rank's losses (1e-5), aux "
                      "losses and load balance, 10 steps",
                      ok and worst <= 1e-5 and aux <= 2e-6 and balance
                      and "pipeline 2 stages" in log_p
                      and (ep == 1 or "(experts 2 of the data ranks)" in log_p)
                      and piped[-1][1] < piped[0][1] - 0.5,
                      log_p + "\n---\n" + log_o)

        for ranks, micro in ((2, 2), (4, 1)) if args.full else ((2, 2),):
            rc_b, log_b = run(ranks, 1, config=ep2_config, micro=micro, steps=10)
            b = lines(log_b)
            check(f"{ranks} ranks at expert degree 2: 10 steps with the MoE fields, the loss falls",
                  rc_b == 0 and [l[0] for l in b] == list(range(1, 11)) and b[-1][1] < b[0][1] - 0.5,
                  log_b)
            if ranks == 2:
                uninterrupted = b
        ck = os.path.join(tmp, "ckpt_ep2")
        rc_s, log_s = run(2, 1, "--save", ck, config=ep2_config, steps=5)
        rc_r, log_r = run(2, 1, "--load", ck, config=ep2_config, steps=10)
        resumed = lines(log_r)
        check("ep 2: saved at step 5 and resumed, steps 6-10 are the uninterrupted run's (1e-6)",
              rc_s == 0 and rc_r == 0 and [l[0] for l in resumed] == list(range(6, 11))
              and max(abs(x[1] - y[1]) / abs(y[1]) for x, y in zip(resumed, uninterrupted[5:])) < 1e-6
              and os.path.isfile(os.path.join(ck, "global_step5", "layer_0_expert_7_mp_rank_00_model_states.pt")),
              log_s + "\n---\n" + log_r)

        bf16_ck = os.path.join(tmp, "ckpt_bf16")
        rc_h, log_h = run(1, 1, "--save", bf16_ck, bf16=True)
        probe16 = ("import torch,sys,glob\n"
                   "f=glob.glob(sys.argv[1]+'/global_step*/mp_rank_00_model_states.pt')[0]\n"
                   "sd=torch.load(f,weights_only=False)['module']\n"
                   "for k in sorted(sd):\n"
                   "  if k.endswith('expert_bias'): print(k, str(sd[k].dtype), ' '.join(repr(v) for v in sd[k].tolist()))\n")
        p = subprocess.run([sys.executable, "-c", probe16, bf16_ck], capture_output=True, text=True)
        rows = [line.split() for line in p.stdout.splitlines()]
        ok = rc_h == 0 and p.returncode == 0 and len(rows) == 2 and all(r[1] == "torch.float32" for r in rows)
        vals = [float(v) / 1e-3 for r in rows for v in r[2:]]
        ok = ok and all(abs(v - round(v)) < 1e-3 and abs(round(v)) <= STEPS for v in vals) and any(abs(v) > 0.5 for v in vals)
        check("bf16: the expert biases stay fp32 and move by whole steps of the rate",
              ok, p.stdout + p.stderr + log_h)

        rc_t, log_t = run(2, 1, "--tensor-model-parallel-size", "2")
        check("a tensor degree is refused naming moe_tiny's normalization",
              rc_t != 0 and "the tensor-parallel GPT does not implement normalization" in log_t, log_t)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
