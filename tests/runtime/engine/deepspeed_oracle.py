#!/usr/bin/env python3
"""DeepSpeed itself as the oracle for dscpp's engine, ZeRO stages 0-2.

    deepspeed_oracle.py --launcher build/launcher/dscpp --train build/tests/runtime/engine/engine_train
        [--muon gram|standard] [--ranks N]

Writes engine_train's initial weights (--mode init), then for every stage in 0, 1, 2 and
gradient accumulation 1 and 4 trains the same model on the same data for 20 steps on 2 ranks
twice: with DeepSpeed (ds_train.py, CPU accelerator, Gloo, torch's AdamW; every case in one
launch, --cases, so that torch and DeepSpeed are imported once) and with dscpp (engine_train
--mode dscpp, a launch per case), both under the dscpp launcher and with the same ds_config. The
losses and final weights must agree within 1e-5 relative (fp32 on CPU). Prints one line per
case and `N passed, M failed` last; exits 1 on any failure.

With --muon, both train with DeepSpeed's Muon (ds_train.config), that Newton-Schulz method,
accumulation 1 and 2, on --ranks ranks: l2 and l3's weights by Muon (each orthogonalised once,
by its owner rank, here), the biases and l1's weight by the auxiliary Adam: the user's
override of the default tags on both sides (DeepSpeed's param.use_muon, InitArgs::use_muon).
l1's weight is the model's one tall matrix, whose Newton-Schulz result differs from
DeepSpeed's by one unit in the last place of the half-precision iteration
(tests/optim/muon_update_oracle.py). Two steps, not 20 (the second takes the first's momentum):
the iteration runs in fp16 (gram, on a CPU with fp16: DeepSpeed's choice) or bf16 (standard),
where a difference in the last bit of a gradient (fp32 sums in another order) now and then
rounds an element of the update to the neighbouring half-precision value, and the iteration
and the steps after it spread that (DeepSpeed against itself, stage 0 against stage 1, drifts
1e-3 apart in 20 steps; here a third step already differed by 8e-4 at stages 1 and 2). Each
case also counts the Newton-Schulz runs of all ranks: dscpp's must be each Muon matrix once a
step at stages 1-2 (every rank's at stage 0); DeepSpeed's are printed beside them (its ZeRO 1-2
runs a matrix on every rank that holds a piece of it)."""
import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


GLOBAL_BATCH = 16
RANKS = 2
TOLERANCE = 1e-5
MUON_STEPS = 2
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # tests/
from dscpp_test_ports import free_port  # noqa: E402
from ds_train import config  # noqa: E402  (the ds_config both sides train with)
from oracle import rel_err  # noqa: E402  (one definition of the comparison for both oracles)


def run(cmd, out, timeout):
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"{' '.join(cmd[:6])}... timed out after {timeout} s") from e
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}... exited {p.returncode}:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    with open(out) as f:
        return json.load(f)




