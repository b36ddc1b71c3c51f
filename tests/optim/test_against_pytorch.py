#!/usr/bin/env python3
"""dscpp's optimizers and LR schedules against PyTorch and DeepSpeed, step by step.

Every case runs through optim_trajectory (one process, a list of specs) and is replayed here
on the same data, built independently from the formulas optim_trajectory.cpp documents:
  * Adam/AdamW, SGD, Adagrad: torch.optim (single-tensor path), with DeepSpeed's defaults read
    from its own classes' signatures and engine.py's rule for Adam vs AdamW;
  * schedules: DeepSpeed's own classes (deepspeed.runtime.lr_schedules) driving the reference
    optimizer: lr (and OneCycle's momentum) after every step, then the final parameters;
  * Lamb, Lion and Adam without bias correction, which PyTorch lacks and whose DeepSpeed
    kernels need a GPU: the short implementations below of the formulas DeepSpeed's kernels
    compute (csrc/lamb/fused_lamb_cuda_kernel.cu, csrc/lion/multi_tensor_lion.cu,
    csrc/adam/multi_tensor_adam.cu), written from those kernels, not from dscpp;
  * configs DeepSpeed or torch refuse: dscpp must refuse them too.
Parameters must agree to 1e-6 relative with torch.optim (fp32; in practice bit for bit) and to
1e-5 with the formula implementations, whose fp32 operations come in another order (the
denominator is floored at 1e-3, for values near zero); lrs and momenta to 1e-12 relative.
Last line: "N passed, M failed".
"""
import argparse
import inspect
import json
import logging
import math
import subprocess
import sys

import torch
from deepspeed.ops.adam import FusedAdam
from deepspeed.ops.lamb import FusedLamb
from deepspeed.ops.lion import FusedLion
from deepspeed.runtime import lr_schedules
from deepspeed.utils import logger as ds_logger

PARAM_TOL = 1e-6
FORMULA_PARAM_TOL = 1e-5
LR_TOL = 1e-12


def param_data(k, n, seed):
    return [(0.5 + 0.4 * math.sin(1.3 * i + 0.7 * k + seed)) * (-1 if i % 2 else 1) for i in range(n)]


def grad_data(t, k, n, seed):
    return [0.1 * math.cos(0.37 * i + 1.1 * t + 0.5 * k + seed) + 0.02 * math.sin(0.05 * i * (t + 1)) for i in range(n)]


def defaults_of(cls):
    return {k: v.default for k, v in inspect.signature(cls.__init__).parameters.items() if v.default is not inspect._empty}


class FusedAdamFormula(torch.optim.Optimizer):
    """multi_tensor_adam.cu: m/bc1 / (sqrt(v/bc2) + eps), decay inside or outside the moments."""

    def __init__(self, params, lr, bias_correction, betas, eps, weight_decay, adam_w_mode):
        super().__init__(params, dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                                      weight_decay=weight_decay))
        self.adam_w_mode = adam_w_mode

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            wd = group["weight_decay"]
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st.update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                st["step"] += 1
                g = p.grad if self.adam_w_mode else p.grad + wd * p
                st["m"] = b1 * st["m"] + (1 - b1) * g
                st["v"] = b2 * st["v"] + (1 - b2) * g * g
                bc1 = 1 - b1**st["step"] if group["bias_correction"] else 1.0
                bc2 = 1 - b2**st["step"] if group["bias_correction"] else 1.0
                update = (st["m"] / bc1) / (torch.sqrt(st["v"] / bc2) + group["eps"])
                if self.adam_w_mode:
                    update = update + wd * p
                p.sub_(group["lr"] * update)


class LambFormula(torch.optim.Optimizer):
    """fused_lamb_cuda_kernel.cu: u = m / (sqrt(v) + eps) + wd*p; p -= lr*sqrt(bc2)/bc1 * r * u
    with r = ||p|| / ||u|| clamped to [min_coeff, max_coeff], 1 if a norm is 0. The kernel takes
    one r per tensor; "segments" (dscpp's extension) splits a tensor into several."""

    def __init__(self, params, lr, bias_correction, betas, eps, eps_inside_sqrt, weight_decay, max_coeff,
                 min_coeff, segments=None, **_ignored):
        super().__init__(params, dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                                      weight_decay=weight_decay, max_coeff=max_coeff, min_coeff=min_coeff,
                                      segments=segments))
        self.eps_inside_sqrt = eps_inside_sqrt

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st.update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                st["step"] += 1
                g = p.grad
                st["m"] = b1 * st["m"] + (1 - b1) * g
                st["v"] = b2 * st["v"] + (1 - b2) * g * g
                denom = torch.sqrt(st["v"] + group["eps"]) if self.eps_inside_sqrt else torch.sqrt(st["v"]) + group["eps"]
                u = st["m"] / denom + group["weight_decay"] * p
                step_size = group["lr"]
                if group["bias_correction"]:
                    step_size = group["lr"] * math.sqrt(1 - b2**st["step"]) / (1 - b1**st["step"])
                start = 0
                new_p = p.clone()
                for n in group["segments"] or [p.numel()]:
                    w_norm = p[start:start + n].double().norm().item()
                    u_norm = u[start:start + n].double().norm().item()
                    r = 1.0
                    if w_norm != 0 and u_norm != 0:
                        r = min(max(w_norm / u_norm, group["min_coeff"]), group["max_coeff"])
                    new_p[start:start + n] = p[start:start + n] - step_size * r * u[start:start + n]
                    start += n
                p.copy_(new_p)


