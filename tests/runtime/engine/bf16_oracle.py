#!/usr/bin/env python3
"""The single-rank oracle in bf16: on the CPU over Gloo (ctest) and on GPUs over NCCL
(bench/rows.toml's row engine-bf16-x2 runs it there).

    bf16_oracle.py --launcher build/launcher/dscpp --train build/tests/runtime/engine/engine_train

bf16 cannot match an fp32 run to 1e-5, so the tolerance comes from a measurement: the
1-rank bf16 run's distance from the fp32 reference (plain LibTorch on the CPU). That 1-rank
run keeps its gradients in fp32 (data_types.grad_accum_dtype fp32). Data parallelism on 2
ranks at stages 0-3 must then stay as close to it as twice that distance, with the gradient
partition in bf16 (no accumulation: the default), in fp32 over two micro-steps (the default
with accumulation), and in bf16 over two micro-steps (grad_accum_dtype bf16): for the MLP,
and for model_zoo's GPT as LayerSpecs (at stage 3 gathered layer by layer, with prefetch,
and with a live-parameter bound below two layers). Every case for the MLP (each stage with
each way of keeping the gradients); for the GPT a covering set by default (each stage once, each
way of keeping the gradients once, and its three ways of gathering at stage 3), every case with
--full (ctest engine.Bf16OracleMatrix, label engine_matrix). Prints one line per case, `N
passed, M failed` last."""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # tests/
from dscpp_test_ports import free_port  # noqa: E402
from oracle import config, rel_err, run  # noqa: E402


EPS = {"mlp": 1e-8, "gpt": 1e-4}  # as oracle.py: the GPT's small gradients meet Adam's eps


def bf16_config(stage, model, extra=None, ga=1, accum=None):
    c = config(stage, True, ga, EPS[model], True, extra)
    c["bf16"] = {"enabled": True}
    if accum:
        c["data_types"] = {"grad_accum_dtype": accum}
    return c


def gpus_here():
    try:
        import torch
        return torch.cuda.device_count()
    except ImportError:
        return 0


def main():
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # on the GPU machine: NVLink multicast stays off
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--quick", action="store_true",
                    help="the GPT at stages 2-3 only, with the partition in bf16 and fp32 (a GPU run's share)")
    ap.add_argument("--full", action="store_true", help="every case for the GPT too")
    args = ap.parse_args()
    gpus = gpus_here()
    if 0 < gpus < 2:
        # The CUDA build puts each rank on its own GPU over NCCL, which refuses two ranks on one.
        print(f"skipped: the 2-rank runs need 2 GPUs, this machine has {gpus}")
        return 77
    tmp = tempfile.mkdtemp()
    passed = failed = 0
    count = 0
    for model in ("gpt",) if args.quick else ("mlp", "gpt"):
        ref = run([args.train, "--mode", "reference", "--model", model,
                   "--config", json.dumps(config(0, False, 1, EPS[model])),
                   "--out", f"{tmp}/ref_{model}.json"], f"{tmp}/ref_{model}.json")
        one = run([args.launcher, "--num_gpus", "1", "--master_port", str(free_port()), args.train, "--mode",
                   "dscpp", "--model", model, "--config", json.dumps(bf16_config(0, model, accum="fp32")),
                   "--out", f"{tmp}/one_{model}.json"], f"{tmp}/one_{model}.json")
        loss_tol = 2 * rel_err(one["losses"], ref["losses"])
        param_tol = 2 * rel_err(one["params"], ref["params"])
        norm_tol = 2 * rel_err(one["grad_norms"], ref["grad_norms"])
        print(f"{model}: 1 rank bf16 vs fp32 reference: losses {loss_tol / 2:.2e}, weights {param_tol / 2:.2e}, "
              f"gradient norms {norm_tol / 2:.2e}")
        # (stage, zero extra, accumulation steps, grad_accum_dtype)
        cases = [(s, None, 1, None) for s in (0, 1, 2, 3)]
        cases += [(s, None, 2, None) for s in (1, 2, 3)] + [(s, None, 2, "bf16") for s in (2, 3)]
        cases += [(2, {"dscpp_deferred_allgather": True}, 1, None)]
        if args.quick:
            cases = [(2, None, 1, None), (3, None, 1, None), (2, None, 2, None), (2, None, 2, "bf16"),
                     (2, {"dscpp_deferred_allgather": True}, 1, None)]
        elif model == "gpt":
            if not args.full:
                # The MLP's cases pair every stage with every way of keeping the gradients; the
                # GPT's own part is its LayerSpecs: each stage and each way once, the deferred
                # all-gather, and stage 3 gathered whole, layer by layer and under a bound.
                cases = [(0, None, 1, None), (1, None, 2, None), (2, None, 2, "bf16"), (3, None, 1, None),
                         (2, {"dscpp_deferred_allgather": True}, 1, None)]
            cases.append((3, {"stage3_param_persistence_threshold": 0}, 1, None))
            cases.append((3, {"stage3_param_persistence_threshold": 0, "stage3_max_live_parameters": 2000,
                              "stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 1000}, 1, None))
        for stage, extra, ga, accum in cases:
            count += 1
            out = f"{tmp}/{model}_s{stage}_{count}.json"
            name = f"{model} bf16 stage={stage} ga={ga}" + (f" grad_accum_dtype={accum}" if accum else "") + \
                (f" {extra}" if extra else "")
            try:
                cfg = bf16_config(stage, model, extra, ga, accum)
                got = run([args.launcher, "--num_gpus", "2", "--master_port", str(free_port()), args.train, "--mode",
                           "dscpp", "--model", model, "--config", json.dumps(cfg), "--out", out], out)
                le, pe = rel_err(got["losses"], one["losses"]), rel_err(got["params"], one["params"])
                ne = rel_err(got["grad_norms"], one["grad_norms"])
                ok = le <= loss_tol and pe <= param_tol and ne <= norm_tol
                msg = (f"losses {le:.2e} (tolerance {loss_tol:.2e}), weights {pe:.2e} (tolerance {param_tol:.2e}), "
                       f"gradient norms {ne:.2e} (tolerance {norm_tol:.2e})")
                if "peak_live" in got:
                    msg += f", peak live {got['peak_live']} (layer {got['max_layer']})"
            except Exception as e:  # noqa: BLE001
                ok, msg = False, str(e)
            print(f"{'PASS' if ok else 'FAIL'} {name} 2 ranks vs 1: {msg}", flush=True)
            passed += ok
            failed += not ok
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
