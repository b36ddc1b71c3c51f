#!/usr/bin/env python3
"""Checkpoints of experts in a pipeline with tensor parallelism (pipeline x tensor x experts;
pipe_moe_train.cpp --tensor 2: the MoE GPT of 4 MoE blocks, 4 experts top-2 with a shared
expert, dropless, as tensor_parallel_gpt_layer_specs), fp32 on CPU, real Gloo ranks, ZeRO 1
(the covering set) or ZeRO 0, 1, 2 (--matrix):

resume:   2 stages x tensor 2 x data 2 at ep 2 (8 ranks): 6 steps in one go equal 3 steps, save,
          new processes, load, 3 steps: every loss, and every rank's final weights, bit for bit.
files:    DeepSpeed 0.19.8's PipelineEngine MoE layout per (stage s, tensor rank m), its
          checkpoint_mp_rank M = s * 2 + m (the grid's get_model_parallel_rank): mp_rank_<M>
          with num_experts [4] per MoE layer of the stage, its module without expert tensors,
          dscpp_tensor_parallel naming no expert; layer_<L>_expert_<E>_mp_rank_<M> for every MoE
          layer L of the stage and expert E (DeepSpeed's own _get_expert_ckpt_name), each
          expert's tensors only, equal on both tensor ranks of a stage (replicas); ZeRO 1-2:
          zero_pp_rank_D_mp_rank_<M> with partition_count [2, 1]; ZeRO 0: expp_rank_{0,1}_mp_rank_<M>;
          no layer_XX-model_states.pt; every file opens with torch.load(weights_only=True).
fp32:     tools/zero_to_fp32 and the folder's zero_to_fp32.py agree bit for bit, and are the
          one-rank model: within 1e-5 of the weights of the same training at tensor 1 (2 x 2 at
          ep 2, put together per global expert), so each split tensor was merged right.
relayout: the checkpoint loaded at tensor 2 x data 2 at ep 1, at tensor 1 (2 x 2, ep 2), at
          tensor 2 x data 1, and (--matrix) on one rank: the next 3 losses within 1e-5 of the
          uninterrupted run's; a tensor-1 checkpoint (2 x 2 at ep 2) loaded at tensor 2 x data 2,
          ep 2: within 1e-5 of the uninterrupted tensor-1 run.
universal: tools/to_universal of it: zero/<name>/fp32.pt bit-equal to zero_to_fp32's, no stage's
          num_experts / dscpp_moe in its model states; checkpoint.load_universal at 2 stages x
          tensor 2 x data 1, ep 1 (and --matrix: one rank) and at 2 x tensor 2 x data 2, ep 2: the
          next losses within 1e-5 of the uninterrupted run's.
refusals: a missing expert file of stage 1's tensor rank 1 (mp_rank_03), and mp_rank_03's model
          states claiming ep 4 over 2 data ranks: each load fails naming the file.
Prints one line per case and `N passed, M failed`; exits 1 on any failure."""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from oracle_cases import Cases  # noqa: E402
from pipe_moe_checkpoint_oracle import (EXPERTS, SAVE_AT, Runner, check_universal,  # noqa: E402
                                        one_rank_weights, rel)

T = 2