class LionFormula(torch.optim.Optimizer):
    """multi_tensor_lion.cu: c = b1*m + (1-b1)*g; p = p*(1 - lr*wd) - lr*sign(c);
    m = b2*m + (1-b2)*g."""

    def __init__(self, params, lr, betas, weight_decay, **_ignored):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                st = self.state.setdefault(p, {})
                m = st.setdefault("m", torch.zeros_like(p))
                c = b1 * m + (1 - b1) * p.grad
                p.copy_(p * (1 - group["lr"] * group["weight_decay"]) - group["lr"] * torch.sign(c))
                st["m"] = b2 * m + (1 - b2) * p.grad


ONE_BIT_ONLY = ("freeze_step", "cuda_aware", "comm_backend_name", "coeff_beta", "factor_max", "factor_min",
                "factor_threshold", "var_freeze_step", "local_step_scaler", "local_step_clipper")


def reference_optimizer(config, groups):
    """The optimizer DeepSpeed's engine would build (engine.py _configure_basic_optimizer)."""
    kind = config["type"].lower()
    params = {k: v for k, v in config.get("params", {}).items() if k not in ONE_BIT_ONLY}
    if kind in ("adam", "adamw", "onebitadam", "zerooneadam"):
        adam_w_mode = params.pop("adam_w_mode", True)
        decoupled = kind == "adamw" or adam_w_mode  # the name "adamw" forces decoupled decay
        if params.pop("torch_adam", False):  # torch's own class and defaults
            return (torch.optim.AdamW if decoupled else torch.optim.Adam)(groups, foreach=False, **params)
        kwargs = defaults_of(FusedAdam)
        kwargs.update(params)
        if not kwargs["bias_correction"]:
            return FusedAdamFormula(groups, kwargs["lr"], False, kwargs["betas"], kwargs["eps"],
                                    kwargs["weight_decay"], decoupled)
        return (torch.optim.AdamW if decoupled else torch.optim.Adam)(
            groups, lr=kwargs["lr"], betas=kwargs["betas"], eps=kwargs["eps"], weight_decay=kwargs["weight_decay"],
            foreach=False)
    if kind in ("lamb", "onebitlamb"):
        kwargs = defaults_of(FusedLamb)
        kwargs.update(params)
        return LambFormula(groups, **kwargs)
    if kind == "lion":
        kwargs = defaults_of(FusedLion)
        kwargs.update(params)
        return LionFormula(groups, **kwargs)
    if kind == "sgd":
        return torch.optim.SGD(groups, foreach=False, **params)
    if kind == "adagrad":
        return torch.optim.Adagrad(groups, foreach=False, **params)
    raise ValueError(f"no reference for {kind}")


def momentum_of(group):
    if "betas" in group:
        return group["betas"][0]
    return group.get("momentum", 0.0)


def replay(spec):
    seed = spec.get("seed", 0)
    shards = spec.get("shards") or [{"size": spec.get("size", 16)}]
    tensors, groups = [], []
    for k, shard in enumerate(shards):
        t = torch.tensor(param_data(k, shard["size"], seed), dtype=torch.float32)
        tensors.append(t)
        groups.append(dict(params=[t], **shard.get("hyper", {})))
    opt = reference_optimizer(spec["optimizer"], groups)
    sched = None
    if "scheduler" in spec:
        sched = getattr(lr_schedules, spec["scheduler"]["type"])(opt, **spec["scheduler"].get("params", {}))
    out = {"lr": [], "momentum": [], "scheduler_lr": []}

    def record():
        out["lr"].append([float(g["lr"]) for g in opt.param_groups])
        out["momentum"].append([float(momentum_of(g)) for g in opt.param_groups])
        if sched is not None:
            out["scheduler_lr"].append(float(sched.get_lr()[0]))

    record()
    for t in range(spec.get("steps", 10)):
        for k, p in enumerate(tensors):
            p.grad = torch.tensor(grad_data(t, k, p.numel(), seed), dtype=torch.float32)
        opt.step()
        if sched is not None:
            sched.step()
        record()
    out["params"] = [p.tolist() for p in tensors]
    formula = isinstance(opt, (FusedAdamFormula, LambFormula, LionFormula))
    out["tolerance"] = FORMULA_PARAM_TOL if formula else PARAM_TOL
    return out


