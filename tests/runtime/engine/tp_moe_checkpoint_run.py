"""Runs tp_moe_checkpoint (checkpoints of experts with tensor parallelism, 4 ranks) in a fresh
folder: one launch saves (--phase save), a second launch, in new processes, resumes and checks
(--phase resume); then, per case, the consolidation script the checkpoint folder carries
(zero_to_fp32.py, torch only) against tools/zero_to_fp32, which tp_moe_checkpoint has checked
against the weights the one-rank engine loaded: the same names and tensors, bit for bit.

    tp_moe_checkpoint_run.py --zero-to-fp32 build/tools/zero_to_fp32 -- LAUNCHER ARGS... BINARY CASES...
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
    work = tempfile.mkdtemp(prefix="tp_moe_checkpoint_")
    for phase in ("save", "resume"):
        rc = subprocess.call(command + ["--phase", phase, "--dir", work])
        if rc != 0:
            print(f"tp_moe_checkpoint --phase {phase} failed ({rc}); files kept in {work}")
            return rc
    import torch
    failed = []
    cases = sorted(d for d in os.listdir(work) if d.startswith("e") and not d.endswith("_missing"))
    for case in cases:
        ck = os.path.join(work, case)
        ours, script = os.path.join(work, case + "_tool.pt"), os.path.join(work, case + "_script.pt")
        subprocess.run([args.zero_to_fp32, ck, ours], check=True)
        subprocess.run([sys.executable, os.path.join(ck, "zero_to_fp32.py"), ck, script], check=True)
        a, b = torch.load(ours, weights_only=True), torch.load(script, weights_only=True)
        experts = [k for k in a if "experts" in k]
        same = list(a) == list(b) and len(experts) > 0 and all(torch.equal(a[k], b[k]) for k in a)
        print(f"{'ok' if same else 'FAILED'}: the folder's zero_to_fp32.py on {case} (tensor 2 x data 2, "
              f"ep 2) = tools/zero_to_fp32 ({len(b)} and {len(a)} tensors, {len(experts)} of experts)")
        if not same:
            failed.append(case)
    if not cases:
        failed.append("no checkpoint folder")
    if failed:
        print("FAILED:", failed, "files kept in", work)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
