#!/usr/bin/env python3
"""DeepSpeed's own MoE layer as the oracle for dscpp's nn::moe::MoE (single process, CPU).

    moe_deepspeed_oracle.py --cli build/tests/nn/moe_cli [--full]

For each case builds deepspeed.moe.layer.MoE (use_rts and top2_2nd_expert_sampling off, which
are random; no noisy gate) with distinct random expert weights, runs it on a [B, T, H] input
and back-propagates sum(output * grad_out) + 0.37 * l_aux; writes its state dict, the input and
the options to a safetensors file that moe_cli runs through dscpp's layer. Both must route
every token to the same experts with the same capacity, drop the same routes, and give the
same l_aux and exp_counts (exact counts), output and gradients of the input and of every
parameter (fp32, relative 1e-6 of the largest value). top-1, top-2 and top-k (k = 4 and 8),
dropping and dropless, train and eval (eval_capacity_factor), min_capacity, Residual MoE,
top-1's used_token mask.
--full adds more (the moe_matrix label). Prints one line per case and `N passed, M failed`."""
import argparse
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from deepspeed.moe.layer import MoE  # noqa: E402

TOL = 1e-6


class MLP(torch.nn.Module):
    """The expert: fc1, exact GELU, fc2, as nn::moe::ExpertMLP."""

    def __init__(self, h, f):
        super().__init__()
        self.fc1 = torch.nn.Linear(h, f)
        self.fc2 = torch.nn.Linear(f, h)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def case(name, k, e, cf=1.0, ecf=1.0, min_cap=2, drop=True, train=True, residual=False,
         used=False, b=2, t=12, h=16, f=32):
    return dict(name=name, k=k, num_experts=e, capacity_factor=cf, eval_capacity_factor=ecf,
                min_capacity=min_cap, drop_tokens=drop, train=train, use_residual=residual,
                used_token=used, b=b, t=t, hidden=h, ffn=f)


DEFAULT = [
    case("top1_drop", 1, 4),
    case("top1_dropless", 1, 4, drop=False),
    case("top1_mincap", 1, 4, cf=0.25, min_cap=5),
    case("top1_used_token", 1, 4, used=True),
    case("top2_drop", 2, 4),
    case("top2_eval", 2, 4, cf=2.0, ecf=0.5, train=False),
    case("top2_dropless_residual", 2, 4, drop=False, residual=True),
    case("top4_drop", 4, 8, cf=0.75),
    case("top8_drop", 8, 16),
    case("top8_dropless", 8, 16, drop=False),
]
FULL = DEFAULT + [
    case("top1_cf2", 1, 8, cf=2.0, b=4),
    case("top1_eval", 1, 4, ecf=0.5, train=False),
    case("top2_residual_drop", 2, 8, residual=True, cf=0.5),
    case("top3_drop", 3, 6),
    case("top4_eval", 4, 8, ecf=0.5, train=False),
    case("top8_cf05", 8, 16, cf=0.5, b=4),
]


def rel(a, b):
    return (a.double() - b.double()).abs().max().item() / max(b.double().abs().max().item(), 1e-30)


def reference(c, seed):
    torch.manual_seed(seed)
    m = MoE(c["hidden"], MLP(c["hidden"], c["ffn"]), num_experts=c["num_experts"], k=c["k"],
            capacity_factor=c["capacity_factor"], eval_capacity_factor=c["eval_capacity_factor"],
            min_capacity=c["min_capacity"], use_residual=c["use_residual"],
            drop_tokens=c["drop_tokens"], use_rts=False, top2_2nd_expert_sampling=False)
    with torch.no_grad():  # distinct experts (DeepSpeed's are copies of one)
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    m.train(c["train"])
    x = torch.randn(c["b"], c["t"], c["hidden"], requires_grad=True)
    grad_out = torch.randn(c["b"], c["t"], c["hidden"])
    inputs = {"x": x.detach().clone(), "grad_out": grad_out}
    used = None
    if c["used_token"]:  # a third of the tokens unused
        used = (torch.arange(c["b"] * c["t"]) % 3 != 1).float()
        inputs["used_token"] = used
    inputs.update({"param." + n: p.detach().clone() for n, p in m.named_parameters()})
    out, l_aux, counts = m(x, used)
    (out * grad_out).sum().add(l_aux * 0.37).backward()
    with torch.no_grad():
        g = m.deepspeed_moe.gate(x.detach().reshape(-1, c["hidden"]), used, True)
    ref = {"output": out.detach(), "l_aux": l_aux.detach(), "exp_counts": counts,
           "capacity": int(g[1]), "routes": g[3].t().long(), "grad.x": x.grad}
    ref.update({"grad." + n: p.grad if p.grad is not None else torch.zeros_like(p)
                for n, p in m.named_parameters()})
    return inputs, ref


def compare(c, ref, got):
    errs = []
    if not torch.equal(ref["exp_counts"].long(), got["exp_counts"].long()):
        errs.append(f"exp_counts {ref['exp_counts'].tolist()} != {got['exp_counts'].tolist()}")
    ours_cap = int(got["capacity"])
    if c["drop_tokens"] and ours_cap != ref["capacity"]:
        errs.append(f"capacity {ref['capacity']} != {ours_cap}")
    if not torch.equal(ref["routes"], got["routes"].long()):
        bad = (ref["routes"] != got["routes"].long()).any(1).nonzero().flatten().tolist()
        errs.append(f"routes differ at tokens {bad[:8]}")
    dropped = int((ref["routes"] < 0).sum())
    for key in ref:
        if key in ("exp_counts", "capacity", "routes"):
            continue
        e = rel(got[key], ref[key])
        if not e <= TOL:
            errs.append(f"{key} rel {e:.2e}")
    return errs[:6] + ([f"and {len(errs) - 6} more"] if len(errs) > 6 else []), dropped


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--full", action="store_true")
    args = ap.parse_args()
    cases = FULL if args.full else DEFAULT
    with tempfile.TemporaryDirectory() as tmp:
        refs = []
        files = []
        for i, c in enumerate(cases):
            inputs, ref = reference(c, 1000 + i)
            meta = {key: (str(int(v)) if isinstance(v, bool) else str(v)) for key, v in c.items()}
            path = os.path.join(tmp, f"{c['name']}.safetensors")
            save_file({key: v.contiguous() for key, v in inputs.items()}, path, metadata=meta)
            refs.append(ref)
            files.append(path)
        p = subprocess.run([args.cli] + files, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        if p.returncode != 0:
            print(f"moe_cli exited {p.returncode}:\n{p.stdout}{p.stderr}")
            return 1
        passed = failed = 0
        for c, ref, path in zip(cases, refs, files):
            got = load_file(path[:-12] + ".out.safetensors")
            errs, dropped = compare(c, ref, got)
            status = "ok" if not errs else "FAIL " + "; ".join(errs)
            print(f"{c['name']}: capacity {ref['capacity']}, {dropped} routes dropped: {status}")
            passed += not errs
            failed += bool(errs)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
