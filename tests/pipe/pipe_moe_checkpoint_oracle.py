#!/usr/bin/env python3
"""Checkpoints of a MoE GPT pipeline with expert parallelism (pipe_moe_train.cpp: 2 stages of
4 MoE blocks, 4 experts top-2 with a shared expert, dropless), fp32 on CPU, real Gloo
ranks, ZeRO 1 (the covering set) or ZeRO 0, 1, 2 (--matrix, with the covering set):

resume:   2 stages x 2 data ranks at ep 2: 6 steps in one go equal 3 steps, save, new
          processes, load, 3 steps: every loss and every final weight bit for bit.
files:    DeepSpeed's PipelineEngine MoE layout, names from DeepSpeed's own
          _get_expert_ckpt_name: per stage s, layer_<L>_expert_<E>_mp_rank_<s> for its MoE
          layers L = 0, 1, ... (counted in the stage's module, DeepSpeed's moe_layer_id), E = 0..3,
          each holding that expert's tensors only under the whole-model key with its global id;
          mp_rank_<s> with num_experts [4] per MoE layer of the stage ("uniform" puts 3 on stage
          0, 1 on stage 1) and its module without expert tensors (the gate
          and the shared expert in it); no layer_XX-model_states.pt; ZeRO 1-2: two groups in
          each zero_pp_rank_D_mp_rank_<s> (partition_count [2, 1]); ZeRO 0:
          expp_rank_{0,1}_mp_rank_<s>; every file opens with torch.load(weights_only=True).
fp32:     tools/zero_to_fp32 and the folder's zero_to_fp32.py give the one-rank model's state
          dict, equal (torch.equal) to the saving ranks' weights put together here (experts by
          global id, each stage's).
relayout: the ep-2 checkpoint loaded at ep 1 on 2 x 2 and on 2 stages x 1 data rank, and a
          checkpoint saved at ep 1 (2 x 2, layer files) loaded at ep 2: the next 3 losses equal
          the uninterrupted run's (1e-5; ep 1 and ep 2 dropless are the same model, the sums'
          order differs); --matrix: also loaded on 1 stage x 4 data ranks at ep 4.
universal: tools/to_universal of it: zero/<name>/fp32.pt bit-equal to zero_to_fp32's, no stage's
          num_experts / dscpp_moe in its model states; checkpoint.load_universal on 2 stages x
          1 data rank at ep 1 (--matrix: and one rank) and on 2 x 2 at ep 2: the next losses
          within 1e-5 of the uninterrupted run's.
refusals: a missing expert file of stage 1, and stage 1's model states claiming ep 4 over 2
          data ranks: each load fails naming the file.
Prints one line per case and `N passed, M failed`; exits 1 on any failure."""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from dscpp_test_ports import free_port  # noqa: E402
from oracle_cases import Cases  # noqa: E402

STEPS, SAVE_AT, EXPERTS = 6, 3, 4