def rel(a, b, floor):
    return abs(a - b) / max(abs(b), floor)


def compare(ours, ref):
    """Problems found, as text; empty when they agree."""
    problems = []
    for key in ("lr", "momentum", "scheduler_lr"):
        mine, theirs = ours.get(key, []), ref[key]
        if len(mine) != len(theirs):
            problems.append(f"{key}: {len(mine)} entries, reference {len(theirs)}")
            continue
        for step, (a, b) in enumerate(zip(mine, theirs)):
            for x, y in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
                if rel(x, y, 1e-300) > LR_TOL:
                    problems.append(f"{key} after {step} steps: {x!r}, reference {y!r}")
                    break
            if len(problems) > 3:
                return problems
    for k, (a, b) in enumerate(zip(ours["params"], ref["params"])):
        worst = max(range(len(b)), key=lambda i: rel(a[i], b[i], 1e-3))
        if rel(a[worst], b[worst], 1e-3) > ref["tolerance"]:
            problems.append(f"shard {k} element {worst}: {a[worst]!r}, reference {b[worst]!r} "
                            f"(rel {rel(a[worst], b[worst], 1e-3):.2e})")
    return problems


def opt(type_, **params):
    return {"type": type_, "params": params}


def sched(type_, **params):
    return {"type": type_, "params": params}