def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--steps", type=int, help="20; 2 with --muon")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per run")
    ap.add_argument("--python", default=sys.executable, help="Python with torch and deepspeed")
    ap.add_argument("--muon", choices=["gram", "standard"], help="DeepSpeed's Muon with this ns_method")
    ap.add_argument("--ranks", type=int, default=RANKS)
    ap.add_argument("--groups", help="parameter groups by name, JSON, given to both sides")
    ap.add_argument("--accumulations", help="the gradient accumulations to run (default: 1,2 with --muon)")
    args = ap.parse_args()
    if args.steps is None:
        args.steps = MUON_STEPS if args.muon else 20
    tmp = tempfile.mkdtemp(prefix="deepspeed_oracle_")
    init = os.path.join(tmp, "init.json")
    run([args.train, "--mode", "init", "--out", init], init, args.timeout)
    passed = failed = 0
    start = time.monotonic()
    accumulations = [int(a) for a in args.accumulations.split(",")] if args.accumulations else (
        [1, 2] if args.muon else [1, 4])
    cases = list(itertools.product([0, 1, 2], accumulations))
    ds_pattern = os.path.join(tmp, "ds_s{stage}_ga{ga}.json")
    # The launcher puts --local_rank=K right after the program, which is the Python
    # interpreter here and would reject it; ds_train.py reads LOCAL_RANK instead.
    ds_cmd = [args.launcher, "--num_gpus", str(args.ranks), "--master_port", str(free_port()), "--no_local_rank",
              args.python, os.path.join(HERE, "ds_train.py"), "--init", init,
              "--cases", ",".join(f"{s}:{g}" for s, g in cases), "--steps", str(args.steps), "--out", ds_pattern]
    if args.muon:
        ds_cmd += ["--muon", args.muon]
    if args.groups:
        ds_cmd += ["--groups", args.groups]
    try:
        run(ds_cmd, ds_pattern.format(stage=cases[-1][0], ga=cases[-1][1]), args.timeout * len(cases))
        ds_error = None
    except Exception as e:  # noqa: BLE001 - DeepSpeed's failure fails every case
        ds_error = e
    for stage, ga in cases:
        name = f"stage={stage} accumulation={ga} ranks={args.ranks}" + (f" muon {args.muon}" if args.muon else "")
        cfg = config(stage, ga, args.muon)
        ds_out = ds_pattern.format(stage=stage, ga=ga)
        cpp_out = os.path.join(tmp, f"dscpp_s{stage}_ga{ga}.json")
        try:
            if ds_error:
                raise RuntimeError(f"DeepSpeed's run failed: {ds_error}")
            with open(ds_out) as f:
                ref = json.load(f)
            got = run([args.launcher, "--num_gpus", str(args.ranks), "--master_port", str(free_port()), args.train,
                       "--mode", "dscpp", "--config", json.dumps(cfg), "--steps", str(args.steps),
                       "--out", cpp_out] + (["--adam-param", "l1.weight"] if args.muon else [])
                      + (["--groups", args.groups] if args.groups else []),
                      cpp_out, args.timeout)
            problems = []
            loss_err = param_err = float("nan")
            if len(got["losses"]) != len(ref["losses"]) or len(ref["losses"]) != args.steps:
                problems.append(f"{len(got['losses'])} losses from dscpp, {len(ref['losses'])} from DeepSpeed")
            else:
                loss_err = rel_err(got["losses"], ref["losses"])
                if not loss_err <= TOLERANCE:
                    problems.append(f"losses differ (worst relative error {loss_err:.2e})")
            if len(got["params"]) != len(ref["params"]):
                problems.append(f"{len(got['params'])} weights from dscpp, {len(ref['params'])} from DeepSpeed")
            else:
                param_err = rel_err(got["params"], ref["params"])
                if not param_err <= TOLERANCE:
                    problems.append(f"weights differ (worst relative error {param_err:.2e})")
            if args.muon:
                # The work: two matrices by Muon; dscpp's owners run each once a step in the group
                # (every rank at stage 0, as DeepSpeed), DeepSpeed's ZeRO 1-2 every rank that
                # holds a piece of it.
                once = 2 * args.steps  # at the accumulation boundary, whatever the accumulation
                want = once * (args.ranks if stage == 0 else 1)
                if got.get("orthogonalised") != want:
                    problems.append(f"dscpp ran Newton-Schulz {got.get('orthogonalised')} times, not {want}")
                work = f"; Newton-Schulz runs: dscpp {got.get('orthogonalised'):.0f}, DeepSpeed {ref.get('orthogonalised'):.0f}"
            else:
                work = ""
            ok = not problems
            msg = (f"losses {loss_err:.1e}, weights {param_err:.1e}" + work) if ok else "; ".join(problems)
        except Exception as e:  # noqa: BLE001 - any failure of a run is this case's failure
            ok, msg = False, str(e)
        print(f"{'PASS' if ok else 'FAIL'} {name}: {msg}", flush=True)
        passed += ok
        failed += not ok
    print(f"{passed} passed, {failed} failed ({time.monotonic() - start:.0f} s)")
    if not failed:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"outputs kept in {tmp}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
