#!/usr/bin/env python3
"""Universal checkpoints of MoE models (moe_train.cpp: 4 experts, top-2, dropless; cloned
ExpertMLPs and the grouped MLP), fp32 on CPU, real ranks. For each saving layout (ep 1 and ep 2,
ZeRO 0-3, 2 and 4 ranks):

convert: tools/to_universal of the checkpoint saved after step 3 writes the one-rank model: one
         zero/<name>/ folder per parameter of the one-rank model (every global expert a local
         one: deepspeed_experts.<E>, stacked weights [E, ...]), each fp32.pt equal (torch.equal)
         to the saving ranks' weights put together as that model; model states without
         num_experts / dscpp_moe, param_shapes one group of those names.
load:    checkpoint.load_universal at other expert-parallel degrees, ZeRO stages and rank counts
         (ep 1, 2, 4): 3 more steps give the uninterrupted run's losses and final weights
         (within 1e-6 relative, MuonH's weights 1e-5; the weights compared as the one-rank
         model's).
refusal: a universal folder without one expert's folder fails the ep-2 load naming it.
--muonh: instead, saves at ep 2 with MuonH stepping the matrices (the experts' partition by it:
         its momentum_buffer beside each fp32.pt) converted and loaded at ep 1, 2 and 4.
Prints one line per case and `N passed, M failed`; exits 1 on any failure."""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))  # tests/
sys.path.insert(0, HERE)
from moe_checkpoint_oracle import MUONH, SAVE_AT, Runner, one_rank_weights, rel  # noqa: E402
from oracle_cases import Cases  # noqa: E402

UNIVERSAL = {"checkpoint": {"load_universal": True}}
# (saving ep, ranks, stage, grouped) -> the loads (ep, ranks, stage): each target degree, a
# stage other than the saving one, and both directions between ep 1 and ep > 1.
PLANS = [
    ((1, 2, 2, False), [(2, 2, 1), (4, 4, 3)]),
    ((1, 2, 0, True), [(2, 2, 0), (4, 4, 2)]),
    ((2, 2, 2, True), [(1, 2, 2), (2, 2, 3), (4, 4, 1)]),
    ((2, 4, 1, False), [(1, 1, 0), (2, 2, 2), (4, 4, 2)]),
    ((2, 2, 3, False), [(2, 4, 0), (1, 2, 3)]),
]
MUONH_PLANS = [
    ((2, 2, 2, True), [(1, 2, 2), (2, 2, 3), (4, 4, 1)]),
    ((2, 4, 0, True), [(2, 2, 2), (1, 1, 0)]),
]


def max_rel(a, b):
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max(((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)).item() for k in a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--to-universal", required=True)
    ap.add_argument("--muonh", action="store_true", help="MuonH's saves at ep 2 (see above)")
    args = ap.parse_args()
    more = {"optimizer": MUONH} if args.muonh else {}
    case = Cases()
    with tempfile.TemporaryDirectory() as tmp:
        r = Runner(args, tmp)
        for (ep, ranks, stage, grouped), loads in MUONH_PLANS if args.muonh else PLANS:
            kind = f"ep {ep} on {ranks} ranks stage {stage} {'grouped' if grouped else 'clones'}"
            kind += ", MuonH" if args.muonh else ""
            key = f"u{ep}{ranks}{stage}{int(grouped)}"
            ckpt = os.path.join(tmp, key)
            w_full, w_saved = (os.path.join(tmp, f"{key}{x}.pt") for x in "ab")
            full = r.train(ranks, stage, ep=ep, grouped=grouped, extra=["--weights", w_full], more_config=more)
            r.train(ranks, stage, ep=ep, grouped=grouped, steps=SAVE_AT, more_config=more,
                    extra=["--save", ckpt, "--save-at", str(SAVE_AT), "--weights", w_saved])
            udir = os.path.join(ckpt, f"global_step{SAVE_AT}_universal")

            def convert():
                p = subprocess.run([args.to_universal, "--input_folder", os.path.join(ckpt, f"global_step{SAVE_AT}")],
                                   capture_output=True, text=True)
                assert p.returncode == 0, p.stdout + p.stderr
                want = one_rank_weights(w_saved, ep, grouped)
                names = sorted(d for d in os.listdir(os.path.join(udir, "zero")) if d != "optimizer_state.pt")
                assert names == sorted(want), (names, sorted(want))
                bad = [k for k in want if not torch.equal(torch.load(os.path.join(udir, "zero", k, "fp32.pt"))["param"],
                                                          want[k])]
                assert not bad, f"fp32.pt differs from the saved weights: {bad}"
                if args.muonh:  # every matrix's momentum beside its weights
                    mats = [k for k in want if want[k].dim() >= 2 and "embed" not in k]
                    lack = [k for k in mats if not os.path.exists(os.path.join(udir, "zero", k, "momentum_buffer.pt"))]
                    assert mats and not lack, f"no momentum_buffer.pt for {lack}"
                model = torch.load(os.path.join(udir, "mp_rank_00_model_states.pt"))
                stale = [k for k in ("num_experts", "dscpp_moe") if k in model]
                assert not stale, f"the universal model states keep {stale}"
                shapes = model["param_shapes"]
                assert len(shapes) == 1 and sorted(shapes[0]) == sorted(want), shapes
            case(f"to_universal of {kind}", convert)

            for ep2, n, s2 in loads:
                def load(ep2=ep2, n=n, s2=s2):
                    w = os.path.join(tmp, f"{key}_{ep2}{n}{s2}.pt")
                    out = r.train(n, s2, ep=ep2, grouped=grouped, more_config={**UNIVERSAL, **more},
                                  extra=["--load", ckpt, "--weights", w])
                    assert out["first_step"] == SAVE_AT, out["first_step"]
                    e_loss = rel(out["losses"], full["losses"][SAVE_AT:])
                    e_w = max_rel(one_rank_weights(w_full, ep, grouped), one_rank_weights(w, ep2, grouped))
                    # MuonH's Newton-Schulz multiplies a gradient's near-zero singular values by up
                    # to 3.4445^5 (about 490) a step: another rank count's sums in another order
                    # leave the weights a few 1e-6 apart after 3 steps (AdamW's: under 1e-6).
                    w_tol = 1e-5 if args.muonh else 1e-6
                    assert e_loss < 1e-6 and e_w < w_tol, (f"{out['losses']} vs {full['losses'][SAVE_AT:]} "
                                                           f"(losses {e_loss:.1e}, weights {e_w:.1e})")
                    return f"losses {e_loss:.1e}, weights {e_w:.1e}"
                case(f"load_universal at ep {ep2} on {n} ranks stage {s2}, {kind}", load)

        if args.muonh:
            return case.summary()

        def missing():
            broken = os.path.join(tmp, "broken")
            shutil.copytree(os.path.join(tmp, "u1220"), broken)
            gone = "moe.deepspeed_moe.experts.deepspeed_experts.3.fc1.weight"
            shutil.rmtree(os.path.join(broken, f"global_step{SAVE_AT}_universal", "zero", gone))
            text = r.train(2, 2, ep=2, more_config=UNIVERSAL, extra=["--load", broken], expect_fail=True)
            assert f"has no folder for parameter '{gone}'" in text, text[-2000:]
        case("load_universal at ep 2 refuses a folder without an expert's parameter", missing)
    return case.summary()


if __name__ == "__main__":
    sys.exit(main())