# name -> spec. Sizes and steps are small: the formulas, not the data, are under test.
CASES = {
    # Adam: engine.py's Adam vs AdamW rule and FusedAdam's defaults.
    "adam_defaults": dict(optimizer=opt("adam"), steps=12, size=24),
    "adam_decays_decoupled_by_default": dict(optimizer=opt("Adam", lr=1e-2, weight_decay=0.05), steps=15, size=24),
    "adam_w_mode_false_is_l2": dict(optimizer=opt("adam", lr=1e-2, weight_decay=0.05, adam_w_mode=False), steps=15),
    "adamw_ignores_adam_w_mode_false": dict(
        optimizer=opt("adamw", lr=1e-2, weight_decay=0.05, adam_w_mode=False), steps=15),
    "adamw_betas_eps": dict(optimizer=opt("AdamW", lr=3e-3, betas=[0.8, 0.99], eps=1e-6, weight_decay=0.01),
                            steps=20, seed=3),
    "adamw_torch_adam_default_decay": dict(optimizer=opt("adamw", lr=1e-2, torch_adam=True), steps=10),
    "adam_without_bias_correction": dict(
        optimizer=opt("adam", lr=1e-2, bias_correction=False, weight_decay=0.01), steps=12),
    "onebitadam_as_adam": dict(optimizer=opt("OneBitAdam", lr=1e-2, weight_decay=0.01, freeze_step=5,
                                             cuda_aware=False, comm_backend_name="nccl"), steps=10),
    "adam_groups": dict(optimizer=opt("adamw", lr=1e-2, weight_decay=0.01), steps=10,
                        shards=[{"size": 16}, {"size": 9, "hyper": {"lr": 3e-3, "weight_decay": 0.0}}]),
    # SGD: torch.optim.SGD.
    "sgd_plain": dict(optimizer=opt("SGD", lr=0.05), steps=10),
    "sgd_momentum": dict(optimizer=opt("sgd", lr=0.01, momentum=0.9), steps=20),
    "sgd_dampening_weight_decay": dict(optimizer=opt("SGD", lr=0.01, momentum=0.8, dampening=0.3, weight_decay=0.01),
                                       steps=20, seed=1),
    "sgd_nesterov_weight_decay": dict(optimizer=opt("SGD", lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.05),
                                      steps=20),
    # Adagrad: torch.optim.Adagrad with DeepSpeed's (= torch's) defaults.
    "adagrad_defaults": dict(optimizer=opt("adagrad"), steps=15),
    "adagrad_all_params": dict(optimizer=opt("Adagrad", lr=0.05, lr_decay=0.01, weight_decay=0.02,
                                             initial_accumulator_value=0.1, eps=1e-8), steps=15),
    # Lamb and Lion: the kernel formulas above.
    "lamb_defaults": dict(optimizer=opt("lamb"), steps=12),
    "lamb_clamped_trust_ratio": dict(optimizer=opt("LAMB", lr=1e-2, weight_decay=0.01, max_coeff=0.5, min_coeff=0.1),
                                     steps=12),
    "lamb_segments": dict(optimizer=opt("lamb", lr=1e-2, weight_decay=0.01), steps=12,
                          shards=[{"size": 24, "hyper": {"segments": [10, 6, 8]}}]),
    "lamb_eps_inside_sqrt_no_bias_correction": dict(
        optimizer=opt("lamb", lr=1e-2, eps=1e-6, eps_inside_sqrt=True, bias_correction=False), steps=12),
    "onebitlamb_as_lamb": dict(optimizer=opt("OneBitLamb", lr=1e-2, freeze_step=3, factor_max=4.0), steps=8),
    "lion_defaults": dict(optimizer=opt("lion"), steps=15),
    "lion_betas_weight_decay": dict(optimizer=opt("Lion", lr=1e-3, betas=[0.95, 0.98], weight_decay=0.1), steps=15),
    # Schedules: DeepSpeed's classes.
    "warmuplr_log": dict(optimizer=opt("adamw", lr=1e-3),
                         scheduler=sched("WarmupLR", warmup_min_lr=1e-4, warmup_max_lr=1e-2, warmup_num_steps=10),
                         steps=20),
    "warmuplr_linear_to_optimizer_lr": dict(
        optimizer=opt("sgd", lr=5e-3, momentum=0.9),
        scheduler=sched("WarmupLR", warmup_num_steps=8, warmup_type="linear"), steps=12),
    "warmuplr_one_warmup_step": dict(optimizer=opt("adam"), scheduler=sched("WarmupLR", warmup_num_steps=1), steps=4),
    "warmupdecaylr_log_past_total": dict(
        optimizer=opt("adamw", lr=1e-3),
        scheduler=sched("WarmupDecayLR", total_num_steps=25, warmup_min_lr=1e-5, warmup_max_lr=5e-3,
                        warmup_num_steps=5), steps=30),
    "warmupdecaylr_linear_default_max": dict(
        optimizer=opt("lamb", lr=0.1),
        scheduler=sched("WarmupDecayLR", total_num_steps=12, warmup_num_steps=4, warmup_type="linear"), steps=14),
    "warmupcosinelr_groups": dict(
        optimizer=opt("adamw", lr=1e-2),
        scheduler=sched("WarmupCosineLR", total_num_steps=20, warmup_num_steps=5, warmup_min_ratio=0.1,
                        cos_min_ratio=0.01), steps=25,
        shards=[{"size": 12}, {"size": 8, "hyper": {"lr": 2e-3}}]),
    "warmupcosinelr_linear_short_total": dict(
        optimizer=opt("adagrad", lr=0.05),
        scheduler=sched("WarmupCosineLR", total_num_steps=3, warmup_num_steps=5, warmup_type="linear"), steps=10),
    "onecycle_adam_momentum": dict(
        optimizer=opt("adamw", lr=1e-3),
        scheduler=sched("OneCycle", cycle_min_lr=1e-3, cycle_max_lr=1e-2, cycle_first_step_size=5,
                        cycle_second_step_size=7, cycle_min_mom=0.85, cycle_max_mom=0.95), steps=20),
    "onecycle_decay": dict(
        optimizer=opt("adam", lr=1e-3, adam_w_mode=False, weight_decay=0.01),
        scheduler=sched("OneCycle", cycle_min_lr=1e-4, cycle_max_lr=1e-3, cycle_first_step_size=4,
                        decay_step_size=2, decay_lr_rate=0.5, decay_mom_rate=0.1), steps=16),
    "onecycle_stairs_sgd": dict(
        optimizer=opt("sgd", lr=0.01, momentum=0.9),
        scheduler=sched("OneCycle", cycle_min_lr=1e-3, cycle_max_lr=1e-2, cycle_first_step_size=6,
                        cycle_second_step_size=4, cycle_first_stair_count=3, cycle_second_stair_count=2), steps=14),
    "onecycle_lion_no_momentum": dict(
        optimizer=opt("lion", lr=1e-4),
        scheduler=sched("OneCycle", cycle_min_lr=1e-5, cycle_max_lr=1e-4, cycle_first_step_size=3,
                        cycle_momentum=False), steps=8),
    "lrrangetest_continuous": dict(
        optimizer=opt("sgd", lr=0.01),
        scheduler=sched("LRRangeTest", lr_range_test_min_lr=1e-4, lr_range_test_step_size=3,
                        lr_range_test_step_rate=0.5), steps=10),
    "lrrangetest_staircase_lamb": dict(
        optimizer=opt("lamb", lr=0.01),
        scheduler=sched("LRRangeTest", lr_range_test_min_lr=1e-3, lr_range_test_step_size=2,
                        lr_range_test_staircase=True), steps=9),
}

