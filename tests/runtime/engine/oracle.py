#!/usr/bin/env python3
"""The single-rank oracle for ZeRO stages 0-3 (stage 3 also layer by layer).

    oracle.py --launcher build/launcher/dscpp --train build/tests/runtime/engine/engine_train

Trains the same tiny models (an MLP, and a small transformer) for 20 steps with plain LibTorch in one process (the reference)
and with dscpp on N ranks through the launcher, for every stage in 0, 1, 2 (and 3), overlap_comm on
and off, gradient accumulation 1 and 4, N = 2 and 4 (every combination under --full; by default
a covering subset: each value, and each pair of values for the MLP); the losses and final weights must agree
within 1e-5 relative (fp32 on CPU), and each rank's optimizer state must hold 1/N of the
elements at stages 1 and 2. Prints one line per case and `N passed, M failed` last."""
import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # tests/
from dscpp_test_ports import free_port  # noqa: E402

GLOBAL_BATCH = 16


def config(stage, overlap, ga, eps=1e-8, reduce_scatter=True, zero_extra=None):
    return {
        "train_batch_size": GLOBAL_BATCH,
        "gradient_accumulation_steps": ga,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW",
                      "params": {"lr": 1e-2, "betas": [0.9, 0.999], "eps": eps, "weight_decay": 0.01}},
        # Small buckets, so that every run reduces several of them.
        "zero_optimization": {"stage": stage, "overlap_comm": overlap, "reduce_bucket_size": 300,
                              "reduce_scatter": reduce_scatter, **(zero_extra or {})},
    }


def run(cmd, out):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... exited {p.returncode}:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    with open(out) as f:
        return json.load(f)