def check_files(tag_dir, zero):
    from deepspeed.runtime.engine import DeepSpeedEngine
    problems = []
    for path in sorted(glob.glob(os.path.join(tag_dir, "*.pt"))):
        torch.load(path)  # weights_only=True: our files hold no pickled objects
    layer_files = glob.glob(os.path.join(tag_dir, "layer_*-model_states.pt"))
    if layer_files:
        problems.append(f"layer files written: {sorted(map(os.path.basename, layer_files))}")
    ckpt, tag = os.path.dirname(tag_dir), os.path.basename(tag_dir)
    total = 0
    for s in range(2):
        layers_of_stage = None
        for m in range(T):
            mp = s * T + m
            model = torch.load(os.path.join(tag_dir, f"mp_rank_{mp:02d}_model_states.pt"))
            module = model.get("module") or {}
            prefixes = sorted({k.split(".deepspeed_moe.")[0] for k in module if ".deepspeed_moe." in k})
            layers_of_stage = layers_of_stage or prefixes
            if prefixes != layers_of_stage:
                problems.append(f"stage {s}: tensor rank {m} has MoE layers {prefixes}, rank 0 {layers_of_stage}")
            if model.get("num_experts") != [EXPERTS] * len(prefixes):
                problems.append(f"mp_rank {mp}: num_experts {model.get('num_experts')}, MoE layers {prefixes}")
            if any("deepspeed_moe.experts." in k for k in module):
                problems.append(f"mp_rank {mp}: expert tensors in its module")
            if not any("deepspeed_moe.gate.wg.weight" in k for k in module):
                problems.append(f"mp_rank {mp}: no gate in its module")
            tp = (model.get("dscpp_tensor_parallel") or {}).get("partitions")
            if not tp or any("deepspeed_moe.experts." in k for k in tp):
                problems.append(f"mp_rank {mp}: dscpp_tensor_parallel {sorted(tp or {})[:4]}...")
            for layer, prefix in enumerate(prefixes):
                for e in range(EXPERTS):
                    name = DeepSpeedEngine._get_expert_ckpt_name(ckpt, layer, e, tag, checkpoint_mp_rank=mp)
                    if not os.path.isfile(name):
                        problems.append(f"no {os.path.basename(name)}")
                        continue
                    sd = torch.load(name)
                    bad = [k for k in sd if not k.startswith(prefix + ".deepspeed_moe.experts.")
                           or not (k.endswith(f".{e}") or f"deepspeed_experts.{e}." in k)]
                    if not sd or bad:
                        problems.append(f"{os.path.basename(name)}: keys {sorted(sd)}")
                    if m > 0:
                        first = torch.load(DeepSpeedEngine._get_expert_ckpt_name(
                            ckpt, layer, e, tag, checkpoint_mp_rank=s * T))
                        if sorted(first) != sorted(sd) or any(not torch.equal(first[k], sd[k]) for k in sd):
                            problems.append(f"{os.path.basename(name)} differs from tensor rank 0's")
            for r in range(2):
                expp = os.path.join(tag_dir, f"expp_rank_{r}_mp_rank_{mp:02d}_optim_states.pt")
                if (zero == 0) != os.path.isfile(expp):
                    problems.append(f"{os.path.basename(expp)} {'missing' if zero == 0 else 'written'}")
            if zero > 0:
                for d in range(2):
                    f = os.path.join(tag_dir, f"zero_pp_rank_{d}_mp_rank_{mp:02d}_optim_states.pt")
                    count = torch.load(f)["optimizer_state_dict"]["partition_count"]
                    if count != [2, 1]:
                        problems.append(f"{os.path.basename(f)}: partition_count {count}")
        total += len(layers_of_stage or [])
    if total != 4:
        problems.append(f"{total} MoE layers over the stages' modules, the model has 4")
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--zero-to-fp32", required=True)
    ap.add_argument("--to-universal", required=True)
    ap.add_argument("--matrix", action="store_true", help="ZeRO 0, 1 and 2, and more layouts")
    args = ap.parse_args()
    case = Cases()

    with tempfile.TemporaryDirectory() as tmp:
        r = Runner(args, tmp)
        for zero in (0, 1, 2) if args.matrix else (1,):
            kind = f"ZeRO {zero}"
            ckpt = os.path.join(tmp, f"t2ep2z{zero}")
            w_full, w_resumed, w_one = (os.path.join(tmp, f"z{zero}{x}") for x in "abc")
            full = r.train(2, 2, 2, zero, tensor=T, extra=["--weights", w_full])
            r.train(2, 2, 2, zero, tensor=T, steps=SAVE_AT, extra=["--save", ckpt, "--save-at", str(SAVE_AT)])
            tag_dir = os.path.join(ckpt, f"global_step{SAVE_AT}")

            def resume():
                out = r.train(2, 2, 2, zero, tensor=T, extra=["--load", ckpt, "--weights", w_resumed])
                assert out["first_step"] == SAVE_AT, out["first_step"]
                assert out["losses"] == full["losses"][SAVE_AT:], (out["losses"], full["losses"])
                n = 0
                for rank in range(8):
                    a = torch.load(f"{w_full}.rank{rank}")["params"]
                    b = torch.load(f"{w_resumed}.rank{rank}")["params"]
                    bad = [k for k in a if not torch.equal(a[k], b[k])]
                    assert sorted(a) == sorted(b) and not bad, f"rank {rank}: weights differ: {bad}"
                    n += len(a)
                return f"bit-exact, {n} tensors over 8 ranks"
            case(f"resume 2 stages x tensor 2 x data 2 at ep 2, {kind}", resume)

            def files():
                problems = check_files(tag_dir, zero)
                assert not problems, "; ".join(problems)
            case(f"files (DeepSpeed's MoE pipeline layout per tensor rank), {kind}", files)

            def fp32():
                # The same training at tensor 1 (2 x 2 at ep 2) to the save: the one-rank model.
                one = r.train(2, 2, 2, zero, steps=SAVE_AT, extra=["--weights", w_one])
                e = rel(one["losses"], full["losses"][:SAVE_AT])
                assert e < 1e-5, f"tensor 1 trains another model: {one['losses']} ({e:.1e})"
                want = one_rank_weights(w_one, 4)
                out, script = os.path.join(tmp, "fp32.pt"), os.path.join(tmp, "script.pt")
                p = subprocess.run([args.zero_to_fp32, ckpt, out], capture_output=True, text=True)
                assert p.returncode == 0, p.stdout + p.stderr
                p = subprocess.run([sys.executable, os.path.join(ckpt, "zero_to_fp32.py"), ckpt, script],
                                   capture_output=True, text=True)
                assert p.returncode == 0, p.stdout + p.stderr
                tool, py = torch.load(out), torch.load(script)
                assert sorted(tool) == sorted(py), sorted(set(tool) ^ set(py))
                bad = [k for k in tool if not torch.equal(tool[k], py[k])]
                assert not bad, f"zero_to_fp32.py differs from the tool: {bad}"
                got = {k: v for k, v in tool.items() if k in want or v.is_floating_point()}
                assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
                worst, name = 0.0, ""
                for k in want:
                    assert got[k].shape == want[k].shape, (k, got[k].shape, want[k].shape)
                    err = ((got[k] - want[k]).abs().max() / want[k].abs().max().clamp_min(1e-12)).item()
                    if err > worst:
                        worst, name = err, k
                assert worst < 1e-5, f"worst {name} {worst:.1e}"
                return f"{len(want)} tensors, worst {worst:.1e} ({name})"
            case(f"zero_to_fp32 = the one-rank model, {kind}", fp32)

            layouts = [(2, 2, 1, T), (2, 2, 2, 1), (2, 1, 1, T)] + ([(1, 1, 1, 1)] if args.matrix else [])
            for stages, data, ep, t in layouts:
                def other(stages=stages, data=data, ep=ep, t=t):
                    out = r.train(stages, data, ep, zero, tensor=t, extra=["--load", ckpt])
                    assert out["first_step"] == SAVE_AT, out["first_step"]
                    e = rel(out["losses"], full["losses"][SAVE_AT:])
                    assert e < 1e-5, f"{out['losses']} vs {full['losses'][SAVE_AT:]} ({e:.1e})"
                    return f"{e:.1e}"
                case(f"loaded on {stages} stages x tensor {t} x data {data} at ep {ep}, {kind}", other)

            def onto():
                t1 = os.path.join(tmp, f"t1ep2z{zero}")
                full1 = r.train(2, 2, 2, zero)
                r.train(2, 2, 2, zero, steps=SAVE_AT, extra=["--save", t1, "--save-at", str(SAVE_AT)])
                out = r.train(2, 2, 2, zero, tensor=T, extra=["--load", t1])
                assert out["first_step"] == SAVE_AT, out["first_step"]
                e = rel(out["losses"], full1["losses"][SAVE_AT:])
                assert e < 1e-5, f"{out['losses']} vs {full1['losses'][SAVE_AT:]} ({e:.1e})"
                return f"{e:.1e}"
            case(f"a tensor-1 checkpoint (ep 2) loaded at tensor 2 x data 2, ep 2, {kind}", onto)

            loads = [(2, 1, T)] + ([(1, 1, 1)] if args.matrix else [])
            case(f"to_universal of it: the one-rank model, loaded at ep 1 and ep 2, {kind}",
                 lambda: check_universal(r, args, ckpt, tag_dir, zero, full, loads, (2, 2, T)))

        ckpt = os.path.join(tmp, "t2ep2z1")

        def missing():
            broken = os.path.join(tmp, "broken")
            shutil.copytree(ckpt, broken)
            gone = "layer_0_expert_2_mp_rank_03_model_states.pt"
            os.remove(os.path.join(broken, f"global_step{SAVE_AT}", gone))
            text = r.train(2, 1, 1, 1, extra=["--load", broken], expect_fail=True)
            assert "has no file of expert 2 of MoE layer 0" in text and gone in text, text[-2000:]
        case("refuses a missing expert file of tensor rank 1, naming it", missing)

        def ep_mismatch():
            other = os.path.join(tmp, "other")
            shutil.copytree(ckpt, other)
            p = os.path.join(other, f"global_step{SAVE_AT}", "mp_rank_03_model_states.pt")
            m = torch.load(p)
            m["dscpp_moe"]["ep_size"] = 4
            torch.save(m, p)
            text = r.train(2, 1, 1, 1, extra=["--load", other], expect_fail=True)
            assert "mp_rank_03_model_states.pt': dp_world_size 2 is not a multiple of ep_size 4" in text, \
                text[-2000:]
        case("refuses stage 1 tensor rank 1's files at an ep that cannot be re-laid, naming the file",
             ep_mismatch)

    return case.summary()


if __name__ == "__main__":
    sys.exit(main())
