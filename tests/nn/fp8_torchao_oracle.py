#!/usr/bin/env python3
"""dscpp's FP8 linear against torchao's Float8Linear (torchao.float8) on the same inputs.

    fp8_torchao_oracle.py --cli build/tests/nn/fp8_linear_cli

For torchao's recipes "tensorwise" (e4m3 forward, e5m2 output gradient: dscpp's "hybrid") and
"rowwise" (e4m3 throughout, per-row scales rounded to powers of two: dscpp's "e4m3"), the
output and the gradients of input, weight and bias agree row by row: each row's largest
difference against that row's largest value. The inputs' rows and columns span three orders of
magnitude, so that a scale taken along the wrong axis (or per tensor) loses the small rows'
precision and fails. Tensorwise: to 1e-5 (fp32 accumulation of the same fp8 operands). Rowwise:
to 2^-7, since torchao rounds a rowwise product through bf16 (torch._scaled_mm has no fp32
output there) and dscpp does not. torchao decides the scales and the axes; the CPU's
_scaled_mm takes only per-tensor scales, so for rowwise the product itself is replaced by its
definition (fp32 product of the fp8 operands times the row and column scales). Exits 1 on a
mismatch."""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
from torchao.float8 import Float8LinearConfig, convert_to_float8_training

TOLERANCE = {"tensorwise": 1e-5, "rowwise": 2.0**-7}


def scaled_mm_by_definition(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                            use_fast_accum=False):
    out = (a.float() @ b.float()) * scale_a * scale_b
    if bias is not None:
        out = out + bias
    return out.to(out_dtype or torch.float32)


def torchao_run(recipe, x, w, b, dy):
    lin = torch.nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(b)
    model = torch.nn.Sequential(lin)
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))
    xi = x.clone().requires_grad_(True)
    real = torch._scaled_mm
    if recipe == "rowwise":
        torch._scaled_mm = scaled_mm_by_definition
    try:
        y = model(xi)
        y.backward(dy)
    finally:
        torch._scaled_mm = real
    return {"y": y.detach(), "dx": xi.grad, "dw": model[0].weight.grad, "db": model[0].bias.grad}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    args = ap.parse_args()
    torch.manual_seed(11)
    def uneven(rows, cols, scale):  # rows and columns from 1e-3 to 1 of the largest
        return (torch.randn(rows, cols) * torch.logspace(-1.5, 0, rows).unsqueeze(1) * torch.logspace(-1.5, 0, cols)
                * scale)

    x = uneven(64, 96, 3.0)
    w = uneven(80, 96, 0.05)
    b = torch.randn(80)
    dy = uneven(64, 80, 2.0)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        inp = os.path.join(tmp, "in.pt")
        torch.save({"x": x, "w": w, "b": b, "dy": dy}, inp)
        for recipe, fmt in (("tensorwise", "hybrid"), ("rowwise", "e4m3")):
            out = os.path.join(tmp, f"{recipe}.pt")
            subprocess.run([args.cli, inp, out, recipe, fmt], check=True)
            ours = torch.load(out)
            theirs = torchao_run(recipe, x, w, b, dy)
            exact = x @ w.t() + b
            for k in ("y", "dx", "dw", "db"):
                a, t = ours[k].double(), theirs[k].double()
                a, t = (a, t) if a.dim() == 2 else (a.unsqueeze(0), t.unsqueeze(0))
                worst = ((a - t).abs().amax(1) / t.abs().amax(1).clamp(min=1e-30)).max().item()
                ok = worst <= TOLERANCE[recipe]
                failures += not ok
                print(f"{'PASS' if ok else 'FAIL'} {recipe}/{fmt} {k}: the worst row's |dscpp - torchao| is "
                      f"{worst:.2e} of its largest value (bound {TOLERANCE[recipe]:.1e})")
            # Both are fp8 products, not the exact one.
            far = (theirs["y"] - exact).abs().max().item() > 1e-3 * exact.abs().max().item()
            failures += not far
            print(f"{'PASS' if far else 'FAIL'} {recipe}: the products are fp8's (far from fp32's)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