class Runner:

    def __init__(self, args, tmp):
        self.args, self.tmp, self.n = args, tmp, 0

    def train(self, stages, data, ep, zero, extra=(), expect_fail=False, steps=STEPS, tensor=1):
        self.n += 1
        out = os.path.join(self.tmp, f"run{self.n}.json")
        cmd = [self.args.launcher, "--num_gpus", str(stages * data * tensor), "--master_port", str(free_port()),
               self.args.train, "--stages", str(stages), "--tensor", str(tensor), "--ep", str(ep),
               "--zero", str(zero), "--steps", str(steps), "--out", out, *extra]
        p = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                           timeout=300)
        if expect_fail:
            if p.returncode == 0:
                raise AssertionError("expected a failure, the run succeeded")
            return p.stdout + p.stderr
        if p.returncode != 0:
            raise RuntimeError(f"exited {p.returncode}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)


def rel(a, b):
    assert len(a) == len(b), (a, b)
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def one_rank_weights(prefix, ranks):
    """The one-rank model's state dict from pipe_moe_train's --weights files: per stage, its data
    ranks 0..ep-1 (expert-parallel ranks 0..ep-1 of expert-data rank 0, DeepSpeed's consecutive
    groups) hold every expert; a clone's local id j of ep rank r is global r * n + j, a stacked
    weight's ranks go end to end on dim 0. A tied weight is its first stage's."""
    files = [torch.load(f"{prefix}.rank{r}") for r in range(ranks)]
    out = {}
    for stage in sorted({f["stage"] for f in files}):
        mine = sorted((f for f in files if f["stage"] == stage), key=lambda f: f["data"])
        ep = mine[0]["ep"]
        holders = mine[:ep]
        n = None
        for k, v in holders[0]["params"].items():
            if k in out:
                continue
            if "deepspeed_moe.experts." not in k:
                out[k] = v
                continue
            m = re.match(r"(.*deepspeed_experts\.)(\d+)(\..*)", k)
            if m is None:  # stacked [E_local, ...]
                out[k] = torch.cat([h["params"][k] for h in holders])
                continue
            n = n or EXPERTS // ep
            for r, h in enumerate(holders):
                out[f"{m[1]}{r * n + int(m[2])}{m[3]}"] = h["params"][k]
    return out


def check_files(tag_dir, zero, ep):
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
        model = torch.load(os.path.join(tag_dir, f"mp_rank_{s:02d}_model_states.pt"))
        module = model.get("module") or {}
        moe_prefixes = sorted({k.split(".deepspeed_moe.")[0] for k in module if ".deepspeed_moe." in k})
        total += len(moe_prefixes)
        if model.get("num_experts") != [EXPERTS] * len(moe_prefixes):
            problems.append(f"stage {s}: num_experts {model.get('num_experts')}, MoE layers {moe_prefixes}")
        if any("deepspeed_moe.experts." in k for k in module):
            problems.append(f"stage {s}: expert tensors in its module")
        if not any("deepspeed_moe.gate.wg.weight" in k for k in module):
            problems.append(f"stage {s}: no gate in its module ({sorted(module)[:6]}...)")
        if not any("shared" in k for k in module):
            problems.append(f"stage {s}: no shared expert in its module")
        for layer, prefix in enumerate(moe_prefixes):
            for e in range(EXPERTS):
                name = DeepSpeedEngine._get_expert_ckpt_name(ckpt, layer, e, tag, checkpoint_mp_rank=s)
                if not os.path.isfile(name):
                    problems.append(f"no {os.path.basename(name)}")
                    continue
                keys = sorted(torch.load(name))
                bad = [k for k in keys if not k.startswith(prefix + ".deepspeed_moe.experts.")
                       or not (k.endswith(f".{e}") or f"deepspeed_experts.{e}." in k)]
                if not keys or bad:
                    problems.append(f"{os.path.basename(name)}: keys {keys}")
        for r in range(ep):
            expp = os.path.join(tag_dir, f"expp_rank_{r}_mp_rank_{s:02d}_optim_states.pt")
            if (zero == 0) != os.path.isfile(expp):
                problems.append(f"{os.path.basename(expp)} {'missing' if zero == 0 else 'written'}")
        if zero > 0:
            for d in range(2):
                osd = torch.load(os.path.join(tag_dir, f"zero_pp_rank_{d}_mp_rank_{s:02d}_optim_states.pt"))
                count = osd["optimizer_state_dict"]["partition_count"]
                if count != [2, 2 // ep]:
                    problems.append(f"stage {s} data rank {d}: partition_count {count}")
    if total != 4:
        problems.append(f"{total} MoE layers over the stages' modules, the model has 4")
    return problems


def check_universal(r, args, ckpt, tag_dir, zero, full, loads, at_ep2):
    """tools/to_universal of the save (beside it: <tag>_universal, latest_universal): every
    zero/<name>/fp32.pt bit-equal to zero_to_fp32's, no stage's MoE metadata in the model states;
    checkpoint.load_universal at ep 1 on each of `loads` ((stages, data, tensor)) and at ep 2 on
    `at_ep2` (each stage's experts cut from the one-rank model's): the next losses within 1e-5 of
    the uninterrupted run's."""
    p = subprocess.run([args.to_universal, "--input_folder", tag_dir], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    udir = tag_dir + "_universal"
    states = torch.load(os.path.join(udir, "mp_rank_00_model_states.pt"))
    stale = [k for k in ("num_experts", "dscpp_moe", "dscpp_pipe") if k in states]
    assert not stale, f"the universal model states keep {stale}"
    whole = os.path.join(r.tmp, f"whole{r.n}.pt")
    p = subprocess.run([args.zero_to_fp32, ckpt, whole], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    want = {k: v for k, v in torch.load(whole).items() if v.is_floating_point()}
    got = {os.path.basename(os.path.dirname(f)): torch.load(f)["param"]
           for f in glob.glob(os.path.join(udir, "zero", "*", "fp32.pt"))}
    assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
    bad = [k for k in want if not torch.equal(got[k], want[k])]
    assert not bad, f"fp32.pt differs from zero_to_fp32's: {bad}"
    worst = 0.0
    for stages, data, t, ep in [(*lay, 1) for lay in loads] + [(*at_ep2, 2)]:
        out = r.train(stages, data, ep, zero, tensor=t, extra=["--load", ckpt, "--universal"])
        assert out["first_step"] == SAVE_AT, out["first_step"]
        e = rel(out["losses"], full["losses"][SAVE_AT:])
        assert e < 1e-5, (f"{stages} x {t} x {data} at ep {ep}: {out['losses']} vs {full['losses'][SAVE_AT:]} "
                          f"({e:.1e})")
        worst = max(worst, e)
    return f"{len(want)} tensors, losses within {worst:.1e} (ep 1 and ep 2)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--zero-to-fp32", required=True)
    ap.add_argument("--to-universal", required=True)
    ap.add_argument("--matrix", action="store_true", help="ZeRO 0, 1 and 2, and 1 stage x 4 data at ep 4")
    args = ap.parse_args()
    case = Cases()

    with tempfile.TemporaryDirectory() as tmp:
        r = Runner(args, tmp)
        for zero in (0, 1, 2) if args.matrix else (1,):
            kind = f"ZeRO {zero}"
            ckpt = os.path.join(tmp, f"ep2z{zero}")
            w_full, w_saved, w_resumed = (os.path.join(tmp, f"z{zero}{x}") for x in "abc")
            full = r.train(2, 2, 2, zero, extra=["--weights", w_full])
            r.train(2, 2, 2, zero, steps=SAVE_AT, extra=["--save", ckpt, "--save-at", str(SAVE_AT),
                                                         "--weights", w_saved])
            tag_dir = os.path.join(ckpt, f"global_step{SAVE_AT}")

            def resume():
                out = r.train(2, 2, 2, zero, extra=["--load", ckpt, "--weights", w_resumed])
                assert out["first_step"] == SAVE_AT, out["first_step"]
                assert out["losses"] == full["losses"][SAVE_AT:], (out["losses"], full["losses"])
                a, b = one_rank_weights(w_full, 4), one_rank_weights(w_resumed, 4)
                bad = [k for k in a if not torch.equal(a[k], b[k])]
                assert not bad, f"weights differ: {bad}"
                return f"bit-exact, {len(a)} tensors"
            case(f"resume 2 x 2 at ep 2, {kind}", resume)

            def files():
                problems = check_files(tag_dir, zero, 2)
                assert not problems, "; ".join(problems)
            case(f"files (DeepSpeed's MoE pipeline layout), {kind}", files)

            def fp32():
                want = one_rank_weights(w_saved, 4)
                out = os.path.join(tmp, "fp32.pt")
                p = subprocess.run([args.zero_to_fp32, ckpt, out], capture_output=True, text=True)
                assert p.returncode == 0, p.stdout + p.stderr
                script = os.path.join(tmp, "script.pt")
                p = subprocess.run([sys.executable, os.path.join(ckpt, "zero_to_fp32.py"), ckpt, script],
                                   capture_output=True, text=True)
                assert p.returncode == 0, p.stdout + p.stderr
                for what, got in (("zero_to_fp32", torch.load(out)), ("zero_to_fp32.py", torch.load(script))):
                    got = {k: v for k, v in got.items() if k in want or v.is_floating_point()}
                    assert sorted(got) == sorted(want), (what, sorted(set(got) ^ set(want)))
                    bad = [k for k in want if not torch.equal(got[k], want[k])]
                    assert not bad, f"{what} differs: {bad}"
                return f"{len(want)} tensors"
            case(f"zero_to_fp32 = the one-rank model, {kind}", fp32)

            layouts = [(2, 2, 1), (2, 1, 1)] + ([(1, 4, 4)] if args.matrix else [])
            for stages, data, ep in layouts:
                def other(stages=stages, data=data, ep=ep):
                    out = r.train(stages, data, ep, zero, extra=["--load", ckpt])
                    assert out["first_step"] == SAVE_AT, out["first_step"]
                    e = rel(out["losses"], full["losses"][SAVE_AT:])
                    assert e < 1e-5, f"{out['losses']} vs {full['losses'][SAVE_AT:]} ({e:.1e})"
                    return f"{e:.1e}"
                case(f"ep 2 checkpoint loaded on {stages} x {data} at ep {ep}, {kind}", other)

            def back():
                ep1 = os.path.join(tmp, f"ep1z{zero}")
                full1 = r.train(2, 2, 1, zero)
                r.train(2, 2, 1, zero, steps=SAVE_AT, extra=["--save", ep1, "--save-at", str(SAVE_AT)])
                out = r.train(2, 2, 2, zero, extra=["--load", ep1])
                assert out["first_step"] == SAVE_AT, out["first_step"]
                e = rel(out["losses"], full1["losses"][SAVE_AT:])
                assert e < 1e-5, f"{out['losses']} vs {full1['losses'][SAVE_AT:]} ({e:.1e})"
                return f"{e:.1e}"
            case(f"ep 1 checkpoint (layer files) loaded at ep 2, {kind}", back)

            loads = [(2, 1, 1)] + ([(1, 1, 1)] if args.matrix else [])
            case(f"to_universal of it: the one-rank model, loaded at ep 1 and ep 2, {kind}",
                 lambda: check_universal(r, args, ckpt, tag_dir, zero, full, loads, (2, 2, 1)))

        ckpt = os.path.join(tmp, "ep2z1")

        def missing():
            broken = os.path.join(tmp, "broken")
            shutil.copytree(ckpt, broken)
            gone = "layer_0_expert_3_mp_rank_01_model_states.pt"
            os.remove(os.path.join(broken, f"global_step{SAVE_AT}", gone))
            text = r.train(2, 2, 2, 1, extra=["--load", broken], expect_fail=True)
            assert "has no file of expert 3 of MoE layer 0" in text and gone in text, text[-2000:]
        case("refuses a missing expert file, naming it", missing)

        def ep_mismatch():
            other = os.path.join(tmp, "other")
            shutil.copytree(ckpt, other)
            p = os.path.join(other, f"global_step{SAVE_AT}", "mp_rank_01_model_states.pt")
            m = torch.load(p)
            m["dscpp_moe"]["ep_size"] = 4
            torch.save(m, p)
            text = r.train(2, 2, 1, 1, extra=["--load", other], expect_fail=True)
            assert "mp_rank_01_model_states.pt': dp_world_size 2 is not a multiple of ep_size 4" in text, \
                text[-2000:]
        case("refuses stage 1's files at an ep that cannot be re-laid, naming the file", ep_mismatch)

    return case.summary()


if __name__ == "__main__":
    sys.exit(main())
