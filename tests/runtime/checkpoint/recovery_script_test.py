#!/usr/bin/env python3
"""The consolidation script save_checkpoint writes into each checkpoint folder
(runtime/checkpoint/zero_to_fp32.py, as DeepSpeed copies its own): run with Python and only
torch on checkpoints of ZeRO stages 0-3 (2 ranks, fp32 and bf16), it writes exactly what our
tools/zero_to_fp32 writes (same keys, torch.equal values); given a folder it writes
FOLDER/pytorch_model.bin; a partition copied over another rank's is refused, naming the file.
Each checkpoint's file form runs in a fresh interpreter; the folder form and the refusal run the
script in this process (runpy), which already paid for torch.

    recovery_script_test.py --launcher build/launcher/dscpp --train build/tests/runtime/engine/engine_train \
        --zero-to-fp32 build/tools/zero_to_fp32"""
import argparse
import contextlib
import io
import os
import runpy
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from checkpoint_oracle import Runner  # noqa: E402
from ds_train import config  # noqa: E402


def run_script(script, argv, fresh):
    """The consolidation script on argv: None if it succeeded, else its error text. fresh: in
    a new interpreter (stderr); otherwise here, as __main__ (the exception's message)."""
    if fresh:
        p = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True)
        return None if p.returncode == 0 else p.stderr
    saved = sys.argv
    sys.argv = [script, *argv]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(script, run_name="__main__")
        return None
    except (Exception, SystemExit) as e:  # noqa: BLE001 - any failure is the script's answer
        return f"{type(e).__name__}: {e}"
    finally:
        sys.argv = saved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launcher", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--zero-to-fp32", dest="zero_to_fp32", required=True)
    ap.add_argument("--timeout", type=int, default=300)
    args = ap.parse_args()
    import torch
    tmp = tempfile.mkdtemp(prefix="recovery_script_")
    r = Runner(args, tmp)
    failures = 0
    for stage, bf16 in ((0, False), (0, True), (1, False), (2, False), (2, True), (3, False)):
        cfg = config(stage, 2)
        if bf16:
            cfg["bf16"] = {"enabled": True}
        name = f"s{stage}{'_bf16' if bf16 else ''}"
        ckpt = os.path.join(tmp, name)
        r.dscpp(name, 2, cfg, ["--save", ckpt, "--save-at", "3"], steps=3)
        problems = []
        script = os.path.join(ckpt, "zero_to_fp32.py")
        ours = os.path.join(tmp, name + "_tool.pt")
        subprocess.run([args.zero_to_fp32, ckpt, ours], check=True, capture_output=True)
        want = torch.load(ours)
        out_dir = os.path.join(tmp, name + "_out")
        os.makedirs(out_dir)
        # Standalone (a fresh Python, torch its only import) once per checkpoint; the folder
        # form and the refusal run the same script in this process (runpy, as __main__): each
        # fresh interpreter costs a torch import, ~3 s of CPU on the 2-core CI machine.
        for out, written, fresh in ((os.path.join(tmp, name + "_script.pt"),) * 2 + (True,),
                                    (out_dir, os.path.join(out_dir, "pytorch_model.bin"), False)):
            err = run_script(script, [ckpt, out], fresh)
            if err is not None:
                problems.append(f"the script failed{' (fresh Python)' if fresh else ''}: {err[-1500:]}")
                break
            got = torch.load(written)
            if list(got) != list(want):
                problems.append(f"keys {list(got)}, zero_to_fp32 {list(want)}")
            else:
                bad = [k for k in want if got[k].dtype != want[k].dtype or not torch.equal(got[k], want[k])]
                if bad:
                    problems.append(f"values differ for {bad}")
        if stage >= 1:  # rank 1's partition over rank 0's: refused, naming the file
            folder = os.path.join(ckpt, "global_step3")
            files = sorted(f for f in os.listdir(folder) if f.endswith("optim_states.pt"))
            shutil.copy(os.path.join(folder, files[1]), os.path.join(folder, files[0]))
            err = run_script(script, [ckpt, os.path.join(tmp, "x.pt")], False)
            if err is None or files[0] not in err or "dscpp_rank" not in err:
                problems.append(f"a swapped partition was not refused by name: {(err or '')[-500:]}")
        ok = not problems
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'} stage={stage} bf16={bf16}{'' if ok else ': ' + '; '.join(problems)}",
              flush=True)
    if not failures:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"outputs kept in {tmp}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