def rel_err(a, b):
    """Largest element error relative to the reference's largest magnitude: a weight near
    zero carries the same absolute rounding as its neighbours, not a smaller one."""
    return max(abs(x - y) for x, y in zip(a, b)) / max(max(abs(y) for y in b), 1e-30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    ap.add_argument("--full", action="store_true", help="every case of every group, not the covering subset")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    # The transformer's linear layers leave some gradients near Adam's eps, where 1-ulp
    # differences of summation order (thread counts, rank splits) grow into 1e-4 weight
    # differences within two steps, in plain LibTorch as much as in dscpp: its runs use
    # eps 1e-4 so the comparison measures dscpp, not that amplification.
    eps = {"mlp": 1e-8, "transformer": 1e-4, "gpt": 1e-4}
    refs = {}
    for model in ("mlp", "transformer", "gpt"):
        ref_out = os.path.join(tmp, f"ref_{model}.json")
        refs[model] = run([args.train, "--mode", "reference", "--model", model, "--config",
                           json.dumps(config(0, False, 1, eps[model])), "--steps", str(args.steps),
                           "--out", ref_out], ref_out)
    # Each group's full product runs under --full (ctest engine.SingleRankOracleMatrix, label
    # engine_matrix); the default run keeps, per group, a covering subset: every value of every
    # dimension, and for the MLP at stages 0-2 and 3 every pair of values (stage x overlap,
    # stage x accumulation, stage x ranks, overlap x accumulation, overlap x ranks,
    # accumulation x ranks), the rows of a pairwise covering array.
    cases = []

    def group(rows, keep):
        """rows: (model, stage, overlap, ga, n, reduce_scatter, extra); keep: the default's
        (stage, overlap, ga, n) subset (None: all)."""
        cases.extend(r for r in rows if args.full or keep is None or r[1:5] in keep)

    F, T = False, True
    # Every combination for the MLP; the transformer at 2 ranks with overlap on.
    group([("mlp",) + c + (True, {}) for c in itertools.product([0, 1, 2], [False, True], [1, 4], [2, 4])],
          {(0, F, 1, 2), (0, T, 4, 4), (1, F, 4, 4), (1, T, 1, 2), (2, F, 1, 4), (2, T, 4, 2)})
    group([("transformer", s, True, ga, 2, True, {}) for s in (0, 1, 2) for ga in (1, 4)],
          {(0, T, 4, 2), (1, T, 1, 2), (2, T, 4, 2)})
    # Stage 3 of modules without layers: the whole module gathered around forward and backward.
    group([("mlp", 3, o, ga, n, True, {}) for o in (False, True) for ga in (1, 4) for n in (2, 4)],
          {(3, F, 1, 2), (3, F, 4, 4), (3, T, 1, 4), (3, T, 4, 2)})
    group([("transformer", 3, True, ga, 2, True, {}) for ga in (1, 4)], {(3, T, 4, 2)})
    # Stage 3 by layer: model_zoo's GPT as LayerSpecs, with nothing persistent, prefetch on
    # (DeepSpeed's defaults) and off, and a live-parameter bound below two layers with no reuse.
    by_layer = {"stage3_param_persistence_threshold": 0}
    no_prefetch = dict(by_layer, stage3_prefetch_bucket_size=0)
    tight = dict(by_layer, stage3_max_live_parameters=2000, stage3_max_reuse_distance=0,
                 stage3_prefetch_bucket_size=1000)
    group([("gpt", 3, True, ga, n, True, by_layer) for ga in (1, 4) for n in (2, 4)],
          {(3, T, 1, 4), (3, T, 4, 2)})
    group([("gpt", 3, o, ga, 2, True, no_prefetch) for o in (False, True) for ga in (1, 4)],
          {(3, F, 4, 2), (3, T, 1, 2)})
    # (By default the pair without 4 ranks re-gathering at every use over 4 micro-steps, the
    # slowest case of the whole oracle.)
    group([("gpt", 3, True, ga, n, True, tight) for ga in (1, 4) for n in (2, 4)],
          {(3, T, 1, 4), (3, T, 4, 2)})
    # Persistence: tensors of at most 100 elements stay whole (448 of this model's), while their
    # total stays within the model's threshold (150: a few of them).
    group([("gpt", 3, True, 1, 2, True, {"stage3_param_persistence_threshold": 100,
                                         "stage3_model_persistence_threshold": 150})], None)
    # The layered model at stages 0 and 2 (no hooks: plain training).
    group([("gpt", s, True, 1, 2, True, {}) for s in (0, 2)], None)
    # dscpp_deferred_allgather: the step's all-gathers are waited for by the next forward, layer
    # by layer for the GPT's LayerSpecs, all at once for the MLP.
    # By default each stage, accumulation and rank count once (the MLP's case adds stage 2
    # with 2 ranks and no accumulation).
    deferred = {"dscpp_deferred_allgather": True}
    group([("gpt", s, True, ga, n, True, deferred) for s, ga, n in ((1, 4, 2), (2, 1, 2), (2, 1, 4), (2, 4, 4))],
          {(1, T, 4, 2), (2, T, 1, 4)})
    group([("mlp", 2, True, 1, 2, True, deferred)], None)
    # reduce_scatter: false (all-reduce, keep one's chunk) at the partitioned stages.
    group([("mlp", s, True, 4, 2, False, {}) for s in (1, 2)], None)
    passed = failed = 0
    for model, stage, overlap, ga, n, rs, extra in cases:
        ref = refs[model]
        out = os.path.join(tmp, f"{model}_s{stage}_o{int(overlap)}_ga{ga}_n{n}.json")
        name = f"{model} stage={stage} overlap_comm={overlap} accumulation={ga} ranks={n}"
        if not rs:
            name += " reduce_scatter=false"
            out = out.replace(".json", "_nors.json")
        if extra:
            name += " " + " ".join(f"{k.replace('stage3_', '')}={v}" for k, v in extra.items())
            out = out.replace(".json", f"_x{abs(hash(json.dumps(extra, sort_keys=True))) % 10**8}.json")
        if args.only not in name:
            continue
        try:
            got = run([args.launcher, "--num_gpus", str(n), "--master_port", str(free_port()), args.train,
                       "--mode", "dscpp", "--model", model,
                       "--config", json.dumps(config(stage, overlap, ga, eps[model], rs, extra)),
                       "--steps", str(args.steps), "--out", out], out)
            loss_err = rel_err(got["losses"], ref["losses"])
            param_err = rel_err(got["params"], ref["params"])
            problems = []
            if len(got["losses"]) != len(ref["losses"]) or loss_err > 1e-5:
                problems.append(f"losses differ (worst relative error {loss_err:.2e})")
            if len(got["params"]) != len(ref["params"]) or param_err > 1e-5:
                problems.append(f"weights differ (worst relative error {param_err:.2e})")
            # Adam keeps two fp32 states per element of the partition: 1/N of the model at
            # stages 1 and 2, all of it at stage 0.
            expect_part = got["total"] // (n if stage >= 1 else 1)
            if got["partition"] != expect_part or got["state_numel"] != 2 * expect_part:
                problems.append(f"optimizer state {got['state_numel']} for partition {got['partition']}, "
                                f"expected 2 x {expect_part}")
            # Stage 3: at rest the module's parameters hold nothing and each rank keeps 1/N of
            # the 16-bit (here fp32) parameters.
            # By layer, parameters under the persistence threshold stay whole.
            expect_rest = got.get("small_numel", 0) if "peak_live" in got else 0
            if stage == 3 and (got["params_at_rest"] != expect_rest or got["partition16"] != expect_part):
                problems.append(f"at rest the parameters hold {got['params_at_rest']} elements and the "
                                f"partition {got['partition16']}, expected {expect_rest} and {expect_part}")
            if extra.get("dscpp_deferred_allgather") and n > 1 and not got.get("publish_deferred"):
                problems.append("no step left its all-gathers to the next forward")
            if stage == 3 and model == "gpt":
                # Gathered layer by layer: never more live than the bound plus one layer, and
                # with a bound below the model, never the whole model at once.
                bound = extra.get("stage3_max_live_parameters", 10**9) + got.get("max_layer", 0)
                if "peak_live" not in got:
                    problems.append("the layered model was not gathered layer by layer")
                elif got["peak_live"] > bound:
                    problems.append(f"{got['peak_live']} parameters live at once, bound {bound}")
                elif bound < got["total"] and got["peak_live"] >= got["total"]:
                    problems.append(f"the whole model ({got['total']}) was live at once")
            if stage < 3 and got["params_at_rest"] != len(got["params"]):
                problems.append(f"parameters hold {got['params_at_rest']} elements at rest, expected all")
            ok = not problems
            msg = f"losses {loss_err:.1e}, weights {param_err:.1e}" if ok else "; ".join(problems)
        except Exception as e:  # noqa: BLE001 - any failure of the run is this case's failure
            ok, msg = False, str(e)
        print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)
        passed += ok
        failed += not ok
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
