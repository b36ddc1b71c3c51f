"""Runs tp_checkpoint (tensor-parallel checkpoints across degrees, 4 ranks) in a fresh folder,
then checks the consolidation script each checkpoint folder carries (zero_to_fp32.py, torch
only) against tools/zero_to_fp32, which tp_checkpoint has checked against the weights the
one-rank engine loaded: the same names and the same tensors, bit for bit, for each round.

    tp_checkpoint_run.py --zero-to-fp32 build/tools/zero_to_fp32 -- LAUNCHER ARGS... TP_CHECKPOINT
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zero-to-fp32", required=True)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    work = tempfile.mkdtemp(prefix="tp_checkpoint_")
    rc = subprocess.call(command + ["--dir", work])
    if rc != 0:
        print(f"tp_checkpoint failed ({rc}); files kept in {work}")
        return rc
    import torch
    failed = []
    rounds = sorted(d for d in os.listdir(work) if d.startswith("z"))
    for z in rounds:
        ck = os.path.join(work, z)
        ours, script = os.path.join(work, z + "_tool.pt"), os.path.join(work, z + "_script.pt")
        subprocess.run([args.zero_to_fp32, ck, ours], check=True)
        subprocess.run([sys.executable, os.path.join(ck, "zero_to_fp32.py"), ck, script], check=True)
        a, b = torch.load(ours, weights_only=True), torch.load(script, weights_only=True)
        same = list(a) == list(b) and len(a) > 0 and all(torch.equal(a[k], b[k]) for k in a)
        print(f"{'ok' if same else 'FAILED'}: the folder's zero_to_fp32.py on the {z} t2d2 "
              f"checkpoint = tools/zero_to_fp32 ({len(b)} and {len(a)} tensors)")
        if not same:
            failed.append(z)
    if not rounds:
        failed.append("no checkpoint folder")
    if failed:
        print("FAILED:", failed, "files kept in", work)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