# Configs the reference refuses: name -> (spec, the reference's own attempt at building it).
_opt = lambda: torch.optim.SGD([torch.zeros(1)], lr=0.1)  # noqa: E731
REJECTED = {
    "warmuplr_zero_warmup_steps": (
        dict(optimizer=opt("adam"), scheduler=sched("WarmupLR", warmup_num_steps=0)),
        lambda: lr_schedules.WarmupLR(_opt(), warmup_num_steps=0)),
    "warmupdecaylr_without_total": (
        dict(optimizer=opt("adam"), scheduler=sched("WarmupDecayLR", warmup_num_steps=5)),
        lambda: lr_schedules.WarmupDecayLR(_opt(), warmup_num_steps=5)),
    "onecycle_without_max": (
        dict(optimizer=opt("adam"), scheduler=sched("OneCycle", cycle_min_lr=0.1)),
        lambda: lr_schedules.OneCycle(_opt(), cycle_min_lr=0.1)),
    "onecycle_zero_first_step": (
        dict(optimizer=opt("adam"), scheduler=sched("OneCycle", cycle_min_lr=0.1, cycle_max_lr=1.0,
                                                    cycle_first_step_size=0)),
        lambda: lr_schedules.OneCycle(_opt(), cycle_min_lr=0.1, cycle_max_lr=1.0, cycle_first_step_size=0)),
    "lrrangetest_fractional_step_size": (
        dict(optimizer=opt("adam"), scheduler=sched("LRRangeTest", lr_range_test_step_size=2.5)),
        lambda: lr_schedules.LRRangeTest(_opt(), lr_range_test_step_size=2.5)),
    "warmuplr_unknown_param": (
        dict(optimizer=opt("adam"), scheduler=sched("WarmupLR", warmup_min_ratio=0.1)),
        lambda: lr_schedules.WarmupLR(_opt(), warmup_min_ratio=0.1)),
    "sgd_nesterov_without_momentum": (
        dict(optimizer=opt("SGD", lr=0.1, nesterov=True)),
        lambda: torch.optim.SGD([torch.zeros(1)], lr=0.1, nesterov=True)),
    "adam_beta_above_one": (
        dict(optimizer=opt("adamw", betas=[0.9, 1.5])),
        lambda: torch.optim.AdamW([torch.zeros(1)], betas=(0.9, 1.5))),
    "adagrad_negative_lr": (
        dict(optimizer=opt("adagrad", lr=-1.0)),
        lambda: torch.optim.Adagrad([torch.zeros(1)], lr=-1.0)),
    "fused_adam_unknown_param": (
        dict(optimizer=opt("adam", foo=1)),
        lambda: inspect.signature(FusedAdam.__init__).bind(None, [], foo=1)),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True, help="path of optim_trajectory")
    args = parser.parse_args()
    ds_logger.setLevel(logging.ERROR)  # DeepSpeed warns when get_lr() precedes the first step

    names = list(CASES) + list(REJECTED)
    specs = list(CASES.values()) + [spec for spec, _ in REJECTED.values()]
    run = subprocess.run([args.cli], input=json.dumps(specs), capture_output=True, text=True)
    if run.returncode != 0:
        print(f"optim_trajectory failed ({run.returncode}): {run.stderr}")
        print(f"0 passed, {len(names)} failed")
        return 1
    results = json.loads(run.stdout)

    passed = failed = 0
    for name, spec, ours in zip(names, specs, results):
        if name in REJECTED:
            try:
                REJECTED[name][1]()
                problems = ["the reference accepts this config: the case is wrong"]
            except (ValueError, TypeError):
                problems = [] if "error" in ours else ["dscpp accepted a config the reference refuses"]
        elif "error" in ours:
            problems = [f"dscpp refused: {ours['error']}"]
        else:
            problems = compare(ours, replay(spec))
        if problems:
            failed += 1
            print(f"FAIL {name}: " + "; ".join(problems))
        else:
            passed += 1
            print(f"ok   {name}" + (f" (refused: {ours['error']})" if "error" in ours else ""))
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
